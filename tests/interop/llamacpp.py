"""llama.cpp's own binaries in tests: the runner is :mod:`dspark.bench.llamacpp`; a test that
needs the binaries skips, with the command that builds them, where they are not built.

``.ci/run`` passes the build's bin folder as ``DSPARK_LLAMACPP_BIN``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dspark.bench.llamacpp import (  # noqa: F401  (the tests' vocabulary)
    BIN_ENV,
    BUILD_HINT,
    DEFAULT_BIN,
    PlainRun,
    SpecRun,
    llamacpp_bin,
    plain,
    plain_run,
    speculative,
    tokenize,
)


def require_bin() -> Path:
    folder = llamacpp_bin()
    if folder is None:
        where = os.environ.get(BIN_ENV) or DEFAULT_BIN
        pytest.skip(f"llama.cpp's binaries are not built in {where}: {BUILD_HINT}")
    return folder

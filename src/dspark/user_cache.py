"""Where dspark keeps what it computes once per machine: converted targets, SPS profiles, campaigns."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$DSPARK_CACHE``, else ``$XDG_CACHE_HOME/dspark``, else ``~/.cache/dspark``."""
    if os.environ.get("DSPARK_CACHE"):
        return Path(os.environ["DSPARK_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "dspark"


def sps_dir() -> Path:
    """SPS profiles (one small JSON per target, dtype, device and engine shape):
    ``$DSPARK_SPS_DIR``, else ``<cache_root>/sps``."""
    return (
        Path(os.environ["DSPARK_SPS_DIR"]).expanduser()
        if os.environ.get("DSPARK_SPS_DIR")
        else cache_root() / "sps"
    )

"""Who the server is and who may call it: the model id clients send, and the API key.

The model id defaults to the target's folder *name* (or its hub id), never a local
filesystem path. The API key may come from ``--api-key``, from a file
(``--api-key-file``: not visible in ``ps``) or from the ``DSPARK_API_KEY`` environment
variable (used when neither flag is given). All three are stripped of surrounding
whitespace the same way (a client's ``Bearer`` token is stripped too, so a key that kept
a space or newline could never be matched), and a key that is empty after that is
refused (it would silently turn authentication off).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dspark.errors import DsparkError

API_KEY_ENV = "DSPARK_API_KEY"


def served_model_name(target: str | None, explicit: str | None = None) -> str:
    """``explicit``, else the target folder's name, else the hub id, else ``tiny`` (the embedded target)."""
    if explicit is not None:
        if not explicit.strip():
            raise DsparkError("--model-name is empty")
        return explicit
    if target is None:
        return "tiny"
    path = Path(target).expanduser()
    if path.exists():
        return path.resolve().name or "model"
    return target


def resolve_api_key(
    key: str | None, key_file: str | Path | None, environ: Mapping[str, str] = os.environ
) -> str | None:
    """The API key to require, stripped: ``--api-key`` or ``--api-key-file`` (not both), else
    the environment variable; None = no authentication."""
    if key is not None and key_file is not None:
        raise DsparkError("the API key is given twice (--api-key and --api-key-file); give one")
    if key is not None:
        name, value = "--api-key", key
    elif key_file is not None:
        name, value = "--api-key-file", str(key_file)
    elif environ.get(API_KEY_ENV) is not None:
        name, value = API_KEY_ENV, environ[API_KEY_ENV]
    else:
        return None
    if name == "--api-key-file":
        try:
            value = Path(value).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DsparkError(f"--api-key-file {value}: cannot read it ({e})") from None
    value = value.strip()
    if not value:
        raise DsparkError(f"{name}: the API key is empty (that would turn authentication off)")
    return value

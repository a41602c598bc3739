"""Who the server is and who may call it: the model id clients send, and the API key.

The model id defaults to the target's folder *name* (or its hub id), never a local
filesystem path. The API key may come from ``--api-key``, from a file
(``--api-key-file``: not visible in ``ps``) or from the ``DSPARK_API_KEY`` environment
variable; an empty key is refused (it would silently turn authentication off).
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
    """The API key to require, from at most one of its sources; None = no authentication."""
    sources = {
        "--api-key": key,
        "--api-key-file": key_file,
        API_KEY_ENV: environ.get(API_KEY_ENV),
    }
    given = {name: value for name, value in sources.items() if value is not None}
    if len(given) > 1:
        raise DsparkError(f"the API key is given more than once ({', '.join(given)}); give it one way")
    if not given:
        return None
    ((name, value),) = given.items()
    if name == "--api-key-file":
        try:
            value = Path(value).expanduser().read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise DsparkError(f"--api-key-file {value}: cannot read it ({e})") from None
    if not value.strip():
        raise DsparkError(f"{name}: the API key is empty (that would turn authentication off)")
    return value

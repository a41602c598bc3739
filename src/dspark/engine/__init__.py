"""The batched speculative-decoding engine (DESIGN §10): requests, KV memory, the step loop.

Names are imported on first use, so that ``dspark.engine.commands`` (which the CLI table
imports) does not pull in torch and transformers before a command runs.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Engine": "dspark.engine.engine",
    "EngineConfig": "dspark.engine.config",
    "EngineStats": "dspark.engine.config",
    "TokenEvent": "dspark.engine.requests",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dspark.engine' has no attribute {name!r}")

"""Size of the offline feature cache, before it is built (DESIGN §7.3).

Per token the cache holds the raw outputs of the ``m`` feature layers and the
final-normed last hidden state (``m + 1`` vectors of ``H`` values), the token id
(int32) and the loss-mask byte; fp8 adds one float32 scale per vector (per-token,
per-layer absmax scaling, because LLM hidden states have outliers far beyond e4m3's
±448)::

    bytes/token = (m + 1)·H·dtype_bytes + 4 + 1   [+ 4·(m + 1) for fp8]

DeepSpec's default (Qwen3-4B, H = 2560, m = 5, bf16) is 6·2560·2 = 30,720 B ≈ 30.7 KB
per token. Never V-sized logits: ``lm_head`` of the cached hidden state gives them back.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from dspark.errors import DsparkError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
ID_BYTES = 4  # int32 token id
MASK_BYTES = 1  # uint8 loss mask
SCALE_BYTES = 4  # float32 scale per vector (fp8 only)
DEEPSPEC_BYTES_PER_TOKEN = 30_720  # Qwen3-4B, 5 layers + last hidden, bf16, ids not counted


@dataclass(frozen=True)
class CacheEstimate:
    hidden_size: int  # H
    num_feature_layers: int  # m
    dtype: str
    tokens: int
    bytes_per_token: int
    total_bytes: int

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """Two lines for the terminal: the formula with its numbers, and the total."""
        m, H, d = self.num_feature_layers, self.hidden_size, DTYPE_BYTES[self.dtype]
        scales = f" + {SCALE_BYTES}·{m + 1} (fp8 scales)" if self.dtype == "fp8" else ""
        return (
            f"bytes/token = ({m}+1)·{H}·{d} ({self.dtype}) + {ID_BYTES} (id) + {MASK_BYTES} (mask){scales}"
            f" = {self.bytes_per_token:,} B ({format_bytes(self.bytes_per_token)})\n"
            f"total for {self.tokens:,} tokens = {self.total_bytes:,} B ({format_bytes(self.total_bytes)})"
        )


def bytes_per_token(hidden_size: int, num_feature_layers: int, dtype: str) -> int:
    """Cache bytes per token: see the module docstring."""
    if dtype not in DTYPE_BYTES:
        raise DsparkError(f"unknown cache dtype {dtype!r}; choose from {', '.join(DTYPE_BYTES)}")
    if hidden_size < 1 or num_feature_layers < 0:
        raise DsparkError(f"bad cache shape: hidden size {hidden_size}, feature layers {num_feature_layers}")
    vectors = num_feature_layers + 1
    size = vectors * hidden_size * DTYPE_BYTES[dtype] + ID_BYTES + MASK_BYTES
    if dtype == "fp8":
        size += vectors * SCALE_BYTES
    return size


def estimate_cache(hidden_size: int, num_feature_layers: int, dtype: str, tokens: int) -> CacheEstimate:
    per_token = bytes_per_token(hidden_size, num_feature_layers, dtype)
    return CacheEstimate(hidden_size, num_feature_layers, dtype, tokens, per_token, per_token * tokens)


def model_dims(path: str | Path) -> tuple[int, int]:
    """``(hidden_size, num_hidden_layers)`` from a model folder's ``config.json``, without loading weights."""
    config_path = Path(path) / "config.json"
    if not config_path.is_file():
        raise DsparkError(f"no config.json in {path}")
    try:
        config = json.loads(config_path.read_text())
        config = config.get("text_config", config)  # multimodal wrappers nest the LM's config
        return int(config["hidden_size"]), int(config["num_hidden_layers"])
    except KeyError as e:
        raise DsparkError(f"{config_path} has no {e.args[0]!r}") from None
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise DsparkError(f"{config_path}: not a model config ({str(e).split(';')[0]})") from None


def format_bytes(n: float) -> str:
    """Decimal units, as disk sizes are sold: 30720 -> '30.7 KB'."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def check_disk(folder: str | Path, needed_bytes: int, margin: float = 1.02) -> None:
    """Refuse to start a build that the disk under ``folder`` cannot hold (with a 2% margin)."""
    folder = Path(folder)
    probe = folder
    while not probe.exists():  # the folder may not exist yet: ask its nearest existing parent
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed_bytes * margin > free:
        raise DsparkError(
            f"the cache needs {format_bytes(needed_bytes)} but {probe} has {format_bytes(free)} free; "
            "free some space, choose another --out, a smaller --dtype (fp8) or fewer tokens"
        )

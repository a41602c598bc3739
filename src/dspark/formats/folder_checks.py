"""Checks on a drafter folder that run before anything is built from it.

A ``config.json`` decides how much memory building the drafter takes, so its sizes are
checked first: the integer fields are integers in range (:func:`check_config_fields`),
and every size that shapes a weight is checked against the shapes the safetensors
*header* records (:func:`check_weight_shapes`: the drafter is first built on the
``meta`` device, which allocates nothing). ``num_hidden_layers: 1e9`` or
``markov_rank: 1e9`` is then an error naming the field, not gigabytes allocated.
Weights must be finite (:func:`check_finite`): a NaN would only show at sampling time.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from dspark.errors import DsparkError

# Drafts per round: DeepSpec and the paper use <= 16; the engine holds [R, K, V] draft
# probabilities, so an absurd K is an allocation error at the first request.
MAX_BLOCK_SIZE = 64
_LAYER_KEY = re.compile(r"^layers\.(\d+)\.")
# field -> smallest allowed value (integers; bool is not an integer here)
_INT_FIELDS = {
    "block_size": 1,
    "num_hidden_layers": 1,
    "markov_rank": 0,
    "mask_token_id": 0,
    "num_target_layers": 1,
    "vocab_size": 1,
    "hidden_size": 1,
    "draft_vocab_size": 1,
    # The draft layers' attention shape is the target's (drafter_dims); a config.json that
    # holds a broken one is refused, not silently replaced by the target's.
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 1,
}
_POSITIVE_FIELDS = ("rms_norm_eps", "rope_theta")  # finite numbers > 0 where present
SIZE_FIELDS = (
    "num_hidden_layers",
    "markov_rank",
    "block_size",
    "hidden_size",
    "vocab_size",
    "draft_vocab_size",
)
_BOOL_FIELDS = ("enable_confidence_head", "confidence_head_with_markov")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_number(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


def check_config_fields(raw: dict[str, Any], where: Path, error: type[DsparkError]) -> None:
    """Types and ranges of the fields the drafter is built from; raises ``error`` naming each bad one."""
    problems = []
    for name, low in _INT_FIELDS.items():
        if name in raw and raw[name] is not None and not (_is_int(raw[name]) and raw[name] >= low):
            problems.append(f"{name} {raw[name]!r} must be an integer >= {low}")
    block = raw.get("block_size")
    if _is_int(block) and block > MAX_BLOCK_SIZE:
        problems.append(f"block_size {block} is larger than {MAX_BLOCK_SIZE}")
    ids = raw.get("target_layer_ids")
    if ids is not None and not (isinstance(ids, list) and all(_is_int(i) for i in ids)):
        problems.append(f"target_layer_ids {ids!r} must be a list of integers")
    inter = raw.get("intermediate_size")  # an integer, or one per layer in some families
    if inter is not None and not all(
        _is_int(v) and v >= 1 for v in (inter if isinstance(inter, list) else [inter])
    ):
        problems.append(f"intermediate_size {inter!r} must be an integer >= 1 (or a list of them)")
    rope = raw.get("rope_parameters")  # transformers 5 nests rope_theta here
    for fields in (raw, rope if isinstance(rope, dict) else {}):
        for name in _POSITIVE_FIELDS:
            if fields.get(name) is not None and not _positive_number(fields[name]):
                problems.append(f"{name} {fields[name]!r} must be a finite number > 0")
    for name in _BOOL_FIELDS:
        if name in raw and not isinstance(raw[name], bool):
            problems.append(f"{name} {raw[name]!r} must be true or false")
    if "markov_head_type" in raw and not isinstance(raw["markov_head_type"], str):
        problems.append(f"markov_head_type {raw['markov_head_type']!r} must be a string")
    temps = raw.get("sts_temperatures")
    if temps is not None and not (isinstance(temps, list) and all(_positive_number(t) for t in temps)):
        problems.append(f"sts_temperatures {temps!r} must be a list of positive numbers")
    if problems:
        raise error(f"{where}: malformed drafter config: " + "; ".join(problems))


def header_shapes(weights: Path, error: type[DsparkError]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the safetensors header alone (no tensor data is read)."""
    try:
        with safe_open(str(weights), "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError) as e:
        raise error(f"{weights}: cannot read weights ({e})") from None


def check_weight_shapes(
    shapes: dict[str, tuple[int, ...]],
    num_hidden_layers: int,
    build_skeleton,
    where: Path,
    error: type[DsparkError],
    config_sizes: dict[str, Any] | None = None,
    omitted: tuple[str, ...] = (),
) -> None:
    """The config's sizes against the header's shapes, before the real drafter is built.

    ``build_skeleton()`` builds the drafter (called under the ``meta`` device once the
    layer count is known to match the file, so it allocates nothing); ``config_sizes``
    are named in the error; ``omitted`` keys (the target's tensors the file left out,
    :mod:`dspark.formats.shared_weights`) are not expected in the file.
    """
    layers = {int(m.group(1)) for k in shapes if (m := _LAYER_KEY.match(k))}
    if len(layers) != num_hidden_layers or (layers and max(layers) != len(layers) - 1):
        raise error(
            f"{where}: config.json says num_hidden_layers {num_hidden_layers}, "
            f"the weights hold {len(layers)} layers"
        )
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in build_skeleton().state_dict().items() if k not in omitted}
    missing, unexpected = sorted(set(expected) - set(shapes)), sorted(set(shapes) - set(expected))
    if missing or unexpected:
        raise error(
            f"{where}: weights do not match the config: missing keys {missing or 'none'}, "
            f"unexpected keys {unexpected or 'none'}"
        )
    wrong = [f"{k} {shapes[k]} != {v}" for k, v in expected.items() if shapes[k] != v]
    if wrong:
        sizes = ", ".join(f"{k} {v}" for k, v in (config_sizes or {}).items())
        raise error(
            f"{where}: weight shapes do not match the config ({sizes}): "
            + "; ".join(f"file {w}" for w in wrong[:5])
        )


def check_finite(state: dict[str, torch.Tensor], where: Path, error: type[DsparkError]) -> None:
    """Refuse weights holding NaN or infinity (a drafter would sample from NaN probabilities)."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise error(f"{where}: weights are not finite (NaN or inf) in {', '.join(bad[:5])}")

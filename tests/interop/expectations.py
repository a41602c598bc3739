"""Checks of an export against the pinned expectations of engines we cannot run here.

DeepSpec is not installable from a registry and SGLang 0.5.23 serves DSpark on GPUs only,
so what their code requires (``fixtures/engine_expectations.json``, with its sources) is
checked statically. Each function returns the list of problems; empty = meets them.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open

FIXTURE = Path(__file__).with_name("fixtures") / "engine_expectations.json"


def load_expectations() -> dict:
    return json.loads(FIXTURE.read_text())


def _read(folder: Path) -> tuple[dict, set[str]]:
    config = json.loads((folder / "config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    return config, keys


def deepspec_weight_names(config: dict, expected: dict) -> set[str]:
    """The weight names DeepSpec's model class declares for this config."""
    w = expected["weights"]
    names = set(w["backbone"])
    for i in range(config["num_hidden_layers"]):
        names |= {n.format(i=i) for n in w["layer"]}
    if config.get("markov_rank", 0) > 0:
        names |= set(w["markov"])
        if config.get("markov_head_type") == "rnn":
            names |= set(w["rnn"])
    if config.get("enable_confidence_head"):
        names |= set(w["confidence"])
    return names


def deepspec_problems(folder: Path) -> list[str]:
    """DeepSpec's ``Qwen3DSparkModel``: fields, architecture, weight names, a valid head type."""
    exp = load_expectations()["deepspec"]
    config, keys = _read(folder)
    problems = [f"missing config field {f}" for f in exp["required_config_fields"] if f not in config]
    if config.get("architectures") != exp["architectures"]:
        problems.append(
            f"architectures {config.get('architectures')} (DeepSpec registers {exp['architectures']})"
        )
    if config.get("markov_head_type") not in exp["markov_head_types"]:
        problems.append(f"markov_head_type {config.get('markov_head_type')!r}")
    if len(config.get("layer_types") or []) != config.get("num_hidden_layers"):
        problems.append("layer_types does not have one entry per draft layer")
    if not problems:
        want = deepspec_weight_names(config, exp)
        if keys != want:
            problems.append(f"weights: missing {sorted(want - keys)}, unexpected {sorted(keys - want)}")
    return problems


def sglang_problems(folder: Path, our_layer_ids: list[int]) -> list[str]:
    """SGLang 0.5.23's DSPARK / EAGLE3 loaders, read from its source."""
    exp = load_expectations()["sglang"]
    config, keys = _read(folder)
    problems = []
    if "eagle_config" in config:  # EAGLE3
        ids = config["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
        if ids != our_layer_ids:
            problems.append(f"eagle3 layer ids {ids} != ours {our_layer_ids} (SGLang adds 1 itself)")
        if not any(k.startswith(exp["eagle3_layer_name"]) for k in keys):
            problems.append("eagle3 layer not named midlayer.*")
        return problems
    if config.get("architectures") != exp["dspark_architectures"]:
        problems.append(f"architectures {config.get('architectures')}")
    if config.get("markov_rank", 0) <= 0:
        problems.append("markov_rank must be > 0")
    if config.get("markov_head_type") not in exp["markov_head_types"]:
        problems.append(f"markov_head_type {config.get('markov_head_type')!r}")
    ids = (config.get("dflash_config") or {}).get("target_layer_ids")
    if ids != our_layer_ids:
        problems.append(f"dflash_config.target_layer_ids {ids} != ours {our_layer_ids}")
    if config.get("sample_from_anchor", exp["sample_from_anchor_default"]) is not True:
        problems.append("sample_from_anchor must be true (anchor slot predicts the first draft)")
    if (
        config.get("markov_head_type") == "rnn"
        and not {"markov_head.joint_proj.weight", "markov_head.joint_proj.bias"} <= keys
    ):
        problems.append("rnn head weights not named markov_head.joint_proj.{weight,bias}")
    sts = folder / "sglang_sts.json"
    if sts.is_file():
        temps = json.loads(sts.read_text()).get("temperatures")
        if not isinstance(temps, list) or len(temps) != config["block_size"] or min(temps) <= 0:
            problems.append(f"STS temperatures {temps} must be {config['block_size']} positive numbers")
    elif config.get("enable_confidence_head") and config.get("sts_temperatures"):
        problems.append("STS temperatures not written to sglang_sts.json")
    sps = folder / "sglang_sps_table.json"
    if sps.is_file() and set(json.loads(sps.read_text())) != set(exp["sps_file"]["keys"]):
        problems.append("SPS table keys")
    return problems

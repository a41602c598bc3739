"""Profiling SPS(B) with the engine's forward, and ``dspark profile`` (DESIGN §9)."""

from __future__ import annotations

import json

from dspark.cli import main
from dspark.engine import Engine, EngineConfig
from dspark.engine.profile import load_or_profile, profile_key, profile_sps, step_runs
from dspark.scheduler import SpsTable
from dspark.targets import TargetAdapter
from dspark.targets.flat import KVStore


def test_step_runs_spread_tokens_over_requests():
    assert [r.length for r in step_runs(5, 8, 10)] == [1] * 5
    assert [r.length for r in step_runs(19, 4, 10)] == [5, 5, 5, 4]
    assert {r.start for r in step_runs(19, 4, 10)} == {10}


def test_profile_then_load(tiny_qwen3, tmp_path):
    target = TargetAdapter(tiny_qwen3)
    store = KVStore.for_target(target, num_slots=4, capacity=64)
    table = profile_sps(target, store, block_size=3, sizes=[1, 4, 16], repeats=1)
    assert table.tokens == (1, 4, 16) and table.meta["slots"] == 4 and table.meta["block_size"] == 3
    path = tmp_path / "sps.json"
    table.save(path)
    loaded = load_or_profile(target, store, block_size=3, path=path)
    assert loaded == table
    # The engine loads a saved table at start instead of profiling.
    engine = Engine(
        target,
        _AnyDrafter(),
        EngineConfig(payoff=False, max_batch=4, max_seq_len=64, block_size=3, sps_path=path),
    )
    assert engine.sps == table


def test_copies_of_a_target_share_a_profile_and_other_shapes_do_not(tiny_qwen3, tmp_path):
    """The key names what a step costs (sizes, dtype, threads, engine shape), not where the
    model was loaded from: a copied tree reuses the table instead of profiling afresh."""
    from transformers import AutoModelForCausalLM

    keys = []
    for name in ("a", "b"):
        tiny_qwen3.save_pretrained(tmp_path / name)
        loaded = TargetAdapter(AutoModelForCausalLM.from_pretrained(tmp_path / name))
        assert loaded.config._name_or_path.endswith(name)
        keys.append(profile_key(loaded, num_slots=4, block_size=3, context=32))
    assert keys[0] == keys[1]
    wider = type(tiny_qwen3.config).from_dict(tiny_qwen3.config.to_dict() | {"intermediate_size": 96})
    assert wider.intermediate_size != tiny_qwen3.config.intermediate_size
    other = TargetAdapter(type(tiny_qwen3)(wider))
    assert profile_key(other, num_slots=4, block_size=3, context=32) != keys[0]


def test_cli_profile(tiny_qwen3, tiny_tokenizer, tmp_path, capsys):
    folder = tmp_path / "model"
    tiny_qwen3.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    out = tmp_path / "sps.json"
    args = ["profile", "--target", str(folder), "--max-batch", "2", "--block-size", "2", "--repeats", "1"]
    assert main([*args, "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    table = SpsTable.load(out)
    assert printed["path"] == str(out) and table.max_tokens == 2 * 3
    assert [row["B"] for row in printed["table"]] == list(table.tokens)


class _AnyDrafter:
    target_layer_ids: tuple[int, ...] = ()

    def propose(self, states, max_len, sampling):
        raise AssertionError("not used")

    def update(self, state, num_accepted, new_features):
        pass

"""The training loop (DESIGN §6): schedule, accumulation, exact resume, non-finite stop, config guard."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from dspark.training.checkpoint import ConfigMismatchError, latest_checkpoint, load_checkpoint
from dspark.training.trainer import NonFiniteLossError, TrainConfig, lr_multiplier, train

from .toy_drafter import ToyConfig, ToyDrafter, tiny_target, toy_samples


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _cfg(tmp_path, name="run", **kw) -> TrainConfig:
    base = dict(
        output_dir=str(tmp_path / name), max_steps=4, global_batch_size=4, micro_batch_size=4, lr=1e-2,
        num_anchors=None, save_every=2, log_every=1, progress=False,
    )  # fmt: skip
    return TrainConfig(**(base | kw))


def _drafter(target, seed=1, **kw) -> ToyDrafter:
    torch.manual_seed(seed)
    return ToyDrafter(ToyConfig(**kw), target)


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# -- learning-rate schedule ---------------------------------------------------------------


def test_warmup_then_cosine_values():
    f = [lr_multiplier(i, total_steps=100, warmup_steps=4) for i in range(100)]
    assert f[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]  # linear warmup, then the cosine starts at its peak
    assert f[52] == pytest.approx(0.5)  # half way through the cosine: (1 + cos(pi/2)) / 2
    assert f[99] == pytest.approx(0.5 * (1 + math.cos(math.pi * 95 / 96)))
    assert all(a >= b for a, b in zip(f[4:], f[5:]))
    floor = [lr_multiplier(i, total_steps=100, warmup_steps=4, min_lr_ratio=0.1) for i in (4, 99)]
    assert floor[0] == pytest.approx(1.0) and floor[1] == pytest.approx(0.1 + 0.9 * f[99])


def test_warmup_is_four_percent_and_drives_the_optimizer(tmp_path, target):
    cfg = _cfg(tmp_path, max_steps=50, global_batch_size=1, micro_batch_size=1, save_every=0)
    assert cfg.warmup_steps == 2  # ceil(4% of 50)
    train(cfg, target, _drafter(target), toy_samples(8))
    lrs = [r["lr"] for r in _records(tmp_path / "run")]
    expected = [1e-2 * lr_multiplier(i, total_steps=50, warmup_steps=2) for i in range(50)]
    assert lrs == pytest.approx(expected, rel=1e-12)


# -- the step -------------------------------------------------------------------------------


def test_accumulation_matches_one_big_micro_batch(tmp_path, target):
    """global 4 = micro 4 x 1 = micro 2 x 2 = micro 1 x 4: the same update (equal normalisers)."""
    finals = []
    for micro in (4, 2, 1):
        cfg = _cfg(tmp_path, f"m{micro}", max_steps=3, micro_batch_size=micro, save_every=0, lr=1e-3)
        drafter = _drafter(target)
        train(cfg, target, drafter, toy_samples(10))
        finals.append({k: v.clone() for k, v in drafter.state_dict().items()})
    for other in finals[1:]:
        for k in finals[0]:
            torch.testing.assert_close(other[k], finals[0][k], atol=1e-5, rtol=0)
    assert not torch.equal(finals[0]["fc.weight"], _drafter(target).fc.weight)  # it did train


def test_frozen_parameters_stay_frozen_and_out_of_the_optimizer(tmp_path, target):
    drafter = _drafter(target)
    head = drafter.lm_head.weight.clone()
    result = train(_cfg(tmp_path, max_steps=2), target, drafter, toy_samples(8))
    assert torch.equal(drafter.lm_head.weight, head)
    ckpt = load_checkpoint(result.checkpoint)
    assert {k.split("/")[0] for k in ckpt.optimizer_state["state"]} == {
        "fc.weight", "fc.bias", "norm_weight", "layers.0.weight", "layers.0.bias"
    }  # fmt: skip
    decayed, plain = ckpt.optimizer_state["param_groups"]
    assert decayed["weight_decay"] == 0.01 and plain["weight_decay"] == 0.0
    assert "norm_weight" in plain["params"] and "fc.weight" in decayed["params"]


def test_metrics_have_loss_terms_and_online_eval_beside_expected_tau(tmp_path, target):
    calls = []

    def online_eval(drafter, step):
        calls.append((step, drafter.training, torch.is_grad_enabled()))
        return {"tau": 2.5}

    cfg = _cfg(tmp_path, eval_every=2, log_every=3, save_every=0)
    train(cfg, target, _drafter(target), toy_samples(8), online_eval=online_eval)
    records = {r["step"]: r for r in _records(tmp_path / "run")}
    assert sorted(records) == [2, 3, 4]  # log steps plus eval steps
    assert calls == [(2, False, False), (4, False, False)]  # eval mode, no grad
    for step in (2, 4):
        assert records[step]["eval/tau"] == 2.5 and "expected_tau" in records[step]
    for key in ("loss", "ce", "tv", "lr", "grad_norm", "tokens_per_s", "acceptance/1", "expected_tau"):
        assert key in records[3], key
    assert "conf" not in records[3] and "soft_ce" not in records[3]  # terms the objective leaves out
    assert records[3]["expected_tau"] == pytest.approx(1 + records[3]["acceptance/1"])  # one slot


# -- exact resume ---------------------------------------------------------------------------


def _state(folder):
    ckpt = load_checkpoint(folder)
    optim = {f"{n}/{k}": v for n, s in ckpt.optimizer_state["state"].items() for k, v in s.items()}
    return ckpt, optim


def test_resume_two_plus_two_equals_four_bit_for_bit(tmp_path, target):
    data = toy_samples(10)
    straight = _drafter(target, dropout=0.2)  # dropout: the torch RNG must be restored too
    train(_cfg(tmp_path, "straight"), target, straight, data)

    class Crash(RuntimeError):
        pass

    def crash(drafter, step):
        raise Crash(f"killed in step {step}")

    first = _drafter(target, dropout=0.2)
    with pytest.raises(Crash):  # dies in step 3, after the step-2 checkpoint
        train(_cfg(tmp_path, "resumed", eval_every=3), target, first, data, online_eval=crash)
    assert latest_checkpoint(tmp_path / "resumed" / "checkpoints").name == "step_00000002"
    second = _drafter(target, seed=99, dropout=0.2)  # different init: the checkpoint must win
    result = train(_cfg(tmp_path, "resumed"), target, second, data)
    assert (result.start_step, result.step) == (2, 4)

    a, a_optim = _state(tmp_path / "straight" / "checkpoints" / "step_00000004")
    b, b_optim = _state(tmp_path / "resumed" / "checkpoints" / "step_00000004")
    assert a.model_state.keys() == b.model_state.keys() == straight.state_dict().keys()
    for k in a.model_state:
        assert torch.equal(a.model_state[k], b.model_state[k]), k
        assert torch.equal(second.state_dict()[k], straight.state_dict()[k]), k
    assert a_optim.keys() == b_optim.keys() and all(torch.equal(a_optim[k], b_optim[k]) for k in a_optim)
    assert a.trainer_state["scheduler"] == b.trainer_state["scheduler"]
    assert (
        a.trainer_state["data"] == b.trainer_state["data"] == {"position": 16, "num_samples": 10, "seed": 0}
    )
    assert second.seen == straight.seen[2:]  # steps 3 and 4 saw the same sequences in the same order
    assert [r["step"] for r in _records(tmp_path / "resumed")] == [1, 2, 3, 4]


def test_resume_refuses_a_changed_config_naming_the_fields(tmp_path, target):
    data = toy_samples(8)
    train(_cfg(tmp_path, max_steps=2), target, _drafter(target), data)
    with pytest.raises(ConfigMismatchError, match=r"train\.lr: 0\.01 -> 0\.02.*train\.max_steps: 2 -> 6"):
        train(_cfg(tmp_path, max_steps=6, lr=2e-2), target, _drafter(target), data)
    with pytest.raises(ConfigMismatchError, match=r"drafter\.block_size: 2 -> 3"):
        train(_cfg(tmp_path, max_steps=2), target, _drafter(target, block_size=3), data)
    with pytest.raises(ConfigMismatchError, match=r"data\.sha256"):
        train(_cfg(tmp_path, max_steps=2), target, _drafter(target), toy_samples(8, seed=5))
    # Run control (logging, saving, progress, output_dir) may change.
    result = train(_cfg(tmp_path, max_steps=2, log_every=5, save_every=1), target, _drafter(target), data)
    assert (result.start_step, result.step) == (2, 2)


def test_refuses_to_overwrite_checkpoints_without_resume(tmp_path, target):
    train(_cfg(tmp_path, max_steps=2), target, _drafter(target), toy_samples(8))
    with pytest.raises(Exception, match="already holds checkpoints"):
        train(_cfg(tmp_path, max_steps=2, resume=False), target, _drafter(target), toy_samples(8))


# -- non-finite stop ------------------------------------------------------------------------


def test_nan_stops_before_the_update_and_names_the_step(tmp_path, target):
    drafter = _drafter(target)
    drafter.nan_on_call = 3  # one forward per step: step 3's loss is NaN
    with pytest.raises(NonFiniteLossError, match=r"at step 3\b") as err:
        train(_cfg(tmp_path, save_every=1), target, drafter, toy_samples(8))
    assert err.value.step == 3
    after_two = load_checkpoint(tmp_path / "run" / "checkpoints" / "step_00000002")
    for k, v in drafter.state_dict().items():  # in memory: exactly the weights after step 2
        assert torch.equal(v, after_two.model_state[k]), k
    assert all(p.grad is None for p in drafter.parameters())
    assert latest_checkpoint(tmp_path / "run" / "checkpoints").name == "step_00000002"
    assert load_file(str(after_two.path / "model.safetensors")).keys() == drafter.state_dict().keys()


def test_stop_rule_ends_the_run_at_a_logged_step_with_a_checkpoint(tmp_path, target):
    seen: list[int] = []

    def stop(step, record):
        seen.append(step)
        assert "loss" in record
        return step == 4

    cfg = _cfg(tmp_path, max_steps=10, log_every=2, save_every=0)
    result = train(cfg, target, _drafter(target), toy_samples(16), stop=stop)
    assert result.step == 4 and seen == [2, 4]
    assert result.checkpoint is not None and load_checkpoint(result.checkpoint).step == 4
    assert [r["step"] for r in _records(tmp_path / "run")] == [2, 4]
    # the schedule is still the 10-step one: the stop did not shorten the cosine
    assert _records(tmp_path / "run")[-1]["lr"] > cfg.lr * lr_multiplier(9, total_steps=10, warmup_steps=1)

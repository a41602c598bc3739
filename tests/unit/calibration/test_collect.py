"""Recording rounds with confidences from the loop's hook; events and prompt-level splits."""

from __future__ import annotations

import numpy as np
import torch

from dspark.calibration.collect import ConfidenceRounds, RoundRecorder, split_by_group
from dspark.protocols import DraftBlock

from .synthetic import synthetic_rounds


def _block(conf: list[float], K: int = 4) -> DraftBlock:
    k = len(conf)
    return DraftBlock(
        tokens=torch.zeros(1, K, dtype=torch.long),
        lengths=torch.tensor([k]),
        probs=None,
        confidences=torch.tensor([conf + [0.0] * (K - k)]),
    )


def test_recorder_keeps_proposed_confidences_only():
    rec = RoundRecorder(group=7)
    rec(_block([0.9, 0.5, 0.25]), 2)
    rec(_block([]), 0)  # no drafts: not a calibration sample
    rec(DraftBlock(torch.zeros(1, 2, dtype=torch.long), torch.tensor([2]), None), 1)  # no confidences
    rounds = rec.rounds(4)
    assert rounds.num_rounds == 1 and rounds.group.tolist() == [7]
    assert rounds.proposed.tolist() == [3] and rounds.accepted.tolist() == [2]
    assert np.allclose(rounds.confidences[0, :3], [0.9, 0.5, 0.25]) and np.isnan(rounds.confidences[0, 3])


def test_survival_and_conditional_events():
    rounds = ConfidenceRounds(
        np.array([[0.9, 0.5], [0.8, 0.5], [0.6, np.nan]]),
        np.array([2, 2, 1]),
        np.array([2, 0, 1]),
        np.array([0, 0, 1]),
    )
    a2, y2 = rounds.survival_events(2)
    assert np.allclose(a2, [0.45, 0.4]) and y2.tolist() == [1.0, 0.0]
    c2, y2 = rounds.conditional_events(2)  # only the first round reached draft 2
    assert np.allclose(c2, [0.5]) and y2.tolist() == [1.0]


def test_split_keeps_prompts_whole_and_is_seeded():
    rounds, _ = synthetic_rounds(n=1_000)
    fit, held = split_by_group(rounds, 0.25, seed=3)
    assert fit.num_rounds + held.num_rounds == rounds.num_rounds
    assert not set(fit.group.tolist()) & set(held.group.tolist())
    assert len(set(held.group.tolist())) == 25  # of 100 prompts
    assert np.array_equal(split_by_group(rounds, 0.25, seed=3)[1].group, held.group)
    same_fit, same_held = split_by_group(rounds, 0.0)
    assert same_fit is rounds and same_held is rounds


def _generate(target, drafter, on_round):
    from dspark.decoding import speculative_generate
    from dspark.protocols import SamplingParams

    params = SamplingParams(temperature=1.0, max_tokens=30, seed=5)
    return speculative_generate(target, drafter, list(range(3, 15)), params, block_size=4, on_round=on_round)


def test_loop_hook_sees_every_round_with_its_confidences(tiny_qwen3):
    from dspark.targets import TargetAdapter
    from tests.unit.drafters.builders import build

    torch.set_num_threads(1)
    target = TargetAdapter(tiny_qwen3)
    seen = []
    rec = RoundRecorder()

    def hook(block, accepted):
        seen.append((int(block.lengths[0]), accepted))
        rec(block, accepted)

    result = _generate(target, build("dspark_markov", target), hook)
    assert seen == [(r.proposed, r.accepted) for r in result.rounds]  # one call per logged round
    drafted = [r for r in result.rounds if r.proposed > 0]
    rounds = rec.rounds(4)
    assert rounds.accepted.tolist() == [r.accepted for r in drafted]
    assert not np.isnan(rounds.confidences[rounds.proposed == 4]).any()


def test_sts_temperatures_of_the_config_reach_the_confidences(tiny_qwen3):
    """Temperatures rescale the confidences the loop sees, and change nothing else."""
    from dspark.calibration.sts import apply_sts
    from dspark.targets import TargetAdapter
    from tests.unit.drafters.builders import build

    torch.set_num_threads(1)
    target = TargetAdapter(tiny_qwen3)
    temps = (2.0, 0.5, 3.0, 1.5)
    runs = []
    for sts in (None, temps):
        rec = RoundRecorder()
        result = _generate(target, build("dspark_markov", target, sts_temperatures=sts), rec)
        runs.append((result.token_ids, rec.rounds(4)))
    (tokens_raw, raw), (tokens_cal, cal) = runs
    assert tokens_raw == tokens_cal  # confidences never touch the sampled tokens (lossless)
    assert np.allclose(cal.confidences, apply_sts(raw.confidences, temps), atol=1e-5, equal_nan=True)

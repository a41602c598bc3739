"""A reduced draft vocabulary (issue 16): drafting, the loss over it, losslessness.

The drafters propose only from ``draft_ids`` (N of the tiny target's 128 tokens); the
loss is checked against an independent reference (the draft distribution written out
over the whole vocabulary with zeros, DESIGN §6), and speculative decoding with such a
drafter against plain decoding (greedy equality, chi-square at T = 1).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from dspark.data.samples import TrainSample
from dspark.decoding import speculative_generate
from dspark.drafters.draft_vocab import (
    engine_tables,
    expand_probs,
    ids_from_d2t,
    most_frequent_tokens,
    target_to_draft,
)
from dspark.drafters.objective_config import dspark_objective, eagle3_objective
from dspark.protocols import SamplingParams, TrainOutput
from dspark.training.objective import compute_loss, l1_distance

from .builders import BLOCK, CONFIGS, DRAFTERS, make_batch, make_state, prompt

N = 24


def draft_ids(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(128, generator=g)[:N].sort().values


def build_reduced(name, target, seed=0, ids=None, **overrides):
    cls, config = CONFIGS[name]
    torch.manual_seed(seed)
    config = dataclasses.replace(config, draft_vocab_size=N, **overrides)
    drafter = cls.from_target(target, config, draft_ids=draft_ids() if ids is None else ids).eval()
    head = getattr(drafter, "markov_head", None)
    if head is not None:
        with torch.no_grad():
            head.markov_w2.weight.normal_(std=0.5)
    return drafter


def test_most_frequent_tokens_counts_supervised_tokens_only():
    samples = [
        TrainSample(torch.tensor([5, 5, 7, 9, 9, 9]), torch.tensor([False, True, True, True, True, True])),
        TrainSample(torch.tensor([1, 1, 1, 7]), torch.tensor([False, False, False, True])),
    ]
    # supervised: 5 x1, 7 x2, 9 x3 (the 1s are prompt tokens); ties and unseen ids go to small ids
    assert most_frequent_tokens(samples, 12, 2).tolist() == [7, 9]
    assert most_frequent_tokens(samples, 12, 4).tolist() == [0, 5, 7, 9]
    with pytest.raises(ValueError):
        most_frequent_tokens(samples, 12, 13)


def test_engine_tables_round_trip():
    ids = draft_ids()
    tables = engine_tables(ids, 128)
    assert torch.equal(ids_from_d2t(tables["d2t"]), ids)
    assert tables["t2d"].dtype == torch.bool and int(tables["t2d"].sum()) == N
    assert torch.equal(torch.nonzero(tables["t2d"]).squeeze(-1), ids)
    assert torch.equal(target_to_draft(ids, 128)[ids], torch.arange(N))


@pytest.mark.parametrize("name", DRAFTERS)
def test_proposals_stay_in_the_draft_vocabulary(target, name):
    drafter = build_reduced(name, target)
    ids = draft_ids()
    assert drafter.lm_head.weight.shape == (N, target.hidden_size)
    torch.testing.assert_close(drafter.lm_head.weight, target.model.get_output_embeddings().weight[ids])
    outside = torch.ones(128, dtype=torch.bool)
    outside[ids] = False
    for params in (SamplingParams(temperature=1.0, seed=3), SamplingParams(temperature=0.0)):
        block = drafter.propose([make_state(target, prompt(9))], BLOCK, [params])
        assert bool(torch.isin(block.tokens, ids).all())
        if params.greedy:  # one-hot at the tokens, reported without probabilities
            assert block.probs is None
            continue
        assert block.probs.shape == (1, BLOCK, 128)
        torch.testing.assert_close(block.probs.sum(-1), torch.ones(1, BLOCK))
        assert float(block.probs[..., outside].abs().max()) == 0.0
        assert bool((block.probs.gather(-1, block.tokens.unsqueeze(-1)) > 0).all())


def _reference_terms(out: TrainOutput, ids: torch.Tensor):
    """CE, L1 and soft CE per slot, the draft distribution written over all V tokens (zeros outside)."""
    p_small = torch.softmax(out.factors.draft_logits(), -1)  # [B, A, K, N]
    p_d = expand_probs(p_small, ids, 128)  # [B, A, K, V]
    q = torch.softmax(out.factors.target_logits(), -1)  # [B, A, K, V]
    l1 = l1_distance(p_d, q)
    inside = torch.isin(out.labels, ids)
    ce = torch.where(inside, -torch.log(p_d.gather(-1, out.labels.unsqueeze(-1)).squeeze(-1)), 0.0)
    q_d = q[..., ids] / q[..., ids].sum(-1, keepdim=True)
    soft = -(q_d * torch.log(p_small)).sum(-1)
    return ce, l1, soft


@pytest.mark.parametrize("name", DRAFTERS)
def test_loss_over_the_draft_vocabulary_matches_the_reference(target, name):
    drafter = build_reduced(name, target)
    ids = draft_ids()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(3, 100, (2, 14), generator=g)
    x[0, 5:9] = ids[:4]  # some labels inside the draft vocabulary, most outside
    batch = make_batch(target, x, torch.ones_like(x, dtype=torch.bool))
    for objective in (
        dspark_objective(),
        eagle3_objective(),
        dataclasses.replace(dspark_objective(), conf=0),
    ):
        if objective.conf and getattr(drafter, "confidence_head", None) is None:
            continue
        out = drafter.forward_train(batch)
        with torch.no_grad():
            ce, l1, soft = _reference_terms(out, ids)
        inside = torch.isin(out.labels[out.valid], ids)
        assert bool(inside.any()) and bool((~inside).any())
        chunked = compute_loss(out, objective, budget_bytes=1 << 12)  # several chunks
        # expected acceptance of slot 1 = mean Σ_D min(p_d, q) over its supervised slots
        first = (1 - 0.5 * l1)[..., 0][out.valid[..., 0]].mean()
        torch.testing.assert_close(chunked.metrics.acceptance[0], first, atol=1e-5, rtol=1e-5)
        dense_out = drafter.forward_train(batch)
        _ = dense_out.logits, dense_out.target_logits  # materialize: the dense reference path
        dense = compute_loss(dense_out, objective)
        for term, ref in (("ce", ce), ("tv", l1), ("soft_ce", soft)):
            got = getattr(chunked, term)
            if got is None:
                continue
            w = (
                torch.exp(-torch.arange(BLOCK, dtype=torch.float32) / objective.decay)
                if objective.decay
                else (objective.geometric ** torch.arange(BLOCK, dtype=torch.float32))
            )
            wv = w * out.valid.float()
            torch.testing.assert_close(got, (ref * wv).sum() / wv.sum(), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(getattr(dense, term), got, atol=1e-5, rtol=1e-5)
        # gradients of the chunked path = autograd through the dense one
        params = [p for p in drafter.parameters() if p.requires_grad]
        g_chunked = torch.autograd.grad(chunked.loss, params, allow_unused=True)
        g_dense = torch.autograd.grad(dense.loss, params, allow_unused=True)
        for a, b in zip(g_chunked, g_dense):
            if a is None or b is None:
                assert a is None and b is None
                continue
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_output_equals_plain_decoding(target, name):
    drafter = build_reduced(name, target)
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    p = prompt(7, seed=4)
    plain = speculative_generate(target, None, p, greedy).token_ids
    spec = speculative_generate(target, drafter, p, greedy, block_size=BLOCK).token_ids
    assert spec == plain


def _peaked(target):
    """The tiny target with a sharper head, so that a 2-token joint has few heavy cells."""
    with torch.no_grad():
        target.model.get_output_embeddings().weight.mul_(6.0)
    target.eos_token_ids = ()  # two tokens every run: the joint is over exactly two
    return target


def test_sampling_is_lossless_chi_square(target):
    """Joint of the first two tokens at T = 1 with a reduced-vocabulary DSpark = the target's."""
    target = _peaked(target)
    p = prompt(6, seed=2)
    probs_1 = torch.softmax(target.forward(torch.tensor([p]), target.new_cache()).logits[0, -1].float(), -1)
    top = probs_1.argsort(descending=True)[:6]
    ids = torch.cat([top[:3], torch.arange(100, 100 + N - 3)]).unique().sort().values
    drafter = build_reduced("dspark_markov", target, ids=ids[:N] if ids.numel() >= N else None)
    exact = np.zeros((128, 128))
    for a in range(128):
        if float(probs_1[a]) < 1e-4:
            continue
        nxt = target.forward(torch.tensor([p + [a]]), target.new_cache()).logits[0, -1].float()
        exact[a] = float(probs_1[a]) * torch.softmax(nxt, -1).numpy()
    runs = 1500
    counts = np.zeros((128, 128))
    for seed in range(runs):
        out = speculative_generate(
            target, drafter, p, SamplingParams(temperature=1.0, max_tokens=2, seed=seed), block_size=BLOCK
        ).token_ids
        counts[out[0], out[1]] += 1
    expected = exact.ravel() / exact.sum() * runs
    keep = expected >= 5
    assert keep.sum() >= 8, "the test needs several heavy cells"
    f_obs = np.append(counts.ravel()[keep], counts.ravel()[~keep].sum())
    f_exp = np.append(expected[keep], expected[~keep].sum())
    assert chisquare(f_obs, f_exp).pvalue > 1e-3
    # the drafter never proposes outside its vocabulary, so some tokens must come from the target
    assert counts[~np.isin(np.arange(128), ids.numpy())].sum() > 0


@pytest.mark.parametrize("name", DRAFTERS)
def test_runs_started_before_the_field_resume(name):
    """A checkpoint's identity without ``draft_vocab_size`` matches the default (None); N does not."""
    from dspark.training.checkpoint import config_differences
    from dspark.training.run_identity import as_json, field_defaults

    config = dataclasses.replace(CONFIGS[name][1], target_layer_ids=(1, 2))
    current = {"drafter": as_json(config)}
    saved = {"drafter": {k: v for k, v in current["drafter"].items() if k != "draft_vocab_size"}}
    defaults = {"drafter": as_json(field_defaults(type(config)))}
    assert config_differences(saved, current, defaults) == []
    reduced = {"drafter": as_json(dataclasses.replace(config, draft_vocab_size=N))}
    assert config_differences(saved, reduced, defaults) == [f"drafter.draft_vocab_size: (absent) -> {N}"]


@pytest.mark.parametrize("name", DRAFTERS)
def test_a_bf16_folder_keeps_the_tables_exact(target, tmp_path, name):
    """Shipping casts weights to bf16, never the d2t / t2d tables (ids above 256 are not exact
    in bf16: a cast SmolLM2 folder was refused on load)."""
    from safetensors.torch import load_file

    from dspark.formats.folder import WEIGHTS_NAME, convert_folder, load_drafter, save_drafter

    drafter = build_reduced(name, target)
    folder = save_drafter(tmp_path / "bf16", drafter, target, dtype=torch.bfloat16)
    copy = convert_folder(save_drafter(tmp_path / "fp32", drafter, target), tmp_path / "copy", torch.bfloat16)
    for path in (folder, copy):
        state = load_file(str(path / WEIGHTS_NAME))
        assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
        assert {v.dtype for k, v in state.items() if k not in ("d2t", "t2d")} == {torch.bfloat16}
        assert torch.equal(load_drafter(path, target).state_dict()["draft_ids"], draft_ids())

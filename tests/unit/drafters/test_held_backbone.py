"""DSpark and DFlash hold the DFlash backbone with its weights' names unchanged (issue 13, DESIGN §5.4).

Until issue 13 both drafters *were* the backbone (they inherited from it). Holding it
instead must leave every name the weights are known by exactly as it was: the keys of
the shipped drafters, of exports and of training checkpoints (model and optimizer state,
which is keyed by ``named_parameters``), and the drafts themselves. The pinned drafts
below were recorded from the shipped drafters with the inheriting classes (commit
8cc8479), by this file's ``_drafts`` — DFlash's and DSpark's again when the converged ones were shipped.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from dspark.decoding.loop import speculative_generate
from dspark.drafters.backbone import DFlashBackbone
from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
from dspark.drafters.parts import hold
from dspark.formats.folder import load_drafter
from dspark.formats.shared_weights import SHARED_KEYS
from dspark.formats.shipped import shipped_drafter_dir
from dspark.presets.tiny import tiny_target_dir
from dspark.protocols import SamplingParams, SequenceState
from dspark.targets import TargetAdapter
from dspark.training.checkpoint import load_checkpoint
from dspark.training.trainer import TrainConfig, train
from tests.unit.training.toy_drafter import tiny_target, toy_samples

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=1.0, seed=5)
PINNED = {  # drafts after prompt ids 5..5+n-1, n = 6, 9, 12 (module docstring)
    # The converged campaign DSpark (shipped 2026-12-01: 9,310 steps = 10 epochs), by ``_drafts``.
    ("dspark", "greedy"): [
        [797, 412, 68, 5, 325, 384, 91],
        [797, 412, 68, 5, 412, 68, 5],
        [20, 15, 514, 91, 12, 202, 336],
    ],
    ("dspark", "sampled"): [
        [1871, 1028, 202, 336, 2, 5, 8],
        [1871, 621, 455, 3014, 567, 1347, 1343],
        [898, 1028, 347, 202, 336, 2, 8],
    ],
    # The converged campaign DFlash (shipped 2026-12-01: 7,800 steps, file without the
    # target's embedding / head), recorded by ``_drafts``.
    ("dflash", "greedy"): [
        [34, 17, 17, 17, 17, 17, 17],
        [412, 354, 202, 202, 202, 2, 63],
        [20, 15, 202, 202, 202, 202, 15],
    ],
    ("dflash", "sampled"): [
        [1871, 1028, 455, 335, 567, 1347, 8],
        [1871, 484, 455, 335, 567, 1347, 8],
        [1871, 484, 977, 335, 567, 1347, 8],
    ],
}


def _drafts(target, drafter, params: SamplingParams) -> list[list[int]]:
    """One block proposed after each prompt, each from a fresh request state."""
    drafts = []
    for n in (6, 9, 12):
        ids = list(range(5, 5 + n))
        out = target.forward(torch.tensor([ids[:-1]]), target.new_cache(), layer_ids=drafter.target_layer_ids)
        state = SequenceState(0, ids, len(ids), features=out.features[0])
        drafts.append(drafter.propose([state], drafter.block_size, [params]).tokens[0].tolist())
    return drafts


def _recorder(out: list):
    return lambda block, _accepted: out.append(block)


@pytest.fixture(scope="module")
def embedded_target() -> TargetAdapter:
    torch.set_num_threads(1)
    return TargetAdapter.from_pretrained(tiny_target_dir())


@pytest.mark.parametrize("method", ["dspark", "dflash"])
def test_shipped_drafter_keys_and_drafts_unchanged(embedded_target, method):
    folder = shipped_drafter_dir(method)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        shipped = list(f.keys())
    drafter = load_drafter(folder, embedded_target)
    assert "backbone" not in dict(drafter.named_children())  # held, not a prefix
    # a file may leave out the target's own embedding / head (formats/shared_weights.py)
    omitted = set(SHARED_KEYS) - set(shipped)
    assert sorted(drafter.state_dict()) == sorted([*shipped, *omitted])
    assert [n for n, _ in drafter.named_parameters()] == list(drafter.state_dict())  # names = keys
    assert _drafts(embedded_target, drafter, GREEDY) == PINNED[method, "greedy"]
    assert _drafts(embedded_target, drafter, SAMPLED) == PINNED[method, "sampled"]


def test_fresh_training_checkpoint_keys_and_drafts(tmp_path):
    """A checkpoint written now has the backbone's bare names in its model and optimizer state."""
    target = tiny_target()
    config = DSparkConfig(num_layers=1, block_size=3, mask_embedding=True, markov_rank=4)
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(target, config)
    cfg = TrainConfig(
        output_dir=str(tmp_path / "run"), max_steps=1, global_batch_size=1, micro_batch_size=1,
        num_anchors=2, save_every=1, log_every=1, progress=False,
    )  # fmt: skip
    ckpt = load_checkpoint(train(cfg, target, drafter, toy_samples(2)).checkpoint)
    names = [n for n, _ in drafter.named_parameters()]
    assert names[:4] == ["mask_embedding", "embed_tokens.weight", "fc.weight", "hidden_norm.weight"]
    assert names[-4:] == [
        "markov_head.markov_w1.weight",
        "markov_head.markov_w2.weight",
        "confidence_head.proj.weight",
        "confidence_head.proj.bias",
    ]
    assert list(drafter.state_dict()) == names
    assert sorted(ckpt.model_state) == sorted(names)  # safetensors stores keys sorted
    trainable = {n for n, p in drafter.named_parameters() if p.requires_grad}
    assert set(ckpt.optimizer_state["state"]) == trainable
    assert not {"embed_tokens.weight", "lm_head.weight"} & trainable
    torch.manual_seed(1)
    again = DSparkDrafter.from_target(target, config)
    again.load_state_dict(ckpt.model_state, strict=True)
    prompt = list(range(3, 15))
    for params in (SamplingParams(temperature=0.0, max_tokens=6), SamplingParams(seed=2, max_tokens=6)):
        mine, theirs = [], []
        for d, out in ((drafter, mine), (again, theirs)):
            speculative_generate(target, d, prompt, params, block_size=3, on_round=_recorder(out))
        assert len(mine) == len(theirs) > 0
        for a, b in zip(mine, theirs):
            assert torch.equal(a.tokens, b.tokens)
            assert (a.probs is None and b.probs is None) or torch.equal(a.probs, b.probs)
            if a.tokens.numel():  # the last round may have no room for drafts
                assert a.confidences is not None and torch.equal(a.confidences, b.confidences)


def test_a_parameter_replaced_on_the_drafter_is_the_one_the_backbone_reads():
    """FSDP2 and ``load_state_dict(assign=True)`` swap parameters on the registered module only."""
    target = tiny_target()
    drafter = DSparkDrafter.from_target(target, DSparkConfig(num_layers=1, block_size=3, mask_embedding=True))
    state = {k: torch.randn_like(v) for k, v in drafter.state_dict().items()}
    drafter.load_state_dict(state, assign=True, strict=True)
    assert drafter.backbone.mask_embedding is drafter.mask_embedding
    assert torch.equal(drafter.backbone.mask_embedding, state["mask_embedding"])
    assert drafter.backbone.fc is drafter.fc and torch.equal(drafter.backbone.fc.weight, state["fc.weight"])


def test_hold_refuses_an_owner_that_already_has_weights():
    owner = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="before registering"):
        hold(owner, "backbone", torch.nn.Linear(2, 2))
    assert issubclass(DFlashBackbone, torch.nn.Module) and not issubclass(DSparkDrafter, DFlashBackbone)

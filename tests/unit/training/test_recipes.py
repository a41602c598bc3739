"""Issue 16's recipes beside the paper's: warm start from DFlash, CE then TV, the head's learning rate."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from dspark.drafters.dflash import DFlashConfig, DFlashDrafter
from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
from dspark.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from dspark.drafters.objective_config import dspark_objective
from dspark.errors import DsparkError
from dspark.formats.folder import save_drafter
from dspark.training.checkpoint import config_differences, load_checkpoint
from dspark.training.run_identity import as_json, identity_defaults
from dspark.training.schedule import ce_objective, objective_at
from dspark.training.trainer import TrainConfig, Trainer, train
from dspark.training.warm_start import HEADS, warm_start_backbone

from .toy_drafter import tiny_target, toy_samples

MASK_ID = 63
DFLASH = DFlashConfig(num_layers=1, block_size=3, mask_token_id=MASK_ID)
DSPARK = DSparkConfig(num_layers=1, block_size=3, mask_token_id=MASK_ID, markov_rank=4)
# The identity fields of a TrainConfig before issue 16's recipes (a running campaign's checkpoints).
OLD_IDENTITY = {
    "max_steps", "global_batch_size", "micro_batch_size", "lr", "min_lr_ratio", "warmup_ratio",
    "weight_decay", "betas", "max_grad_norm", "num_anchors", "seed", "precision", "flush_denormals",
}  # fmt: skip


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _cfg(tmp_path, name="run", **kw) -> TrainConfig:
    base = dict(
        output_dir=str(tmp_path / name), max_steps=2, global_batch_size=2, micro_batch_size=1, lr=1e-2,
        num_anchors=3, save_every=0, log_every=1, progress=False,
    )  # fmt: skip
    return TrainConfig(**(base | kw))


def _dspark(target, seed=1, config=DSPARK):
    torch.manual_seed(seed)
    return DSparkDrafter.from_target(target, config)


@pytest.fixture(scope="module")
def dflash_folder(target, tmp_path_factory):
    torch.manual_seed(0)
    drafter = DFlashDrafter.from_target(target, DFLASH)
    return save_drafter(tmp_path_factory.mktemp("dflash") / "dflash", drafter, target), drafter.state_dict()


# -- warm start ---------------------------------------------------------------------------------


def test_warm_start_copies_every_dflash_tensor_and_leaves_the_heads_fresh(target, dflash_folder):
    folder, dflash = dflash_folder
    fresh = {k: v.clone() for k, v in _dspark(target).state_dict().items()}
    drafter = _dspark(target)
    copied = warm_start_backbone(drafter, folder, target)
    state = drafter.state_dict()
    assert set(copied) == set(dflash) and set(state) - set(dflash) == {
        k for k in state if k.startswith(HEADS)
    }
    assert any(k.startswith("markov_head.") for k in state) and any(
        k.startswith("confidence_head.") for k in state
    )
    for k, v in dflash.items():
        assert torch.equal(state[k], v), k
    assert not torch.equal(fresh["fc.weight"], dflash["fc.weight"])  # seeds differ: the copy is visible
    for k in state.keys() - dflash.keys():  # the heads: this drafter's own initialisation, untouched
        assert torch.equal(state[k], fresh[k]), k


def test_the_trainer_warm_starts_a_fresh_run_only(tmp_path, target, dflash_folder):
    folder = tmp_path / "dflash"
    shutil.copytree(dflash_folder[0], folder)
    cfg = _cfg(tmp_path, warm_start=str(folder), save_every=1)
    trainer = Trainer(cfg, target, _dspark(target), _dataset(), _world(target))
    assert torch.equal(trainer.drafter.fc.weight, dflash_folder[1]["fc.weight"])
    result = train(cfg, target, _dspark(target), toy_samples(4))
    trained = load_checkpoint(result.checkpoint).model_state["fc.weight"]
    assert not torch.equal(trained, dflash_folder[1]["fc.weight"])  # it trained
    shutil.rmtree(folder)  # a resumed run does not read the folder again: it has its checkpoint
    resumed = Trainer(cfg, target, _dspark(target), _dataset(), _world(target))
    assert resumed.start()[0] == 2
    assert torch.equal(resumed.drafter.fc.weight, trained)


def _dataset():
    from dspark.data.samples import TrainDataset

    return TrainDataset(toy_samples(4))


def _world(target):
    from dspark.training import distributed

    return distributed.current_world(target.device)


@pytest.mark.parametrize(
    "config, match",
    [
        (DSparkConfig(num_layers=1, block_size=4, mask_token_id=MASK_ID, markov_rank=4), "block_size 3 != 4"),
        (DSparkConfig(num_layers=2, block_size=3, mask_token_id=MASK_ID, markov_rank=4), "num_layers 1 != 2"),
        (DSparkConfig(num_layers=1, block_size=3, mask_token_id=62, markov_rank=4), "mask_token_id 63 != 62"),
    ],
)
def test_warm_start_refuses_another_backbone_in_one_line(target, dflash_folder, config, match):
    with pytest.raises(DsparkError, match=match) as err:
        warm_start_backbone(_dspark(target, config=config), dflash_folder[0], target)
    assert "\n" not in str(err.value) and "cannot warm-start" in str(err.value)


def test_warm_start_refuses_a_non_dspark_drafter_and_a_non_dflash_folder(tmp_path, target, dflash_folder):
    torch.manual_seed(0)
    with pytest.raises(DsparkError, match="not a DFlashDrafter"):
        warm_start_backbone(DFlashDrafter.from_target(target, DFLASH), dflash_folder[0], target)
    eagle3_folder = save_drafter(
        tmp_path / "eagle3", Eagle3Drafter.from_target(target, Eagle3Config(block_size=3)), target
    )
    with pytest.raises(DsparkError, match="holds a Eagle3Drafter"):
        warm_start_backbone(_dspark(target), eagle3_folder, target)
    other = tiny_target(seed=5)  # same shapes, other weights: the folder's checks refuse it
    with pytest.raises(DsparkError, match="another target"):
        warm_start_backbone(_dspark(other), dflash_folder[0], other)


def test_warm_start_from_a_dspark_folder_copies_every_tensor_heads_included(tmp_path, target):
    trained = _dspark(target, seed=3)
    folder = save_drafter(tmp_path / "dspark", trained, target)
    drafter = _dspark(target, seed=1)
    copied = warm_start_backbone(drafter, folder, target)
    state, theirs = drafter.state_dict(), trained.state_dict()
    assert set(copied) == set(state) == set(theirs)
    assert any(k.startswith(HEADS) for k in copied)
    for k, v in theirs.items():
        assert torch.equal(state[k], v), k
    bigger = DSparkConfig(num_layers=1, block_size=3, mask_token_id=MASK_ID, markov_rank=8)
    with pytest.raises(DsparkError, match="markov_head"):  # another head: refused in one line
        warm_start_backbone(_dspark(target, config=bigger), folder, target)


# -- prompt-end anchors -------------------------------------------------------------------------


def test_prompt_end_anchors_train_blocks_at_the_prompts_last_token_and_say_so(tmp_path, target, monkeypatch):
    """With the recipe every micro-batch's anchors may sit at the prompt's last token (the toy
    samples' position SEQ_LEN/2 - 1), and the trained drafter's folder says it drafts a
    request's first round; without it neither."""
    import dspark.drafters.blocks as blocks
    from dspark.formats.folder import load_drafter
    from dspark.protocols import drafter_traits

    from .toy_drafter import SEQ_LEN

    seen = []
    sample = blocks.sample_anchors

    def spy(mask, num_anchors, generator=None, prompt_end=False):
        anchors = sample(mask, num_anchors, generator, prompt_end)
        seen.append(set(anchors.flatten().tolist()))
        return anchors

    monkeypatch.setattr(blocks, "sample_anchors", spy)
    for recipe, num_anchors in ((False, SEQ_LEN), (True, SEQ_LEN), (True, None)):  # None: every one
        seen.clear()
        drafter = _dspark(target)
        cfg = _cfg(
            tmp_path, f"run-{recipe}-{num_anchors}", num_anchors=num_anchors, prompt_end_anchors=recipe
        )
        train(cfg, target, drafter, toy_samples(4))
        assert seen and all((SEQ_LEN // 2 - 1 in anchors) == recipe for anchors in seen)
        folder = save_drafter(tmp_path / f"drafter-{recipe}-{num_anchors}", drafter, target)
        assert json.loads((folder / "config.json").read_text()).get("prompt_end_anchors", False) == recipe
        assert drafter_traits(load_drafter(folder, target)).after_prompt == recipe


# -- CE first, then TV ----------------------------------------------------------------------------


def test_objective_at_switches_after_ce_steps():
    paper = dspark_objective()
    ce = ce_objective(paper)
    assert (ce.ce, ce.tv, ce.conf, ce.decay) == (1.0, 0.0, paper.conf, paper.decay)
    assert [objective_at(s, ce_steps=3, objective=paper) for s in (1, 2, 3, 4, 5)] == [
        ce,
        ce,
        ce,
        paper,
        paper,
    ]
    assert objective_at(1, ce_steps=0, objective=paper) is paper
    assert TrainConfig(output_dir="x", max_steps=10, ce_warmup_frac=0.3).ce_steps == 3


def test_training_uses_ce_for_the_first_steps_then_tv(tmp_path, target):
    train(_cfg(tmp_path, max_steps=4, ce_warmup_frac=0.5), target, _dspark(target), toy_samples(4))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert ["tv" in r for r in rows] == [False, False, True, True]  # the TV term is in the loss from step 3
    assert all("ce" in r and "conf" in r for r in rows)
    for r in rows[:2]:  # CE phase: loss = 1.0 CE + 1.0 conf
        assert r["loss"] == pytest.approx(r["ce"] + r["conf"], rel=1e-5)
    for r in rows[2:]:  # then the paper's 0.1 CE + 0.9 TV + 1.0 conf
        assert r["loss"] == pytest.approx(0.1 * r["ce"] + 0.9 * r["tv"] + r["conf"], rel=1e-5)


@pytest.mark.parametrize(
    ("recipe", "message"),
    [({"ce_warmup_frac": 0.5}, "no TV term"), ({"head_lr_mult": 2.0}, "sequential head")],
    ids=["ce-warmup-needs-a-tv-objective", "head-lr-mult-needs-a-sequential-head"],
)
def test_a_recipe_dflash_lacks_the_part_for_is_refused(tmp_path, target, recipe, message):
    torch.manual_seed(0)
    with pytest.raises(DsparkError, match=message):
        Trainer(
            _cfg(tmp_path, **recipe),
            target,
            DFlashDrafter.from_target(target, DFLASH),
            _dataset(),
            _world(target),
        )


# -- the sequential head's learning rate -----------------------------------------------------------


def test_head_groups_have_lr_times_the_multiplier(tmp_path, target):
    cfg = _cfg(tmp_path, head_lr_mult=10.0, warmup_ratio=0.0)
    trainer = Trainer(cfg, target, _dspark(target), _dataset(), _world(target))
    head = {id(p) for p in trainer.drafter.markov_head.parameters()}
    seen = set()
    for group in trainer.optimizer.param_groups:
        ids = {id(p) for p in group["params"]}
        in_head = ids <= head
        assert in_head or not ids & head  # a group is all head or no head
        assert group["lr"] == pytest.approx(cfg.lr * (10.0 if in_head else 1.0))
        seen |= ids if in_head else set()
    assert seen == head  # every head parameter, and only those, at lr × 10
    trainer.step(1)  # the schedule scales every group alike
    factor = trainer.scheduler.get_last_lr()[0] / cfg.lr
    for group, base in zip(trainer.optimizer.param_groups, trainer.scheduler.base_lrs, strict=True):
        assert group["lr"] == pytest.approx(base * factor)


def test_default_keeps_the_two_groups_of_earlier_runs(tmp_path, target):
    trainer = Trainer(_cfg(tmp_path), target, _dspark(target), _dataset(), _world(target))
    groups = trainer.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
    trainable = [p for p in trainer.drafter.parameters() if p.requires_grad]
    assert [[id(p) for p in g["params"]] for g in groups] == [  # matrices, then norms and biases
        [id(p) for p in trainable if p.dim() >= 2],
        [id(p) for p in trainable if p.dim() < 2],
    ]


# -- run identity: unchanged for the paper's recipe -------------------------------------------------


def test_default_identity_is_the_one_earlier_runs_stored(tmp_path, target):
    cfg = _cfg(tmp_path)
    assert set(cfg.identity()) == OLD_IDENTITY
    assert cfg.identity().keys() - OLD_IDENTITY == set()
    set_ = _cfg(tmp_path, warm_start="d", ce_warmup_frac=0.25, head_lr_mult=3.0).identity()
    assert set_.keys() - OLD_IDENTITY == {"warm_start", "ce_warmup_frac", "head_lr_mult"}
    defaults = as_json(identity_defaults(cfg, _dspark(target)))
    old = {"train": as_json(cfg.identity())}
    assert config_differences(old, {"train": as_json(cfg.identity())}, defaults) == []
    assert config_differences(
        old, {"train": as_json(_cfg(tmp_path, ce_warmup_frac=0.25).identity())}, defaults
    ) == ["train.ce_warmup_frac: (absent) -> 0.25"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--drafter", "dflash", "--head-lr-mult", "2"], "--head-lr-mult: only for --drafter dspark"),
        (["--drafter", "dspark", "--ce-warmup-frac", "1.5"], "--ce-warmup-frac must be in [0, 1)"),
        (["--drafter", "dspark", "--head-lr-mult", "0"], "--head-lr-mult must be > 0"),
        (
            ["--drafter", "dspark", "--warm-start", "/nonexistent"],
            "--warm-start /nonexistent: not a drafter folder",
        ),
    ],
)
def test_train_flags_fail_in_one_line(tmp_path, capsys, flags, message):
    from dspark.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", *flags, "--data", "tiny-corpus", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"dspark: error: {message}" in err and err.count("\n") == 1

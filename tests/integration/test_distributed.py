"""Two real gloo processes give the same training result as one (DESIGN §6).

The processes are spawned with the environment torchrun would give them (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT) and join through
:func:`dspark.training.distributed.launch`. Each trains the stand-in drafter for 3
steps with global batch 4 = micro 2 x 2 processes, once behind DDP and once behind
FSDP2, then real DSpark (with a mask token and with a learned mask input) and Eagle3 drafters
behind FSDP2; one process trains the same global
batch as micro 2 x 2 accumulation steps (and the stand-in as one micro-batch of 4).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from dspark.drafters.dspark import DSparkConfig, DSparkDrafter
from dspark.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from dspark.training import distributed
from dspark.training.checkpoint import load_checkpoint
from dspark.training.trainer import TrainConfig, train
from tests.unit.training.toy_drafter import ToyConfig, ToyDrafter, tiny_target, toy_samples

STEPS = 3


def _config(out: str, name: str, micro: int, parallel: str = "ddp") -> TrainConfig:
    return TrainConfig(
        output_dir=f"{out}/{name}", max_steps=STEPS, global_batch_size=4, micro_batch_size=micro, lr=1e-3,
        num_anchors=None, parallel=parallel, save_every=0, log_every=1, eval_every=STEPS, progress=False,
    )  # fmt: skip


def _probe(drafter: ToyDrafter, step: int = STEPS) -> dict[str, float]:
    """An online evaluation reading weights outside forward (FSDP keeps them sharded there)."""
    with torch.no_grad():
        return {"probe": float(drafter.fc.weight.sum() + drafter.layers[0](torch.ones(1, 32)).sum())}


def _run(cfg: TrainConfig, world=None) -> ToyDrafter:
    target = tiny_target()
    torch.manual_seed(1 + (world.rank if world else 0))  # ranks start apart: wrapping must sync them
    drafter = ToyDrafter(ToyConfig(), target)
    train(cfg, target, drafter, toy_samples(12), world=world, online_eval=_probe)
    return drafter


REAL = {
    "dspark": (DSparkDrafter, DSparkConfig(num_layers=2, block_size=3, mask_token_id=63, markov_rank=4)),
    # A learned mask input is the held backbone's own parameter: FSDP2 must shard and train it.
    "dspark-mask": (
        DSparkDrafter,
        DSparkConfig(num_layers=2, block_size=3, mask_embedding=True, markov_rank=4),
    ),
    "eagle3": (Eagle3Drafter, Eagle3Config(block_size=3)),
}


def _run_real(kind: str, cfg: TrainConfig, world=None) -> None:
    """A real drafter: sampled anchors, block masks, frozen shared weights, extra layer methods."""
    target = tiny_target()
    torch.manual_seed(1)
    cls, config = REAL[kind]
    train(
        dataclasses.replace(cfg, num_anchors=2),
        target,
        cls.from_target(target, config),
        toy_samples(12),
        world=world,
    )


def _worker(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    torch.set_num_threads(1)
    with distributed.launch("cpu") as world:
        assert (world.rank, world.world_size, world.is_main) == (rank, world_size, rank == 0)
        for parallel in ("ddp", "fsdp"):
            drafter = _run(_config(out, parallel, micro=2, parallel=parallel), world)
            assert len(drafter.seen) == STEPS  # one micro-batch per process per step
            Path(f"{out}/{parallel}-seen-rank{rank}.json").write_text(json.dumps(drafter.seen))
        for kind in REAL:
            _run_real(kind, _config(out, f"{kind}-fsdp", micro=2, parallel="fsdp"), world)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weights(path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "checkpoints" / f"step_{STEPS:08d}" / "model.safetensors"))


def test_two_gloo_processes_equal_one(tmp_path):
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    accumulated = _run(_config(str(tmp_path), "single-accum", micro=2))
    one_batch = _run(_config(str(tmp_path), "single-batch", micro=4))
    reference = _weights(tmp_path / "single-accum")
    assert reference.keys() == accumulated.state_dict().keys()
    assert not torch.equal(reference["fc.weight"], ToyDrafter(ToyConfig(), tiny_target()).fc.weight)
    for name in ("ddp", "fsdp", "single-batch"):
        got = _weights(tmp_path / name)
        assert got.keys() == reference.keys(), name
        for k in reference:
            torch.testing.assert_close(got[k], reference[k], atol=1e-5, rtol=0, msg=f"{name}: {k}")
    for kind in REAL:
        _run_real(kind, _config(str(tmp_path), f"{kind}-single", micro=2))
        single, sharded = _weights(tmp_path / f"{kind}-single"), _weights(tmp_path / f"{kind}-fsdp")
        assert sharded.keys() == single.keys()
        for k in single:
            torch.testing.assert_close(sharded[k], single[k], atol=1e-5, rtol=0, msg=f"{kind}: {k}")
    for k, v in one_batch.state_dict().items():
        torch.testing.assert_close(v, reference[k], atol=1e-5, rtol=0)
    # The ranks saw disjoint halves of each step's samples; together, what one process saw.
    for name in ("ddp", "fsdp"):
        seen = [json.loads((tmp_path / f"{name}-seen-rank{r}.json").read_text()) for r in (0, 1)]
        assert [a + b for a, b in zip(*seen)] == [
            sum(accumulated.seen[2 * s : 2 * s + 2], []) for s in range(STEPS)
        ]
        # Only rank 0 wrote, and the optimizer state is whole (not a shard).
        ckpt = load_checkpoint(tmp_path / name / "checkpoints" / f"step_{STEPS:08d}")
        ref = load_checkpoint(tmp_path / "single-accum" / "checkpoints" / f"step_{STEPS:08d}")
        for param, state in ref.optimizer_state["state"].items():
            torch.testing.assert_close(
                ckpt.optimizer_state["state"][param]["exp_avg"], state["exp_avg"], atol=1e-6, rtol=0
            )
        assert ckpt.trainer_state["world_size"] == 2
        assert len(ckpt.rng) == 2
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == STEPS
        assert abs(rows[-1]["eval/probe"] - _probe(accumulated)["probe"]) < 1e-4

"""The distributed helpers in a single process: one code path, every helper a no-op (DESIGN §6)."""

from __future__ import annotations

import torch
from torch import nn

from dspark.training import distributed


def test_single_process_world(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    world = distributed.init_from_env("cpu")
    assert (world.rank, world.world_size, world.is_main, world.distributed) == (0, 1, True, False)
    assert not torch.distributed.is_initialized()
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(distributed.all_reduce_sum(t), t) and distributed.all_reduce_sum(t) is not t
    assert distributed.all_gather_objects({"a": 1}) == [{"a": 1}]
    assert distributed.broadcast_object(3) == 3
    distributed.barrier()
    distributed.teardown()


def test_wrap_sync_and_full_state_round_trip():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    module[1].requires_grad_(False)
    world = distributed.World()
    assert distributed.wrap(module, world, "fsdp") is module and distributed.unwrap(module) is module
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=0.1)
    with distributed.gradient_sync(module, enabled=False), distributed.full_params(module):
        module(torch.ones(2, 3)).sum().backward()
    norm = distributed.clip_grad_norm(module[0].parameters(), 1e-3)
    assert (
        norm > 1e-3
        and torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in module[0].parameters()])) <= 1.01e-3
    )
    opt.step()
    model_state = {k: v.clone() for k, v in distributed.full_model_state(module).items()}
    assert model_state.keys() == module.state_dict().keys()
    optim_state = distributed.full_optimizer_state(module, opt)
    assert set(optim_state["state"]) == {"0.weight", "0.bias"}  # keyed by name, frozen layer absent

    torch.manual_seed(1)
    fresh = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    fresh[1].requires_grad_(False)
    fresh_opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=0.1)
    distributed.load_full_state(fresh, fresh_opt, model_state, optim_state)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, model_state[k]), k
    got = fresh_opt.state_dict()["state"]
    want = opt.state_dict()["state"]
    assert all(torch.equal(got[i][key], want[i][key]) for i in want for key in want[i])

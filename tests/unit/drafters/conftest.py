"""Fixtures of the drafter tests (builders live in ``builders.py``)."""

from __future__ import annotations

import pytest
import torch

from dspark.targets import TargetAdapter

from .builders import DRAFTERS, build


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny ops run fastest single-threaded; on 2 shared cores torch's thread pool spins."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def target(tiny_qwen3) -> TargetAdapter:
    return TargetAdapter(tiny_qwen3)


@pytest.fixture(params=DRAFTERS)
def drafter(request, target):
    return build(request.param, target)

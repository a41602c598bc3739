"""`dspark bench serve`'s measurement loop on a tiny random target: coherent points, a plot."""

from __future__ import annotations

import pytest

from dspark.bench.serve_load import PLAIN, bench_serve, plot_load
from dspark.drafters.ngram import NgramDrafter
from dspark.targets import TargetAdapter

from .server_harness import SPS


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> TargetAdapter:
    from tests.unit.data.tiny_chat_target import build_tiny_chat_target

    return TargetAdapter.from_pretrained(build_tiny_chat_target(tmp_path_factory.mktemp("chat_target")))


def test_closed_loop_points_per_policy_and_plot(target, tmp_path):
    prompts = [f"Explain topic {i}. " * 3 for i in range(5)]
    points = bench_serve(
        target,
        NgramDrafter(target.vocab_size),
        ["fixed", "prefix", PLAIN],
        [1, 3],
        prompts,
        max_tokens=8,
        requests_per_client=2,
        block_size=4,
        max_seq_len=128,
        sps=SPS,
        payoff=False,  # the policies as defined (the payoff controller would rightly skip n-gram here)
    )
    assert [(p.policy, p.concurrency) for p in points] == [
        (policy, c) for policy in ("fixed", "prefix", PLAIN) for c in (1, 3)
    ]
    for p in points:
        assert p.requests == 2 * p.concurrency and p.tokens == 8 * p.requests  # random target: no EOS
        assert p.throughput > 0 and p.per_user > 0 and p.tau >= 1.0
        assert 0 <= p.verify_budget <= 4
    plain = [p for p in points if p.policy == PLAIN]
    assert all(p.tau == 1.0 and p.verify_budget == 0 for p in plain)
    assert all(p.verify_budget > 0 for p in points if p.policy == "fixed")
    png = plot_load(points, tmp_path / "plot.png")
    assert png.read_bytes()[:4] == b"\x89PNG"

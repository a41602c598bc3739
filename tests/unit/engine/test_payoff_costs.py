"""What the payoff controller prices drafting with (issue 17): the model drafter's seconds per
call and per request, the clock they are read on, and a step's seconds without the drafter's.
Hand-made timings only: no assertion reads a wall clock."""

from __future__ import annotations

import time

import pytest

from dspark.engine.payoff_drafting import PayoffDrafting, pricing_clock

from .conftest import VOCAB
from .drafters import NoisyOracleDrafter


def test_the_model_is_never_priced_free_before_a_call_without_a_first_proposal(target, sps):
    """Calls holding some request's first model proposal (its whole prompt) price the model
    until a call without one was timed; then only those do."""
    from dspark.engine.payoff_drafting import MODEL, PayoffDrafting

    from .test_engine_drafters import build

    payoff = PayoffDrafting(build("dflash", target), VOCAB, 4, sps)
    assert MODEL not in payoff.costs(8).draft_s  # nothing timed yet: the optimistic first try
    payoff.first_costs.observe(8, 0.080)
    first = payoff.costs(8).draft_s[MODEL]
    assert first > 0 and payoff.model_call_s(8) + 8 * first == pytest.approx(0.080)
    payoff.model_costs.observe(8, 0.008)
    assert payoff.model_call_s(8) + 8 * payoff.costs(8).draft_s[MODEL] == pytest.approx(0.008)


def test_a_chain_drafters_calls_of_one_size_split_over_one_row_per_request(target, sps):
    """While every call was of one size, its seconds are split per call and per request like
    the target's step line over the rows a request adds to a drafter forward: ``K + 1`` for a
    block drafter (DFlash), 1 for Eagle3's chain (a forward per draft). On the same step line
    ``a + b·B``, per call : per request is ``a : b`` for the chain and ``a : 5b`` for a block of
    K = 4: five times as much of a call is per call for the chain."""
    from dspark.engine.payoff_drafting import PayoffDrafting
    from dspark.protocols import draft_rows_per_request

    from .test_engine_drafters import build

    shares = {}
    for name, rows in (("eagle3", 1), ("dflash", 5)):
        drafter = build(name, target)
        assert draft_rows_per_request(drafter, 4) == rows
        payoff = PayoffDrafting(drafter, VOCAB, 4, sps)
        payoff.model_costs.observe(1, 0.026)  # one call of one request
        call_s, per_request = payoff.model_split(16)
        assert call_s + per_request == pytest.approx(0.026)  # the observation, at its own size
        shares[name] = call_s / per_request
    assert shares["eagle3"] == pytest.approx(5 * shares["dflash"])


def test_costs_are_priced_on_the_engine_threads_cpu_clock_for_a_one_thread_cpu_target():
    assert pricing_clock("cpu", threads=1) is time.thread_time
    assert pricing_clock("cpu", threads=2) is time.perf_counter  # waits of other threads may sleep
    assert pricing_clock("cuda", threads=1) is time.perf_counter


def test_a_step_is_priced_without_the_model_drafters_seconds(sps):
    """The model drafter's calls and updates in a step are priced as drafting: the step-time
    line gets the rest of the step (forward, sampling, verification, bookkeeping)."""
    payoff = PayoffDrafting(NoisyOracleDrafter({}, VOCAB), VOCAB, 4, sps)
    payoff.start_step()
    payoff.model_step_s = 0.003  # as propose() and observe_update() add it
    payoff.observe_step(8, 0.010)
    assert payoff.step_times.line.wy == pytest.approx(0.007) and payoff.step_times.line.wx == 8
    payoff.observe_step(8, 0.010)  # the next step starts from zero drafting seconds
    assert payoff.step_times.line.wy == pytest.approx(0.95 * 0.007 + 0.010)

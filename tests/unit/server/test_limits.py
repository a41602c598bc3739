"""Request limits of the server (issue 15): preparation time, template-controlling kwargs, byte bound."""

from __future__ import annotations

import asyncio
import time

import pytest

from dspark.server.errors import ApiError
from dspark.server.limits import Preparer, max_token_bytes, template_variables


def test_slow_preparation_is_a_503_and_the_event_loop_stays_free():
    preparer = Preparer(timeout_s=0.2)
    ticks = []

    async def main():
        async def tick():
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        try:
            with pytest.raises(ApiError) as e:
                await preparer.run(lambda: time.sleep(1.0))
        finally:
            ticker.cancel()
        return e.value

    started = time.perf_counter()
    error = asyncio.run(main())
    assert error.status == 503 and "longer than 0.2 s" in error.message
    assert time.perf_counter() - started < 0.9  # answered at the limit, not when the work ended
    assert max(b - a for a, b in zip(ticks, ticks[1:])) < 0.1  # the loop kept running meanwhile
    preparer.close()


def test_template_control_keys_are_refused_and_variables_pass():
    assert template_variables({"enable_thinking": False}) == {"enable_thinking": False}
    assert template_variables(None) == {}
    for key in ("chat_template", "tokenize", "return_dict", "tools"):
        with pytest.raises(ApiError, match=key):
            template_variables({key: "x", "enable_thinking": True})


def test_max_token_bytes_bounds_every_token():
    class Vocab:
        def get_vocab(self):
            return {"a": 0, "ĠĠĠĠ": 1, "é": 2}

    assert max_token_bytes(Vocab()) == 8  # "Ġ" is 2 bytes in UTF-8

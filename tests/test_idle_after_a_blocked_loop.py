"""An engine's silence is judged from its pipe, not from how long the
caller was away: an event loop blocked (by another task's CPU work) for
longer than ``io_timeout_s`` while a call with a deadline waited must not
fail a healthy engine whose answers wait in its pipe."""

import asyncio
import time

from subwabbit import (AsyncVowpalWabbitPool, AsyncVowpalWabbitProcess,
                       VowpalWabbitDummyFormatter)

ITEMS = ["|i " + " ".join(f"f{k}" for k in range(20))] * 50


async def _call_across_a_blocked_loop(model, timeout: float) -> list:
    task = asyncio.ensure_future(model.predict("", ITEMS, timeout=timeout))
    await asyncio.sleep(0)  # the call writes its lines and waits for the answers
    time.sleep(1.0)  # another task holds the loop, past io_timeout_s
    return await task


def test_async_call_with_a_deadline_after_a_blocked_loop_keeps_a_healthy_engine():
    async def main() -> None:
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"],
                                         io_timeout_s=0.3)
        await model.start()
        try:
            pid = model.pid
            for _ in range(3):
                assert len(await _call_across_a_blocked_loop(model, 10.0)) == len(ITEMS)
            assert model.pid == pid
            assert len(await model.predict("", ITEMS, timeout=10.0)) == len(ITEMS)
        finally:
            await model.close()

    asyncio.run(main())


def test_async_pool_call_past_its_deadline_after_a_blocked_loop_fails_no_engine():
    # The loop wakes the call after its deadline, when nothing is read any
    # more: engines whose answers wait unread were taken for stuck.
    async def main() -> None:
        pool = AsyncVowpalWabbitPool(VowpalWabbitDummyFormatter(), ["--quiet"], size=2,
                                     io_timeout_s=0.3)
        await pool.start()
        try:
            pids = sorted(pool.engine_pids())
            for _ in range(3):
                await _call_across_a_blocked_loop(pool, 0.2)
            await asyncio.sleep(0.5)
            assert sorted(pool.engine_pids()) == pids
        finally:
            await pool.close()

    asyncio.run(main())

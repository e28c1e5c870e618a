"""The asyncio pool against real engines, on real event loops: split calls,
many tasks at once, deadlines, cancellation, reloads, failed engines, close."""

import asyncio
import gc
import logging
import os
import shutil
import signal
import sys
import threading
import time
import warnings
import weakref

import pytest

from subwabbit import AsyncVowpalWabbitPool, VowpalWabbitError, VowpalWabbitStartupError
from subwabbit.command import default_engine_command

from conftest import (CyclesLeft, DictFormatter, children_of_this_process, common, in_child,
                      items, proc_stat, process_gone, scoring_args, slow_starting_engine,
                      wait_until, warnings_of)


def run(coroutine):
    return asyncio.run(coroutine)


def test_split_calls_from_many_tasks_each_get_their_own_predictions(trained_model, truth):
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=2) as pool:
            metrics = {}
            whole = await pool.predict(common(1), items(3000), metrics=metrics)
            assert whole == truth[trained_model][1]
            assert metrics["engines"] == 2
            assert (pool.batch_size, pool.max_pending_lines) == (100, 200)

            async def caller(user, index):
                size = 50 + (index * 397) % 2950
                timeout = None if index % 4 == 0 else 0.010
                got = await pool.predict(common(user), items(size), timeout=timeout)
                assert got == truth[trained_model][user][:len(got)]
                if timeout is None:
                    assert len(got) == size
                return len(got)

            counts = await asyncio.gather(*(caller(user, index)
                                            for user in range(6) for index in range(12)))
            assert len(counts) == 72 and sum(counts) > 0
            return pool.stats()

    stats = run(main())
    assert stats["calls"] == 73


def test_calls_leave_no_reference_cycles(trained_model, truth):
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=2) as pool:
            await pool.predict(common(0), items(3000), timeout=0.005)
            with CyclesLeft() as cycles:
                for user in range(4):
                    got = await pool.predict(common(user), items(3000) * 5, timeout=0.005)
                    assert got == (truth[trained_model][user] * 5)[:len(got)]
                    whole = await pool.predict(common(user), items(3000))
                    assert whole == truth[trained_model][user]
            return cycles.names

    assert run(main()) == []


def test_a_waiting_call_is_not_starved_by_a_task_that_calls_back_to_back(trained_model, truth):
    # The task in a loop gave its engine back and took it again before the
    # waiting task ran (no await between its calls): the waiting call
    # returned [] at its deadline. Waiting calls now come first.
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1,
                                         io_timeout_s=2.0) as pool:
            stop = False
            loop_calls = 0

            async def back_to_back():
                nonlocal loop_calls
                while not stop:
                    await pool.predict(common(0), items(3000))
                    loop_calls += 1

            looping = asyncio.ensure_future(back_to_back())
            try:
                while loop_calls < 2:
                    await asyncio.sleep(0.01)
                metrics = {}
                got = await pool.predict(common(1), items(300), timeout=0.5, metrics=metrics)
                unbounded = await pool.predict(common(2), items(300))
            finally:
                stop = True
                await asyncio.wait_for(looping, 30)
            return got, unbounded, metrics, loop_calls

    got, unbounded, metrics, loop_calls = run(asyncio.wait_for(main(), 60))
    assert got == truth[trained_model][1][:300], (len(got), loop_calls, metrics)
    assert metrics["waited_for_other_call"] == 1
    assert unbounded == truth[trained_model][2][:300]


def test_a_waiting_task_with_a_longer_budget_is_not_starved_by_shorter_ones(trained_model,
                                                                          truth):
    # As the thread pool's: a 50 ms call came first for 5 ms only, then
    # after every new 10 ms call of two tasks calling back to back.
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=1) as pool:
            stop = False

            async def back_to_back():
                while not stop:
                    await pool.predict(common(0), items(3000), timeout=0.010)

            looping = [asyncio.ensure_future(back_to_back()) for _ in range(2)]
            lengths = []
            try:
                await asyncio.sleep(0.05)
                for _ in range(40):
                    got = await pool.predict(common(1), items(3000), timeout=0.050)
                    assert got == truth[trained_model][1][:len(got)]
                    lengths.append(len(got))
                    await asyncio.sleep(0.010)
            finally:
                stop = True
                await asyncio.wait_for(asyncio.gather(*looping), 30)
            return lengths

    lengths = run(asyncio.wait_for(main(), 60))
    assert sum(1 for length in lengths if length) >= 30, lengths


def test_a_start_that_a_reload_overtakes_leaves_the_reloaded_model_alone(
        trained_model, second_model, truth, tmp_path):
    # start() read the generation after its engines had started: a reload()
    # that switched models meanwhile got the first model's engines too, and
    # calls mixed the two models (found by a review).
    flag = tmp_path / "slow"
    wrapper = tmp_path / "slow_for_one_model.py"
    wrapper.write_text(
        "import os, sys, time\n"
        f"if os.path.exists({str(flag)!r}) and {trained_model!r} in sys.argv:\n"
        "    time.sleep(1.5)\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n")
    command = [sys.executable, str(wrapper)] + default_engine_command()
    flag.write_text("")

    async def main():
        pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                                     vw_command=command)
        starting = asyncio.ensure_future(pool.start())
        await asyncio.sleep(0.2)  # start() is loading the first model, slowly
        await pool.reload(scoring_args(second_model))  # the second one switches first
        await asyncio.wait_for(starting, 30)
        generation, engines = pool.generation, len(pool.engine_pids())
        got = [await pool.predict(common(user), items(3000)) for user in range(6)]
        await pool.close()
        return generation, engines, got

    generation, engines, got = run(asyncio.wait_for(main(), 60))
    assert (generation, engines) == (1, 2)
    assert got == [truth[second_model][user] for user in range(6)]
    assert wait_until(lambda: not children_of_this_process())


@pytest.mark.parametrize("size", [1, 2])
def test_a_replacement_that_an_ending_event_loop_cut_short_is_started_again(
        trained_model, truth, tmp_path, size):
    # The loop that ended cancelled the task starting the replacement, and
    # nothing started it again: the pool stayed an engine short for good,
    # and with one engine every call returned [] (found by a review).
    flag, command = slow_starting_engine(tmp_path, 0.5)
    pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=size,
                                 vw_command=command)

    async def first_loop():
        await pool.start()
        flag.write_text("")  # engines start slowly from now on
        victim = pool.engine_pids()[0]
        os.kill(victim, signal.SIGKILL)
        assert process_gone(victim)
        await pool.predict(common(1), items(3000), timeout=0.05)  # a replacement is due
        await asyncio.sleep(0.1)  # it is starting when the loop ends

    async def second_loop():
        got = []
        for _ in range(40):
            got.append(await pool.predict(common(2), items(300), timeout=0.05))
            if len(pool.engine_pids()) == size and got[-1]:
                break
            await asyncio.sleep(0.1)
        stats = pool.stats()
        await pool.close()
        return stats, got

    run(first_loop())
    flag.unlink()
    stats, got = run(second_loop())
    assert all(each == truth[trained_model][2][:len(each)] for each in got)
    assert stats["engines"] == size and got[-1], (stats, [len(each) for each in got])


def test_a_forked_childs_own_engines_that_an_ending_event_loop_cut_short_start_again(
        trained_model, truth, tmp_path):
    flag, command = slow_starting_engine(tmp_path, 0.5)

    async def in_the_child(pool):
        flag.write_text("")
        await pool.predict(common(1), items(300), timeout=0.001)  # starts its own engines
        await asyncio.sleep(0.1)  # they are starting when the loop ends

    async def in_the_child_later(pool):
        got = []
        deadline = time.monotonic() + 20
        while not (got and got[-1]) and time.monotonic() < deadline:
            got.append(await pool.predict(common(2), items(300), timeout=0.05))
            await asyncio.sleep(0.1)
        # (the first call that gets answers may get only some by its deadline
        # on a loaded machine: all of them come without one)
        if got[-1]:
            got.append(await pool.predict(common(2), items(300)))
        engines = len(pool.engine_pids())
        await pool.close()
        return ([each == truth[trained_model][2][:len(each)] for each in got],
                [len(each) for each in got[-2:]], engines)

    def child():
        asyncio.run(in_the_child(pool))
        flag.unlink()
        return asyncio.run(in_the_child_later(pool))

    async def main():
        async with pool:
            return in_child(child)

    pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                                 vw_command=command)
    result = run(main())
    assert "ok" in result, result
    exact, lengths, engines = result["ok"]
    assert all(exact) and lengths[0] > 0 and lengths[-1] == 300 and engines == 2, result


def test_deadline_waiting_for_an_engine_and_a_loop_that_keeps_turning(trained_model, truth):
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=1) as pool:
            gaps = []

            async def ticker():
                last = time.perf_counter()
                while True:
                    await asyncio.sleep(0.001)
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now

            tick = asyncio.ensure_future(ticker())
            long_call = asyncio.ensure_future(pool.predict(common(4), items(3000) * 30))
            await asyncio.sleep(0.02)
            metrics = {}
            began = time.perf_counter()
            got = await pool.predict(common(5), items(100), timeout=0.005, metrics=metrics)
            took = time.perf_counter() - began
            assert took < 0.005 + 0.1
            assert got == truth[trained_model][5][:len(got)]
            assert metrics["waited_for_other_call"] == 1
            assert await long_call == truth[trained_model][4] * 30
            tick.cancel()
            assert max(gaps) < 0.1

    run(main())


def test_a_cancelled_call_leaves_every_engine_exact(trained_model, truth):
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=2) as pool:
            for delay in (0.0, 0.001, 0.003):
                task = asyncio.ensure_future(pool.predict(common(2), items(3000) * 10))
                await asyncio.sleep(delay)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(pool.predict(common(3), items(3000) * 10), 0.002)
                assert await pool.predict(common(0), items(3000)) == truth[trained_model][0]
            assert pool.stats()["engines_busy"] == 0

    run(main())


def test_reload_with_no_failed_or_mixed_call(trained_model, second_model, truth):
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=2) as pool:
            stop = False
            served = {0: 0, 1: 0}

            async def caller(user):
                while not stop:
                    metrics = {}
                    got = await pool.predict(common(user), items(3000), timeout=0.050,
                                             metrics=metrics)
                    generation = metrics["model_generation"]
                    if generation is None:
                        assert got == []
                        continue
                    model = trained_model if generation == 0 else second_model
                    assert got == truth[model][user][:len(got)]
                    served[generation] += 1

            callers = [asyncio.ensure_future(caller(user)) for user in range(3)]
            await asyncio.sleep(0.2)
            await pool.reload(scoring_args(second_model))
            await asyncio.sleep(0.2)
            stop = True
            await asyncio.gather(*callers)
            assert served[0] > 0 and served[1] > 0
            with pytest.raises(VowpalWabbitStartupError):
                await pool.reload(["-i", "/nonexistent/model.vw", "-t", "--quiet"])
            assert await pool.predict(common(1), items(3000)) == truth[second_model][1]

    run(main())


def test_starts_and_reloads_at_once_on_a_second_event_loop(trained_model, second_model, truth):
    """The pool's start and reload locks were asyncio.Locks: one that two
    tasks ever waited for belongs to that loop, and two start() or reload()
    at once on the next loop raised RuntimeError ('bound to a different
    event loop')."""
    pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)

    async def on_the_first_loop():
        await asyncio.gather(pool.start(), pool.start())
        await asyncio.gather(pool.reload(scoring_args(trained_model)),
                             pool.reload(scoring_args(trained_model)))
        return await pool.predict(common(1), items(3000))

    async def on_the_next_loop():
        try:
            await asyncio.gather(pool.start(), pool.start())
            await asyncio.gather(pool.reload(scoring_args(trained_model)),
                                 pool.reload(scoring_args(second_model)))
            return await pool.predict(common(2), items(3000))
        finally:
            await pool.close()

    assert run(on_the_first_loop()) == truth[trained_model][1]
    assert run(on_the_next_loop()) == truth[second_model][2]


def test_a_killed_engine_is_replaced_and_training_is_refused(trained_model, truth):
    async def main():
        pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)
        with pytest.raises(VowpalWabbitError, match="not started"):
            await pool.predict(common(1), items(3))
        await pool.start()
        try:
            with pytest.raises(VowpalWabbitError, match="pool"):
                await pool.train(common(1), items(2), [1, -1])
            os.kill(pool.engine_pids()[1], signal.SIGKILL)
            assert await pool.predict(common(3), items(3000) * 5) == truth[trained_model][3] * 5
            deadline = time.time() + 30
            while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
                await pool.predict(common(2), items(300), timeout=0.010)
                await asyncio.sleep(0.01)
            stats = pool.stats()
            assert stats["engine_failures"] == 1 and stats["engines_replaced"] == 1
            assert stats["engines"] == 2
            assert await pool.predict(common(4), items(3000)) == truth[trained_model][4]
            pids = pool.engine_pids()
            os.kill(pids[0], signal.SIGSTOP)
        finally:
            began = time.perf_counter()
            await pool.close(timeout=1.0)
            assert time.perf_counter() - began < 1.5

    run(main())


def test_engines_that_keep_dying_young_are_replaced_with_a_back_off(trained_model, truth,
                                                                    caplog):
    """As for the thread pool: the replacements of engines that die as
    soon as they are in service wait, up to a second, once more than the
    pool's size died young in a row (before: hundreds in 2 s)."""
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=2) as pool:
            killed = set()
            until = time.monotonic() + 2.0
            with caplog.at_level(logging.WARNING, logger="subwabbit"):
                while time.monotonic() < until:
                    for pid in set(pool.engine_pids()) - killed:
                        killed.add(pid)
                        os.kill(pid, signal.SIGKILL)
                    await asyncio.sleep(0.001)
            assert len(killed) <= 20, len(killed)
            assert "in a row): starting a replacement in 1 s" in caplog.text
            until = time.monotonic() + 5.0
            while pool.stats()["engines"] < 2 and time.monotonic() < until:
                await asyncio.sleep(0.01)
            assert pool.stats()["engines"] == 2
            assert await pool.predict(common(1), items(3000)) == truth[trained_model][1]

    run(main())


def test_an_engine_that_died_idle_is_replaced_before_a_call_can_take_it(trained_model, truth):
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=2) as pool:
            assert await pool.predict(common(1), items(3000)) == truth[trained_model][1]
            victim, survivor = pool.engine_pids()
            os.kill(victim, signal.SIGKILL)
            deadline = time.time() + 10
            while os.path.exists(f"/proc/{victim}") and time.time() < deadline:
                await asyncio.sleep(0.01)  # (its fork server reaps it)
            await asyncio.sleep(0.05)  # and reports its exit status
            metrics = {}
            got = await pool.predict(common(2), items(3000), metrics=metrics)
            assert got == truth[trained_model][2] and metrics["engine_failures"] == 0
            assert pool.stats()["engine_failures"] == 1
            deadline = time.time() + 30
            while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
                await asyncio.sleep(0.01)
            assert survivor in pool.engine_pids() and victim not in pool.engine_pids()
            assert await pool.predict(common(3), items(3000)) == truth[trained_model][3]

    run(main())


def test_a_replacement_that_failed_to_start_is_tried_again(trained_model, truth, tmp_path,
                                                           caplog):
    served, away = tmp_path / "served.vw", tmp_path / "away.vw"
    shutil.copy(trained_model, served)

    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(str(served)), size=2,
                                         share_weights=False) as pool:
            os.rename(served, away)
            victim = pool.engine_pids()[0]
            os.kill(victim, signal.SIGKILL)
            while proc_stat(victim) is not None and proc_stat(victim)[0] != "Z":
                await asyncio.sleep(0.01)
            assert await pool.predict(common(1), items(3000)) == truth[trained_model][1]
            deadline = time.time() + 10
            while "attempt 2" not in caplog.text and time.time() < deadline:
                await asyncio.sleep(0.01)
            assert "attempt 2" in caplog.text and pool.stats()["engines"] == 1
            os.rename(away, served)
            deadline = time.time() + 30
            while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
                await asyncio.sleep(0.01)
            assert pool.stats()["engines"] == 2
            assert await pool.predict(common(2), items(3000)) == truth[trained_model][2]
            os.unlink(served)  # and once more, closing while the replacement waits
            os.kill(pool.engine_pids()[0], signal.SIGKILL)
            await pool.predict(common(3), items(30))
            await asyncio.sleep(0.2)
            began = time.monotonic()
        assert time.monotonic() - began < 5

    with caplog.at_level(logging.WARNING, logger="subwabbit"):
        run(main())


def test_a_pool_dropped_while_a_replacement_waits_is_released(trained_model, tmp_path, caplog):
    served = tmp_path / "served.vw"
    shutil.copy(trained_model, served)

    async def main():
        pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(str(served)), size=2,
                                     share_weights=False)
        await pool.start()
        victim, survivor = pool.engine_pids()
        os.unlink(served)
        os.kill(victim, signal.SIGKILL)
        while proc_stat(victim) is not None and proc_stat(victim)[0] != "Z":
            await asyncio.sleep(0.01)
        await pool.predict(common(1), items(30))
        deadline = time.time() + 10
        while "attempt 1" not in caplog.text and time.time() < deadline:
            await asyncio.sleep(0.01)
        assert "attempt 1" in caplog.text
        dropped = weakref.ref(pool)
        del pool
        deadline = time.time() + 5
        while (gc.collect() >= 0 and dropped() is not None) and time.time() < deadline:
            await asyncio.sleep(0.01)
        assert dropped() is None
        return survivor

    with caplog.at_level(logging.WARNING, logger="subwabbit"), warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        survivor = run(main())
    assert process_gone(survivor)


def test_a_pool_built_before_a_fork_and_started_in_the_child_runs_one_set_of_engines(
        trained_model, truth):
    # A pool built at import under gunicorn --preload, started in each
    # worker's lifespan: the worker's engines are those start() started.
    pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)

    def child():
        async def main():
            with pytest.raises(VowpalWabbitError, match="not started"):
                await pool.predict(common(1), items(30))
            async with pool:
                got = await pool.predict(common(1), items(3000))
                first = pool.engine_pids()
                await asyncio.sleep(1.5)  # time for a second start to show
                return [got == truth[trained_model][1], first, pool.engine_pids(),
                        pool.stats()["engines"], children_of_this_process()]
        return asyncio.run(main())

    result = in_child(child)
    assert "error" not in result, result
    exact, first, later, engines, children = result["ok"]
    assert exact and engines == 2 and later == first and len(first) == 2
    assert len(children) <= 2  # one fork server (or, without one, the two engines)


def test_a_pool_started_before_a_fork_serves_the_child_with_engines_of_its_own(
        trained_model, truth):
    # Forked from a running loop (multiprocessing's fork, say): the child's
    # loop serves calls with the child's own engines, the parent's untouched.
    async def in_the_child(pool):
        first = await pool.predict(common(1), items(300), timeout=0.001)
        got = await pool.predict(common(1), items(3000))
        engines = pool.engine_pids()
        await pool.close()
        return [len(first), got == truth[trained_model][1], engines]

    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=2) as pool:
            parent_engines = pool.engine_pids()
            result = in_child(lambda: asyncio.run(in_the_child(pool)))
            assert "error" not in result, result
            first, exact, engines = result["ok"]
            assert first == 0 and exact and len(engines) == 2
            assert not set(engines) & set(parent_engines)
            assert pool.engine_pids() == parent_engines
            assert await pool.predict(common(2), items(3000)) == truth[trained_model][2]

    run(main())


def test_a_forked_child_that_loads_another_model_file_than_its_parent_warns(
        trained_model, truth, tmp_path):
    served = tmp_path / "served.vw"
    shutil.copy(trained_model, served)

    async def in_the_child(pool):
        warned = warnings_of("subwabbit")
        got = await pool.predict(common(1), items(3000))
        await pool.close()
        return [got == truth[trained_model][1], warned]

    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(str(served)),
                                         size=2) as pool:
            shutil.copy(trained_model, tmp_path / "new.vw")
            os.replace(tmp_path / "new.vw", served)
            result = in_child(lambda: asyncio.run(in_the_child(pool)))
            assert "error" not in result, result
            exact, warned = result["ok"]
            assert exact and len(warned) == 1, warned
            assert f"model file at {served}" in warned[0], warned

    run(main())


def test_a_forked_engine_that_dies_idle_is_replaced_with_no_call_at_all(trained_model, truth):
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=2) as pool:
            victim, survivor = pool.engine_pids()
            os.kill(victim, signal.SIGKILL)
            deadline = time.time() + 30
            while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
                await asyncio.sleep(0.01)
            stats = pool.stats()
            assert stats["engine_failures"] == 1 and stats["engines_replaced"] == 1
            assert stats["calls"] == 0
            assert survivor in pool.engine_pids() and victim not in pool.engine_pids()
            assert await pool.predict(common(3), items(3000)) == truth[trained_model][3]
            await pool.reload(scoring_args(trained_model))
            await asyncio.sleep(0.2)
            assert pool.stats()["engine_failures"] == 1

    run(main())


def test_a_pool_dropped_without_close_stops_its_engines(trained_model):
    async def main():
        pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)
        await pool.start()
        await pool.predict(common(1), items(300))
        return pool.engine_pids() + [pool._groups[0].server.pid]  # pylint: disable=protected-access

    with pytest.warns(ResourceWarning):
        pids = run(main())
    assert all(process_gone(pid, 5.0) for pid in pids)


def test_the_engines_a_dropped_pool_lets_go_are_not_taken_for_failed(trained_model, caplog):
    # Its engines exit once let go, and their fork server says so while the
    # pool is still reachable: that must not count failures or fork
    # replacements for a pool nobody holds (it did in 4 of 10 drops).
    async def main():
        pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)
        await pool.start()
        await pool.predict(common(1), items(300))
        pids = pool.engine_pids() + [pool._groups[0].server.pid]  # pylint: disable=protected-access
        with pytest.warns(ResourceWarning):
            del pool
        await asyncio.sleep(0.3)  # the loop runs what the exits scheduled
        return pids

    for _ in range(10):
        with caplog.at_level("INFO", logger="subwabbit"):
            pids = run(main())
        assert all(process_gone(pid, 5.0) for pid in pids)
        assert not [record for record in caplog.records
                    if "failed" in record.getMessage() or "replace" in record.getMessage()]
        caplog.clear()


def test_a_stopped_engine_is_replaced_after_io_timeout_s(trained_model, truth):
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                                         io_timeout_s=1.0) as pool:
            stopped = pool.engine_pids()[0]
            os.kill(stopped, signal.SIGSTOP)
            deadline = time.time() + 20
            while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
                got = await pool.predict(common(1), items(3000), timeout=0.010)
                assert got == truth[trained_model][1][:len(got)]
                await asyncio.sleep(0.005)
            assert pool.stats()["engine_failures"] == 1
            assert stopped not in pool.engine_pids()
            assert await pool.predict(common(2), items(3000)) == truth[trained_model][2]

    run(main())


def test_close_lets_tasks_in_progress_end_with_their_prefix(trained_model, truth):
    async def main():
        pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)
        await pool.start()
        exchanges = []
        new_exchange = pool._new_exchange

        def watched(*args, **kwargs):
            exchanges.append(new_exchange(*args, **kwargs))
            return exchanges[-1]

        pool._new_exchange = watched
        task = asyncio.ensure_future(pool.predict(common(2), items(3000) * 40))
        # Close once the call has handed out some predictions (a fixed sleep
        # closed a loaded machine's call before its first answer: its prefix
        # was rightly empty).
        deadline = time.perf_counter() + 20
        while not (exchanges and exchanges[0].returned) and time.perf_counter() < deadline:
            await asyncio.sleep(0.001)
        assert not task.done()
        began = time.perf_counter()
        await pool.close(timeout=2.0)
        assert time.perf_counter() - began < 2.5
        got = await task
        assert 0 < len(got) < 120000 and got == (truth[trained_model][2] * 40)[:len(got)]

    run(main())


def test_close_with_a_call_on_a_stopped_engine_returns_within_its_timeout(trained_model):
    async def main():
        pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1)
        await pool.start()
        pid = pool.engine_pids()[0]
        call = asyncio.ensure_future(pool.predict(common(1), items(3000) * 200))
        await asyncio.sleep(0.2)
        os.kill(pid, signal.SIGSTOP)  # the call holds an engine that answers no more
        await asyncio.sleep(0.1)
        began = time.perf_counter()
        await pool.close(timeout=2.0)
        took = time.perf_counter() - began
        await asyncio.wait({call}, timeout=5)
        assert call.done()
        if not call.cancelled() and call.exception() is not None:
            assert isinstance(call.exception(), VowpalWabbitError)
        return took

    assert run(main()) < 2.0 + 0.5  # it took up to 1.5 times the timeout


def test_tasks_starting_the_pool_at_once_start_it_once(trained_model, truth):
    async def main():
        pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)
        groups = []
        new_group = pool._new_group

        def counting(argv, vw_args):
            groups.append(new_group(argv, vw_args))
            return groups[-1]

        pool._new_group = counting
        await asyncio.gather(pool.start(), pool.start(), pool.start())
        engines = pool.engine_pids()
        got = await pool.predict(common(1), items(3000))
        await pool.close()
        return len(groups), engines, got

    groups, engines, got = run(main())
    assert groups == 1 and len(engines) == 2
    assert got == truth[trained_model][1]


def test_the_loop_tells_a_call_which_engines_it_found_readable(trained_model, truth):
    """``wait_for_engines`` returns the stdout descriptors the event loop
    found readable (``None`` when the deadline is too close to sleep), and
    the pool's calls read only those engines and stay exact."""
    from subwabbit.asyncio_process import wait_for_engines

    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=2) as pool:
            first, second = [slot.engine for slot in pool._roster.slots]
            clock = time.perf_counter
            # Nothing printed: the timer ends the wait, with nothing readable.
            assert await wait_for_engines([(first, False), (second, False)],
                                          clock() + 0.05) == []
            assert await wait_for_engines([(first, False)], clock()) is None
            os.write(second.stdin_fd, b"|\n")  # one featureless example
            ready = await wait_for_engines([(first, False), (second, False)], clock() + 10)
            assert ready == [second.stdout_fd]
            assert os.read(second.stdout_fd, 100).count(b"\n") == 1
            for user in range(3):
                whole = await pool.predict(common(user), items(3000))
                assert whole == truth[trained_model][user]
                got = await pool.predict(common(user), items(3000) * 10, timeout=0.005)
                assert got == (truth[trained_model][user] * 10)[:len(got)]

    run(main())



def test_a_call_without_a_deadline_on_a_stopped_engine_fails_over_after_io_timeout_s(
        trained_model, truth):
    """As with threads: a call of one batch waits on the event loop right
    after writing it, and that wait ends within io_timeout_s."""
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=1, io_timeout_s=0.5) as pool:
            assert await pool.predict(common(1), items(10)) == truth[trained_model][1][:10]
            stopped = pool.engine_pids()[0]
            os.kill(stopped, signal.SIGSTOP)
            try:
                began = time.perf_counter()
                got = await asyncio.wait_for(pool.predict(common(2), items(10)), 10)
                took = time.perf_counter() - began
            finally:
                try:
                    os.kill(stopped, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            assert took < 5 and got == truth[trained_model][2][:10]
            assert pool.stats()["engine_failures"] == 1
            assert stopped not in pool.engine_pids()

    run(main())


class _HeldFormatter(DictFormatter):
    """Holds the loop of a call whose request says ``hold`` until ``gate`` opens."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.holding = threading.Event()

    def format_common_features(self, common_features, debug_info=None):
        if common_features.get("hold"):
            self.holding.set()
            self.gate.wait(30)
        return super().format_common_features(common_features, debug_info)


def test_a_call_of_a_second_event_loop_running_at_once_is_refused(trained_model, truth):
    """A pool serves one running event loop at a time: a call of a loop in
    another thread, while calls of the first are in progress, waited for an
    engine until its own deadline (or io_timeout_s), unwoken, and returned
    nothing (found by a review). It is refused; once the first loop's calls
    have ended, the second loop is served."""
    formatter = _HeldFormatter()
    pool = AsyncVowpalWabbitPool(formatter, scoring_args(trained_model), size=1)
    run(pool.start())
    first: list = []

    def first_loop():
        first.append(run(pool.predict(dict(common(1), hold=True), items(300))))

    thread = threading.Thread(target=first_loop)
    thread.start()
    try:
        assert formatter.holding.wait(30)
        with pytest.raises(VowpalWabbitError, match="one event loop at a time"):
            run(pool.predict(common(2), items(300), timeout=5.0))
    finally:
        formatter.gate.set()
        thread.join(60)
    assert first == [truth[trained_model][1][:300]]
    assert run(pool.predict(common(2), items(300), timeout=5.0)) == truth[trained_model][2][:300]
    run(pool.close())

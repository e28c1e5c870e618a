"""Both pools under stress, against real engines: threads calling while the
model is reloaded, engines are killed and the process forks; tasks calling,
cancelled at random points and cut short by ``asyncio.wait_for`` while the
model is reloaded and engines are killed. Every call's predictions must be
exactly those of the model that served it (``metrics["model_generation"]``),
no later than a second past its deadline (a loose bound: the calls share 2
cores with reloads, kills and forks; other tests check deadlines closely),
and nothing may hang."""

import asyncio
import os
import random
import signal
import threading
import time

import pytest

from subwabbit import AsyncVowpalWabbitPool, VowpalWabbitError, VowpalWabbitPool

from conftest import DictFormatter, common, in_child, items, scoring_args


def _random_call(rng):
    """A random request: the user, how many items, the timeout."""
    return (rng.randrange(6), rng.choice([1, 30, 250, 1000, 3000]),
            rng.choice([None, 0.002, 0.010, 0.050]))


def _check_call(got, metrics, user, size, timeout, took, models, errors, served):
    """Record in ``errors`` what is wrong with a call's predictions: late,
    not those of the model that served it, short without a deadline."""
    if timeout is not None and took > timeout + 1.0:
        errors.append(("late", timeout, took, size))
    generation = metrics["model_generation"]
    if generation is None:
        if got:
            errors.append(("predictions without a generation", len(got)))
        return
    model = models[generation % 2]
    if got != model[user][:len(got)]:
        errors.append(("wrong or mixed", user, generation, len(got), size))
    elif timeout is None and len(got) != size:
        errors.append(("short without deadline", len(got), size))
    served.append(generation)


def _kill_one_engine(pool, rng):
    pids = pool.engine_pids()
    if pids:
        try:
            os.kill(rng.choice(pids), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _worker(pool, models, stop, errors, served, seed):
    rng = random.Random(seed)
    while not stop.is_set():
        user, size, timeout = _random_call(rng)
        metrics = {}
        began = time.perf_counter()
        try:
            got = pool.predict(common(user), items(size), timeout=timeout, metrics=metrics)
        except VowpalWabbitError as exc:
            if stop.is_set():
                return
            if "a reload has replaced that model" in str(exc):
                continue  # documented: old-model engines died after a reload
            errors.append(("raised", repr(exc)))
            continue
        _check_call(got, metrics, user, size, timeout, time.perf_counter() - began, models,
                    errors, served)


@pytest.mark.parametrize("round_", range(2))
def test_threads_reloads_and_kills(trained_model, second_model, truth, round_):
    models = [truth[trained_model], truth[second_model]]
    args = [scoring_args(trained_model), scoring_args(second_model)]
    pool = VowpalWabbitPool(DictFormatter(), args[0], size=2, io_timeout_s=2.0)
    stop = threading.Event()
    errors, served = [], []
    threads = [threading.Thread(target=_worker, args=(pool, models, stop, errors, served, k))
               for k in range(4)]
    for thread in threads:
        thread.start()
    rng = random.Random(round_)
    try:
        for step in range(12):
            time.sleep(rng.uniform(0.02, 0.15))
            action = rng.choice(["reload", "kill", "kill", "sleep"])
            if action == "reload":
                pool.reload(args[(pool.generation + 1) % 2])
            elif action == "kill":
                _kill_one_engine(pool, rng)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(20)
        alive = [t for t in threads if t.is_alive()]
        began = time.perf_counter()
        pool.close(timeout=3.0)
        closing = time.perf_counter() - began
    assert not alive
    assert closing < 3.5
    assert errors == [], errors[:10]
    assert served


@pytest.mark.parametrize("round_", range(2))
def test_fork_while_threads_call_and_reload(trained_model, second_model, truth, round_):
    models = [truth[trained_model], truth[second_model]]
    args = [scoring_args(trained_model), scoring_args(second_model)]
    pool = VowpalWabbitPool(DictFormatter(), args[0], size=2, io_timeout_s=2.0)
    stop = threading.Event()
    errors, served = [], []
    threads = [threading.Thread(target=_worker, args=(pool, models, stop, errors, served, k))
               for k in range(3)]
    for thread in threads:
        thread.start()
    reloading = threading.Event()

    def reloader():
        k = 0
        while not stop.is_set():
            time.sleep(0.05)
            k += 1
            try:
                pool.reload(args[k % 2])
            except VowpalWabbitError:
                return

    rel = threading.Thread(target=reloader)
    rel.start()
    children = []
    try:
        for _ in range(4):
            time.sleep(0.1)

            def body():
                found = []
                gen0 = pool.generation
                cerr, cserved = [], []
                cstop = threading.Event()
                cthreads = [threading.Thread(target=_worker,
                                             args=(pool, models, cstop, cerr, cserved, 100 + k))
                            for k in range(2)]
                for t in cthreads:
                    t.start()
                time.sleep(1.0)
                cstop.set()
                for t in cthreads:
                    t.join(10)
                if any(t.is_alive() for t in cthreads):
                    found.append("child thread hung")
                began = time.perf_counter()
                pool.close(timeout=2.0)
                if time.perf_counter() - began > 2.5:
                    found.append("child close late")
                return {"errors": cerr[:5] + found, "served": len(cserved), "gen": gen0}

            children.append(in_child(body, limit_s=30))
        time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads + [rel]:
            thread.join(20)
        pool.close(timeout=3.0)
    assert errors == [], errors[:10]
    for child in children:
        assert "ok" in child, child
        assert child["ok"]["errors"] == [] and child["ok"]["served"] > 0, child


async def _checked_call(pool, models, rng, errors, served):
    user, size, timeout = _random_call(rng)
    metrics = {}
    began = time.perf_counter()
    try:
        got = await pool.predict(common(user), items(size), timeout=timeout, metrics=metrics)
    except VowpalWabbitError as exc:
        if "a reload has replaced that model" not in str(exc):
            errors.append(("raised", repr(exc), size, time.perf_counter() - began, repr(pool),
                           pool.stats()))
        return
    _check_call(got, metrics, user, size, timeout, time.perf_counter() - began, models,
                errors, served)


@pytest.mark.parametrize("round_", range(2))
def test_cancellations_reloads_and_kills(trained_model, second_model, truth, round_):
    models = [truth[trained_model], truth[second_model]]
    args = [scoring_args(trained_model), scoring_args(second_model)]

    async def main():
        rng = random.Random(round_)
        errors, served = [], []
        async with AsyncVowpalWabbitPool(DictFormatter(), args[0], size=2,
                                         io_timeout_s=2.0) as pool:
            stop = False

            async def caller(seed):
                crng = random.Random(seed)
                while not stop:
                    await _checked_call(pool, models, crng, errors, served)

            async def canceller(seed):
                crng = random.Random(seed)
                while not stop:
                    user = crng.randrange(6)
                    task = asyncio.ensure_future(pool.predict(
                        common(user), items(3000) * crng.choice([1, 5]),
                        timeout=crng.choice([None, 0.02])))
                    await asyncio.sleep(crng.choice([0, 0, 0.0001, 0.0005, 0.001, 0.003, 0.01]))
                    if crng.random() < 0.3:
                        for _ in range(crng.randrange(1, 4)):
                            await asyncio.sleep(0)
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                    except VowpalWabbitError as exc:
                        if "a reload has replaced" not in str(exc):
                            errors.append(("cancel raised", repr(exc)))
                    # the next call on the pool is exact and on time
                    await _checked_call(pool, models, crng, errors, served)

            async def wait_for_user(seed):
                crng = random.Random(seed)
                while not stop:
                    try:
                        await asyncio.wait_for(pool.predict(common(1), items(3000)),
                                               crng.choice([0.0005, 0.002, 0.006]))
                    except asyncio.TimeoutError:
                        pass

            tasks = [asyncio.ensure_future(caller(k)) for k in range(3)]
            tasks += [asyncio.ensure_future(canceller(10 + k)) for k in range(2)]
            tasks += [asyncio.ensure_future(wait_for_user(20))]
            for step in range(10):
                await asyncio.sleep(rng.uniform(0.05, 0.2))
                action = rng.choice(["reload", "kill", "sleep"])
                if action == "reload":
                    await pool.reload(args[(pool.generation + 1) % 2])
                elif action == "kill":
                    _kill_one_engine(pool, rng)
            await asyncio.sleep(0.5)
            stop = True
            done, pending = await asyncio.wait(tasks, timeout=20)
            for task in done:
                if task.exception() is not None:
                    errors.append(("task failed", repr(task.exception())))
            hung = len(pending)
            for task in pending:
                task.cancel()
            # all engines free, and a final call exact
            await asyncio.sleep(0.3)
            stats = pool.stats()
            final = await pool.predict(common(0), items(3000))
            final_ok = final == models[pool.generation % 2][0]
        return errors, served, hung, stats, final_ok

    errors, served, hung, stats, final_ok = asyncio.run(asyncio.wait_for(main(), 120))
    assert hung == 0
    assert errors == [], errors[:10]
    assert served and final_ok
    assert stats["engines_busy"] == 0, stats

"""The thread pool against real engines: split calls, concurrent threads,
deadlines, waiting for an engine, reloads, failed engines, close and fork.

Every prediction is compared with what the engine prints for the same lines
read from a file, for the model that served the call.
"""

import asyncio
import gc
import json
import logging
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import weakref

import pytest

from subwabbit import pool_base
from subwabbit import (AsyncVowpalWabbitPool, VowpalWabbitDummyFormatter, VowpalWabbitError,
                       VowpalWabbitPool, VowpalWabbitProtocolError, VowpalWabbitStartupError)
from subwabbit.command import default_engine_command
from subwabbit.core.split import SplitPredictExchange
from subwabbit.engine_group import LOW_PRIORITY_NICE
from subwabbit.fork_server import ForkServer

from conftest import (Client, CyclesLeft, DictFormatter, WideItems, children_of_this_process,
                      common, deadline_calls, in_child, items, wide_model,
                      pipe_on_freed_numbers, proc_stat, process_gone, scoring_args,
                      slow_starting_engine, wait_until, warnings_of)


@pytest.fixture
def pool(trained_model):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        yield pool


def test_one_call_is_split_over_the_engines_and_equals_the_engine(pool, trained_model, truth):
    metrics = {}
    got = pool.predict(common(1), items(3000), metrics=metrics)
    assert got == truth[trained_model][1]
    assert metrics["engines"] == 2 and metrics["num_lines"] == 3000
    assert metrics["model_generation"] == 0 and metrics["engine_failures"] == 0
    # A small request is served by one engine.
    assert pool.predict(common(2), items(30), metrics=metrics) == truth[trained_model][2][:30]
    assert metrics["engines"] == 1


def test_calls_leave_no_reference_cycles(pool, trained_model, truth):
    """What a call allocates is freed when it returns. (Each batch named its
    lane and each lane held its batches: a pool of 2 left about 10 objects
    per call to the garbage collector, and a collection every 30 to 45 calls
    of the benchmark workload.)"""
    pool.predict(common(0), items(3000), timeout=0.005)
    with CyclesLeft() as cycles:
        for user in range(4):
            got = pool.predict(common(user), items(3000) * 5, timeout=0.005)
            assert got == (truth[trained_model][user] * 5)[:len(got)]
            assert pool.predict(common(user), items(3000)) == truth[trained_model][user]
            assert pool.predict(common(user), items(20)) == truth[trained_model][user][:20]
    assert cycles.names == []


def test_a_generator_of_items_and_the_default_size(trained_model, truth):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model)) as pool:
        assert pool.size == len(os.sched_getaffinity(0))
        # Twice a single process's batches and lines in flight (see POOL_BATCH_SIZE).
        assert (pool.batch_size, pool.max_pending_lines) == (100, 200)
        got = pool.predict(common(3), (item for item in items(1000)))
    assert got == truth[trained_model][3][:1000]


def test_deadline_gives_a_prefix_by_the_deadline_and_the_next_call_is_exact(
        pool, trained_model, truth):
    for user in range(6):
        began = time.perf_counter()
        got = pool.predict(common(user), items(3000) * 20, timeout=0.005)
        took = time.perf_counter() - began
        assert took < 0.005 + 0.1
        expected = (truth[trained_model][user] * 20)[:len(got)]
        assert got == expected
        assert len(got) < 60000
    assert pool.predict(common(0), items(3000)) == truth[trained_model][0]


def _deadline_calls(pool, calls, **kwargs):
    """:func:`conftest.deadline_calls` on ``pool``, with the lines each call
    left in flight on the engines."""
    return deadline_calls(pool.predict, calls, after_each=lambda: sum(
        slot.channel.in_flight_lines for slot in pool._roster.slots), **kwargs)


def test_near_its_deadline_a_split_call_leaves_little_in_flight_and_stays_exact(
        monkeypatch, tmp_path):
    """Near its deadline a call over both engines deals each only what it
    answers by then at its pace: it ends leaving far fewer lines in flight
    than with that limit off (``reach_factor`` 0: each engine holds up to
    200 lines until the write cut-off, here 6 ms of its work)."""
    with VowpalWabbitPool(WideItems(18), wide_model(tmp_path, 18), size=2) as pool:
        on = statistics.median(_deadline_calls(pool, 12)[1])
        monkeypatch.setattr(SplitPredictExchange, "reach_factor", 0.0)
        off = statistics.median(_deadline_calls(pool, 12)[1])
    assert off > 150 and on < off / 3, (off, on)


def test_calls_on_a_model_slow_per_line_return_what_fits_in_their_deadline(tmp_path):
    """At a few ms a line, the 200 lines an engine may hold take longer
    than a 100 ms call: dealt them, every call returned nothing, each spent
    on the lines the one before it left. Each engine is now dealt what it
    answers by the deadline at its pace in its last call, and writes its
    answers as they come (not 128 at a time). (A 10 ms call on a model 10
    times faster is the same test, but a loaded machine's scheduler alone
    left such calls empty.)"""
    with VowpalWabbitPool(WideItems(60), wide_model(tmp_path, 60), size=2) as pool:
        lengths, _ = _deadline_calls(pool, 16, known=200, timeout=0.100)
    assert statistics.median(lengths[4:]) > 0, lengths


def test_concurrent_threads_each_get_their_own_predictions(pool, trained_model, truth):
    errors, counts = [], []

    def worker(user):
        try:
            for index in range(25):
                size = 50 + (index * 397) % 2950
                timeout = None if index % 5 == 0 else 0.010
                got = pool.predict(common(user), items(size), timeout=timeout)
                if got != truth[trained_model][user][:len(got)]:
                    errors.append((user, index, len(got)))
                if timeout is None and len(got) != size:
                    errors.append((user, index, "short", len(got)))
                counts.append(len(got))
        except Exception as exc:  # pylint: disable=broad-except
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(user,)) for user in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert len(counts) == 150 and sum(counts) > 0
    assert pool.stats()["calls"] == 150


def test_a_call_never_waits_past_its_deadline_for_a_free_engine(trained_model, truth):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1) as pool:
        started = threading.Event()
        long_result = []

        def long_call():
            started.set()
            long_result.append(pool.predict(common(4), items(3000) * 60))

        thread = threading.Thread(target=long_call)
        thread.start()
        started.wait()
        time.sleep(0.05)  # the long call holds the only engine
        metrics = {}
        began = time.perf_counter()
        got = pool.predict(common(5), items(100), timeout=0.005, metrics=metrics)
        took = time.perf_counter() - began
        thread.join(60)
        assert took < 0.005 + 0.1
        assert got == truth[trained_model][5][:len(got)]
        assert metrics["waited_for_other_call"] == 1 and metrics["lock_wait_time"] > 0
        assert long_result[0] == truth[trained_model][4] * 60
        assert pool.stats()["waited_for_engine"] >= 1


def test_a_waiting_call_is_not_starved_by_a_caller_that_calls_back_to_back(trained_model, truth):
    # The caller in a loop gave its engine back and took it again at once,
    # before the waiting call could: the waiting call returned [] at its
    # deadline, however many loop calls ended meanwhile. Waiting calls now
    # come first, in the order they came.
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1,
                          io_timeout_s=2.0) as pool:
        stop = threading.Event()
        loop_calls = [0]

        def back_to_back():
            while not stop.is_set():
                pool.predict(common(0), items(3000))
                loop_calls[0] += 1

        thread = threading.Thread(target=back_to_back)
        thread.start()
        try:
            assert wait_until(lambda: loop_calls[0] >= 2)
            metrics = {}
            got = pool.predict(common(1), items(300), timeout=0.5, metrics=metrics)
            # without a deadline too (it raised VowpalWabbitBusyError after io_timeout_s)
            unbounded = pool.predict(common(2), items(300))
        finally:
            stop.set()
            thread.join(30)
        assert got == truth[trained_model][1][:300], (len(got), loop_calls, metrics)
        assert metrics["waited_for_other_call"] == 1
        assert unbounded == truth[trained_model][2][:300]
        assert pool.stats()["engines"] == 1


def test_a_waiting_call_with_a_longer_budget_is_not_starved_by_shorter_ones(trained_model,
                                                                          truth):
    # Found by a review: a waiting call came first for a tenth of its time
    # only; a 50 ms call behind two threads calling a pool of one engine back
    # to back with 10 ms deadlines saw its 5 ms run out before the engine was
    # free, and then every new 10 ms call came before it: 28 of 40 got
    # nothing. It now also comes before calls whose deadline is earlier.
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1) as pool:
        stop = threading.Event()

        def back_to_back():
            while not stop.is_set():
                pool.predict(common(0), items(3000), timeout=0.010)

        threads = [threading.Thread(target=back_to_back) for _ in range(2)]
        for thread in threads:
            thread.start()
        lengths = []
        try:
            time.sleep(0.05)
            for _ in range(40):
                got = pool.predict(common(1), items(3000), timeout=0.050)
                assert got == truth[trained_model][1][:len(got)]
                lengths.append(len(got))
                time.sleep(0.010)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
    assert sum(1 for length in lengths if length) >= 30, lengths


def test_a_call_that_finds_an_idle_engine_dead_returns_by_its_deadline(trained_model,
                                                                      tmp_path):
    # The error of an engine found dead while idle waited for the last lines
    # of its stderr for up to 50 ms, whatever the deadline of the call that
    # found it (found by a review). Here its stderr stays open after it dies
    # (a process it started holds it), so that wait runs its full length.
    wrapper = tmp_path / "engine_with_a_lingering_child.sh"
    wrapper.write_text('sleep 5 & exec "$@"\n')
    command = ["sh", str(wrapper)] + default_engine_command()
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1,
                          share_weights=False, vw_command=command) as pool:
        engine = pool._roster.slots[0].engine  # pylint: disable=protected-access
        os.kill(engine.pid, signal.SIGKILL)
        assert wait_until(lambda: engine.returncode is not None)  # its exit status is known
        began = time.perf_counter()
        got = pool.predict(common(1), items(300), timeout=0.005)
        took = time.perf_counter() - began
        assert took < 0.005 + 0.025, took
        assert got == []
        assert pool.stats()["engine_failures"] == 1


def test_lock_wait_time_is_the_wait_for_an_engine_only(trained_model):
    # Found by a review: it counted the formatting of the common features too.
    class SlowCommonFeatures(DictFormatter):
        def format_common_features(self, common_features, debug_info=None):
            time.sleep(0.02)
            return super().format_common_features(common_features, debug_info)

    with VowpalWabbitPool(SlowCommonFeatures(), scoring_args(trained_model), size=2) as pool:
        metrics = {}
        pool.predict(common(1), items(10), metrics=metrics)
    assert metrics["waited_for_other_call"] == 0 and metrics["lock_wait_time"] < 0.01, metrics


def test_training_on_a_pool_is_refused(pool):
    with pytest.raises(VowpalWabbitError, match="write_only=True"):
        pool.train(common(1), items(2), [1, -1])


def test_bad_input_raises_before_anything_is_sent_and_the_pool_stays_exact(
        pool, trained_model, truth):
    class Bad(DictFormatter):
        def format_item_features(self, common_features, item_features, debug_info=None):
            if item_features["id"] == 7:
                return None
            return super().format_item_features(common_features, item_features, debug_info)

    bad_pool_formatter = Bad()
    pool.formatter = bad_pool_formatter
    with pytest.raises(TypeError, match="format_item_features"):
        pool.predict(common(1), items(3000))
    pool.formatter = DictFormatter()
    assert pool.predict(common(1), items(3000)) == truth[trained_model][1]


def test_reload_switches_models_with_no_failed_or_mixed_call(
        trained_model, second_model, truth):
    first = truth[trained_model]
    second = truth[second_model]
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        old_pids = set(pool.engine_pids())
        stop = threading.Event()
        errors, served = [], {0: 0, 1: 0}

        def worker(user):
            while not stop.is_set():
                metrics = {}
                try:
                    got = pool.predict(common(user), items(3000), timeout=0.050,
                                       metrics=metrics)
                except Exception as exc:  # pylint: disable=broad-except
                    errors.append(repr(exc))
                    return
                generation = metrics["model_generation"]
                if generation is None:  # no engine was free within the budget
                    if got != []:
                        errors.append(("predictions without a model", user, len(got)))
                    continue
                model = first if generation == 0 else second
                if got != model[user][:len(got)]:
                    errors.append(("mixed or wrong", user, generation, len(got)))
                served[generation] += 1

        threads = [threading.Thread(target=worker, args=(user,)) for user in range(3)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        pool.reload(scoring_args(second_model))
        time.sleep(0.3)
        stop.set()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert served[0] > 0 and served[1] > 0
        assert pool.generation == 1 and pool.stats()["reloads"] == 1
        assert pool.predict(common(2), items(3000)) == second[2]
        # The old engines are closed once idle.
        deadline = time.time() + 10
        while any(proc_stat(pid) not in (None,) and proc_stat(pid)[0] != "Z"
                  for pid in old_pids) and time.time() < deadline:
            time.sleep(0.05)
        assert all(proc_stat(pid) is None or proc_stat(pid)[0] == "Z" for pid in old_pids)


def test_a_reload_that_cannot_start_raises_and_the_old_model_keeps_serving(
        pool, trained_model, truth, tmp_path):
    with pytest.raises(VowpalWabbitStartupError):
        pool.reload(["-i", str(tmp_path / "missing.vw"), "-t", "--quiet"])
    assert pool.generation == 0
    assert pool.predict(common(1), items(3000)) == truth[trained_model][1]


def test_reloads_run_in_the_order_they_were_asked_for(pool, trained_model, second_model,
                                                      truth, monkeypatch):
    """A reload asked for while another runs waits its turn: one asked for
    after it, from the thread whose reload just ended, comes after it. (The
    reload lock was a plain threading.Lock, which the thread that releases it
    takes again before a waiting thread wakes: the older reload ran last and
    its model served.)"""
    spawn = pool._spawn
    began = []
    first = threading.Event()
    queued = threading.Event()

    def spawn_in_order(argv, vw_args, count):
        began.append(vw_args[vw_args.index("-i") + 1])
        if len(began) == 1:
            first.set()
            assert queued.wait(10)
            time.sleep(0.2)  # the other thread's reload now waits for its turn
            raise VowpalWabbitStartupError("this model does not start")
        return spawn(argv, vw_args, count)

    monkeypatch.setattr(pool, "_spawn", spawn_in_order)

    def retry_at_once():
        with pytest.raises(VowpalWabbitStartupError):
            pool.reload(scoring_args(second_model))
        pool.reload(scoring_args(trained_model))  # asked for last: it serves

    def asked_in_between():
        assert first.wait(10)
        queued.set()
        pool.reload(scoring_args(second_model))

    threads = [threading.Thread(target=retry_at_once), threading.Thread(target=asked_in_between)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert began == [second_model, second_model, trained_model]
    assert pool.generation == 2
    assert pool.predict(common(1), items(3000)) == truth[trained_model][1]


class _LengthFails(list):
    """Items whose len() fails (a lazy sequence: a database query, say)."""

    def __len__(self):
        raise RuntimeError("the query failed")


def test_items_whose_length_fails_leave_no_call_counted(pool, trained_model, truth):
    """The call raises, and is not left counted among the calls in progress.
    (len() ran after the call was counted in, and the count was never taken
    back: every later call took half the engines it may, as if another ran.)"""
    for _ in range(3):
        with pytest.raises(RuntimeError):
            pool.predict(common(1), _LengthFails(items(3000)), timeout=1)
    assert pool._roster.calls == 0 and pool._roster.waiting == 0
    metrics = {}
    assert pool.predict(common(1), items(3000), metrics=metrics) == truth[trained_model][1]
    assert metrics["engines"] == 2


def kill_every_engine_for(pool, seconds):
    """Kill each engine of ``pool`` as soon as it is in service, for
    ``seconds``, as an engine that dies on every example would die.

    :returns: how many were killed
    """
    killed = set()
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for pid in set(pool.engine_pids()) - killed:
            killed.add(pid)
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)
    return len(killed)


def test_engines_that_keep_dying_young_are_replaced_with_a_back_off(trained_model, truth,
                                                                    caplog, monkeypatch):
    """Replacements of engines that keep dying right after they start wait
    (up to a second) once more engines than the pool's size died young in
    a row: before, they were forked as fast as the fork server could (about
    400 in 2 s, two warnings each); the pool is back to its size within
    a second of the last death, and exact."""
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        with caplog.at_level(logging.WARNING, logger="subwabbit"):
            killed = kill_every_engine_for(pool, 2.0)
        assert killed <= 20, killed
        assert len(caplog.records) <= 3 * killed
        assert "in a row): starting a replacement in 1 s" in caplog.text
        assert wait_until(lambda: pool.stats()["engines"] == 2, 5.0), pool.stats()
        assert pool.predict(common(1), items(3000)) == truth[trained_model][1]
        # An engine that dies after it served a while is replaced at once.
        monkeypatch.setattr(pool_base, "YOUNG_ENGINE_S", 0.5)
        time.sleep(0.5)
        caplog.clear()
        replaced = pool.stats()["engines_replaced"]
        with caplog.at_level(logging.WARNING, logger="subwabbit"):
            os.kill(pool.engine_pids()[0], signal.SIGKILL)
            assert wait_until(lambda: pool.stats()["engines_replaced"] > replaced, 5.0)
        assert "; starting a replacement\n" in caplog.text + "\n"
        assert "starting a replacement in" not in caplog.text
        assert wait_until(lambda: pool.stats()["engines"] == 2, 5.0)


def test_a_killed_engine_is_replaced_and_calls_stay_exact(pool, trained_model, truth):
    victim = pool.engine_pids()[0]
    os.kill(victim, signal.SIGKILL)
    # The call that meets the dead engine deals its batches to the other one.
    metrics = {}
    assert pool.predict(common(3), items(3000), metrics=metrics) == truth[trained_model][3]
    deadline = time.time() + 30
    while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
        pool.predict(common(2), items(500), timeout=0.010)
        time.sleep(0.01)
    stats = pool.stats()
    assert stats["engine_failures"] == 1 and stats["engines_replaced"] == 1
    assert stats["engines"] == 2 and victim not in pool.engine_pids()
    assert pool.predict(common(4), items(3000)) == truth[trained_model][4]


#: A vw stand-in that answers each example with the number that ends its
#: line (0 for a start-up probe). The first engine started with a given
#: marker file (the second argument) prints an unparsable line before its
#: answer to the first example after the probes, and answers the third one
#: 0.3 s late; the others behave.
UNPARSABLE_LINE_ENGINE = textwrap.dedent("""
    import os, sys, time
    misbehaves = not os.path.exists(sys.argv[1])
    open(sys.argv[1], "a").close()
    answered = 0
    for line in sys.stdin.buffer:
        if line == b"\\n":
            continue  # vw answers nothing to an empty line
        answered += 1
        if misbehaves and answered == 3:
            sys.stdout.buffer.write(b"garbage\\n")
        if misbehaves and answered == 5:
            sys.stdout.buffer.flush()
            time.sleep(0.3)
        number = line.split()[-1]
        sys.stdout.buffer.write(number + b"\\n" if number != b"|" else b"0\\n")
        sys.stdout.buffer.flush()
""")


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_an_engine_that_printed_an_unparsable_answer_serves_no_other_call(kind, tmp_path):
    """An engine whose answers could not be parsed no longer knows which
    answer is whose: its call raises, and it is replaced, as the process
    classes replace theirs. It went back into service, and the next call
    got the answer the first call's last item was owed ([3.0, 4.0, 5.0])."""
    script = tmp_path / "unparsable.py"
    script.write_text(UNPARSABLE_LINE_ENGINE)
    arguments = dict(vw_command=[sys.executable, str(script), str(tmp_path / "started")],
                     size=1)
    first_items, second_items = ["|b 1", "|b 2", "|b 3"], ["|b 4", "|b 5", "|b 6"]

    def check(first, second, stats):
        assert isinstance(first, VowpalWabbitProtocolError) and "garbage" in str(first)
        assert second == [4.0, 5.0, 6.0]
        assert stats["engine_failures"] == 1 and stats["engines_replaced"] == 1

    if kind == "threads":
        with VowpalWabbitPool(VowpalWabbitDummyFormatter(), [], **arguments) as pool:
            with pytest.raises(VowpalWabbitProtocolError) as caught:
                pool.predict("|a", first_items, timeout=5.0)
            check(caught.value, pool.predict("|a", second_items, timeout=5.0), pool.stats())
        return

    async def calls():
        async with AsyncVowpalWabbitPool(VowpalWabbitDummyFormatter(), [], **arguments) as pool:
            with pytest.raises(VowpalWabbitProtocolError) as caught:
                await pool.predict("|a", first_items, timeout=5.0)
            check(caught.value, await pool.predict("|a", second_items, timeout=5.0),
                  pool.stats())

    asyncio.run(calls())


#: A vw stand-in that answers each example with the number that ends its
#: line (0 for a start-up probe), all the lines of one read in one write.
#: The first engine started with a given marker file (the second argument)
#: answers every example after the probes twice (the number, then the
#: number + 0.5); the others behave.
DOUBLE_ANSWER_ENGINE = textwrap.dedent("""
    import os, sys
    misbehaves = not os.path.exists(sys.argv[1])
    open(sys.argv[1], "a").close()
    answered = 0
    pending = b""
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\\n")
        out = []
        for line in lines:
            if not line:
                continue  # vw answers nothing to an empty line
            answered += 1
            number = line.split()[-1]
            out.append(b"0" if number == b"|" else number)
            if misbehaves and answered > 2:
                out.append(number + b".5")
        if out:
            os.write(1, b"\\n".join(out) + b"\\n")
""")


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_answers_read_with_a_line_nobody_was_owed_are_not_given(kind, tmp_path):
    """An engine that printed more lines than it was sent examples is out of
    step: the answers that came in the read that showed it are dropped with
    its engine, and its items are served by another (the process classes
    raise). The call got them: [1.0, 1.5, 2.0]."""
    script = tmp_path / "double.py"
    script.write_text(DOUBLE_ANSWER_ENGINE)
    arguments = dict(vw_command=[sys.executable, str(script), str(tmp_path / "started")],
                     size=1)
    request = ["|b 1", "|b 2", "|b 3"]
    if kind == "threads":
        with VowpalWabbitPool(VowpalWabbitDummyFormatter(), [], **arguments) as pool:
            assert pool.predict("|a", request, timeout=5.0) == [1.0, 2.0, 3.0]
            stats = pool.stats()
    else:
        async def call():
            async with AsyncVowpalWabbitPool(VowpalWabbitDummyFormatter(), [],
                                             **arguments) as pool:
                assert await pool.predict("|a", request, timeout=5.0) == [1.0, 2.0, 3.0]
                return pool.stats()

        stats = asyncio.run(call())
    assert stats["engine_failures"] == 1


@pytest.mark.parametrize("share", [True, False])
def test_an_engine_that_died_idle_is_replaced_before_a_call_can_take_it(trained_model, truth,
                                                                         share):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                          share_weights=share) as pool:
        assert pool.predict(common(1), items(3000)) == truth[trained_model][1]
        victim, survivor = pool.engine_pids()
        os.kill(victim, signal.SIGKILL)
        assert process_gone(victim)
        time.sleep(0.05)  # a forked engine's exit status comes from its fork server
        metrics = {}
        assert pool.predict(common(2), items(3000), metrics=metrics) == truth[trained_model][2]
        # The call found it dead before taking engines: no failure of its own.
        assert metrics["engine_failures"] == 0
        assert pool.stats()["engine_failures"] == 1
        deadline = time.time() + 30
        while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
            time.sleep(0.01)
        assert survivor in pool.engine_pids() and victim not in pool.engine_pids()
        assert len(pool.engine_pids()) == 2
        assert pool.predict(common(3), items(3000)) == truth[trained_model][3]


def test_a_forked_engine_that_dies_idle_is_replaced_with_no_call_at_all(trained_model, truth):
    # Its fork server reports its exit: the pool replaces it at once.
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        assert pool.shares_weights()
        victim, survivor = pool.engine_pids()
        os.kill(victim, signal.SIGKILL)
        deadline = time.time() + 30
        while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
            time.sleep(0.01)
        stats = pool.stats()
        assert stats["engine_failures"] == 1 and stats["engines_replaced"] == 1
        assert stats["calls"] == 0 and len(pool.engine_pids()) == 2
        assert survivor in pool.engine_pids() and victim not in pool.engine_pids()
        assert pool.predict(common(3), items(3000)) == truth[trained_model][3]
        # Engines ending because the pool reloads or closes are not failures.
        pool.reload(scoring_args(trained_model))
        time.sleep(0.2)
        assert pool.stats()["engine_failures"] == 1


def test_a_pool_dropped_without_close_stops_its_engines(trained_model):
    # Nothing the pool started (its fork server's reader thread, its
    # engine groups) may keep it alive.
    pool = VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)
    pool.predict(common(1), items(300))
    pids = pool.engine_pids() + [pool._groups[0].server.pid]  # pylint: disable=protected-access
    with pytest.warns(ResourceWarning):
        del pool
    assert all(process_gone(pid, 5.0) for pid in pids)


def test_an_engine_killed_during_a_call_costs_no_prediction(trained_model, truth):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        pids = pool.engine_pids()
        killer = threading.Timer(0.02, os.kill, (pids[1], signal.SIGKILL))
        killer.start()
        metrics = {}
        got = pool.predict(common(0), items(3000) * 40, metrics=metrics)
        killer.join()
        assert got == truth[trained_model][0] * 40
        assert metrics["engine_failures"] == 1


def test_a_call_whose_engine_died_comes_before_later_calls_for_the_replacement(
        trained_model, truth):
    # A call whose engines all failed waited for a replacement without a
    # place among the waiting calls: a call that came after it took the
    # replacement first. Under calls made back to back (four threads, 5 s),
    # a call without a deadline raised VowpalWabbitBusyError ("none was
    # replaced within io_timeout_s") while 400 later calls were served.
    from subwabbit.pool import _wait_for_lanes
    from subwabbit.pool_base import WaitForEngine, WaitForPipes
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1,
                          io_timeout_s=10.0) as pool:

        def killing_items():
            for index, item in enumerate(items(3000)):
                if index == 600:
                    os.kill(pool.engine_pids()[0], signal.SIGKILL)
                yield item

        metrics = {}
        flow = pool._predict_flow(common(1), killing_items(), None, None, metrics)
        wait = next(flow)
        while not isinstance(wait, WaitForEngine):  # (until its engine has failed)
            wait = (flow.send(_wait_for_lanes(wait.lanes, wait.until))
                    if isinstance(wait, WaitForPipes) else next(flow))
        assert wait_until(lambda: pool.stats()["engines_replaced"] == 1)
        later = {}
        assert pool.predict(common(2), items(300), timeout=0.2, metrics=later) == []
        assert later["waited_for_other_call"] == 1
        assert _drive(flow, wait) == truth[trained_model][1]
        assert metrics["engine_failures"] == 1 and metrics["model_generation"] == 0
        assert pool.predict(common(2), items(300)) == truth[trained_model][2][:300]
        assert pool.stats()["engines_busy"] == 0 and pool._roster.waiting == 0


def _drive(flow, wait):
    """Drive a pool call's flow to its end as the thread pool does (with one
    engine per call for itself: it never waits for another)."""
    from subwabbit.pool import _wait_for_lanes
    from subwabbit.pool_base import WaitForPipes
    try:
        while True:
            wait = (flow.send(_wait_for_lanes(wait.lanes, wait.until))
                    if isinstance(wait, WaitForPipes) else next(flow))
    except StopIteration as finished:
        return finished.value


def test_a_call_reads_only_the_engines_its_driver_found_readable(pool, trained_model, truth):
    """After a wait the driver sends back the readable stdout descriptors,
    and the call reads those engines only (not knowing, it reads them all)."""
    import select

    from subwabbit.pool import _wait_for_lanes
    from subwabbit.pool_base import WaitForPipes
    flow = pool._predict_flow(common(1), items(3000), None, None, None)
    wait = next(flow)
    # Until both engines have lines written to them (and owe their answers).
    while not (isinstance(wait, WaitForPipes) and len(wait.lanes) == 2 and all(
            lane.channel.in_flight_lines and not lane.channel.unwritten_bytes
            for lane in wait.lanes)):
        wait = (flow.send(_wait_for_lanes(wait.lanes, wait.until))
                if isinstance(wait, WaitForPipes) else next(flow))
    lanes = wait.lanes
    fds = [lane.key.engine.stdout_fd for lane in lanes]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(select.select(fds, [], [], 0.1)[0]) < 2:
        pass
    received = [lane.channel.bytes_received for lane in lanes]
    wait = flow.send(())  # the driver saw nothing readable: nothing is read
    assert isinstance(wait, WaitForPipes)
    assert [lane.channel.bytes_received for lane in lanes] == received
    wait = flow.send([fds[1]])  # only the second engine is read
    assert lanes[0].channel.bytes_received == received[0]
    assert lanes[1].channel.bytes_received > received[1]
    while not isinstance(wait, WaitForPipes):  # (on a slow machine, a turn for a loop)
        wait = next(flow)
    assert lanes[0].channel.bytes_received == received[0]
    wait = flow.send(None)  # not known: every engine is read
    assert lanes[0].channel.bytes_received > received[0]
    assert _drive(flow, wait) == truth[trained_model][1]
    assert pool.predict(common(2), items(3000)) == truth[trained_model][2]


def test_a_call_deals_every_engine_with_room_before_it_waits(pool, trained_model, truth):
    """A lane with room for a batch is dealt at once: the call's first wait
    comes when both engines have lines to answer, not after the first batch
    (a wait of no time for the second cost a third of a call's waits)."""
    from subwabbit.pool_base import WaitForPipes
    flow = pool._predict_flow(common(1), items(3000), None, None, None)
    wait = next(flow)
    while not isinstance(wait, WaitForPipes):
        wait = next(flow)
    assert len(wait.lanes) == 2
    assert all(lane.channel.in_flight_lines for lane in wait.lanes)
    assert _drive(flow, wait) == truth[trained_model][1]


@pytest.mark.parametrize("cutoff", [0.2, 0.0])
def test_no_line_is_written_after_the_write_cutoff_when_a_wait_ends_past_it(trained_model,
                                                                            truth, cutoff):
    """A wait that ends after the write cut-off (here: the engine's stdin
    became writable again) writes nothing more than the rest of a line
    already partly in the pipe; with no cut-off, nothing after the
    deadline."""
    from subwabbit.pool import _wait_for_lanes
    from subwabbit.pool_base import WaitForPipes
    # Lines of about 4 KB: 200 in flight do not fit in the engine's pipe.
    long_common = {"user": 1, "ctx": [f"tok{i}" for i in range(500)]}
    timeout = 0.5
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1,
                          write_cutoff_s=cutoff) as pool:
        pool.predict(long_common, items(10), timeout=2)
        pid = pool.engine_pids()[0]
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.perf_counter()
            flow = pool._predict_flow(long_common, items(3000), timeout, None, None)
            wait = next(flow)
            # Until the call waits for the stopped engine with lines unwritten.
            while not (isinstance(wait, WaitForPipes) and wait.lanes[0].channel.unwritten_bytes
                       and wait.until is not None and wait.until - time.perf_counter() > 0.05):
                wait = (flow.send(_wait_for_lanes(wait.lanes, wait.until))
                        if isinstance(wait, WaitForPipes) else next(flow))
            channel = wait.lanes[0].channel
            line_bytes = len(pool.formatter.get_formatted_example(
                pool.formatter.format_common_features(long_common),
                pool.formatter.format_item_features(long_common, items(1)[0]))) + 1
            time.sleep(max(0.0, started + timeout - cutoff + 0.02 - time.perf_counter()))
        finally:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)  # the engine drains its pipe: there is room again
        written = channel.bytes_written
        try:
            wait = flow.send([])  # the wait ended with nothing readable
            while True:
                wait = (flow.send(_wait_for_lanes(wait.lanes, wait.until))
                        if isinstance(wait, WaitForPipes) else next(flow))
        except StopIteration:
            pass
        assert channel.bytes_written - written < line_bytes
        # What the call left on the engine never reaches the next call.
        assert pool.predict(common(1), items(3000), timeout=5) == truth[trained_model][1]


def test_calls_are_exact_when_the_driver_waits_with_poll(trained_model, truth, monkeypatch):
    """Descriptors beyond select()'s limit are waited for with poll(), whose
    readable descriptors are sent back the same way."""
    import subwabbit.pool
    monkeypatch.setattr(subwabbit.pool, "SELECT_FD_LIMIT", 0)
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        for user in range(3):
            assert pool.predict(common(user), items(3000)) == truth[trained_model][user]
        got = pool.predict(common(4), items(3000) * 10, timeout=0.005)
        assert got == (truth[trained_model][4] * 10)[:len(got)]
        assert pool.predict(common(5), items(3000)) == truth[trained_model][5]


def test_a_stopped_engine_holds_no_call_up_once_its_items_are_dealt(trained_model, truth):
    """The batches a stopped engine holds are dealt again to the engine that
    answers, once no new item is left: the call ends long before io_timeout_s,
    exact, and what the stopped engine answers when it resumes reaches no call."""
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                          io_timeout_s=60.0) as pool:
        stopped = pool.engine_pids()[0]
        os.kill(stopped, signal.SIGSTOP)
        try:
            metrics = {}
            began = time.perf_counter()
            got = pool.predict(common(1), items(3000), metrics=metrics)
            assert time.perf_counter() - began < 10.0
            assert got == truth[trained_model][1]
            assert metrics["engines"] == 2 and metrics["engine_failures"] == 0
            assert metrics["hedged_lines"] > 0
        finally:
            os.kill(stopped, signal.SIGCONT)
        for index in (2, 0, 1, 2):
            assert pool.predict(common(index), items(3000)) == truth[trained_model][index]
        assert stopped in pool.engine_pids() and pool.stats()["engine_failures"] == 0


def test_a_stopped_engine_holds_no_call_up_while_items_are_left_to_deal(trained_model, truth):
    """The batch of a stopped engine that the results wait for is copied to
    the engine that answers while new items are still dealt: a call too
    large to be dealt whole by its deadline returns the items the other
    engine answered (before, it returned what came before that batch: at
    most one batch of 100)."""
    expected = truth[trained_model][1]
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                          io_timeout_s=60.0) as pool:
        stopped = pool.engine_pids()[0]
        os.kill(stopped, signal.SIGSTOP)
        try:
            metrics = {}
            began = time.perf_counter()
            got = pool.predict(common(1), ({"id": index % 50} for index in range(10 ** 8)),
                               timeout=0.5, metrics=metrics)
            assert time.perf_counter() - began < 0.5 + 0.5
            assert len(got) > 1000, (len(got), metrics)
            assert got == [expected[index % len(expected)] for index in range(len(got))]
            assert metrics["hedged_lines"] > 0 and metrics["engine_failures"] == 0
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert pool.predict(common(2), items(3000)) == truth[trained_model][2]


def test_a_wait_while_items_are_left_to_deal_looks_for_no_copy(trained_model, truth,
                                                                 monkeypatch):
    """While new items are left, a lane with room is dealt at once (a copy of
    a quiet lane's batch comes with that deal), so the time of a copy never
    decides a wait: the driver's wake_at() does not look for one. It did at
    every wait of a call (about 15 us each, 2 engines: a few percent of the
    calling thread's time per prediction), to find none."""
    looked = []
    waiting = []
    hedges, wake_at = SplitPredictExchange._hedges, SplitPredictExchange.wake_at

    def spied_hedges(exchange, *args, **kwargs):
        if waiting and exchange._items_left:
            looked.append(1)
        return hedges(exchange, *args, **kwargs)

    def spied_wake_at(exchange):
        waiting.append(1)
        try:
            return wake_at(exchange)
        finally:
            waiting.pop()

    monkeypatch.setattr(SplitPredictExchange, "_hedges", spied_hedges)
    monkeypatch.setattr(SplitPredictExchange, "wake_at", spied_wake_at)
    expected = truth[trained_model][1] * 10
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        for timeout in (None, 0.05, 0.05):
            got = pool.predict(common(1), items(3000) * 10, timeout=timeout)
            assert got == expected[:len(got)]
            if timeout is None:
                assert len(got) == len(expected)
    assert len(looked) == 0


def test_close_returns_within_its_timeout_with_a_stopped_engine(trained_model):
    pool = VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)
    pids = pool.engine_pids()
    os.kill(pids[0], signal.SIGSTOP)
    began = time.perf_counter()
    pool.close(timeout=1.0)
    assert time.perf_counter() - began < 1.0 + 0.5
    for pid in pids:
        deadline = time.time() + 5
        while proc_stat(pid) is not None and proc_stat(pid)[0] != "Z" and time.time() < deadline:
            time.sleep(0.02)
        assert proc_stat(pid) is None or proc_stat(pid)[0] == "Z"
    with pytest.raises(VowpalWabbitError, match="closed"):
        pool.predict(common(1), items(3))


def test_a_forked_child_starts_its_own_engines_and_the_parent_is_untouched(
        pool, trained_model, truth):
    parent_pids = pool.engine_pids()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(read_end)
            first = pool.predict(common(1), items(3000), timeout=0.001)
            got = pool.predict(common(1), items(3000))
            report = {"ok": got == truth[trained_model][1], "first": len(first),
                      "pids": pool.engine_pids()}
            pool.close()
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        report = json.loads(reader.read() or "{}")
    os.waitpid(pid, 0)
    assert report["ok"] is True
    assert not set(report["pids"]) & set(parent_pids)
    assert pool.engine_pids() == parent_pids
    assert pool.predict(common(2), items(3000)) == truth[trained_model][2]


def test_a_forked_child_whose_engines_cannot_start_yet_tries_again(trained_model, truth,
                                                                    tmp_path):
    # The model file is away when the child forks (a deploy step): its first
    # start fails, and it serves once the file is back.
    served = tmp_path / "served.vw"
    shutil.copy(trained_model, served)
    with VowpalWabbitPool(DictFormatter(), scoring_args(str(served)), size=2) as pool:
        os.rename(served, tmp_path / "away.vw")

        def child():
            first = pool.predict(common(1), items(300), timeout=0.5)
            os.rename(tmp_path / "away.vw", served)
            deadline = time.monotonic() + 20
            got = []
            while not got and time.monotonic() < deadline:
                got = pool.predict(common(1), items(3000), timeout=0.5)
            # (a loaded machine's first call that gets answers may get only
            # some by its deadline: all of them come without one)
            exact = bool(got) and got == truth[trained_model][1][:len(got)]
            exact = exact and pool.predict(common(1), items(3000)) == truth[trained_model][1]
            engines = pool.engine_pids()
            pool.close()
            return [len(first), exact, engines]

        result = in_child(child)
        assert "error" not in result, result
        first, exact, engines = result["ok"]
        assert first == 0 and exact and len(engines) == 2
        assert not set(engines) & set(pool.engine_pids())
        assert pool.predict(common(2), items(3000)) == truth[trained_model][2]


def test_a_forked_child_that_loads_another_model_file_than_its_parent_warns(
        trained_model, truth, tmp_path):
    # A new file moved over the model's path after the parent loaded it (a
    # deploy without reload): a child forked then serves that file, while
    # the children forked before serve the parent's; it says so.
    served = tmp_path / "served.vw"
    shutil.copy(trained_model, served)
    with VowpalWabbitPool(DictFormatter(), scoring_args(str(served)), size=2) as pool:
        def child():
            warned = warnings_of("subwabbit")
            got = pool.predict(common(1), items(3000))
            pool.close()
            return [got == truth[trained_model][1], warned]

        result = in_child(child)
        assert "error" not in result, result
        assert result["ok"] == [True, []]  # the same file: nothing to say
        shutil.copy(trained_model, tmp_path / "new.vw")
        os.replace(tmp_path / "new.vw", served)
        result = in_child(child)
        assert "error" not in result, result
        exact, warned = result["ok"]
        assert exact  # (the same model's bytes in a new file)
        assert len(warned) == 1 and f"model file at {served}" in warned[0], warned
        assert f"parent process {os.getpid()}" in warned[0] and "generation 0" in warned[0]
        assert pool.predict(common(2), items(3000)) == truth[trained_model][2]


def test_close_in_a_forked_child_while_its_own_engines_start(trained_model):
    # close() went through the pool's engine groups unlocked while the
    # child's start, cut short by it, took its group out from its own
    # thread: RuntimeError "dictionary changed size during iteration"
    # (found by a review). A fork server that takes a while to exit (a large
    # model to free) and a start that takes a while widen the window.
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        def child():
            close_server, fork_engine = ForkServer.close, ForkServer.fork_engine

            def slow_close(server, timeout_s=5.0):
                close_server(server, timeout_s)
                time.sleep(0.5)

            def slow_fork(server, timeout_s=5.0):
                engine = fork_engine(server, timeout_s)
                time.sleep(0.2)
                return engine

            ForkServer.close, ForkServer.fork_engine = slow_close, slow_fork
            pool.predict(common(1), items(10), timeout=0.001)  # starts the child's own engines
            time.sleep(0.1)  # its fork server is up, its first engine being forked
            began = time.perf_counter()
            pool.close(timeout=3.0)
            return time.perf_counter() - began

        result = in_child(child)
        assert "ok" in result, result
        assert result["ok"] < 3.0 + 1.0


def test_calls_racing_in_a_forked_child_count_one_restart(trained_model, truth):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        def child():
            restarts = []

            def call():
                metrics = {}
                pool.predict(common(1), items(30), timeout=0.2, metrics=metrics)
                restarts.append(metrics["restarts"])
            threads = [threading.Thread(target=call) for _ in range(8)]
            # All eight find the pool a fork's before one of them starts its engines.
            with pool._cond:  # pylint: disable=protected-access
                for thread in threads:
                    thread.start()
                time.sleep(0.3)
            for thread in threads:
                thread.join(30)
            got = pool.predict(common(1), items(3000))
            pool.close()
            return [sorted(restarts), got == truth[trained_model][1]]

        result = in_child(child)
        assert "error" not in result, result
        assert result["ok"] == [[0] * 7 + [1], True]


# ------------------------------------------------------------- shared model

def test_engines_are_forked_from_one_process_that_loaded_the_model(trained_model, truth,
                                                                   caplog):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        assert pool.shares_weights()
        server = pool._groups[0].server  # pylint: disable=protected-access
        for pid in pool.engine_pids():
            assert int(proc_stat(pid)[1]) == server.pid  # the server's children, not ours
            assert len(os.listdir(f"/proc/{pid}/task")) == 1  # the one-thread loop
        assert pool.predict(common(1), items(3000)) == truth[trained_model][1]
        usage = pool.memory_usage()
        assert usage["processes"] == 3 and 0 < usage["pss_bytes"] <= usage["rss_bytes"]
        # Replacements are forked too, and an engine outlives a server that died.
        # (The next call meets the dead engine once it is gone; a call while it
        # is still exiting may be served by the other alone, as by a stopped one.)
        victim = pool.engine_pids()[0]
        os.kill(victim, signal.SIGKILL)
        assert process_gone(victim)
        assert pool.predict(common(2), items(3000)) == truth[trained_model][2]
        deadline = time.time() + 30
        while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
            time.sleep(0.01)
        assert all(int(proc_stat(pid)[1]) == server.pid for pid in pool.engine_pids())
        # A server that dies is reported, reaped (no zombie waits for close())
        # and, at the next replacement, started anew: replacements go on
        # sharing one copy of the model.
        with caplog.at_level(logging.WARNING, logger="subwabbit"):
            os.kill(server.pid, signal.SIGKILL)
            wait_until(lambda: server.died)
            assert pool.predict(common(3), items(3000)) == truth[trained_model][3]
            assert wait_until(lambda: server.engine.proc.returncode is not None)
            with pytest.raises(ChildProcessError):
                os.waitpid(server.pid, os.WNOHANG)  # reaped
            assert f"fork server vw[{server.pid}] killed by SIGKILL" in caplog.text
            victim = pool.engine_pids()[0]
            os.kill(victim, signal.SIGKILL)
            assert process_gone(victim)
            assert pool.predict(common(4), items(3000)) == truth[trained_model][4]
            wait_until(lambda: pool.stats()["engines_replaced"] >= 2, 30)
        assert pool.stats()["engines"] == 2
        new_server = pool._groups[0].server  # pylint: disable=protected-access
        assert new_server is not None and new_server.pid != server.pid
        assert pool.shares_weights()
        assert int(proc_stat(pool.engine_pids()[-1])[1]) == new_server.pid
        assert "started a new fork server" in caplog.text
        assert pool.predict(common(5), items(3000)) == truth[trained_model][5]
        # ... and it reports the exits of what it forked, as the first one did.
        forked = pool.engine_pids()[-1]
        os.kill(forked, signal.SIGKILL)
        assert wait_until(lambda: pool.stats()["engines_replaced"] >= 3, 30)
        assert pool.predict(common(0), items(3000)) == truth[trained_model][0]


def test_a_reload_whose_fork_server_does_not_load_in_time_fails_within_its_timeout(
        trained_model, second_model, truth):
    # A fork server that had not loaded the model within startup_timeout_s
    # was closed as one that serves: its input closed, SIGTERM a second
    # before 5 s, and the reload raised 4 s after its timeout (stopped here
    # as soon as it is spawned, as one stuck loading the model).
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                          startup_timeout_s=1.0) as pool:
        before = set(children_of_this_process())
        stopped = []
        reloading = threading.Event()

        with open("/proc/self/cmdline", "rb") as handle:
            ours = handle.read()

        def stop_new_servers():
            while reloading.is_set():
                for pid in set(children_of_this_process()) - before - set(stopped):
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as handle:
                            if handle.read() == ours:
                                continue  # not yet the server: stopped before its exec,
                                # it would hold this process in its fork (vfork) for good
                    except OSError:
                        continue
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                time.sleep(0.001)

        reloading.set()
        watcher = threading.Thread(target=stop_new_servers)
        watcher.start()
        began = time.perf_counter()
        try:
            with pytest.raises(VowpalWabbitStartupError, match="did not load the model within"):
                pool.reload(scoring_args(second_model))
            took = time.perf_counter() - began
        finally:
            reloading.clear()
            watcher.join()
        assert len(stopped) == 1
        assert took < 1.0 + 0.5, took
        assert process_gone(stopped[0], 1.0)
        assert pool.generation == 0
        assert pool.predict(common(1), items(3000)) == truth[trained_model][1]


def _pool_with_a_dead_fork_server(model):
    pool = VowpalWabbitPool(DictFormatter(), scoring_args(model), size=2)
    server = pool._groups[0].server  # pylint: disable=protected-access
    os.kill(server.pid, signal.SIGKILL)
    assert wait_until(lambda: server.died)
    return pool, server


def test_a_fork_server_that_stops_answering_is_replaced_by_a_new_one(trained_model, truth,
                                                                     caplog):
    # A server whose fork went unanswered is not asked again (a late answer
    # would be taken for the next fork's): it is killed, a new one loads the
    # model, and the replacement is forked from it, sharing its copy.
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                          startup_timeout_s=1.0) as pool:
        group = pool._groups[0]  # pylint: disable=protected-access
        stuck = group.server
        os.kill(stuck.pid, signal.SIGSTOP)
        try:
            with caplog.at_level(logging.WARNING, logger="subwabbit"):
                victim = pool.engine_pids()[0]
                os.kill(victim, signal.SIGKILL)
                assert process_gone(victim)
                assert pool.predict(common(1), items(3000)) == truth[trained_model][1]
                assert wait_until(lambda: pool.stats()["engines_replaced"] >= 1, 30)
        finally:
            if proc_stat(stuck.pid) is not None:
                os.kill(stuck.pid, signal.SIGKILL)
        assert "did not answer a fork" in caplog.text
        # (its engine killed above, whose exit it could not report, is warned of)
        assert f"vw[{stuck.pid}] ignored SIGTERM" not in caplog.text
        assert f"vw[{stuck.pid}] survived SIGKILL" not in caplog.text
        assert process_gone(stuck.pid)
        server = group.server
        assert server is not None and server.pid != stuck.pid and not server.closed
        assert int(proc_stat(pool.engine_pids()[-1])[1]) == server.pid
        assert pool.predict(common(2), items(3000)) == truth[trained_model][2]
        began = time.monotonic()
    assert time.monotonic() - began < 10


@pytest.mark.parametrize("kind", ["pool", "asyncio-pool"])
def test_a_stopped_fork_server_delays_replacements_briefly_and_no_call(kind, trained_model,
                                                                       truth):
    """A fork request to a stopped (SIGSTOP) server waited for its answer for
    the whole ``startup_timeout_s`` (60 s by default, 30 here): a pool whose
    engines had all died served nothing meanwhile. A server that stays
    stopped is now taken for stuck at once, and a new one forks the
    replacements; calls return by their deadlines meanwhile."""
    client = Client(kind, DictFormatter(), scoring_args(trained_model), size=2,
                    startup_timeout_s=30.0)
    try:
        stopped = client.model._groups[0].server.pid  # pylint: disable=protected-access
        os.kill(stopped, signal.SIGSTOP)
        try:
            for victim in client.pids():
                os.kill(victim, signal.SIGKILL)
            began = time.perf_counter()
            late = []
            while time.perf_counter() - began < 20:
                called = time.perf_counter()
                got = client.predict(common(1), items(3000), timeout=0.020)
                late.append(time.perf_counter() - called - 0.020)
                assert got == truth[trained_model][1][:len(got)]
                if got:
                    break
            served_after = time.perf_counter() - began
        finally:
            if proc_stat(stopped) is not None:
                os.kill(stopped, signal.SIGCONT)
        assert served_after < 10, served_after  # generous; the start-up timeout is 30 s
        assert max(late) < 0.1, max(late)  # generous: 2 shared cores
        assert process_gone(stopped)
        assert client.predict(common(2), items(3000)) == truth[trained_model][2]
    finally:
        client.close()


def test_a_replacement_that_failed_to_start_is_tried_again(trained_model, truth, tmp_path,
                                                           caplog):
    # The model file is missing for a while (a deploy step, a network file
    # system): the replacement fails, and is tried again until the file is back.
    served = tmp_path / "served.vw"
    shutil.copy(trained_model, served)
    away = tmp_path / "away.vw"
    with VowpalWabbitPool(DictFormatter(), scoring_args(str(served)), size=2,
                          share_weights=False) as pool:
        with caplog.at_level(logging.WARNING, logger="subwabbit"):
            os.rename(served, away)
            victim = pool.engine_pids()[0]
            os.kill(victim, signal.SIGKILL)
            assert process_gone(victim)
            assert pool.predict(common(1), items(3000)) == truth[trained_model][1]
            assert wait_until(lambda: "attempt 2" in caplog.text, 10), caplog.text
            assert pool.stats()["engines"] == 1
            os.rename(away, served)  # the same file again
            assert wait_until(lambda: pool.stats()["engines_replaced"] == 1, 30), caplog.text
        assert pool.stats()["engines"] == 2
        assert pool.predict(common(2), items(3000)) == truth[trained_model][2]


def test_calls_do_not_hurry_a_replacement_that_waits_to_try_again(trained_model, tmp_path,
                                                                   caplog):
    # Every call that gives its engines back wakes the pool's waiters: the
    # replacement waits out its time all the same.
    served = tmp_path / "served.vw"
    shutil.copy(trained_model, served)
    with VowpalWabbitPool(DictFormatter(), scoring_args(str(served)), size=2,
                          share_weights=False) as pool:
        os.unlink(served)
        with caplog.at_level(logging.WARNING, logger="subwabbit"):
            victim = pool.engine_pids()[0]
            os.kill(victim, signal.SIGKILL)
            assert process_gone(victim)
            end = time.monotonic() + 1.0
            calls = 0
            while time.monotonic() < end:
                pool.predict(common(1), items(30))
                calls += 1
        attempts = caplog.text.count("starting a replacement vw engine failed")
        # (tried at once, after 0.5 s, then after 1 s more)
        assert calls > 20 and 1 <= attempts <= 3, (calls, attempts)


def test_a_replacement_that_a_reload_overtook_is_stopped_without_holding_up_calls(
        trained_model, second_model, truth, monkeypatch):
    # The replacement starts, a reload switches to another model meanwhile,
    # and the replacement, of no use now, is stopped once the pool's lock is
    # released: reaping an engine that frees a large model takes a while,
    # and calls must not wait for it.
    import subwabbit.pool as pool_module  # pylint: disable=import-outside-toplevel
    import subwabbit.pool_base as pool_base  # pylint: disable=import-outside-toplevel
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        group = pool._groups[0]  # pylint: disable=protected-access
        started, reloaded = threading.Event(), threading.Event()
        original_add_one = group.add_one

        def add_one_overtaken():
            engine = original_add_one()
            started.set()
            reloaded.wait(30)
            return engine
        group.add_one = add_one_overtaken
        stops = []
        original_discard = pool_base.discard

        def spied_discard(engines, group=None, *args):
            locked = pool._cond.acquire(False)  # pylint: disable=protected-access
            if locked:
                pool._cond.release()  # pylint: disable=protected-access
            stops.append(([engine.pid for engine in engines], locked))
            return original_discard(engines, group, *args)
        monkeypatch.setattr(pool_module, "discard", spied_discard, raising=False)
        monkeypatch.setattr(pool_base, "discard", spied_discard)
        victim = pool.engine_pids()[0]
        os.kill(victim, signal.SIGKILL)
        assert process_gone(victim)
        assert pool.predict(common(1), items(3000)) == truth[trained_model][1]
        assert started.wait(30)
        pool.reload(scoring_args(second_model))
        reloaded.set()
        assert wait_until(lambda: stops, 30)
        (pids, lock_was_free), = stops
        assert lock_was_free and len(pids) == 1 and process_gone(pids[0])
        assert pids[0] not in pool.engine_pids() and len(pool.engine_pids()) == 2
        assert pool.predict(common(2), items(3000)) == truth[second_model][2]


def test_no_replacement_is_tried_again_once_the_pool_closed(trained_model, tmp_path):
    served = tmp_path / "served.vw"
    shutil.copy(trained_model, served)
    threads = threading.active_count()
    with VowpalWabbitPool(DictFormatter(), scoring_args(str(served)), size=2,
                          share_weights=False) as pool:
        os.unlink(served)
        victim = pool.engine_pids()[0]
        os.kill(victim, signal.SIGKILL)
        assert process_gone(victim)
        pool.predict(common(1), items(30))
        time.sleep(0.2)  # the replacement failed and waits to try again
    # close() wakes it: it ends instead of trying again
    assert wait_until(lambda: threading.active_count() <= threads, 5)


def test_a_pool_dropped_while_a_replacement_waits_is_released(trained_model, tmp_path, caplog):
    # The waiting replacement holds the pool only weakly: the pool and its
    # engines go as soon as the service lets go of it.
    served = tmp_path / "served.vw"
    shutil.copy(trained_model, served)
    pool = VowpalWabbitPool(DictFormatter(), scoring_args(str(served)), size=2,
                            share_weights=False)
    victim, survivor = pool.engine_pids()
    os.unlink(served)
    with caplog.at_level(logging.WARNING, logger="subwabbit"):
        os.kill(victim, signal.SIGKILL)
        assert process_gone(victim)
        pool.predict(common(1), items(30))
        assert wait_until(lambda: "attempt 1" in caplog.text)
    dropped = weakref.ref(pool)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del pool
        assert wait_until(lambda: gc.collect() >= 0 and dropped() is None, 5)
    assert process_gone(survivor)
    assert wait_until(lambda: not any(thread.name == "subwabbit-pool-replace"
                                      for thread in threading.enumerate()), 5)


def test_replacements_due_together_fork_from_one_new_server(trained_model, truth):
    pool, dead = _pool_with_a_dead_fork_server(trained_model)
    with pool:
        victims = pool.engine_pids()
        for victim in victims:
            os.kill(victim, signal.SIGKILL)
        assert all(process_gone(victim) for victim in victims)
        pool.predict(common(1), items(3000), timeout=0.5)  # finds both dead: two replacements
        assert wait_until(lambda: pool.stats()["engines"] == 2, 60)
        server = pool._groups[0].server  # pylint: disable=protected-access
        assert server is not None and server.pid != dead.pid
        # both forked by the one new server: no engine loaded a copy of its own
        assert [int(proc_stat(pid)[1]) for pid in pool.engine_pids()] == [server.pid] * 2
        assert pool.predict(common(2), items(3000)) == truth[trained_model][2]


def test_a_server_restart_that_the_close_overtakes_starts_nothing(trained_model, monkeypatch,
                                                                    caplog):
    import subwabbit.engine_group as engine_group  # pylint: disable=import-outside-toplevel
    before = set(children_of_this_process())
    pool, _ = _pool_with_a_dead_fork_server(trained_model)
    restarting = threading.Event()

    class SlowServer(engine_group.ForkServer):
        def __init__(self, *args, **kwargs):
            restarting.set()
            time.sleep(1.0)  # the close comes while the new server starts
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(engine_group, "ForkServer", SlowServer)
    victim = pool.engine_pids()[0]
    os.kill(victim, signal.SIGKILL)
    assert process_gone(victim)
    with caplog.at_level(logging.WARNING, logger="subwabbit"):
        pool.predict(common(1), items(300), timeout=0.5)
        assert restarting.wait(10)
        pool.close(timeout=5)
        # the restart finishes, finds the group closed, stops its server, starts no
        # engine, and is not tried again
        assert wait_until(lambda: not any(thread.name == "subwabbit-pool-replace"
                                          for thread in threading.enumerate()), 30)
    assert "replaced a failed" not in caplog.text
    assert wait_until(lambda: not set(children_of_this_process()) - before, 10)


@pytest.mark.parametrize("share", [False, True])
def test_no_replacement_loads_a_model_file_written_over_the_served_one(
        trained_model, second_model, truth, tmp_path, caplog, share):
    # A replacement that loaded the file again would serve calls of the old
    # generation with the new model, beside an engine that has the old one.
    current = tmp_path / "current.vw"
    shutil.copy(trained_model, current)
    with VowpalWabbitPool(DictFormatter(), scoring_args(str(current)), size=2,
                          share_weights=share) as pool:
        assert pool.shares_weights() is share
        assert pool.predict(common(1), items(3000)) == truth[trained_model][1]
        if share:  # a fork server forks from memory: only a new server reads the file
            server = pool._groups[0].server  # pylint: disable=protected-access
            os.kill(server.pid, signal.SIGKILL)
            assert wait_until(lambda: server.died)
        shutil.copy(second_model, tmp_path / "next.vw")
        os.replace(tmp_path / "next.vw", current)
        # The file is checked before anything loads it: no copy and no new
        # server is started only to be refused.
        group = pool._groups[0]  # pylint: disable=protected-access
        loads = []
        for name in ("_start_copy", "_start_server"):
            def counted(original=getattr(group, name), name=name):
                loads.append(name)
                return original()
            setattr(group, name, counted)
        with caplog.at_level(logging.WARNING, logger="subwabbit"):
            victim = pool.engine_pids()[0]
            os.kill(victim, signal.SIGKILL)
            assert process_gone(victim)
            assert pool.predict(common(2), items(3000)) == truth[trained_model][2]
            # (Each call takes dead engines out and has them replaced.)
            assert wait_until(lambda: "changed since" in caplog.text or not pool.predict(
                common(2), items(300)) == truth[trained_model][2][:300], 30), \
                (pool.stats(), [slot.engine.describe() for slot in pool._roster.slots])  # pylint: disable=protected-access
        assert "replacement" in caplog.text and "reload() the pool" in caplog.text
        assert pool.stats()["engines"] == 1 and pool.stats()["engines_replaced"] == 0
        assert loads == []
        for user in (3, 4):
            assert pool.predict(common(user), items(3000)) == truth[trained_model][user]
        pool.reload(scoring_args(str(current)))
        assert pool.predict(common(5), items(3000)) == truth[second_model][5]
        assert pool.stats()["engines"] == 2


@pytest.mark.parametrize("extra, shared", [([], False), (["-f", "MODEL"], False)])
def test_a_copy_per_engine_when_sharing_is_off_or_impossible(trained_model, truth, tmp_path,
                                                            extra, shared):
    extra = [str(tmp_path / "out.vw") if arg == "MODEL" else arg for arg in extra]
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model) + extra, size=2,
                          share_weights=bool(extra)) as pool:
        assert pool.shares_weights() is shared
        for pid in pool.engine_pids():
            assert int(proc_stat(pid)[1]) == os.getpid()
        assert pool.predict(common(1), items(3000)) == truth[trained_model][1]


def test_a_pool_of_one_engine_starts_it_on_its_own_with_vws_two_threads(trained_model, truth):
    """Nothing to share with one engine: it runs vw's driver, whose second
    thread gives a lone engine more predictions within a deadline."""
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1) as pool:
        assert not pool.shares_weights()
        [pid] = pool.engine_pids()
        assert int(proc_stat(pid)[1]) == os.getpid()
        assert pool.predict(common(1), items(3000)) == truth[trained_model][1]
        assert len(os.listdir(f"/proc/{pid}/task")) == 2
        pool.reload(scoring_args(trained_model))
        assert not pool.shares_weights()
        assert pool.predict(common(2), items(3000)) == truth[trained_model][2]


def test_a_model_that_needs_vws_own_driver_is_served_by_separate_engines(tmp_path):
    data = tmp_path / "oaa.txt"
    data.write_text("".join(f"{1 + n % 3} |f x{n % 3}\n" for n in range(300)), encoding="utf-8")
    model = tmp_path / "oaa.vw"
    subprocess.run(default_engine_command() + ["-d", str(data), "-f", str(model), "--oaa", "3",
                                               "--quiet"], check=True, timeout=120)

    class F(DictFormatter):
        def format_common_features(self, common_features, debug_info=None):
            return "|c"

        def format_item_features(self, common_features, item_features, debug_info=None):
            return f"|f x{item_features['id'] % 3}"

    with VowpalWabbitPool(F(), ["-i", str(model), "-t", "--quiet"], size=2) as pool:
        assert not pool.shares_weights()
        assert pool.predict(None, items(300)) == [1 + (n % 50) % 3 for n in range(300)]


def test_a_stopped_engine_is_replaced_after_io_timeout_s_and_calls_stay_on_time(
        trained_model, truth):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                          io_timeout_s=1.0) as pool:
        stopped = pool.engine_pids()[0]
        os.kill(stopped, signal.SIGSTOP)
        try:
            deadline = time.time() + 20
            while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
                began = time.perf_counter()
                got = pool.predict(common(1), items(3000), timeout=0.010)
                assert time.perf_counter() - began < 0.010 + 0.1
                assert got == truth[trained_model][1][:len(got)]
                time.sleep(0.005)
            assert pool.stats()["engine_failures"] == 1
            assert stopped not in pool.engine_pids()
            assert pool.predict(common(2), items(3000)) == truth[trained_model][2]
        finally:
            try:
                os.kill(stopped, signal.SIGCONT)
            except ProcessLookupError:
                pass



@pytest.mark.parametrize("kind", ["scalar", "cb_explore_adf"])
def test_a_call_without_a_deadline_on_a_stopped_engine_fails_over_after_io_timeout_s(
        trained_model, truth, kind):
    """A call of one batch (the first is the last; a multi-line example is
    always one) waits right after writing it: that wait must end within
    io_timeout_s when the engine never answers, and the call goes on with
    a replacement (it waited for a stopped engine forever once)."""
    if kind == "scalar":
        args, its, kwargs = scoring_args(trained_model), items(10), {}
    else:
        args, its, kwargs = ["--cb_explore_adf", "--quiet"], items(5), {
            "prediction_type": "cb_explore_adf"}
    with VowpalWabbitPool(DictFormatter(), args, size=1, io_timeout_s=0.5, **kwargs) as pool:
        expected = pool.predict(common(1), its)
        stopped = pool.engine_pids()[0]
        os.kill(stopped, signal.SIGSTOP)
        outcome = {}

        def call():
            began = time.perf_counter()
            outcome["got"] = pool.predict(common(1), its)
            outcome["took"] = time.perf_counter() - began

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(10)
        try:
            os.kill(stopped, signal.SIGCONT)
        except ProcessLookupError:
            pass
        caller.join(10)
        assert "took" in outcome and outcome["took"] < 5, outcome
        assert outcome["got"] == expected
        if kind == "scalar":
            assert expected == truth[trained_model][1][:10]
        assert pool.stats()["engine_failures"] == 1
        assert stopped not in pool.engine_pids()

@pytest.mark.parametrize("share", [True, False])
def test_engines_of_a_crowded_pool_run_below_the_client(trained_model, truth, share):
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                          share_weights=share, low_priority_engines=True) as pool:
        for pid in pool.engine_pids():
            assert os.sched_getscheduler(pid) == os.SCHED_BATCH
            assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, mine + LOW_PRIORITY_NICE)
        victim = pool.engine_pids()[0]
        os.kill(victim, signal.SIGKILL)
        assert process_gone(victim)
        assert pool.predict(common(1), items(3000)) == truth[trained_model][1]
        deadline = time.time() + 30
        while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
            time.sleep(0.01)
        for pid in pool.engine_pids():  # the replacement too
            assert os.sched_getscheduler(pid) == os.SCHED_BATCH
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1,
                          share_weights=share, low_priority_engines=False) as pool:
        # by default: lowered when several engines and one calling thread
        # exceed the CPUs; a lone engine (vw's two threads) never
        with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1) as default:
            assert default.low_priority_engines is False
            [pid] = default.engine_pids()
            assert os.sched_getscheduler(pid) == os.SCHED_OTHER
        with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as default:
            assert default.low_priority_engines is (3 > len(os.sched_getaffinity(0)))
        for pid in pool.engine_pids():
            assert os.sched_getscheduler(pid) == os.SCHED_OTHER
            assert os.getpriority(os.PRIO_PROCESS, pid) == mine


@pytest.mark.parametrize("timeout", [None, 20.0])
def test_close_wakes_a_call_waiting_for_an_engine_of_a_pool_with_none(trained_model, tmp_path,
                                                                      timeout):
    """A call waiting for an engine while the pool has none in service (its
    one engine died, the replacement is starting) ends when the pool closes.
    (close() changed nothing a waiting thread looks at when no engine was
    left to take out of service: the call slept on until its deadline, or
    io_timeout_s, or for ever without one.)"""
    flag, command = slow_starting_engine(tmp_path, 5.0)
    pool = VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1,
                            vw_command=command, io_timeout_s=20.0)
    flag.touch()  # the replacement takes 5 s to start
    victim = pool.engine_pids()[0]
    os.kill(victim, signal.SIGKILL)
    assert process_gone(victim)
    # A call finds it dead: it is taken out of service, and replaced.
    assert wait_until(lambda: pool.predict(common(1), items(100), timeout=0.0) == []
                      and pool.stats()["engine_failures"] == 1)
    assert pool.stats()["engines"] == 0
    errors, ended = [], []

    def call():
        try:
            pool.predict(common(1), items(100), timeout=timeout)
        except VowpalWabbitError as exc:
            errors.append(exc)
        ended.append(time.perf_counter())

    thread = threading.Thread(target=call)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a timeout of 20 s is meant)
        thread.start()
        assert wait_until(lambda: pool._roster.waiting == 1)
        time.sleep(0.1)
        closed = time.perf_counter()
        pool.close(timeout=1.0)
        thread.join(10)
    assert len(ended) == 1 and ended[0] - closed < 1.5
    assert len(errors) == 1 and "closed" in str(errors[0])


def test_close_ends_a_call_waiting_for_a_replacement_with_its_prefix(trained_model, truth,
                                                                     tmp_path):
    """A call in progress whose engines all failed waits for a replacement;
    when the pool closes meanwhile, it ends at once with the predictions it
    has, as every call in progress does. (It slept on until io_timeout_s,
    then raised, and what it had was lost.)"""
    flag, command = slow_starting_engine(tmp_path, 5.0)

    class SlowFormatter(DictFormatter):
        def format_item_features(self, common_features, item_features, debug_info=None):
            time.sleep(0.00005)
            return super().format_item_features(common_features, item_features, debug_info)

    pool = VowpalWabbitPool(SlowFormatter(), scoring_args(trained_model), size=1,
                            vw_command=command, io_timeout_s=20.0)
    flag.touch()  # the replacement takes 5 s to start
    results, errors, ended = [], [], []

    def call():
        try:
            results.append(pool.predict(common(2), items(3000) * 100))
        except VowpalWabbitError as exc:
            errors.append(exc)
        ended.append(time.perf_counter())

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.3)
    os.kill(pool.engine_pids()[0], signal.SIGKILL)
    assert wait_until(lambda: pool.stats()["engine_failures"] == 1)
    time.sleep(0.2)
    assert not ended
    closed = time.perf_counter()
    pool.close(timeout=1.0)
    thread.join(10)
    assert len(ended) == 1 and ended[0] - closed < 1.5
    assert errors == []
    got = results[0]
    assert 0 < len(got) and got == (truth[trained_model][2] * 100)[:len(got)]


def test_close_lets_calls_in_progress_end_with_their_prefix(trained_model, truth):
    pool = VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)
    results, errors = [], []

    def long_call():
        try:
            results.append(pool.predict(common(2), items(3000) * 40))
        except Exception as exc:  # pylint: disable=broad-except
            errors.append(exc)

    thread = threading.Thread(target=long_call)
    thread.start()
    time.sleep(0.02)
    began = time.perf_counter()
    pool.close(timeout=2.0)
    assert time.perf_counter() - began < 2.0 + 0.5
    thread.join(10)
    assert errors == []
    got = results[0]
    assert 0 < len(got) < 120000 and got == (truth[trained_model][2] * 40)[:len(got)]


def test_an_idle_engine_with_leftovers_is_not_taken_for_stuck(trained_model, truth):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                          io_timeout_s=0.3, write_cutoff_s=0.0) as pool:
        pool.predict(common(1), items(3000) * 20, timeout=0.003)  # leaves lines in flight
        assert any(slot.channel.in_flight_lines for slot in pool._roster.slots)
        time.sleep(0.5)  # longer than io_timeout_s, nobody reading their answers
        for _ in range(5):
            assert pool.predict(common(3), items(60)) == truth[trained_model][3][:60]
        assert pool.stats()["engine_failures"] == 0


class _HeldFormatter(DictFormatter):
    """Stops before its 101st item until ``resume`` is set: the call holds its
    engine meanwhile."""

    def __init__(self):
        super().__init__()
        self.reached, self.resume = threading.Event(), threading.Event()
        self.formatted = 0

    def format_item_features(self, common_features, item_features, debug_info=None):
        self.formatted += 1
        if self.formatted == 101:
            self.reached.set()
            self.resume.wait(30)
        return super().format_item_features(common_features, item_features, debug_info)


def test_close_never_closes_pipes_a_call_still_uses(trained_model, truth):
    # close(0.2) cannot wait for a call stuck in its formatter. Were the
    # engine's descriptors closed under it, their numbers would go to the next
    # pipe opened (another engine's, in a service): here a pipe of answers that
    # are nobody's. The call must neither read them nor write into it.
    formatter = _HeldFormatter()
    pool = VowpalWabbitPool(formatter, scoring_args(trained_model), size=1)
    engine = pool._roster.slots[0].engine
    outcome = {}

    metrics = {}

    def call():
        try:
            outcome["got"] = pool.predict(common(1), items(400), metrics=metrics)
        except VowpalWabbitError as exc:
            outcome["raised"] = exc
        except BaseException as exc:  # pylint: disable=broad-except
            outcome["wrong error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    assert formatter.reached.wait(10)
    began = time.perf_counter()
    pool.close(timeout=0.2)
    assert time.perf_counter() - began < 0.2 + 0.5
    try:
        with pipe_on_freed_numbers(engine) as planted:
            until = time.time() + 5  # the engine close() killed is dead before the call goes on
            while time.time() < until and (proc_stat(engine.pid) or ["Z"])[0] != "Z":
                time.sleep(0.01)
            formatter.resume.set()
            thread.join(30)
    finally:
        formatter.resume.set()
    assert not thread.is_alive()
    assert planted.left == planted.marker  # nothing read from it, nothing written into it
    assert "got" in outcome, outcome  # it ends with what it has
    assert outcome["got"] == truth[trained_model][1][:len(outcome["got"])]
    assert metrics["engine_failures"] == 0  # close() killed its engine: no failure


def test_a_call_whose_old_model_engines_fail_after_a_reload_fails_at_once(
        trained_model, second_model):
    # Its model is gone: no engine of it will be started again, so a call
    # with no deadline must not wait out io_timeout_s for one.
    pool = VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1,
                            io_timeout_s=20)
    try:
        old = pool.engine_pids()
        outcome = {}

        def call():
            try:
                outcome["got"] = pool.predict(common(1), items(3000) * 300)
            except VowpalWabbitError as exc:
                outcome["raised"] = exc
                outcome["at"] = time.perf_counter()

        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(0.3)
        pool.reload(scoring_args(second_model))
        killed = time.perf_counter()
        os.kill(old[0], signal.SIGKILL)
        thread.join(30)
        assert "raised" in outcome, outcome.keys()
        assert "reload has replaced that model" in str(outcome["raised"])
        assert outcome["at"] - killed < 5  # not io_timeout_s (20 s)
    finally:
        pool.close()


def test_a_forked_child_that_reloads_first_runs_only_the_new_engines(
        trained_model, second_model, truth):
    pool = VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)
    try:
        def child():
            pool.reload(scoring_args(second_model))
            got = pool.predict(common(1), items(3000))
            engines = pool.engine_pids()
            until = time.perf_counter() + 3  # time for a second start to show
            while len(engines) <= 2 and time.perf_counter() < until:
                time.sleep(0.05)
                engines = pool.engine_pids()
            pool.close(5)
            return [got, engines]

        result = in_child(child)
        assert "error" not in result, result
        got, engines = result["ok"]
        assert got == truth[second_model][1]
        assert len(engines) == 2
        assert pool.predict(common(1), items(3000)) == truth[trained_model][1]
    finally:
        pool.close()


def test_an_engine_that_ends_after_its_fork_server_died_has_an_unknown_status(trained_model):
    from subwabbit.errors import UNKNOWN_EXIT_STATUS, describe_returncode  # pylint: disable=import-outside-toplevel
    pool = VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)
    try:
        group = pool._groups[0]
        assert group.shares_weights
        server = group.server.engine.pid
        process = pool._roster.slots[0].engine.proc  # forked by the server
        os.kill(server, signal.SIGKILL)
        until = time.time() + 10
        while not group.server.died and time.time() < until:
            time.sleep(0.01)
        os.kill(process.pid, signal.SIGKILL)
        while process.poll() is None and time.time() < until:
            time.sleep(0.01)
        # not "exited with code 0": nobody could learn how it ended
        assert process.poll() == UNKNOWN_EXIT_STATUS
        assert "unknown status" in describe_returncode(process.poll())
    finally:
        pool.close()


def test_a_fork_server_closed_with_exit_reports_unread_ends_quietly(trained_model):
    # A pool closes its fork server's socket as its engines end; the exit
    # statuses the server sent last may not have been read yet. Closed with
    # unread messages, the socket resets the server's end: the server raised
    # ConnectionResetError, and its traceback came out as a dozen WARNING
    # lines of "subwabbit.engine" at a service's shutdown, the server exiting
    # with code 1 (seen under uvicorn).
    from subwabbit.command import build_argv, normalize_vw_args  # pylint: disable=import-outside-toplevel
    argv = build_argv(default_engine_command(), normalize_vw_args(scoring_args(trained_model)),
                      predictions=True, audit=False)
    server = ForkServer(argv, 30.0)
    engines = [server.fork_engine(30.0) for _ in range(3)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)  # the reader thread cannot take the statuses from us
    try:
        for engine in engines:
            os.kill(engine.pid, signal.SIGKILL)
        until = time.perf_counter() + 0.5  # a busy wait holds the interpreter lock
        while time.perf_counter() < until:
            pass
        server.close()
    finally:
        sys.setswitchinterval(interval)
        for engine in engines:
            try:
                engine.close(1.0)
            except VowpalWabbitError:  # killed, as meant
                pass
    assert server.engine.proc.returncode == 0, server.engine.stderr_tail()
    assert "Traceback" not in server.engine.stderr_tail()


def test_reload_with_an_infinite_timeout_closes_the_old_engines(trained_model, second_model,
                                                                truth):
    pool = VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)
    try:
        old = pool.engine_pids()
        pool.reload(scoring_args(second_model), timeout=math.inf)  # no OverflowError
        assert pool.predict(common(1), items(3000)) == truth[second_model][1]
        for pid in old:
            assert process_gone(pid)
    finally:
        pool.close()


def test_a_running_call_never_takes_an_engine_an_interrupted_call_tore(trained_model, truth):
    # Two threads: call A, interrupted while it wrote to its engine, gives it
    # back torn while call B runs; B must not take it when it rebalances
    # (a review found B's answers shifted onto other items: 1,100 of 3,000).
    from test_robustness import _Interrupt  # pylint: disable=import-outside-toplevel

    class Slow(DictFormatter):  # B is still dealing when A gives its engine back
        def format_item_features(self, common_features, item_features, debug_info=None):
            time.sleep(0.00005)
            return super().format_item_features(common_features, item_features, debug_info)

    with VowpalWabbitPool(Slow(), scoring_args(trained_model), size=2) as pool:
        torn, other = pool._roster.slots  # pylint: disable=protected-access
        roster = pool._roster  # pylint: disable=protected-access
        with pool._state_lock():  # pylint: disable=protected-access
            roster.take(other)  # A is served by `torn` alone
        real = torn.engine.write_some

        def write_some(view, deadline=None):
            written = real(view, deadline)
            if written:
                torn.engine.write_some = real
                raise _Interrupt()  # the bytes went; the count did not
            return written

        torn.engine.write_some = write_some
        with pytest.raises(_Interrupt):
            pool.predict(common(1), items(3000), timeout=5.0)
        assert torn.channel.torn
        with pool._state_lock():  # pylint: disable=protected-access
            roster.take(torn)  # as if A still held it when B began
            roster.give_back(other)
        got = {}
        thread = threading.Thread(target=lambda: got.update(b=pool.predict(common(2), items(3000))))
        thread.start()
        time.sleep(0.02)
        with pool._state_lock():  # pylint: disable=protected-access
            roster.give_back(torn)  # A's end gives it back, torn
            roster.version += 1
            pool._changed()  # pylint: disable=protected-access
        thread.join(30)
        assert got["b"] == truth[trained_model][2]
        assert pool.predict(common(3), items(3000)) == truth[trained_model][3]
        assert torn.engine.closed or torn not in roster.slots


def test_a_forked_childs_stats_count_its_own_calls_not_its_parents(trained_model, truth):
    """A forked child's pool counts the calls it serves: it counted its
    parent's as well, so that summed over the workers of a preloaded
    service the master's calls were counted once per worker (found by the
    metrics review). The model's generation is kept."""
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=1) as pool:
        for user in range(3):
            pool.predict(common(user), items(100))
        pool.reload(scoring_args(trained_model))

        def child():
            got = [pool.predict(common(user), items(100)) == truth[trained_model][user][:100]
                   for user in range(2)]
            stats = pool.stats()
            pool.close()
            return [got, stats["calls"], stats["reloads"], stats["generation"]]

        result = in_child(child, limit_s=60)
        assert "error" not in result, result
        assert result["ok"] == [[True, True], 2, 0, 1]
        assert pool.stats()["calls"] == 3 and pool.stats()["reloads"] == 1

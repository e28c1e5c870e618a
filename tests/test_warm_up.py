"""New engines of a pool warm up on a recent call's lines before they serve,
and engines that serve no more are closed at the lowest CPU priority.

A new engine is slow on its first few hundred lines (its example pool and
buffers grow), and an engine on its way out (a fork server frees the
model) takes CPU from the calls in progress: both showed in the calls
right after a reload. The core's part is tested without processes; the
pools' part on real engines, by what the engines read (``/proc/PID/io``)
and their nice values (``/proc/PID/stat``).
"""

import asyncio
import contextlib
import os
import signal
import threading
import time

import pytest

from subwabbit import AsyncVowpalWabbitPool, VowpalWabbitPool, VowpalWabbitProcess
from subwabbit.core.channel import Channel
from subwabbit.core.exchanges import WarmUpExchange, warm_up_lines_usable

from conftest import DictFormatter, common, format_lines, items, proc_stat, scoring_args

#: The pools' batch: the first batch of a call is what new engines warm up on.
FIRST_BATCH = 100


def read_chars(pid):
    """Bytes the process has read with read(2) and the like since it started."""
    with open(f"/proc/{pid}/io", encoding="utf-8") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def nice_of(pid):
    """The nice value of ``pid``'s main thread, or ``None`` once it is gone."""
    fields = proc_stat(pid)
    return None if fields is None or fields[0] == "Z" else int(fields[16])


def sample_bytes(user):
    """The bytes of the first batch of a call for ``user`` on items(3000)."""
    lines = format_lines(DictFormatter(), common(user), items(3000))[:FIRST_BATCH]
    return len(("\n".join(lines) + "\n").encode())


# ------------------------------------------------------------------ the core


def test_the_warm_up_sends_each_chunk_once_the_last_is_answered_and_drops_the_answers():
    channel = Channel(1)
    call = channel.begin()
    exchange = WarmUpExchange(channel, call, None, ["|a x", "|a y"], rounds=2)
    sent = []

    def write(view):
        sent.append(bytes(view))
        return len(view)

    assert exchange.step(0.0) == []
    channel.write_with(write)
    assert sent == [b"|a x\n"] and not exchange.done
    exchange.step(0.1)  # nothing answered yet: no second chunk
    assert channel.unwritten_bytes == 0 and call.owed_lines == 1
    channel.receive(b"0.5\n")
    exchange.step(0.2)
    channel.write_with(write)
    assert sent[-1] == b"|a y\n|a x\n" and not exchange.done
    channel.receive(b"0.25\n")
    exchange.step(0.3)
    assert channel.unwritten_bytes == 0 and not exchange.done
    channel.receive(b"0.5\n")
    exchange.step(0.4)
    channel.write_with(write)
    assert sent[-1] == b"|a y\n" and not exchange.done
    channel.receive(b"0.25\n")
    assert exchange.step(0.5) == [] and exchange.done and not exchange.timed_out
    assert call.answers == [] and exchange.answered == 4


def test_a_warm_up_whose_budget_has_passed_sends_nothing():
    channel = Channel(1)
    exchange = WarmUpExchange(channel, channel.begin(), 10.0, ["|a x"], budget_end=1.0)
    exchange.step(1.0)
    assert exchange.done and not exchange.timed_out and channel.unwritten_bytes == 0


def test_the_warm_up_ends_at_its_deadline():
    channel = Channel(1)
    exchange = WarmUpExchange(channel, channel.begin(), 1.0, ["|a x"], rounds=2)
    exchange.step(0.5)
    exchange.step(1.0)
    assert exchange.done and exchange.timed_out


@pytest.mark.parametrize("lines", [[], ["1 |a x"], ["'tag |a x"], ["|a x", "|a\ny"],
                                   ["|a\r"], [" |a x"]])
def test_only_unlabelled_single_line_examples_warm_an_engine_up(lines):
    assert not warm_up_lines_usable(lines)
    with pytest.raises(ValueError):
        WarmUpExchange(Channel(1), Channel(1).begin(), None, lines)


def test_lines_of_examples_with_no_label_warm_an_engine_up():
    assert warm_up_lines_usable(["|u u1 |i i2 c2", "|i i3"])


# ----------------------------------------------------------------- the pools


@pytest.mark.parametrize("share", [True, False])
def test_a_reloads_engines_predict_a_recent_calls_lines_before_they_serve(
        trained_model, second_model, truth, share):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                          share_weights=share) as pool:
        pool.reload(scoring_args(trained_model))  # before any call: nothing to warm up on
        cold = [read_chars(pid) for pid in pool.engine_pids()]
        assert pool.predict(common(1), items(3000)) == truth[trained_model][1]
        pool.reload(scoring_args(trained_model))
        warm = [read_chars(pid) for pid in pool.engine_pids()]
        # Twice the first batch of the last call, besides what a cold one
        # read (with a copy each: the same model file too).
        assert min(warm) - max(cold) >= 2 * sample_bytes(1), (cold, warm)
        if share:  # a forked engine had read only its start-up probes
            assert max(cold) < 100
        assert pool.predict(common(2), items(3000)) == truth[trained_model][2]
        pool.reload(scoring_args(second_model))
        assert pool.predict(common(2), items(3000)) == truth[second_model][2]


def test_a_replacement_engine_is_warmed_up_before_it_serves(trained_model, truth):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        assert pool.predict(common(3), items(3000)) == truth[trained_model][3]
        victim, survivor = pool.engine_pids()
        os.kill(victim, signal.SIGKILL)
        # A short call, over before the replacement is up: it serves no call
        # before the check below.
        assert pool.predict(common(4), items(200)) == truth[trained_model][4][:200]
        deadline = time.time() + 30
        while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
            time.sleep(0.01)
        (replacement,) = set(pool.engine_pids()) - {survivor}
        # The call that met the dead engine failed a lane: its lines are not
        # the sample; the call before it (user 3) gave it.
        assert read_chars(replacement) >= 2 * sample_bytes(3)


def test_warming_up_changes_no_prediction_of_a_model_loaded_for_learning(
        trained_model, tmp_path, truth):
    # Without -t the engines would learn from labelled lines: the warm-up
    # lines have no label, so the predictions stay the model's.
    args = [arg for arg in scoring_args(trained_model) if arg != "-t"]
    with VowpalWabbitPool(DictFormatter(), args, size=2) as pool:
        for user in range(3):
            assert pool.predict(common(user), items(3000)) == truth[trained_model][user]
        pool.reload(args)
        for user in range(3):
            assert pool.predict(common(user), items(3000)) == truth[trained_model][user]


def test_no_warm_up_with_lines_that_carry_a_label(trained_model, truth):
    class Labelled(DictFormatter):
        def format_common_features(self, common_features, debug_info=None):
            return "'req " + super().format_common_features(common_features, debug_info)

    with VowpalWabbitPool(Labelled(), scoring_args(trained_model), size=2) as pool:
        pool.predict(common(1), items(300))
        pool.reload(scoring_args(trained_model))
        assert max(read_chars(pid) for pid in pool.engine_pids()) < 100


@contextlib.contextmanager
def stopped_and_watched(pids):
    """Stop the processes (SIGSTOP: they cannot exit before their nice
    values are read) and record the highest nice value each is seen at, from
    a thread that polls without sleeping: when a fork server among them
    exits, the kernel continues the stopped members of the process group it
    leaves orphaned, and those may then exit at once. Yields the record
    (pid to nice value); continues them all on the way out."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    seen = {}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            for pid in pids:
                nice = nice_of(pid)
                if nice is not None:
                    seen[pid] = max(seen.get(pid, -20), nice)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def test_the_old_engines_and_fork_server_of_a_reload_are_closed_at_the_lowest_priority(
        trained_model, second_model, truth):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        pool.predict(common(1), items(300))
        old = pool.engine_pids()
        server = pool._groups[0].server.pid  # pylint: disable=protected-access
        before = {pid: nice_of(pid) for pid in old + [server]}
        assert all(nice < 19 for nice in before.values())
        with stopped_and_watched(old + [server]) as seen:
            pool.reload(scoring_args(second_model), timeout=1.0)
            deadline = time.time() + 5
            while any(seen.get(pid) != 19 for pid in old + [server]) and time.time() < deadline:
                time.sleep(0.01)
        assert seen == {pid: 19 for pid in old + [server]}
        # (A crowded pool's engines run a little below the client: see
        # low_priority_engines. The new ones are as the old ones were.)
        assert [nice_of(pid) for pid in pool.engine_pids()] == [before[old[0]]] * 2
        assert pool.predict(common(2), items(3000)) == truth[second_model][2]


def test_the_asyncio_pool_warms_up_its_reloads_engines_and_retires_the_old_ones(
        trained_model, second_model, truth):
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=2) as pool:
            assert await pool.predict(common(5), items(3000)) == truth[trained_model][5]
            old = pool.engine_pids()
            server = pool._groups[0].server.pid  # pylint: disable=protected-access
            with stopped_and_watched(old + [server]) as seen:
                await pool.reload(scoring_args(second_model), timeout=1.0)
                deadline = time.time() + 5
                while any(seen.get(pid) != 19 for pid in old + [server]) \
                        and time.time() < deadline:
                    await asyncio.sleep(0.01)
            assert seen == {pid: 19 for pid in old + [server]}
            assert min(read_chars(pid) for pid in pool.engine_pids()) >= 2 * sample_bytes(5)
            assert await pool.predict(common(0), items(3000)) == truth[second_model][0]

    asyncio.run(main())


class Wide(DictFormatter):
    """Items of 90 features each: with ``--interactions iiii`` about 10 ms per line."""

    def format_item_features(self, common_features, item_features, debug_info=None):
        return "|i " + " ".join(f"f{item_features['id']}_{k}" for k in range(90))


def test_an_engine_slow_per_line_warms_up_on_what_fits_and_starts_in_time():
    # Warmed up on the last call's whole first batch (100 lines, 1 s), a
    # reload took longer than the start-up timeout and failed.
    args = ["--interactions", "iiii", "-t", "--quiet"]
    with VowpalWabbitPool(Wide(), args, size=2, startup_timeout_s=1.5) as pool:
        # (time for a first batch of 100 lines on each engine: about 1 s here
        # on a quiet machine, 3 s on a slow one)
        got = pool.predict(common(1), items(3000), timeout=4.0)
        assert 0 < len(got) < 3000
        began = time.perf_counter()
        pool.reload(args)
        assert time.perf_counter() - began < 1.0
        # Something was warmed up, and nothing was left in flight: the
        # next call's answers are its own.
        assert all(read_chars(pid) > 100 for pid in pool.engine_pids())
        assert pool.predict(common(1), items(20)) == got[:20]
        victim = pool.engine_pids()[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.time() + 10
        while pool.stats()["engines_replaced"] < 1 and time.time() < deadline:
            time.sleep(0.01)
        assert pool.stats()["engines_replaced"] == 1 and len(pool.engine_pids()) == 2
        assert pool.predict(common(1), items(20)) == got[:20]


def test_the_warm_up_sends_growing_chunks_while_they_fit_in_its_budget():
    lines = [f"|a x{index}" for index in range(100)]
    channel = Channel(1)
    call = channel.begin()
    exchange = WarmUpExchange(channel, call, 100.0, lines, rounds=2, budget_end=0.1)
    sizes = []
    now = 0.0

    def write(view):
        sizes.append(bytes(view).count(b"\n"))
        return len(view)

    while not exchange.done:
        exchange.step(now)
        if channel.unwritten_bytes:
            channel.write_with(write)
        now += 0.001 * call.owed_lines  # 1 ms per line
        channel.receive(b"0.5\n" * call.owed_lines)
    # 1 line took 1 ms, then 2, 4, 8, 16 and 32 more (63 ms in all); 64 more
    # would end at 127 ms, after the budget.
    assert sizes == [1, 2, 4, 8, 16, 32] and exchange.answered == 63
    assert not exchange.timed_out and call.owed_lines == 0


class HeavyFirst(DictFormatter):
    """Items 0-1 have 320 features (with ``--interactions iiii``, 1.3 s a
    line on a host where a Python loop of 10**7 additions takes 0.5 s, and
    more on slower ones: 250 took 0.4 s there, inside the start-up timeout
    of the test below), the others 8."""

    def format_item_features(self, common_features, item_features, debug_info=None):
        count = 320 if item_features["id"] < 2 else 8
        return "|i " + " ".join(f"f{item_features['id']}_{k}" for k in range(count))


def test_a_warm_up_cut_by_the_start_up_timeout_leaves_its_answers_to_no_call(tmp_path):
    # The first warm-up line takes longer than the start-up timeout leaves:
    # the engine serves with that line's answer owed to no call, and the
    # first call's answers are its own.
    model = str(tmp_path / "slow.vw")
    with VowpalWabbitProcess(HeavyFirst(), ["--interactions", "iiii", "-f", model, "--quiet"],
                             write_only=True) as trainer:
        trainer.train(common(0), items(40)[2:], [1 if k % 3 else -1 for k in range(38)],
                      [None] * 38)
    args = ["-i", model, "-t", "--quiet"]
    with VowpalWabbitPool(HeavyFirst(), args, size=2) as fresh:
        expected = fresh.predict(common(0), items(40)[2:])
    assert len(set(expected)) > 10
    with VowpalWabbitPool(HeavyFirst(), args, size=2, startup_timeout_s=0.5) as pool:
        pool.predict(common(0), items(3))  # its first batch: 2 heavy lines first
        began = time.perf_counter()
        pool.reload(args)
        assert time.perf_counter() - began < 2.0
        assert any(slot.channel.stale_lines for slot in pool._roster.slots)  # pylint: disable=protected-access
        assert pool.predict(common(0), items(40)[2:]) == expected

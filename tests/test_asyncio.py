"""The asyncio client against the real engine, on real event loops."""

import asyncio
import os
import signal
import sys
import textwrap
import threading
import time

import pytest

from subwabbit import (AsyncVowpalWabbitProcess, VowpalWabbitDummyFormatter,
                       VowpalWabbitEngineExitedError, VowpalWabbitError,
                       VowpalWabbitProtocolError, VowpalWabbitStartupError,
                       VowpalWabbitTimeoutError)

from conftest import (STUBBORN_ENGINE, CyclesLeft, DictFormatter, children_of_this_process,
                      WideItems, common, expected_for, items, scoring_args, slow_starting_engine,
                      wide_model)


def run(coroutine):
    return asyncio.run(coroutine)


def test_an_engine_that_restart_started_while_close_ran_does_not_outlive_it(tmp_path):
    """close() does not wait for a restart() whose engine is slow to start;
    the closed object must not adopt the engine that start gives."""
    flag, command = slow_starting_engine(tmp_path, 1.0)

    async def main():
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"],
                                         vw_command=command)
        await model.start()
        before = set(children_of_this_process())  # its first engine among them
        flag.write_text("")
        restart = asyncio.ensure_future(model.restart())
        await asyncio.sleep(0.3)  # the new engine is starting
        await model.close(timeout=0.5)
        with pytest.raises(VowpalWabbitError, match="closed"):
            await restart
        until = time.monotonic() + 10
        while time.monotonic() < until and set(children_of_this_process()) - before:
            await asyncio.sleep(0.05)
        return set(children_of_this_process()) - before

    assert run(main()) == set()


@pytest.mark.parametrize("how", ["first call", "replacement after a crash"])
def test_a_start_cut_short_by_the_end_of_its_event_loop_is_made_again_on_the_next(
        trained_model, truth, how):
    """A call returns by its deadline while the engine starts in the
    background; when its loop ends first (``asyncio.run()`` of one request),
    the start is cancelled with it. Every later call, on any loop, raised
    ``RuntimeError('Event loop is closed')``: it waited for that start."""
    model = AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(trained_model),
                                     restart_on_crash=True)

    async def first():
        if how == "first call":
            assert await model.predict(common(1), items(3000), timeout=0.001) == []
            return
        await model.start()
        os.kill(model.pid, signal.SIGKILL)
        with pytest.raises(VowpalWabbitEngineExitedError):
            await model.predict(common(1), items(3000), timeout=5.0)

    async def then():
        try:
            return (await model.predict(common(2), items(3000)),
                    await model.predict(common(3), items(3000), timeout=5.0))
        finally:
            await model.close()

    run(first())
    assert run(then()) == (truth[trained_model][2], truth[trained_model][3])
    assert model.restart_count == (1 if how == "replacement after a crash" else 0)


def test_calls_leave_no_reference_cycles(trained_model, truth):
    async def main():
        async with AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(trained_model)) as model:
            await model.predict(common(0), items(3000), timeout=0.005)
            with CyclesLeft() as cycles:
                for user in range(3):
                    got = await model.predict(common(user), items(3000) * 5, timeout=0.005)
                    assert got == (truth[trained_model][user] * 5)[:len(got)]
                    assert await model.predict(common(user), items(3000)) == \
                        truth[trained_model][user]
            return cycles.names

    assert run(main()) == []


@pytest.mark.parametrize("count", [0, 1, 49, 50, 51, 777])
def test_predictions_equal_engine_reading_a_file(trained_model, tmp_path, count):
    formatter = DictFormatter()
    common = {"user": 4, "ctx": ["k2"]}
    expected = expected_for(formatter, trained_model, tmp_path, common, items(count))

    async def main():
        async with AsyncVowpalWabbitProcess(formatter, scoring_args(trained_model)) as model:
            return await model.predict(common, items(count))

    assert run(main()) == expected


def test_train_save_and_explain(tmp_path):
    async def main():
        async with AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"]) as model:
            for _ in range(10):
                await model.train("|u a", ["|i b", "|i c"], [1, -1], [None, None])
            scores = await model.predict("|u a", ["|i b", "|i c"])
            await model.save(str(tmp_path / "m.vw"))
        async with AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                                            ["-i", str(tmp_path / "m.vw"), "--quiet"],
                                            audit_mode=True) as auditor:
            raw, explanation = await auditor.explain_vw_line("|u a |i b")
        return scores, raw, explanation

    scores, raw, explanation = run(main())
    assert scores[0] > 0 > scores[1]
    assert raw == pytest.approx(scores[0], abs=1e-5)
    assert "i^b" in explanation


#: A vw stand-in in audit mode whose answer to a line holding ``garbage``
#: has one line too many at its start (a raw score it cannot print), so
#: every later answer comes one line late.
SHIFTING_AUDIT_ENGINE = textwrap.dedent("""
    import sys
    shifted = False
    for line in sys.stdin:
        if line == "\\n":
            continue
        name = line.split()[-1]
        if "garbage" in line:
            sys.stdout.write("x\\n\\tf^a:1:1:0\\nx\\n")
            shifted = True
        elif shifted:  # the previous answer's last line, then this one's first two
            sys.stdout.write(f"0.5\\n0\\n\\tf^{name}:1:1:0\\n")
            sys.stdout.flush()
            sys.stdin.readline()  # (the rest only when the next line comes)
            sys.stdout.write("0\\n")
        else:
            sys.stdout.write(f"0\\n\\tf^{name}:1:1:0\\n0\\n")
        sys.stdout.flush()
""")


def test_an_audit_answer_that_is_no_raw_score_fails_the_engine(tmp_path):
    # As VowpalWabbitProcess does: the engine's output is out of step. Before,
    # the process went on with it, and the next explain_vw_line returned
    # (0.5, '0'): the end of the answer before and a raw score as its explanation.
    script = tmp_path / "shifting.py"
    script.write_text(SHIFTING_AUDIT_ENGINE)

    async def main():
        async with AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"],
                                            audit_mode=True,
                                            vw_command=[sys.executable, str(script)]) as auditor:
            assert await auditor.explain_vw_line("|f first") == (0.0, "f^first:1:1:0")
            with pytest.raises(VowpalWabbitProtocolError, match="where a prediction was expected"):
                await auditor.explain_vw_line("|f garbage")
            with pytest.raises(VowpalWabbitError, match="failed earlier"):
                await auditor.explain_vw_line("|f next")

    run(main())


def test_a_save_that_cannot_be_written_raises_before_the_engine_is_asked(tmp_path):
    async def main():
        async with AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"]) as model:
            before = await model.predict("", ["|a x"])
            pid = model.pid
            with pytest.raises(OSError):
                await model.save("/proc/m.vw")
            assert model.pid == pid and await model.predict("", ["|a x"]) == before
            await model.save(str(tmp_path / "m.vw"))
        return (tmp_path / "m.vw").stat().st_size

    assert run(main()) > 0


def test_returns_by_deadline_and_the_next_call_is_exact(trained_model, tmp_path):
    formatter = DictFormatter()
    common = {"user": 1}
    many = items(100000)
    expected_small = expected_for(formatter, trained_model, tmp_path, common, items(40, 3))

    async def main():
        async with AsyncVowpalWabbitProcess(formatter, scoring_args(trained_model)) as model:
            began = time.perf_counter()
            metrics = {}
            first = await model.predict(common, many, timeout=0.010, metrics=metrics)
            elapsed = time.perf_counter() - began
            second = await model.predict(common, items(40, 3))
            return first, elapsed, second, metrics

    first, elapsed, second, metrics = run(main())
    assert elapsed < 0.010 + 0.040  # generous: a shared 2-core machine
    assert 0 < len(first) < len(many) and metrics["num_lines"] == len(first)
    assert first == expected_for(formatter, trained_model, tmp_path, common, many[:len(first)])
    assert second == expected_small


def test_many_tasks_are_served_in_arrival_order_each_with_its_own_predictions(trained_model,
                                                                               tmp_path):
    formatter = DictFormatter()
    requests = [({"user": index % 9, "ctx": [f"k{index % 4}"]}, items(20 + 37 * index, index))
                for index in range(12)]
    expected = [expected_for(formatter, trained_model, tmp_path, common, its)
                for common, its in requests]
    finished = []

    async def one(model, index):
        common, its = requests[index]
        got = await model.predict(common, its)
        finished.append(index)
        return got

    async def main():
        async with AsyncVowpalWabbitProcess(formatter, scoring_args(trained_model)) as model:
            return await asyncio.gather(*(one(model, index) for index in range(len(requests))))

    results = run(main())
    assert results == expected
    assert finished == sorted(finished)


def test_a_task_whose_deadline_passes_while_waiting_gets_nothing(trained_model):
    formatter = DictFormatter()

    async def main():
        async with AsyncVowpalWabbitProcess(formatter, scoring_args(trained_model)) as model:
            long_call = asyncio.ensure_future(model.predict({"user": 1}, items(200000)))
            await asyncio.sleep(0.01)
            metrics = {}
            began = time.perf_counter()
            short = await model.predict({"user": 2}, items(5), timeout=0.02, metrics=metrics)
            elapsed = time.perf_counter() - began
            everything = await long_call
            return short, elapsed, metrics, len(everything)

    short, elapsed, metrics, long_count = run(main())
    assert short == [] and metrics["num_lines"] == 0
    assert metrics["waited_for_other_call"] == 1 and metrics["lock_wait_time"] >= 0.02
    assert elapsed < 0.02 + 0.05
    assert long_count == 200000


@pytest.mark.parametrize("how", ["wait_for", "cancel"])
def test_a_cancelled_call_leaves_the_object_exact(trained_model, tmp_path, how):
    formatter = DictFormatter()
    common = {"user": 6}
    expected = expected_for(formatter, trained_model, tmp_path, common, items(300, 9))

    async def main():
        async with AsyncVowpalWabbitProcess(formatter, scoring_args(trained_model)) as model:
            for round_index in range(5):
                call = model.predict(common, items(100000))
                if how == "wait_for":
                    with pytest.raises(asyncio.TimeoutError):
                        await asyncio.wait_for(call, 0.003 * (round_index + 1))
                else:
                    task = asyncio.ensure_future(call)
                    await asyncio.sleep(0.003 * (round_index + 1))
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                assert await model.predict(common, items(300, 9)) == expected

    run(main())


def test_the_loop_keeps_running_during_a_long_call(trained_model):
    """A call never holds the event loop: a ticker task keeps ticking."""
    formatter = DictFormatter()

    async def main():
        async with AsyncVowpalWabbitProcess(formatter, scoring_args(trained_model)) as model:
            ticks = []
            stop = asyncio.Event()

            async def ticker():
                while not stop.is_set():
                    ticks.append(time.perf_counter())
                    await asyncio.sleep(0)

            task = asyncio.ensure_future(ticker())
            await asyncio.sleep(0)
            began = time.perf_counter()
            got = await model.predict({"user": 1}, items(30000))
            elapsed = time.perf_counter() - began
            stop.set()
            await task
            return len(got), elapsed, [t for t in ticks if began <= t <= began + elapsed]

    count, elapsed, ticks = run(main())
    assert count == 30000
    # one turn at least every half millisecond of work; generous for a shared machine
    assert len(ticks) >= elapsed / 0.005, (len(ticks), elapsed)


# a 5 s budget on purpose: the call must still be running when the engine dies
def test_engine_killed_mid_call_raises_and_restart_recovers(trained_model, tmp_path):
    formatter = DictFormatter()
    common = {"user": 3}
    expected = expected_for(formatter, trained_model, tmp_path, common, items(500))

    async def main():
        async with AsyncVowpalWabbitProcess(formatter, scoring_args(trained_model)) as model:
            first_pid = model.pid
            call = asyncio.ensure_future(model.predict(common, items(500000), timeout=5.0))
            await asyncio.sleep(0.02)
            os.kill(first_pid, signal.SIGKILL)
            with pytest.raises(VowpalWabbitEngineExitedError) as caught:
                await call
            assert caught.value.returncode == -signal.SIGKILL
            with pytest.raises(VowpalWabbitError, match="failed earlier"):
                await model.predict(common, items(3))
            await model.restart()
            assert model.pid != first_pid and model.restart_count == 1
            return await model.predict(common, items(500))

    assert run(main()) == expected


def test_restart_on_crash_never_holds_a_call_past_its_deadline(trained_model, tmp_path):
    formatter = DictFormatter()
    common = {"user": 8}
    expected = expected_for(formatter, trained_model, tmp_path, common, items(200))

    async def main():
        async with AsyncVowpalWabbitProcess(formatter, scoring_args(trained_model),
                                            restart_on_crash=True) as model:
            first_pid = model.pid
            os.kill(first_pid, signal.SIGKILL)
            await asyncio.sleep(0.05)
            with pytest.raises(VowpalWabbitEngineExitedError):
                await model.predict(common, items(200), timeout=1.0)
            lateness, empty_with_restart = [], 0
            for _ in range(200):
                metrics = {}
                began = time.perf_counter()
                got = await model.predict(common, items(200), timeout=0.010, metrics=metrics)
                lateness.append(time.perf_counter() - began - 0.010)
                if got == [] and metrics["restarts"] == 1:
                    empty_with_restart += 1
                if got:
                    assert got == expected[:len(got)]
                    break
            final = await model.predict(common, items(200))
            return lateness, empty_with_restart, final, model.pid != first_pid, model.restart_count

    lateness, empty_with_restart, final, new_pid, restarts = run(main())
    assert empty_with_restart >= 1  # the wheel engine takes ~100 ms to start
    assert max(lateness) < 0.030, lateness
    assert final == expected and new_pid and restarts == 1


def test_startup_failures_raise_with_the_engines_words():
    async def main(args, command=None):
        async with AsyncVowpalWabbitProcess(DictFormatter(), args, vw_command=command):
            pass

    with pytest.raises(VowpalWabbitStartupError, match="no_such_option"):
        run(main(["--no_such_option", "--quiet"]))
    with pytest.raises(VowpalWabbitStartupError, match="cannot run"):
        run(main(["--quiet"], "/nonexistent/vw"))


SILENT_ENGINE = "import sys, time\nsys.stdin.readline()\ntime.sleep(60)\n"


def test_a_silent_engine_fails_start_up_close_to_the_timeout(tmp_path):
    script = tmp_path / "silent.py"
    script.write_text(SILENT_ENGINE)
    before = children_of_this_process()

    async def main():
        model = AsyncVowpalWabbitProcess(DictFormatter(), [], startup_timeout_s=0.5,
                                         vw_command=[sys.executable, str(script)])
        began = time.perf_counter()
        with pytest.raises(VowpalWabbitStartupError, match="did not answer a probe"):
            await model.start()
        return time.perf_counter() - began

    assert 0.5 <= run(main()) < 0.5 + 0.2
    assert children_of_this_process() == before


def test_close_of_a_stubborn_engine_keeps_the_loop_running(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN_ENGINE)

    async def main():
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), [],
                                         vw_command=[sys.executable, str(script)])
        await model.start()
        assert await model.predict("|a", ["|b x"] * 3) == [0.0, 0.0, 0.0]
        pid = model.pid
        ticks = []

        async def ticker():
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.01)

        task = asyncio.ensure_future(ticker())
        began = time.perf_counter()
        await model.close(timeout=1.0)
        elapsed = time.perf_counter() - began
        task.cancel()
        return pid, elapsed, len(ticks)

    pid, elapsed, ticks = run(main())
    assert elapsed < 1.0 + 0.1
    assert ticks >= 20  # the loop ran throughout
    assert pid not in children_of_this_process()


def test_a_start_cancelled_while_spawning_leaves_no_engine_behind():
    before = children_of_this_process()

    async def main():
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"])
        task = asyncio.ensure_future(model.start())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.5)  # the spawn finishes on its thread and is aborted
        await model.close()

    run(main())
    deadline = time.monotonic() + 5
    while children_of_this_process() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children_of_this_process() == before


def test_metrics_detailed_metrics_and_the_hook(trained_model):
    hooked = []

    async def main():
        async with AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(trained_model),
                                            metrics_hook=hooked.append) as model:
            metrics, detailed = {}, {}
            got = await model.predict({"user": 1}, items(500), metrics=metrics,
                                      detailed_metrics=detailed)
            return got, metrics, detailed

    got, metrics, detailed = run(main())
    assert metrics["num_lines"] == len(got) == 500
    assert set(metrics) >= {"prepare_time", "total_time", "lock_wait_time", "restarts",
                            "cleanup_time", "before_cleanup_pending_lines",
                            "after_cleanup_pending_lines", "waited_for_other_call"}
    assert sum(value for _, value in detailed["receiving_bytes"]) > 500
    assert detailed["generating_lines_time"] and detailed["pending_lines"]
    assert hooked[-1]["method"] == "predict" and hooked[-1]["num_lines"] == 500


@pytest.mark.parametrize("io_timeout_s", [None, 3.0])
def test_close_during_another_tasks_call_leaves_later_calls_no_turn_to_wait_for(io_timeout_s):
    async def main():
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"],
                                         io_timeout_s=io_timeout_s)
        await model.start()
        long_call = asyncio.ensure_future(
            model.predict("|c k", [f"|i f{n % 50}" for n in range(200_000)]))
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(model.close())  # waits for the turn, then closes
        await asyncio.sleep(0.01)
        queued = asyncio.ensure_future(model.predict("|c k", ["|i f1"]))  # behind close()
        await closing
        await long_call
        began = time.perf_counter()
        for call in (queued, model.predict("|c k", ["|i f1"])):
            with pytest.raises(VowpalWabbitError, match="is closed"):
                await asyncio.wait_for(call, timeout=5)
        return time.perf_counter() - began

    assert run(main()) < 1.0  # at once, not after io_timeout_s (or never)


@pytest.mark.parametrize("delay", [0.0, 0.005, 0.02])
def test_a_cancelled_save_leaves_no_file_and_a_working_engine(tmp_path, delay):
    # Cancelled once its command reached the engine, a save used to remove
    # the engine's file under it (vw then aborts) or leave a file written later.
    async def main():
        async with AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                                            ["--quiet", "-b", "24"]) as model:
            await model.train("|c k", [f"|i f{n} g{n}" for n in range(2000)], [1] * 2000)
            saving = asyncio.ensure_future(model.save(str(tmp_path / "model.vw")))
            await asyncio.sleep(delay)
            saving.cancel()
            try:
                await saving
            except asyncio.CancelledError:
                pass
            for _ in range(300):  # the engine may still be saving: give it 3 s
                if not os.listdir(tmp_path):
                    break
                await asyncio.sleep(0.01)
            left = sorted(os.listdir(tmp_path))
            if saving.cancelled():
                assert left == []
            else:  # it finished before the cancel
                assert left == ["model.vw"]
            return await model.predict("|c k", ["|i f1"])

    assert run(main()) == [1.0]


def test_a_cancelled_save_is_cleaned_up_after_the_loop_ends(tmp_path):
    # The object is never closed and the loop ends right after the cancel:
    # the clean-up must not die with the loop.
    async def main():
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-b", "24"])
        await model.start()
        await model.train("|c k", [f"|i f{n} g{n}" for n in range(2000)], [1] * 2000)
        saving = asyncio.ensure_future(model.save(str(tmp_path / "model.vw")))
        await asyncio.sleep(0.005)
        saving.cancel()
        try:
            await saving
        except asyncio.CancelledError:
            pass
        return saving.cancelled()

    cancelled = run(main())
    until = time.perf_counter() + 5
    while os.listdir(tmp_path) and time.perf_counter() < until:
        time.sleep(0.02)
    assert sorted(os.listdir(tmp_path)) == ([] if cancelled else ["model.vw"])


def test_calls_on_a_model_slow_per_line_return_what_fits_in_their_deadline(tmp_path):
    """As the nonblocking class: at a few ms a line, a 100 ms call keeps in
    flight only what the engine answers by its deadline, so that every call
    after the first few returns some predictions (most returned none)."""
    args = wide_model(tmp_path, 60)

    async def main():
        async with AsyncVowpalWabbitProcess(WideItems(60), args) as model:
            truth = {user: await model.predict(common(user), items(200)) for user in range(3)}
            assert len(set(truth[0][:50])) > 10
            lengths = []
            for call in range(16):
                got = await model.predict(common(call % 3), items(3000), timeout=0.100)
                assert got == truth[call % 3][:len(got)]
                assert len(got) < 200  # the deadline ended the call
                lengths.append(len(got))
            return lengths

    lengths = run(main())
    # (a few calls that the machine's load left without a line, the engine
    # slower than in the call before, are not what this tests: before, all
    # but the first returned nothing)
    assert sum(1 for length in lengths[6:] if length == 0) <= 4, lengths


@pytest.mark.parametrize("final_model", [True, False])
def test_a_close_that_terminates_an_engine_writing_its_final_model_raises(final_model, tmp_path):
    """As the single processes' close: an engine started with -f that close()
    had to terminate has not written its model, and close() said nothing
    (a stopped engine never exits by itself: the close has to kill it)."""
    path = tmp_path / "final.vw"
    args = ["--quiet", "-f", str(path)] if final_model else ["--quiet"]

    async def main():
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), args)
        await model.start()
        await model.train("", ["|f a", "|f b"], [1, -1])
        os.kill(model.pid, signal.SIGSTOP)
        if final_model:
            with pytest.raises(VowpalWabbitTimeoutError, match="-f model was not written"):
                await model.close(timeout=1.0)
        else:
            await model.close(timeout=1.0)
        await model.close()  # closing twice is harmless, and raises nothing more

    run(main())
    assert not path.exists()


def test_calls_from_event_loops_in_two_threads_take_turns_without_waiting_for_a_timeout(
        trained_model, tmp_path):
    """A call that waits for another thread's call (on another event loop)
    gets the object as soon as that call ends: before, the other thread
    granted it the turn without waking its loop, which slept until the
    waiting call's own deadline (it returned ``[]``) or ``io_timeout_s``."""
    formatter = DictFormatter()
    requests = {index: ({"user": index, "ctx": [f"k{index % 4}"]}, items(3000, index))
                for index in range(2)}
    expected = {index: expected_for(formatter, trained_model, tmp_path, *requests[index])
                for index in requests}
    model = AsyncVowpalWabbitProcess(formatter, scoring_args(trained_model), io_timeout_s=60.0)
    results = {index: [] for index in requests}
    errors = []

    def worker(index):
        async def calls():
            for _ in range(10):
                results[index].append(await model.predict(*requests[index], timeout=8.0))
        try:
            asyncio.run(calls())
        except BaseException as exc:  # pylint: disable=broad-except
            errors.append(exc)

    run(model.start())
    try:
        threads = [threading.Thread(target=worker, args=(index,)) for index in requests]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
    finally:
        run(model.close())
    assert errors == []
    for index in requests:
        assert results[index] == [expected[index]] * 10

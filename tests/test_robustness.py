"""A dead, stuck, misused or shared engine: every failure is fast, loud and exact.

Every test drives a real engine (or a small Python child that plays a stubborn
one) through both process classes.
"""

import asyncio
import gc
import inspect
import logging
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

from subwabbit import (AsyncVowpalWabbitProcess, VowpalWabbitBusyError,
                       VowpalWabbitDummyFormatter, VowpalWabbitEngineExitedError,
                       VowpalWabbitError, VowpalWabbitNonBlockingProcess, VowpalWabbitPool,
                       VowpalWabbitProcess, VowpalWabbitProtocolError, VowpalWabbitStartupError,
                       VowpalWabbitTimeoutError)

from conftest import (ALL_KINDS, STUBBORN_ENGINE, Client, CyclesLeft, DictFormatter, WideItems,
                       children_of_this_process, common, expected_for, expected_scalars,
                       format_lines, open_fds, pipe_on_freed_numbers, proc_stat, scoring_args,
                       slow_starting_engine, wait_until, wide_model)
from conftest import items as _items  # its tests name their lists of items "items"

CLASSES = [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess]
CLASS_IDS = ["blocking", "nonblocking"]


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_calls_leave_no_reference_cycles(cls, trained_model, truth):
    """What a call allocates is freed when it returns, whether it ends at its
    deadline, is read to the end or is abandoned half-read (the pools have
    the same test)."""
    with cls(DictFormatter(), scoring_args(trained_model)) as model:
        list(model.predict(common(0), _items(3000), timeout=0.005))
        with CyclesLeft() as cycles:
            for user in range(3):
                got = list(model.predict(common(user), _items(3000) * 5, timeout=0.005))
                assert got == (truth[trained_model][user] * 5)[:len(got)]
                got = list(model.predict(common(user), _items(3000)))
                assert got == truth[trained_model][user]
                half_read = iter(model.predict(common(user), _items(500)))
                assert next(half_read) == truth[trained_model][user][0]
                del half_read
    assert cycles.names == []


def _resume(process_id):
    try:
        os.kill(process_id, signal.SIGCONT)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------ crashes

@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_sigkill_mid_call_raises_with_details_and_restart_recovers(cls, trained_model, tmp_path):
    formatter = DictFormatter()
    common = {"user": 3}
    items = _items(5000)
    expected = expected_for(formatter, trained_model, tmp_path, common, items)
    with cls(formatter, scoring_args(trained_model)) as model:
        engine_pid = model.pid
        got = []
        iterator = model.predict(common, items, timeout=None if cls is VowpalWabbitProcess else 5.0)
        got.append(next(iterator))
        os.kill(engine_pid, signal.SIGKILL)
        killed_at = time.perf_counter()
        with pytest.raises(VowpalWabbitEngineExitedError) as caught:
            for prediction in iterator:
                got.append(prediction)
        assert time.perf_counter() - killed_at < 1.0
        error = caught.value
        assert error.returncode == -signal.SIGKILL
        assert error.argv == model.argv
        assert "killed by SIGKILL" in str(error)
        # what was returned before the crash is exact
        assert got == pytest.approx(expected[:len(got)], abs=1e-6)
        assert len(got) < len(items)
        # the object refuses to guess until it is restarted
        with pytest.raises(VowpalWabbitError, match="failed earlier"):
            list(model.predict(common, items[:3]))
        model.restart()
        assert model.pid != engine_pid and model.restart_count == 1
        assert list(model.predict(common, items)) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_input_that_would_make_the_engine_exit_is_refused_before_sending(cls):
    # A non-numeric label under --oaa ended the engine (exit code 1); it is
    # refused now, and the engine serves on.
    with cls(VowpalWabbitDummyFormatter(), ["--oaa", "3", "--quiet"]) as model:
        assert list(model.predict("1", ["|f a", "|f b"])) == [1.0, 1.0]
        with pytest.raises(ValueError, match="'abc' is not a class label"):
            list(model.predict("abc", ["|f a"] * 10, timeout=None))
        assert list(model.predict("1", ["|f a", "|f b"])) == [1.0, 1.0]


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_an_engine_that_exits_is_reported_with_its_stderr(cls):
    # What the engine said before it died comes with the error: here its
    # warning about a label outside the logistic loss's range.
    with cls(VowpalWabbitDummyFormatter(), ["--loss_function", "logistic"]) as model:
        model.train("|f", ["a"], labels=[2], weights=[None])
        list(model.predict("|u", ["|f a"]))  # the training line was read
        until = time.monotonic() + 10
        engine = model._engine  # pylint: disable=protected-access
        while "not in the range" not in engine.stderr_tail() and time.monotonic() < until:
            time.sleep(0.02)
        os.kill(model.pid, signal.SIGKILL)
        with pytest.raises(VowpalWabbitEngineExitedError) as caught:
            list(model.predict("|u", ["|f a"] * 10, timeout=None))
        assert caught.value.returncode == -signal.SIGKILL
        assert "The label 2 is not in the range [-1,1]" in caught.value.stderr_tail
        assert caught.value.argv == model.argv
        with pytest.raises(VowpalWabbitError, match="failed earlier"):
            model.train("|f", ["a"], labels=[1], weights=[None])


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_restart_on_crash_restarts_once_counts_and_logs(cls, trained_model, tmp_path, caplog):
    formatter = DictFormatter()
    common = {"user": 5, "ctx": ["k1"]}
    items = _items(300)
    expected = expected_for(formatter, trained_model, tmp_path, common, items)
    hooked = []
    with cls(formatter, scoring_args(trained_model), restart_on_crash=True,
             metrics_hook=hooked.append) as model:
        first_pid = model.pid
        metrics = {}
        assert list(model.predict(common, items, metrics=metrics)) == pytest.approx(expected)
        assert metrics["restarts"] == 0
        os.kill(first_pid, signal.SIGKILL)
        # the crash surfaces in the call that meets it ...
        with pytest.raises(VowpalWabbitEngineExitedError):
            list(model.predict(common, items))
        # ... and the next call restarts the engine before serving
        with caplog.at_level(logging.WARNING, logger="subwabbit"):
            assert list(model.predict(common, items, metrics=metrics)) == pytest.approx(expected)
        assert metrics["restarts"] == 1
        assert model.restart_count == 1 and model.pid != first_pid
        assert any("restarted the vw engine" in record.getMessage() for record in caplog.records)
        assert hooked[-1]["restarts"] == 1
        # a healthy process does not restart again
        assert list(model.predict(common, items, metrics=metrics)) == pytest.approx(expected)
        assert metrics["restarts"] == 0 and model.restart_count == 1


#: A vw stand-in that answers its start-up probes with 0, and every other
#: example with 0.25 and a tag of as many megabytes as its argument says
#: (vw prints an example's tag after its prediction, on the same line);
#: with an argument such as ``1:garbage``, with ``garbage`` instead of 0.25.
LONG_LINE_ENGINE = textwrap.dedent("""
    import sys
    answered = 0
    megabytes, _, answer = sys.argv[1].partition(":")
    tag = b"t" * (int(megabytes) << 20)
    answer = answer.encode() or b"0.25"
    for line in sys.stdin.buffer:
        if line == b"\\n":
            continue  # vw answers nothing to an empty line
        answered += 1
        sys.stdout.buffer.write(b"0\\n" if answered <= 2 else answer + b" " + tag + b"\\n")
        sys.stdout.buffer.flush()
""")


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_a_long_answer_line_is_read_in_time_linear_in_its_length(cls, tmp_path):
    """An answer line of 48 MB (a long tag) is read within a deadline of
    15 s: the start of a line still without its newline was joined again at
    every read, so that reading a line of N bytes cost O(N**2) (40 MB took
    85 s)."""
    script = tmp_path / "long_lines.py"
    script.write_text(LONG_LINE_ENGINE)
    # (the blocking class, told to return at most 0.5 s after its deadline)
    bounded = {"max_lateness_s": 0.5} if cls is VowpalWabbitProcess else {}
    with cls(VowpalWabbitDummyFormatter(), [], vw_command=[sys.executable, str(script), "48"],
             **bounded) as model:
        assert list(model.predict("|a", ["|b x"], timeout=15.0)) == [0.25]
        assert list(model.predict("|a", ["|b y", "|b z"], timeout=15.0)) == [0.25, 0.25]


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_a_long_example_line_is_written_in_time_linear_in_its_length(cls, tmp_path):
    """An item of 160 MB is written and answered within a deadline of 15 s
    (about 2 s here): the channel searched all that it had written of a line
    still without its newline at every write, so that writing a line of N
    bytes cost O(N**2) (128 MB took about 20 s; found by a review)."""
    script = tmp_path / "long_lines.py"
    script.write_text(LONG_LINE_ENGINE)
    bounded = {"max_lateness_s": 0.5} if cls is VowpalWabbitProcess else {}
    with cls(VowpalWabbitDummyFormatter(), [], vw_command=[sys.executable, str(script), "0"],
             **bounded) as model:
        item = "|b " + "x" * (160 << 20)
        assert list(model.predict("|a", [item], timeout=15.0)) == [0.25]
        del item
        assert list(model.predict("|a", ["|b y", "|b z"], timeout=15.0)) == [0.25, 0.25]


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_a_long_line_that_is_no_prediction_is_named_by_its_start(cls, tmp_path):
    """The error of an answer line that is no prediction quotes its first
    200 bytes, as the other such errors do: it quoted the whole line (here
    a megabyte, in the message and in every log of it)."""
    script = tmp_path / "long_lines.py"
    script.write_text(LONG_LINE_ENGINE)
    with cls(VowpalWabbitDummyFormatter(), [],
             vw_command=[sys.executable, str(script), "1:garbage"]) as model:
        with pytest.raises(VowpalWabbitProtocolError) as caught:
            list(model.predict("|a", ["|b x"], timeout=15.0))
    assert "b'garbage tttt" in caught.value.message
    assert len(caught.value.message) < 400


#: A vw stand-in that answers its start-up probes with 0, and every other
#: example with 0.25 after a warning of as many megabytes as its argument
#: says on stderr; it exits when it reads "exit".
LONG_WARNING_ENGINE = textwrap.dedent("""
    import sys
    answered = 0
    warning = b"[warning] " + b"w" * (int(sys.argv[1]) << 20) + b"\\n"
    for line in sys.stdin.buffer:
        if line == b"\\n":
            continue  # vw answers nothing to an empty line
        if b"exit" in line:
            sys.exit(3)
        answered += 1
        if answered > 2:
            sys.stderr.buffer.write(warning)
            sys.stderr.buffer.flush()
        sys.stdout.buffer.write(b"0\\n" if answered <= 2 else b"0.25\\n")
        sys.stdout.buffer.flush()
""")


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_a_long_stderr_line_neither_stalls_the_engine_nor_floods_logs_and_errors(
        cls, tmp_path, caplog):
    """An engine that prints a warning of 48 MB on stderr is drained in time
    for a call with a deadline of 15 s, and the warning's first 4 KB go into
    the log (once) and into the error of its exit: the reader split all that
    a line had printed so far at every read (a line of N bytes cost O(N**2):
    the engine waited for its stderr pipe), and logged and kept the whole
    line."""
    script = tmp_path / "long_warnings.py"
    script.write_text(LONG_WARNING_ENGINE)
    bounded = {"max_lateness_s": 0.5} if cls is VowpalWabbitProcess else {}
    caplog.set_level(logging.INFO, logger="subwabbit.engine")
    with cls(VowpalWabbitDummyFormatter(), [], vw_command=[sys.executable, str(script), "48"],
             **bounded) as model:
        assert list(model.predict("|a", ["|b x"], timeout=15.0)) == [0.25]
        engine_pid = model.pid
        with pytest.raises(VowpalWabbitEngineExitedError) as caught:
            list(model.predict("|a", ["|b exit"], timeout=15.0))
    assert caught.value.returncode == 3
    assert caught.value.stderr_tail == "[warning] " + "w" * (4096 - 10) + (
        f" [... {(48 << 20) + 10 - 4096} more bytes]")
    logged = [record.getMessage() for record in caplog.records
              if record.name == "subwabbit.engine" and "[warning]" in record.getMessage()]
    assert logged == [f"vw[{engine_pid}]: {caught.value.stderr_tail}"]


def test_write_only_engine_crash_is_reported_by_the_next_write(tmp_path):
    model = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"], write_only=True)
    try:
        os.kill(model.pid, signal.SIGKILL)
        time.sleep(0.2)
        with pytest.raises(VowpalWabbitEngineExitedError) as caught:
            model.train("|f a", ["|g b"] * 20000, labels=[1] * 20000, weights=[None] * 20000)
        assert caught.value.returncode == -signal.SIGKILL
        model.restart()
        model.train("|f a", ["|g b"], labels=[1], weights=[None])
        model.save(str(tmp_path / "m.vw"))
        assert (tmp_path / "m.vw").stat().st_size > 0
    finally:
        model.close()


@pytest.mark.parametrize("cls", CLASSES + [AsyncVowpalWabbitProcess],
                         ids=CLASS_IDS + ["asyncio"])
def test_a_saved_model_is_logged_at_info_on_the_engine_logger(cls, tmp_path, caplog):
    # The monitoring page lists the models an engine saved among its life on
    # 'subwabbit.engine' at INFO. The blocking and nonblocking classes logged
    # them on 'subwabbit', and the asyncio class not at all.
    path = str(tmp_path / "m.vw")
    with caplog.at_level(logging.INFO, logger="subwabbit"):
        if cls is AsyncVowpalWabbitProcess:
            async def save():
                async with cls(VowpalWabbitDummyFormatter(), ["--quiet"]) as model:
                    await model.save(path)
                    return model.pid
            pid = asyncio.run(save())
        else:
            with cls(VowpalWabbitDummyFormatter(), ["--quiet"]) as model:
                model.save(path)
                pid = model.pid
    saves = [record for record in caplog.records if "saved its model" in record.getMessage()]
    assert [(record.name, record.levelname, record.getMessage()) for record in saves] == [
        ("subwabbit.engine", "INFO", f"vw[{pid}] saved its model to {path}")]


# ------------------------------------------------------------------- stalls

def test_blocking_io_timeout_raises_instead_of_waiting_forever(trained_model, tmp_path):
    formatter = DictFormatter()
    common = {"user": 1}
    items = _items(200)
    expected = expected_for(formatter, trained_model, tmp_path, common, items)
    with VowpalWabbitProcess(formatter, scoring_args(trained_model), io_timeout_s=0.5) as model:
        stopped = model.pid
        os.kill(stopped, signal.SIGSTOP)
        try:
            began = time.perf_counter()
            with pytest.raises(VowpalWabbitTimeoutError, match="did not answer for 0.5 s"):
                list(model.predict(common, items))
            elapsed = time.perf_counter() - began
            assert 0.5 <= elapsed < 0.5 + 0.5
            with pytest.raises(VowpalWabbitError, match="failed earlier"):
                list(model.predict(common, items))
            began = time.perf_counter()
            model.restart()
            assert time.perf_counter() - began < 2.0
        finally:
            _resume(stopped)
        assert list(model.predict(common, items)) == pytest.approx(expected)
    assert stopped not in children_of_this_process()


@pytest.mark.parametrize("cls", CLASSES)
def test_a_caller_slower_than_io_timeout_between_predictions_is_not_an_engine_stall(
        cls, trained_model, tmp_path):
    """The time a caller keeps a predict() iterator between two items is its
    own, not the engine's silence: a pause longer than ``io_timeout_s``
    raised VowpalWabbitTimeoutError ("the vw engine did not answer for 0.5 s")
    and left a healthy engine refused as failed."""
    formatter = DictFormatter()
    common = {"user": 1}
    items = _items(300)
    expected = expected_for(formatter, trained_model, tmp_path, common, items)
    with cls(formatter, scoring_args(trained_model), batch_size=10, io_timeout_s=0.5) as model:
        predictions = model.predict(common, items)
        got = [next(predictions)]
        time.sleep(1.0)  # the caller works on the first prediction
        got += list(predictions)
        assert got == pytest.approx(expected)
        assert list(model.predict(common, items)) == pytest.approx(expected)


def test_blocking_write_timeout_on_a_stopped_write_only_engine():
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"], write_only=True,
                             io_timeout_s=0.5) as model:
        os.kill(model.pid, signal.SIGSTOP)
        try:
            began = time.perf_counter()
            count = 50000  # far more than a pipe holds
            with pytest.raises(VowpalWabbitTimeoutError, match="writing"):
                model.train("|f a b c", ["|g d e f"] * count, labels=[1] * count,
                            weights=[None] * count)
            assert time.perf_counter() - began < 0.5 + 1.0
        finally:
            _resume(model.pid)


def test_io_timeout_none_keeps_waiting_like_2x(trained_model):
    formatter = DictFormatter()
    with VowpalWabbitProcess(formatter, scoring_args(trained_model), io_timeout_s=None) as model:
        os.kill(model.pid, signal.SIGSTOP)
        threading.Timer(1.0, os.kill, (model.pid, signal.SIGCONT)).start()
        began = time.perf_counter()
        assert len(list(model.predict({"user": 1}, _items(100)))) == 100
        assert time.perf_counter() - began >= 0.9


def test_nonblocking_stalled_engine_never_makes_calls_late(trained_model, tmp_path):
    formatter = DictFormatter()
    common = {"user": 2}
    items = _items(1000)
    expected = expected_for(formatter, trained_model, tmp_path, common, items)
    with VowpalWabbitNonBlockingProcess(formatter, scoring_args(trained_model)) as model:
        assert list(model.predict(common, items)) == pytest.approx(expected)
        os.kill(model.pid, signal.SIGSTOP)
        late = []
        try:
            for _ in range(30):
                began = time.perf_counter()
                got = list(model.predict(common, items, timeout=0.010))
                late.append(time.perf_counter() - began - 0.010)
                assert got == pytest.approx(expected[:len(got)])
        finally:
            os.kill(model.pid, signal.SIGCONT)
        # generous: the worst lateness measured here is well under a millisecond
        assert max(late) < 0.020, late
        # after the stall, leftovers are cleared and answers are exact again
        assert list(model.predict(common, items)) == pytest.approx(expected)


def test_nonblocking_without_deadline_uses_io_timeout(trained_model):
    formatter = DictFormatter()
    with VowpalWabbitNonBlockingProcess(formatter, scoring_args(trained_model),
                                        io_timeout_s=0.5, restart_on_crash=True) as model:
        stopped = model.pid
        os.kill(stopped, signal.SIGSTOP)
        try:
            began = time.perf_counter()
            with pytest.raises(VowpalWabbitTimeoutError):
                list(model.predict({"user": 1}, _items(500), timeout=None))
            assert time.perf_counter() - began < 0.5 + 0.5
        finally:
            _resume(stopped)
        metrics = {}
        assert len(list(model.predict({"user": 1}, _items(500), metrics=metrics))) == 500
        assert metrics["restarts"] == 1


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_close_of_a_stopped_engine_returns_within_its_timeout(cls, trained_model):
    model = cls(DictFormatter(), scoring_args(trained_model))
    engine_pid = model.pid
    os.kill(engine_pid, signal.SIGSTOP)
    began = time.perf_counter()
    model.close(timeout=1.0)
    assert time.perf_counter() - began < 1.0 + 0.1
    assert engine_pid not in children_of_this_process()


def _close_with(client, timeout):
    """``client.close(timeout)`` (a :class:`Client`), on its loop for an asyncio one."""
    if client.loop is not None:
        try:
            client.loop.run_until_complete(client.model.close(timeout))
        finally:
            client.loop.close()
    else:
        client.model.close(timeout)


@pytest.mark.parametrize("kind,kwargs", [
    ("blocking", {}), ("blocking", {"write_only": True}), ("nonblocking", {}),
    ("asyncio", {}), ("pool", {"size": 2}), ("asyncio-pool", {"size": 2})],
    ids=["blocking", "write_only", "nonblocking", "asyncio", "pool", "asyncio-pool"])
@pytest.mark.parametrize("owing", [False, True], ids=["idle", "owing"])
def test_close_kills_a_stopped_engine_after_a_short_grace(kind, kwargs, owing, trained_model):
    """A stopped engine never reads the end of its input: close(timeout=5)
    waited for it until SIGTERM and SIGKILL, 4.8 s, whichever the class
    (but the asyncio pool). An engine that stays stopped is killed after
    STOPPED_GRACE_S."""
    client = Client(kind, DictFormatter(), scoring_args(trained_model), io_timeout_s=0.5,
                    **kwargs)
    pids = client.pids()
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        if owing and not kwargs.get("write_only"):
            try:  # the engines are left owing the answers of this call
                client.predict(common(1), _items(3000), timeout=0.010)
            except VowpalWabbitTimeoutError:
                assert kind == "blocking"  # (it waits for what it sent)
        began = time.perf_counter()
        _close_with(client, 5.0)
        took = time.perf_counter() - began
    finally:
        for pid in pids:
            _resume(pid)
    assert took < 2.0, took  # generous: 2 shared cores; the grace is 0.2 s
    for pid in pids:
        assert wait_until(lambda: proc_stat(pid) is None or proc_stat(pid)[0] == "Z", 5.0)


def test_close_of_a_stopped_engine_that_writes_a_model_says_it_was_not_written(tmp_path):
    model = VowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                                ["--quiet", "-f", str(tmp_path / "final.vw")], write_only=True)
    model.train("", ["|f a"], labels=[1.0])
    os.kill(model.pid, signal.SIGSTOP)
    began = time.perf_counter()
    try:
        with pytest.raises(VowpalWabbitTimeoutError, match="was stopped .* was killed"):
            model.close(5.0)
    finally:
        _resume(model.pid)
    assert time.perf_counter() - began < 2.0
    assert not (tmp_path / "final.vw").exists()


def test_close_kills_an_engine_that_ignores_eof_and_sigterm(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN_ENGINE)
    model = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), [],
                                vw_command=[sys.executable, str(script)])
    assert list(model.predict("|a", ["|b x"] * 3)) == [0.0, 0.0, 0.0]
    engine_pid = model.pid
    began = time.perf_counter()
    model.close(timeout=1.0)
    assert time.perf_counter() - began < 1.0 + 0.1
    assert engine_pid not in children_of_this_process()


# ------------------------------------------------------------------ start-up

@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
@pytest.mark.parametrize("vw_args, vw_command, message", [
    (["--quiet"], "/nonexistent/bin/vw", "cannot run the vw engine"),
    (["-i", "/nonexistent/model.vw", "--quiet"], None, "can't open: /nonexistent/model.vw"),
    (["--no_such_option", "--quiet"], None, "no_such_option"),
], ids=["missing-executable", "unreadable-model", "bad-argument"])
def test_startup_failures_raise_quickly_with_the_engines_words(cls, vw_args, vw_command, message):
    before = children_of_this_process()
    began = time.perf_counter()
    with pytest.raises(VowpalWabbitStartupError) as caught:
        cls(DictFormatter(), vw_args, vw_command=vw_command)
    assert time.perf_counter() - began < 2.0
    assert message in str(caught.value)
    assert children_of_this_process() == before


# ------------------------------------------------------------------- threads

@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_threads_sharing_a_process_each_get_their_own_predictions(cls, trained_model, tmp_path):
    formatter = DictFormatter()
    rng = random.Random(7)
    requests = []
    for index in range(48):
        common = {"user": index % 9, "ctx": [f"k{index % 4}"]}
        requests.append((common, _items(rng.randint(1, 400), rng.randint(0, 49))))
    all_lines = [line for common, items in requests for line in format_lines(formatter, common, items)]
    flat = expected_scalars(all_lines, scoring_args(trained_model), tmp_path)
    expected, position = [], 0
    for _, items in requests:
        expected.append(flat[position:position + len(items)])
        position += len(items)

    errors = []
    checked = []

    def worker(thread_index, model):
        local = random.Random(thread_index)
        try:
            for _ in range(12):
                request = local.randrange(len(requests))
                common, items = requests[request]
                timeout = local.choice([None, None, 0.005, 0.05])
                got = []
                abandoned = False
                for prediction in model.predict(common, items, timeout=timeout):
                    got.append(prediction)
                    if local.random() < 0.002:
                        abandoned = True  # must not shift anyone's predictions
                        break
                assert got == pytest.approx(expected[request][:len(got)], abs=1e-6)
                if timeout is None and not abandoned:
                    assert len(got) == len(items)
                checked.append(len(got))
        except BaseException as exc:  # pylint: disable=broad-except
            errors.append(exc)

    with cls(formatter, scoring_args(trained_model)) as model:
        threads = [threading.Thread(target=worker, args=(index, model)) for index in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads)
        assert not errors, errors
        assert len(checked) == 8 * 12 and sum(checked) > 0
        # the process is still exact afterwards
        common, items = requests[0]
        assert list(model.predict(common, items)) == pytest.approx(expected[0], abs=1e-6)


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_unfinished_iterator_in_another_thread_blocks_then_refuses(cls, trained_model):
    formatter = DictFormatter()
    with cls(formatter, scoring_args(trained_model), io_timeout_s=0.3) as model:
        held = model.predict({"user": 1}, _items(500))
        next(held)  # this thread now holds the process
        outcome = {}

        def other_thread():
            metrics = {}
            began = time.perf_counter()
            outcome["with_deadline"] = list(model.predict({"user": 2}, _items(5), timeout=0.05,
                                                          metrics=metrics))
            outcome["deadline_elapsed"] = time.perf_counter() - began
            outcome["lock_wait_time"] = metrics["lock_wait_time"]
            try:
                list(model.predict({"user": 2}, _items(5)))
            except VowpalWabbitBusyError as exc:
                outcome["busy"] = exc

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(timeout=10)
        assert outcome["with_deadline"] == []
        assert 0.05 <= outcome["lock_wait_time"] and outcome["deadline_elapsed"] < 0.05 + 0.05
        assert "serialised" in str(outcome["busy"])
        held.close()  # releases the process
        thread = threading.Thread(
            target=lambda: outcome.update(after=list(model.predict({"user": 2}, _items(5)))))
        thread.start()
        thread.join(timeout=10)
        assert len(outcome["after"]) == 5


# ------------------------------------------------------------------- hygiene

def test_open_close_cycles_leak_nothing(trained_model):
    for cls in CLASSES:  # warm up: imports, first-use caches
        cls(DictFormatter(), scoring_args(trained_model)).close()
    gc.collect()
    fds_before = open_fds()
    children_before = children_of_this_process()
    threads_before = threading.active_count()
    for cycle in range(200):
        kind = cycle % 4
        if kind == 3:
            model = VowpalWabbitProcess(DictFormatter(), ["--quiet"], write_only=True)
            model.train({"user": 1}, _items(3), labels=[1, -1, 1], weights=[None] * 3)
        else:
            model = CLASSES[kind % 2](DictFormatter(), scoring_args(trained_model))
            assert len(list(model.predict({"user": 1}, _items(3)))) == 3
        model.close()
    gc.collect()
    assert open_fds() == fds_before
    assert children_of_this_process() == children_before
    deadline = time.monotonic() + 5
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == threads_before


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_dropped_process_warns_is_reaped_and_del_never_blocks(cls, trained_model):
    fds_before = open_fds()
    # What the test session made before is set aside, so that the collection
    # below times the dropped object, not a traversal of every object alive.
    gc.collect()
    gc.freeze()
    try:
        model = cls(DictFormatter(), scoring_args(trained_model))
        engine_pid = model.pid
        os.kill(engine_pid, signal.SIGSTOP)  # an engine that cannot even exit
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            began = time.perf_counter()
            del model
            gc.collect()
            assert time.perf_counter() - began < 0.2
    finally:
        gc.unfreeze()
    assert any(issubclass(warning.category, ResourceWarning) for warning in caught)
    os.kill(engine_pid, signal.SIGCONT)  # now it sees EOF and exits; the reaper collects it
    deadline = time.monotonic() + 10
    while engine_pid in children_of_this_process() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine_pid not in children_of_this_process()
    deadline = time.monotonic() + 5
    while open_fds() > fds_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert open_fds() <= fds_before


@pytest.mark.parametrize("kind", ALL_KINDS + ["pool", "asyncio-pool"])
def test_a_dropped_client_stops_its_engines_when_resource_warnings_are_errors(
        kind, trained_model):
    # Under -W error::ResourceWarning (pytest's filterwarnings = error), the
    # warning that a client was not closed is an exception in __del__: raised
    # before the engines were let go, it left every dropped process client's
    # engine a zombie, and every dropped pool's fork server running, with its
    # threads and descriptors.
    client = Client(kind, DictFormatter(), scoring_args(trained_model),
                    **({"size": 2} if "pool" in kind else {}))
    client.predict(common(1), _items(20))
    pids = client.pids()
    if "pool" in kind:
        pids.append(client.model._groups[0].server.pid)  # pylint: disable=protected-access
    unraisable = []  # (the messages only: a traceback would keep the engine's pipes)
    hook = sys.unraisablehook
    sys.unraisablehook = lambda failure: unraisable.append(str(failure.exc_value))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            client.model = None
            gc.collect()
    finally:
        sys.unraisablehook = hook
        if client.loop is not None:
            client.loop.close()
    assert any("was not closed" in message for message in unraisable), unraisable
    assert wait_until(lambda: all(proc_stat(pid) is None for pid in pids)), \
        [(pid, proc_stat(pid)) for pid in pids if proc_stat(pid) is not None]


@pytest.mark.parametrize("kind", ALL_KINDS + ["write-only"])
def test_a_dropped_client_leaves_no_descriptor_to_the_garbage_collector(kind, trained_model):
    # A client dropped without close() warns that it was not closed, and its
    # engine's pipes are closed then: the engine's stderr (and a write-only
    # engine's stdout), which a reader thread shares, were closed by nobody
    # once that thread ended: only the collection of the objects holding
    # them did (much later, when a reference cycle holds them), warning
    # 'unclosed file <_io.FileIO ...>' each.
    write_only = kind == "write-only"
    args = ["--quiet"] if write_only else scoring_args(trained_model)
    client = Client("blocking" if write_only else kind, DictFormatter(), args,
                    **({"write_only": True} if write_only else {}))
    if write_only:
        client.train(common(1), _items(20), labels=[1] * 20, weights=[None] * 20)
    else:
        client.predict(common(1), _items(20))
    pid = client.pids()[0]
    readers = [thread for thread in threading.enumerate() if f"vw{pid}-std" in thread.name]
    assert readers
    assert _drop(client, pid, readers) == \
        [f"subwabbit: vw[{pid}] was not closed; call close() or use 'with'"]


@pytest.mark.parametrize("kind", ["pool", "asyncio-pool"])
def test_a_dropped_pool_leaves_no_socket_to_the_garbage_collector(kind, trained_model):
    # The socket to a pool's fork server was closed by nobody once a
    # dropped pool's server ended (only close() closed it): the collection
    # of the server's object did, warning 'unclosed <socket.socket ...>'.
    client = Client(kind, DictFormatter(), scoring_args(trained_model), size=2)
    client.predict(common(1), _items(20))
    server = client.model._groups[0].server.pid  # pylint: disable=protected-access
    threads = [thread for thread in threading.enumerate() if f"vw{server}-" in thread.name]
    assert [message for message in _drop(client, server, threads)
            if "was not closed" not in message] == []


def _drop(client, pid, threads):
    """Drop ``client``'s object without closing it, wait until the process
    ``pid`` has ended and ``threads`` with it, and collect: the messages of
    the ResourceWarnings given meanwhile."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        client.model = None
        gc.collect()
        assert wait_until(lambda: proc_stat(pid) is None)
        for thread in threads:
            thread.join(10)
        gc.collect()
    if client.loop is not None:
        client.loop.close()
    return [str(warning.message) for warning in caught
            if issubclass(warning.category, ResourceWarning)]


def test_processes_never_closed_do_not_hold_up_interpreter_exit(trained_model, tmp_path):
    """Objects left to the garbage collector at exit (module globals): the
    interpreter exits at once, and the engines, their input closed, exit too."""
    script = tmp_path / "forgets_to_close.py"
    script.write_text(
        "import sys\n"
        "from subwabbit import (VowpalWabbitDummyFormatter, VowpalWabbitNonBlockingProcess,\n"
        "                       VowpalWabbitProcess)\n"
        f"args = ['-i', {trained_model!r}, '-t', '--quiet']\n"
        "blocking = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), args)\n"
        "nonblocking = VowpalWabbitNonBlockingProcess(VowpalWabbitDummyFormatter(), args)\n"
        "writer = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ['--quiet'], write_only=True)\n"
        "print(len(list(blocking.predict('|u a', ['|i b']))), blocking.pid, nonblocking.pid,\n"
        "      writer.pid, flush=True)\n")
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-W", "ignore", str(script)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert time.perf_counter() - began < 15
    first, *engines = [int(word) for word in done.stdout.split()]
    assert first == 1
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" for pid in engines) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z" for pid in engines)


def _state(pid: int) -> str:
    fields = proc_stat(pid)
    return "gone" if fields is None else fields[0]


def _parked_call(model, resume, park_s):
    """A thread whose call takes its first prediction, then parks in user
    code, holding the process, until ``resume`` is set or ``park_s`` passed,
    and reads the rest: ``(thread, outcome)``, once it is parked."""
    parked = threading.Event()
    outcome = {}

    def holder():
        iterator = model.predict({"user": 1}, _items(2000))
        next(iterator)
        parked.set()
        resume.wait(park_s)
        try:
            outcome["rest"] = list(iterator)
        except VowpalWabbitError as exc:
            outcome["error"] = exc
        except BaseException as exc:  # pylint: disable=broad-except
            outcome["wrong error"] = exc

    thread = threading.Thread(target=holder)
    thread.start()
    assert parked.wait(10)
    return thread, outcome


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_close_while_another_thread_holds_the_process_is_bounded(cls, trained_model):
    model = cls(DictFormatter(), scoring_args(trained_model))
    engine_pid = model.pid
    thread, outcome = _parked_call(model, threading.Event(), park_s=0.6)
    began = time.perf_counter()
    model.close(timeout=1.0)
    assert time.perf_counter() - began < 1.0 + 0.1
    thread.join(10)
    assert isinstance(outcome.get("error"), VowpalWabbitError)
    assert engine_pid not in children_of_this_process()


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_a_call_whose_engine_close_kills_is_told_the_process_was_closed(cls, tmp_path):
    """A call still reading its predictions when close() kills its engine
    raises that the process was closed (as the asyncio class's call does),
    not that its engine failed: it had raised VowpalWabbitEngineExitedError
    'the vw engine closed its output ... killed by SIGKILL'."""
    model = cls(WideItems(28), wide_model(tmp_path, 28))  # about 0.3 ms a line
    started = threading.Event()
    outcome = {}

    def call():
        try:
            for _ in model.predict(common(1), _items(100_000)):
                started.set()
        except Exception as exc:  # pylint: disable=broad-except
            outcome["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    assert started.wait(30)
    model.close(timeout=0.4)
    thread.join(30)
    error = outcome.get("error")
    assert isinstance(error, VowpalWabbitError), outcome
    assert not isinstance(error, VowpalWabbitEngineExitedError), str(error)
    assert "closed" in str(error) and error.returncode is None, str(error)


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_close_never_closes_pipes_a_call_still_uses(cls, trained_model):
    """close(0.2) cannot wait for a call parked in user code. Were the
    engine's descriptors closed under it, their numbers would go to the next
    pipe opened (another engine's, in a service): here a pipe of answers
    that are nobody's. The call must neither read them nor write into it,
    and closes its killed engine's pipes itself when it ends (the pools'
    test of the same is in test_pool.py)."""
    model = cls(DictFormatter(), scoring_args(trained_model))
    engine = model._engine  # pylint: disable=protected-access
    resume = threading.Event()
    thread, outcome = _parked_call(model, resume, park_s=30)
    began = time.perf_counter()
    model.close(timeout=0.2)
    assert time.perf_counter() - began < 0.2 + 0.5
    try:
        with pipe_on_freed_numbers(engine) as planted:
            # The pipes are still the call's: between its check that the engine
            # is open and its next system call, nothing else can take their numbers.
            assert planted.numbers == []
            until = time.time() + 5  # the engine close() killed is dead before the call goes on
            while time.time() < until and _state(engine.pid) not in ("Z", "gone"):
                time.sleep(0.01)
            resume.set()
            thread.join(30)
    finally:
        resume.set()
    assert not thread.is_alive()
    assert planted.left == planted.marker  # nothing read from it, nothing written into it
    assert "error" in outcome and "closed" in str(outcome["error"]), outcome
    assert engine.closed and engine.pid not in children_of_this_process()


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_restart_of_a_process_closed_under_a_parked_call_raises_at_once(cls, trained_model):
    model = cls(DictFormatter(), scoring_args(trained_model), io_timeout_s=30)
    resume = threading.Event()
    thread, _ = _parked_call(model, resume, park_s=30)
    try:
        model.close(timeout=0.2)
        began = time.perf_counter()
        with pytest.raises(VowpalWabbitError, match="is closed"):
            model.restart()
        assert time.perf_counter() - began < 1  # not after io_timeout_s
    finally:
        resume.set()
        thread.join(30)


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_close_reports_an_engine_that_died_on_its_own_under_a_parked_call(cls, trained_model):
    """The engine is gone (SIGTERM from outside) while a call is parked
    holding it: close() leaves its pipes to the call, and still reports the
    failure, as it does when it closes them itself."""
    model = cls(DictFormatter(), scoring_args(trained_model))
    engine = model._engine  # pylint: disable=protected-access
    resume = threading.Event()
    thread, outcome = _parked_call(model, resume, park_s=30)
    try:
        os.kill(engine.pid, signal.SIGTERM)
        until = time.time() + 5
        while time.time() < until and _state(engine.pid) not in ("Z", "gone"):
            time.sleep(0.01)
        began = time.perf_counter()
        with pytest.raises(VowpalWabbitEngineExitedError, match="failed while shutting down"):
            model.close(timeout=0.2)
        assert time.perf_counter() - began < 0.2 + 0.5
    finally:
        resume.set()
        thread.join(30)
    assert "error" in outcome, outcome
    assert engine.closed and engine.pid not in children_of_this_process()


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_close_reports_the_engine_left_to_a_call_that_restarts_meanwhile(cls, trained_model):
    """As above, and the parked call's restart clears the object's engine
    between close() leaving the engine to the call and reporting its
    failure (the moment is made certain by clearing it where close() lets
    go of its channel): close() reports the engine it left to the call."""
    model = cls(DictFormatter(), scoring_args(trained_model))
    engine = model._engine  # pylint: disable=protected-access
    resume = threading.Event()
    thread, _ = _parked_call(model, resume, park_s=30)
    let_go = model._abandon_channel  # pylint: disable=protected-access

    def let_go_and_restart(reason):
        let_go(reason)
        model._engine = None  # pylint: disable=protected-access

    model._abandon_channel = let_go_and_restart  # pylint: disable=protected-access
    try:
        os.kill(engine.pid, signal.SIGTERM)
        until = time.time() + 5
        while time.time() < until and _state(engine.pid) not in ("Z", "gone"):
            time.sleep(0.01)
        with pytest.raises(VowpalWabbitEngineExitedError, match="failed while shutting down"):
            model.close(timeout=0.2)
    finally:
        resume.set()
        thread.join(30)
    assert engine.closed and engine.pid not in children_of_this_process()


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_an_engine_that_restart_started_while_close_ran_does_not_outlive_it(cls, tmp_path):
    """close() cannot wait for a restart() whose engine is slow to start; the
    engine that start gives must not be adopted by the closed object (it ran,
    unowned, after close() had returned)."""
    flag, command = slow_starting_engine(tmp_path, 1.5)
    model = cls(VowpalWabbitDummyFormatter(), ["--quiet"], vw_command=command)
    before = set(children_of_this_process())  # its first engine among them
    flag.write_text("")
    outcome = {}

    def restart():
        try:
            model.restart()
            outcome["restarted"] = True
        except VowpalWabbitError as exc:
            outcome["raised"] = exc

    thread = threading.Thread(target=restart)
    thread.start()
    time.sleep(0.3)  # the new engine is starting
    began = time.perf_counter()
    model.close(timeout=0.5)
    assert time.perf_counter() - began < 0.5 + 0.2
    thread.join(30)
    assert "raised" in outcome and "closed" in str(outcome["raised"]), outcome
    until = time.time() + 10
    while time.time() < until and set(children_of_this_process()) - before:
        time.sleep(0.05)
    assert set(children_of_this_process()) - before == set()


def test_a_call_waiting_for_a_replacement_that_close_cancelled_raises_vowpal_wabbit_error():
    """The nonblocking class starts a failed engine's replacement in the
    background; close() cancels it. A replacement that finished starting
    just then is stopped, and the call waiting for it gets the library's
    error (it got an AssertionError)."""

    class SlowToFinishStarting(VowpalWabbitNonBlockingProcess):
        slow = False

        def _after_start(self, engine):
            super()._after_start(engine)
            if SlowToFinishStarting.slow:
                time.sleep(1.0)  # started and checked: only the hand-over is left

    model = SlowToFinishStarting(VowpalWabbitDummyFormatter(), ["--quiet"],
                                 restart_on_crash=True)
    os.kill(model.pid, signal.SIGKILL)
    with pytest.raises(VowpalWabbitError):
        list(model.predict("", ["| a"] * 50000))  # reports the crash
    before = set(children_of_this_process())
    SlowToFinishStarting.slow = True
    outcome = {}

    def call():
        try:
            outcome["got"] = list(model.predict("", ["| a"]))
        except BaseException as exc:  # pylint: disable=broad-except
            outcome["raised"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.3)  # the replacement is starting
    model.close(timeout=1.0)
    thread.join(30)
    assert isinstance(outcome.get("raised"), VowpalWabbitError), outcome
    until = time.time() + 10
    while time.time() < until and set(children_of_this_process()) - before:
        time.sleep(0.05)
    assert set(children_of_this_process()) - before == set()


@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_hook_hears_of_a_train_call_that_failed(cls):
    hooked = []
    with cls(VowpalWabbitDummyFormatter(), ["--quiet"], metrics_hook=hooked.append) as model:
        model.train("|f", ["a", "b"], labels=[1, -1], weights=[None, None])
        assert hooked[-1]["method"] == "train" and hooked[-1]["num_lines"] == 2
        os.kill(model.pid, signal.SIGKILL)
        with pytest.raises(VowpalWabbitEngineExitedError):
            model.train("|f", ["a"] * 20000, labels=[1] * 20000, weights=[None] * 20000)
        assert hooked[-1]["method"] == "train" and hooked[-1]["num_lines"] == 0
        assert hooked[-1]["total_time"] >= 0


@pytest.mark.parametrize("cls", CLASSES)
def test_infinite_and_huge_seconds_mean_no_limit_everywhere(cls, trained_model, tmp_path):
    # Each of these reached select() or a lock's wait as a number the system
    # refuses (OverflowError) before such values were capped.
    formatter = DictFormatter()
    items = _items(300)
    expected = expected_for(formatter, trained_model, tmp_path, {"user": 2}, items)
    path = str(tmp_path / "saved.vw")
    for settings in ({"io_timeout_s": math.inf, "startup_timeout_s": math.inf},
                     {"io_timeout_s": 1e300}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 1e300 "looks like milliseconds"
            with cls(formatter, scoring_args(trained_model), **settings) as model:
                for timeout in (math.inf, 1e300, None):
                    assert list(model.predict({"user": 2}, items, timeout=timeout)) == \
                        pytest.approx(expected, abs=1e-6)
                model.save(path, timeout=math.inf)
                assert os.path.getsize(path) > 0
                model.restart(timeout=math.inf)
                assert list(model.predict({"user": 2}, items, timeout=math.inf)) == \
                    pytest.approx(expected, abs=1e-6)
                model.close(timeout=math.inf)


def test_a_call_with_no_limit_waits_for_another_threads_call(trained_model, tmp_path):
    formatter = DictFormatter()
    expected = expected_for(formatter, trained_model, tmp_path, {"user": 3}, _items(5))
    with VowpalWabbitNonBlockingProcess(formatter, scoring_args(trained_model)) as model:
        unfinished = model.predict({"user": 3}, _items(3000))
        next(unfinished)  # this thread holds the process
        got = []
        waiter = threading.Thread(
            target=lambda: got.append(list(model.predict({"user": 3}, _items(5),
                                                         timeout=math.inf))))
        waiter.start()
        time.sleep(0.2)
        assert waiter.is_alive() and not got  # waiting for its turn, not failed
        unfinished.close()
        waiter.join(10)
        assert got == [pytest.approx(expected, abs=1e-6)]


@pytest.mark.parametrize("timeout", [None, math.inf, 1e300])
def test_a_stopped_engine_fails_a_call_with_no_limit_after_io_timeout_s(trained_model, timeout):
    with VowpalWabbitNonBlockingProcess(DictFormatter(), scoring_args(trained_model),
                                        io_timeout_s=0.5) as model:
        os.kill(model.pid, signal.SIGSTOP)
        raised = []

        def call():
            try:
                list(model.predict({"user": 1}, _items(3000), timeout=timeout))
            except VowpalWabbitError as exc:
                raised.append(exc)

        waiter = threading.Thread(target=call, daemon=True)
        try:
            waiter.start()
            waiter.join(0.5 + 2.0)
            assert not waiter.is_alive(), "the call waits on a stopped engine"
        finally:
            os.kill(model.pid, signal.SIGCONT)
        assert len(raised) == 1 and isinstance(raised[0], VowpalWabbitTimeoutError)


@pytest.mark.parametrize("kind,kwargs", [
    ("blocking", {}), ("blocking", {"max_lateness_s": 5.0}), ("nonblocking", {}),
    ("asyncio", {}), ("pool", {"size": 1}), ("asyncio-pool", {"size": 1})],
    ids=["blocking", "blocking-max_lateness", "nonblocking", "asyncio", "pool", "asyncio-pool"])
def test_a_stopped_engine_fails_a_call_with_a_long_deadline_after_io_timeout_s(
        kind, kwargs, trained_model, truth):
    """``io_timeout_s`` held only for calls that ended at no deadline: a
    call whose deadline was further off (8 s here) waited for it in full on
    a stopped engine and returned nothing (nonblocking, asyncio, the pools,
    and the blocking class with ``max_lateness_s``). Now an engine that owes
    answers and shows no progress for ``io_timeout_s`` has failed whatever
    the deadline: a process raises VowpalWabbitTimeoutError, a pool serves
    the call with a replacement."""
    client = Client(kind, DictFormatter(), scoring_args(trained_model), io_timeout_s=0.5,
                    **kwargs)
    try:
        client.predict(common(1), _items(10))
        stopped = client.pids()[0]
        os.kill(stopped, signal.SIGSTOP)
        metrics = {}
        began = time.perf_counter()
        try:
            if "pool" in kind:
                got = client.predict(common(1), _items(3000), timeout=8.0, metrics=metrics)
            else:
                with pytest.raises(VowpalWabbitTimeoutError, match="io_timeout_s"):
                    client.predict(common(1), _items(3000), timeout=8.0, metrics=metrics)
            took = time.perf_counter() - began
        finally:
            _resume(stopped)
        assert took < 0.5 + 2.0, took  # generous: 2 shared cores
        assert metrics["engine_failures"] == 1
        if "pool" in kind:
            assert got == truth[trained_model][1]
            assert stopped not in client.pids()
        else:
            with pytest.raises(VowpalWabbitError, match="failed earlier"):
                client.predict(common(1), _items(10), timeout=8.0)
    finally:
        client.close()


def _calls_on_a_stopped_engine(cls, model_path, restart):
    """Calls with a 10 ms deadline, 20 ms apart for up to 5 s, on a process
    whose engine is stopped (``SIGSTOP``) after a first call: each call's
    outcome (predictions, or the error) and metrics, until one gets every
    prediction (with ``restart_on_crash``) or the calls raise."""
    outcomes = []

    async def run():
        model = cls(DictFormatter(), scoring_args(model_path), io_timeout_s=0.5,
                    restart_on_crash=restart)

        async def predict(**kwargs):
            got = model.predict(common(2), _items(300), **kwargs)
            return await got if inspect.iscoroutine(got) else list(got)

        try:
            await predict(timeout=5.0)
            stopped = model.pid
            os.kill(stopped, signal.SIGSTOP)
            try:
                until = time.monotonic() + 5.0
                while time.monotonic() < until:
                    metrics = {}
                    try:
                        got = await predict(timeout=0.010, metrics=metrics)
                    except VowpalWabbitError as exc:
                        outcomes.append((exc, metrics))
                        if len(outcomes) > 3 and isinstance(outcomes[-4][0], VowpalWabbitError):
                            return
                    else:
                        outcomes.append((got, metrics))
                        if len(got) == 300:
                            return
                    await asyncio.sleep(0.02)
            finally:
                _resume(stopped)
        finally:
            closed = model.close(1.0)
            if inspect.iscoroutine(closed):
                await closed

    asyncio.run(run())
    return outcomes


@pytest.mark.parametrize("restart", [True, False], ids=["restart_on_crash", "no_restart"])
@pytest.mark.parametrize("cls", [VowpalWabbitNonBlockingProcess, AsyncVowpalWabbitProcess],
                         ids=["nonblocking", "asyncio"])
def test_a_stopped_engine_is_failed_between_calls_with_deadlines(cls, restart, trained_model,
                                                                 truth):
    """Calls with a deadline end long before ``io_timeout_s``: an engine
    stopped while it owed answers made every later call return nothing, for
    good, even with ``restart_on_crash`` (found by a review). Between calls,
    an engine that has owed answers and printed nothing for ``io_timeout_s``
    has failed, counted in the metrics of the call that finds it: with
    ``restart_on_crash`` later calls get a new engine and their own
    predictions; without, they raise, naming the cause."""
    outcomes = _calls_on_a_stopped_engine(cls, trained_model, restart)
    failed = [metrics for _, metrics in outcomes if metrics.get("engine_failures")]
    assert len(failed) == 1
    last = outcomes[-1][0]
    if restart:
        assert last == pytest.approx(truth[trained_model][2][:300], abs=1e-6)
    else:
        assert isinstance(last, VowpalWabbitError)
        assert "printed nothing for 0.5 s (io_timeout_s)" in str(last)


def test_an_unfinished_save_is_cleaned_up_only_once_the_engine_wrote_its_file(tmp_path):
    # A save that timed out (or was cancelled) may still be running in the
    # engine: its files are removed after the engine renamed them into place,
    # never under it while it writes (vw aborts when its rename fails).
    from subwabbit.saving import ModelSave  # pylint: disable=import-outside-toplevel

    class Running:  # the engine, alive while the test plays its part
        returncode = None

    save = ModelSave(str(tmp_path / "model.vw"))
    writing = save.side + ".writing"
    with open(writing, "wb") as handle:  # the engine is writing
        handle.write(b"weights")
    save.clean_up_later(Running(), 10)
    time.sleep(0.3)
    assert os.path.exists(writing)  # left alone while it writes
    os.replace(writing, save.side)  # the engine is done
    until = time.time() + 5
    while os.listdir(tmp_path) and time.time() < until:
        time.sleep(0.02)
    assert os.listdir(tmp_path) == []


_INTERRUPTED_SERVICE = r'''
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="LOG %(message)s")
from subwabbit import VowpalWabbitNonBlockingProcess, VowpalWabbitPool
from conftest import DictFormatter, common, items, scoring_args
model, what = sys.argv[1], sys.argv[2]
if what == "nonblocking":
    client = VowpalWabbitNonBlockingProcess(DictFormatter(), scoring_args(model))
    predict = lambda user, timeout: list(client.predict(common(user), items(300), timeout=timeout))
else:
    client = VowpalWabbitPool(DictFormatter(), scoring_args(model), size=int(what))
    predict = lambda user, timeout: client.predict(common(user), items(300), timeout=timeout)
# As uvicorn and gunicorn do: the signal asks for a graceful shutdown.
import signal
stopping = []
signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
print("ready", flush=True)
while not stopping:
    predict(1, 0.05)
# the graceful shutdown: what is still in flight gets answered
print("after", [len(predict(2, 0.5)) for _ in range(5)], flush=True)
client.close()
'''


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Popen(process_group=) is 3.11's")
@pytest.mark.parametrize("what", ["nonblocking", "1", "2"])
def test_the_terminals_ctrl_c_reaches_the_client_not_its_engines(trained_model, what):
    # ^C in a terminal sends SIGINT to the whole foreground process group. The
    # engines must live on until the client closes them: a service's graceful
    # shutdown still answers the requests in flight, with no engine failing.
    child = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED_SERVICE, trained_model, what],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))})
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        os.killpg(child.pid, signal.SIGINT)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert out.strip() == "after [300, 300, 300, 300, 300]", out
    assert child.returncode == 0


class _Interrupt(BaseException):
    """Stands for KeyboardInterrupt inside an event loop (which stops on a real one)."""


def _interrupt_after_a_read(engine, exception=KeyboardInterrupt):
    """Have ``engine``'s next read that gets bytes raise ``exception`` once
    they have left the pipe: a signal that lands right after the system call."""
    real = engine.read_some

    def read_some(deadline=None):
        data = real(deadline)
        if data:
            engine.read_some = real
            raise exception()
        return data

    engine.read_some = read_some


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize("cls", CLASSES, ids=CLASS_IDS)
def test_an_interrupt_between_a_read_and_its_bookkeeping_fails_the_engine(cls, restart,
                                                                          trained_model, truth):
    # The answers it read are lost: a next call on that engine would take
    # later answers for earlier items. It is a failed engine instead.
    with cls(DictFormatter(), scoring_args(trained_model), restart_on_crash=restart) as model:
        _interrupt_after_a_read(model._engine)  # pylint: disable=protected-access
        with pytest.raises(KeyboardInterrupt):
            list(model.predict(common(1), _items(3000), timeout=5.0))
        if restart:
            assert list(model.predict(common(2), _items(3000))) == truth[trained_model][2]
        else:
            with pytest.raises(VowpalWabbitError, match="interrupted"):
                list(model.predict(common(2), _items(3000)))


def test_an_interrupted_pool_call_has_the_engine_it_tore_replaced(trained_model, truth):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        _interrupt_after_a_read(pool._roster.slots[0].engine)  # pylint: disable=protected-access
        with pytest.raises(KeyboardInterrupt):
            pool.predict(common(1), _items(3000), timeout=5.0)
        for user in (2, 3):
            assert pool.predict(common(user), _items(3000)) == truth[trained_model][user]
        assert pool.stats()["engine_failures"] == 1


def test_an_interrupted_asyncio_call_fails_the_engine(trained_model, truth):
    async def main():
        async with AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(trained_model),
                                            restart_on_crash=True) as model:
            await model.predict(common(0), _items(10))
            _interrupt_after_a_read(model._engine, _Interrupt)  # pylint: disable=protected-access
            with pytest.raises(_Interrupt):
                await model.predict(common(1), _items(3000), timeout=5.0)
            return await model.predict(common(2), _items(3000))

    assert asyncio.run(main()) == truth[trained_model][2]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Popen(process_group=) is 3.11's")
def test_engines_have_a_process_group_of_their_own_in_the_clients_session(trained_model):
    # Their own group keeps the terminal's ^C away; the client's session keeps
    # them in its scheduling autogroup (a session of their own cost a pool of
    # 2 on 2 vCPUs 8% of its predictions within 10 ms).
    with VowpalWabbitNonBlockingProcess(DictFormatter(), scoring_args(trained_model)) as model, \
            VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        server = pool._groups[0].server.pid  # pylint: disable=protected-access
        for pid in [model._engine.pid, server] + pool.engine_pids():  # pylint: disable=protected-access
            assert os.getpgid(pid) != os.getpgid(0)
            assert os.getsid(pid) == os.getsid(0)


TRAIN_METRICS = {"num_lines", "total_time", "lock_wait_time", "restarts", "method"}


@pytest.mark.parametrize("cls", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess])
def test_train_metrics_reach_the_hook_however_the_call_ended(cls):
    # Found by a review: a train() whose input was refused never reached the
    # hook, and no train() call had the restarts key the docs list.
    seen = []
    with cls(VowpalWabbitDummyFormatter(), ["--quiet"], metrics_hook=seen.append) as model:
        model.train("|u a", ["|i b"], labels=[1], weights=[None])
        with pytest.raises(ValueError):
            model.train("|u a", ["|i b\n1 |i c"], labels=[1], weights=[None])  # a bad example
    assert len(seen) == 2, seen
    assert all(TRAIN_METRICS <= set(metrics) for metrics in seen), seen
    assert seen[1]["num_lines"] == 0


def test_async_train_metrics_reach_the_hook_however_the_call_ended():
    seen = []

    async def main():
        async with AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"],
                                            metrics_hook=seen.append) as model:
            await model.train("|u a", ["|i b"], labels=[1], weights=[None])
            with pytest.raises(ValueError):
                await model.train("|u a", ["|i b"], labels=[1, 1])  # lengths differ

    asyncio.run(main())
    assert len(seen) == 2, seen
    assert all(TRAIN_METRICS <= set(metrics) for metrics in seen), seen


class _SlowFormatter(DictFormatter):
    """A formatter that spends ``seconds`` (1 ms) of CPU per item (a lookup
    per item, say)."""

    def __init__(self, seconds=0.001):
        super().__init__()
        self.seconds = seconds

    def format_item_features(self, common_features, item_features, debug_info=None):
        until = time.perf_counter() + self.seconds
        while time.perf_counter() < until:
            pass
        return super().format_item_features(common_features, item_features, debug_info)


@pytest.mark.parametrize("cls", [VowpalWabbitNonBlockingProcess, VowpalWabbitPool,
                                 AsyncVowpalWabbitProcess],
                         ids=["nonblocking", "pool", "asyncio"])
def test_a_formatter_slow_per_item_still_gets_predictions_by_the_deadline(cls, trained_model,
                                                                          truth):
    """Items were formatted a whole batch at a time (50, or 100 in a pool)
    with no look at the clock: with a formatter at 1 ms an item, every call
    with a 20 ms deadline formatted past it, returned nothing and was 30 to
    80 ms late, call after call (found by a review). With a deadline a call
    now formats no more at a time than the formatter formats in about 1 ms
    at its last speed, and no more than it formats before the write cut-off.
    (The first call, before the speed is known, formats 8 items at first.)
    Here at 10 ms an item and 200 ms, the same test, where a loaded
    machine's scheduler alone made 20 ms calls more than 15 ms late, and
    100 ms calls more than 50: formatted a batch at a time, calls are 300 ms
    late or more."""
    results = []

    async def run():
        model = cls(_SlowFormatter(0.010), scoring_args(trained_model))
        try:
            if inspect.iscoroutinefunction(getattr(model, "start", None)):
                await model.start()  # (an asyncio object starts its engine at its first call)
            for _ in range(6):
                began = time.perf_counter()
                got = model.predict(common(3), _items(300), timeout=0.200)
                got = await got if inspect.iscoroutine(got) else list(got)
                results.append((got, time.perf_counter() - began))
        finally:
            closed = model.close()
            if inspect.iscoroutine(closed):
                await closed

    asyncio.run(run())
    for got, wall in results:
        assert got == pytest.approx(truth[trained_model][3][:len(got)], abs=1e-6)
        assert wall < 0.200 + 0.100, wall  # generous: 2 shared cores
    # (most, not all: a loaded machine may leave a call without an answer;
    # formatted a batch at a time, none had one)
    assert sum(1 for got, _ in results[1:] if got) >= 4, [len(got) for got, _ in results]


class _SometimesSlowFormatter(DictFormatter):
    """A formatter fast for most items and 10 ms for those marked ``slow``
    (a cache miss per item, say)."""

    def format_item_features(self, common_features, item_features, debug_info=None):
        if item_features.get("slow"):
            time.sleep(0.010)
        return super().format_item_features(common_features, item_features, debug_info)


@pytest.mark.parametrize("kind", ["blocking", "nonblocking", "asyncio", "pool", "asyncio-pool"])
def test_a_formatter_slow_for_some_items_makes_a_call_late_by_one_item_at_most(
        kind, trained_model, truth):
    """Batches are sized by the formatter's speed in earlier batches, and a
    batch was formatted whole without a look at the clock: after fast
    calls, a call whose items turned slow (10 ms each) formatted a batch of
    them past its 20 ms deadline, 0.15 to 0.5 s late. The clock is read
    after each item now: no item is begun after the deadline (the write
    cut-off), so a call is late by one item's formatting at most."""
    client = Client(kind, _SometimesSlowFormatter(), scoring_args(trained_model),
                    **({"size": 2} if "pool" in kind else {}))
    try:
        for _ in range(5):  # fast calls: the formatter is measured fast
            client.predict(common(3), _items(300), timeout=0.050)
        for _ in range(3):
            its = [dict(item, slow=index >= 20) for index, item in enumerate(_items(300))]
            began = time.perf_counter()
            got = client.predict(common(3), its, timeout=0.020)
            wall = time.perf_counter() - began
            assert got == pytest.approx(truth[trained_model][3][:len(got)], abs=1e-6)
            assert wall < 0.020 + 0.010 + 0.050, wall  # one slow item; generous: 2 shared cores
    finally:
        client.close()


class _PausedOnceFormatter(_SlowFormatter):
    """:class:`_SlowFormatter` (5 ms an item) that stalls for 300 ms once,
    at its 25th item (a garbage collection, say)."""

    def __init__(self):
        super().__init__(0.005)
        self.formatted = 0

    def format_item_features(self, common_features, item_features, debug_info=None):
        self.formatted += 1
        if self.formatted == 25:
            time.sleep(0.300)
        return super().format_item_features(common_features, item_features, debug_info)


@pytest.mark.parametrize("cls", [VowpalWabbitNonBlockingProcess, VowpalWabbitPool,
                                 AsyncVowpalWabbitProcess],
                         ids=["nonblocking", "pool", "asyncio"])
def test_a_formatter_paused_once_gets_predictions_again(cls, trained_model, truth):
    """The formatter's speed kept for the next call is that of the call's
    last batch; a batch of one item that stalled once (60 ms) made every
    later call with a 20 ms deadline format nothing (not one item "fits"),
    so the speed was never measured again and the client returned nothing,
    for good. A call that formats nothing halves the speed it keeps: a
    later call measures it again. (Here 5 times slower, a 300 ms stall and
    100 ms calls: the same test, with room for a loaded machine's
    scheduler.)"""
    results = []

    async def run():
        model = cls(_PausedOnceFormatter(), scoring_args(trained_model))
        try:
            if inspect.iscoroutinefunction(getattr(model, "start", None)):
                await model.start()
            for _ in range(10):
                got = model.predict(common(3), _items(300), timeout=0.100)
                got = await got if inspect.iscoroutine(got) else list(got)
                results.append(got)
        finally:
            closed = model.close()
            if inspect.iscoroutine(closed):
                await closed

    asyncio.run(run())
    for got in results:
        assert got == pytest.approx(truth[trained_model][3][:len(got)], abs=1e-6)
    # (most, not all: a loaded machine may leave a call without an answer;
    # before, every call after the stall returned nothing)
    assert sum(1 for got in results[-4:] if got) >= 3, [len(got) for got in results]

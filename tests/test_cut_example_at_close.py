"""A training call cut off in the middle of a line, then close(): the engine
must not learn the cut line into the ``-f`` model it saves."""

import asyncio
import gc
import os
import signal
import time
from typing import Any

import pytest

from subwabbit import (AsyncVowpalWabbitProcess, VowpalWabbitDummyFormatter,
                       VowpalWabbitError, VowpalWabbitNonBlockingProcess,
                       VowpalWabbitProcess, VowpalWabbitTimeoutError)

#: Every item line has the same 40 features: a model that learnt only whole
#: lines gives f0 and f39 the same weight; a cut line updates f0, not f39.
ITEM = "|i " + " ".join(f"f{k}" for k in range(40))


class Interrupted(Exception):
    """Raised by a timer's signal handler in the middle of a training call."""


def _interrupt(*_: Any) -> None:
    raise Interrupted()


#: a line of the training calls below, and the calls' items, labels and weights
LINE_BYTES = len(f"1  {ITEM}\n")
TRAIN = ([ITEM] * 20000, [1] * 20000, [None] * 20000)


def _assert_cut_mid_line(model: Any) -> None:
    written = model._channel.bytes_written  # pylint: disable=protected-access
    assert written % LINE_BYTES, "the test needs a line cut in the middle"


def _cut_mid_line(model: Any, resume: bool = True) -> None:
    """Interrupt a train call of ``model`` in the middle of a line: its
    engine, stopped (SIGSTOP), reads nothing, so the call fills the pipe and
    waits, and a timer interrupts it with a line written in part. The
    engine goes on (SIGCONT) unless ``resume`` is false."""
    pid = model.pid
    previous = signal.signal(signal.SIGALRM, _interrupt)
    os.kill(pid, signal.SIGSTOP)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(Interrupted):
            model.train("", *TRAIN)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if resume:
            os.kill(pid, signal.SIGCONT)
    _assert_cut_mid_line(model)


async def _cancel_mid_line(model: Any, resume: bool = True) -> None:
    """:func:`_cut_mid_line` for the asyncio client: the call is cancelled."""
    pid = model.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(model.train("", *TRAIN), 0.5)
    finally:
        if resume:
            os.kill(pid, signal.SIGCONT)
    _assert_cut_mid_line(model)


def _resume(pid: int) -> None:
    """Let a stopped engine go on, if close() has not killed and reaped it."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _assert_learnt_whole_lines(path: Any) -> Any:
    """The model saved at ``path`` learnt whole lines only (see :data:`ITEM`):
    :returns: its prediction for them"""
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["-i", path, "-t", "--quiet"]) as check:
        first, last = check.predict("", ["|i f0", "|i f39"])
    assert first == last
    return first


@pytest.mark.parametrize("cls, options", [(VowpalWabbitProcess, {"write_only": True}),
                                          (VowpalWabbitProcess, {}),
                                          (VowpalWabbitNonBlockingProcess, {})])
def test_close_after_a_call_cut_mid_line_saves_no_cut_example(cls, options, tmp_path):
    path = str(tmp_path / "model.vw")
    model = cls(VowpalWabbitDummyFormatter(), ["--quiet", "-f", path], **options)
    _cut_mid_line(model)
    model.close()
    _assert_learnt_whole_lines(path)


def test_close_after_a_cancelled_async_call_saves_no_cut_example(tmp_path):
    path = str(tmp_path / "model.vw")

    async def cut_call() -> None:
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-f", path])
        await model.start()
        await _cancel_mid_line(model)
        await model.close()

    asyncio.run(cut_call())
    _assert_learnt_whole_lines(path)


def test_reload_after_a_call_cut_mid_line_saves_no_cut_example(tmp_path):
    path = str(tmp_path / "model.vw")
    model = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-f", path],
                                write_only=True)
    _cut_mid_line(model)
    model.reload(["--quiet", "-f", str(tmp_path / "next.vw")])
    model.close()  # (it waits for the replaced engine's close)
    _assert_learnt_whole_lines(path)


def test_async_reload_after_a_cancelled_call_saves_no_cut_example(tmp_path):
    path = str(tmp_path / "model.vw")

    async def cut_call_then_reload() -> None:
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-f", path])
        await model.start()
        await _cancel_mid_line(model)
        await model.reload(["--quiet", "-f", str(tmp_path / "next.vw")])
        await model.close()  # (it waits for the replaced engine's close)

    asyncio.run(cut_call_then_reload())
    _assert_learnt_whole_lines(path)


def test_a_dropped_process_saves_no_cut_example(tmp_path):
    path = str(tmp_path / "model.vw")
    model = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-f", path],
                                write_only=True)
    _cut_mid_line(model)
    with pytest.warns(ResourceWarning):
        del model  # never closed: it lets go of its engine, which saves its model
        gc.collect()
    _assert_learnt_whole_lines(path)


def _tear_next_write(model: Any) -> None:
    """Make the model's next write give the engine part of a line and then
    raise, as an interrupt landing after the system call and before the
    channel counted the bytes would: the channel is left torn."""
    engine = model._engine  # pylint: disable=protected-access
    write_some = engine.write_some

    def torn_write(data: Any, deadline: Any = None) -> int:
        del engine.write_some
        write_some(data[:len(ITEM) // 2], deadline)
        raise Interrupted()

    engine.write_some = torn_write


def _train_torn(model: Any) -> None:
    model.train("", [ITEM] * 3, [1] * 3, [None] * 3)  # whole lines, as the model had
    _tear_next_write(model)
    with pytest.raises(Interrupted):
        model.train("", [ITEM] * 3, [1] * 3, [None] * 3)
    assert model._channel.torn  # pylint: disable=protected-access


def test_a_dropped_process_after_a_torn_write_saves_no_model(tmp_path):
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")
    model = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-f", str(path)])
    _train_torn(model)
    with pytest.warns(ResourceWarning):
        del model  # never closed: its engine is killed, and saves nothing
        gc.collect()
    assert path.read_bytes() == b"the model saved before"


@pytest.mark.parametrize("cls, options", [(VowpalWabbitProcess, {"write_only": True}),
                                          (VowpalWabbitProcess, {}),
                                          (VowpalWabbitNonBlockingProcess, {})])
def test_close_after_a_torn_write_saves_no_model(cls, options, tmp_path):
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")
    model = cls(VowpalWabbitDummyFormatter(), ["--quiet", "-f", str(path)], **options)
    pid = model.pid
    _train_torn(model)
    with pytest.raises(VowpalWabbitError, match="not saved"):
        model.close()
    assert path.read_bytes() == b"the model saved before"
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped
    model.close()  # closed: again, nothing happens


def test_async_close_after_a_torn_write_saves_no_model(tmp_path):
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")

    async def torn_then_close() -> None:
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                                         ["--quiet", "-f", str(path)])
        await model.start()
        await model.train("", [ITEM] * 3, [1] * 3, [None] * 3)
        _tear_next_write(model)
        with pytest.raises(Interrupted):
            await model.train("", [ITEM] * 3, [1] * 3, [None] * 3)
        assert model._channel.torn  # pylint: disable=protected-access
        with pytest.raises(VowpalWabbitError, match="not saved"):
            await model.close()
        await model.close()

    asyncio.run(torn_then_close())
    assert path.read_bytes() == b"the model saved before"


@pytest.mark.parametrize("cls", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess])
def test_close_after_a_torn_write_of_a_predicting_engine_is_quiet(cls):
    model = cls(VowpalWabbitDummyFormatter(), ["--quiet"])
    _train_torn(model)
    model.close()  # no model to lose: the engine closes as before


def test_reload_after_a_torn_write_keeps_the_old_model_file(tmp_path):
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")
    model = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-f", str(path)])
    _train_torn(model)
    model.reload(["--quiet"])
    model.close()  # (it waits for the replaced engine's close)
    assert path.read_bytes() == b"the model saved before"


def test_async_reload_after_a_torn_write_keeps_the_old_model_file(tmp_path):
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")

    async def torn_then_reload() -> None:
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                                         ["--quiet", "-f", str(path)])
        await model.start()
        _tear_next_write(model)
        with pytest.raises(Interrupted):
            await model.train("", [ITEM] * 3, [1] * 3, [None] * 3)
        await model.reload(["--quiet"])
        await model.close()  # (it waits for the replaced engine's close)

    asyncio.run(torn_then_reload())
    assert path.read_bytes() == b"the model saved before"


def test_restart_after_a_call_cut_mid_line_saves_no_cut_example(tmp_path):
    path = str(tmp_path / "model.vw")
    model = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-f", path])
    _cut_mid_line(model)
    model.restart()  # the old engine saves its model as it closes
    _assert_learnt_whole_lines(path)
    model.close()


def test_async_restart_after_a_cancelled_call_saves_no_cut_example(tmp_path):
    path = str(tmp_path / "model.vw")

    async def cut_call_then_restart() -> None:
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-f", path])
        await model.start()
        await _cancel_mid_line(model)
        await model.restart()  # the old engine saves its model as it closes
        _assert_learnt_whole_lines(path)
        await model.close()

    asyncio.run(cut_call_then_restart())


def test_restart_after_a_torn_write_keeps_the_old_model_file(tmp_path):
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")
    model = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-f", str(path)])
    _train_torn(model)
    model.restart()
    assert path.read_bytes() == b"the model saved before"
    model.close()


def test_close_after_a_torn_read_saves_the_model(tmp_path):
    # An interrupt between reading the engine's answers and handing them out
    # tears the channel, but every byte written is known: the engine's input
    # ends on a whole line, and its model is saved as usual.
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")
    model = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-f", str(path)])
    model.train("", [ITEM] * 3, [1] * 3, [None] * 3)
    engine = model._engine  # pylint: disable=protected-access
    read_some = engine.read_some

    def torn_read(deadline: Any = None) -> bytes:
        data = read_some(deadline)
        if data:
            del engine.read_some
            raise Interrupted()
        return data

    engine.read_some = torn_read
    with pytest.raises(Interrupted):
        list(model.predict("", ["|i f0"] * 3))
    channel = model._channel  # pylint: disable=protected-access
    assert channel.torn and not channel.input_torn
    model.close()
    assert path.read_bytes() != b"the model saved before"
    assert _assert_learnt_whole_lines(path) != 0


def test_close_of_a_stopped_engine_with_a_cut_line_ends_soon_saying_it_was_stopped(tmp_path):
    # A stopped engine never takes the rest of the cut line: close() kills it
    # once it has stayed stopped for STOPPED_GRACE_S, as it does an engine
    # stopped without a cut line, not after a quarter of its timeout (7.5 s
    # of the default 30 s), and says it was stopped.
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")
    model = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet", "-f", str(path)],
                                write_only=True)
    pid = model.pid
    try:
        _cut_mid_line(model, resume=False)
        assert model._channel.unwritten_bytes  # pylint: disable=protected-access
        began = time.monotonic()
        with pytest.raises(VowpalWabbitTimeoutError, match="stopped"):
            model.close()
        assert time.monotonic() - began < 4.0
    finally:
        _resume(pid)
    assert path.read_bytes() == b"the model saved before"


def test_async_close_of_a_stopped_engine_with_a_cut_line_ends_soon_saying_it_was_stopped(
        tmp_path):
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")

    async def cut_and_close() -> float:
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                                         ["--quiet", "-f", str(path)])
        await model.start()
        pid = model.pid
        try:
            await _cancel_mid_line(model, resume=False)
            assert model._channel.unwritten_bytes  # pylint: disable=protected-access
            began = time.monotonic()
            with pytest.raises(VowpalWabbitTimeoutError, match="stopped"):
                await model.close()
            return time.monotonic() - began
        finally:
            _resume(pid)

    assert asyncio.run(cut_and_close()) < 4.0
    assert path.read_bytes() == b"the model saved before"


def test_a_background_restart_after_a_torn_write_keeps_the_old_model_file(tmp_path):
    # restart_on_crash replaces a failed engine in the background (the
    # nonblocking class): the engine it replaces is closed as restart()
    # closes one, killed when its input may end in a cut line, and saves
    # nothing then.
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")
    model = VowpalWabbitNonBlockingProcess(VowpalWabbitDummyFormatter(),
                                           ["--quiet", "-f", str(path)], restart_on_crash=True)
    old = model.pid
    _train_torn(model)
    deadline = time.monotonic() + 10.0
    while model.pid in (None, old) and time.monotonic() < deadline:
        list(model.predict("", [ITEM], timeout=0.1))  # the torn engine is replaced
        time.sleep(0.05)
    assert model.pid not in (None, old)  # (the old engine was closed before it started)
    assert path.read_bytes() == b"the model saved before"
    model.close()


def test_a_background_restart_after_a_call_failed_mid_line_keeps_the_old_model_file(tmp_path):
    # The call fails while a line is half written (the engine, stopped,
    # left the pipe full for io_timeout_s): restart_on_crash replaces the
    # engine at once, and the one it replaces, running again, must not
    # learn the cut line into its -f model.
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")
    model = VowpalWabbitNonBlockingProcess(VowpalWabbitDummyFormatter(),
                                           ["--quiet", "-f", str(path)], restart_on_crash=True,
                                           io_timeout_s=0.3)
    old = model.pid
    os.kill(old, signal.SIGSTOP)
    try:
        with pytest.raises(VowpalWabbitTimeoutError):
            model.train("", *TRAIN)
    finally:
        os.kill(old, signal.SIGCONT)  # before the replacement finds it stopped
    _assert_cut_mid_line(model)
    deadline = time.monotonic() + 10.0
    while model.pid in (None, old) and time.monotonic() < deadline:
        list(model.predict("", [ITEM], timeout=0.1))
        time.sleep(0.05)
    assert model.pid not in (None, old)  # (the old engine was closed before it started)
    assert path.read_bytes() == b"the model saved before"
    model.close()

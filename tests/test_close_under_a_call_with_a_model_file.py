"""close() that has to kill an ``-f`` engine because another thread's (or
task's) call still holds it: the model is not written, and close() says so,
as it does for an engine it had to terminate or found stopped."""

import asyncio
import os
import signal
import threading
import time

import pytest

from subwabbit import (AsyncVowpalWabbitProcess, VowpalWabbitDummyFormatter,
                       VowpalWabbitError, VowpalWabbitNonBlockingProcess, VowpalWabbitProcess,
                       VowpalWabbitTimeoutError)

LINES = 20000  # more than a stopped engine's pipe holds: the call waits


@pytest.mark.parametrize("cls", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess])
def test_close_that_kills_an_engine_another_thread_holds_says_its_model_was_not_written(
        cls, tmp_path):
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")
    model = cls(VowpalWabbitDummyFormatter(), ["--quiet", "-f", str(path)], io_timeout_s=None)
    pid = model.pid
    os.kill(pid, signal.SIGSTOP)  # the call below holds the engine until close() kills it
    failures = []

    def call() -> None:
        try:
            model.train("", ["|i a"] * LINES, [1] * LINES, [None] * LINES)
        except VowpalWabbitError as exc:
            failures.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    try:
        time.sleep(0.3)
        with pytest.raises(VowpalWabbitTimeoutError, match="was not written"):
            model.close(timeout=2.0)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        thread.join(10.0)
    assert failures  # the call was ended
    assert path.read_bytes() == b"the model saved before"


def test_async_close_that_kills_an_engine_another_task_holds_says_its_model_was_not_written(
        tmp_path):
    path = tmp_path / "model.vw"
    path.write_bytes(b"the model saved before")

    async def main() -> None:
        model = AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                                         ["--quiet", "-f", str(path)], io_timeout_s=None)
        await model.start()
        pid = model.pid
        os.kill(pid, signal.SIGSTOP)
        task = asyncio.ensure_future(
            model.train("", ["|i a"] * LINES, [1] * LINES, [None] * LINES))
        try:
            await asyncio.sleep(0.3)
            with pytest.raises(VowpalWabbitTimeoutError, match="was not written"):
                await model.close(timeout=2.0)
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            with pytest.raises(VowpalWabbitError):
                await task

    asyncio.run(main())
    assert path.read_bytes() == b"the model saved before"

"""An engine counts as stopped for STOPPED_GRACE_S only when it was seen
stopped throughout: an earlier, separate stop (seen by a close, a fork
request, the rest of a cut line) does not count towards the next one."""

import os
import signal
import time

from subwabbit import VowpalWabbitDummyFormatter, VowpalWabbitProcess
from subwabbit.engine_process import STOPPED_GRACE_S, _process_state


def _wait_for_state(pid: int, states: str) -> None:
    deadline = time.monotonic() + 5.0
    while _process_state(pid) not in states and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _process_state(pid) in states


def test_a_stop_seen_once_does_not_count_towards_a_later_one():
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"]) as model:
        engine = model._engine  # pylint: disable=protected-access
        os.kill(model.pid, signal.SIGSTOP)
        _wait_for_state(model.pid, "Tt")
        assert not engine.stayed_stopped(time.perf_counter())  # the count starts
        os.kill(model.pid, signal.SIGCONT)  # it runs again, unseen
        _wait_for_state(model.pid, "SR")
        time.sleep(STOPPED_GRACE_S * 2)
        os.kill(model.pid, signal.SIGSTOP)  # stopped again, a moment ago
        try:
            _wait_for_state(model.pid, "Tt")
            began = time.perf_counter()
            assert not engine.stayed_stopped(began)
            while not engine.stayed_stopped(time.perf_counter()):  # seen every 50 ms
                assert time.perf_counter() - began < 5.0
                time.sleep(0.05)
            assert time.perf_counter() - began >= STOPPED_GRACE_S
        finally:
            os.kill(model.pid, signal.SIGCONT)
        assert list(model.predict("", ["|i a"])) == [0.0]

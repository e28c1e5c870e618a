"""The driver of the blocking and nonblocking classes: runs an exchange of
:mod:`subwabbit.core` over an engine's pipes, waiting in ``select``/``poll``.

It moves bytes and waits; every decision (what to send, whose an answer is,
when a call is over) is the core's.
"""

import contextlib
import logging
import time
from typing import (Any, Callable, ContextManager, Dict, Iterator, List, Optional,
                    Sequence)

from .core.channel import PROBE_LINE, START_BLANK, Channel
from .core.exchanges import Exchange, WarmUpExchange
from .core.kinds import PredictionKind
from .engine_process import EngineProcess
from .errors import VowpalWabbitEngineExitedError, VowpalWabbitProtocolError
from .transfer import check_probe_result, file_wait_error, pump, startup_probe

logger = logging.getLogger("subwabbit")

_clock = time.perf_counter

#: The longest a call waits for its engine's pipes before it steps again,
#: when other threads share the object (a ``lock`` is given to
#: :func:`drive`): a thread that ends this call (a new call of the thread
#: that began it, while another thread finishes its iterator) cannot wake
#: it, and a call that went to sleep just after the other one took the
#: engine's last answers would sleep until ``io_timeout_s`` (30 s) before
#: it learnt that it had ended.
SHARED_WAIT_S = 0.05


def drive(engine: EngineProcess, exchange: Exchange,
          detailed: Optional[Dict[str, List[Any]]] = None,
          lock: Optional[ContextManager[Any]] = None) -> Iterator[List[Any]]:
    """Run ``exchange`` to its end, yielding its results as they come.

    The exchange is not ended here: the caller ends it (in a ``finally``),
    so that an abandoned generator leaves the channel exact.

    :param lock: held while a step works on the channel (not while it
        waits for the pipes, nor while the caller has the results)
    """
    channel = exchange.channel
    status_deadline = exchange.end_at
    reads = engine.prints_answers
    guard = contextlib.nullcontext() if lock is None else lock
    # Whether stdout may hold something: a read that finds the pipe empty is a
    # system call for nothing (and, after each write, it nearly always did), so
    # after one, read again only once the wait says a pipe is ready.
    may_read = True
    while True:
        moved = True
        with guard:
            results = exchange.step(_clock())
            if not results and not exchange.done:
                received = channel.bytes_received
                moved = pump(engine, channel, status_deadline, detailed, read=may_read)
                if may_read and channel.bytes_received == received:
                    may_read = False
        if results:
            yield results
            # The caller held the results for as long as it liked: the engine
            # was not silent meanwhile (a pause longer than idle_s raised
            # VowpalWabbitTimeoutError, and the process counted as failed).
            exchange.caller_returned()
            continue  # step again first: the caller may have started another call meanwhile
        if exchange.done:
            return
        if not moved:
            wake = exchange.wake_at()
            if lock is not None:
                recheck = _clock() + SHARED_WAIT_S
                if wake is None or wake > recheck:
                    wake = recheck
            may_read = engine.wait(reads, channel.unwritten_bytes > 0, wake)


def run(engine: EngineProcess, exchange: Exchange,
        lock: Optional[ContextManager[Any]] = None) -> List[Any]:
    """Run ``exchange`` to its end and return all its results (``lock``: see
    :func:`drive`)."""
    results: List[Any] = []
    try:
        for part in drive(engine, exchange, lock=lock):
            results += part
    finally:
        exchange.end()
    return results


def start_engine(argv: List[str], outputs_per_line: int, startup_timeout_s: float,
                 on_spawn: Optional[Callable[[EngineProcess], None]] = None,
                 kind: Optional[PredictionKind] = None, blank: bool = False) -> EngineProcess:
    """Spawn an engine and check that it answers (or, write-only, that it reads).

    :param outputs_per_line: answer lines per example (0: write-only)
    :param on_spawn: called with the engine as soon as it is spawned (so that
        another thread can kill it while it starts)
    :param kind: the model's kind, whose shape the probe answers must have
        (``None``: any shape, as in audit mode)
    :param blank: send no probe: check only that the engine reads
        :data:`~subwabbit.core.channel.START_BLANK` (an engine that the
        probes would teach, see :func:`~subwabbit.core.kinds.probes_would_teach`)
    :raises VowpalWabbitStartupError: when the engine cannot run, exits, says
        it failed, or shows no sign of life within ``startup_timeout_s`` (the
        error then comes within a few milliseconds of the timeout)
    """
    deadline = _clock() + startup_timeout_s
    engine = EngineProcess(argv, prints_answers=outputs_per_line > 0)
    if on_spawn is not None:
        on_spawn(engine)
    try:
        if blank:
            await_input_consumed(engine, deadline, START_BLANK)
            engine.started_with_blank = True
        elif outputs_per_line:
            check_answers_probe(engine, outputs_per_line, deadline, kind)
        else:
            await_input_consumed(engine, deadline)
        if not outputs_per_line:
            engine.drain_stdout_in_background()
    except BaseException:
        engine.abort()
        raise
    return engine


def check_answers_probe(engine: EngineProcess, outputs_per_line: int, deadline: float,
                        kind: Optional[PredictionKind] = None) -> None:
    """Send the start-up probes and wait for their answers until ``deadline``.

    :raises VowpalWabbitStartupError: when the engine fails, stays silent, or
        answers in another shape than ``kind`` prints
    """
    exchange = startup_probe(outputs_per_line, deadline, kind)
    mismatch = None
    try:
        run(engine, exchange)
    except VowpalWabbitEngineExitedError as exc:
        raise engine.exited_at_startup() from exc
    except VowpalWabbitProtocolError as exc:
        mismatch = exc
    check_probe_result(engine, exchange, mismatch, kind)


def warm_up(engine: EngineProcess, lines: Sequence[str], outputs_per_line: int,
            deadline: float, budget_end: Optional[float] = None, rounds: int = 2,
            largest_chunk: int = 0) -> Channel:
    """Have a started engine predict ``lines`` (``rounds`` times over, in
    chunks growing to ``largest_chunk``, as long as they fit before
    ``budget_end``) and drop the answers, so that its first calls do not pay
    for its first lines (see
    :class:`~subwabbit.core.exchanges.WarmUpExchange`).

    :returns: the channel to serve the engine on: a chunk still unanswered
        at ``deadline`` is owed to no call on it, so that its answers are
        discarded when they come (an engine slow per line is not failed for
        its warm-up)
    :raises VowpalWabbitStartupError: when the engine exits or prints what
        its lines do not call for
    """
    channel = Channel(outputs_per_line)
    exchange = WarmUpExchange(channel, channel.begin(), deadline, lines, rounds,
                              budget_end, largest_chunk)
    try:
        run(engine, exchange)  # (ends the exchange's call: what it is owed is stale)
    except VowpalWabbitEngineExitedError as exc:
        raise engine.exited_at_startup() from exc
    except VowpalWabbitProtocolError as exc:
        raise engine.startup_error(f"the vw engine's answers to its warm-up lines: {exc.message}",
                                   wait_for_exit=False) from exc
    if exchange.timed_out:
        logger.info("vw[%d] had not answered its warm-up lines by the start-up timeout: "
                    "it serves with %d of them left to answer", engine.pid,
                    channel.stale_lines)
    return channel


def await_input_consumed(engine: EngineProcess, deadline: float,
                         data: bytes = PROBE_LINE) -> None:
    """Write-only start-up check: the engine reads stdin only once its
    arguments are accepted and its model loaded, so wait until it has read
    ``data`` (a probe example, or :data:`~subwabbit.core.channel.START_BLANK`),
    or exited."""
    unwritten = memoryview(data)
    delay = 0.0005
    output = b""
    while True:
        try:
            if unwritten:
                unwritten = unwritten[engine.write_some(unwritten):]
        except VowpalWabbitEngineExitedError as exc:
            raise engine.exited_at_startup(output) from exc
        unread = engine.unread_input_bytes()
        if not unwritten and not unread:
            return
        if engine.wait(True, False, min(deadline, _clock() + delay)):
            try:
                chunk = engine.read_some()
            except VowpalWabbitEngineExitedError as exc:
                raise engine.exited_at_startup(output, read_s=0.0) from exc
            output += chunk
        if engine.returncode is not None:
            raise engine.exited_at_startup(output)
        if _clock() >= deadline:
            raise engine.startup_error(
                "the vw engine did not start reading examples within the start-up timeout",
                output, wait_for_exit=False)
        delay = min(delay * 2, 0.01)


def wait_for_file(engine: EngineProcess, exists: Callable[[], bool], deadline: Optional[float],
                  what: str) -> None:
    """Sleep-poll until ``exists()`` (a write-only engine's save has no answer).

    :raises VowpalWabbitEngineExitedError: when the engine exits meanwhile
    :raises VowpalWabbitTimeoutError: when ``deadline`` passes first
    """
    delay = 0.0005
    while not exists():
        error = file_wait_error(engine, deadline, what)
        if error is not None:
            raise error
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


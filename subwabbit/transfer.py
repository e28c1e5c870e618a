"""Moving bytes between an engine's pipes and its channel, for every driver.

The engine's pipes are non-blocking, so one write and one read never wait;
the sync and asyncio drivers call :func:`pump` alike and differ only in how
they wait between pumps.
"""

import time
from typing import Any, Dict, List, Optional

from .core.channel import Channel
from .core.exchanges import ProbeExchange
from .core.kinds import PredictionKind
from .engine_process import STOPPED_POLL_S, EngineProcess
from .errors import (VowpalWabbitEngineExitedError, VowpalWabbitError,
                     VowpalWabbitProtocolError, VowpalWabbitTimeoutError)

_clock = time.perf_counter

#: Errors after which an engine's output can no longer be matched to calls.
ENGINE_FAILURES = (VowpalWabbitEngineExitedError, VowpalWabbitProtocolError,
                   VowpalWabbitTimeoutError)

def torn_channel_error() -> VowpalWabbitProtocolError:
    """The failure of an engine whose channel is :attr:`~subwabbit.core.channel.Channel.torn`."""
    return VowpalWabbitProtocolError(
        "a call was interrupted (by a KeyboardInterrupt, say) while it moved lines to or from "
        "the vw engine: which answer is whose is no longer known, so the engine serves no "
        "other call")


def unsaved_model_error(engine: EngineProcess, stopped: bool = False,
                        timeout_s: float = 0.0) -> VowpalWabbitError:
    """The failure of closing an engine started with ``-f`` whose input
    could not be made to end on a whole line (:func:`finish_example`: a
    write was cut short, so its input may end in a cut example, which it
    would learn into the model it saves, or the engine did not take the rest
    of a cut example in time): it is killed instead, and saves nothing.

    :param stopped: the engine did not take the rest because it stayed
        stopped (SIGSTOP, a debugger): the error is then the one of closing
        any stopped ``-f`` engine, a
        :class:`~subwabbit.errors.VowpalWabbitTimeoutError` saying so
        (:meth:`~subwabbit.engine_process.EngineProcess.final_model_lost`)
    :param timeout_s: the close's timeout, for that error
    """
    if stopped:
        return engine.final_model_lost(timeout_s, stopped=True)
    return VowpalWabbitProtocolError(
        "the vw engine's -f model was not saved: a call was interrupted in the middle of an "
        "example, and the rest of that example could not be written (the write itself was cut "
        "short, or the engine did not take the rest in time), so the engine, whose input would "
        "have ended in a cut example, was killed; a model file from before was left as it was",
        argv=engine.argv, returncode=engine.proc.returncode, stderr_tail=engine.stderr_tail())


def killed_under_a_call_error(engine: EngineProcess,
                              timeout_s: float) -> VowpalWabbitTimeoutError:
    """The failure of a ``close()`` that had to kill an engine started with
    ``-f`` because another thread's (or task's) call still held it after
    half of the close's timeout: its model is not written."""
    return VowpalWabbitTimeoutError(
        "close() killed the vw engine: another call still held it after half of close()'s "
        f"timeout of {timeout_s:g} s, so its -f model was not written (a model file from "
        "before was left as it was); end the calls first, or pass close() a longer timeout",
        argv=engine.argv, returncode=engine.proc.returncode,
        stderr_tail=engine.stderr_tail())


def stuck_engine_error(engine: EngineProcess, channel: Channel, idle_s: Optional[float],
                       argv: Any = None) -> Optional[VowpalWabbitError]:
    """Between calls: the failure of an engine that has owed answers and
    printed nothing for ``idle_s`` (:meth:`Channel.quiet_for
    <subwabbit.core.channel.Channel.quiet_for>`), or ``None``. Calls with
    deadlines end long before ``idle_s``, so a stopped engine is found here,
    not by them. Nobody reads the pipe between calls: what the engine
    printed meanwhile is read first (answers of ended calls, discarded), and
    only an engine with still nothing to read, or whose pipe failed, is stuck.

    :param argv: the engine's command, for the error
    """
    now = _clock()
    channel.note_progress(now)
    if not channel.quiet_for(now, idle_s):
        return None
    try:
        pump(engine, channel, now)
    except ENGINE_FAILURES as exc:
        return exc
    channel.note_progress(now)
    if not channel.quiet_for(now, idle_s):
        return None  # it was answering
    return VowpalWabbitTimeoutError(
        f"the vw engine owed {channel.in_flight_lines} answers and printed nothing for "
        f"{idle_s:g} s (io_timeout_s); it may be stopped or stuck", argv=argv)


#: The longest an event-loop driver works without giving the loop a turn.
YIELD_AFTER_S = 0.0005


def pump(engine: EngineProcess, channel: Channel, status_deadline: Optional[float],
         detailed: Optional[Dict[str, List[Any]]] = None, read: bool = True,
         write: bool = True) -> bool:
    """Write what the stdin pipe takes and read what stdout holds, once each.

    :param status_deadline: how long an error report may wait for a dead
        engine's exit status (the call's hard deadline, if any)
    :param detailed: when given, receives ``sending_*``/``receiving_*`` entries
    :param read: whether to read (``False``: only write, when the caller knows
        that stdout was empty a moment ago and has not waited since)
    :param write: whether to write (``False``: only read, when the exchange
        has yet to decide what may still be written: the write cut-off)
    :returns: whether any byte moved
    :raises VowpalWabbitEngineExitedError: at EOF or a broken pipe
    """
    moved = False
    if write and channel.unwritten_bytes:
        began = _clock() if detailed is not None else 0.0
        written = channel.write_with(lambda view: engine.write_some(view, status_deadline))
        moved = written > 0
        if detailed is not None:
            now = _clock()
            detailed["sending_lines_time"].append((now, now - began))
            if "sending_bytes" in detailed:
                detailed["sending_bytes"].append((now, written))
    if read and engine.prints_answers:
        began = _clock() if detailed is not None else 0.0
        data = channel.read_with(engine.read_some, status_deadline)
        if data:
            moved = True
        if detailed is not None:
            now = _clock()
            detailed["receiving_lines_time"].append((now, now - began))
            if "receiving_bytes" in detailed:
                detailed["receiving_bytes"].append((now, len(data)))
                detailed["pending_lines"].append((now, channel.in_flight_lines))
    return moved


def finish_example_step(engine: EngineProcess, channel: Channel,
                        deadline: float) -> Optional[bool]:
    """One turn of :func:`finish_example`, for the drivers that wait their
    own way between turns (the event loop's): write what the engine takes
    of the rest of a partly written example, reading and dropping what it
    prints.

    :returns: ``True`` when the engine's input ends on a whole line
        (:attr:`~subwabbit.core.channel.Channel.input_ends_whole` on a
        :attr:`~subwabbit.core.channel.Channel.torn` channel, to which
        nothing is written: its bytes are unknown), ``False`` when it cannot
        be made to (the deadline passed, the engine stayed stopped or
        ended), ``None`` when the engine took nothing yet: wait for its
        pipes, then take another turn
    """
    if channel.torn:  # (by a read, its input intact, or by a write, its input unknown)
        return channel.input_ends_whole
    try:
        while channel.unwritten_bytes:
            if not pump(engine, channel, deadline):
                now = _clock()
                if now >= deadline or engine.stayed_stopped(now):
                    return False
                return None
    except VowpalWabbitError:  # it ended: closing it reports why
        return False
    return True


def finish_example(engine: EngineProcess, channel: Channel, deadline: float) -> bool:
    """Before the input of an engine that saves a ``-f`` model is closed:
    write the rest of the example a call left partly written (interrupted in
    the middle of a line, say), so that the engine does not take the cut
    line, at the end of its input, for a whole example and learn it into the
    model it saves. What the engine prints meanwhile is read and dropped
    (the channel was let go). Turn by turn (:func:`finish_example_step`).

    Nothing is written to a :attr:`~subwabbit.core.channel.Channel.torn`
    channel, whose bytes are unknown. When this returns ``False`` the caller
    kills the engine, so that it saves nothing
    (:func:`unsaved_model_error`).

    :param deadline: a :func:`time.perf_counter` value: an engine that does
        not take the bytes by then is not given them, nor one that stays
        stopped (SIGSTOP, a debugger) for
        :data:`~subwabbit.engine_process.STOPPED_GRACE_S` meanwhile
        (:meth:`~subwabbit.engine_process.EngineProcess.stayed_stopped`:
        it would never take them)
    :returns: whether the engine's input ends on a whole line: every byte
        the channel held was written, and no write was cut short
        (:attr:`~subwabbit.core.channel.Channel.input_torn`)
    """
    while True:
        done = finish_example_step(engine, channel, deadline)
        if done is not None:
            return done
        engine.wait(engine.prints_answers, True, min(deadline, _clock() + STOPPED_POLL_S))


#: How many probes the start-up check sends: with two, an engine that prints
#: more or fewer lines per example than the model's kind shows it at once.
STARTUP_PROBES = 2


def startup_probe(outputs_per_line: int, deadline: float,
                  kind: Optional[PredictionKind]) -> ProbeExchange:
    """The start-up check of a new engine: probes on a channel of their own,
    whose answers must have the shape of ``kind`` (``None``: any, as in
    audit mode)."""
    channel = Channel(outputs_per_line)
    return ProbeExchange(channel, channel.begin(), deadline, None, probes=STARTUP_PROBES,
                         check=None if kind is None else kind.check_probe_answers)


def check_probe_result(engine: EngineProcess, exchange: ProbeExchange,
                       mismatch: Optional[VowpalWabbitProtocolError] = None,
                       kind: Optional[PredictionKind] = None) -> None:
    """Raise the start-up error a finished probe exchange calls for, if any.

    :param mismatch: the error raised while the probes were answered (the
        answers did not have the shape of the model's kind, or there were
        more lines than it prints)
    :param kind: the model's kind, for the message
    """
    if exchange.timed_out and mismatch is None:
        raise engine.startup_error(
            "the vw engine did not answer a probe example during start-up "
            "(is the model multi-line, or is it still loading?)", wait_for_exit=False)
    answer = exchange.answer
    if answer and answer[0].startswith(b"["):
        # A real vw prints fatal errors as log lines on stdout, then exits.
        output = b"\n".join(answer) + b"\n" + engine.read_until_eof(_clock() + 2.0)
        raise engine.startup_error("the vw engine failed during start-up", output)
    if mismatch is not None:
        message = mismatch.message
        if kind is not None and "prediction_type=" not in message:
            message += (f"; the engine prints more lines per example than a {kind.name!r} "
                        f"model ({kind.origin}). A model file carries its reductions: pass "
                        "prediction_type= to say which kind of model it is")
        raise engine.startup_error(message, b"\n".join(answer), wait_for_exit=False)


def file_wait_error(engine: EngineProcess, deadline: Optional[float],
                    what: str) -> Optional[VowpalWabbitError]:
    """What ends a wait for a file the engine writes (a save with no answer)
    before the file appears: its exit, or ``deadline`` passing (``None``
    while neither has happened).

    :param what: what the wait is for, for the message (``"saving the model to PATH"``)
    """
    if engine.returncode is not None:
        return engine.exited_error(f"the vw engine exited while {what}")
    if deadline is not None and _clock() >= deadline:
        return VowpalWabbitTimeoutError(f"timed out {what}", argv=engine.argv,
                                        stderr_tail=engine.stderr_tail())
    return None

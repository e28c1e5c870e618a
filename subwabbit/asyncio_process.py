"""The asyncio client: the nonblocking class's guarantees for ``async def`` code.

It runs the same exchanges of :mod:`subwabbit.core` as the other classes and
only differs in how it waits: on the engine's pipes with the event loop
(``add_reader``/``add_writer``), never in a blocking call and never in a
thread per call.
"""

import asyncio
import collections
import logging
import os
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .base import Label
from .client import (DEFAULT_IO_TIMEOUT_S, ClientBase, MetricsHook, check_per_item,
                     let_go_after_unhooked_fork)
from .command import VwArgs
from .core.channel import START_BLANK, Channel
from .core.exchanges import (AuditExchange, CleanupExchange, Exchange, Pacing, PredictExchange,
                             SendExchange, format_common_part,
                             new_predict_exchange)
from .deadlines import deadline_from_timeout, required_seconds, warn_if_milliseconds
from .asyncio_support import close_left_behind, hand_off, hand_off_closing, wait_for_closing
from .engine_process import EngineProcess, shutdown_schedule
from .unserved_engines import RetiringEngines, StartingEngines
from .errors import (VowpalWabbitBusyError, VowpalWabbitEngineExitedError, VowpalWabbitError,
                     VowpalWabbitProtocolError, VowpalWabbitTimeoutError)
from .lines import audit_line, parse_scalar
from .nonblocking import (DEFAULT_BATCH_SIZE, DEFAULT_MAX_PENDING_LINES, DEFAULT_WRITE_CUTOFF_S,
                          check_deadline_settings)
from .saving import ModelSave, SavePath
from .transfer import (ENGINE_FAILURES, YIELD_AFTER_S, check_probe_result, file_wait_error,
                       finish_example_step, killed_under_a_call_error, pump, startup_probe,
                       stuck_engine_error, torn_channel_error, unsaved_model_error)

logger = logging.getLogger("subwabbit")

_clock = time.perf_counter

#: The event loop's selector sleeps in whole milliseconds (rounded up), so a
#: wait that should end at a deadline is set this much earlier, and the last
#: stretch is covered by yielding to the loop without sleeping.
_LOOP_TIMER_SLACK_S = 0.001


class _FifoTurn:
    """Calls on one object, one at a time, in arrival order; a waiter gives
    up at its own deadline (or when cancelled) without disturbing the others.

    Unlike :class:`asyncio.Lock` it belongs to no event loop (each waiter
    waits on a future of its own loop): an object made and used on one loop
    may be used on another after that one ended, or at the same time from
    another thread's loop (a waiter of another loop is woken through
    :meth:`~asyncio.loop.call_soon_threadsafe`)."""

    def __init__(self) -> None:
        self._busy = False
        self._waiters: Deque["asyncio.Future[bool]"] = collections.deque()
        self._when_free: List[Callable[[], None]] = []
        #: the turn's state, for calls on event loops of several threads
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        """Whether a call holds the turn."""
        return self._busy

    def call_when_free(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once no call holds the turn (now, if none does)."""
        with self._lock:
            if self._busy:
                self._when_free.append(callback)
                return
        callback()

    async def acquire(self, until: Optional[float]) -> bool:
        """Wait for the turn until ``until`` (a :func:`time.perf_counter` value).

        :returns: ``False`` when ``until`` passed first
        """
        with self._lock:
            if not self._busy and not self._waiters:
                self._busy = True
                return True
            waiter: "asyncio.Future[bool]" = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
        timeout = None if until is None else max(0.0, until - _clock())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        except asyncio.CancelledError:
            if not self._withdraw(waiter):
                self.release()  # granted as the task was cancelled: pass it on
            raise
        return not self._withdraw(waiter)

    def _withdraw(self, waiter: "asyncio.Future[bool]") -> bool:
        """Stop ``waiter`` waiting, unless it was granted the turn (by
        :meth:`release`, perhaps in another thread, its wake-up still to come).

        :returns: whether it was still waiting
        """
        with self._lock:
            try:
                self._waiters.remove(waiter)
            except ValueError:
                return False
        waiter.cancel()
        return True

    async def __aenter__(self) -> None:
        """``async with turn:`` waits for the turn with no time limit."""
        await self.acquire(None)

    async def __aexit__(self, *exc_info: Any) -> None:
        self.release()

    def release(self) -> None:
        """Pass the turn to the oldest waiter still waiting, or free it (a
        waiter whose event loop was closed waits no more)."""
        with self._lock:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done() and _wake(waiter):
                    return
            self._busy = False
            callbacks, self._when_free = self._when_free, []
        for callback in callbacks:
            callback()


def _wake(waiter: "asyncio.Future[bool]") -> bool:
    """Set ``waiter`` done on its own event loop: at once when that is the
    running one, else through the loop's ``call_soon_threadsafe`` (a waiter
    on another thread's loop).

    :returns: ``False`` when its loop is closed (no one waits on it any more)
    """
    loop = waiter.get_loop()
    if loop.is_closed():
        return False
    try:
        running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is running:
        waiter.set_result(True)
        return True
    try:
        loop.call_soon_threadsafe(_set_granted, waiter)
    except RuntimeError:  # closed meanwhile
        return False
    return True


def _set_granted(waiter: "asyncio.Future[bool]") -> None:
    if not waiter.done():
        waiter.set_result(True)


async def _finish_example(engine: EngineProcess, channel: Channel, deadline: float) -> bool:
    """:func:`~subwabbit.transfer.finish_example` on the event loop: the
    rest of a partly written example goes to the engine before its input
    closes, by ``deadline`` at the latest, turn by turn
    (:func:`~subwabbit.transfer.finish_example_step`), yielding to the loop
    in between.

    :returns: whether the engine's input ends on a whole line (else the
        caller kills it, so that it saves nothing)
    """
    while True:
        done = finish_example_step(engine, channel, deadline)
        if done is not None:
            return done
        await asyncio.sleep(0.001)


class AsyncVowpalWabbitProcess(ClientBase):
    """A VW model served by a vw engine for asyncio code, with hard deadlines.

    Use it as ``async with AsyncVowpalWabbitProcess(formatter, vw_args) as model``
    (or ``await model.start()`` and ``await model.close()``)::

        scores = await model.predict(common_features, items_features, timeout=0.010)
        await model.train(common_features, items_features, labels, weights)
        await model.save(path)

    ``predict`` returns a list: in item order, the predictions the engine gave
    by the deadline. It formats items in batches and waits on the pipes with
    the event loop, giving the loop a turn at least every half millisecond.
    Many tasks may await calls on one object at once: they are served one at a
    time in arrival order, each within its own deadline (a task whose deadline
    passes while it waits gets ``[]``, with ``metrics['waited_for_other_call']``).
    A task cancelled mid-call leaves the object exact: what it left in flight
    is discarded as it arrives.

    Linux only. The arguments are those of
    :class:`~subwabbit.nonblocking.VowpalWabbitNonBlockingProcess`. With
    ``restart_on_crash=True`` a replacement engine starts in the background as
    soon as the engine fails; calls return by their deadlines meanwhile
    (``[]``, with ``metrics['restarts'] == 1``). An object used in a process
    forked after its creation starts its own engine the same way (or raises,
    with ``restart_after_fork=False``).
    """

    #: Keep in flight no more lines than the engine answers by the deadline
    #: at its pace (see :attr:`subwabbit.core.exchanges.Pacing.reach_at_deadline`):
    #: with a model at a few hundred µs a line, up to ``max_pending_lines``
    #: in flight outlasted a 10 ms call and most calls returned nothing.
    #: ``False`` on an instance keeps ``max_pending_lines`` in flight to the
    #: write cut-off, as earlier 3.0 code did (benchmarks compare the two).
    reach_at_deadline = True

    _detailed_keys = ("sending_bytes", "receiving_bytes", "pending_lines",
                      "generating_lines_time", "sending_lines_time", "receiving_lines_time")

    def __init__(self, formatter: Any, vw_args: VwArgs, batch_size: int = DEFAULT_BATCH_SIZE,
                 audit_mode: bool = False, max_pending_lines: int = DEFAULT_MAX_PENDING_LINES,
                 write_timeout_ms: Optional[float] = None,
                 pipe_buffer_size_bytes: Optional[int] = None,
                 vw_command: Union[str, Sequence[str], None] = None, *,
                 write_cutoff_s: float = DEFAULT_WRITE_CUTOFF_S,
                 metrics_hook: Optional[MetricsHook] = None, startup_timeout_s: float = 60.0,
                 io_timeout_s: Optional[float] = DEFAULT_IO_TIMEOUT_S,
                 restart_on_crash: bool = False, restart_after_fork: bool = True,
                 prediction_type: Optional[str] = None) -> None:
        self._engine: Optional[EngineProcess] = None
        self._channel: Optional[Channel] = None
        self._closed = False
        self.write_cutoff_s, self.max_pending_lines, self.pipe_buffer_size_bytes = \
            check_deadline_settings(max_pending_lines, pipe_buffer_size_bytes, write_timeout_ms,
                                    write_cutoff_s)
        self._configure(formatter, vw_args, batch_size, write_only=False, audit_mode=audit_mode,
                        vw_command=vw_command, metrics_hook=metrics_hook,
                        startup_timeout_s=startup_timeout_s, io_timeout_s=io_timeout_s,
                        restart_on_crash=restart_on_crash, restart_after_fork=restart_after_fork,
                        prediction_type=prediction_type)
        self._broken: Optional[BaseException] = None
        self._turn = _FifoTurn()
        #: taken by reload(), so that overlapping reloads switch in the order asked for
        self._reload_turn = _FifoTurn()
        self._starting: Optional["asyncio.Task[EngineProcess]"] = None
        #: engines spawned for this object and not (yet) its engine (a
        #: reload's or a restart's, starting or waiting for the turn): close() kills them
        self._new_engines = StartingEngines()
        #: the spawns on the executor under way (close() waits for them)
        self._spawns: "set[asyncio.Future[EngineProcess]]" = set()
        #: engines reload() replaced, closing in the background: close() ends
        #: them, and waits for the tasks closing them
        self._retiring = RetiringEngines()
        self._retire_tasks: "set[asyncio.Future[None]]" = set()
        self._closing: Optional["asyncio.Future[None]"] = None
        self._ever_started = False

    def _pacing(self) -> Pacing:
        return Pacing(batch_size=self.batch_size, max_in_flight_lines=self.max_pending_lines,
                      write_cutoff_s=self.write_cutoff_s, hard_deadline=True,
                      reach_at_deadline=self.reach_at_deadline)

    # -------------------------------------------------------------- status

    @property
    def pid(self) -> Optional[int]:
        """The engine's process id (``None`` before :meth:`start`)."""
        return self._engine.pid if self._engine is not None else None

    @property
    def vw_process(self) -> Optional[Any]:
        """The engine's :class:`subprocess.Popen`, or ``None``."""
        return self._engine.proc if self._engine is not None else None

    @property
    def pending_lines(self) -> int:
        """Examples sent (or queued) to the engine whose predictions have not been read."""
        return self._channel.in_flight_lines if self._channel is not None else 0

    def __repr__(self) -> str:
        if self._engine is None:
            state = "closed" if self._closed else "not started"
            return f"<{type(self).__name__} {state} argv={self.argv!r}>"
        return (f"<{type(self).__name__} pid={self._engine.pid} {self._engine.describe()} "
                f"pending_lines={self.pending_lines} argv={self.argv!r}>")

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> "AsyncVowpalWabbitProcess":
        """Start the engine and wait (without blocking the loop) until it answers.

        It takes the object's turn, as a call does, so that it never races a
        call, :meth:`restart` or :meth:`reload` that is starting an engine:
        whichever comes first starts it, and the others find it started.

        :raises VowpalWabbitStartupError: as the other classes' constructors
        :raises VowpalWabbitError: when :meth:`close` ran meanwhile
        :raises VowpalWabbitBusyError: when calls held the object for more
            than ``io_timeout_s``
        """
        let_go_after_unhooked_fork()
        if self._closed:
            raise self._closed_error()
        if self._engine is not None:
            return self
        cancels_before = _cancel_requests()
        limit = None if self.io_timeout_s is None else _clock() + self.io_timeout_s
        if not await self._turn.acquire(limit):
            raise VowpalWabbitBusyError("another task's call held the object too long",
                                        argv=self.argv)
        try:
            if self._closed:
                raise self._closed_error()
            if self._engine is not None:  # started by whoever had the turn before
                return self
            starting = self._start_under_way()
            if starting is None:
                starting = self._starting = asyncio.ensure_future(self._start_engine())
            kept = False
            try:
                engine = await asyncio.shield(starting)
            except asyncio.CancelledError:
                self._raise_if_start_stopped(starting, cancels_before)
                # This task's own cancellation. A start that ended with an
                # engine just as it came stays for the next call (or close())
                # to take: dropped, that engine ran on, served by nobody.
                kept = _gave_engine(starting)
                raise
            finally:
                if starting.done() and not kept:
                    self._starting = None
            self._adopt(engine)
        finally:
            self._turn.release()
        return self

    def _raise_if_start_stopped(self, starting: "asyncio.Future[EngineProcess]",
                                cancels_before: int) -> None:
        """A start that :meth:`close` stopped is not the waiting task's own
        cancellation: it raises what a call on a closed object raises.

        :param cancels_before: the task's pending cancellation requests when
            it began waiting (:func:`_cancel_requests`)
        :raises VowpalWabbitError: when ``starting`` was cancelled and this
            task is not being cancelled itself
        """
        if starting.cancelled() and _cancel_requests() <= cancels_before:
            raise self._closed_while_starting()

    async def __aenter__(self) -> "AsyncVowpalWabbitProcess":
        return await self.start()

    async def __aexit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        try:
            await self.close()
        except VowpalWabbitError:
            if exc_type is None:
                raise
            logger.exception("closing the vw engine failed while another exception propagated")

    def _adopt(self, engine: EngineProcess) -> None:
        if self._closed:
            # close() ran while this engine started (it does not wait for a
            # restart's start): the engine must not outlive the object.
            _abort_off_loop(engine)
            raise self._closed_while_starting()
        self._abandon_channel("the process moved to another engine")
        self._engine = engine
        self._new_engines.handed_over([engine])
        self._channel = self._new_channel(engine.started_with_blank)
        self._owner_pid = engine.owner_pid
        self._broken = None
        if self._ever_started:
            self._restart_count += 1
        self._ever_started = True

    async def _start_engine(self, argv: Optional[List[str]] = None,
                            probes_teach: Optional[str] = None) -> EngineProcess:
        """Start an engine (``argv`` and ``probes_teach``: a reload's, else this
        object's) and check it, without probes if they would teach it."""
        if argv is None:
            argv, probes_teach = self.argv, self._probes_teach
        deadline = _clock() + self.startup_timeout_s
        # Spawning (fork/exec, the stderr reader thread) takes milliseconds:
        # done on the loop's executor, so that it never holds the loop.
        loop = asyncio.get_running_loop()
        spawn = loop.run_in_executor(None, self._spawn, argv)
        self._spawns.add(spawn)
        spawn.add_done_callback(self._spawns.discard)
        try:
            engine = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            spawn.add_done_callback(_abort_spawned)
            raise
        try:
            if self.pipe_buffer_size_bytes is not None:
                engine.set_pipe_size(self.pipe_buffer_size_bytes)
            if probes_teach is not None:
                await self._await_blank_read(engine, deadline)
                engine.started_with_blank = True
                return engine
            exchange = startup_probe(self._outputs_per_line, deadline, self._probe_kind)
            mismatch = None
            try:
                await self._drive(engine, exchange)
            except VowpalWabbitEngineExitedError as exc:
                await self._await_exit(engine, _clock() + 1.0)
                raise engine.exited_at_startup(read_s=0.1) from exc
            except VowpalWabbitProtocolError as exc:
                mismatch = exc
            finally:
                exchange.end()
            check_probe_result(engine, exchange, mismatch, self._probe_kind)
        except BaseException as exc:
            _abort_off_loop(engine)
            if self._closed and isinstance(exc, VowpalWabbitError):  # close() killed it
                raise self._closed_while_starting() from exc
            raise
        return engine

    async def close(self, timeout: float = 30.0) -> None:
        """Stop the engine without blocking the loop: close its input so that
        it finishes (and writes a ``-f`` model), then SIGTERM and SIGKILL it if
        it has not exited near the end of ``timeout``. Idempotent: a second
        call waits for the first one's closing.

        Cancelling ``close()`` (``asyncio.wait_for``, a shutdown) does not
        stop the closing: it goes on in the background, and what remains is
        handed to the loop's executor if the closing itself is cancelled.

        :raises VowpalWabbitEngineExitedError: when the engine exits with an
            error of its own that no earlier call reported
        :raises VowpalWabbitProtocolError: when an engine started with ``-f``
            was killed, unsaved, because a call was interrupted inside a write
            to it (see :func:`~subwabbit.transfer.unsaved_model_error`)
        """
        timeout = required_seconds(timeout, "timeout")
        let_go_after_unhooked_fork()
        if self._closing is not None:
            if not await wait_for_closing(self._closing, timeout):
                logger.warning("close(): the first close() of %r never ended (its event loop "
                               "was closed); closing the engine from this loop", self)
                engine = self._engine
                if engine is not None and not engine.closed:
                    await close_left_behind([engine], [], timeout)
            return
        if self._closed:
            return
        self._closed = True
        self._closing = asyncio.ensure_future(self._close_engine(_clock(), timeout))
        self._closing.add_done_callback(_note_close_failure)
        await asyncio.shield(self._closing)

    async def _close_engine(self, began: float, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        spawns = [spawn for spawn in self._spawns if spawn.get_loop() is loop]
        if spawns:  # (a few milliseconds)
            await asyncio.wait(spawns, timeout=max(0.0, began + timeout / 4 - _clock()))
        # (its spawns were awaited above, on this loop)
        starting = self._new_engines.kill_all(spawn_wait_s=0.0)
        await self._close_own_engine(began, timeout)
        for engine in starting:  # (their starters close their pipes)
            await self._await_exit(engine, began + timeout)
        await self._end_retiring(began + timeout)

    async def _end_retiring(self, deadline: float) -> None:
        """The engines that reload() replaced are closed in the background
        within the reload's timeout: those still running are ended by
        ``deadline`` (:meth:`RetiringEngines.end
        <subwabbit.unserved_engines.RetiringEngines.end>`, off the loop),
        and the tasks closing them awaited."""
        loop = asyncio.get_running_loop()
        ending = hand_off(loop, self._retiring.end, deadline)
        tasks = [task for task in self._retire_tasks if task.get_loop() is loop]
        if ending is not None:
            tasks.append(ending)
        if tasks:  # (they end as their engines have)
            await asyncio.wait(tasks, timeout=max(0.0, deadline - _clock()))

    def _spawn(self, argv: List[str]) -> EngineProcess:
        """Spawn an engine for this object (on the executor), noted for
        close(), or killed at once if close() came first."""
        engine = EngineProcess(argv)
        self._new_engines.note(engine)
        return engine

    async def _close_own_engine(self, began: float, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        await self._cancel_start()
        engine = self._engine
        if engine is None or engine.closed:
            return
        held = killed = False
        try:
            if self._turn.busy and engine.returncode is None:
                # A call in another task is under way: let it meet a dead engine.
                held = await self._turn.acquire(began + timeout / 2)
                if not held:
                    logger.warning("close(): another task's call still holds %r; killing the "
                                   "engine", self)
                    killed = engine.returncode is None
                    engine.kill()
                    # The call meets the dead engine and gives the turn back:
                    # its pipes must stay open until then (closed under its
                    # wait, they left it waiting for good).
                    held = await self._turn.acquire(began + timeout * 0.75)
                    if not held:
                        self._abandon_channel("the process was closed")
                        self._turn.call_when_free(engine.close_killed)
                        if killed and self._writes_final_model:
                            raise killed_under_a_call_error(engine, timeout)
                        return
            self._abandon_channel("the process was closed")
            # (a call cut off in the middle of a line, cancelled say: vw would
            # learn the cut line into the model it saves; where its rest
            # cannot be written, the engine must save nothing)
            unsaved = (self._writes_final_model and self._channel is not None
                       and (held or not self._turn.busy) and not killed
                       and not await _finish_example(engine, self._channel,
                                                     began + timeout / 4))
            stopped = unsaved and engine.stayed_stopped(_clock())
            if unsaved:
                engine.kill()
            await self._shut_down(engine, max(0.0, began + timeout - _clock()),
                                  final_model=self._writes_final_model)
            if unsaved:
                raise unsaved_model_error(engine, stopped, timeout)
            if killed and self._writes_final_model:
                raise killed_under_a_call_error(engine, timeout)
        except (asyncio.CancelledError, GeneratorExit):
            # Cancelled (the loop is shutting down), or dropped unfinished
            # with a closed loop (GeneratorExit). A call still on the engine
            # keeps its pipes (their numbers must not go to another pipe
            # under it): the engine is killed, and its pipes are closed when
            # the call gives the turn back. Otherwise the closing finishes
            # off the loop.
            self._abandon_channel("the process was closed")
            if self._turn.busy and not held:
                engine.kill()
                self._turn.call_when_free(engine.close_killed)
            elif not engine.closed:
                hand_off_closing(loop, [engine], [], began + timeout)
            raise
        finally:
            if held:  # calls that were waiting for it now find the object closed
                self._turn.release()

    def _start_under_way(self) -> Optional["asyncio.Task[EngineProcess]"]:
        """The engine start under way (:attr:`_starting`), or ``None``.

        A start whose event loop has been closed is forgotten: a call whose
        loop ended (``asyncio.run()`` of one request) may leave one behind,
        cancelled or never to finish, and no later loop can wait for it. An
        engine it had started is stopped.
        """
        starting = self._starting
        if starting is None or not starting.get_loop().is_closed():
            return starting
        self._starting = None
        if starting.done() and not starting.cancelled() and starting.exception() is None:
            _abort_off_loop(starting.result())
        logger.info("an engine start of %r was left by an event loop that is closed; "
                    "it is started again", self)
        return None

    async def _cancel_start(self) -> None:
        """Cancel an engine start under way, and abort what it started."""
        starting, self._starting = self._start_under_way(), None
        if starting is None:
            return
        starting.cancel()
        # Waits for the start to end; a cancellation of this task goes on up
        # (the start's own clean-up stops what it spawned, and one that had
        # finished is stopped here: nothing else refers to it any more).
        try:
            await asyncio.wait({starting})
        finally:
            if _gave_engine(starting):
                _abort_off_loop(starting.result())  # it had finished before the cancel

    async def _shut_down(self, engine: EngineProcess, timeout: float, *,
                         final_model: bool = False) -> None:
        """Close the engine's input so that it finishes, escalating to
        SIGTERM and SIGKILL as :meth:`EngineProcess.close
        <subwabbit.engine_process.EngineProcess.close>` does, but yielding to
        the loop while it waits; returns within ``timeout``.

        :param final_model: the engine writes a ``-f`` model as it exits
        :raises VowpalWabbitEngineExitedError: as ``EngineProcess.close``
        :raises VowpalWabbitTimeoutError: with ``final_model``, when the
            engine had to be terminated (its model is not written)
        """
        deadline = _clock() + timeout
        terminate_at, kill_at = shutdown_schedule(deadline, timeout)
        engine.close_input()
        await self._await_exit(engine, terminate_at, drain=True, unless_stopped=True)
        terminated = engine.returncode is None
        stopped = terminated and engine.stayed_stopped(_clock())
        if stopped:
            logger.warning("vw[%d] is stopped (SIGSTOP, a debugger) and cannot finish; "
                           "killing it", engine.pid)
        elif terminated:
            logger.warning("vw[%d] did not exit after its input was closed; terminating",
                           engine.pid)
            engine.terminate()
            await self._await_exit(engine, kill_at)
        if engine.returncode is None:
            engine.kill()
            await self._await_exit(engine, deadline)
        engine.close(max(0.0, deadline - _clock()))
        if final_model and terminated:
            raise engine.final_model_lost(timeout, stopped)

    async def _retire(self, engine: EngineProcess, timeout: float,
                      channel: Optional[Channel] = None) -> None:
        """:meth:`_shut_down` an engine that no call uses any more (the one
        :meth:`restart` or :meth:`reload` replaced). When that is cancelled
        (the restart's task, or the loop ending under a reload's background
        closing), the rest of the closing is handed to the loop's executor:
        the engine is still stopped, reaped and its pipes closed within
        ``timeout``.

        :param channel: its channel, for an engine that saves a ``-f`` model:
            the rest of an example a call left partly written is written
            first (see :func:`_finish_example`); where it cannot be, the
            engine is killed, and saves nothing
            (:func:`~subwabbit.transfer.unsaved_model_error`)
        :raises VowpalWabbitEngineExitedError: as :meth:`_shut_down`
        """
        loop = asyncio.get_running_loop()
        deadline = _clock() + timeout
        try:
            if channel is not None and not await _finish_example(engine, channel,
                                                                 _clock() + timeout / 4):
                engine.kill()
                logger.warning("the replaced vw engine: %s", unsaved_model_error(engine))
            await self._shut_down(engine, max(0.0, deadline - _clock()))
        except (asyncio.CancelledError, GeneratorExit):
            if not engine.closed:
                hand_off_closing(loop, [engine], [], deadline)
            raise

    async def _await_blank_read(self, engine: EngineProcess, deadline: float) -> None:
        """The start-up check of an engine that probes would teach: write
        :data:`~subwabbit.core.channel.START_BLANK` and wait, yielding to the
        loop, until the engine has read it (as
        :func:`~subwabbit.sync_driver.await_input_consumed` does)."""
        output = b""
        try:
            engine.write_some(memoryview(START_BLANK))  # one byte: an empty pipe takes it
            delay = 0.0005
            while engine.unread_input_bytes():
                if engine.returncode is not None:
                    raise engine.exited_at_startup(output, read_s=0.1)
                if _clock() >= deadline:
                    raise engine.startup_error(
                        "the vw engine did not start reading examples within the start-up "
                        "timeout", output, wait_for_exit=False)
                await asyncio.sleep(min(delay, max(0.0, deadline - _clock())))
                delay = min(delay * 2, 0.01)
                output += engine.read_some()
        except VowpalWabbitEngineExitedError as exc:
            await self._await_exit(engine, _clock() + 1.0)
            raise engine.exited_at_startup(output, read_s=0.1) from exc

    @staticmethod
    async def _await_exit(engine: EngineProcess, until: float, drain: bool = False,
                          unless_stopped: bool = False) -> None:
        """Poll for the engine's exit until ``until``, yielding to the loop
        (``unless_stopped``: no longer once the engine has stayed stopped,
        see :meth:`EngineProcess.stayed_stopped
        <subwabbit.engine_process.EngineProcess.stayed_stopped>`)."""
        delay = 0.001
        while engine.returncode is None and _clock() < until:
            if unless_stopped and engine.stayed_stopped(_clock()):
                return
            if drain:
                drain = engine.discard_output()
            await asyncio.sleep(min(delay, max(0.0, until - _clock())))
            delay = min(delay * 2, 0.02)

    def __del__(self) -> None:
        self._release()

    def _after_fork_in_child(self) -> None:
        self._turn = _FifoTurn()
        self._reload_turn = _FifoTurn()
        try:
            if self._engine is not None:
                self._engine.abandon_in_fork()
            self._abandon_channel("the process was forked; its engine belongs to the parent",
                                  in_fork=True)
        finally:  # whatever happens above, the child starts an engine of its own
            self._engine = self._channel = None
            self._starting = None
            self._new_engines.reset_in_fork()
            self._spawns = set()
            self._retiring.reset_in_fork()
            self._retire_tasks = set()
            self._closing = None
            self._broken = None

    # ----------------------------------------------------------- the driver

    async def _drive(self, engine: EngineProcess, exchange: Exchange,
                     detailed: Optional[Dict[str, List[Any]]] = None) -> List[Any]:
        """Run ``exchange`` to its end on the event loop; return its results.

        The caller ends the exchange (in a ``finally``), so that a cancelled
        call leaves the channel exact.
        """
        channel = exchange.channel
        results: List[Any] = []
        yielded_at = _clock()
        while True:
            now = _clock()
            part = exchange.step(now)
            if part:
                results += part
            if exchange.done:
                return results
            try:
                moved = pump(engine, channel, now, detailed)
            except VowpalWabbitEngineExitedError as exc:
                # The error was built without waiting: learn the exit status now.
                until = _clock() + 1.0
                if exchange.end_at is not None:
                    until = min(until, exchange.end_at)
                await self._await_exit(engine, until)
                exc.returncode = engine.returncode
                exc.stderr_tail = engine.stderr_tail()
                raise
            if moved:
                if _clock() - yielded_at >= YIELD_AFTER_S:
                    await asyncio.sleep(0)
                    yielded_at = _clock()
                continue
            await _wait_for_pipes(engine, channel.unwritten_bytes > 0, exchange.wake_at())
            yielded_at = _clock()

    async def _run(self, exchange: Exchange,
                   detailed: Optional[Dict[str, List[Any]]] = None,
                   end: bool = True) -> List[Any]:
        """Drive ``exchange`` on the engine and return its results.

        :param end: end the exchange when it returns or raises (``False``:
            the caller ends it, once it has read what it needs from it)
        """
        engine = self._engine
        assert engine is not None
        try:
            return await self._drive(engine, exchange, detailed)
        except ENGINE_FAILURES as exc:
            engine.add_context(exc)
            self._fail(exc)
            raise
        finally:
            if end:
                exchange.end()

    def _fail(self, exc: BaseException) -> None:
        self._broken = exc
        logger.debug("the vw engine of %r failed: %s", self, exc)
        if self.restart_on_crash and not self._closed:
            self._begin_replacement("the engine failed")

    def _begin_replacement(self, reason: str) -> None:
        if self._start_under_way() is not None:
            return
        self._abandon_channel(f"the process's engine is being replaced ({reason})")
        old, self._engine, self._channel = self._engine, None, None
        if old is not None and not old.closed:
            _abort_off_loop(old)
        level = logging.WARNING if self._broken is not None else logging.INFO
        logger.log(level, "starting a new vw engine in the background (%s)", reason)
        self._starting = asyncio.ensure_future(self._start_engine())

    # -------------------------------------------------------- call control

    async def _begin_call(self, deadline: Optional[float],
                          metrics: Optional[Dict[str, Any]]) -> bool:
        """Wait for the turn (until the deadline, else ``io_timeout_s``) and
        for an engine (starting a replacement where one is due).

        :returns: ``False`` when the deadline passed first (the turn is not held)
        :raises VowpalWabbitBusyError: without a deadline, after ``io_timeout_s``
        :raises VowpalWabbitError: when the object is closed
        """
        let_go_after_unhooked_fork()
        if self._closed:  # at once, not after the call in progress
            raise self._closed_error()
        began = _clock()
        contended = self._turn.busy
        limit = deadline
        if limit is None and self.io_timeout_s is not None:
            limit = began + self.io_timeout_s
        try:
            held = await self._turn.acquire(limit)
        finally:  # a call cancelled while it waits has waited too
            waited = _clock() - began
            if metrics is not None:
                metrics["lock_wait_time"] = waited
            if contended:
                self._note_contention(waited, metrics)
        if not held:
            if deadline is not None:
                return False
            raise VowpalWabbitBusyError(
                f"another task's call held this {type(self).__name__} for {waited:.3g} s; "
                "calls on one object are served one at a time", argv=self.argv)
        try:
            if not await self._ensure_engine(deadline, metrics):
                self._turn.release()
                return False
        except BaseException:
            self._turn.release()
            raise
        return True

    async def _ensure_engine(self, deadline: Optional[float],
                             metrics: Optional[Dict[str, Any]]) -> bool:
        cancels_before = _cancel_requests()
        if self._closed:
            raise self._closed_error()
        if self._channel is not None and self._channel.torn and self._broken is None:
            # a call was interrupted between a read or write and its bookkeeping
            self._broken = torn_channel_error()
        if self._engine is not None and self._channel is not None and self._broken is None:
            # owed answers and printed nothing for io_timeout_s (see the sync
            # classes' _fail_if_stuck): it failed, as if it had crashed
            stuck = stuck_engine_error(self._engine, self._channel, self.io_timeout_s, self.argv)
            if stuck is not None:
                self._engine.add_context(stuck)
                self._broken = stuck
                self._count_failure(metrics)
        if self._engine is not None and self._broken is None:
            return True
        if self._engine is None and self._in_forked_child():
            if not self.restart_after_fork:
                raise self._fork_error()
            self._begin_replacement(f"this process ({os.getpid()}) is a fork of "
                                    f"{self._owner_pid}")
        elif self._broken is not None:
            if not self.restart_on_crash:
                raise VowpalWabbitError(
                    f"the vw engine of this {type(self).__name__} failed earlier and can no "
                    "longer be used; call restart() (or create the object with "
                    f"restart_on_crash=True) or close() it (cause: {self._broken})"
                ) from self._broken
            self._begin_replacement("the engine failed")
        elif self._start_under_way() is None:
            self._starting = asyncio.ensure_future(self._start_engine())
        if self._ever_started and metrics is not None:
            metrics["restarts"] = 1
        starting = self._starting
        assert starting is not None
        timeout = None if deadline is None else max(0.0, deadline - _clock())
        await asyncio.wait({starting}, timeout=timeout)
        if not starting.done():
            return False
        self._starting = None
        if starting.cancelled():  # close() stopped it (it holds no turn)
            self._raise_if_start_stopped(starting, cancels_before)
        engine = starting.result()  # raises what the start raised
        replaces_a_failure = self._broken is not None  # (not a fork's first engine)
        self._adopt(engine)
        logger.log(logging.WARNING if replaces_a_failure else logging.INFO,
                   "vw[%d] is serving %r", engine.pid, self)
        return True

    # ------------------------------------------------------------- predict

    async def predict(self, common_features: Any, items_features: Iterable[Any],
                      timeout: Optional[float] = None, debug_info: Any = None,
                      metrics: Optional[Dict[str, Any]] = None,
                      detailed_metrics: Optional[Dict[str, Any]] = None) -> List[Any]:
        """Predictions for the items, in item order, by the deadline.

        :param common_features: passed to ``format_common_features``
        :param items_features: one entry per item
        :param timeout: seconds; ``None``: no limit (``io_timeout_s`` of
            silence raises :class:`~subwabbit.errors.VowpalWabbitTimeoutError`,
            with or without a deadline, unless the deadline comes first)
        :param debug_info: passed to every formatter call
        :param metrics: as :meth:`VowpalWabbitNonBlockingProcess.predict
            <subwabbit.nonblocking.VowpalWabbitNonBlockingProcess.predict>`
        :param detailed_metrics: as the nonblocking class
        :returns: the predictions returned by the deadline (a prefix of the
            items; for ``--cb_adf`` and ``--cb_explore_adf``, all of them or
            none), typed by the kind of model (see :doc:`model_kinds`)
        :raises ValueError: when a formatted line is not exactly one example
        :raises VowpalWabbitEngineExitedError: when the engine dies (within the deadline)
        """
        start = _clock()
        deadline = deadline_from_timeout(timeout, start=start)
        warn_if_milliseconds(timeout)
        check_per_item(items_features, "items_features")
        self._require_predictions("predict")
        metrics = self._prepare_metrics(metrics, detailed_metrics, self._detailed_keys)
        predictions: List[Any] = []
        exchange: Optional[PredictExchange] = None
        held = False
        returned = False
        try:
            held = await self._begin_call(deadline, metrics)
            if not held:
                return predictions
            assert self._channel is not None
            channel = self._channel
            common_part = format_common_part(self.formatter, common_features, debug_info)
            call = channel.begin()
            if metrics is not None:
                metrics["prepare_time"] = _clock() - start
                metrics["before_cleanup_pending_lines"] = channel.stale_lines
            exchange = new_predict_exchange(
                channel, call, kind=self.prediction_kind, formatter=self.formatter,
                common_part=common_part, common_features=common_features, items=items_features,
                debug_info=debug_info, pacing=self._pacing(), deadline=deadline,
                idle_s=self.io_timeout_s, detailed=detailed_metrics, clock=_clock,
                format_s_per_item=self._format_s_per_item)
            # Ended below, once the metrics are taken: ending it turns the
            # lines it still owes into leftovers, which are not earlier calls'.
            predictions = await self._run(exchange, detailed_metrics, end=False)
            returned = True
            return predictions
        except ENGINE_FAILURES:
            self._count_failure(metrics)
            raise
        finally:
            # (for a call that never began: earlier calls' leftovers, not
            # the lines of the call it waited for)
            self._finish_predict_metrics(metrics, exchange, start, self._leftover_lines(), True)
            if metrics is not None and not returned:
                metrics["num_lines"] = 0  # raised or cancelled: the caller got none
            if exchange is not None:
                self._format_s_per_item = exchange.format_s_per_item
                exchange.end()
                # An engine that owes what the call left in flight and prints
                # nothing is quiet from now on, not from the next call.
                exchange.channel.note_progress(_clock())
            if held:
                self._turn.release()
            self._finish_call("predict", metrics)

    # --------------------------------------------------------------- others

    async def train(self, common_features: Any, items_features: Iterable[Any],
                    labels: Iterable[Label], weights: Optional[Iterable[Optional[float]]] = None,
                    debug_info: Any = None) -> None:
        """Learn from labelled items; returns once the engine has learnt them.

        Every example is formatted and checked before the first one is sent.

        :raises ValueError: see :meth:`VowpalWabbitProcess.train
            <subwabbit.blocking.VowpalWabbitProcess.train>`
        """
        start = _clock()
        self._require_predictions("train")
        metrics = self._train_metrics()
        learnt = 0
        try:  # the hook hears of the call however it ends, refused input included
            lines = self._format_training_lines(common_features, items_features, labels,
                                                weights, debug_info)
            await self._call(None, metrics)
            try:
                assert self._channel is not None
                if lines:
                    await self._run(SendExchange(self._channel, self._channel.begin(keep=False),
                                                 lines, self.io_timeout_s))
            finally:
                self._turn.release()
            # a multi-line example's lines are its shared line and one per item
            learnt = len(lines) - 1 if self.prediction_kind.multi_line and lines else len(lines)
        except ENGINE_FAILURES:
            self._count_failure(metrics)
            raise
        finally:
            self._finish_train(metrics, start, learnt)

    async def _call(self, deadline: Optional[float],
                    metrics: Optional[Dict[str, Any]] = None) -> None:
        """Take the turn for a call that must run (raise instead of returning nothing)."""
        if not await self._begin_call(deadline, metrics):
            raise VowpalWabbitTimeoutError("the deadline passed before the engine was free",
                                           argv=self.argv)

    async def save(self, path: SavePath, timeout: Optional[float] = None) -> None:
        """Save the model to ``path`` now, atomically, while the engine keeps
        serving (see :meth:`VowpalWabbitProcess.save
        <subwabbit.process_model.VowpalWabbitProcessModel.save>`). A save
        cancelled after its command reached the engine leaves ``path`` as it
        was; what the engine writes for it is removed once written.

        :raises VowpalWabbitError: when the engine fails or times out, or
            makes several passes (``--passes`` above 1: nothing is sent)
        :raises OSError: when no file can be written where ``path`` points
            (nothing is sent to the engine)
        """
        self._refuse_save_of_passes()
        deadline = deadline_from_timeout(timeout)
        await self._call(deadline)
        try:
            engine, channel = self._engine, self._channel
            assert engine is not None and channel is not None
            save = ModelSave(path)
            written_before = channel.bytes_written
            done = False
            try:
                timed_out = False
                for exchange in self._save_exchanges(channel, save, deadline):
                    await self._run(exchange)
                    timed_out = exchange.timed_out
                if timed_out:
                    error = VowpalWabbitTimeoutError(f"timed out saving the model to {save.target}")
                    engine.add_context(error)
                    self._fail(error)
                    raise error
                if not self._save_probes:
                    await self._await_file(engine, save, self._save_file_limit(deadline))
                save.finish(engine)
                done = True
            finally:
                save.clean_up_after(engine, done, channel.bytes_written != written_before,
                                    self.io_timeout_s)
        finally:
            self._turn.release()

    async def _await_file(self, engine: EngineProcess, save: ModelSave,
                          limit: Optional[float]) -> None:
        """Wait, yielding to the loop, until the engine has written the
        save's file or ``limit`` passes (a save with no probe after it; the
        loop of :func:`~subwabbit.sync_driver.wait_for_file`)."""
        delay = 0.0005
        while not save.written():
            error = file_wait_error(engine, limit, f"saving the model to {save.target}")
            if error is not None:
                engine.add_context(error)
                self._fail(error)
                raise error
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)

    async def explain_vw_line(self, vw_line: str, link_function: bool = False) -> Any:
        """Audit one example (needs ``audit_mode=True``); see
        :meth:`VowpalWabbitProcess.explain_vw_line
        <subwabbit.process_model.VowpalWabbitProcessModel.explain_vw_line>`.

        :returns: ``(raw prediction, explanation string)``
        """
        del link_function
        if not self.audit_mode:
            raise VowpalWabbitError("explain_vw_line() needs a process created with audit_mode=True")
        vw_line = audit_line(vw_line)
        await self._call(None)
        try:
            assert self._channel is not None
            exchange = AuditExchange(self._channel, self._channel.begin(), vw_line,
                                     self.io_timeout_s)
            await self._run(exchange)
            raw, features, _prediction = exchange.answer
            try:
                score = parse_scalar(raw)
            except VowpalWabbitProtocolError as exc:
                self._fail(exc)  # (the engine's output can no longer be trusted)
                raise
            return score, features.decode("utf-8", "replace").strip("\t\r ")
        finally:
            self._turn.release()

    async def cleanup(self, timeout: Optional[float] = None) -> bool:
        """Read and discard what earlier calls left in flight.

        :param timeout: seconds to stop after, or ``None``
        :returns: whether nothing is left in flight
        """
        deadline = deadline_from_timeout(timeout)
        if not await self._begin_call(deadline, None):
            return False
        try:
            assert self._channel is not None
            channel = self._channel
            if channel.stale_lines:
                await self._run(CleanupExchange(channel, channel.begin(keep=False), deadline,
                                                self.io_timeout_s))
            return not channel.stale_lines
        finally:
            self._turn.release()

    async def reload(self, vw_args: VwArgs, timeout: float = 5.0) -> None:
        """Switch to an engine started with new arguments, with no failed
        call; see :meth:`VowpalWabbitProcess.reload
        <subwabbit.process_model.VowpalWabbitProcessModel.reload>`. The new
        engine is started while calls go on; the switch waits for the call in
        progress (calls are served in arrival order), and the old engine is
        closed in the background. Reloads asked for at the same time run one
        after the other, in the order they were asked for: the last one serves.

        :raises VowpalWabbitStartupError: when the new engine cannot start;
            the object goes on with the old one
        """
        timeout = required_seconds(timeout, "timeout")
        let_go_after_unhooked_fork()
        if self._closed:
            raise self._closed_error()
        # One at a time, in the order asked for: the last one asked for serves
        # (else overlapping reloads switched in the order their engines
        # happened to start, and an older model could stay).
        async with self._reload_turn:
            if self._closed:  # (while an earlier reload ran)
                raise self._closed_error()
            # The model file's header is read off the event loop.
            plan = await asyncio.get_running_loop().run_in_executor(None, self._plan_reload,
                                                                    vw_args)
            engine = await self._start_engine(plan.argv, plan.probes_teach)
            limit = None if self.io_timeout_s is None else _clock() + self.io_timeout_s
            try:
                acquired = await self._turn.acquire(limit)
            except BaseException:
                _abort_off_loop(engine)
                raise
            if not acquired:
                _abort_off_loop(engine)
                raise VowpalWabbitBusyError("another task's call held the object too long",
                                            argv=self.argv)
            try:
                if self._closed:
                    _abort_off_loop(engine)
                    raise self._closed_error()
                try:
                    await self._cancel_start()
                except BaseException:
                    _abort_off_loop(engine)
                    raise
                old = None if self._in_forked_child() else self._engine
                failed = self._broken is not None or (self._channel is not None
                                                      and self._channel.torn)
                # (the old engine's: reloaded() takes the new arguments')
                old_channel = self._channel if self._writes_final_model else None
                self._reloaded(plan)
                restarts = self._restart_count
                self._adopt(engine)
                self._restart_count = restarts  # a reload is not a restart
            finally:
                self._turn.release()
        logger.info("reloaded: vw[%s] -> vw[%s] (%s)", old.pid if old else None, engine.pid,
                    " ".join(plan.argv))
        if old is not None and not old.closed:
            self._retiring.add([old])
            task = asyncio.ensure_future(
                self._retire(old, min(timeout, 0.5) if failed else timeout, old_channel))
            task.add_done_callback(_log_close_failure)
            self._retire_tasks.add(task)
            task.add_done_callback(self._retire_tasks.discard)

    async def restart(self, timeout: float = 5.0) -> None:
        """Replace the engine with a fresh one started with the same command
        (after any failure, or on a healthy engine).

        :param timeout: seconds the old engine gets to exit
        :raises VowpalWabbitStartupError: when the new engine cannot start
        """
        timeout = required_seconds(timeout, "timeout")
        let_go_after_unhooked_fork()
        if self._closed:
            raise self._closed_error()
        began = _clock()
        limit = None if self.io_timeout_s is None else began + self.io_timeout_s
        if not await self._turn.acquire(limit):
            raise VowpalWabbitBusyError("another task's call held the object too long",
                                        argv=self.argv)
        try:
            await self._cancel_start()
            self._abandon_channel("the process's engine was restarted")
            old_channel = self._channel if self._writes_final_model else None
            old, self._engine, self._channel = self._engine, None, None
            if old is not None and not old.closed:
                # A failed engine has nothing worth waiting for (as the sync classes).
                try:
                    await self._retire(old, min(timeout, 0.5) if self._broken else timeout,
                                       old_channel)
                except VowpalWabbitError as exc:
                    logger.warning("the replaced vw engine failed: %s", exc)
            self._owner_pid = os.getpid()
            try:
                engine = await self._start_engine()
            except VowpalWabbitError as exc:
                self._broken = exc
                raise
            self._adopt(engine)
            logger.warning("restarted the vw engine: now vw[%d], restart #%d", engine.pid,
                           self._restart_count)
        finally:
            self._turn.release()


def _note_close_failure(task: "asyncio.Future[None]") -> None:
    """Log how a closing whose ``close()`` call was cancelled failed (an
    awaiting ``close()`` raises it too)."""
    if not task.cancelled() and task.exception() is not None:
        logger.info("closing the vw engine: %s", task.exception())


def _log_close_failure(task: "asyncio.Future[None]") -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("the vw engine replaced by reload() failed: %s", task.exception())


def _abort_spawned(spawn: "asyncio.Future[EngineProcess]") -> None:
    """Kill an engine whose start was cancelled while it was being spawned."""
    if _gave_engine(spawn):
        _abort_off_loop(spawn.result(), spawn.get_loop())


def _gave_engine(start: "asyncio.Future[EngineProcess]") -> bool:
    """Whether ``start`` (a spawn, or an engine start) has ended with an engine."""
    return start.done() and not start.cancelled() and start.exception() is None


def _cancel_requests() -> int:
    """The current task's pending cancellation requests (Python 3.11+; 0
    before). A task that once swallowed a cancellation keeps a count: what
    tells that it is being cancelled now is a count above the one it had."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling() if cancelling is not None else 0


def _abort_off_loop(engine: EngineProcess,
                    loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
    """Kill an engine now and reap it (and close its pipes) on the loop's
    executor (``loop``, by default the running one): a killed engine of a
    large model takes milliseconds to go, and one forked by a stopped fork
    server is not reaped at all.

    With no loop running (a coroutine dropped unfinished after its loop was
    closed, and closed by the garbage collector) it is reaped here: no loop
    will ever run the executor's callback, and nothing waits for a thread.
    """
    engine.kill()
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            engine.abort()
            return
    hand_off(loop, engine.abort)


async def _wait_for_pipes(engine: EngineProcess, write: bool, until: Optional[float]) -> None:
    """Wait with the event loop until stdout is readable, stdin writable (when
    ``write``), or ``until`` (a :func:`time.perf_counter` value)."""
    await wait_for_engines([(engine, write)], until)


async def wait_for_engines(engines: Sequence[Tuple[EngineProcess, bool]],
                           until: Optional[float]) -> Optional[List[int]]:
    """Wait with the event loop until the stdout of one of ``engines`` is
    readable or its stdin writable (for those paired with ``True``), or until
    ``until`` (a :func:`time.perf_counter` value).

    :returns: the stdout descriptors that the loop found readable (output,
        or its end), or ``None`` when it was not asked (``until`` was too
        close for the loop to sleep: it only yielded once)
    """
    loop = asyncio.get_running_loop()
    remaining = None if until is None else until - _clock()
    if remaining is not None and remaining <= _LOOP_TIMER_SLACK_S:
        # The loop cannot sleep this precisely: yield once and look again.
        await asyncio.sleep(0)
        return None
    ready: "asyncio.Future[None]" = loop.create_future()
    readable: List[int] = []

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    def wake_to_read(fd: int) -> None:
        readable.append(fd)
        wake()

    for engine, write in engines:
        loop.add_reader(engine.stdout_fd, wake_to_read, engine.stdout_fd)
        if write:
            loop.add_writer(engine.stdin_fd, wake)
    timer = None if remaining is None else loop.call_later(remaining - _LOOP_TIMER_SLACK_S, wake)
    try:
        await ready
    finally:
        if timer is not None:
            timer.cancel()
        for engine, write in engines:
            loop.remove_reader(engine.stdout_fd)
            if write:
                loop.remove_writer(engine.stdin_fd)
    return readable

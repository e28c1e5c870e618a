"""What the blocking and nonblocking classes share: the engine's lifecycle,
turn-taking between threads, restarts (after a failure or a fork), and the
calls themselves, each an exchange of :mod:`subwabbit.core` run by
:mod:`subwabbit.sync_driver`."""

import collections
import contextlib
import logging
import os
import threading
import time
from typing import (Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Sequence,
                    Tuple, Union)

from .base import Label, VowpalWabbitBaseFormatter, VowpalWabbitBaseModel
# AUDIT_LINES_PER_EXAMPLE and DEFAULT_IO_TIMEOUT_S stay importable from here, as in 3.0.
from .client import (AUDIT_LINES_PER_EXAMPLE, DEFAULT_IO_TIMEOUT_S, ClientBase,  # noqa: F401
                     FifoLock, MetricsHook, check_per_item, let_go_after_unhooked_fork)
from .command import VwArgs
from .core.channel import Channel
from .core.exchanges import (AuditExchange, CleanupExchange, Exchange, PredictExchange,
                             SendExchange, format_common_part,
                             new_predict_exchange)
from .deadlines import deadline_from_timeout, required_seconds, warn_if_milliseconds
from .engine_process import EngineProcess
from .unserved_engines import SPAWN_WAIT_S, RetiringEngines, StartingEngines, await_exits
from .errors import (VowpalWabbitBusyError, VowpalWabbitError, VowpalWabbitProtocolError,
                     VowpalWabbitTimeoutError)
from .lines import audit_line, parse_scalar
from .saving import ModelSave, SavePath
from .sync_driver import drive, run, start_engine, wait_for_file
# ENGINE_FAILURES stays importable from here, as in 3.0.
from .transfer import (ENGINE_FAILURES, finish_example, killed_under_a_call_error,
                       stuck_engine_error, torn_channel_error, unsaved_model_error)

logger = logging.getLogger("subwabbit")

# How long a restart gives an engine that already failed to exit before SIGKILL.
_FAILED_ENGINE_CLOSE_S = 0.5


class _Replacement:
    """A replacement engine started on a thread of its own, so that no call
    waits for it past its deadline.

    :param start: starts and checks the engine; called with a function that
        receives the spawned engine (so that :meth:`cancel` can kill it)
    :param old: the failed engine to close first, if any
    """

    def __init__(self, start: Callable[[Callable[[EngineProcess], None]], EngineProcess],
                 old: Optional[EngineProcess], kill_old: bool = False) -> None:
        self.engine: Optional[EngineProcess] = None
        #: the old engine writes a -f model and its input may end in a cut
        #: line (see _kill_old): it is killed, not closed
        self._kill_old = kill_old
        self.error: Optional[BaseException] = None
        self.done = threading.Event()
        self._spawned: Optional[EngineProcess] = None
        self._cancelled = False
        self._start = start
        self._old = old
        self.thread = threading.Thread(target=self._run, name="subwabbit-restart", daemon=True)
        self.thread.start()

    def _spawned_engine(self, engine: EngineProcess) -> None:
        self._spawned = engine
        if self._cancelled:
            engine.kill()

    def _run(self) -> None:
        try:
            if self._old is not None and not self._old.closed:
                if self._kill_old:
                    self._old.kill()
                    logger.warning("the replaced vw engine: %s", unsaved_model_error(self._old))
                try:
                    self._old.close(_FAILED_ENGINE_CLOSE_S)
                except VowpalWabbitError as exc:
                    logger.debug("the replaced vw engine failed: %s", exc)
            engine = self._start(self._spawned_engine)
            if self._cancelled:  # cancel() may have stopped waiting for this thread
                engine.abort()
                self.error = VowpalWabbitError("the process was closed while its replacement "
                                               "engine started")
            else:
                self.engine = engine
        except BaseException as exc:  # pylint: disable=broad-except
            self.error = exc
            logger.warning("starting a replacement vw engine failed: %s", exc)
        finally:
            self.done.set()

    def cancel(self, timeout: float) -> None:
        """Stop the start-up (kill the engine being started), wait for the
        thread within ``timeout`` and close what it started."""
        self._cancelled = True
        if self._spawned is not None:
            self._spawned.kill()
        self.thread.join(timeout)
        if self.engine is not None:
            self.engine.abort()

    def abandon_in_fork(self) -> None:
        """In a forked child: let go of the engines the parent's thread holds."""
        for engine in (self._spawned, self.engine, self._old):
            if engine is not None:
                engine.abandon_in_fork()


class VowpalWabbitProcessModel(ClientBase, VowpalWabbitBaseModel):
    """Base class of the models that run a vw engine as a child process.

    Each call (``predict``, ``train``, ``save``, ``explain_vw_line``) is a
    *call* on the engine's :class:`~subwabbit.core.channel.Channel`, which
    keeps every answer with its own call: what an earlier call left in
    flight is read and thrown away as it arrives, and an earlier ``predict``
    iterator resumed afterwards raises instead of reading predictions that are
    not its own.

    Calls are serialised: a call holds the process from its start until it
    returns (for ``predict``: until its iterator is exhausted, closed or
    garbage-collected). A call from another thread waits for it, until its
    own deadline (a ``predict`` with a timeout then yields nothing) or for
    ``io_timeout_s`` (then :class:`~subwabbit.errors.VowpalWabbitBusyError`);
    such waits are counted in ``metrics['waited_for_other_call']`` and logged
    at WARNING at most once a minute. A new call from the thread that holds
    the process supersedes its unfinished iterator.

    After the engine fails (it exits, prints something unexpected, or does not
    answer within ``io_timeout_s``) every call raises
    :class:`~subwabbit.errors.VowpalWabbitError` until :meth:`restart`; with
    ``restart_on_crash=True`` a replacement engine is started (see the
    subclasses for when a call waits for it).

    In a process forked after the object was created, the parent's engine is
    never read, written, signalled or closed: the first call in the child
    starts an engine of its own with the same command (logged at INFO), or
    raises :class:`~subwabbit.errors.VowpalWabbitError` with
    ``restart_after_fork=False``.
    """

    #: the keys ``detailed_metrics`` receives from ``predict``
    _detailed_keys: Tuple[str, ...] = ()

    #: one ``generating_lines_time`` entry per line (else per batch)
    _timing_per_line = False

    #: whether a replacement engine starts in the background (the call
    #: returns by its deadline) or within the call
    _background_restarts = False

    def __init__(self, formatter: VowpalWabbitBaseFormatter, vw_args: VwArgs, batch_size: int, *,
                 write_only: bool, audit_mode: bool,
                 vw_command: Union[str, Sequence[str], None],
                 metrics_hook: Optional[MetricsHook], startup_timeout_s: float,
                 io_timeout_s: Optional[float], restart_on_crash: bool,
                 restart_after_fork: bool = True, prediction_type: Optional[str] = None) -> None:
        self._engine: Optional[EngineProcess] = None
        self._channel: Optional[Channel] = None
        self._replacement: Optional[_Replacement] = None
        #: an engine close() killed under another thread's call: its pipes are
        #: that call's until it ends its turn, which closes them
        self._close_on_turn_end: Optional[EngineProcess] = None
        self._closed = False
        #: set when close() begins (before it may kill the engine under a call)
        self._closing = False
        #: engines spawned for this object and not yet its engine (starting, or
        #: started and waiting to be adopted): close() kills them
        self._new_engines = StartingEngines()
        #: engines reload() replaced, closing in the background: close() ends them
        self._retiring = RetiringEngines()
        #: taken by reload(), so that overlapping reloads switch in the order asked for
        self._reload_lock = FifoLock()
        VowpalWabbitBaseModel.__init__(self, formatter)
        self._configure(formatter, vw_args, batch_size, write_only=write_only,
                        audit_mode=audit_mode, vw_command=vw_command, metrics_hook=metrics_hook,
                        startup_timeout_s=startup_timeout_s, io_timeout_s=io_timeout_s,
                        restart_on_crash=restart_on_crash, restart_after_fork=restart_after_fork,
                        prediction_type=prediction_type)
        self._broken: Optional[BaseException] = None
        # (thread id, token) of the call holding the process, guarded by _turn
        self._holder: Optional[Tuple[int, object]] = None
        # (reentrant, so that _end_turn can tell when it runs inside a section
        # of its own thread's: see there)
        self._turn = threading.Condition(threading.RLock())
        #: (thread id, token) of calls waiting for the process, oldest first
        self._turn_queue: Deque[Tuple[int, object]] = collections.deque()
        #: held while a call works on the channel (a step of its driver), and
        #: while a thread supersedes its own unfinished call: that call's
        #: iterator may be running in another thread (see _begin_call)
        self._step_lock = threading.Lock()
        self._adopt(self._start_engine())

    def _start_engine(self, on_spawn: Optional[Callable[[EngineProcess], None]] = None,
                      argv: Optional[List[str]] = None,
                      probes_teach: Optional[str] = None) -> EngineProcess:
        """Start an engine (``argv`` and ``probes_teach``: a reload's, else this
        object's), without probes if they would teach it."""
        if argv is None:
            argv, probes_teach = self.argv, self._probes_teach

        try:
            with self._new_engines.spawning() as note:
                def spawned(engine: EngineProcess) -> None:
                    note(engine)  # (killed there if close() came first)
                    if on_spawn is not None:
                        on_spawn(engine)

                engine = start_engine(argv, self._outputs_per_line, self.startup_timeout_s,
                                      spawned, self._probe_kind, blank=probes_teach is not None)
            try:
                self._after_start(engine)
            except BaseException:
                engine.abort()
                raise
        except VowpalWabbitError as exc:
            if self._closed:  # close() killed it while it started
                raise self._closed_while_starting() from exc
            raise
        return engine

    def _adopt(self, engine: EngineProcess) -> None:
        with self._turn:  # against close(), which marks the object closed under it
            closed = self._closed
            if not closed:
                self._engine = engine
                self._new_engines.handed_over([engine])
        if closed:
            # close() ran while this engine started (a restart or a call's
            # replacement held the process, and close() could not wait for it):
            # the engine must not outlive the object.
            engine.abort()
            raise self._closed_while_starting()
        self._abandon_channel("the process moved to another engine")
        self._channel = self._new_channel(engine.started_with_blank)
        self._owner_pid = engine.owner_pid

    # ------------------------------------------------------- subclass hooks

    def _after_start(self, engine: EngineProcess) -> None:
        """Prepare the pipes of a newly started engine."""

    # -------------------------------------------------------------- status

    @property
    def pending_lines(self) -> int:
        """Examples sent (or queued) to the engine whose predictions have not been read."""
        return self._channel.in_flight_lines if self._channel is not None else 0

    @property
    def pid(self) -> Optional[int]:
        """The engine's process id."""
        return self._engine.pid if self._engine is not None else None

    @property
    def vw_process(self) -> Optional[Any]:
        """The engine's :class:`subprocess.Popen` (subwabbit 2.x's attribute,
        for its ``pid`` in health checks); ``None`` while no engine runs."""
        return self._engine.proc if self._engine is not None else None

    def __repr__(self) -> str:
        if self._engine is None:
            return f"<{type(self).__name__} no engine{' (closed)' if self._closed else ''}>"
        state = self._engine.describe()
        if self._engine.closed:
            state = f"closed, {state}"
        return (f"<{type(self).__name__} pid={self._engine.pid} {state} "
                f"pending_lines={self.pending_lines} argv={self.argv!r}>")

    # -------------------------------------------------------- call control

    def _fail_if_torn(self) -> None:
        """An engine whose channel a call left torn (interrupted between a
        read or write and its bookkeeping) has failed: the next call restarts
        it or raises, as after a crash. Asked only by the thread that holds
        the process: another thread's call changes the channel meanwhile."""
        channel = self._channel
        if channel is not None and channel.torn and self._broken is None:
            self._fail(torn_channel_error())

    def _fail_if_stuck(self, metrics: Optional[Dict[str, Any]]) -> None:
        """An engine that has owed answers and printed nothing for
        ``io_timeout_s`` has failed (:func:`~subwabbit.transfer.stuck_engine_error`):
        the call restarts it or raises, as after a crash (counted in its
        metrics). Calls with deadlines nearer than ``io_timeout_s`` return by them,
        so without this a stopped engine made every one of them return
        nothing, for good. Asked only by the thread that holds the process."""
        engine, channel = self._engine, self._channel
        if engine is None or channel is None or self._broken is not None:
            return
        with self._step_lock:
            error = stuck_engine_error(engine, channel, self.io_timeout_s, self.argv)
        if error is not None:
            self._fail(error)
            self._count_failure(metrics)

    def _engine_or_raise(self) -> Tuple[EngineProcess, Channel]:
        engine, channel = self._engine, self._channel
        if self._closed:
            raise self._closed_error()
        if self._broken is not None:
            raise VowpalWabbitError(
                f"the vw engine of this {type(self).__name__} failed earlier and can no longer "
                "be used; call restart() (or create the process with restart_on_crash=True) or "
                f"close() it (cause: {self._broken.args[0]})"
            ) from self._broken
        if engine is None or channel is None:
            if self._in_forked_child():
                raise self._fork_error()
            raise VowpalWabbitError(f"{type(self).__name__} has no engine")
        if engine.closed:
            raise self._closed_error()
        return engine, channel

    def _needs_new_engine(self) -> bool:
        if self._closed:
            return False
        if self._engine is None and self._in_forked_child():
            return True
        return self._broken is not None and self.restart_on_crash

    def _check_usable(self) -> None:
        """Raise now, at the call, what the call would raise once it starts:
        that the object is closed, that its engine failed (without
        ``restart_on_crash``), or that it is a fork's (without
        ``restart_after_fork``). Not that it has no engine, or a closed one,
        at this moment: another thread's :meth:`restart` holds the process
        while it replaces the engine, and the call waits for it as for any
        other call (:meth:`_begin_call` checks the engine once it holds the
        process)."""
        let_go_after_unhooked_fork()
        if self._closed:
            raise self._closed_error()
        if self._needs_new_engine():
            if (self._engine is None and self._in_forked_child()
                    and not self.restart_after_fork):
                raise self._fork_error()
        elif self._broken is not None:
            self._engine_or_raise()

    def _wait_for_turn(self, token: object, wait_until: Optional[float]) -> bool:
        """Hold the process for the call ``token``, waiting for another thread's call.

        Waiting calls are served in arrival order: a call that ends hands the
        process to the oldest waiter, so a thread that calls in a loop cannot
        starve the others (or a :meth:`reload` waiting to switch engines).

        :returns: ``False`` when ``wait_until`` passed first
        """
        me = threading.get_ident()
        with self._turn:
            holder = self._holder
            if (holder is None and not self._turn_queue) or (holder is not None
                                                              and holder[0] == me):
                self._holder = (me, token)
                return True
            entry = (me, token)
            self._turn_queue.append(entry)
            try:
                while self._holder is not entry:
                    if self._closed:  # close() wakes the waiting calls
                        raise self._closed_error()
                    left = None if wait_until is None else wait_until - time.perf_counter()
                    if left is not None and left <= 0:
                        self._turn_queue.remove(entry)
                        return False
                    self._turn.wait(left)
            except BaseException:  # KeyboardInterrupt, a signal handler's exception
                engine = None
                if self._holder is entry:  # handed to us meanwhile: pass it on
                    engine = self._pass_turn_locked()
                elif entry in self._turn_queue:
                    self._turn_queue.remove(entry)
                if engine is not None:
                    engine.close_killed()
                raise
            return True

    def _turn_limit(self, began: float, deadline: Optional[float]) -> Optional[float]:
        """How long a call may wait for another thread's: until its deadline,
        else ``io_timeout_s`` from ``began``."""
        if deadline is not None or self.io_timeout_s is None:
            return deadline
        return began + self.io_timeout_s

    def _end_turn(self, token: object) -> None:
        if self._turn._is_owned():  # type: ignore[attr-defined]  # pylint: disable=protected-access
            # A predict() iterator finalized (by the garbage collector) while
            # this thread is inside a section of the turn's lock: ending the
            # turn here would change the holder under that section. A thread
            # of its own ends it once the section lets go of the lock.
            try:
                threading.Thread(target=self._end_turn, args=(token,),
                                 name="subwabbit-end-turn", daemon=True).start()
            except RuntimeError:  # (interpreter shutdown: no call follows)
                pass
            return
        with self._turn:
            if self._holder is None or self._holder[1] is not token:
                return
            engine = self._pass_turn_locked()
        if engine is not None:  # close() left it to this call: the call is over
            engine.close_killed()

    def _pass_turn_locked(self) -> Optional[EngineProcess]:
        """Hand the process to the oldest waiter (see :meth:`_wait_for_turn`),
        with ``_turn`` held.

        :returns: the engine that close() left to the call whose turn this
            was, now to be closed (outside the lock)
        """
        self._holder = self._turn_queue.popleft() if self._turn_queue else None
        self._turn.notify_all()
        engine, self._close_on_turn_end = self._close_on_turn_end, None
        return engine

    def _busy_error(self, waited: float) -> VowpalWabbitBusyError:
        return VowpalWabbitBusyError(
            f"another thread's call held this {type(self).__name__} for {waited:.3g} s; "
            "calls on one process are serialised (an unfinished predict() iterator holds "
            "the process until it is exhausted or closed)", argv=self.argv)

    def _begin_call(self, deadline: Optional[float] = None,
                    metrics: Optional[Dict[str, Any]] = None,
                    quiet_deadline: bool = False) -> Optional[object]:
        """Take the process over for a new call: wait for other threads' calls
        and make sure an engine is there (restarting one when allowed).

        :param deadline: the call's deadline, also the longest wait for the
            process (``io_timeout_s`` without one)
        :param metrics: receives ``lock_wait_time``, ``waited_for_other_call``
            and ``restarts``
        :param quiet_deadline: return ``None`` instead of raising when the
            deadline passes while waiting for another thread or for a
            replacement engine
        :returns: the call's token; ``None`` (with ``quiet_deadline``) when
            the deadline passed
        :raises VowpalWabbitBusyError: when the process stayed held too long
        :raises VowpalWabbitTimeoutError: when the deadline passed while a
            replacement engine started (without ``quiet_deadline``)
        """
        began = time.perf_counter()
        token = object()
        holder = self._holder
        contended = holder is not None and holder[0] != threading.get_ident()
        try:
            held = self._wait_for_turn(token, self._turn_limit(began, deadline))
            if held and holder is not None and not contended:
                # This thread held the process for an unfinished call: the new
                # call supersedes it. Its iterator may be running in another
                # thread (handed to a thread pool, say): end it once its current
                # step is over, so that its next step raises before it touches
                # the channel that this call uses from now on.
                with self._step_lock:
                    channel = self._channel
                    if channel is not None:
                        channel.supersede()
        finally:  # a call whose wait ends in an error (close() ran) has waited too
            waited = time.perf_counter() - began
            if metrics is not None:
                metrics["lock_wait_time"] = waited
            if contended:
                self._note_contention(waited, metrics)
        if not held:
            if quiet_deadline and deadline is not None:
                return None
            raise self._busy_error(waited)
        try:
            self._fail_if_torn()
            self._fail_if_stuck(metrics)
            if not self._ensure_engine(deadline, metrics):
                if quiet_deadline and deadline is not None:
                    self._end_turn(token)
                    return None
                # (not that the engine failed: the replacement goes on starting)
                raise VowpalWabbitTimeoutError(
                    "the deadline passed before the new vw engine, starting in the background, "
                    "was ready; a later call uses it", argv=self.argv)
            self._engine_or_raise()
        except BaseException:
            self._end_turn(token)
            raise
        return token

    def _ensure_engine(self, deadline: Optional[float],
                       metrics: Optional[Dict[str, Any]]) -> bool:
        """Start a replacement engine where one is due (after a failure with
        ``restart_on_crash``, or in a forked child).

        :returns: ``False`` when the replacement is not ready by ``deadline``
        """
        if not self._needs_new_engine():
            return True
        forked = self._broken is None  # else the engine failed
        if forked:
            if not self.restart_after_fork:
                raise self._fork_error()
            reason = f"this process ({os.getpid()}) is a fork of {self._owner_pid}"
        else:
            reason = f"the previous engine failed: {self._broken.args[0]}"  # type: ignore[union-attr]
        if metrics is not None:
            metrics["restarts"] = 1
        if not self._background_restarts:
            self._restart_engine(reason, level=logging.INFO if forked else logging.WARNING)
            return True
        replacement = self._replacement
        if replacement is None:
            old, self._engine = self._engine, None
            logger.log(logging.INFO if forked else logging.WARNING,
                       "starting a new vw engine in the background (%s)", reason)
            replacement = self._replacement = _Replacement(self._start_engine, old,
                                                           self._old_input_cut())
        wait_s = None if deadline is None else max(0.0, deadline - time.perf_counter())
        if not replacement.done.wait(wait_s):
            return False
        self._replacement = None
        if replacement.error is not None:
            raise replacement.error
        assert replacement.engine is not None  # else _run recorded an error
        self._adopt(replacement.engine)
        self._broken = None
        self._restart_count += 1
        logger.log(logging.INFO if forked else logging.WARNING,
                   "restarted the vw engine (%s): now vw[%s], restart #%d",
                   reason, self.pid, self._restart_count)
        return True

    @contextlib.contextmanager
    def _call(self, deadline: Optional[float] = None,
              metrics: Optional[Dict[str, Any]] = None) -> Iterator[object]:
        """Hold the process for a call that does all its work before returning."""
        token = self._begin_call(deadline, metrics)
        try:
            yield token
        finally:
            self._end_turn(token)

    def _fail(self, exc: VowpalWabbitError) -> None:
        """Remember an engine failure so that later calls refuse to guess
        which prediction is whose; start a replacement at once when allowed."""
        if self._engine is not None:
            self._engine.add_context(exc)
        self._broken = exc
        logger.debug("the vw engine of %r failed: %s", self, exc.message)
        with self._turn:  # against close(), which marks the object closed under it
            if self.restart_on_crash and self._background_restarts \
                    and self._replacement is None and not self._closed:
                old, self._engine = self._engine, None
                self._replacement = _Replacement(self._start_engine, old,
                                                 self._old_input_cut())

    def _old_input_cut(self) -> bool:
        """For a replacement in the background: whether the engine it
        replaces writes a ``-f`` model and its input may end in a cut line
        (a call interrupted in the middle of a line, or inside a write): it
        is then killed, so that it saves nothing rather than learn the cut
        line. (The rest is not written there, as :meth:`restart` writes it:
        the failed call may still be ending on the channel, in another
        thread.)"""
        channel = self._channel
        return (self._writes_final_model and channel is not None
                and not channel.input_ends_whole)

    def _drive(self, engine: EngineProcess, exchange: Exchange,
               detailed: Optional[Dict[str, List[Any]]] = None) -> Iterator[List[Any]]:
        """:func:`~subwabbit.sync_driver.drive`, remembering engine failures."""
        runner = drive(engine, exchange, detailed, self._step_lock)
        while True:
            try:
                results = next(runner)
            except StopIteration:
                return
            except ENGINE_FAILURES as exc:
                self._fail_or_closed(exc)
                raise
            yield results

    def _fail_or_closed(self, exc: VowpalWabbitError) -> None:
        """A call's engine failed: :meth:`_fail`, unless close() killed it
        under the call, which then raises that the process was closed (as a
        call of the asyncio class does), not that its engine failed."""
        if self._closing:
            raise VowpalWabbitError(f"this call cannot go on: the {type(self).__name__} was "
                                    "closed; its remaining predictions were discarded") from exc
        self._fail(exc)

    def _run(self, exchange: Exchange) -> List[Any]:
        """:func:`~subwabbit.sync_driver.run`, remembering engine failures."""
        engine = self._engine
        assert engine is not None
        try:
            return run(engine, exchange, self._step_lock)
        except ENGINE_FAILURES as exc:
            self._fail_or_closed(exc)
            raise

    # ------------------------------------------------------------- restart

    def _restart_engine(self, reason: str, timeout: float = 5.0,
                        level: int = logging.WARNING) -> None:
        """Stop the engine (if any) and start a new one.

        :param level: the level of the log record of the restart (``INFO`` for
            a forked child's first engine: nothing failed)
        """
        old = self._engine
        old_pid = old.pid if old is not None else None
        if self._replacement is not None:
            self._replacement.cancel(timeout)
            self._replacement = None
        self._abandon_channel(f"the process's engine was restarted ({reason})")
        if old is not None and not old.closed:
            if self._broken is not None:
                # A failed engine has nothing worth waiting for: it is dead, or
                # stuck, or its output can no longer be trusted.
                timeout = min(timeout, _FAILED_ENGINE_CLOSE_S)
            _close_old_engine(old, timeout,
                              self._channel if self._writes_final_model else None)
        self._engine = self._channel = None
        try:
            self._adopt(self._start_engine())
        except VowpalWabbitError as exc:
            self._broken = exc
            raise
        self._broken = None
        self._restart_count += 1
        logger.log(level, "restarted the vw engine (%s): %s -> vw[%s], restart #%d",
                   reason, "no engine" if old_pid is None else f"vw[{old_pid}]", self.pid,
                   self._restart_count)

    def reload(self, vw_args: VwArgs, timeout: float = 5.0) -> None:
        """Switch to an engine started with new arguments (typically
        ``-i new_model.vw``), with no failed call.

        The new engine is started and checked while calls go on with the old
        one; then, between two calls, the process switches to it, and the old
        engine is closed in the background (within ``timeout``; its ``-f``
        model, if any, is written). What the old engine had in flight is
        dropped with it. A process that had failed is healthy again after a
        reload. Reloads asked for at the same time run one after the other,
        in the order they were asked for: the last one serves.

        :param vw_args: the new engine arguments
        :param timeout: seconds the old engine gets to exit
        :raises VowpalWabbitStartupError: when the new engine cannot start;
            the process goes on with the old one
        :raises VowpalWabbitBusyError: when another thread's call holds the
            process for longer than ``io_timeout_s`` (the new engine is stopped)
        """
        timeout = required_seconds(timeout, "timeout")
        let_go_after_unhooked_fork()
        if self._closed:
            raise self._closed_error()
        # One at a time, in the order asked for: the last one asked for
        # serves (else two overlapping reloads switched in the order their
        # engines happened to start, and the older model could stay).
        with self._reload_lock:
            if self._closed:  # (while an earlier reload ran)
                raise self._closed_error()
            plan = self._plan_reload(vw_args)
            engine = self._start_engine(argv=plan.argv, probes_teach=plan.probes_teach)
            began = time.perf_counter()
            token = object()
            try:
                held = self._wait_for_turn(token, self._turn_limit(began, None))
            except BaseException:  # close() ran meanwhile (or an interrupt)
                engine.abort()
                raise
            if not held:
                engine.abort()
                raise self._busy_error(time.perf_counter() - began)
            try:
                if self._closed:
                    engine.abort()
                    raise self._closed_error()
                self._fail_if_torn()  # (then the old engine is closed as a failed one)
                if self._replacement is not None:
                    self._replacement.cancel(timeout)
                    self._replacement = None
                old = self._engine
                if self._in_forked_child():
                    old = None  # the parent's: never touched here
                # (the old engine's: reloaded() takes the new arguments')
                old_channel = self._channel if self._writes_final_model else None
                self._reloaded(plan)
                self._abandon_channel("the process switched to a new engine (reload)")
                self._adopt(engine)
                failed, self._broken = self._broken, None
            finally:
                self._end_turn(token)
        logger.info("reloaded: vw[%s] -> vw[%s] (%s)", old.pid if old else None, engine.pid,
                    " ".join(plan.argv))
        if old is not None and not old.closed:
            self._retiring.add([old])
            threading.Thread(target=_close_old_engine,
                             args=(old, min(timeout, _FAILED_ENGINE_CLOSE_S) if failed
                                   else timeout, old_channel),
                             name="subwabbit-reload-close", daemon=True).start()

    def restart(self, timeout: float = 5.0) -> None:
        """Replace the engine with a fresh one started with the same command line.

        The old engine is closed first (its input is closed, so a ``-f`` model
        is written; SIGTERM and SIGKILL follow within ``timeout``). Predictions
        still in flight are lost, and unfinished ``predict`` iterators raise if
        resumed. Works on a healthy or a failed process, not a closed one.

        :param timeout: seconds the old engine gets to exit
        :raises VowpalWabbitStartupError: when the new engine cannot start (the
            process stays failed; call ``restart()`` again)
        :raises VowpalWabbitBusyError: when another thread's call holds the
            process for longer than ``io_timeout_s``
        """
        timeout = required_seconds(timeout, "timeout")
        let_go_after_unhooked_fork()
        if self._closed:  # at once, not after waiting for a call left holding it
            raise self._closed_error()
        began = time.perf_counter()
        token = object()
        if not self._wait_for_turn(token, self._turn_limit(began, None)):
            raise self._busy_error(time.perf_counter() - began)
        try:
            if self._closed:
                raise self._closed_error()
            if self._in_forked_child() and self._engine is None:
                self._owner_pid = os.getpid()
            self._restart_engine("restart() was called", timeout)
        finally:
            self._end_turn(token)

    # ------------------------------------------------------------ predict

    def predict(self, common_features: Any, items_features: Iterable[Any],
                timeout: Optional[float] = None, debug_info: Any = None,
                metrics: Optional[Dict[str, Any]] = None,
                detailed_metrics: Optional[Dict[str, Any]] = None) -> Iterator[Any]:
        """Predictions for the items, in item order (see the subclasses)."""
        start = time.perf_counter()
        deadline = deadline_from_timeout(timeout, start=start)
        warn_if_milliseconds(timeout)
        check_per_item(items_features, "items_features")
        metrics = self._prepare_metrics(metrics, detailed_metrics, self._detailed_keys)
        return self._predict(start, deadline, common_features, items_features, debug_info,
                             metrics, detailed_metrics)

    def _predict(self, start: float, deadline: Optional[float], common_features: Any,
                 items_features: Iterable[Any], debug_info: Any,
                 metrics: Optional[Dict[str, Any]],
                 detailed: Optional[Dict[str, Any]]) -> Iterator[Any]:
        # pylint: disable=too-many-locals
        clock = time.perf_counter
        yielded = 0
        token: Optional[object] = None
        exchange: Optional[PredictExchange] = None
        pacing = self._pacing()
        try:
            # Raised at the first next(), as in 2.x.
            self._require_predictions("predict")
            self._check_usable()
            token = self._begin_call(deadline, metrics, quiet_deadline=True)
            if token is None:
                return
            engine, channel = self._engine_or_raise()
            common_part = format_common_part(self.formatter, common_features, debug_info)
            call = channel.begin()
            if metrics is not None:
                metrics["prepare_time"] = clock() - start
                if pacing.hard_deadline:
                    metrics["before_cleanup_pending_lines"] = channel.stale_lines
            exchange = new_predict_exchange(
                channel, call, kind=self.prediction_kind, formatter=self.formatter,
                common_part=common_part, common_features=common_features, items=items_features,
                debug_info=debug_info, pacing=pacing, deadline=deadline,
                idle_s=self.io_timeout_s, detailed=detailed, clock=clock,
                timing_per_line=self._timing_per_line, format_s_per_item=self._format_s_per_item)
            for predictions in self._drive(engine, exchange, detailed):
                for prediction in predictions:
                    yielded += 1  # counted before the caller can stop at this yield
                    yield prediction
        except ENGINE_FAILURES:
            self._count_failure(metrics)
            raise
        finally:
            self._finish_predict_metrics(metrics, exchange, start, self._leftover_lines(),
                                         pacing.hard_deadline)
            if metrics is not None:
                metrics["num_lines"] = yielded  # what the caller received
            if exchange is not None:
                self._format_s_per_item = exchange.format_s_per_item
                ended_here = exchange.call.active  # (not by a call that superseded it)
                exchange.end()
                if ended_here:
                    # An engine that owes what the call left in flight and
                    # prints nothing is quiet from now on, not from the next
                    # call (see _fail_if_stuck).
                    exchange.channel.note_progress(clock())
            if token is not None:
                self._end_turn(token)
            self._finish_call("predict", metrics)

    # -------------------------------------------------------------- train

    def train(self, common_features: Any, items_features: Iterable[Any],
              labels: Iterable[Label], weights: Optional[Iterable[Optional[float]]] = None,
              debug_info: Any = None) -> None:
        """Learn from labelled items (see the subclasses)."""
        start = time.perf_counter()
        if self.audit_mode:
            raise VowpalWabbitError("train() is not available in audit mode; use explain_vw_line()")
        metrics = self._train_metrics()
        learnt = 0
        try:  # the hook hears of the call however it ends, refused input included
            self._check_usable()
            lines = self._format_training_lines(common_features, items_features, labels,
                                                weights, debug_info)
            with self._call(None, metrics):
                _, channel = self._engine_or_raise()
                if lines:
                    self._run(SendExchange(channel, channel.begin(keep=False), lines,
                                           self.io_timeout_s))
            # a multi-line example's lines are its shared line and one per item
            learnt = len(lines) - 1 if self.prediction_kind.multi_line and lines else len(lines)
        except ENGINE_FAILURES:
            self._count_failure(metrics)
            raise
        finally:
            self._finish_train(metrics, start, learnt)

    # ---------------------------------------------------- save and explain

    def save(self, path: SavePath, timeout: Optional[float] = None) -> None:
        """Save the model to ``path`` now, while the engine keeps running.

        The engine writes its model through its ``save_...|`` control example,
        which yields no prediction, so the count of predictions is not
        disturbed. The file appears atomically (written beside ``path``, then
        renamed) and is complete when this method returns.

        .. note:: The engine saves what it has. A process running with ``-t``
           saves its weights without the learning state, and in vw 9.x such a
           model scores differently once loaded (``vw -i m -t -f copy`` does the
           same); save from a process without ``-t`` to keep a model intact.

        :param path: where to write the model, a ``str``, ``bytes`` or
            :class:`os.PathLike` path (parent directories are created)
        :param timeout: seconds to wait for the engine; ``None``: no limit but
            ``io_timeout_s`` without progress
        :raises VowpalWabbitError: when the engine fails or times out (a
            timed-out save leaves the process failed: restart or close it),
            or makes several passes (``--passes`` above 1: nothing is sent)
        :raises OSError: when no file can be written where ``path`` points
            (nothing is sent to the engine, which keeps serving)
        """
        self._refuse_save_of_passes()
        deadline = deadline_from_timeout(timeout)
        self._check_usable()
        with self._call(deadline):
            engine, channel = self._engine_or_raise()
            save = ModelSave(path)
            written_before = channel.bytes_written
            done = False
            try:
                timed_out = False
                for exchange in self._save_exchanges(channel, save, deadline):
                    self._run(exchange)
                    timed_out = exchange.timed_out
                if timed_out:
                    error = VowpalWabbitTimeoutError(f"timed out saving the model to {save.target}")
                    self._fail(error)
                    raise error
                if not self._save_probes:
                    try:
                        wait_for_file(engine, save.written, self._save_file_limit(deadline),
                                      f"saving the model to {save.target}")
                    except ENGINE_FAILURES as exc:
                        self._fail(exc)
                        raise
                save.finish(engine)
                done = True
            finally:
                save.clean_up_after(engine, done, channel.bytes_written != written_before,
                                    self.io_timeout_s)

    def explain_vw_line(self, vw_line: str, link_function: bool = False) -> Tuple[float, str]:
        """Audit one example: its raw score and the features that made it.

        Needs ``audit_mode=True``. In audit mode the engine prints three lines
        per example (raw score, features, final prediction), which are read
        together, so calls can follow each other indefinitely. A labelled line
        also trains the model unless the engine runs with ``-t``.

        :param vw_line: one example in VW text format (one trailing newline, as a
            line read from a file has, is dropped, as subwabbit 2.x did)
        :param link_function: accepted for compatibility with subwabbit 2.x;
            the output shape no longer depends on it
        :returns: ``(raw prediction, explanation string)``, the explanation being
            tab-separated ``namespace^feature:hashindex:value:weight`` entries for
            :meth:`~subwabbit.base.VowpalWabbitBaseFormatter.get_human_readable_explanation`
        :raises VowpalWabbitError: when the process is not in audit mode
        :raises ValueError: when ``vw_line`` is not exactly one example
        """
        del link_function
        if not self.audit_mode:
            raise VowpalWabbitError("explain_vw_line() needs a process created with audit_mode=True")
        vw_line = audit_line(vw_line)
        self._check_usable()
        with self._call():
            _, channel = self._engine_or_raise()
            exchange = AuditExchange(channel, channel.begin(), vw_line, self.io_timeout_s)
            self._run(exchange)
            raw, features, _prediction = exchange.answer
            try:
                score = parse_scalar(raw)
            except VowpalWabbitProtocolError as exc:
                self._fail(exc)
                raise
        return score, features.decode("utf-8", "replace").strip("\t\r ")

    def _cleanup(self, deadline: Optional[float]) -> bool:
        """Read and discard earlier calls' leftovers until ``deadline``."""
        token = self._begin_call(deadline, quiet_deadline=True)
        if token is None:
            return False
        try:
            _, channel = self._engine_or_raise()
            if not channel.stale_lines:
                return True
            exchange = CleanupExchange(channel, channel.begin(keep=False), deadline,
                                       self.io_timeout_s)
            self._run(exchange)
            return not channel.stale_lines
        finally:
            self._end_turn(token)

    # ------------------------------------------------------------- lifecycle

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine: close its input so that it finishes (and writes a
        ``-f`` model), then SIGTERM and SIGKILL it if it has not exited near
        the end of ``timeout``. Returns within ``timeout`` seconds (another
        thread's running call is given half of it to finish first; then its
        engine is killed if it still runs, and a call that still runs at three
        quarters of it keeps the engine's pipes and closes them when it
        ends, raising that the process was closed). An engine being started
        for the object (by a reload, a restart or a replacement in another
        thread) is killed, and the call that started it raises that the
        process was closed. An engine that a reload replaced and that is
        still closing in the background is killed near the end of
        ``timeout``. Closing twice is harmless. In a forked child it
        only lets go of the parent's engine.

        :raises VowpalWabbitEngineExitedError: when the engine exits with an
            error of its own that no earlier call reported
        :raises VowpalWabbitTimeoutError: when an engine started with
            ``-f``/``--final_regressor`` had to be terminated before it exited:
            its model is not written (pass a longer ``timeout``)
            (or killed because it stayed stopped, SIGSTOP, a debugger: with
            a line a call left cut too)
            (or killed because another thread's call still held it after half
            of ``timeout``)
        :raises VowpalWabbitProtocolError: when an engine started with ``-f``
            was killed, unsaved, because a call was interrupted inside a write
            to it (see :func:`~subwabbit.transfer.unsaved_model_error`)
        """
        timeout = required_seconds(timeout, "timeout")
        let_go_after_unhooked_fork()
        if self._closed:
            return
        self._closing = True
        began = time.perf_counter()
        token = object()
        held = self._wait_for_turn(token, began + timeout / 2)
        #: the engine close() killed under another thread's call (its -f
        #: model is then not written, which close() raises)
        killed_for_call: Optional[EngineProcess] = None
        if not held and self._engine is not None and self._engine.returncode is None:
            # Another thread's call is still running: kill the engine so that
            # it fails at once, and let it end before the pipes are closed.
            logger.warning("close(): another thread's call still holds %r; killing the engine",
                           self)
            killed_for_call = self._engine
            killed_for_call.kill()
            held = self._wait_for_turn(token, began + timeout * 0.75)
        try:
            with self._turn:  # an engine being adopted is either seen below or refused
                self._closed = True
                self._turn.notify_all()  # calls waiting for the turn raise
                # A call that still holds on keeps its (killed) engine's pipes
                # until it ends its turn: closed under it, their descriptor
                # numbers could go to another engine's pipe or a file before
                # its next read or write, which would then take bytes that are
                # not its own.
                left = self._engine if not held and self._holder is not None else None
                leave_to_call = left is not None
                if leave_to_call:
                    self._close_on_turn_end = left
            self._abandon_channel("the process was closed")
            # (a spawn under way takes milliseconds: let it end, and kill it too)
            killed = self._new_engines.kill_all(min(timeout, SPAWN_WAIT_S))
            await_exits(killed, began + timeout)
            replacement, self._replacement = self._replacement, None
            if replacement is not None:
                replacement.cancel(max(0.0, timeout / 4))
            if self._engine is not None and not leave_to_call:
                # (a call cut off in the middle of a line: vw would learn the
                # cut line into the model it saves; where its rest cannot be
                # written, the engine must save nothing)
                unsaved = (self._writes_final_model and self._channel is not None
                           and killed_for_call is None
                           and not finish_example(self._engine, self._channel,
                                                  began + timeout / 4))
                stopped = unsaved and self._engine.stayed_stopped(time.perf_counter())
                if unsaved:
                    self._engine.kill()
                self._engine.close(max(0.0, timeout - (time.perf_counter() - began)),
                                   final_model=self._writes_final_model)
                if unsaved:
                    raise unsaved_model_error(self._engine, stopped, timeout)
            elif left is not None:
                # An engine that had exited on its own before close() killed
                # it: its failure is this close()'s to report, as it would be
                # had its pipes been closed here. (The engine left to the call,
                # not self._engine: the call may have cleared that since,
                # restarting its engine.)
                code = left.proc.poll()
                failure = None if code is None else left.own_failure(code)
                if failure is not None:
                    raise failure
            if killed_for_call is not None and self._writes_final_model:
                raise killed_under_a_call_error(killed_for_call, timeout)
        finally:
            if held:
                self._end_turn(token)
            self._retiring.end(began + timeout)  # (what reload() replaced)

    def __enter__(self) -> "VowpalWabbitProcessModel":
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        try:
            self.close()
        except VowpalWabbitError:
            if exc_type is None:
                raise
            logger.exception("closing the vw engine failed while another exception propagated")

    def __del__(self) -> None:
        try:
            self._release()
        finally:  # (its ResourceWarning may raise, when warnings are errors)
            replacement = getattr(self, "_replacement", None)
            if replacement is not None and replacement.engine is not None \
                    and not replacement.engine.closed:
                replacement.engine.release()

    def _after_fork_in_child(self) -> None:
        self._turn = threading.Condition(threading.RLock())
        self._turn_queue = collections.deque()
        self._holder = None
        self._step_lock = threading.Lock()  # (a parent's thread may have held it)
        self._reload_lock = FifoLock()
        try:
            if self._engine is not None:
                self._engine.abandon_in_fork()
            if self._replacement is not None:
                self._replacement.abandon_in_fork()
            self._abandon_channel("the process was forked; its engine belongs to the parent",
                                  in_fork=True)
        finally:  # whatever happens above, the child starts an engine of its own
            self._engine = self._channel = self._replacement = None
            self._new_engines.reset_in_fork()
            self._retiring.reset_in_fork()
            self._closing = self._closed  # (a close() of the parent's does not close the child's)
            self._close_on_turn_end = None
            self._broken = None


def _close_old_engine(engine: EngineProcess, timeout: float,
                      channel: Optional[Channel] = None) -> None:
    """Close an engine that a reload (on a thread of its own) or a restart
    replaced, logging its failure.

    :param channel: its channel, for an engine that saves a ``-f`` model: the
        rest of an example a call left partly written is written first (see
        :func:`~subwabbit.transfer.finish_example`); where it cannot be, the
        engine is killed, and saves nothing
        (:func:`~subwabbit.transfer.unsaved_model_error`)
    """
    if channel is not None and not finish_example(engine, channel,
                                                  time.perf_counter() + timeout / 4):
        engine.kill()
        logger.warning("the replaced vw engine: %s", unsaved_model_error(engine))
    try:
        engine.close(timeout)
    except VowpalWabbitError as exc:
        logger.warning("the replaced vw engine failed: %s", exc)

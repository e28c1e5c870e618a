"""A pool of engines of one model for threaded services.

:class:`VowpalWabbitPool` runs several engines and serves any number of
threads at once. Each call runs the steps of :class:`~subwabbit.pool_base.PoolBase`
on the calling thread: it waits in ``select`` on the pipes of the engines it
holds, and on a condition variable for a free engine, so threads hold no lock
while they do I/O.
"""

import logging
import os
import select
import threading
import time
import weakref
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from .base import VowpalWabbitBaseFormatter
from .client import DEFAULT_IO_TIMEOUT_S, FifoLock, MetricsHook, let_go_after_unhooked_fork
from .command import VwArgs
from .core.roster import Slot
from .core.split import Lane
from .deadlines import required_seconds
from .engine_group import EngineGroup
from .engine_process import SELECT_FD_LIMIT, EngineProcess, close_quietly, retire_quietly
from .errors import VowpalWabbitError
from .nonblocking import DEFAULT_WRITE_CUTOFF_S
from .pool_base import (POOL_BATCH_SIZE, POOL_MAX_PENDING_LINES, PoolBase, WaitForEngine,
                        WaitForPipes, discard)

logger = logging.getLogger("subwabbit")

_clock = time.perf_counter


class VowpalWabbitPool(PoolBase):
    """Several engines of one model, shared by any number of threads.

    ``predict`` may be called from many threads at once; each call gets
    exactly its own predictions. A call's items are cut into batches that are
    dealt to the engines it holds, so one large request is scored by several
    engines at once; when calls run or wait concurrently, each holds an equal
    share of the engines (a call that holds more than its share gives one
    back as soon as its answers are in). A call never waits past its deadline
    for a free engine: it returns what was ready, possibly ``[]``.

    A pool serves; it does not learn: :meth:`train` raises. Train with one
    write-only :class:`~subwabbit.blocking.VowpalWabbitProcess`, save, and
    :meth:`reload` the pool with the new model: calls in progress finish on
    the old engines, later calls use the new ones, no call fails.

    An engine that fails, or that owes answers and prints nothing for
    ``io_timeout_s``, is replaced in the background (logged at WARNING,
    counted in :meth:`~subwabbit.pool_base.PoolBase.stats`); the batches it
    owed a call are dealt to the call's other engines. When engines keep
    failing soon after they start, their replacements wait, up to a second
    (:data:`~subwabbit.pool_base.YOUNG_FAILURE_RETRY_S`).

    :param formatter: turns common and item features into VW lines
    :param vw_args: engine arguments, typically ``["-i", "model.vw", "-t", "--quiet"]``
    :param size: how many engines (default: the CPUs this process may use,
        :func:`~subwabbit.cpus.usable_cpus`: its affinity, within its cgroup's CPU quota);
        at most :func:`~subwabbit.pool_size.largest_pool_size` (1024, fewer when
        ``ulimit -n`` leaves too few open files for the engines' pipes): more is
        a :class:`ValueError` before any engine starts
    :param batch_size: items formatted and sent to one engine at a time
        (:data:`~subwabbit.pool_base.POOL_BATCH_SIZE`, twice a single process's)
    :param max_pending_lines: the most lines in flight per engine
        (:data:`~subwabbit.pool_base.POOL_MAX_PENDING_LINES`)
    :param write_cutoff_s: no new batch is sent this long before a deadline
    :param vw_command: the engine command; see :class:`~subwabbit.blocking.VowpalWabbitProcess`
    :param metrics_hook: called with each call's metrics dict when it ends
    :param startup_timeout_s: how long each engine may take to start and answer
    :param io_timeout_s: how long an engine may owe answers and print nothing
        before it is taken for stuck and replaced
    :param restart_after_fork: in a forked child, start the pool's own engines
        at the first call (``False``: raise)
    :param share_weights: with the wheel's engine, load the model once and
        fork the engines from that process, so that they share its memory
        (see :meth:`~subwabbit.pool_base.PoolBase.memory_usage`); a ``vw``
        executable, a model that needs vw's own driver, or ``-f`` in
        ``vw_args`` load a copy per engine, and a pool of one engine starts
        it on its own (nothing to share; it runs vw's two-thread driver)
    :param prediction_type: the kind of model, when ``vw_args`` do not show it
        (see :doc:`model_kinds`). Predictions are typed as for the single
        classes; a multi-line kind (``--cb_explore_adf``) makes one example of
        each call, served whole by one engine
    :param low_priority_engines: run the engines below the calling threads'
        priority (``SCHED_BATCH`` and nice +5; see
        :func:`~subwabbit.engine_group.lower_priority`), so that an engine
        woken by a write does not take the core of the thread that feeds it.
        Default (``None``): when the pool has several engines and they and
        one calling thread are more than the CPUs the process may use (a
        pool of the default size on 2 CPUs or more); a pool of one engine
        runs it at the client's priority
    :raises VowpalWabbitStartupError: when an engine cannot start (the
        others are stopped)
    """

    def __init__(self, formatter: VowpalWabbitBaseFormatter, vw_args: VwArgs,
                 size: Optional[int] = None, *, batch_size: int = POOL_BATCH_SIZE,
                 max_pending_lines: int = POOL_MAX_PENDING_LINES,
                 write_cutoff_s: float = DEFAULT_WRITE_CUTOFF_S,
                 vw_command: Union[str, Sequence[str], None] = None,
                 metrics_hook: Optional[MetricsHook] = None, startup_timeout_s: float = 30.0,
                 io_timeout_s: Optional[float] = DEFAULT_IO_TIMEOUT_S,
                 restart_after_fork: bool = True, share_weights: bool = True,
                 prediction_type: Optional[str] = None,
                 low_priority_engines: Optional[bool] = None) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._reload_lock = FifoLock()
        #: engines (and groups) to stop once the state lock is released (see :meth:`_discard`)
        self._discards: List["tuple[List[EngineProcess], Optional[EngineGroup]]"] = []
        self._configure_pool(formatter, vw_args, size, batch_size=batch_size,
                             max_pending_lines=max_pending_lines, write_cutoff_s=write_cutoff_s,
                             vw_command=vw_command, metrics_hook=metrics_hook,
                             startup_timeout_s=startup_timeout_s, io_timeout_s=io_timeout_s,
                             restart_after_fork=restart_after_fork, share_weights=share_weights,
                             prediction_type=prediction_type,
                             low_priority_engines=low_priority_engines)
        group, engines = self._spawn(self.argv, self.vw_args, self.size)
        self._groups[0] = group
        self._enlist(engines, 0, group)

    # ------------------------------------------------- the driver's part

    def _state_lock(self) -> threading.Condition:
        return self._cond

    def _changed(self) -> None:
        self._cond.notify_all()

    def _discard(self, engines: List[EngineProcess], group: Optional[EngineGroup] = None
                 ) -> None:
        # Called with the state lock held: stopping them (reaping an engine
        # that frees a large model takes a while) waits until it is released,
        # so that no call waits for it (see _discard_pending).
        self._discards.append((engines, group))

    def _discard_pending(self) -> None:
        """Stop what :meth:`_discard` set aside (without the state lock)."""
        with self._cond:
            pending, self._discards = self._discards, []
        for engines, group in pending:
            try:
                discard(engines, group)
            except Exception as exc:  # pylint: disable=broad-except
                logger.error("stopping vw engines of no use failed: %r", exc)

    def _spawn(self, argv: List[str], vw_args: List[str], count: int
               ) -> "tuple[EngineGroup, List[EngineProcess]]":
        group = self._new_group(argv, vw_args)
        return group, group.start(count)

    def _close_later(self, slots: List[Slot], timeout: float = 5.0) -> None:
        if slots:
            self._retiring.add([slot.engine for slot in slots])
            threading.Thread(target=_retire_all, args=([slot.engine for slot in slots], timeout),
                             name="subwabbit-pool-close", daemon=True).start()

    def _start_engine_later(self, generation: int, delay: float = 0.0) -> None:
        threading.Thread(target=_keep_trying,
                         args=(weakref.ref(self), self._cond, "_try_replacement", generation,
                               delay),
                         name="subwabbit-pool-replace", daemon=True).start()

    def _engine_exited(self, pid: int) -> None:
        if not self._closed:
            threading.Thread(target=self._replace_if_dead_and_free, args=(pid,),
                             name="subwabbit-pool-exit", daemon=True).start()

    def _try_replacement(self, generation: int) -> None:
        """One attempt to start a replacement engine for ``generation`` and
        put it in service (nothing when it is no longer wanted).

        :raises Exception: when the engine could not start (see :func:`_keep_trying`)
        """
        group = self._replacement_wanted(generation)
        if group is None:  # (closed, or another model, since it was due)
            return
        engine = group.add_one()
        with self._cond:
            added = self._put_in_service([engine], generation, replacing=True)
        self._discard_pending()
        if added:
            logger.warning("replaced a failed vw engine of the pool: now vw[%s]", engine.pid)

    # --------------------------------------------------------------- predict

    def predict(self, common_features: Any, items_features: Iterable[Any],
                timeout: Optional[float] = None, debug_info: Any = None,
                metrics: Optional[Dict[str, Any]] = None) -> List[Any]:
        """Predictions for the items, in item order: the longest prefix of
        items whose predictions are ready by the deadline.

        Safe to call from any number of threads at once.

        :param common_features: passed to ``format_common_features``
        :param items_features: one entry per item
        :param timeout: seconds; ``None``: no limit
        :param debug_info: passed to every formatter call
        :param metrics: filled with ``num_lines``, ``total_time``,
            ``lock_wait_time`` (waiting for a free engine),
            ``waited_for_other_call`` (1 when no engine was free at first),
            ``engines`` (how many engines served the call),
            ``engine_failures`` (engines that failed during it),
            ``hedged_lines`` (lines dealt a second time, to an engine with
            room, when the one holding them went quiet),
            ``model_generation`` (the :attr:`~subwabbit.pool_base.PoolBase.generation`
            that served it; ``None`` if no engine did) and ``restarts`` (1 when
            the call started the pool's engines after a fork)
        :returns: a list of predictions
        :raises ValueError: when a formatted line is not exactly one example
        :raises VowpalWabbitError: when the pool is closed; without a deadline,
            :class:`~subwabbit.errors.VowpalWabbitBusyError` when no engine is
            free within ``io_timeout_s``
        """
        flow = self._predict_flow(common_features, items_features, timeout, debug_info,
                                  metrics)
        try:
            wait = next(flow)
            while True:
                if type(wait) is WaitForPipes:  # pylint: disable=unidiomatic-typecheck
                    wait = flow.send(_wait_for_lanes(wait.lanes, wait.until))
                    continue
                if type(wait) is WaitForEngine:  # pylint: disable=unidiomatic-typecheck
                    self._wait_for_change(wait.version, wait.until)
                elif self._roster.calls + self._roster.waiting > 1:
                    # A turn to give: the other calls (running, or waiting for
                    # an engine) need the interpreter lock to keep their deadlines.
                    time.sleep(0)
                wait = next(flow)
        except StopIteration as finished:
            return finished.value
        finally:
            flow.close()

    def _wait_for_change(self, version: int, until: Optional[float]) -> None:
        with self._cond:
            while self._roster.version == version:
                left = None if until is None else until - _clock()
                if left is not None and left <= 0:
                    return
                self._cond.wait(left)

    def _check_open(self) -> bool:
        let_go_after_unhooked_fork()
        if self._closed:
            raise self._closed_error()
        return self._in_forked_child() and self._start_in_fork()

    # ----------------------------------------------------------- not served

    def train(self, *args: Any, **kwargs: Any) -> None:
        """Refused: a pool serves one model (see :class:`VowpalWabbitPool`).

        :raises VowpalWabbitError: always
        """
        raise self._refuse_training("train")

    # ---------------------------------------------------------------- reload

    def reload(self, vw_args: VwArgs, timeout: float = 5.0) -> None:
        """Serve a new model (typically new ``vw_args`` with ``-i new_model``)
        with no failed call.

        New engines are started and checked first; then new calls go to
        them, calls in progress finish on the old engines, and each old
        engine is closed once no call holds it. Reloads asked for at the
        same time run one after the other, in the order they were asked
        for: the last one serves.

        :param vw_args: the new engine arguments
        :param timeout: how long each old engine gets to exit
        :raises VowpalWabbitStartupError: when a new engine cannot start; the
            pool keeps serving the old model
        """
        let_go_after_unhooked_fork()
        with self._reload_lock:  # one at a time: the last one asked for serves
            plan, timeout = self._check_reload(timeout, vw_args)
            try:
                group, engines = self._spawn(plan.argv, plan.vw_args, self.size)
            except VowpalWabbitError as exc:
                if self._closed:  # close() stopped the new engines as they started
                    raise self._closed_error() from exc
                raise
            try:
                with self._cond:
                    idle, old_groups = self._switch_to(group, engines, plan)
            finally:
                self._discard_pending()
        self._close_later(idle, timeout)
        for old in old_groups:
            old.retire(timeout)

    # ------------------------------------------------------------------ fork

    def _after_fork_in_child(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._reload_lock = FifoLock()
        # The parent's to stop, not ours: let go of them untouched.
        discards, self._discards = self._discards, []
        for engines, group in discards:
            for engine in engines:
                engine.abandon_in_fork()
            if group is not None:
                group.abandon_in_fork()
        self._after_fork_in_child_base()

    def _start_in_fork(self) -> bool:
        """In a forked child: start the pool's own engines in the background
        (once); calls wait for them within their deadlines.

        :returns: whether this call started them (another thread's call may
            have been first)
        """
        if not self.restart_after_fork:
            raise self._fork_error()
        with self._cond:
            if not self._in_forked_child():
                return False
            logger.info("this process (%d) is a fork of %d: starting the pool's own engines",
                        os.getpid(), self._owner_pid)
            self._owner_pid = os.getpid()
            self._restart_count += 1
            generation = self._roster.generation
            self._groups = {}
        threading.Thread(target=_keep_trying,
                         args=(weakref.ref(self), self._cond, "_try_own_engines", generation),
                         name="subwabbit-pool-start", daemon=True).start()
        return True

    def _try_own_engines(self, generation: int) -> None:
        """In a forked child: one attempt to start the pool's own engines
        for ``generation`` and put them in service (nothing when they are no
        longer wanted).

        :raises Exception: when they could not start (see :func:`_keep_trying`)
        """
        group = self._new_group(self.argv, self.vw_args)
        with self._cond:
            if not self._serving(generation):
                return
            # Recorded before it starts: close() closes it, which cuts the start short.
            self._groups[generation] = group
        try:
            engines = group.start(self.size)
        except BaseException:
            with self._cond:
                if self._groups.get(generation) is group:
                    del self._groups[generation]
            raise
        self._check_file_after_fork(group)
        with self._cond:
            self._put_in_service(engines, generation, group=group)
        self._discard_pending()

    # ----------------------------------------------------------------- close

    def close(self, timeout: float = 30.0) -> None:
        """Stop every engine within ``timeout`` (input closed, then SIGTERM
        and SIGKILL). Calls in progress end at their next step with the
        predictions they have, and give their engines back before those are
        closed. A call that holds on for more than half the timeout has its
        engines killed and ends with what it has; it closes their pipes when
        it gives them back, so that nothing it still reads or writes can be
        another's. Engines being started (by a reload, or to replace a failed
        engine) are killed, and the reload raises that the pool was closed.
        Idempotent."""
        timeout = required_seconds(timeout, "timeout")
        let_go_after_unhooked_fork()
        deadline = _clock() + timeout
        with self._cond:
            slots = self._begin_close_now()
            if slots is None:
                return
            if not self._in_forked_child():
                # Calls in progress see the pool closed at their next step and
                # give their engines back: let them, for half the time.
                until = _clock() + timeout / 2
                while any(slot.held for slot in slots) and _clock() < until:
                    self._cond.wait(until - _clock())
            free = self._leave_held_to_their_calls_now(slots)
            # Taken under the lock: a start that this close cuts short takes
            # its group out of the dict from its own thread.
            groups = self._groups_to_close()
        if self._in_forked_child():
            self._abandon_in_fork(slots)
            return
        threads = []
        for slot in free:
            thread = threading.Thread(target=close_quietly,
                                      args=(slot.engine, max(0.0, deadline - _clock())),
                                      name="subwabbit-pool-close", daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(max(0.0, deadline - _clock()))
        for group in groups:
            group.close(max(0.0, deadline - _clock()))
        self._retiring.end(deadline)

    def __enter__(self) -> "VowpalWabbitPool":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _keep_trying(pool_ref: "weakref.ReferenceType[VowpalWabbitPool]", cond: threading.Condition,
                 attempt: str, generation: int, delay: float = 0.0) -> None:
    """Start engines for ``generation`` of a pool (on a thread of its own)
    with its method ``attempt`` (a key of
    :data:`~subwabbit.pool_base.START_ATTEMPTS`), trying again after a
    failure (any exception: a VowpalWabbitError, or the machine out of
    descriptors or threads) while the pool serves that model. Between
    attempts the thread holds the pool only weakly: a pool dropped without
    ``close()`` is released, and its engines with it, while a start waits.

    :param delay: seconds to wait before the first attempt
    """
    failures = 0
    wait: Optional[float] = delay
    while True:
        if wait and not _wait_to_try(pool_ref, cond, generation, wait):
            return
        pool = pool_ref()
        if pool is None:
            return
        try:
            getattr(pool, attempt)(generation)
            return
        except Exception as exc:  # pylint: disable=broad-except
            failures += 1
            wait = pool._start_failed(exc, failures, generation, attempt)  # pylint: disable=protected-access
        del pool
        if wait is None:
            return


def _wait_to_try(pool_ref: "weakref.ReferenceType[VowpalWabbitPool]", cond: threading.Condition,
                 generation: int, delay: float) -> bool:
    """Wait ``delay`` seconds before a start for ``generation``, holding the
    pool only weakly.

    :returns: ``False`` when the start is no longer wanted (the pool was
        dropped, closed, or serves another model: close() and reload() notify)
    """
    # Calls notify too, as they give engines back.
    retry_at = time.monotonic() + delay
    with cond:
        while True:
            pool = pool_ref()
            if pool is None or not pool._serving(generation):  # pylint: disable=protected-access
                return False
            del pool
            left = retry_at - time.monotonic()
            if left <= 0:
                return True
            cond.wait(left)


def _retire_all(engines: List[EngineProcess], timeout: float) -> None:
    for engine in engines:
        retire_quietly(engine, timeout)


def _wait_for_lanes(lanes: List[Lane[Slot]], until: Optional[float]) -> List[int]:
    """Sleep until an engine of ``lanes`` printed something or can take more
    input (when it has some waiting), or until ``until``.

    :returns: the stdout descriptors that are readable (output, or its end)
    """
    readers = [lane.key.engine.stdout_fd for lane in lanes]
    writers = [lane.key.engine.stdin_fd for lane in lanes if lane.channel.unwritten_bytes]
    timeout = None if until is None else max(0.0, until - _clock())
    if max(readers + writers) < SELECT_FD_LIMIT:
        return select.select(readers, writers, [], timeout)[0]
    poller = select.poll()
    for fd in readers:
        poller.register(fd, select.POLLIN)
    for fd in writers:
        poller.register(fd, select.POLLOUT)
    # Round down: waking a little early costs one more loop, waking late misses the deadline.
    events = poller.poll(None if timeout is None else int(timeout * 1000))
    return [fd for fd, event in events if event & _READABLE]


#: poll events after which a read returns output, or the end of it
#: (a descriptor closed under the call, POLLNVAL, is read too: the read raises)
_READABLE = select.POLLIN | select.POLLHUP | select.POLLERR | select.POLLNVAL

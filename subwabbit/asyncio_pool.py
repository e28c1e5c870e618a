"""A pool of engines of one model for asyncio services.

:class:`AsyncVowpalWabbitPool` is :class:`~subwabbit.pool.VowpalWabbitPool`
for ``async def`` code: the same steps (:class:`~subwabbit.pool_base.PoolBase`),
driven on the event loop. A call waits on its engines' pipes with
``add_reader`` and ``add_writer``; engines are started, checked and closed on
the loop's executor, so the loop is never blocked.
"""

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from typing import (Any, ContextManager, Dict, Iterable, Iterator, List, Optional, Sequence,
                    Set, Union)

from .asyncio_process import _FifoTurn, wait_for_engines
from .asyncio_support import close_left_behind, hand_off, hand_off_closing, wait_for_closing
from .base import VowpalWabbitBaseFormatter
from .client import DEFAULT_IO_TIMEOUT_S, MetricsHook, let_go_after_unhooked_fork
from .command import VwArgs
from .core.roster import Slot
from .deadlines import required_seconds
from .engine_group import EngineGroup
from .engine_process import EngineProcess, retire_quietly
from .errors import VowpalWabbitError
from .nonblocking import DEFAULT_WRITE_CUTOFF_S
from .pool_base import (POOL_BATCH_SIZE, POOL_MAX_PENDING_LINES, PoolBase, WaitForEngine,
                        WaitForPipes, discard)

logger = logging.getLogger("subwabbit")

_clock = time.perf_counter


class AsyncVowpalWabbitPool(PoolBase):
    """Several engines of one model, shared by any number of asyncio tasks.

    The asyncio counterpart of :class:`~subwabbit.pool.VowpalWabbitPool`,
    with the same guarantees: every task gets exactly its own predictions, a
    large request is dealt over several engines, concurrent requests share
    the engines fairly, no call waits past its deadline for an engine,
    :meth:`reload` switches models with no failed call, failed engines are
    replaced in the background, and :meth:`train` is refused. A cancelled
    call leaves every engine exact. Start it with ``await pool.start()`` or
    ``async with``::

        async with AsyncVowpalWabbitPool(formatter, ["-i", "model.vw", "-t"]) as pool:
            scores = await pool.predict(common_features, items, timeout=0.010)

    The parameters are those of :class:`~subwabbit.pool.VowpalWabbitPool`.
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
        self._configure_pool(formatter, vw_args, size, batch_size=batch_size,
                             max_pending_lines=max_pending_lines, write_cutoff_s=write_cutoff_s,
                             vw_command=vw_command, metrics_hook=metrics_hook,
                             startup_timeout_s=startup_timeout_s, io_timeout_s=io_timeout_s,
                             restart_after_fork=restart_after_fork, share_weights=share_weights,
                             prediction_type=prediction_type,
                             low_priority_engines=low_priority_engines)
        self._started = False
        self._waiters: List["asyncio.Future[None]"] = []
        self._tasks: Set["asyncio.Future[Any]"] = set()
        #: the tasks of :attr:`_tasks` that start engines: what each attempts,
        #: for which generation (see :meth:`_resume_cut_short_starts`)
        self._starts: Dict["asyncio.Future[Any]", "tuple[str, int]"] = {}
        #: the loop that started the engines (a fork server reports an
        #: engine's exit to it from another thread)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        # (not asyncio.Lock: one that was ever waited for belongs to its
        # loop, and start() or reload() on the next loop raised RuntimeError)
        self._start_lock = _FifoTurn()
        self._reload_lock = _FifoTurn()
        self._closing: Optional["asyncio.Future[None]"] = None
        self._closing_slots: List[Slot] = []
        self._loops = _OneLoopAtATime(type(self).__name__)

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> "AsyncVowpalWabbitPool":
        """Start the engines (on the loop's executor) and wait until each answers.

        :raises VowpalWabbitStartupError: when one cannot start (the others are stopped)
        """
        let_go_after_unhooked_fork()
        if self._closed:
            raise self._closed_error()
        async with self._start_lock:  # two tasks starting the pool start it once
            if self._in_forked_child():
                # Made (and perhaps started) in a parent process, started in
                # this one (a pool built at import under gunicorn --preload,
                # started in each worker's lifespan): the engines started now
                # are this process's own, and no call starts others.
                if self._started and not self.restart_after_fork:
                    raise self._fork_error()  # (started in the parent: its engines)
                self._owner_pid = os.getpid()
                self._started = False
            if not self._started:
                # The generation these engines are for: a reload() that
                # switches models while they start makes them the old model's,
                # and they are stopped (the reload's engines serve).
                generation = self._roster.generation
                group, engines = await self._spawn(self.argv, self.vw_args, self.size)
                if self._put_in_service(engines, generation, group=group):
                    self._groups[generation] = group
                elif self._closed:
                    raise self._closed_error()
                self._started = True
        return self

    async def __aenter__(self) -> "AsyncVowpalWabbitPool":
        return await self.start()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def _spawn(self, argv: List[str], vw_args: List[str], count: int
                     ) -> "tuple[EngineGroup, List[EngineProcess]]":
        self._loop = asyncio.get_running_loop()  # the loop that hears of engine exits
        group = self._new_group(argv, vw_args)
        return group, await _in_executor(group, group.start, count)

    async def close(self, timeout: float = 30.0) -> None:
        """Stop every engine within ``timeout`` without blocking the loop
        (input closed, then SIGTERM and SIGKILL). Calls in progress end at
        their next step with the predictions they have; as in
        :meth:`VowpalWabbitPool.close <subwabbit.pool.VowpalWabbitPool.close>`,
        one that holds on for more than half the timeout has its engines
        killed, and closes their pipes itself. Idempotent: a second call
        waits for the first one's closing.

        Cancelling ``close()`` (``asyncio.wait_for``, a shutdown) does not
        stop the closing: it goes on in the background, and what remains is
        handed to the loop's executor if the closing itself is cancelled.
        """
        timeout = required_seconds(timeout, "timeout")
        let_go_after_unhooked_fork()
        began = _clock()
        if self._closing is not None:
            if not await wait_for_closing(self._closing, timeout):
                logger.warning("close(): the first close() of the pool never ended (its event "
                               "loop was closed); closing its engines from this loop")
                await close_left_behind([slot.engine for slot in self._closing_slots],
                                        self._groups_to_close(), timeout)
            return
        slots = self._begin_close_now()
        if slots is None:
            return
        for task in list(self._tasks):
            task.cancel()
        if self._in_forked_child():
            self._abandon_in_fork(slots)
            return
        self._closing_slots = slots
        self._closing = asyncio.ensure_future(self._close_engines(slots, began, timeout))
        await asyncio.shield(self._closing)

    async def _close_engines(self, slots: List[Slot], began: float, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        closing: List["asyncio.Future[None]"] = []
        try:
            # Calls in progress see the pool closed at their next step and
            # give their engines back: let them, for half the time.
            while any(slot.held for slot in slots) and _clock() < began + timeout / 2:
                await asyncio.sleep(0.001)
        finally:  # cancelled too: the closing goes on on the executor's threads
            free = self._leave_held_to_their_calls_now(slots)
            closing = hand_off_closing(loop, [slot.engine for slot in free],
                                       self._groups_to_close(), began + timeout)
            retiring = hand_off(loop, self._retiring.end, began + timeout)
            if retiring is not None:
                closing.append(retiring)
        if closing:
            await asyncio.wait(closing, timeout=max(0.001, began + timeout - _clock()))

    # ------------------------------------------------- the driver's part

    #: never block the loop waiting for a failed engine's exit status
    _status_wait_s = 0.0

    def _state_lock(self) -> ContextManager[Any]:
        return contextlib.nullcontext()  # one thread: the loop's

    def _changed(self) -> None:
        self._notify()

    def _notify(self) -> None:
        """Wake every call waiting for an engine (they look again)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _close_later(self, slots: List[Slot], timeout: float = 5.0) -> None:
        if slots:
            self._retiring.add([slot.engine for slot in slots])
            loop = asyncio.get_running_loop()
            for slot in slots:
                hand_off(loop, retire_quietly, slot.engine, timeout)

    def _discard(self, engines: List[EngineProcess], group: Optional[EngineGroup] = None
                 ) -> None:
        hand_off(asyncio.get_running_loop(), discard, engines, group)

    def _start_engine_later(self, generation: int, delay: float = 0.0) -> None:
        self._start_in_background("_try_replacement", generation, delay)

    def _start_in_background(self, attempt: str, generation: int, delay: float = 0.0) -> None:
        """Start engines for ``generation`` with ``attempt`` (see
        :func:`_keep_trying`) in a task of the running loop, ``delay``
        seconds from now."""
        task = asyncio.ensure_future(_keep_trying(weakref.ref(self), attempt, generation,
                                                  delay))
        tasks, starts = self._tasks, self._starts
        tasks.add(task)
        starts[task] = (attempt, generation)
        # Callbacks that hold the containers, not the pool: a pool dropped
        # while a start waits to try again is released.
        task.add_done_callback(tasks.discard)
        task.add_done_callback(lambda done: starts.pop(done, None))

    def _resume_cut_short_starts(self) -> None:
        """Start again what the end of an event loop cut short: a loop that
        ends cancels the tasks starting replacements (or a forked child's
        own engines), and their engines are stopped. Nothing else would
        start them again, and the pool would stay short of engines for good
        (with one engine, every call would return nothing). Called at every
        call, on its loop; the common case costs one count of the roster."""
        generation = self._roster.generation
        healthy = self._roster.healthy(generation)
        if healthy >= self.size:
            return
        loop = asyncio.get_running_loop()
        if self._loop is None or self._loop.is_closed():
            self._loop = loop  # engine exits are reported to this loop from now on
        pending = [attempt for task, (attempt, owed) in self._starts.items()
                   if owed == generation and not task.done() and not task.get_loop().is_closed()]
        if "_try_own_engines" in pending:
            return
        if generation not in self._groups:  # this process's own engines never started
            logger.warning("starting the pool's engines again: the event loop that started "
                           "them ended first")
            self._start_in_background("_try_own_engines", generation)
            return
        missing = self.size - healthy - len(pending)
        if missing > 0:
            logger.warning("starting %d replacement engine(s) of the pool again: the event "
                           "loop that started them ended first", missing)
            for _ in range(missing):
                self._start_in_background("_try_replacement", generation)

    def _engine_exited(self, pid: int) -> None:
        loop = self._loop
        if self._closed or loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._replace_if_dead_and_free, pid)
        except RuntimeError:  # the loop closed meanwhile
            pass

    async def _try_replacement(self, generation: int) -> None:
        """One attempt to start a replacement engine for ``generation`` and
        put it in service (see :meth:`VowpalWabbitPool._try_replacement
        <subwabbit.pool.VowpalWabbitPool._try_replacement>`)."""
        group = self._replacement_wanted(generation)
        if group is None:  # (closed, or another model, since it was due)
            return
        engine = await _in_executor(group, group.add_one)
        if self._put_in_service([engine], generation, replacing=True):
            logger.warning("replaced a failed vw engine of the pool: now vw[%s]", engine.pid)

    # --------------------------------------------------------------- predict

    async def predict(self, common_features: Any, items_features: Iterable[Any],
                      timeout: Optional[float] = None, debug_info: Any = None,
                      metrics: Optional[Dict[str, Any]] = None) -> List[Any]:
        """Predictions for the items, in item order: the longest prefix of
        items whose predictions are ready by the deadline. See
        :meth:`VowpalWabbitPool.predict <subwabbit.pool.VowpalWabbitPool.predict>`.

        A pool serves one running event loop at a time (loops one after the
        other, as ``asyncio.run()`` makes them, are served).

        :raises VowpalWabbitError: for a call of an event loop while calls of
            another loop, running in another thread, are in progress"""
        with self._loops.call():
            return await self._predict(common_features, items_features, timeout, debug_info,
                                       metrics)

    async def _predict(self, common_features: Any, items_features: Iterable[Any],
                       timeout: Optional[float], debug_info: Any,
                       metrics: Optional[Dict[str, Any]]) -> List[Any]:
        flow = self._predict_flow(common_features, items_features, timeout, debug_info,
                                  metrics)
        try:
            wait = next(flow)
            while True:
                if type(wait) is WaitForPipes:  # pylint: disable=unidiomatic-typecheck
                    readable = await wait_for_engines(
                        [(lane.key.engine, lane.channel.unwritten_bytes > 0)
                         for lane in wait.lanes], wait.until)
                    wait = flow.send(readable)
                    continue
                if type(wait) is WaitForEngine:  # pylint: disable=unidiomatic-typecheck
                    if self._roster.version == wait.version:
                        await self._wait_for_change(wait.until)
                else:  # GiveTheLoopATurn
                    await asyncio.sleep(0)
                wait = next(flow)
        except StopIteration as finished:
            return finished.value
        finally:
            flow.close()

    async def _wait_for_change(self, until: Optional[float]) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        timeout = None if until is None else max(0.0, until - _clock())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            if not waiter.done():
                waiter.cancel()
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _check_open(self) -> bool:
        let_go_after_unhooked_fork()
        if self._closed:
            raise self._closed_error()
        if self._in_forked_child() and not self.restart_after_fork:
            raise self._fork_error()
        if not self._started:  # (in a forked child too: nothing to serve with)
            raise VowpalWabbitError(f"{type(self).__name__} is not started: await its start() "
                                    "or use it with 'async with'")
        if self._in_forked_child():
            logger.info("this process (%d) is a fork of %d: starting the pool's own engines",
                        os.getpid(), self._owner_pid)
            self._owner_pid = os.getpid()
            self._restart_count += 1
            self._start_in_background("_try_own_engines", self._roster.generation)
            return True
        self._resume_cut_short_starts()
        return False

    async def _try_own_engines(self, generation: int) -> None:
        """In a forked child: one attempt to start the engines of the current
        model (see :meth:`VowpalWabbitPool._try_own_engines
        <subwabbit.pool.VowpalWabbitPool._try_own_engines>`)."""
        if not self._serving(generation):
            return
        group, engines = await self._spawn(self.argv, self.vw_args, self.size)
        self._check_file_after_fork(group)
        if self._put_in_service(engines, generation, group=group):
            self._groups[generation] = group

    # ----------------------------------------------------------- not served

    async def train(self, *args: Any, **kwargs: Any) -> None:
        """Refused: a pool serves one model.

        :raises VowpalWabbitError: always
        """
        raise self._refuse_training("train")

    # ---------------------------------------------------------------- reload

    async def reload(self, vw_args: VwArgs, timeout: float = 5.0) -> None:
        """Serve a new model with no failed call; see
        :meth:`VowpalWabbitPool.reload <subwabbit.pool.VowpalWabbitPool.reload>`.

        :raises VowpalWabbitStartupError: when a new engine cannot start; the
            pool keeps serving the old model
        """
        loop = asyncio.get_running_loop()
        let_go_after_unhooked_fork()
        async with self._reload_lock:  # one at a time: the last one asked for serves
            # The model file's header is read off the event loop.
            plan, timeout = await loop.run_in_executor(None, self._check_reload, timeout, vw_args)
            try:
                group, engines = await self._spawn(plan.argv, plan.vw_args, self.size)
            except VowpalWabbitError as exc:
                if self._closed:  # close() stopped the new engines as they started
                    raise self._closed_error() from exc
                raise
            idle, old_groups = self._switch_to(group, engines, plan)
        self._started = True
        self._close_later(idle, timeout)
        for old in old_groups:
            hand_off(loop, old.retire, timeout)

    # ------------------------------------------------------------------ fork

    def _after_fork_in_child(self) -> None:
        self._after_fork_in_child_base()
        self._loop = None
        self._waiters = []
        self._tasks = set()
        self._starts = {}
        self._start_lock = _FifoTurn()
        self._reload_lock = _FifoTurn()
        self._closing = None
        self._closing_slots = []
        self._loops = _OneLoopAtATime(type(self).__name__)


class _OneLoopAtATime:
    """The event loops with calls of a pool in progress. A pool serves one
    running loop at a time: its state is the loop's, and a call of a loop
    in another thread, waiting for an engine, was woken only by its own
    deadline (calls ran up to ``io_timeout_s`` late or returned nothing; found
    by a review). Such a call is refused; loops one after the other (one
    ``asyncio.run()`` after another) are served.

    :param owner: the pool's class name, for the message
    """

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._lock = threading.Lock()
        self._calls: Dict[asyncio.AbstractEventLoop, int] = {}

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Count a call of the running loop while it runs.

        :raises VowpalWabbitError: when another loop, running, has calls in progress
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if any(other is not loop and other.is_running() for other in self._calls):
                raise VowpalWabbitError(
                    f"{self._owner} serves one event loop at a time, and calls of another "
                    "loop, running in another thread, are in progress: give each event loop "
                    "its own pool, or call a VowpalWabbitPool from threads")
            self._calls[loop] = self._calls.get(loop, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._calls.pop(loop) - 1
                if left:
                    self._calls[loop] = left


async def _keep_trying(pool_ref: "weakref.ReferenceType[AsyncVowpalWabbitPool]", attempt: str,
                       generation: int, delay: float = 0.0) -> None:
    """Start engines for ``generation`` of a pool with its coroutine method
    ``attempt`` (a key of :data:`~subwabbit.pool_base.START_ATTEMPTS`),
    trying again after a failure (any exception but a cancellation) while
    the pool serves that model (``close()`` cancels the task). Between
    attempts the task holds the pool only weakly: a pool dropped without
    ``close()`` is released while a start waits.

    :param delay: seconds to wait before the first attempt
    """
    if delay:
        await asyncio.sleep(delay)
    failures = 0
    while True:
        pool = pool_ref()
        if pool is None:
            return
        try:
            await getattr(pool, attempt)(generation)
            return
        except Exception as exc:  # pylint: disable=broad-except
            failures += 1
            retry_s = pool._start_failed(exc, failures, generation, attempt)  # pylint: disable=protected-access
        del pool
        if retry_s is None:
            return
        await asyncio.sleep(retry_s)


async def _in_executor(group: EngineGroup, start: Any, *args: Any) -> Any:
    """Run a blocking start of ``group`` on the loop's executor; if the call
    is cancelled, what it started is stopped when it finishes."""
    future = asyncio.get_running_loop().run_in_executor(None, start, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(lambda done: _abort_started(done, group))
        raise


def _abort_started(future: "asyncio.Future[Any]", group: EngineGroup) -> None:
    """Stop what a cancelled start started (an engine, or a list of them:
    the whole group), off the loop."""
    if not future.cancelled() and future.exception() is None:
        started = future.result()
        engines, whole = (started, group) if isinstance(started, list) else ([started], None)
        hand_off(future.get_loop(), discard, engines, whole)

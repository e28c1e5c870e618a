"""A pool of engines of one model for asyncio services.

:class:`AsyncVowpalWabbitPool` is :class:`~subwabbit.pool.VowpalWabbitPool`
for ``async def`` code: the same split calls (:mod:`subwabbit.core.split`)
and the same sharing of engines (:mod:`subwabbit.core.roster`), driven on the
event loop. A call waits on its engines' pipes with ``add_reader`` and
``add_writer``; engines are started, checked and closed on the loop's
executor, so the loop is never blocked.
"""

import asyncio
import logging
import os
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Union

from .asyncio_process import _YIELD_AFTER_S, wait_for_engines
from .base import VowpalWabbitBaseFormatter
from .client import DEFAULT_IO_TIMEOUT_S, MetricsHook
from .command import VwArgs
from .core.roster import Slot
from .core.split import Lane, SplitPredictExchange
from .deadlines import deadline_from_timeout, validate_seconds, warn_if_milliseconds
from .engine_group import EngineGroup
from .engine_process import EngineProcess
from .errors import VowpalWabbitError
from .nonblocking import DEFAULT_BATCH_SIZE, DEFAULT_MAX_PENDING_LINES, DEFAULT_WRITE_CUTOFF_S
from .pool import _ENGINE_FAILURES, PoolBase, _close_quietly
from .transfer import pump

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
                 size: Optional[int] = None, *, batch_size: int = DEFAULT_BATCH_SIZE,
                 max_pending_lines: int = DEFAULT_MAX_PENDING_LINES,
                 write_cutoff_s: float = DEFAULT_WRITE_CUTOFF_S,
                 vw_command: Union[str, Sequence[str], None] = None,
                 metrics_hook: Optional[MetricsHook] = None, startup_timeout_s: float = 30.0,
                 io_timeout_s: Optional[float] = DEFAULT_IO_TIMEOUT_S,
                 restart_after_fork: bool = True, share_weights: bool = True) -> None:
        self._configure_pool(formatter, vw_args, size, batch_size=batch_size,
                             max_pending_lines=max_pending_lines, write_cutoff_s=write_cutoff_s,
                             vw_command=vw_command, metrics_hook=metrics_hook,
                             startup_timeout_s=startup_timeout_s, io_timeout_s=io_timeout_s,
                             restart_after_fork=restart_after_fork, share_weights=share_weights)
        self._started = False
        self._waiters: List["asyncio.Future[None]"] = []
        self._tasks: Set["asyncio.Future[Any]"] = set()

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> "AsyncVowpalWabbitPool":
        """Start the engines (on the loop's executor) and wait until each answers.

        :raises VowpalWabbitStartupError: when one cannot start (the others are stopped)
        """
        if self._closed:
            raise VowpalWabbitError(f"{type(self).__name__} is closed")
        if not self._started:
            group, engines = await self._spawn(self.argv, self.size)
            if self._closed:
                for engine in engines:
                    engine.abort()
                group.close()
                raise VowpalWabbitError(f"{type(self).__name__} is closed")
            generation = self._roster.generation
            self._groups[generation] = group
            for engine in engines:
                self._roster.add(engine, generation)
            self._started = True
            self._notify()
        return self

    async def __aenter__(self) -> "AsyncVowpalWabbitPool":
        return await self.start()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def _spawn(self, argv: List[str], count: int
                     ) -> "tuple[EngineGroup, List[EngineProcess]]":
        group = EngineGroup(argv, self.startup_timeout_s, self.share_weights)
        return group, await self._in_executor(group, group.start, count)

    @staticmethod
    async def _in_executor(group: EngineGroup, start: Any, *args: Any) -> Any:
        """Run a blocking start of ``group`` on the loop's executor; if the
        call is cancelled, what it started is stopped when it finishes."""
        future = asyncio.get_running_loop().run_in_executor(None, start, *args)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(lambda done: _abort_started(done, group))
            raise

    async def close(self, timeout: float = 30.0) -> None:
        """Stop every engine within ``timeout`` without blocking the loop
        (input closed, then SIGTERM and SIGKILL). Idempotent."""
        validate_seconds(timeout, "timeout", allow_none=False)
        if self._closed:
            return
        self._closed = True
        slots = list(self._roster.slots)
        for slot in slots:
            self._roster.remove(slot)
        self._notify()
        for task in list(self._tasks):
            task.cancel()
        if self._in_forked_child():
            for slot in slots:
                slot.engine.abandon_in_fork()
            for group in self._groups.values():
                group.abandon_in_fork()
            return
        loop = asyncio.get_running_loop()
        began = _clock()
        if slots:
            closing = [loop.run_in_executor(None, _close_quietly, slot.engine, timeout)
                       for slot in slots]
            await asyncio.wait(closing, timeout=timeout)
        groups = [loop.run_in_executor(None, group.close, max(0.0, began + timeout - _clock()))
                  for group in self._groups.values()]
        if groups:
            await asyncio.wait(groups, timeout=max(0.001, began + timeout - _clock()))

    def _release(self) -> None:
        if self._closed:
            return
        engines = [slot.engine for slot in self._roster.slots]
        engines += [group.server.engine for group in self._groups.values()
                    if group.server is not None]
        for engine in engines:
            if engine.owner_pid == os.getpid() and not engine.closed:
                engine.release(0.0)

    def __del__(self) -> None:
        try:
            self._release()
        except Exception:  # pylint: disable=broad-except
            pass

    def _background(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _close_later(self, slots: List[Slot], timeout: float = 5.0) -> None:
        if not slots:
            return
        loop = asyncio.get_running_loop()
        for slot in slots:
            loop.run_in_executor(None, _close_quietly, slot.engine, timeout)

    # ------------------------------------------------------------ waiting

    def _notify(self) -> None:
        """Wake every call waiting for an engine (they look again)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

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

    # --------------------------------------------------------------- predict

    async def predict(self, common_features: Any, items_features: Iterable[Any],
                      timeout: Optional[float] = None, debug_info: Any = None,
                      metrics: Optional[Dict[str, Any]] = None) -> List[Any]:
        """Predictions for the items, in item order: the longest prefix of
        items whose predictions are ready by the deadline. See
        :meth:`VowpalWabbitPool.predict <subwabbit.pool.VowpalWabbitPool.predict>`."""
        start = _clock()
        warn_if_milliseconds(timeout)
        deadline = deadline_from_timeout(timeout, start=start)
        metrics = self._prepare_pool_metrics(metrics)
        results: List[Any] = []
        exchange: Optional[SplitPredictExchange] = None
        engines_used = 0
        counted = False
        try:
            if self._check_open() and metrics is not None:
                metrics["restarts"] = 1
            exchange = self._new_exchange(common_features, items_features, deadline, debug_info)
            generation, counted = await self._acquire_first(exchange, items_features, deadline,
                                                            start, metrics)
            if generation is not None:
                if metrics is not None:
                    metrics["model_generation"] = generation
                engines_used = await self._serve(exchange, items_features, generation, results)
        finally:
            if exchange is not None:
                engines_used = max(engines_used, len(exchange.lanes))
                self._close_later(self._give_back_now(exchange.end(), counted))
                self._notify()
            self._finish_pool_metrics(metrics, start, results, exchange, engines_used)
        return results

    def _check_open(self) -> bool:
        if self._closed:
            raise VowpalWabbitError(f"{type(self).__name__} is closed")
        if self._in_forked_child():
            if not self.restart_after_fork:
                raise self._fork_error()
            logger.info("this process (%d) is a fork of %d: starting the pool's own engines",
                        os.getpid(), self._owner_pid)
            self._owner_pid = os.getpid()
            self._restart_count += 1
            generation = self._roster.generation
            self._background(self._start_group(generation))
            return True
        if not self._started:
            raise VowpalWabbitError(f"{type(self).__name__} is not started: await its start() "
                                    "or use it with 'async with'")
        return False

    async def _acquire_first(self, exchange: SplitPredictExchange, items: Any,
                             deadline: Optional[float], start: float,
                             metrics: Optional[Dict[str, Any]]) -> "tuple[Optional[int], bool]":
        limit = deadline
        if limit is None and self.io_timeout_s is not None:
            limit = start + self.io_timeout_s
        roster = self._roster
        waited = False
        try:
            while True:
                if self._closed:
                    raise VowpalWabbitError(f"{type(self).__name__} is closed")
                for slot in self._roster.stuck(_clock(), self.io_timeout_s):
                    self._take_out_failed(slot, self._stuck_error(slot))
                generation = self._take_first(exchange, items)
                if generation is not None:
                    break
                if not waited:
                    waited = True
                    roster.waiting += 1
                    roster.version += 1
                    self._counters["waited_for_engine"] += 1
                if limit is not None and _clock() >= limit:
                    if deadline is not None:
                        return None, False
                    raise self._no_engine_error(start)
                await self._wait_for_change(limit)
        finally:
            if waited:
                roster.waiting -= 1
                roster.version += 1
                if metrics is not None:
                    metrics["waited_for_other_call"] = 1
            if metrics is not None:
                metrics["lock_wait_time"] = _clock() - start
        return generation, True

    async def _serve(self, exchange: SplitPredictExchange, items: Any, generation: int,
                     results: List[Any]) -> int:
        roster = self._roster
        seen = -1
        most = len(exchange.lanes)
        yielded_at = _clock()
        while True:
            now = _clock()
            for lane in exchange.stuck_lanes(now):
                self._fail_lane(exchange, lane, exchange.idle_error())
            results += exchange.step(now)
            if exchange.done:
                return most
            if seen != roster.version or exchange.releasable_lanes():
                self._close_later(self._rebalance_now(exchange, items, generation))
                self._notify()
                seen = roster.version
                most = max(most, len(exchange.lanes))
            if not exchange.lanes:
                if not await self._wait_for_engine(exchange, generation):
                    exchange.done = exchange.timed_out = True
                    return most
                continue
            moved = False
            for lane in list(exchange.lanes):
                try:
                    if pump(lane.key.engine, lane.channel, now):
                        moved = True
                except _ENGINE_FAILURES as exc:
                    self._fail_lane(exchange, lane, exc)
                    moved = True
            if moved:
                if _clock() - yielded_at >= _YIELD_AFTER_S:
                    await asyncio.sleep(0)
                    yielded_at = _clock()
                continue
            await wait_for_engines([(lane.key.engine, lane.channel.unwritten_bytes > 0)
                                    for lane in exchange.lanes], exchange.wake_at())
            yielded_at = _clock()

    async def _wait_for_engine(self, exchange: SplitPredictExchange, generation: int) -> bool:
        limit = exchange.end_at
        if limit is None and self.io_timeout_s is not None:
            limit = _clock() + self.io_timeout_s
        while True:
            if self._closed:
                raise VowpalWabbitError(f"{type(self).__name__} is closed")
            if self._take_replacement(exchange, generation):
                return True
            if limit is not None and _clock() >= limit:
                if exchange.end_at is None:
                    raise self._no_engine_error(None)
                return False
            await self._wait_for_change(limit)

    def _fail_lane(self, exchange: SplitPredictExchange, lane: Lane,
                   error: BaseException) -> None:
        exchange.fail_lane(lane)
        self._take_out_failed(lane.key, error)

    def _take_out_failed(self, slot: Slot, error: BaseException) -> None:
        """Take a failed engine out of service, stop it, and start its
        replacement in the background."""
        replacing = self._take_out_now(slot)
        self._notify()
        self._log_failure(slot, error, replacing)
        slot.engine.kill()
        self._close_later([slot], 0.5)
        if replacing:
            generation = slot.generation
            self._background(self._add_engine(generation, True))

    async def _start_group(self, generation: int) -> None:
        """In a forked child: start the engines of the current model."""
        try:
            group, engines = await self._spawn(self.argv, self.size)
        except VowpalWabbitError as exc:
            logger.warning("starting the pool's vw engines failed: %s", exc)
            return
        if self._closed or generation != self._roster.generation:
            for engine in engines:
                engine.abort()
            group.close()
            return
        self._groups[generation] = group
        for engine in engines:
            self._roster.add(engine, generation)
        self._notify()

    async def _add_engine(self, generation: int, replacing: bool = False) -> None:
        group = self._groups.get(generation)
        if group is None:
            return
        try:
            engine = await self._in_executor(group, group.add_one)
        except VowpalWabbitError as exc:
            logger.warning("starting a vw engine for the pool failed: %s", exc)
            return
        if self._closed or generation != self._roster.generation:
            engine.abort()
            return
        self._roster.add(engine, generation)
        self._notify()
        if replacing:
            self._counters["engines_replaced"] += 1
            logger.warning("replaced a failed vw engine of the pool: now vw[%s]", engine.pid)

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
        validate_seconds(timeout, "timeout", allow_none=False)
        if self._closed:
            raise VowpalWabbitError(f"{type(self).__name__} is closed")
        argv = self._reload_argv(vw_args)
        group, engines = await self._spawn(argv, self.size)
        if self._closed:
            for engine in engines:
                engine.abort()
            group.close()
            raise VowpalWabbitError(f"{type(self).__name__} is closed")
        idle, old_groups = self._switch_now(group, engines)
        self._reloaded(vw_args, argv)
        self._started = True
        self._notify()
        logger.info("reloaded the pool: generation %d, vw%s", self._roster.generation,
                    [engine.pid for engine in engines])
        self._close_later(idle, timeout)
        loop = asyncio.get_running_loop()
        for old in old_groups:
            loop.run_in_executor(None, old.close, timeout)

    # ------------------------------------------------------------------ fork

    def _after_fork_in_child(self) -> None:
        for slot in list(self._roster.slots):
            slot.engine.abandon_in_fork()
            self._roster.remove(slot)
        for group in self._groups.values():
            group.abandon_in_fork()
        self._groups = {}
        self._waiters = []
        self._tasks = set()


def _abort_started(future: "asyncio.Future[Any]", group: EngineGroup) -> None:
    """Stop what a cancelled start started (an engine, or a list of them)."""
    if not future.cancelled() and future.exception() is None:
        started = future.result()
        for engine in started if isinstance(started, list) else [started]:
            engine.abort()
        if isinstance(started, list):
            group.close()

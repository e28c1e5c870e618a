"""A pool of engines of one model for threaded services.

:class:`VowpalWabbitPool` runs several engines and serves any number of
threads at once. One call's items are dealt in batches to the engines it
holds (:mod:`subwabbit.core.split`), so a large request is scored by several
engines at once; concurrent calls share the engines fairly
(:mod:`subwabbit.core.roster`). Each call waits in ``poll`` on the pipes of
the engines it holds, so threads need no lock while they do I/O.
"""

import logging
import os
import select
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

from .base import VowpalWabbitBaseFormatter
from .client import DEFAULT_IO_TIMEOUT_S, ClientBase, MetricsHook
from .command import VwArgs
from .core.exchanges import format_common_part
from .core.roster import Roster, Slot
from .core.split import Lane, SplitPredictExchange
from .deadlines import deadline_from_timeout, validate_seconds, warn_if_milliseconds
from .engine_group import EngineGroup
from .engine_process import SELECT_FD_LIMIT, EngineProcess
from .errors import (VowpalWabbitBusyError, VowpalWabbitEngineExitedError, VowpalWabbitError,
                     VowpalWabbitProtocolError, VowpalWabbitTimeoutError)
from .lines import parse_scalars
from .nonblocking import (DEFAULT_BATCH_SIZE, DEFAULT_MAX_PENDING_LINES, DEFAULT_WRITE_CUTOFF_S,
                          check_deadline_settings)
from .transfer import pump

logger = logging.getLogger("subwabbit")

_clock = time.perf_counter

#: Errors after which an engine's output can no longer be matched to calls.
_ENGINE_FAILURES = (VowpalWabbitEngineExitedError, VowpalWabbitProtocolError,
                    VowpalWabbitTimeoutError)

#: How long the report of a failed engine waits for its exit status.
_STATUS_WAIT_S = 0.05

#: A call takes one more engine only while at least this many of its items
#: are left to deal (smaller requests are served by one engine: a second
#: would save less time than waking it costs).
SPLIT_MIN_ITEMS = 2 * DEFAULT_BATCH_SIZE


def smaps_rollup(pid: int) -> Dict[str, int]:
    """The memory totals of ``/proc/PID/smaps_rollup`` in bytes (empty when
    the process is gone or the file is unreadable)."""
    fields: Dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
            for line in rollup:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    except (OSError, ValueError):
        return {}
    return fields


def default_pool_size() -> int:
    """The number of CPUs this process may run on (``os.sched_getaffinity``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def check_pool_size(size: Optional[int]) -> int:
    """``size``, or the default when ``None``.

    :raises ValueError: for anything but a positive int
    """
    if size is None:
        return default_pool_size()
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive int or None, got {size!r}")
    return size


def lanes_wanted(remaining: Optional[int], share: int, held: int) -> int:
    """How many more engines a call should take: up to its ``share``, and
    only while enough items are left to make another engine worth it
    (``remaining`` is ``None`` for an iterable of unknown length)."""
    room = share - held
    if room <= 0:
        return 0
    if remaining is None:
        return room
    useful = remaining // SPLIT_MIN_ITEMS
    return max(0, min(room, useful if held else max(1, useful)))


class PoolBase(ClientBase):
    """What the thread and asyncio pools share: settings, the roster, metrics."""

    def _configure_pool(self, formatter: Any, vw_args: VwArgs, size: Optional[int], *,
                        batch_size: int, max_pending_lines: int, write_cutoff_s: float,
                        vw_command: Union[str, Sequence[str], None],
                        metrics_hook: Optional[MetricsHook], startup_timeout_s: float,
                        io_timeout_s: Optional[float], restart_after_fork: bool,
                        share_weights: bool) -> None:
        self._configure(formatter, vw_args, batch_size, write_only=False, audit_mode=False,
                        vw_command=vw_command, metrics_hook=metrics_hook,
                        startup_timeout_s=startup_timeout_s, io_timeout_s=io_timeout_s,
                        restart_on_crash=True, restart_after_fork=restart_after_fork)
        self.size = check_pool_size(size)
        self.write_cutoff_s = check_deadline_settings(max_pending_lines, None, None,
                                                      write_cutoff_s)
        self.max_pending_lines = max_pending_lines
        self._roster = Roster()
        self.share_weights = bool(share_weights)
        #: the engines of each generation still in service
        self._groups: Dict[int, EngineGroup] = {}
        self._closed = False
        #: counters since the pool was created (see :meth:`stats`)
        self._counters = {"calls": 0, "engine_failures": 0, "engines_replaced": 0,
                          "reloads": 0, "waited_for_engine": 0}

    #: turns raw prediction lines into the values ``predict`` returns
    parse_predictions: Callable[[List[bytes]], List[Any]] = staticmethod(parse_scalars)

    # ---------------------------------------------------------------- status

    @property
    def generation(self) -> int:
        """The model generation new calls are served by (0, then one more per :meth:`reload`)."""
        return self._roster.generation

    def stats(self) -> Dict[str, int]:
        """Counters and gauges of the pool, for monitoring.

        :returns: ``calls``, ``engine_failures``, ``engines_replaced``,
            ``reloads``, ``waited_for_engine`` (calls that found no engine
            free), and the gauges ``engines`` (in service for the current
            model), ``engines_busy`` and ``generation``
        """
        roster = self._roster
        current = [slot for slot in roster.slots if slot.generation == roster.generation]
        stats = dict(self._counters)
        stats.update(engines=len(current), engines_busy=sum(1 for s in current if s.held),
                     generation=roster.generation)
        return stats

    def engine_pids(self) -> List[int]:
        """Process ids of the engines serving the current model."""
        roster = self._roster
        return [slot.engine.pid for slot in roster.slots if slot.generation == roster.generation]

    def __repr__(self) -> str:
        state = "closed" if self._closed else self._roster.describe()
        return f"<{type(self).__name__} size={self.size} {state} argv={self.argv!r}>"

    # ---------------------------------------------------------------- calls

    def _new_exchange(self, common_features: Any, items_features: Iterable[Any],
                      deadline: Optional[float], debug_info: Any) -> SplitPredictExchange:
        common_part = format_common_part(self.formatter, common_features, debug_info)
        return SplitPredictExchange(
            formatter=self.formatter, common_part=common_part, common_features=common_features,
            items=items_features, debug_info=debug_info, parse=self.parse_predictions,
            batch_size=self.batch_size, max_in_flight_lines=self.max_pending_lines,
            deadline=deadline, write_cutoff_s=self.write_cutoff_s,
            idle_s=self.io_timeout_s if deadline is None else None)

    def _prepare_pool_metrics(self, metrics: Optional[Dict[str, Any]]
                              ) -> Optional[Dict[str, Any]]:
        metrics = self._prepare_metrics(metrics, None, ())
        if metrics is not None:
            metrics["engines"] = 0
            metrics["engine_failures"] = 0
            metrics["model_generation"] = None
        return metrics

    def _finish_pool_metrics(self, metrics: Optional[Dict[str, Any]], start: float,
                             results: List[Any], exchange: Optional[SplitPredictExchange],
                             engines: int) -> None:
        if metrics is not None:
            metrics["num_lines"] = len(results)
            metrics["total_time"] = _clock() - start
            metrics["engines"] = engines
            if exchange is not None:
                metrics["engine_failures"] = exchange.failed_lanes
        self._finish_call("predict", metrics)

    @staticmethod
    def _remaining(items: Any, exchange: SplitPredictExchange) -> Optional[int]:
        try:
            return len(items) - exchange.formatted
        except TypeError:
            return None

    def _stuck_error(self, slot: Slot) -> VowpalWabbitTimeoutError:
        return VowpalWabbitTimeoutError(
            f"the vw engine owed {slot.channel.in_flight_lines} answers and printed nothing for "
            f"{self.io_timeout_s:g} s (io_timeout_s); it may be stopped or stuck",
            argv=self.argv)

    def _no_engine_error(self, start: Optional[float]) -> VowpalWabbitBusyError:
        if start is None:
            return VowpalWabbitBusyError("the pool's engines failed and none was replaced "
                                         "within io_timeout_s", argv=self.argv)
        return VowpalWabbitBusyError(f"no engine of the pool was free for "
                                     f"{_clock() - start:.3g} s (io_timeout_s)", argv=self.argv)

    def _refuse_training(self, method: str) -> VowpalWabbitError:
        return VowpalWabbitError(
            f"{method}() is not available on a pool: a pool serves one model with several "
            "engines, which would each learn something else. Train with one process "
            "(VowpalWabbitProcess(..., write_only=True)), save the model and reload() the "
            "pool with it")


    # ------------------------------------------- decisions (caller holds the state)

    def _take_first(self, exchange: SplitPredictExchange, items: Any) -> Optional[int]:
        """Take a call's first engines if one is free.

        :returns: the generation that serves it, or ``None`` when none is free
        """
        roster = self._roster
        generation = roster.generation
        free = roster.free(generation)
        if not free:
            return None
        roster.calls += 1
        want = lanes_wanted(self._remaining(items, exchange), roster.share(generation), 0)
        for slot in free[:max(1, want)]:
            roster.take(slot)
            exchange.add_lane(slot, slot.channel)
        return generation

    def _take_replacement(self, exchange: SplitPredictExchange, generation: int) -> bool:
        """For a call whose engines all failed: take a free engine of its generation."""
        roster = self._roster
        free = roster.free(generation)
        if not free or generation != roster.generation:
            return False
        roster.take(free[0])
        exchange.add_lane(free[0], free[0].channel)
        return True

    def _rebalance_now(self, exchange: SplitPredictExchange, items: Any,
                       generation: int) -> List[Slot]:
        """Give back retired engines whose answers are in, retire one when
        another call waits and this one holds more than its share, and take
        free engines when it may hold more.

        :returns: engines to close (their generation was replaced)
        """
        roster = self._roster
        closing = []
        for lane in exchange.releasable_lanes():
            exchange.release_lane(lane)
            if roster.give_back(lane.key):
                closing.append(lane.key)
        active = exchange.active_lanes
        if roster.over_share(active, generation):
            lanes = [lane for lane in exchange.lanes if not lane.retiring]
            exchange.retire_lane(min(lanes, key=lambda lane: lane.channel.in_flight_lines))
        elif exchange.wants_lanes and not roster.waiting and generation == roster.generation:
            want = lanes_wanted(self._remaining(items, exchange), roster.share(generation),
                                active)
            for slot in roster.free(generation)[:want]:
                roster.take(slot)
                exchange.add_lane(slot, slot.channel)
        return closing

    def _give_back_now(self, lanes: List[Lane], counted: bool) -> List[Slot]:
        """A call ends: its engines go back.

        :returns: engines to close (their generation was replaced)
        """
        self._counters["calls"] += 1
        now = _clock()
        for lane in lanes:
            lane.key.note_progress(now)
        closing = [lane.key for lane in lanes if self._roster.give_back(lane.key)]
        if counted:
            self._roster.calls -= 1
            self._roster.version += 1
        return closing

    def _take_out_now(self, slot: Slot) -> bool:
        """A failed engine leaves service.

        :returns: whether a replacement is due (it was in service, for the
            current generation, and the pool is open)
        """
        in_service = self._roster.remove(slot)
        self._counters["engine_failures"] += 1
        return in_service and slot.generation == self._roster.generation and not self._closed

    def _switch_now(self, group: EngineGroup, engines: List[Any]
                    ) -> "tuple[List[Slot], List[EngineGroup]]":
        """Put a reload's engines in service and serve new calls with them.

        :returns: the old engines no call holds, to close now, and the old
            groups (whose fork servers can go: their engines live on)
        """
        generation = self._roster.generation + 1
        old_groups = list(self._groups.values())
        self._groups = {generation: group}
        for engine in engines:
            self._roster.add(engine, generation)
        self._counters["reloads"] += 1
        return self._roster.switch(generation), old_groups

    def shares_weights(self) -> bool:
        """Whether the engines serving the current model were forked from one
        process that loaded it (they share its memory pages)."""
        group = self._groups.get(self._roster.generation)
        return group is not None and group.shares_weights

    def memory_usage(self) -> Dict[str, int]:
        """Memory of the engines serving the current model (and of the
        process that loaded it, when they share its pages), from
        ``/proc/PID/smaps_rollup``: ``rss_bytes`` (the sum, pages shared
        between engines counted once per engine), ``pss_bytes`` (each shared
        page divided among the processes that share it: what the pool
        costs), and ``processes``.
        """
        pids = self.engine_pids()
        group = self._groups.get(self._roster.generation)
        if group is not None and group.server is not None:
            pids.append(group.server.pid)
        usage = {"rss_bytes": 0, "pss_bytes": 0, "processes": 0}
        for pid in pids:
            fields = smaps_rollup(pid)
            if fields:
                usage["rss_bytes"] += fields.get("Rss", 0)
                usage["pss_bytes"] += fields.get("Pss", 0)
                usage["processes"] += 1
        return usage

    def _log_failure(self, slot: Slot, error: BaseException, replacing: bool) -> None:
        if isinstance(error, VowpalWabbitError):
            slot.engine.add_context(error)
        logger.warning("a vw engine of the pool failed (vw[%s]): %s%s", slot.engine.pid, error,
                       "; starting a replacement" if replacing else "")


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

    An engine that fails is replaced in the background (logged at WARNING,
    counted in :meth:`stats`); the batches it owed are dealt to the call's
    other engines.

    :param formatter: turns common and item features into VW lines
    :param vw_args: engine arguments, typically ``["-i", "model.vw", "-t", "--quiet"]``
    :param size: how many engines (default: the CPUs this process may use)
    :param batch_size: items formatted and sent to one engine at a time
    :param max_pending_lines: the most lines in flight per engine
    :param write_cutoff_s: no new batch is sent this long before a deadline
    :param vw_command: the engine command; see :class:`~subwabbit.blocking.VowpalWabbitProcess`
    :param metrics_hook: called with each call's metrics dict when it ends
    :param startup_timeout_s: how long each engine may take to start and answer
    :param io_timeout_s: without a deadline, how long an engine may stay
        silent before it is taken for stuck (and replaced)
    :param restart_after_fork: in a forked child, start the pool's own engines
        at the first call (``False``: raise)
    :param share_weights: with the wheel's engine, load the model once and
        fork the engines from that process, so that they share its memory
        (see :meth:`memory_usage`); a ``vw`` executable, a model that needs
        vw's own driver, or ``-f`` in ``vw_args`` load a copy per engine
    :raises VowpalWabbitStartupError: when an engine cannot start (the
        others are stopped)
    """

    def __init__(self, formatter: VowpalWabbitBaseFormatter, vw_args: VwArgs,
                 size: Optional[int] = None, *, batch_size: int = DEFAULT_BATCH_SIZE,
                 max_pending_lines: int = DEFAULT_MAX_PENDING_LINES,
                 write_cutoff_s: float = DEFAULT_WRITE_CUTOFF_S,
                 vw_command: Union[str, Sequence[str], None] = None,
                 metrics_hook: Optional[MetricsHook] = None, startup_timeout_s: float = 30.0,
                 io_timeout_s: Optional[float] = DEFAULT_IO_TIMEOUT_S,
                 restart_after_fork: bool = True, share_weights: bool = True) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._configure_pool(formatter, vw_args, size, batch_size=batch_size,
                             max_pending_lines=max_pending_lines, write_cutoff_s=write_cutoff_s,
                             vw_command=vw_command, metrics_hook=metrics_hook,
                             startup_timeout_s=startup_timeout_s, io_timeout_s=io_timeout_s,
                             restart_after_fork=restart_after_fork, share_weights=share_weights)
        group, engines = self._spawn(self.argv, self.size)
        self._groups[0] = group
        for engine in engines:
            self._roster.add(engine, 0)

    # ------------------------------------------------------------- engines

    def _spawn(self, argv: List[str], count: int) -> "tuple[EngineGroup, List[EngineProcess]]":
        """Start ``count`` engines of a model at once and check each answers.

        :raises VowpalWabbitStartupError: the first failure (the others are stopped)
        """
        group = EngineGroup(argv, self.startup_timeout_s, self.share_weights)
        return group, group.start(count)

    def _close_later(self, slots: List[Slot], timeout: float = 5.0) -> None:
        """Close engines that no call holds any more, on a thread of their own."""
        if not slots:
            return

        def close() -> None:
            for slot in slots:
                try:
                    slot.engine.close(timeout)
                except VowpalWabbitError as exc:
                    logger.debug("closing a retired vw engine: %s", exc)
        threading.Thread(target=close, name="subwabbit-pool-close", daemon=True).start()

    def _replace(self, slot: Slot, error: BaseException) -> None:
        """Take a failed engine out of service and start its replacement in
        the background (for the generation it served, if still current)."""
        with self._cond:
            replacing = self._take_out_now(slot)
            generation = slot.generation
            self._cond.notify_all()
        self._log_failure(slot, error, replacing)
        slot.engine.abort()
        if not replacing:
            return
        threading.Thread(target=self._add_engine, args=(generation, True),
                         name="subwabbit-pool-replace", daemon=True).start()

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
            ``model_generation`` (the :attr:`generation` that served it) and
            ``restarts`` (1 when the call found the pool's engines being
            started after a fork)
        :returns: a list of predictions
        :raises ValueError: when a formatted line is not exactly one example
        :raises VowpalWabbitError: when the pool is closed; without a deadline,
            :class:`~subwabbit.errors.VowpalWabbitBusyError` when no engine is
            free within ``io_timeout_s``
        """
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
            generation, counted = self._acquire_first(exchange, items_features, deadline,
                                                      start, metrics)
            if generation is not None:
                if metrics is not None:
                    metrics["model_generation"] = generation
                engines_used = self._serve(exchange, items_features, generation, results)
        finally:
            if exchange is not None:
                engines_used = max(engines_used, len(exchange.lanes))
                self._give_back(exchange.end(), counted)
            self._finish_pool_metrics(metrics, start, results, exchange, engines_used)
        return results

    def _check_open(self) -> bool:
        """Raise if closed; in a forked child, start the pool's own engines.

        :returns: whether engines were started (after a fork)
        """
        if self._closed:
            raise VowpalWabbitError(f"{type(self).__name__} is closed")
        if self._in_forked_child():
            self._start_in_fork()
            return True
        return False

    def _acquire_first(self, exchange: SplitPredictExchange, items: Any,
                       deadline: Optional[float], start: float,
                       metrics: Optional[Dict[str, Any]]) -> "tuple[Optional[int], bool]":
        """Take the call's first engines, waiting for one to be free until
        the deadline (or ``io_timeout_s``).

        :returns: the generation that serves the call (``None``: the
            deadline passed first) and whether the call was counted in
        """
        limit = deadline
        if limit is None and self.io_timeout_s is not None:
            limit = start + self.io_timeout_s
        roster = self._roster
        waited = False
        with self._cond:
            while True:
                if self._closed:
                    raise VowpalWabbitError(f"{type(self).__name__} is closed")
                stuck = self._roster.stuck(_clock(), self.io_timeout_s)
                if stuck:
                    self._cond.release()
                    try:
                        for slot in stuck:
                            self._replace(slot, self._stuck_error(slot))
                    finally:
                        self._cond.acquire()
                    continue
                generation = self._take_first(exchange, items)
                if generation is not None:
                    break
                if not waited:
                    waited = True
                    roster.waiting += 1
                    roster.version += 1
                    self._counters["waited_for_engine"] += 1
                left = None if limit is None else limit - _clock()
                if left is not None and left <= 0:
                    roster.waiting -= 1
                    roster.version += 1
                    self._note_wait(start, metrics)
                    if deadline is not None:
                        return None, False
                    raise self._no_engine_error(start)
                self._cond.wait(left)
            if waited:
                roster.waiting -= 1
        if waited:
            self._note_wait(start, metrics)
        elif metrics is not None:
            metrics["lock_wait_time"] = _clock() - start
        return generation, True

    def _note_wait(self, start: float, metrics: Optional[Dict[str, Any]]) -> None:
        waited_s = _clock() - start
        if metrics is not None:
            metrics["lock_wait_time"] = waited_s
            metrics["waited_for_other_call"] = 1

    def _serve(self, exchange: SplitPredictExchange, items: Any, generation: int,
               results: List[Any]) -> int:
        """Drive the call on its engines until it is done.

        :returns: the most engines the call held at once
        """
        roster = self._roster
        seen = -1
        most = len(exchange.lanes)
        while True:
            now = _clock()
            for lane in exchange.stuck_lanes(now):
                self._fail_lane(exchange, lane, exchange.idle_error())
            results += exchange.step(now)
            if exchange.done:
                return most
            if seen != roster.version or exchange.releasable_lanes():
                seen = self._rebalance(exchange, items, generation)
                most = max(most, len(exchange.lanes))
            if not exchange.lanes:
                if not self._wait_for_engine(exchange, generation):
                    exchange.done = exchange.timed_out = True
                    return most
                continue
            moved = False
            for lane in list(exchange.lanes):
                try:
                    # A failed engine's exit status is worth a short wait at most:
                    # its batches go to the other engines.
                    if pump(lane.key.engine, lane.channel, now + _STATUS_WAIT_S):
                        moved = True
                except _ENGINE_FAILURES as exc:
                    self._fail_lane(exchange, lane, exc)
                    moved = True
            if not moved:
                _wait_for_lanes(exchange.lanes, exchange.wake_at())

    def _rebalance(self, exchange: SplitPredictExchange, items: Any, generation: int) -> int:
        """:meth:`_rebalance_now` under the lock.

        :returns: the roster's version seen
        """
        with self._cond:
            closing = self._rebalance_now(exchange, items, generation)
            self._cond.notify_all()
            seen = self._roster.version
        self._close_later(closing)
        return seen

    def _wait_for_engine(self, exchange: SplitPredictExchange, generation: int) -> bool:
        """A call whose engines all failed waits for one of its generation.

        :returns: ``False`` when its time is up first
        """
        limit = exchange.end_at
        if limit is None and self.io_timeout_s is not None:
            limit = _clock() + self.io_timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise VowpalWabbitError(f"{type(self).__name__} is closed")
                if self._take_replacement(exchange, generation):
                    return True
                left = None if limit is None else limit - _clock()
                if left is not None and left <= 0:
                    if exchange.end_at is None:
                        raise self._no_engine_error(None)
                    return False
                self._cond.wait(left)

    def _fail_lane(self, exchange: SplitPredictExchange, lane: Lane,
                   error: BaseException) -> None:
        exchange.fail_lane(lane)
        self._replace(lane.key, error)

    def _give_back(self, lanes: List[Lane], counted: bool) -> None:
        with self._cond:
            closing = self._give_back_now(lanes, counted)
            self._cond.notify_all()
        self._close_later(closing)

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
        engine is closed once no call holds it.

        :param vw_args: the new engine arguments
        :param timeout: how long each old engine gets to exit
        :raises VowpalWabbitStartupError: when a new engine cannot start; the
            pool keeps serving the old model
        """
        validate_seconds(timeout, "timeout", allow_none=False)
        if self._closed:
            raise VowpalWabbitError(f"{type(self).__name__} is closed")
        argv = self._reload_argv(vw_args)
        group, engines = self._spawn(argv, self.size)
        with self._cond:
            if self._closed:
                for engine in engines:
                    engine.abort()
                group.close()
                raise VowpalWabbitError(f"{type(self).__name__} is closed")
            idle, old_groups = self._switch_now(group, engines)
            self._reloaded(vw_args, argv)
            generation = self._roster.generation
            self._cond.notify_all()
        logger.info("reloaded the pool: generation %d, vw%s", generation,
                    [engine.pid for engine in engines])
        self._close_later(idle, timeout)
        for old in old_groups:
            old.close(timeout)

    # ------------------------------------------------------------------ fork

    def _after_fork_in_child(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        for slot in list(self._roster.slots):
            slot.engine.abandon_in_fork()
        for group in self._groups.values():
            group.abandon_in_fork()
        generation = self._roster.generation
        self._roster = Roster()
        self._roster.generation = generation

    def _start_in_fork(self) -> None:
        """In a forked child: start the pool's own engines in the background
        (once); calls wait for them within their deadlines."""
        if not self.restart_after_fork:
            raise self._fork_error()
        with self._cond:
            if not self._in_forked_child():
                return
            logger.info("this process (%d) is a fork of %d: starting the pool's own engines",
                        os.getpid(), self._owner_pid)
            self._owner_pid = os.getpid()
            self._restart_count += 1
            generation = self._roster.generation
            self._groups = {generation: EngineGroup(self.argv, self.startup_timeout_s,
                                                    self.share_weights)}
        threading.Thread(target=self._start_group, args=(generation,),
                         name="subwabbit-pool-start", daemon=True).start()

    def _start_group(self, generation: int) -> None:
        """Start the engines of ``generation``'s group and put them in
        service (on a thread of its own: failures are logged)."""
        group = self._groups[generation]
        try:
            engines = group.start(self.size)
        except VowpalWabbitError as exc:
            logger.warning("starting the pool's vw engines failed: %s", exc)
            return
        with self._cond:
            if self._closed or generation != self._roster.generation:
                for engine in engines:
                    engine.abort()
                return
            for engine in engines:
                self._roster.add(engine, generation)
            self._cond.notify_all()

    def _add_engine(self, generation: int, replacing: bool = False) -> None:
        """Start one engine for ``generation`` and put it in service (on a
        thread of its own: failures are logged)."""
        group = self._groups.get(generation)
        if group is None:
            return
        try:
            engine = group.add_one()
        except VowpalWabbitError as exc:
            logger.warning("starting a vw engine for the pool failed: %s", exc)
            return
        with self._cond:
            if self._closed or generation != self._roster.generation:
                engine.abort()
                return
            self._roster.add(engine, generation)
            if replacing:
                self._counters["engines_replaced"] += 1
            self._cond.notify_all()
        if replacing:
            logger.warning("replaced a failed vw engine of the pool: now vw[%s]", engine.pid)

    # ----------------------------------------------------------------- close

    def close(self, timeout: float = 30.0) -> None:
        """Stop every engine within ``timeout`` (input closed, then SIGTERM
        and SIGKILL). Calls in progress end with what they have. Idempotent."""
        validate_seconds(timeout, "timeout", allow_none=False)
        with self._cond:
            if self._closed:
                return
            self._closed = True
            slots = list(self._roster.slots)
            for slot in slots:
                self._roster.remove(slot)
            self._cond.notify_all()
        if self._in_forked_child():
            for slot in slots:
                slot.engine.abandon_in_fork()
            for group in self._groups.values():
                group.abandon_in_fork()
            return
        deadline = _clock() + timeout
        threads = []
        for slot in slots:
            thread = threading.Thread(target=_close_quietly, args=(slot.engine, timeout),
                                      name="subwabbit-pool-close", daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(max(0.0, deadline - _clock()))
        for group in self._groups.values():
            group.close(max(0.0, deadline - _clock()))

    def _release(self) -> None:
        if self._closed:
            return
        engines = [slot.engine for slot in self._roster.slots]
        engines += [group.server.engine for group in self._groups.values()
                    if group.server is not None]
        for engine in engines:
            if engine.owner_pid == os.getpid() and not engine.closed:
                engine.release(0.0)

    def __enter__(self) -> "VowpalWabbitPool":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._release()
        except Exception:  # pylint: disable=broad-except
            pass


def _close_quietly(engine: EngineProcess, timeout: float) -> None:
    try:
        engine.close(timeout)
    except VowpalWabbitError as exc:
        logger.debug("closing a vw engine of the pool: %s", exc)


def _wait_for_lanes(lanes: List[Lane], until: Optional[float]) -> None:
    """Sleep until an engine of ``lanes`` printed something or can take more
    input (when it has some waiting), or until ``until``."""
    readers = [lane.key.engine.stdout_fd for lane in lanes]
    writers = [lane.key.engine.stdin_fd for lane in lanes if lane.channel.unwritten_bytes]
    timeout = None if until is None else max(0.0, until - _clock())
    if max(readers + writers) < SELECT_FD_LIMIT:
        select.select(readers, writers, [], timeout)
        return
    poller = select.poll()
    for fd in readers:
        poller.register(fd, select.POLLIN)
    for fd in writers:
        poller.register(fd, select.POLLOUT)
    # Round down: waking a little early costs one more loop, waking late misses the deadline.
    poller.poll(None if timeout is None else int(timeout * 1000))

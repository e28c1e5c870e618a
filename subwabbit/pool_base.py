"""What the thread and asyncio pools share: settings, the roster, metrics,
and the steps of a ``predict`` call.

A pool call is a generator, :meth:`PoolBase._predict_flow`, in the manner of
httpx's auth flows: it does the work that never waits (formatting, writing and
reading the pipes, which are non-blocking, and every decision through
:mod:`subwabbit.core.split` and :mod:`subwabbit.core.roster`) and *yields*
what it must wait for: :class:`WaitForPipes` (an engine's output, or room in
its input) or :class:`WaitForEngine` (a free engine). The thread pool
(:mod:`subwabbit.pool`) waits in ``select`` and on a condition; the asyncio
pool (:mod:`subwabbit.asyncio_pool`) waits with the event loop. Each supplies
how to lock the pool's state, how to wake waiters, and how to close and start
engines in the background.
"""

import logging
import os
import time
import weakref
from typing import (Any, Collection, ContextManager, Dict, FrozenSet, Generator, Iterable, List,
                    NamedTuple, Optional, Sequence, Union)

from .client import ClientBase, MetricsHook, ReloadPlan, check_per_item, flag, positive_int
from .command import VwArgs
from .core.channel import Channel
from .core.exchanges import format_common_part
from .core.roster import Roster, Slot, Ticket
from .core.split import Lane, SplitPredictExchange
from .cpus import usable_cpus
from .deadlines import deadline_from_timeout, required_seconds, warn_if_milliseconds
from .engine_group import EngineGroup
from .engine_process import EngineProcess
from .unserved_engines import RetiringEngines
from .errors import VowpalWabbitBusyError, VowpalWabbitError, VowpalWabbitProtocolError
from .model_file import FileIdentity, model_file_path
from .nonblocking import DEFAULT_BATCH_SIZE, check_deadline_settings
from .pool_size import largest_pool_size, size_limit_reason
from .transfer import (ENGINE_FAILURES, YIELD_AFTER_S, pump, stuck_engine_error,
                       torn_channel_error)

logger = logging.getLogger("subwabbit")

_clock = time.perf_counter

#: How long the report of a failed engine waits for its exit status.
_STATUS_WAIT_S = 0.05

#: Seconds between attempts to start engines that failed to start (a
#: replacement, or a forked child's own engines; the last repeats while the
#: pool is open and serves that model): a model file briefly missing, a
#: start-up slower than ``startup_timeout_s`` on a loaded machine or a failed
#: fork must not leave the pool an engine short, or without engines, for good.
START_RETRY_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


def start_retry_s(failures: int) -> float:
    """How long to wait after the ``failures``-th failed start (1 or more)."""
    return START_RETRY_S[min(failures, len(START_RETRY_S)) - 1]


#: An engine that fails within this many seconds of entering service fails *young*.
YOUNG_ENGINE_S = 5.0

#: Seconds the replacement of an engine that failed young waits, when more
#: engines than the pool's size failed young in a row (the first such
#: failure past the size waits the first figure, and so on; the last
#: repeats; an engine that fails older starts the count again). Engines
#: that die at once (killed as they start, or on every example) were
#: replaced as fast as a fork server forks: 195 a second for a pool of 2,
#: each logged twice at WARNING. A call that kills its engines (a request vw
#: dies on) costs a pool no more than a second of an engine short.
YOUNG_FAILURE_RETRY_S = (0.1, 0.2, 0.5, 1.0)


def young_failure_retry_s(young_failures: int, size: int) -> float:
    """How long the replacement after the ``young_failures``-th failure in
    a row of a young engine waits, in a pool of ``size`` engines (``0``: none)."""
    over = young_failures - size
    if over <= 0:
        return 0.0
    return YOUNG_FAILURE_RETRY_S[min(over, len(YOUNG_FAILURE_RETRY_S)) - 1]


#: The methods by which each driver starts engines in the background, which
#: its ``_keep_trying`` calls until one returns, and what each starts.
START_ATTEMPTS = {"_try_replacement": "a replacement vw engine",
                  "_try_own_engines": "the pool's vw engines"}


#: A call takes one more engine only while at least this many of its items
#: are left to deal (smaller requests are served by one engine: a second
#: would save less time than waking it costs).
SPLIT_MIN_ITEMS = 2 * DEFAULT_BATCH_SIZE

#: Items a pool formats and deals to one engine at a time by default: twice a
#: single process's batch. A pool's calling thread feeds several engines, and
#: larger batches cost it less per item; on 2 vCPUs, with the benchmark's
#: formatter (about 0.3 us per item), a pool of 2 returned 4% to 8% more
#: predictions within 10 ms with batches of 100 and up to 200 lines in flight
#: than with 50 and 100 (6,000 items per request, in-process A/B), and served
#: 6%, 16% and 32% more predictions per second to 1, 4 and 16 concurrent
#: callers; with a formatter of 5 us per item the two did alike. A call may
#: overrun its deadline by one batch's formatting.
POOL_BATCH_SIZE = 2 * DEFAULT_BATCH_SIZE

#: The most lines a pool keeps in flight per engine by default (two default batches).
POOL_MAX_PENDING_LINES = 2 * POOL_BATCH_SIZE


class WaitForPipes(NamedTuple):
    """Wait until an engine of ``lanes`` printed something or can take its
    waiting input, or until ``until`` (``None``: no limit).

    The driver sends back (``flow.send``) the stdout descriptors it found
    readable, so that the call reads only those engines: a read of an empty
    pipe is a system call and an exception, and reading every engine after
    every wait and every step made a sixth of the client's cost per line.
    ``None`` (``next(flow)``) means "not known": every engine is read.
    """

    lanes: List[Lane[Slot]]
    until: Optional[float]


class WaitForEngine(NamedTuple):
    """Wait until the pool's state changes from ``version`` (an engine was
    given back, added or taken out), or until ``until``."""

    version: int
    until: Optional[float]


class GiveTheLoopATurn(NamedTuple):
    """The call has worked for a while without waiting: an event loop should
    run its other tasks once (threads need not)."""


#: What a pool call may wait for.
Wait = Union[WaitForPipes, WaitForEngine, GiveTheLoopATurn]

#: What a driver sends back after :class:`WaitForPipes`: the readable stdout
#: descriptors, or ``None`` when it does not know.
Readable = Optional[Collection[int]]

_NONE_READABLE: FrozenSet[int] = frozenset()


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


#: ``looked_at`` of a call that has not read its engines after a wait yet:
#: no lane has been quiet as of then
_NEVER_LOOKED = float("-inf")


def default_pool_size() -> int:
    """The number of CPUs this process may use: those it may run on
    (``os.sched_getaffinity``), no more than its cgroup's CPU quota
    (``docker run --cpus``, a Kubernetes CPU limit) rounded up; see
    :func:`~subwabbit.cpus.usable_cpus`."""
    return usable_cpus()


def check_pool_size(size: Optional[int]) -> int:
    """``size``, or the default when ``None``.

    :raises ValueError: for anything but a positive int, or more engines
        than the process can run (:func:`~subwabbit.pool_size.largest_pool_size`),
        before any engine starts
    """
    if size is None:
        return min(default_pool_size(), largest_pool_size())
    number = positive_int(size, "size", or_none=True)
    if number > largest_pool_size():
        raise ValueError(f"size={number} is more engines than a pool may have here: "
                         f"{size_limit_reason()}")
    return number


def lanes_wanted(remaining: Optional[int], share: int, held: int,
                 most: Optional[int] = None) -> int:
    """How many more engines a call should take: up to its ``share`` (and
    ``most``, the engines it can use at all), and only while enough items are
    left to make another engine worth it (``remaining`` is ``None`` for an
    iterable of unknown length)."""
    room = share - held if most is None else min(share, most) - held
    if room <= 0:
        return 0
    if remaining is None:
        return room
    useful = remaining // SPLIT_MIN_ITEMS
    return max(0, min(room, useful if held else max(1, useful)))


def _new_counters() -> Dict[str, int]:
    """The counters of :meth:`PoolBase.stats`, at 0."""
    return {"calls": 0, "engine_failures": 0, "engines_replaced": 0, "reloads": 0,
            "waited_for_engine": 0}


class PoolBase(ClientBase):
    """What the thread and asyncio pools share: settings, the roster, metrics."""

    def _configure_pool(self, formatter: Any, vw_args: VwArgs, size: Optional[int], *,
                        batch_size: int, max_pending_lines: int, write_cutoff_s: float,
                        vw_command: Union[str, Sequence[str], None],
                        metrics_hook: Optional[MetricsHook], startup_timeout_s: float,
                        io_timeout_s: Optional[float], restart_after_fork: bool,
                        share_weights: bool, prediction_type: Optional[str],
                        low_priority_engines: Optional[bool] = None) -> None:
        self._configure(formatter, vw_args, batch_size, write_only=False, audit_mode=False,
                        vw_command=vw_command, metrics_hook=metrics_hook,
                        startup_timeout_s=startup_timeout_s, io_timeout_s=io_timeout_s,
                        restart_on_crash=True, restart_after_fork=restart_after_fork,
                        prediction_type=prediction_type)
        self.size = check_pool_size(size)
        self.write_cutoff_s, self.max_pending_lines, _ = check_deadline_settings(
            max_pending_lines, None, None, write_cutoff_s)
        self._roster = Roster()
        self.share_weights = flag(share_weights, "share_weights")
        #: in a forked child: the model file its parent's engines loaded, and
        #: the parent's pid (see :meth:`_check_file_after_fork`)
        self._parent_model_file: Optional[FileIdentity] = None
        self._fork_parent_pid = os.getpid()
        #: whether the engines run below the client's priority (default: when
        #: there are several and, with the calling thread, they are more than
        #: the CPUs). A lone engine runs vw's two-thread driver, and lowered
        #: it starves: ``python -m benchmarks.pool``, pinned to 1 CPU, gave a
        #: pool of 1 709 predictions within 10 ms lowered and 1,482 not (the
        #: engine alone: 1,343 and 1,432)
        self.low_priority_engines = (self.size > 1 and self.size + 1 > default_pool_size()
                                     if low_priority_engines is None
                                     else flag(low_priority_engines, "low_priority_engines"))
        #: the engines of each generation still in service
        self._groups: Dict[int, EngineGroup] = {}
        #: every group of this pool still referred to (one a reload is
        #: starting included): close() closes them all, which stops the
        #: engines they are starting
        self._all_groups: "weakref.WeakSet[EngineGroup]" = weakref.WeakSet()
        #: engines closing on other threads (an old model's, failed ones):
        #: close() ends them within its timeout (``_close_later`` adds them)
        self._retiring = RetiringEngines()
        self._closed = False
        #: counters since the pool was created, or in a forked child since
        #: the fork (see :meth:`stats`)
        self._counters = _new_counters()
        #: engines of the generation that failed young in a row (see
        #: :data:`YOUNG_FAILURE_RETRY_S`), and that generation
        self._young_failures = (0, 0)
        #: the first batch of the last call that got predictions with no
        #: engine failing: what new engines are warmed up with (see
        #: :meth:`_warm_up_lines`)
        self._recent_lines: Optional[Sequence[str]] = None

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
            model), ``engines_busy`` and ``generation``. The counters count
            since the pool was created, or in a forked child since the fork
            (what the parent counted is not the child's); the generation is
            the model's, and a child keeps it.
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
                      deadline: Optional[float], debug_info: Any) -> SplitPredictExchange[Slot]:
        common_part = format_common_part(self.formatter, common_features, debug_info)
        return SplitPredictExchange(
            formatter=self.formatter, common_part=common_part, common_features=common_features,
            items=items_features, debug_info=debug_info, kind=self.prediction_kind,
            batch_size=self.batch_size, max_in_flight_lines=self.max_pending_lines,
            deadline=deadline, write_cutoff_s=self.write_cutoff_s,
            idle_s=self.io_timeout_s,
            clock=_clock, format_s_per_item=self._format_s_per_item)

    def _prepare_pool_metrics(self, metrics: Optional[Dict[str, Any]]
                              ) -> Optional[Dict[str, Any]]:
        metrics = self._prepare_metrics(metrics, None, ())
        if metrics is not None:
            metrics["engines"] = 0
            metrics["engine_failures"] = 0
            metrics["hedged_lines"] = 0
            metrics["model_generation"] = None
        return metrics

    def _finish_pool_metrics(self, metrics: Optional[Dict[str, Any]], start: float,
                             results: Optional[List[Any]],
                             exchange: Optional[SplitPredictExchange[Slot]],
                             engines: int) -> None:
        """Fill a call's closing metrics and hand them to the hook.

        :param results: what the call returned; ``None`` when it raised (or
            was cancelled): the caller got no prediction, whatever the
            engines had answered
        """
        if metrics is not None:
            metrics["num_lines"] = 0 if results is None else len(results)
            metrics["total_time"] = _clock() - start
            metrics["engines"] = engines
            if exchange is not None:
                metrics["engine_failures"] = exchange.failed_lanes
                metrics["hedged_lines"] = exchange.hedged_lines
        self._finish_call("predict", metrics)

    @staticmethod
    def _length(items: Any) -> Optional[int]:
        """How many items a call has (``None``: an iterable of unknown
        length). Asked once, before the call takes anything: a ``len()``
        that raises (a lazy sequence's query) must not leave the call
        counted in, or engines it gave back unclosed."""
        try:
            return len(items)
        except TypeError:
            return None

    @staticmethod
    def _remaining(total: Optional[int], exchange: SplitPredictExchange[Slot]) -> Optional[int]:
        return None if total is None else total - exchange.formatted

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

    def _take_first(self, exchange: SplitPredictExchange[Slot], total: Optional[int],
                    ticket: Optional[Ticket] = None,
                    deadline: Optional[float] = None) -> Optional[int]:
        """Take a call's first engines if one is free and not due to a call
        that waited before it.

        :param ticket: the call's place among the waiting calls (``None``:
            it does not wait yet, and comes after all of them)
        :param deadline: the call's deadline (``None``: none), for
            :meth:`Roster.ahead_of <subwabbit.core.roster.Roster.ahead_of>`
        :returns: the generation that serves it, or ``None`` when none is free
        """
        roster = self._roster
        generation = roster.generation
        free = roster.free(generation)
        if not free:
            return None
        mine = len(free) - roster.ahead_of(ticket, _clock(), deadline)
        if mine <= 0:
            return None
        roster.calls += 1
        want = lanes_wanted(self._remaining(total, exchange), roster.share(generation), 0,
                            exchange.max_lanes)
        for slot in free[:min(mine, max(1, want))]:
            roster.take(slot)
            exchange.add_lane(slot, slot.channel)
        return generation

    def _take_replacement(self, exchange: SplitPredictExchange[Slot], generation: int,
                          ticket: Optional[Ticket] = None) -> bool:
        """For a call whose engines all failed: take a free engine of its
        generation, if not due to a call that waited before it.

        :param ticket: the call's place among the waiting calls (``None``:
            it does not wait yet, and comes after all of them)
        """
        roster = self._roster
        free = roster.free(generation)
        if not free or generation != roster.generation:
            return False
        if len(free) <= roster.ahead_of(ticket, _clock(), exchange.end_at):
            return False
        roster.take(free[0])
        exchange.add_lane(free[0], free[0].channel)
        return True

    def _rebalance_now(self, exchange: SplitPredictExchange[Slot], total: Optional[int],
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
            if self._given_back_now(lane.key):
                closing.append(lane.key)
        active = exchange.active_lanes
        if roster.over_share(active, generation):
            lanes = [lane for lane in exchange.lanes if not lane.retiring]
            exchange.retire_lane(min(lanes, key=lambda lane: lane.channel.in_flight_lines))
        elif exchange.wants_lanes and not roster.waiting and generation == roster.generation:
            want = lanes_wanted(self._remaining(total, exchange), roster.share(generation),
                                active, exchange.max_lanes)
            for slot in roster.free(generation)[:want]:
                roster.take(slot)
                exchange.add_lane(slot, slot.channel)
        return closing

    def _give_back_now(self, lanes: List[Lane[Slot]], counted: bool) -> List[Slot]:
        """A call ends: its engines go back.

        :returns: engines to close (their generation was replaced)
        """
        self._counters["calls"] += 1
        now = _clock()
        for lane in lanes:
            lane.key.note_progress(now)
        closing = [lane.key for lane in lanes if self._given_back_now(lane.key)]
        if counted:
            self._roster.calls -= 1
            self._roster.version += 1
        return closing

    def _given_back_now(self, slot: Slot) -> bool:
        """A call gives ``slot`` back (state lock held).

        :returns: whether the call must close its engine now: a reload
            replaced its generation, it was taken out of service while held,
            or the pool was closed while the call held it
        """
        must_close = self._roster.give_back(slot)
        if self._closed:  # close() closed the others itself
            must_close, slot.close_on_return = slot.close_on_return, False
        return must_close

    def _leave_held_to_their_calls_now(self, slots: List[Slot]) -> List[Slot]:
        """At close, once calls had their time to give engines back (state
        lock held): the engines still held are killed, so that their calls
        meet a dead engine at their next step, and are closed by their calls
        when they give them back, since a descriptor closed under a call
        could be reused by another engine or file before the call's next
        read or write.

        :returns: the engines no call holds, for ``close()`` to close
        """
        for slot in slots:
            if slot.held:
                slot.close_on_return = True
                slot.engine.kill()
        return [slot for slot in slots if not slot.held]

    def _take_out_now(self, slot: Slot) -> bool:
        """A failed engine leaves service (counted once however many calls see it fail).

        :returns: whether it was in service (so a replacement is due, for the
            current generation of an open pool)
        """
        in_service = self._roster.remove(slot)
        if in_service:
            self._counters["engine_failures"] += 1
        return in_service

    def _check_reload(self, timeout: float, vw_args: VwArgs) -> "tuple[ReloadPlan, float]":
        """Check a reload's arguments before anything starts (this reads the
        model file's header: the asyncio pool calls it on a worker thread).

        :returns: what the reload switches to, and ``timeout`` validated
        """
        timeout = required_seconds(timeout, "timeout")
        if self._closed:
            raise self._closed_error()
        return self._plan_reload(vw_args), timeout

    def _switch_to(self, group: EngineGroup, engines: List[EngineProcess],
                   plan: ReloadPlan) -> "tuple[List[Slot], List[EngineGroup]]":
        """Serve new calls with a reload's started engines (state lock held);
        stop them instead if the pool closed meanwhile.

        :returns: see :meth:`_switch_now`
        :raises VowpalWabbitError: when the pool closed during the reload
        """
        if self._closed:
            self._discard(engines, group)
            raise self._closed_error()
        if self._in_forked_child():
            # A child's reload gives it engines of its own: there is nothing
            # left to start for the model it inherited.
            self._owner_pid = os.getpid()
        switched = self._switch_now(group, engines)
        self._reloaded(plan)
        self._changed()
        logger.info("reloaded the pool: generation %d, vw%s", self._roster.generation,
                    [engine.pid for engine in engines])
        return switched

    def _begin_close_now(self) -> Optional[List[Slot]]:
        """Mark the pool closed and take every engine out of service (state
        lock held).

        :returns: the engines, or ``None`` when the pool was closed already
        """
        if self._closed:
            return None
        self._closed = True
        slots = list(self._roster.slots)
        for slot in slots:
            self._roster.remove(slot)
        # A change, engines or not: a call waiting while none was in service
        # (a replacement starting) waits for one, and must see the pool closed.
        self._roster.version += 1
        self._changed()
        return slots

    def _abandon_in_fork(self, slots: List[Slot]) -> None:
        """Closing in a forked child: let go of the parent's engines untouched."""
        for slot in slots:
            slot.engine.abandon_in_fork()
        for group in list(self._groups.values()):
            group.abandon_in_fork()

    def _switch_now(self, group: EngineGroup, engines: List[Any]
                    ) -> "tuple[List[Slot], List[EngineGroup]]":
        """Put a reload's engines in service and serve new calls with them.

        :returns: the old engines no call holds, to close now, and the old
            groups (whose fork servers can go: their engines live on)
        """
        generation = self._roster.generation + 1
        old_groups = list(self._groups.values())
        # Their fork servers close within the reload's timeout: close()
        # ends those still running within its own, as the old engines.
        self._retiring.add([group.server.engine for group in old_groups
                            if group.server is not None])
        self._groups = {generation: group}
        self._enlist(engines, generation, group)
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

    def _log_failure(self, slot: Slot, error: BaseException, replacing: bool,
                     delay: float = 0.0, young: int = 0) -> None:
        """Log an engine's failure.

        :param delay: how long its replacement waits (see :meth:`_replacement_delay`)
        :param young: engines that failed young in a row, this one included
        """
        if isinstance(error, VowpalWabbitError):
            slot.engine.add_context(error)
        if not replacing:
            then = ""
        elif delay:
            then = (f"; engines keep failing within {YOUNG_ENGINE_S:g} s of their start "
                    f"({young} in a row): starting a replacement in {delay:g} s")
        else:
            then = "; starting a replacement"
        # The text, not the error: its traceback holds the pool (see _start_failed).
        logger.warning("a vw engine of the pool failed (vw[%s]): %s%s", slot.engine.pid,
                       str(error), then)

    def _new_group(self, argv: List[str], vw_args: List[str]) -> EngineGroup:
        """The engines of one model, started with ``argv`` (the engine
        command and ``vw_args``)."""
        # The group (and its fork server's reader thread) hold the pool only
        # weakly: a pool dropped without close() is released, and its
        # engines with it, as soon as nothing else refers to it.
        pool = weakref.ref(self)

        def warm_up_lines() -> Optional[Sequence[str]]:
            alive = pool()
            return None if alive is None else alive._warm_up_lines()  # pylint: disable=protected-access

        def engine_exited(pid: int) -> None:
            alive = pool()
            if alive is not None:
                alive._engine_exited(pid)  # pylint: disable=protected-access

        group = EngineGroup(argv, self.startup_timeout_s, self.share_weights,
                            self._outputs_per_line, self._probe_kind, self.low_priority_engines,
                            warm_up_lines, engine_exited, model_path=model_file_path(vw_args))
        self._all_groups.add(group)
        return group

    def _groups_to_close(self) -> List[EngineGroup]:
        """The groups close() closes: those in service, and those starting
        engines (a reload's, a replacement's), whose starts it cuts short:
        every group made by :meth:`_new_group` and still referred to (those
        in service are among them)."""
        return list(self._all_groups)

    def _engine_exited(self, pid: int) -> None:
        """A fork server reported that its engine ``pid`` ended (called on
        the thread that reads its messages, which must not block): the
        driver runs :meth:`_replace_if_dead_and_free` on its side."""
        raise NotImplementedError()

    def _serving(self, generation: int) -> bool:
        """Whether the pool is open and serves ``generation``'s model."""
        return not self._closed and generation == self._roster.generation

    def _replacement_wanted(self, generation: int) -> Optional[EngineGroup]:
        """The group a replacement for ``generation`` is started in, or
        ``None`` when none is wanted any more (the pool closed, or a reload
        moved it to another model)."""
        return self._groups.get(generation) if self._serving(generation) else None

    def _start_failed(self, error: BaseException, failures: int, generation: int,
                      attempt: str) -> Optional[float]:
        """Log a start of engines for ``generation`` that failed (the
        ``failures``-th in a row) in the driver's method ``attempt`` (a key
        of :data:`START_ATTEMPTS`).

        :returns: how long to wait before the next attempt (``None``: none
            is wanted any more)
        """
        if not self._serving(generation):
            return None
        delay = start_retry_s(failures)
        # The text, not the error: its traceback holds the pool, and a
        # handler that keeps records would keep a dropped pool alive.
        logger.warning("starting %s failed (attempt %d; the next in %g s): %s",
                       START_ATTEMPTS[attempt], failures, delay, str(error))
        return delay

    def _replace_if_dead_and_free(self, pid: int) -> None:
        """Take engine ``pid`` out of service and start its replacement, if
        it is in service, ended, and no call holds it (a call that holds it
        finds it failed by itself). An engine that dies between calls is so
        replaced at once, before a call can take it: found by a call, it
        cost that call most of its predictions (its first batches went to
        the dead engine, and the replacement started during the call)."""
        if self._closed:
            return
        with self._state_lock():
            dead = self._take_out_dead_now(pid)
            if dead:
                self._changed()
        for slot in dead:
            self._stop_failed(slot, self._exited_idle_error(slot), replacing=True)

    def _take_out_dead_now(self, pid: Optional[int] = None) -> List[Slot]:
        """Take out of service the free engines (of process ``pid``, if
        given) that have ended (with the state lock held).

        :returns: those that were in service (a replacement is due)
        """
        return [slot for slot in list(self._roster.slots)
                if (pid is None or slot.engine.pid == pid) and not slot.held
                and slot.engine.returncode is not None and self._take_out_now(slot)]

    def _exited_idle_error(self, slot: Slot, until: Optional[float] = None) -> BaseException:
        """The error of an engine that exited while no call used it (built
        without the state lock: it may wait for the last lines of stderr,
        never past ``until``, the deadline of the call that found it)."""
        deadline = _clock() + self._status_wait_s
        if until is not None:
            deadline = min(deadline, until)
        return slot.engine.exited_error("the vw engine exited while no call used it",
                                        deadline=deadline)

    def _enlist(self, engines: List[EngineProcess], generation: int,
                group: Optional[EngineGroup]) -> None:
        """Put ``engines``, which ``group`` started, in service for
        ``generation``: the group hands them over (its close() leaves them
        to the pool) and the roster deals them to calls."""
        if group is not None:
            group.hand_over(engines)
        now = _clock()
        for engine in engines:
            self._roster.add(engine, generation, self._channel_for(engine)).since = now

    def _channel_for(self, engine: EngineProcess) -> Channel:
        """The channel a started engine serves on: the one its warm-up left
        (answers it owes to no call are discarded as they come), or a new one."""
        channel, engine.warm_channel = engine.warm_channel, None
        return channel if channel is not None else self._new_channel()

    def _warm_up_lines(self) -> Optional[Sequence[str]]:
        """Lines a recent call sent and had answered, for new engines
        (a reload's, a replacement, those a forked child starts) to predict
        before they serve: a new engine is slow on its first few hundred
        lines. Called on the thread that starts the engines."""
        return self._recent_lines

    # ------------------------------------------------ what each driver supplies

    #: how long the report of a failed engine may wait for its exit status
    #: (the asyncio driver never blocks the loop for it)
    _status_wait_s = _STATUS_WAIT_S

    #: The part of its time (from its start to its deadline) during which a
    #: call waiting for an engine comes before the calls that came after it;
    #: after it, only before those with an earlier deadline; a call without a
    #: deadline comes first for as long as it waits (see
    #: :class:`~subwabbit.core.roster.Roster` for the figures behind it).
    waiting_precedence = 0.1

    def _state_lock(self) -> ContextManager[Any]:
        """Held while the pool's state (the roster, the groups) is read or changed."""
        raise NotImplementedError()

    def _changed(self) -> None:
        """Wake the calls waiting for an engine (called with the state lock held)."""
        raise NotImplementedError()

    def _close_later(self, slots: List[Slot], timeout: float = 5.0) -> None:
        """Close engines no call holds any more, without waiting for them."""
        raise NotImplementedError()

    def _start_engine_later(self, generation: int, delay: float = 0.0) -> None:
        """Start a replacement engine for ``generation`` in the background,
        ``delay`` seconds from now."""
        raise NotImplementedError()

    def _discard(self, engines: List[EngineProcess], group: Optional[EngineGroup] = None
                 ) -> None:
        """Stop engines that will never serve (and their group's fork
        server): started for a pool that closed or moved to another model.
        Called with the state lock held: the threads' pool does it once the
        lock is released, the asyncio pool off the loop."""
        discard(engines, group)

    # ------------------------------------------------------ one predict call

    def _predict_flow(self, common_features: Any, items_features: Iterable[Any],
                      timeout: Optional[float], debug_info: Any,
                      metrics: Optional[Dict[str, Any]]) -> Generator[Wait, Readable, List[Any]]:
        """The steps of one ``predict`` call; yields what it waits for and
        returns the predictions. Closing the generator (an exception or a
        cancellation in the driver) gives the engines back exact."""
        start = _clock()
        warn_if_milliseconds(timeout)
        deadline = deadline_from_timeout(timeout, start=start)
        check_per_item(items_features, "items_features")
        metrics = self._prepare_pool_metrics(metrics)
        results: List[Any] = []
        exchange: Optional[SplitPredictExchange[Slot]] = None
        engines_used = 0
        counted = False
        returned = False
        try:
            if self._check_open() and metrics is not None:
                metrics["restarts"] = 1
            exchange = self._new_exchange(common_features, items_features, deadline, debug_info)
            total = self._length(items_features)
            generation = yield from self._first_engines(exchange, total, deadline,
                                                        start, metrics)
            if generation is not None:
                counted = True
                if metrics is not None:
                    metrics["model_generation"] = generation
                engines_used = yield from self._serve(exchange, total, generation, results)
                if results and not exchange.failed_lanes and exchange.first_lines:
                    self._recent_lines = exchange.first_lines
            returned = True
        finally:
            if exchange is not None:
                self._format_s_per_item = exchange.format_s_per_item
                engines_used = max(engines_used, len(exchange.lanes))
                with self._state_lock():
                    closing = self._give_back_now(exchange.end(), counted)
                    self._changed()
                self._close_later(closing)
            self._finish_pool_metrics(metrics, start, results if returned else None, exchange,
                                      engines_used)
        return results

    def _check_open(self) -> bool:
        """Raise if the pool cannot serve; in a forked child, start its own engines.

        :returns: whether engines were started (after a fork)
        """
        raise NotImplementedError()

    def _first_engines(self, exchange: SplitPredictExchange[Slot], total: Optional[int],
                       deadline: Optional[float], start: float,
                       metrics: Optional[Dict[str, Any]]
                       ) -> Generator[Wait, Readable, Optional[int]]:
        """Take the call's first engines, waiting for one to be free until the
        deadline (or ``io_timeout_s``); free engines found dead or stuck are
        replaced first.

        :returns: the generation that serves the call (``None``: the deadline
            passed first; the call was not counted in)
        """
        limit = deadline
        if limit is None and self.io_timeout_s is not None:
            limit = start + self.io_timeout_s
        roster = self._roster
        ticket: Optional[Ticket] = None
        began = _clock()
        try:
            while True:
                with self._state_lock():
                    if self._closed:
                        raise self._closed_error()
                    stuck = self._take_out_unfit()
                    if not stuck:
                        generation = self._take_first(exchange, total, ticket, deadline)
                        if generation is not None:
                            return generation
                        if ticket is None:
                            ticket = self._start_waiting(start, deadline)
                            self._counters["waited_for_engine"] += 1
                        if limit is not None and _clock() >= limit:
                            if deadline is not None:
                                return None
                            raise self._no_engine_error(start)
                        version = roster.version
                for slot, error in stuck:
                    if error is None:
                        error = self._exited_idle_error(slot, deadline)
                    self._stop_failed(slot, error, replacing=True)
                if not stuck:
                    yield WaitForEngine(version, limit)
        finally:
            self._stop_waiting(ticket)
            if metrics is not None:
                metrics["lock_wait_time"] = _clock() - began
                if ticket is not None:
                    metrics["waited_for_other_call"] = 1

    def _start_waiting(self, now: float, deadline: Optional[float]) -> Ticket:
        """A call's place among the calls waiting for an engine (with the
        state lock held): first among the calls after it for a part of its
        time (:attr:`waiting_precedence`; see
        :class:`~subwabbit.core.roster.Roster`), a call without a deadline for
        as long as it waits."""
        return self._roster.wait(
            None if deadline is None else now + (deadline - now) * self.waiting_precedence,
            deadline)

    def _stop_waiting(self, ticket: Optional[Ticket]) -> None:
        """Give up a call's place among the waiting calls, if it has one."""
        if ticket is not None:
            with self._state_lock():
                self._roster.stop_waiting(ticket)
                self._changed()

    def _serve(self, exchange: SplitPredictExchange[Slot], total: Optional[int], generation: int,
               results: List[Any]) -> Generator[Wait, Readable, int]:
        """Drive the call on its engines until it is done.

        :returns: the most engines the call held at once
        """
        roster = self._roster
        seen = -1
        most = len(exchange.lanes)
        worked_since = _clock()
        #: the stdout descriptors the driver's last wait found readable
        #: (``None``: not known, every engine is read)
        readable: Readable = None
        #: whether the loop just came back from a wait: the engines it found
        #: readable are read before the step, so that one step per wake takes
        #: their answers and deals in their place (stepping first found
        #: nothing new and cost a second step and pump round per wake). That
        #: read writes nothing: the step decides what may still be written
        #: (the write cut-off drops the lines not yet in a pipe). Past the
        #: deadline nothing is read: the step ends the call.
        woke = False
        #: when the loop last read the engines after a wait: a lane is stuck
        #: if it was quiet for io_timeout_s as of then. (As of the step's
        #: time, an event loop that ran other tasks past io_timeout_s, or a
        #: wake past the deadline, when nothing is read, took answers
        #: waiting unread in the pipes for silence, and failed healthy engines.)
        looked_at: Optional[float] = None
        while True:
            if self._closed:  # close() waits for the calls to give their engines back
                exchange.done = exchange.timed_out = True
                return most
            if woke:
                woke = False
                now = _clock()
                if exchange.end_at is None or now < exchange.end_at:
                    self._pump_lanes(exchange, readable, now, write=False)
                    looked_at = now
                readable = _NONE_READABLE
            now = _clock()
            for lane in exchange.stuck_lanes(
                    now, _NEVER_LOOKED if looked_at is None else looked_at):
                self._fail_lane(exchange, lane, exchange.idle_error())
            try:
                results += exchange.step(now)
            except VowpalWabbitProtocolError as exc:
                # An engine printed what is no prediction: it serves no other call.
                unparsable = exchange.unparsable_lane
                if unparsable is not None and unparsable in exchange.lanes:
                    self._fail_lane(exchange, unparsable, exc)
                raise
            if exchange.done:
                return most
            if self._closed:  # closed during the step (a slow formatter): its engines
                exchange.done = exchange.timed_out = True  # may be killed; none failed
                return most
            if seen != roster.version or exchange.releasable_lanes():
                with self._state_lock():
                    closing = self._rebalance_now(exchange, total, generation)
                    self._changed()
                    seen = roster.version
                self._close_later(closing)
                most = max(most, len(exchange.lanes))
            if not exchange.lanes:
                if not (yield from self._replacement_engine(exchange, generation)):
                    exchange.done = exchange.timed_out = True
                    return most
                continue
            answered = self._pump_lanes(exchange, readable, now)
            # Until the next wait, no engine is known to have printed more.
            readable = _NONE_READABLE
            if answered or exchange.can_deal_now():
                # Answers to take, or a lane with room for the next batch (it
                # has just been written to another): step again without a wait
                # (a wait of no time cost a third of a call's waits).
                if _clock() - worked_since >= YIELD_AFTER_S:
                    yield GiveTheLoopATurn()
                    worked_since = _clock()
                continue
            # The wait comes without another step: a lane just dealt its first
            # lines must have its idle clock running (a call without a deadline
            # would otherwise wait for a stopped engine forever).
            exchange.note_progress(_clock())
            readable = yield WaitForPipes(list(exchange.lanes), exchange.wake_at())
            worked_since = _clock()
            woke = True

    def _pump_lanes(self, exchange: SplitPredictExchange[Slot], readable: Readable,
                    now: float, write: bool = True) -> bool:
        """Write what each engine of the call takes (unless ``write`` is
        false) and read the engines in ``readable`` (``None``: all); an
        engine that fails is reported to the exchange (its batches are dealt
        again).

        :returns: whether any answer arrived (or an engine failed)
        """
        answered = False
        # A failed engine's exit status is worth a short wait at most (its
        # batches go to the other engines), never past the deadline.
        status_until = now + self._status_wait_s
        if exchange.end_at is not None:
            status_until = min(status_until, exchange.end_at)
        for lane in list(exchange.lanes):
            engine, channel = lane.key.engine, lane.channel
            received = channel.bytes_received
            try:
                pump(engine, channel, status_until,
                     read=readable is None or engine.stdout_fd in readable, write=write)
            except ENGINE_FAILURES as exc:
                self._fail_lane(exchange, lane, exc)
                answered = True
                continue
            if channel.bytes_received != received:
                answered = True
        return answered

    def _replacement_engine(self, exchange: SplitPredictExchange[Slot],
                            generation: int) -> Generator[Wait, Readable, bool]:
        """A call whose engines all failed waits for one of its generation.

        :returns: ``False`` when its time is up first, or the pool closed
        """
        limit = exchange.end_at
        if limit is None and self.io_timeout_s is not None:
            limit = _clock() + self.io_timeout_s
        roster = self._roster
        #: its place among the calls waiting for an engine: without one, the
        #: replacement went to whichever call asked first, and a caller
        #: calling back to back kept it from this call until its time was up
        ticket: Optional[Ticket] = None
        try:
            while True:
                with self._state_lock():
                    if self._closed:  # a call in progress: it ends with what it has
                        return False
                    if self._take_replacement(exchange, generation, ticket):
                        return True
                    if generation != roster.generation:
                        # A reload replaced the call's model: no engine of it is
                        # started again, and a call never mixes two models.
                        if exchange.end_at is not None:
                            return False
                        raise VowpalWabbitError(
                            "the engines of the model this call began on failed, and a "
                            "reload has replaced that model since: call again to be served "
                            "by the new one")
                    if limit is not None and _clock() >= limit:
                        if exchange.end_at is None:
                            raise self._no_engine_error(None)
                        return False
                    if ticket is None:
                        # as a call that waits for its first engine
                        ticket = self._start_waiting(_clock(), exchange.end_at)
                    version = roster.version
                yield WaitForEngine(version, limit)
        finally:
            self._stop_waiting(ticket)

    def _take_out_unfit(self) -> "List[tuple[Slot, Optional[BaseException]]]":
        """Free engines that a call must not take, taken out of service (with
        the state lock held): those that exited while no call used them
        (their error is ``None``: the caller builds it, without the lock),
        and those that owe answers and printed nothing for ``io_timeout_s``.

        Nobody reads a free engine's pipe, so what it printed meanwhile is
        read first (and discarded: it belongs to calls that ended); only an
        engine with nothing to read, or whose pipe failed, is stuck.
        """
        # A dead engine found here costs no call anything; found by a call,
        # it cost that call most of its predictions (the call's first batches
        # went to it, the replacement started meanwhile).
        found: "List[tuple[Slot, Optional[BaseException]]]" = [
            (slot, None) for slot in self._take_out_dead_now()]
        # A call interrupted between a read or write and its bookkeeping left
        # its engine's channel torn: nobody knows which answer is whose.
        found += [(slot, torn_channel_error()) for slot in list(self._roster.slots)
                  if not slot.held and slot.channel.torn and self._take_out_now(slot)]
        for slot in self._roster.stuck(_clock(), self.io_timeout_s):
            error = stuck_engine_error(slot.engine, slot.channel, self.io_timeout_s, self.argv)
            if error is None:
                continue  # it was answering: not stuck
            if self._take_out_now(slot):
                found.append((slot, error))
        if found:
            self._changed()
        return found

    def _fail_lane(self, exchange: SplitPredictExchange[Slot], lane: Lane[Slot],
                   error: BaseException) -> None:
        exchange.fail_lane(lane, keep_answers=not isinstance(error, VowpalWabbitProtocolError))
        if exchange.failed_lanes > max(2, self.size):
            # The call's own lines keep failing engines: stop dealing them out.
            self._fail_slot(lane.key, error)
            raise error
        self._fail_slot(lane.key, error)

    def _fail_slot(self, slot: Slot, error: BaseException) -> None:
        """Take a failed engine out of service, stop it, and start its
        replacement in the background (for the generation it served, if
        still current)."""
        with self._state_lock():
            in_service = self._take_out_now(slot)
            self._changed()
        self._stop_failed(slot, error, in_service)

    def _stop_failed(self, slot: Slot, error: BaseException, replacing: bool) -> None:
        """Stop an engine taken out of service, and start its replacement
        if it was in service for the current generation of an open pool."""
        replacing = replacing and slot.generation == self._roster.generation and \
            not self._closed
        delay, young = self._replacement_delay(slot) if replacing else (0.0, 0)
        self._log_failure(slot, error, replacing, delay, young)
        slot.engine.kill()
        self._close_later([slot], 0.5)
        if replacing:
            self._start_engine_later(slot.generation, delay)

    def _replacement_delay(self, slot: Slot) -> "tuple[float, int]":
        """How long the replacement of ``slot``, which failed, waits before
        it starts (see :data:`YOUNG_FAILURE_RETRY_S`), and how many engines
        have failed young in a row, ``slot``'s included (for the log message:
        both are read under the state lock)."""
        with self._state_lock():
            generation, young = self._young_failures
            if generation != slot.generation:
                young = 0
            if slot.since is not None and _clock() - slot.since < YOUNG_ENGINE_S:
                young += 1
            else:
                young = 0
            self._young_failures = (slot.generation, young)
        return young_failure_retry_s(young, self.size), young

    def _put_in_service(self, engines: List[EngineProcess], generation: int,
                        replacing: bool = False, group: Optional[EngineGroup] = None) -> bool:
        """Add started engines to the roster (with the state lock held), or
        stop them (and ``group``, whose engines they all are) when the pool
        closed or moved to another generation.

        :returns: whether they were added
        """
        if self._closed or generation != self._roster.generation:
            self._discard(engines, group)
            return False
        self._enlist(engines, generation, group if group is not None
                     else self._groups.get(generation))
        if replacing:
            self._counters["engines_replaced"] += len(engines)
        self._changed()
        return True

    def _check_file_after_fork(self, group: EngineGroup) -> None:
        """In a forked child whose own engines of the parent's generation
        just started (``group``): warn when they loaded another model file
        than the parent's engines did (a new file moved over the path since):
        this process then serves another model than its parent and the forks
        made before the file changed, under the same generation number."""
        parent = self._parent_model_file
        if parent is not None and group.model_file != parent:
            logger.warning(
                "the model file at %s is not the one the pool's engines loaded in the parent "
                "process %d: this process (%d) serves the new file under generation %d, and "
                "other processes forked from the same parent may serve the old one (write "
                "new models under new names, or reload() the pool in every process)",
                model_file_path(self.vw_args), self._fork_parent_pid, os.getpid(),
                self._roster.generation)

    # ----------------------------------------------------------- not served

    def _after_fork_in_child_base(self) -> None:
        """In a forked child: let go of the parent's engines and fork servers."""
        for slot in list(self._roster.slots):
            slot.engine.abandon_in_fork()
        serving = self._groups.get(self._roster.generation)
        self._parent_model_file = serving.model_file if serving is not None else None
        self._fork_parent_pid = self._owner_pid
        for group in self._groups.values():
            group.abandon_in_fork()
        self._groups = {}
        self._all_groups = weakref.WeakSet()  # the parent's
        self._retiring.reset_in_fork()
        generation = self._roster.generation
        self._roster = Roster()
        self._roster.generation = generation
        # The parent's calls are the parent's: summed over the workers of a
        # preloaded service, they were counted once per worker.
        self._counters = _new_counters()
        self._young_failures = (0, 0)

    def _release(self) -> None:
        if self._closed:
            return
        # Closed first: the engines it lets go exit, their fork server says
        # so, and that must not start replacements (the pool is still
        # reachable through its weak references while __del__ runs).
        self._closed = True
        for group in self._groups.values():
            if group.server is not None:
                group.server.on_exit = None
                group.server.stopped = True  # its end is asked for, not a death to report
        engines = [slot.engine for slot in self._roster.slots]
        engines += [group.server.engine for group in self._groups.values()
                    if group.server is not None]
        failure: Optional[Exception] = None
        for engine in engines:
            if engine.owner_pid == os.getpid() and not engine.closed:
                try:
                    engine.release(0.0)
                except Exception as exc:  # pylint: disable=broad-except
                    # (its ResourceWarning, when warnings are errors): every
                    # engine is let go all the same
                    failure = failure or exc
        if failure is not None:
            raise failure

    def __del__(self) -> None:
        try:
            self._release()
        except ResourceWarning:
            raise  # (an error where warnings are: reported as for the other clients)
        except Exception:  # pylint: disable=broad-except
            pass


#: How long stopping what will never serve waits for each step: there is no
#: model to write, and a fork server that does not answer (stopped) is killed.
DISCARD_WAIT_S = 1.0


def discard(engines: List[EngineProcess], group: Optional[EngineGroup] = None,
            timeout: float = DISCARD_WAIT_S) -> None:
    """Stop started engines that will never serve, and their group's fork
    server: every engine is killed first, then the server is stopped (so that
    an engine it cannot reap any more is not waited for), then each engine is
    reaped. Blocks for about ``2 * timeout`` at most."""
    for engine in engines:
        engine.kill()
    if group is not None:
        group.close(timeout)
    for engine in engines:
        engine.abort(timeout)

"""One ``predict`` call spread over several engines, without I/O.

A pool scores one request on several engines at once. The call's items are
cut into batches, formatted in item order, and each batch is *dealt* to the
engine (a *lane*) with the most room; answers come back on each lane in the
order its batches were dealt, and the call hands out predictions in item
order: the longest prefix of items whose predictions have all arrived. Dealing
batches in item order (rather than giving each engine a contiguous half) keeps
the engines working on the same prefix, so that a deadline wastes little.

Each lane is a :class:`~subwabbit.core.channel.Call` on that engine's
:class:`~subwabbit.core.channel.Channel`, so the channel's rules hold per
engine: an answer goes only to the call that is owed it, and what an ended
call left in flight is discarded when it arrives.

Lanes come and go during a call: the driver adds one when an engine is free
and the call may use more (see :mod:`subwabbit.core.roster`), retires one so
that another call can have it (no new batch is dealt to it; it is released
once its answers are in), or reports one failed (its unanswered batches are
dealt again to the other lanes, so that a dead engine costs time, not
predictions).
"""

import collections
import math
from typing import Any, Deque, Hashable, Iterable, List, Optional

from ..errors import VowpalWabbitTimeoutError
from .channel import Call, Channel
from .exchanges import Parser, _line_joiner, check_item_parts, format_next


class _Batch:
    """Consecutive items formatted together and dealt to one lane."""

    # No reference to its lane: the lane holds its batches, and a cycle
    # between them would leave every call's batches to the garbage collector,
    # whose pauses fall on later calls.
    __slots__ = ("start", "lines", "values")

    def __init__(self, start: int, lines: List[str]) -> None:
        self.start = start          # index of its first item in the request
        self.lines = lines          # its formatted examples
        self.values: List[Any] = []  # predictions received so far, in order

    @property
    def complete(self) -> bool:
        return len(self.values) == len(self.lines)


class Lane:
    """One engine's part in a split call.

    :param key: the driver's name for the engine (returned to it on release)
    :param channel: the engine's channel; a call is begun on it
    """

    __slots__ = ("key", "channel", "call", "batches", "retiring", "dealt_lines",
                 "_progress", "_quiet_since")

    def __init__(self, key: Hashable, channel: Channel) -> None:
        self.key = key
        self.channel = channel
        self.call: Call = channel.begin()
        #: batches dealt to this lane and not fully answered, in dealing order
        self.batches: Deque[_Batch] = collections.deque()
        #: no new batch is dealt; released once its batches are answered
        self.retiring = False
        #: example lines dealt to this lane in all
        self.dealt_lines = 0
        self._progress = -1
        self._quiet_since = 0.0

    @property
    def drained(self) -> bool:
        """Whether nothing this lane was dealt is still unanswered."""
        return not self.batches


class SplitPredictExchange:
    """The steps of one ``predict`` call over any number of lanes.

    :param formatter: the model's formatter
    :param common_part: the formatted common features (checked by the caller)
    :param common_features: passed on to ``format_item_features``
    :param items: the items (any iterable; read in order, a batch at a time)
    :param debug_info: passed to every formatter call
    :param parse: turns answer lines into predictions
    :param batch_size: items formatted and dealt at a time
    :param max_in_flight_lines: the most lines in flight per engine (earlier
        calls' leftovers on it included)
    :param deadline: the call's deadline (a clock value), or ``None``; the call
        ends at it with what has arrived
    :param write_cutoff_s: no new batch is dealt this long before the deadline
    :param idle_s: how long a lane may owe answers without any progress before
        it is reported stuck (:meth:`stuck_lanes`); ``None``: no limit
    """

    def __init__(self, *, formatter: Any, common_part: str, common_features: Any,
                 items: Iterable[Any], debug_info: Any, parse: Optional[Parser] = None,
                 batch_size: int, max_in_flight_lines: int, deadline: Optional[float],
                 write_cutoff_s: float = 0.0, idle_s: Optional[float] = None,
                 kind: Any = None) -> None:
        if parse is None:
            if kind is None:
                raise TypeError("SplitPredictExchange needs parse= or kind=")
            parse = kind.parse_answers
        self.parse = parse
        #: for a multi-line kind the items make one example: one batch, one lane
        self._example_kind = kind if kind is not None and kind.multi_line else None
        self._common_part = common_part
        self._parts: List[str] = []
        #: the most engines the call can use (``None``: any number)
        self.max_lanes: Optional[int] = 1 if self._example_kind is not None else None
        self._now = 0.0
        self.batch_size = batch_size
        self.max_in_flight_lines = max(max_in_flight_lines, batch_size)
        #: when the call ends whatever is in flight
        self.end_at = deadline
        self.idle_s = idle_s
        self._stop_dealing_at = None if deadline is None else deadline - write_cutoff_s
        self._items = iter(items)
        self._format_item = formatter.format_item_features
        self._common_features = common_features
        self._debug_info = debug_info
        self._join = _line_joiner(formatter, common_part, debug_info)
        self.lanes: List[Lane] = []
        #: batches in item order whose predictions have not all been handed out
        self._order: Deque[_Batch] = collections.deque()
        #: batches to deal again (their lane failed), lowest items first
        self._redeal: List[_Batch] = []
        #: predictions of the first batch of ``_order`` already handed out
        self._handed = 0
        #: no item at or after this index is handed out (set when lines are
        #: dropped at the write cut-off or lost with a failed engine)
        self._limit = math.inf
        #: items formatted so far
        self.formatted = 0
        self._items_left = True
        self._cut_off = False
        #: predictions handed out so far
        self.returned = 0
        #: engines that failed during the call
        self.failed_lanes = 0
        self.done = False
        self.timed_out = False

    # ------------------------------------------------------------ lanes

    def add_lane(self, key: Hashable, channel: Channel) -> Lane:
        """Give the call one more engine (what earlier calls left in flight
        on it is discarded as it arrives)."""
        lane = Lane(key, channel)
        self.lanes.append(lane)
        return lane

    def retire_lane(self, lane: Lane) -> None:
        """Deal nothing more to ``lane``; release it once :attr:`Lane.drained`."""
        lane.retiring = True

    def fail_lane(self, lane: Lane) -> None:
        """``lane``'s engine failed: drop the lane (ending its call) and deal
        its unanswered batches again to the other lanes."""
        self.failed_lanes += 1
        self._collect_lane(lane)  # what arrived before the failure is good
        lane.channel.end(lane.call)
        self.lanes.remove(lane)
        for batch in lane.batches:
            if not self._cut_off:
                self._redeal.append(batch)
            else:
                self._limit = min(self._limit, batch.start + len(batch.values))
        lane.batches.clear()
        self._redeal.sort(key=_start)

    def release_lane(self, lane: Lane) -> None:
        """Take a drained lane out of the call (ending its call on the channel)."""
        if not lane.drained:
            raise ValueError("a lane is released only once its batches are answered")
        lane.channel.end(lane.call)
        self.lanes.remove(lane)

    def releasable_lanes(self) -> List[Lane]:
        """Retiring lanes whose answers are all in."""
        return [lane for lane in self.lanes if lane.retiring and lane.drained]

    @property
    def dealing(self) -> bool:
        """Whether items are left to deal (before the write cut-off)."""
        return not self._cut_off and (bool(self._redeal) or self._items_left)

    #: whether another engine would help
    wants_lanes = dealing

    @property
    def active_lanes(self) -> int:
        """Lanes that are dealt batches (not retiring)."""
        return sum(1 for lane in self.lanes if not lane.retiring)

    # ------------------------------------------------------------- steps

    def step(self, now: float) -> List[Any]:
        """Deal what fits (at most one newly formatted batch), take what
        arrived, apply the deadline.

        :returns: predictions for the next items of the request, in order
        """
        if self.done:
            return []
        self._now = now
        if self.dealing:
            if self._stop_dealing_at is not None and now >= self._stop_dealing_at:
                self._stop_dealing()
            else:
                self._deal()
        self._collect()
        results = self._hand_out()
        if not self.dealing and all(lane.drained for lane in self.lanes):
            self.done = True
        elif self.end_at is not None and now >= self.end_at:
            self.done = self.timed_out = True
        return results

    def _deal(self) -> None:
        lanes = [lane for lane in self.lanes if not lane.retiring]
        if not lanes:
            return
        limit = self.max_in_flight_lines
        batch_size = self.batch_size
        while self._redeal or self._items_left:
            lane = min(lanes, key=_in_flight)
            room = limit - lane.channel.in_flight_lines
            if self._redeal:
                batch = self._redeal[0]
                if room < min(len(batch.lines) - len(batch.values), batch_size):
                    return
                del self._redeal[0]
                self._give(lane, batch, batch.lines[len(batch.values):])
                continue
            if self._example_kind is not None:
                self._format_example(batch_size)
                return
            if room < batch_size:
                return
            batch = self._format(batch_size)
            if batch is not None:
                self._give(lane, batch, batch.lines)
            # One batch formatted per step: the driver checks the clock (the
            # write cut-off, the deadline) and an event loop gets its turn
            # between steps, however slow the formatter.
            return

    def _format_example(self, want: int) -> None:
        """A multi-line kind: format ``want`` more items (one step's share, so
        that an event loop gets turns); when they have all been formatted, the
        example is one batch, queued whole on one lane."""
        parts = self._next_parts(want)
        check_item_parts(parts, len(self._parts))
        self._parts += parts
        if self._items_left:
            return
        if self._parts:
            batch = _Batch(0, self._parts)
            self._parts = []
            self.formatted = len(batch.lines)
            self._order.append(batch)
            lane = min((lane for lane in self.lanes if not lane.retiring), key=_in_flight)
            self._give(lane, batch, batch.lines)

    def _next_parts(self, want: int) -> List[Any]:
        """The next ``want`` items formatted (fewer when they run out: then
        no item is left)."""
        parts = format_next(self._format_item, self._common_features, self._items, want,
                            self._debug_info)
        if len(parts) < want:
            self._items_left = False
        return parts

    def _format(self, want: int) -> Optional[_Batch]:
        parts = self._next_parts(want)
        if not parts:
            return None
        batch = _Batch(self.formatted, self._join(parts, self.formatted))
        self.formatted += len(parts)
        self._order.append(batch)
        return batch

    def _give(self, lane: Lane, batch: _Batch, lines: List[str]) -> None:
        if self._example_kind is not None:
            lane.call.queue_example(self._example_kind.example_lines(self._common_part, lines))
        else:
            lane.call.queue_lines(lines)
        lane.dealt_lines += len(lines)
        lane.batches.append(batch)

    def _stop_dealing(self) -> None:
        """The write cut-off: deal nothing more, and forget the lines that
        have not reached an engine; the results end before the first of them."""
        self._cut_off = True
        self._collect()  # so that what a lane still owes is what it was dealt and not sent
        for batch in self._redeal:
            self._limit = min(self._limit, batch.start + len(batch.values))
        self._redeal = []
        for lane in self.lanes:
            lane.channel.forget_unwritten(lane.call)
            owed = lane.call.owed_lines
            kept: Deque[_Batch] = collections.deque()
            for batch in lane.batches:
                waiting = len(batch.lines) - len(batch.values)
                if owed < waiting:
                    self._limit = min(self._limit, batch.start + len(batch.values) + owed)
                    batch.lines = batch.lines[:len(batch.values) + owed]
                owed -= min(owed, waiting)
                if not batch.complete:
                    kept.append(batch)
            lane.batches = kept

    def _collect(self) -> None:
        for lane in self.lanes:
            self._collect_lane(lane)

    def _collect_lane(self, lane: Lane) -> None:
        answers = lane.call.take_answers()
        if answers:
            if self._example_kind is not None:
                values = self._example_kind.parse_example(answers, len(lane.batches[0].lines))
            else:
                values = self.parse(answers)
            offset = 0
            while offset < len(values):
                batch = lane.batches[0]
                take = min(len(batch.lines) - len(batch.values), len(values) - offset)
                batch.values.extend(values[offset:offset + take])
                offset += take
                if batch.complete:
                    lane.batches.popleft()

    def _hand_out(self) -> List[Any]:
        results: List[Any] = []
        order = self._order
        while order:
            batch = order[0]
            got = len(batch.values)
            if batch.start + got > self._limit:
                got = max(0, int(self._limit) - batch.start)
            if self._handed < got:
                results.extend(batch.values[self._handed:got])
                self._handed = got
            if got < len(batch.lines) or batch.start + got >= self._limit:
                break
            order.popleft()
            self._handed = 0
        self.returned += len(results)
        return results

    # --------------------------------------------------------- time limits

    def stuck_lanes(self, now: float) -> List[Lane]:
        """Lanes that owe answers and showed no progress for ``idle_s``."""
        if self.idle_s is None:
            return []
        stuck = []
        for lane in self.lanes:
            channel = lane.channel
            if not channel.in_flight_lines and not channel.unwritten_bytes:
                lane._progress = -1
                continue
            progress = channel.bytes_written + channel.bytes_received
            if progress != lane._progress:
                lane._progress = progress
                lane._quiet_since = now
            elif now - lane._quiet_since >= self.idle_s:
                stuck.append(lane)
        return stuck

    def idle_error(self) -> VowpalWabbitTimeoutError:
        """The error of a call whose every engine is stuck."""
        return VowpalWabbitTimeoutError(
            f"the vw engine did not answer for {self.idle_s:g} s while waiting for its "
            "predictions (io_timeout_s); it may be stopped or stuck")

    def wake_at(self) -> Optional[float]:
        """When :meth:`step` must run again even if the pipes stay quiet."""
        if self._example_kind is not None and self._items_left and not self._cut_off:
            return self._now  # more items of the example to format: step again at once
        wake = self.end_at
        if self._stop_dealing_at is not None and self.dealing:
            wake = self._stop_dealing_at
        if self.idle_s is not None:
            quiet = [lane._quiet_since + self.idle_s for lane in self.lanes
                     if lane._progress >= 0]
            if quiet:
                wake = min(quiet) if wake is None else min(wake, min(quiet))
        return wake

    def end(self) -> List[Lane]:
        """End the call on every lane (idempotent); what it left in flight is
        discarded by the channels as it arrives.

        :returns: the lanes it held, to be given back to the pool
        """
        self.done = True
        lanes, self.lanes = self.lanes, []
        for lane in lanes:
            lane.channel.end(lane.call)
        return lanes


def _in_flight(lane: Lane) -> int:
    return lane.channel.in_flight_lines


def _start(batch: _Batch) -> int:
    return batch.start

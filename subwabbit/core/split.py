"""One ``predict`` call spread over several engines, without I/O.

A pool scores one request on several engines at once. The call's items are
cut into batches, formatted in item order, and each batch is *dealt* to the
engine (a *lane*) with the most room; answers come back on each lane in the
order its batches were dealt, and the call hands out predictions in item
order: the longest prefix of items whose predictions have all arrived. Dealing
batches in item order (rather than giving each engine a contiguous half) keeps
the engines working on the same prefix, so that a deadline wastes little.

An engine that falls behind holds that prefix back: on a machine with no
more cores than engines, the engine that shares a core with the client often
answers at a third of the other's pace, and the other races ahead on items
that cannot be handed out before the slow one's batch is in (a deadline then
cut 150 to 320 answered lines of 3,000 from the results). So each lane is
dealt by its *pace*, the lines it answered per second of the call during
which it owed answers (a lane dealt less is not taken for slower): a lane
at a third of the fastest one's pace holds a third of the lines in flight,
in batches a third as large, so that a batch waits about as long in any
engine; a batch goes to the emptiest lane for its pace. And once no new
item is left to deal, when every lane holding an unanswered batch has
answered nothing for the time the fastest lane takes for two batches, a
lane with room that does not hold it is dealt a copy of that batch's
unanswered lines (the batch is *hedged*; the first such batch in item
order, one per step; a batch is copied again only once its copy's lane
went quiet too or failed, so a batch is on each lane once at most):
whichever lane answers a line first gives its prediction, the others'
answers to it are dropped, and the call does not wait for them (the
channel discards them like any ended call's leftovers). The lane holding
the batch may be retiring, and it may be the fastest: an engine that stops
or is starved of CPU holds up no call, while one that keeps answering,
however slowly, costs no copy (copies cost an engine's time: copying
whatever was left at the end of a call cost 2% of the predictions under
steady load). While new items are left, only the first unanswered batch
(the one the results wait for) is copied, before the next new batch, once
the lanes holding it answered nothing for 2 ms at least: before, a call of
200,000 items with one of two engines stopped 20 ms in returned nothing by
its deadline of 0.3 s, the other engine answering new items all along.

A lane holds no more lines than its engine is expected to answer by the
deadline at its pace (until the call has measured it, at the pace it kept
in its last call, which the channel keeps): a line answered after the
deadline is lost to the call, and its engine spends the next call's first
moments on it, on cores it shares with the other engines and the calling
thread. Near the deadline of a call of 3,000 items, a pool of two on 2
vCPUs had its engines read 180 to 370 lines per 10 ms call beyond the 1,000
to 1,200 it returned; limited, calls returned 1.04x to 1.17x the
predictions (``python -m benchmarks.pool_pacing``, nine runs at 3,000 and
6,000 items; a pool of one, whose engine runs vw's own driver: 0.996x and
0.972x, where the noise between runs is about 4%). For a model slow per
line it decides whether calls return anything: at 150 to 400 µs a line,
the 200 lines an engine may hold took longer than a call, and every 10 ms
call of a pool of two returned nothing, each spent on the lines the one
before it left; limited from the start of a call (and with the engines
writing their answers every 2 ms of their CPU or so), they returned 40 to 70
predictions once the first calls' leftovers were answered.

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
from typing import (Any, Callable, Deque, Dict, Generic, Hashable, Iterable, Iterator, List,
                    Optional, Sequence, Tuple, TypeVar)

from ..errors import VowpalWabbitProtocolError, VowpalWabbitTimeoutError
from .channel import Call, Channel
from .exchanges import FormatterSpeed, Parser, _line_joiner, check_item_parts, format_next


#: The type of a lane's key, the driver's name for its engine (a pool's
#: :class:`~subwabbit.core.roster.Slot`): a call hands its lanes back with it.
Key = TypeVar("Key", bound=Hashable)


class _Batch:
    """Consecutive items formatted together and dealt to one lane (to more,
    when it is hedged)."""

    # No reference to its lanes: the lanes hold their shares of it, and a
    # cycle between them would leave every call's batches to the garbage
    # collector, whose pauses fall on later calls.
    __slots__ = ("start", "lines", "values")

    def __init__(self, start: int, lines: Sequence[str]) -> None:
        self.start = start          # index of its first item in the request
        self.lines = lines          # its formatted examples
        self.values: List[Any] = []  # predictions received so far, in order

    @property
    def complete(self) -> bool:
        return len(self.values) == len(self.lines)


class _Share:
    """The lines ``next`` to ``end`` of a batch that one lane owes answers for.

    Every share of a batch begins at or before the batch's first unanswered
    line and runs in order, so an answer to line ``next`` is either the
    batch's next prediction or one another lane gave already.
    """

    __slots__ = ("batch", "next", "end")

    def __init__(self, batch: _Batch, start: int, end: int) -> None:
        self.batch = batch
        self.next = start
        self.end = end


class Lane(Generic[Key]):
    """One engine's part in a split call.

    :param key: the driver's name for the engine (returned to it on release)
    :param channel: the engine's channel; a call is begun on it
    """

    __slots__ = ("key", "channel", "call", "shares", "retiring", "dealt_lines",
                 "answered", "answered_at", "busy_s", "busy_at_answer", "_busy_since",
                 "_progress", "_quiet_since")

    def __init__(self, key: Key, channel: Channel) -> None:
        self.key = key
        self.channel = channel
        self.call: Call = channel.begin()
        #: what this lane owes answers for, in dealing order
        self.shares: Deque[_Share] = collections.deque()
        #: no new batch is dealt; released once its batches are answered
        self.retiring = False
        #: example lines dealt to this lane in all
        self.dealt_lines = 0
        #: lines this lane answered in the call (its pace: see ``_rooms``)
        self.answered = 0
        #: when it last answered, or was dealt lines while it owed none (a clock value)
        self.answered_at: Optional[float] = None
        #: seconds of the call during which it owed answers
        self.busy_s = 0.0
        #: :attr:`busy_s` when it last answered (its pace up to its last answer)
        self.busy_at_answer = 0.0
        self._busy_since: Optional[float] = None
        self._progress = -1
        self._quiet_since = 0.0

    @property
    def drained(self) -> bool:
        """Whether every batch this lane was dealt is answered (by it, or by
        the lane a batch was hedged to: what it still owes then is dropped)."""
        return all(share.batch.complete for share in self.shares)


class SplitPredictExchange(Generic[Key]):
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
    :param write_cutoff_s: no line is written this long before the deadline
        (no new batch is dealt, and lines dealt but not yet written are dropped)
    :param idle_s: how long a lane may owe answers without any progress before
        it is reported stuck (:meth:`stuck_lanes`); ``None``: no limit
    :param pace: deal each lane by its pace (see the module's text);
        ``False``: every lane is dealt ``batch_size`` at a time up to
        ``max_in_flight_lines``
    :param hedge: once no new item is left, deal an unanswered batch again
        to a lane with room when the lanes holding it went quiet
    :param clock: the clock of ``now`` values; with a deadline, batches are
        cut to what the formatter formats in little time at its last speed
        (:func:`~subwabbit.core.exchanges.items_to_format`)
    :param format_s_per_item: the formatter's seconds per item in the
        client's last call (``None``: unknown)
    """

    #: With a deadline, a lane holds at most what it answers in this
    #: fraction of the time left at its pace (see the module's text); ``0``
    #: turns that limit off (``python -m benchmarks.pool_pacing`` compares
    #: settings).
    reach_factor = 1.0

    def __init__(self, *, formatter: Any, common_part: str, common_features: Any,
                 items: Iterable[Any], debug_info: Any, parse: Optional[Parser] = None,
                 batch_size: int, max_in_flight_lines: int, deadline: Optional[float],
                 write_cutoff_s: float = 0.0, idle_s: Optional[float] = None,
                 kind: Any = None, pace: bool = True, hedge: bool = True,
                 clock: Optional[Callable[[], float]] = None,
                 format_s_per_item: Optional[float] = None) -> None:
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
        self._pace = pace
        self._hedge = hedge and self._example_kind is None
        self._now = 0.0
        self.batch_size = batch_size
        self.max_in_flight_lines = max(max_in_flight_lines, batch_size)
        #: when the call ends whatever is in flight
        self.end_at = deadline
        self.idle_s = idle_s
        self._stop_dealing_at = None if deadline is None else deadline - write_cutoff_s
        self._items = iter(items)
        self._clock = clock
        self._speed = FormatterSpeed(format_s_per_item)
        self._format_item = formatter.format_item_features
        self._common_features = common_features
        self._debug_info = debug_info
        self._join = _line_joiner(formatter, common_part, debug_info,
                                  None if self._example_kind is not None else kind)
        self.lanes: List[Lane[Key]] = []
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
        #: the lane whose answers a step could not parse (its engine failed:
        #: which answer is whose is no longer known), if any
        self.unparsable_lane: Optional[Lane[Key]] = None
        #: lines dealt a second time, to another lane (see the module's text)
        self.hedged_lines = 0
        #: the formatted lines of the call's first batch (``None`` before it
        #: is formatted, and for a multi-line kind)
        self.first_lines: Optional[Sequence[str]] = None
        self.done = False
        self.timed_out = False

    # ------------------------------------------------------------ lanes

    @property
    def format_s_per_item(self) -> Optional[float]:
        """The formatter's seconds per item, for the client's next call
        (:class:`~subwabbit.core.exchanges.FormatterSpeed`)."""
        return self._speed.seconds_per_item

    def add_lane(self, key: Key, channel: Channel) -> Lane[Key]:
        """Give the call one more engine (what earlier calls left in flight
        on it is discarded as it arrives)."""
        lane = Lane(key, channel)
        self.lanes.append(lane)
        return lane

    def retire_lane(self, lane: Lane[Key]) -> None:
        """Deal nothing more to ``lane``; release it once :attr:`Lane.drained`."""
        lane.retiring = True

    def fail_lane(self, lane: Lane[Key], keep_answers: bool = True) -> None:
        """``lane``'s engine failed: drop the lane (ending its call) and deal
        its unanswered batches again to the other lanes.

        :param keep_answers: whether the answers that arrived since the last
            step are good (an engine that exited printed them before its
            end); ``False``: the engine printed what nobody was owed, and the
            answers of the read that showed it may be anyone's
        """
        self.failed_lanes += 1
        if keep_answers:
            self._collect_lane(lane)  # what arrived before the failure is good
        else:
            lane.call.take_answers()
        lane.channel.end(lane.call)
        self.lanes.remove(lane)
        # What another lane owes of a batch (it was hedged) is its rest:
        # every share runs to the batch's end, but for the write cut-off's.
        reach = _reach(self.lanes)
        for share in lane.shares:
            batch = share.batch
            ends = max(len(batch.values), reach.get(id(batch), 0))
            if ends >= len(batch.lines):
                continue
            if not self._cut_off and ends == len(batch.values):
                self._redeal.append(batch)
            else:
                self._limit = min(self._limit, batch.start + ends)
        lane.shares.clear()
        self._redeal.sort(key=_start)

    def release_lane(self, lane: Lane[Key]) -> None:
        """Take a drained lane out of the call (ending its call on the channel)."""
        if not lane.drained:
            raise ValueError("a lane is released only once its batches are answered")
        self._keep_pace(lane)
        lane.channel.end(lane.call)
        self.lanes.remove(lane)

    def _keep_pace(self, lane: Lane[Key]) -> None:
        """Leave ``lane``'s pace in this call on its channel, for the
        engine's next call to deal by until it has measured its own."""
        measured = self._measured_pace(lane, self._least_share())
        if measured is not None:
            lane.channel.pace = measured

    @staticmethod
    def _measured_pace(lane: Lane, floor: int) -> Optional[float]:
        """``lane``'s lines answered per second it owed answers in this call,
        once it has answered ``floor`` lines (``None`` before);
        :meth:`_rooms` computes it inline."""
        if lane.answered >= floor and lane.busy_s > 0:
            return lane.answered / lane.busy_s
        return None

    def releasable_lanes(self) -> List[Lane[Key]]:
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
        return len(self._dealt_lanes())

    # ------------------------------------------------------------- steps

    def step(self, now: float) -> List[Any]:
        """Take what arrived, deal what fits (at most one newly formatted
        batch), apply the deadline.

        :returns: predictions for the next items of the request, in order
        """
        if self.done:
            return []
        self._now = now
        for lane in self.lanes:
            if lane._busy_since is not None:
                lane.busy_s += now - lane._busy_since
        self._collect()
        if not self._cut_off:
            if self._stop_dealing_at is not None and now >= self._stop_dealing_at:
                self._stop_dealing()
            elif self.dealing or self._hedge:
                self._deal()
        for lane in self.lanes:
            lane._busy_since = now if lane.channel.in_flight_lines else None
        results = self._hand_out()
        if not self.dealing and all(lane.drained for lane in self.lanes):
            self.done = True
        elif self._cut_off and self._example_kind is None and self._all_handed_out():
            # What the lanes still owe lies past the end of the results (a
            # line before it never reached an engine): waiting for it would
            # only hold the engines until the deadline.
            self.done = True
        elif self.end_at is not None and now >= self.end_at:
            self.done = self.timed_out = True
        return results

    def _all_handed_out(self) -> bool:
        """After the write cut-off: whether every result the call can still
        return was handed out (the results end at :attr:`_limit`, or with
        the last item formatted)."""
        return self.returned >= min(self._limit, self.formatted)

    def _deal(self) -> None:
        lanes = self._dealt_lanes()
        if not lanes:
            return
        while self._redeal:
            lane = self._redeal_lane(lanes)
            if lane is None:
                return
            batch = self._redeal.pop(0)
            self._give(lane, batch, len(batch.values))
        if self._example_kind is not None:
            if self._items_left:
                self._format_example(self.batch_size)
            return
        fits = self._fitting(lanes)
        if not fits:
            return
        if self._items_left:
            if self._hedge and self._quiet_lane() and self._hedge_first_due(
                    [lane for lane, _ in fits], first_only=True):
                # A lane that went quiet holds the batch the results wait
                # for: its copy comes before new items (see the module's text).
                return
            lane, size = fits[0]
            new_batch = self._format(size)
            if self._cut_off:  # (no item could be formatted before it)
                return
            if new_batch is not None:
                self._give(lane, new_batch, 0)
                # One batch formatted per step: the driver checks the clock
                # (the write cut-off, the deadline) and an event loop gets its
                # turn between steps, however slow the formatter.
                return
        if self._hedge and len(self.lanes) > 1:
            self._hedge_first_due([lane for lane, _ in fits])

    def _rooms(self, lanes: List[Lane[Key]]) -> List[Tuple[Lane[Key], int, int]]:
        """Every lane with its room and the size of a batch for it, by pace,
        the emptiest first (the most room for its pace's share of lines).

        A lane that answers at a fraction of the fastest lane's pace (lines
        per second while it owed answers) may hold that fraction of
        ``max_in_flight_lines`` (of ``batch_size`` per batch), a quarter at
        least: the time its batches wait in it stays about the same on
        every lane, so the first unanswered batch, which decides what can
        be handed out, is never far behind the others. A lane that has not
        answered a quarter batch yet counts at its engine's pace in its
        last call (:attr:`Channel.pace <subwabbit.core.channel.Channel.pace>`),
        or as the fastest if none was measured.

        With a deadline, a lane whose pace is known (or was known in its
        engine's last call) holds no more than it can answer by the deadline
        at that pace (times :attr:`reach_factor`; a line at least, not a
        quarter batch, which a slow engine may answer after the deadline),
        and a batch for it is cut to that room (see the module's text).
        """
        # One pass for the paces, one for the rooms, no helper call and no
        # sort of a single lane: this runs once or twice for every step of a
        # call, and list comprehensions, a sort and calls of _pace_of() here
        # cost the calling thread 6% more instructions per prediction (3%
        # for the calls alone). The pace is _pace_of()'s, the floor
        # _least_share()'s: change them together.
        limit, size = self.max_in_flight_lines, self.batch_size
        floor = size // 4 or 1  # _least_share()
        fastest = 0.0
        paces: List[Optional[float]] = []
        for lane in lanes:  # _pace_of()
            busy_s = lane.busy_s
            measured: Optional[float]
            if self._pace and lane.answered >= floor and busy_s > 0:
                measured = lane.answered / busy_s
            elif self._pace:
                measured = lane.channel.pace  # the engine's last call's (None: unknown)
            else:
                measured = None
            if measured is not None and measured > fastest:
                fastest = measured
            paces.append(measured)
        rooms = []
        left_s = None  # the time left to the deadline, when it limits what a lane holds
        if self.end_at is not None and self.reach_factor:
            left_s = (self.end_at - self._now) * self.reach_factor
        for lane, pace in zip(lanes, paces):
            if pace is not None and pace < fastest:
                share = pace / fastest
                lane_limit = int(limit * share)
                lane_size = int(size * share)
                if lane_limit < floor:
                    lane_limit = floor
                if lane_size < floor:
                    lane_size = floor
            else:
                lane_limit, lane_size = limit, size
            in_flight = lane.channel.in_flight_lines
            if pace is not None and left_s is not None:
                reach = pace * left_s  # (compared before int(): a deadline may be infinite)
                if reach < lane_limit:
                    lane_limit = int(reach) if reach > 1 else 1
                    if lane_limit - in_flight < lane_size:
                        lane_size = lane_limit - in_flight
                        if lane_size < 1:
                            lane_size = 1
            room = lane_limit - in_flight
            rooms.append((-room / lane_limit, lane, room, lane_size))
        if len(rooms) > 1:
            rooms.sort(key=_emptiest)  # stable: ties keep the lanes' order
        return [(lane, room, lane_size) for _, lane, room, lane_size in rooms]

    def _dealt_lanes(self) -> List[Lane[Key]]:
        """The lanes that may be dealt lines (not retiring)."""
        return [lane for lane in self.lanes if not lane.retiring]

    def _fitting(self, lanes: List[Lane[Key]]) -> List[Tuple[Lane[Key], int]]:
        """The lanes of ``lanes`` with room for a whole batch of their pace's
        size, the emptiest first, each with that size (see :meth:`_rooms`)."""
        return [(lane, size) for lane, room, size in self._rooms(lanes) if room >= size]

    def _redeal_lane(self, lanes: List[Lane[Key]]) -> Optional[Lane[Key]]:
        """The lane of ``lanes`` that the first batch to deal again goes to:
        the emptiest with room for its unanswered lines, or for a batch of
        the lane's size (``None``: none has room)."""
        batch = self._redeal[0]
        want = len(batch.lines) - len(batch.values)
        return next((lane for lane, room, size in self._rooms(lanes)
                     if room >= min(want, size)), None)

    def _least_share(self) -> int:
        """The smallest batch a lane is dealt by its pace relative to the
        other lanes' (a quarter batch; by the deadline's reach, a line), and
        the lines it answers before its pace counts (:meth:`_rooms` computes
        it inline)."""
        return max(1, self.batch_size // 4)

    def can_deal_now(self) -> bool:
        """Whether :meth:`step` would deal a batch to a lane if it ran now (at
        the time of the last step; only a quiet pipe keeps it from being
        taken: a lane added to the call, another dealt just before): a driver
        steps again instead of waiting."""
        if self._cut_off or (self._stop_dealing_at is not None
                             and self._now >= self._stop_dealing_at):
            return False
        lanes = self._dealt_lanes()
        if self._redeal:
            return self._redeal_lane(lanes) is not None
        if self._example_kind is not None or not self._items_left:
            return False  # (an example's items are formatted at once: see wake_at)
        return bool(self._fitting(lanes))

    def _pace_of(self, lane: Lane[Key], floor: int) -> Optional[float]:
        """``lane``'s lines answered per second it owed answers in this call;
        before it answered ``floor`` lines, its engine's in its last call
        (``None`` if unknown, and without pacing); :meth:`_rooms` computes
        it inline."""
        if not self._pace:
            return None
        measured = self._measured_pace(lane, floor)
        return lane.channel.pace if measured is None else measured

    def _hedge_wait(self) -> float:
        """How long a lane may answer nothing before a batch it holds is
        dealt again: the time the fastest lane takes for two batches
        (:data:`HEDGE_MIN_S` at least; :data:`HEDGE_UNKNOWN_S` before any
        lane's pace is known).

        A lane's pace here is the one it kept up to its last answer: the
        pace dealing goes by (:meth:`_rooms`) falls while a lane is silent,
        and a silent lane whose pace was the only one known made its own
        wait grow faster than its silence, so that its batch was never
        copied (found by a review)."""
        floor = self._least_share()
        paces = []
        if self._pace:
            for lane in self.lanes:
                if lane.answered >= floor and lane.busy_at_answer > 0:
                    paces.append(lane.answered / lane.busy_at_answer)
                elif lane.channel.pace is not None:
                    paces.append(lane.channel.pace)
        if not paces:
            return HEDGE_UNKNOWN_S
        return max(HEDGE_MIN_S, 2 * self.batch_size / max(paces))

    def _hedges(self, lanes: List[Lane[Key]], first_only: bool = False
                ) -> Iterator[Tuple[_Batch, Lane[Key], float]]:
        """Every unanswered batch, in item order, that one of ``lanes``
        (lanes with room) does not hold: with the first such lane, and when
        the batch may be dealt to it again (once every lane holding it
        answered nothing for :meth:`_hedge_wait`). The lanes holding it may
        be retiring; a batch no lane holds any more is being dealt again
        (``_redeal``), not copied. With ``first_only``, the first unanswered
        batch alone (the one the results wait for), if a lane holds it."""
        holders: Dict[int, List[Lane[Key]]] = {}
        for lane in self.lanes:
            for share in lane.shares:
                holders.setdefault(id(share.batch), []).append(lane)
        wait = self._hedge_wait()
        if first_only:
            wait = max(wait, HEDGE_WHILE_DEALING_MIN_S)
        for batch in self._order:
            if batch.complete:
                continue
            held_by = holders.get(id(batch))
            if not held_by:
                continue
            target = next((lane for lane in lanes if lane not in held_by), None)
            if target is not None:
                heard = [lane.answered_at for lane in held_by if lane.answered_at is not None]
                yield batch, target, (max(heard) + wait if heard else self._now)
            if first_only:
                return

    def _quiet_lane(self) -> bool:
        """Whether the call has another lane and one of its lanes answered
        nothing for :data:`HEDGE_WHILE_DEALING_MIN_S` (a check of no cost
        before :meth:`_hedges`, at every step that deals new items)."""
        if len(self.lanes) < 2:
            return False
        quiet_since = self._now - HEDGE_WHILE_DEALING_MIN_S
        return any(lane.answered_at is not None and lane.answered_at <= quiet_since
                   for lane in self.lanes)

    def _hedge_first_due(self, lanes: List[Lane[Key]], first_only: bool = False) -> bool:
        """Deal the first batch that is due again (see :meth:`_hedges`) to a
        lane of ``lanes`` that does not hold it.

        :param first_only: consider the first unanswered batch only (new
            items are left to deal: a copy of it is all that holds the
            results back, the other batches of a quiet lane are copied as
            they come first)
        :returns: whether a batch was dealt again
        """
        for batch, lane, due in self._hedges(lanes, first_only):
            if due <= self._now:
                self.hedged_lines += len(batch.lines) - len(batch.values)
                self._give(lane, batch, len(batch.values))
                return True
        return False

    def _next_hedge(self) -> Optional[float]:
        """When a batch becomes due again and a lane has room for it, if
        that can happen before the write cut-off (``None``: no hedge can
        come without a pipe event).

        While new items are left none can: :meth:`wake_at` asks only when
        no lane has room for a batch, and a lane with room is dealt at once
        (a copy of the first batch comes with that deal, see :meth:`_deal`);
        looking for one anyway cost every wait of a call about 15 us."""
        if not (self._hedge and not self._items_left and not self._cut_off
                and len(self.lanes) > 1):
            return None
        fits = [lane for lane, _ in self._fitting(self._dealt_lanes())]
        dues = [due for _, _, due in self._hedges(fits)]
        if not dues:
            return None
        # A wake in the past, or closer than an event loop can sleep, would
        # spin the driver; the step that follows deals what is due by then.
        due = max(min(dues), self._now + HEDGE_WAKE_AHEAD_S)
        if self._stop_dealing_at is not None and due >= self._stop_dealing_at:
            return None
        return due

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
            lane = min(self._dealt_lanes(), key=_in_flight)
            self._give(lane, batch, 0)

    def _next_parts(self, want: int) -> List[Any]:
        """The next ``want`` items formatted (fewer when they run out: then
        no item is left)."""
        parts, ran_out = format_next(self._format_item, self._common_features, self._items,
                                     want, self._debug_info, self._clock, self._stop_dealing_at)
        if ran_out:
            self._items_left = False
        return parts

    def _format(self, want: int) -> Optional[_Batch]:
        clock = self._clock
        if clock is not None:
            began = clock()
            want = self._speed.items(want, began, self._stop_dealing_at)
            if not want:  # not one more item is formatted before the write cut-off
                self._stop_dealing()
                return None
        parts = self._next_parts(want)
        if not parts:
            return None
        if clock is not None:
            self._speed.note(clock() - began, len(parts))
        batch = _Batch(self.formatted, self._join(parts, self.formatted))
        if not self.formatted:
            self.first_lines = batch.lines
        self.formatted += len(parts)
        self._order.append(batch)
        return batch

    def _give(self, lane: Lane[Key], batch: _Batch, first: int) -> None:
        """Queue the lines of ``batch`` from its line ``first`` on ``lane``."""
        lines = batch.lines[first:] if first else batch.lines
        if self._example_kind is not None:
            lane.call.queue_example(self._example_kind.example_lines(self._common_part, lines))
        else:
            lane.call.queue_lines(lines, batch.start + first)
        if lane.drained:  # it owed nothing: it is not quiet, it had nothing to say
            lane.answered_at = self._now
        lane.dealt_lines += len(lines)
        lane.shares.append(_Share(batch, first, len(batch.lines)))

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
            kept: Deque[_Share] = collections.deque()
            for share in lane.shares:
                share.end = share.next + min(owed, share.end - share.next)
                owed -= share.end - share.next
                if share.next < share.end:
                    kept.append(share)
            lane.shares = kept
        # A batch ends where the farthest of its shares that reached an engine ends.
        reach = _reach(self.lanes)
        for batch in self._order:
            ends = max(len(batch.values), reach.get(id(batch), 0))
            if ends < len(batch.lines):
                self._limit = min(self._limit, batch.start + ends)
                batch.lines = batch.lines[:ends]

    def _collect(self) -> None:
        for lane in self.lanes:
            try:
                self._collect_lane(lane)
            except VowpalWabbitProtocolError:
                self.unparsable_lane = lane
                raise

    def _collect_lane(self, lane: Lane[Key]) -> None:
        answers = lane.call.take_answers()
        if answers:
            shares = lane.shares
            if self._example_kind is not None:
                values = self._example_kind.parse_example(answers, len(shares[0].batch.lines))
            else:
                values = self.parse(answers)
            if values:
                lane.answered_at = self._now
                lane.busy_at_answer = lane.busy_s
            offset = 0
            while offset < len(values):
                share = shares[0]
                batch = share.batch
                take = min(share.end - share.next, len(values) - offset)
                # The lines before the batch's first unanswered one were
                # answered by the other lane of a hedged batch: dropped.
                new = share.next + take - len(batch.values)
                if new > 0:
                    batch.values.extend(values[offset + take - new:offset + take])
                share.next += take
                lane.answered += take
                offset += take
                if share.next == share.end:
                    shares.popleft()

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

    def stuck_lanes(self, now: float, looked_at: Optional[float] = None) -> List[Lane[Key]]:
        """Lanes that owe answers and showed no progress for ``idle_s``
        (see :meth:`note_progress`).

        :param looked_at: when the driver last read the engines' pipes
            (``None``: ``now``): a lane is stuck when it was quiet for
            ``idle_s`` as of then, not as of a step that came late (an event
            loop busy with other tasks), while its answers waited unread
        """
        if self.idle_s is None:
            return []
        idle_s = self.idle_s
        judged_at = now if looked_at is None else looked_at
        return [lane for lane in self.lanes
                if _quiet_too_long(lane, now, idle_s, judged_at)]

    def note_progress(self, now: float) -> None:
        """Start the idle clock of every lane that owes answers (and restart
        it on those whose pipes moved), without reporting any stuck: a driver
        that waits right after writing calls this, so that its wait
        (:meth:`wake_at`) ends within ``idle_s`` for a lane just dealt its
        first lines too. No-op without ``idle_s``."""
        idle_s = self.idle_s
        if idle_s is not None:
            for lane in self.lanes:
                _quiet_too_long(lane, now, idle_s)

    def idle_error(self) -> VowpalWabbitTimeoutError:
        """The error of a call whose every engine is stuck."""
        return VowpalWabbitTimeoutError(
            f"the vw engine did not answer for {self.idle_s:g} s while waiting for its "
            "predictions (io_timeout_s); it may be stopped or stuck")

    def wake_at(self) -> Optional[float]:
        """When :meth:`step` must run again even if the pipes stay quiet."""
        if self._example_kind is not None and self._items_left and not self._cut_off:
            return self._now  # more items of the example to format: step again at once
        if self.can_deal_now():
            return self._now  # a lane (one just added, say) has room: deal at once
        wake = self.end_at
        if self._stop_dealing_at is not None and self.dealing:
            wake = self._stop_dealing_at
        if self.idle_s is not None:
            quiet = [lane._quiet_since + self.idle_s for lane in self.lanes
                     if lane._progress >= 0]
            if quiet:
                wake = min(quiet) if wake is None else min(wake, min(quiet))
        hedge = self._next_hedge()
        if hedge is not None:
            wake = hedge if wake is None else min(wake, hedge)
        return wake

    def end(self) -> List[Lane[Key]]:
        """End the call on every lane (idempotent); what it left in flight is
        discarded by the channels as it arrives.

        :returns: the lanes it held, to be given back to the pool
        """
        self.done = True
        lanes, self.lanes = self.lanes, []
        for lane in lanes:
            self._keep_pace(lane)
            lane.channel.end(lane.call)
        return lanes


#: the least time a lane may answer nothing before a batch it holds is dealt again
HEDGE_MIN_S = 0.0002
#: that time before any lane's pace is known
HEDGE_UNKNOWN_S = 0.001
#: that time while new items are left to deal, for the first unanswered
#: batch (the only one copied then): an engine that the scheduler leaves
#: without a core for a moment is not copied, one stopped or starved is
#: (under load from other processes on 2 vCPUs, 0.5 ms copied about 80
#: lines per 6,000-item call of 10 ms, 2 ms about 5)
HEDGE_WHILE_DEALING_MIN_S = 0.002
#: the least time ahead of a step that a copy's wake is set (:meth:`SplitPredictExchange.wake_at`):
#: an event loop sleeps in whole milliseconds, and asyncio's drivers take a
#: wake under 1 ms away for "look again now", so a closer one spins them
HEDGE_WAKE_AHEAD_S = 0.0015


def _quiet_too_long(lane: Lane, now: float, idle_s: float,
                    judged_at: Optional[float] = None) -> bool:
    """Whether ``lane`` owes answers and its pipes have not moved for
    ``idle_s`` by ``judged_at`` (``None``: ``now``; its idle clock starts,
    or starts again, at ``now`` when they move)."""
    channel = lane.channel
    if not channel.in_flight_lines and not channel.unwritten_bytes:
        lane._progress = -1  # pylint: disable=protected-access
        return False
    progress = channel.bytes_written + channel.bytes_received
    if progress != lane._progress:  # pylint: disable=protected-access
        lane._progress = progress  # pylint: disable=protected-access
        lane._quiet_since = now  # pylint: disable=protected-access
        return False
    if judged_at is None:
        judged_at = now
    return judged_at - lane._quiet_since >= idle_s  # pylint: disable=protected-access


def _in_flight(lane: Lane) -> int:
    return lane.channel.in_flight_lines


def _start(batch: _Batch) -> int:
    return batch.start


def _emptiest(entry: Tuple[float, Lane, int, int]) -> float:
    return entry[0]


def _reach(lanes: List[Lane]) -> Dict[int, int]:
    """For every batch the lanes owe answers for (by ``id``): the end of the
    farthest share of it."""
    reach: Dict[int, int] = {}
    for lane in lanes:
        for share in lane.shares:
            key = id(share.batch)
            reach[key] = max(reach.get(key, 0), share.end)
    return reach

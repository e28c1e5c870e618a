"""What one call does, step by step, without I/O.

An *exchange* drives one :class:`~subwabbit.core.channel.Call` of a channel to
its end. A driver runs every exchange the same way::

    while True:
        results = exchange.step(clock())   # formats, queues, checks time
        ...hand the results to the caller...
        if exchange.done:
            break
        ...write what the channel holds, read what the engine printed...
        if nothing moved:
            ...wait for the pipes until exchange.wake_at()...

:meth:`Exchange.step` is the only place where the time limits are applied: a
call's deadline (hard: return by it; soft: stop formatting new items at it)
and ``io_timeout_s`` (how long the engine may stay silent while a call waits
for it: without a deadline that ends the call, or before it for the calls
whose :attr:`Exchange.idle_before_deadline` is true). The driver never decides when a call is over.
"""

import itertools
from typing import (Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional,
                    Sequence, Union)

from ..base import example_joiner
from ..errors import VowpalWabbitTimeoutError
from ..lines import (PrefixedLines, breaks_no_line, check_line_labels, check_line_part,
                     common_part_holds_the_header, label_problem, label_words,
                     shared_header)
from .channel import Call, Channel

#: Turns raw answer lines into the values ``predict`` gives.
Parser = Callable[[List[bytes]], List[Any]]


class Pacing(NamedTuple):
    """How a ``predict`` call feeds the engine and treats its deadline.

    :param batch_size: the most items formatted at a time
    :param max_in_flight_lines: the most lines queued or sent whose answers
        have not arrived (earlier calls' leftovers included)
    :param min_batch: format only when at least this many lines fit (the
        blocking class formats whole batches, the nonblocking one fills any room)
    :param write_cutoff_s: with a hard deadline, stop sending new lines this
        long before it, so that what is in flight can be answered in time
    :param hard_deadline: return by the deadline (nonblocking, asyncio); else
        the deadline only stops formatting, and what was queued is answered
    :param max_lateness_s: without a hard deadline, return at the latest this
        long after the deadline with what has arrived (``None``: wait for
        every answer to what was sent)
    :param lines_at_deadline: when set, a call with a deadline keeps in
        flight at most this many lines more than the engine is expected to
        answer before the deadline, at the rate it has answered the call so
        far (until its first answers: ``batch_size`` more). Far from the
        deadline ``max_in_flight_lines`` applies, so the engine has work
        queued even when the client is descheduled; near it, what the call
        leaves to be answered after its deadline shrinks to this many lines
        (more if the engine slows down after the rate was measured: at most
        ``max_in_flight_lines``). Single-line kinds only: a multi-line call
        queues its one example when ``max_in_flight_lines`` leaves room.
        ``None``: ``max_in_flight_lines`` at any time
    :param reach_at_deadline: with a deadline, keep in flight no more than
        the engine is expected to answer by then (a line at least, and
        ``min_batch``), at its pace in this call once it has answered a
        quarter batch (of its lines, or of earlier calls' leftovers it
        waits for), and before that at its pace in its last such call
        (kept on the channel,
        :attr:`Channel.pace <subwabbit.core.channel.Channel.pace>`): a line
        answered after the deadline is lost to the call and delays the next
        one. Single-line kinds only
    """

    batch_size: int
    max_in_flight_lines: int
    min_batch: int = 1
    write_cutoff_s: float = 0.0
    hard_deadline: bool = True
    max_lateness_s: Optional[float] = None
    lines_at_deadline: Optional[int] = None
    reach_at_deadline: bool = False


class Exchange:
    """The steps of one call on a channel.

    :param channel: the engine's channel
    :param call: the call, begun on ``channel``
    :param deadline: the call's deadline (a clock value), or ``None``
    :param idle_s: how long the engine may show no progress while the call
        waits (see :attr:`idle_before_deadline`); ``None``: no limit
    :param hard_deadline: whether the call ends at ``deadline`` whatever is in flight
    """

    #: what the call waits for, for the idle error message
    doing = "waiting for its answers"
    #: whether ``idle_s`` applies before a deadline that ends the call too:
    #: an engine that owes answers and shows no progress for ``idle_s`` is
    #: stuck however long the call may still wait (a save, whose engine is
    #: silent while it writes the file, is bounded by its timeout only)
    idle_before_deadline = False

    def __init__(self, channel: Channel, call: Call, deadline: Optional[float],
                 idle_s: Optional[float], hard_deadline: bool = True,
                 max_lateness_s: Optional[float] = None) -> None:
        self.channel = channel
        self.call = call
        self.deadline = deadline
        self.idle_s = idle_s
        self.hard_deadline = hard_deadline
        #: when the call ends whatever is in flight (``None``: only when done)
        self.end_at: Optional[float] = None
        if deadline is not None:
            if hard_deadline:
                self.end_at = deadline
            elif max_lateness_s is not None:
                self.end_at = deadline + max_lateness_s
        #: whether the call is over (its results are all out)
        self.done = False
        #: whether it ended at its deadline rather than with everything answered
        self.timed_out = False
        self._progress = -1
        self._quiet_since: Optional[float] = None
        #: the time of the last idle check: the driver has read the engine's
        #: pipe since (it pumps after every step that does not end the call)
        self._looked_at: Optional[float] = None

    # -- to be provided by subclasses

    def _advance(self, now: float) -> List[Any]:
        """Queue what should be queued now; return results that are ready."""
        raise NotImplementedError()

    def _finished(self) -> bool:
        """Whether the call has everything it needs."""
        return self.call.owed_lines == 0 and self.channel.unwritten_bytes == 0

    # -- the step

    def step(self, now: float) -> List[Any]:
        """Advance the call at time ``now``.

        :returns: results ready for the caller (predictions, for ``predict``)
        :raises VowpalWabbitTimeoutError: when the engine showed no progress for
            ``idle_s`` while the call waited (see :attr:`idle_before_deadline`)
        :raises VowpalWabbitError: when the call was superseded by another
        """
        if self.done:
            return []
        self.call.check_active()
        results = self._advance(now)
        if self._finished():
            self.done = True
            return results
        if self.end_at is not None and now >= self.end_at:
            self.done = self.timed_out = True
            return results
        self._check_idle(now)
        return results

    def _idle_applies(self) -> bool:
        return self.idle_s is not None and (self.end_at is None or self.idle_before_deadline)

    def _check_idle(self, now: float) -> None:
        """Raise when the engine showed no progress for ``idle_s`` as of the
        last step: the driver has read its pipe since then, and found
        nothing. (Judged at ``now``, a step that came late, after an event
        loop blocked by other work or a descheduled thread, took answers
        waiting unread in the pipe for the engine's silence.)"""
        if not self._idle_applies():
            return
        looked_at, self._looked_at = self._looked_at, now
        channel = self.channel
        progress = channel.bytes_written + channel.bytes_received
        if progress != self._progress:  # always so at the first check (-1)
            self._progress = progress
            self._quiet_since = now
            return
        assert self.idle_s is not None and self._quiet_since is not None
        if looked_at is not None and looked_at - self._quiet_since >= self.idle_s:
            doing = ("writing to it" if channel.unwritten_bytes and not channel.expects_output
                     else self.doing)
            raise VowpalWabbitTimeoutError(
                f"the vw engine did not answer for {self.idle_s:g} s while {doing} "
                "(io_timeout_s); it may be stopped or stuck")

    def caller_returned(self) -> None:
        """The caller asks for more after holding the results of a step (a
        ``predict`` iterator resumed): the time it kept them is not the
        engine's silence, so the ``idle_s`` clock starts again at the next step."""
        self._progress = -1

    def wake_at(self) -> Optional[float]:
        """When :meth:`step` must run again even if the pipes stay quiet
        (``None``: only when they move)."""
        wake = self.end_at
        if self._idle_applies() and self._quiet_since is not None:
            assert self.idle_s is not None
            idle_end = self._quiet_since + self.idle_s
            if self._looked_at is not None and self._looked_at >= idle_end:
                idle_end = self._looked_at  # (read the pipe, then step at once)
            wake = idle_end if wake is None else min(wake, idle_end)
        return wake

    def end(self) -> None:
        """End the call on its channel (idempotent): what it left in flight
        is discarded by the channel as it arrives."""
        self.done = True
        self.channel.end(self.call)


class PredictExchange(Exchange):
    """``predict``: format items in batches while there is room in flight,
    and hand out the parsed predictions in item order.

    :param formatter: the model's formatter
    :param common_part: the formatted common features (checked by the caller)
    :param common_features: passed on to ``format_item_features``
    :param items: the items
    :param debug_info: passed to every formatter call
    :param parse: turns answer lines into predictions
    :param pacing: see :class:`Pacing`
    :param detailed: when given, receives ``generating_lines_time`` entries
    :param clock: the clock of ``now`` values, for ``generating_lines_time``
    :param timing_per_line: one ``generating_lines_time`` entry per line (the
        batch's time shared out, as subwabbit 2.x's blocking class gave),
        instead of one per batch
    :param kind: the client's single-line
        :class:`~subwabbit.core.kinds.PredictionKind`, whose rule the label
        words of every line must pass before it is queued (``None``: none)
    :param format_s_per_item: the formatter's seconds per item in the
        client's last call (``None``: unknown); with a deadline and a
        ``clock``, batches are cut to what it formats in little time
        (:func:`items_to_format`)
    """

    doing = "waiting for its predictions"
    idle_before_deadline = True

    def __init__(self, channel: Channel, call: Call, *, formatter: Any, common_part: str,
                 common_features: Any, items: Iterable[Any], debug_info: Any, parse: Parser,
                 pacing: Pacing, deadline: Optional[float], idle_s: Optional[float],
                 detailed: Optional[Dict[str, List[Any]]] = None,
                 clock: Optional[Callable[[], float]] = None,
                 timing_per_line: bool = False, kind: Any = None,
                 format_s_per_item: Optional[float] = None) -> None:
        super().__init__(channel, call, deadline, idle_s, pacing.hard_deadline,
                         pacing.max_lateness_s)
        self._speed = FormatterSpeed(format_s_per_item)
        self._timing_per_line = timing_per_line
        self.pacing = pacing
        self.parse = parse
        self.producing = True
        self.returned = 0
        #: when the earlier calls' leftovers were all answered (a ``now`` value)
        self.cleared_at: Optional[float] = None if channel.stale_lines else -1.0
        self._items = iter(items)
        self._common_features = common_features
        self._debug_info = debug_info
        self._format_item = formatter.format_item_features
        self._join = _line_joiner(formatter, common_part, debug_info, kind)
        self._stop_producing_at: Optional[float] = None
        if deadline is not None:
            self._stop_producing_at = deadline - (pacing.write_cutoff_s if pacing.hard_deadline
                                                  else 0.0)
        self._detailed = detailed
        self._clock = clock
        #: the ``now`` of the first step (for the engine's rate in this call)
        self._began: Optional[float] = None
        #: seconds of the call during which it had lines in flight (its pace:
        #: see :meth:`pace`), and since when it has had them
        self.busy_s = 0.0
        self._busy_since: Optional[float] = None
        #: the earlier calls' leftovers in flight at the first step: the
        #: engine's answers to them count in its pace (see :meth:`_answered`)
        self._stale_at_began = 0

    def _advance(self, now: float) -> List[Any]:
        channel, call = self.channel, self.call
        if self._began is None:
            self._began = now
            self._stale_at_began = channel.stale_lines
        if self._busy_since is not None:
            self.busy_s += now - self._busy_since
        if self.cleared_at is None and not channel.stale_lines:
            self.cleared_at = now
        if self.producing:
            stop_at = self._stop_producing_at
            if stop_at is not None and now >= stop_at:
                self._stop_producing()
            else:
                room = self.in_flight_limit(now) - channel.in_flight_lines
                if room >= self.pacing.min_batch:
                    self._produce(min(room, self.pacing.batch_size))
        self._busy_since = now if channel.in_flight_lines else None
        answers = call.take_answers()
        if not answers:
            return []
        predictions = self.parse(answers)
        self.returned += len(predictions)
        return predictions

    def in_flight_limit(self, now: float) -> int:
        """The most lines that may be in flight at ``now`` (see
        :attr:`Pacing.lines_at_deadline`); never less than ``min_batch``, so
        that a call with nothing in flight can always send."""
        pacing = self.pacing
        most = max(pacing.min_batch, pacing.max_in_flight_lines)
        if self.deadline is None:
            return most
        if pacing.reach_at_deadline:
            pace = self.pace()
            if pace is not None:
                reach = pace * max(0.0, self.deadline - now)
                if reach < most:
                    return max(pacing.min_batch, 1, int(reach))
            return most
        if pacing.lines_at_deadline is None:
            return most
        elapsed = now - self._began if self._began is not None else 0.0
        if self.returned and elapsed > 0:
            # what the engine should answer before the deadline, at this call's
            # rate (capped before int(): a deadline may be infinite)
            ahead = int(min(float(pacing.max_in_flight_lines),
                            self.returned / elapsed * max(0.0, self.deadline - now)))
        else:
            ahead = pacing.batch_size
        return max(pacing.min_batch,
                   min(pacing.max_in_flight_lines, pacing.lines_at_deadline + ahead))

    def _least_lines(self) -> int:
        """The answers after which this call's pace counts (a quarter batch)."""
        return max(self.pacing.min_batch, self.pacing.batch_size // 4, 1)

    def _answered(self) -> int:
        """The lines the engine answered since this call's first step: its
        own, and the earlier calls' leftovers it answered meanwhile. (Counting
        only its own, a call that spent its time on leftovers, because the
        engine got slower than the pace it was dealt by, measured nothing and
        kept that pace for the next call, which filled up again with lines
        answered after its deadline.)"""
        return self.returned + self._stale_at_began - self.channel.stale_lines

    def _measured_pace(self) -> Optional[float]:
        """The engine's answers per second while this call had lines in
        flight, once it has answered :meth:`_least_lines` (``None`` before)."""
        answered = self._answered()
        if answered >= self._least_lines() and self.busy_s > 0:
            return answered / self.busy_s
        return None

    def pace(self) -> Optional[float]:
        """This call's pace (:meth:`_measured_pace`); before it is known,
        the engine's pace in its last call (``None``: unknown)."""
        measured = self._measured_pace()
        return self.channel.pace if measured is None else measured

    def end(self) -> None:
        measured = self._measured_pace()
        if measured is not None:  # kept for the engine's next call
            self.channel.pace = measured
        super().end()

    @property
    def format_s_per_item(self) -> Optional[float]:
        """The formatter's seconds per item, for the client's next call
        (:class:`FormatterSpeed`)."""
        return self._speed.seconds_per_item

    def _stop_producing(self) -> None:
        """The write cut-off (hard deadline) or the deadline: format and
        send nothing more (with a hard deadline, what is not written yet
        is dropped)."""
        self.producing = False
        if self.pacing.hard_deadline:
            self.channel.forget_unwritten(self.call)

    def _produce(self, want: int) -> None:
        parts = self._format(want)
        if parts:
            self.call.queue_lines(self._join(parts, self.call.queued_lines))

    def _format(self, want: int) -> List[Any]:
        """Format up to ``want`` more items (fewer when they run out: then
        :attr:`producing` turns false; fewer, too, when the formatter is
        slow and a deadline near: :func:`items_to_format`), timing it for
        ``detailed_metrics`` and for the next batch's size."""
        clock = self._clock
        began = clock() if clock is not None else 0.0
        if clock is not None:
            want = self._speed.items(want, began, self._stop_producing_at)
            if not want:  # not one more item is formatted before the cut-off
                self._stop_producing()
                return []
        parts, ran_out = format_next(self._format_item, self._common_features, self._items,
                                     want, self._debug_info, clock, self._stop_producing_at)
        if ran_out:
            self.producing = False
        if clock is not None and parts:
            self._speed.note(clock() - began, len(parts))
        if self._detailed is not None and self._clock:
            end = self._clock()
            entries = self._detailed["generating_lines_time"]
            if self._timing_per_line:
                # Each line gets its share, stamped where its share ends, so
                # that every entry has its own timestamp (as in 2.x); a step
                # that found no more items formatted no line and adds none.
                share = (end - began) / len(parts) if parts else 0.0
                entries.extend((began + share * (index + 1), share)
                               for index in range(len(parts)))
            else:
                entries.append((end, end - began))
        return parts

    def _finished(self) -> bool:
        return not self.producing and self.call.owed_lines == 0


class MultiLinePredictExchange(PredictExchange):
    """``predict`` on a multi-line kind (``--cb_adf``, ``--cb_explore_adf``):
    the call's items make one example, so the call gives a prediction for
    every item or none.

    Items are formatted ``batch_size`` at a time (a step each, so that an
    event loop gets turns); the example is queued once all are formatted,
    when the lines in flight leave room for it (or none are), and only
    before the write cut-off (hard deadline) or the deadline (soft): a call
    whose deadline comes first sends nothing and gives ``[]``. With a hard
    deadline, an example still unwritten at the cut-off is not sent; one
    partly written is sent whole, and its answer discarded if it comes after
    the deadline. Arguments as :class:`PredictExchange`, and:

    :param kind: the :class:`~subwabbit.core.kinds.PredictionKind` (its
        ``example_lines`` and ``parse_example``)
    """

    def __init__(self, channel: Channel, call: Call, *, kind: Any, **kwargs: Any) -> None:
        super().__init__(channel, call, parse=_no_parse, **kwargs)
        self._kind = kind
        self._common_part: str = kwargs["common_part"]
        self._parts: List[str] = []
        self._formatting = True   # items remain to be formatted
        self._waiting = False     # formatted, waiting for room to queue the example
        self._stopped = False
        self._items_queued = 0
        self._now: Optional[float] = None

    def _advance(self, now: float) -> List[Any]:
        self._now = now
        channel, call = self.channel, self.call
        if self.cleared_at is None and not channel.stale_lines:
            self.cleared_at = now
        stop_at = self._stop_producing_at
        if not self._stopped and stop_at is not None and now >= stop_at:
            self._stop_producing()
        if self._formatting:
            self._parts += self._format(self.pacing.batch_size)
            if not self.producing:  # the items ran out
                self._formatting = False
                self._waiting = bool(self._parts)
        if self._waiting:
            count = len(self._parts)
            in_flight = channel.in_flight_lines
            if not in_flight or in_flight + count <= self.pacing.max_in_flight_lines:
                check_item_parts(self._parts)
                call.queue_example(self._kind.example_lines(self._common_part, self._parts))
                self._items_queued = count
                self._waiting = False
                self._parts = []
        self.producing = self._formatting or self._waiting
        answers = call.take_answers()
        if not answers:
            return []
        predictions = self._kind.parse_example(answers, self._items_queued)
        self.returned += len(predictions)
        return predictions

    def _stop_producing(self) -> None:
        """As :meth:`PredictExchange._stop_producing`: the example is not
        sent (nor its formatting finished) unless it is queued already."""
        self._stopped = True
        self._formatting = self._waiting = False
        self._parts = []
        if self.pacing.hard_deadline:
            self.channel.forget_unwritten(self.call)

    def wake_at(self) -> Optional[float]:
        if self._formatting and self._now is not None:
            return self._now  # more items to format: step again at once
        return super().wake_at()


def _no_parse(lines: List[bytes]) -> List[Any]:
    raise AssertionError("multi-line answers are parsed by the kind")


def new_predict_exchange(channel: Channel, call: Call, *, kind: Any,
                         **kwargs: Any) -> PredictExchange:
    """The ``predict`` exchange for a kind of model: a :class:`PredictExchange`
    (one line per item) or a :class:`MultiLinePredictExchange` (one example
    per call). Keyword arguments as :class:`PredictExchange`, without ``parse``.

    :param kind: the client's :class:`~subwabbit.core.kinds.PredictionKind`
    """
    if kind.multi_line:
        return MultiLinePredictExchange(channel, call, kind=kind, **kwargs)
    return PredictExchange(channel, call, parse=kind.parse_answers, kind=kind, **kwargs)


#: With a deadline, one batch's formatting takes about this long at most
#: (seconds, at the formatter's last measured speed): a formatter slow per
#: item (0.2 ms, say: a lookup per item) formatted a whole batch of 50 or
#: 100 items past a 10 ms deadline, and such calls returned nothing, ever.
FORMAT_BATCH_S = 0.001
#: With a deadline, the items of a call's first batch while the formatter's
#: speed is not known yet (the client's first call).
FIRST_FORMAT_ITEMS = 8


def items_to_format(want: int, seconds_per_item: Optional[float], now: float,
                    stop_at: Optional[float]) -> int:
    """How many of the ``want`` next items to format in one go: all of them
    without a deadline (``stop_at``: when lines stop being sent); with one,
    no more than the formatter formats in :data:`FORMAT_BATCH_S` nor by
    ``stop_at`` at ``seconds_per_item``, and :data:`FIRST_FORMAT_ITEMS`
    while its speed is unknown (``None``).

    :returns: ``0`` when not one item would be formatted by ``stop_at``: the
        caller stops sending as it does at ``stop_at`` (an item formatted
        past it, at 1 ms an item, ended a call past its deadline)
    """
    if stop_at is None:
        return want
    if seconds_per_item is None:
        return min(want, FIRST_FORMAT_ITEMS)
    if seconds_per_item <= 0:
        return want
    before_stop = (stop_at - now) / seconds_per_item
    if before_stop < 1:
        return 0
    return int(min(want, max(1.0, FORMAT_BATCH_S / seconds_per_item), before_stop))


def stale_speed(seconds_per_item: Optional[float]) -> Optional[float]:
    """The formatter's speed a call that formatted nothing (not one item
    fitted before its cut-off at ``seconds_per_item``) keeps for the next
    call: half of it. A call that formats nothing measures nothing, so a
    speed measured once too slow (a batch of one item during a garbage
    collection) made every later call format nothing, for good; halved at
    each such call, a later call formats an item and measures it again."""
    return None if seconds_per_item is None else seconds_per_item / 2


class FormatterSpeed:
    """The formatter's speed as one call measures it, batch by batch: how
    many items a batch may hold (:func:`items_to_format`), and the seconds
    per item the client keeps for its next call (:attr:`seconds_per_item`;
    halved, :func:`stale_speed`, when the call formats nothing before it
    measured the speed itself). The single-engine and the split exchanges
    both size their batches with it.

    :param seconds_per_item: what the client's last call measured (``None``: unknown)
    """

    __slots__ = ("seconds_per_item", "_measured")

    def __init__(self, seconds_per_item: Optional[float]) -> None:
        self.seconds_per_item = seconds_per_item
        self._measured = False

    def items(self, want: int, now: float, stop_at: Optional[float]) -> int:
        """:func:`items_to_format` at this speed (``0``: stop sending)."""
        count = items_to_format(want, self.seconds_per_item, now, stop_at)
        if not count and not self._measured:
            self.seconds_per_item = stale_speed(self.seconds_per_item)
        return count

    def note(self, seconds: float, items: int) -> None:
        """A batch of ``items`` (at least one) took ``seconds`` to format."""
        self.seconds_per_item = seconds / items
        self._measured = True


def format_next(format_item: Callable[..., Any], common_features: Any, items: Iterator[Any],
                want: int, debug_info: Any, clock: Optional[Callable[[], float]] = None,
                stop_at: Optional[float] = None) -> "tuple[List[Any], bool]":
    """The formatted parts of the next ``want`` items of ``items`` (fewer
    when it runs out), as ``format_item_features`` returns them.

    With a ``clock`` and a ``stop_at``, the clock is read after each item,
    and no item is begun at or after ``stop_at``: formatting ends past it by
    one item's time at most. (Batches are sized by the formatter's measured
    speed, but a formatter slow for some items only, a cache miss say,
    formatted a whole batch of them past the deadline: calls were 0.15 to
    0.5 s late with a 20 ms timeout at 5 ms an item.)

    :returns: the parts, and whether ``items`` ran out
    """
    if clock is None or stop_at is None:
        parts = [format_item(common_features, item, debug_info=debug_info)
                 for item in itertools.islice(items, want)]
        return parts, len(parts) < want
    parts = []
    for item in itertools.islice(items, want):
        parts.append(format_item(common_features, item, debug_info=debug_info))
        if clock() >= stop_at:
            return parts, False
    return parts, len(parts) < want


def _line_joiner(formatter: Any, common_part: str, debug_info: Any,
                 kind: Any = None) -> Callable[[List[Any], int], Sequence[str]]:
    """A function that checks item parts and joins them with the common part
    into lines (inline when the formatter keeps the default joining), and
    checks the label words vw reads in them with the rule of ``kind`` (a
    single-line :class:`~subwabbit.core.kinds.PredictionKind`; ``None``:
    no such check).

    :raises ValueError: from the function, at its first call when the
        common part puts a label the kind refuses into every line, else for
        the first line whose label it refuses
    """
    join = example_joiner(formatter)
    prefix = common_part + " "
    # With the default joining, the common part decides once per call whether
    # a batch's lines can be known to be whole examples from its parts alone
    # (the check of every line was a sixth of the client's work per line),
    # and, holding every line's header, what label they all have.
    by_parts = join is None and common_part_holds_the_header(common_part)
    rule = kind.label_words_rule() if kind is not None else None
    common_problem = None
    if rule is not None and by_parts:
        common_problem = _common_label_problem(common_part, common_part, rule)
        rule = None  # no line has other label words

    def lines(parts: List[Any], first_index: int) -> Sequence[str]:
        flat = check_item_parts(parts, first_index)
        if common_problem is not None:
            raise ValueError(common_problem)
        if join is None:
            if by_parts and breaks_no_line(flat):
                return PrefixedLines(prefix, parts)
            joined = [prefix + part for part in parts]
        else:
            joined = [join(common_part, part, debug_info=debug_info) for part in parts]
        if rule is not None:
            _check_labels(rule, joined, first_index,
                          shared_header(common_part, parts) if join is None else None,
                          common_part)
        return joined
    return lines


def _common_label_problem(header: str, common_part: str,
                          rule: Callable[[List[str]], Optional[str]]) -> Optional[str]:
    """The error message when ``rule`` refuses the label words of ``header``,
    which the common part gives every line (``None``: no problem)."""
    return label_problem(label_words(header + "|"), "the formatted common features", rule,
                         common_part)


def _check_labels(rule: Callable[[List[str]], Optional[str]], lines: List[str],
                  first_index: int, header: Optional[str], common_part: str) -> None:
    """Check the label words of ``lines`` with ``rule``: once, when they all
    have ``header`` (the common part's, see :func:`~subwabbit.lines.shared_header`),
    else line by line."""
    if header is None:
        check_line_labels(lines, rule, first_index)
        return
    problem = _common_label_problem(header, common_part, rule)
    if problem is not None:
        raise ValueError(problem)


def check_item_parts(parts: List[Any], first_index: int = 0) -> str:
    """Check that every formatted item part is a ``str``.

    :returns: the parts joined without separators (for checks of the text)
    :raises TypeError: naming ``format_item_features`` and the item, for the first that is not
    """
    try:
        return "".join(parts)
    except TypeError:
        for offset, part in enumerate(parts):
            if not isinstance(part, str):
                raise TypeError(
                    f"format_item_features returned {type(part).__name__} for item "
                    f"#{first_index + offset}; it must return a str") from None
        raise


def format_common_part(formatter: Any, common_features: Any, debug_info: Any) -> str:
    """Format and check the common features of a call.

    :raises TypeError: when ``format_common_features`` does not return a ``str``
    :raises ValueError: when it contains a line break
    """
    common = formatter.format_common_features(common_features, debug_info=debug_info)
    if not isinstance(common, str):
        raise TypeError(f"format_common_features returned {type(common).__name__}; "
                        "it must return a str")
    check_line_part(common, "the formatted common features")
    return common


class SendExchange(Exchange):
    """Send prepared lines and wait until the engine has answered them all
    (answers discarded: ``train``), or, write-only, until they are written.

    :param lines: formatted and checked examples; on a multi-line channel,
        the lines of one example (its shared line first)
    """

    doing = "waiting for it to learn"

    def __init__(self, channel: Channel, call: Call, lines: List[str],
                 idle_s: Optional[float]) -> None:
        super().__init__(channel, call, None, idle_s, hard_deadline=False)
        self._lines: Optional[List[str]] = lines

    def _advance(self, now: float) -> List[Any]:
        if self._lines is not None:
            if self.channel.multi_line:
                self.call.queue_example(self._lines)
            else:
                self.call.queue_lines(self._lines)
            self._lines = None
        return []


class ProbeExchange(Exchange):
    """Send probe examples (after an optional control line, such as a
    save command) and wait for their answers.

    :param control: a control line to send before the probe (or several,
        in a sequence), or ``None``
    :param deadline: give up at this time (hard)
    :param probe: whether to send a probe at all (a write-only engine answers none)
    :param probes: how many probes to send (start-up sends two, so that an
        engine printing more or fewer lines per example than expected shows it)
    :param check: called with the probe answer lines received so far, at
        every step; raises when they are not what the model's kind prints
        (:meth:`PredictionKind.check_probe_answers
        <subwabbit.core.kinds.PredictionKind.check_probe_answers>`)
    """

    doing = "waiting for the answer to a probe"

    def __init__(self, channel: Channel, call: Call, deadline: Optional[float],
                 idle_s: Optional[float],
                 control: Union[None, bytes, Sequence[bytes]] = None,
                 probe: bool = True, probes: int = 1,
                 check: Optional[Callable[[List[bytes]], None]] = None) -> None:
        super().__init__(channel, call, deadline, idle_s, hard_deadline=True)
        self._control = [control] if isinstance(control, bytes) else list(control or ())
        self._probes = probes if probe else 0
        self._check = check
        self._queued = False

    def _advance(self, now: float) -> List[Any]:
        if not self._queued:
            for line in self._control:
                self.call.queue_control(line)
            for _ in range(self._probes):
                self.call.queue_probe()
            self._queued = True
        if self._check is not None and self.call.probe_answers:
            self._check(self.call.probe_answers)
        return []

    @property
    def answer(self) -> List[bytes]:
        """The probe's answer lines, once :attr:`done`."""
        return self.call.probe_answers


class WarmUpExchange(Exchange):
    """Have a new engine predict lines that a recent call sent, and drop
    the answers.

    A new engine is slow on its first lines: a forked engine of a pool took
    3.5 ms for its first 200 lines of the benchmark's workload, 1.7 ms for
    the next 200 and 1.0 ms from then on, the first two with 760 and 190
    page faults (its example pool and buffers growing) against 12. Warmed
    before it serves, it costs no call that time.

    The lines go in chunks of growing size (:data:`WARM_UP_FIRST_CHUNK`
    line, then twice as many each time, up to ``largest_chunk``: as many
    as a call keeps in flight on an engine, which reads and parses them at
    once), each once the previous one is answered, taking ``lines`` over
    again until ``rounds`` times their number were sent. A chunk is sent only if,
    at the pace of the chunk before it, it is answered before
    ``budget_end`` (none once that has passed): an engine that is slow per
    line (a model with many features or interactions) is warmed on a few
    lines only. Only a chunk still unanswered at the hard ``deadline`` is
    left in flight: the exchange then ends :attr:`timed_out`, and its
    channel owes those answers to no call (they are discarded as they
    arrive, whoever serves on the channel next).

    :param lines: formatted single-line examples (each starting with ``|``:
        no label, so that no engine learns from them)
    :param rounds: how many times the lines are sent in all
    :param largest_chunk: the most lines sent at once (0: as many as
        ``lines``)
    :param deadline: the hard deadline (see above)
    :param budget_end: no chunk is sent that would end after this (a clock
        value; ``None``: no such limit)
    :raises ValueError: when a line is not an unlabelled single-line example
    """

    doing = "warming up"

    def __init__(self, channel: Channel, call: Call, deadline: Optional[float],
                 lines: Sequence[str], rounds: int = 2,
                 budget_end: Optional[float] = None, largest_chunk: int = 0) -> None:
        super().__init__(channel, call, deadline, None, hard_deadline=True)
        if not warm_up_lines_usable(lines):
            raise ValueError("warm-up lines must be unlabelled single-line examples")
        self._lines = lines
        self._left = rounds * len(lines)
        self._budget_end = budget_end
        self._next = 0  # where in ``lines`` the next chunk starts
        self._largest = largest_chunk or len(lines)
        self._chunk = min(WARM_UP_FIRST_CHUNK, self._largest)
        self._sent_at: Optional[float] = None
        self._seconds_per_line: Optional[float] = None
        #: answer lines the engine printed
        self.answered = 0

    def _advance(self, now: float) -> List[Any]:
        self.answered += len(self.call.take_answers())
        if self.call.owed_lines or not self._left:
            return []
        if self._sent_at is not None:  # the last chunk is answered: its pace
            self._seconds_per_line = (now - self._sent_at) / self._chunk
            self._chunk = min(2 * self._chunk, self._largest)
        size = min(self._chunk, self._left)
        if self._budget_end is not None and (
                now >= self._budget_end or (self._seconds_per_line is not None
                                            and now + size * self._seconds_per_line
                                            > self._budget_end)):
            self._left = 0  # the next chunk would not fit: warm enough
            return []
        chunk = [self._lines[(self._next + offset) % len(self._lines)] for offset in range(size)]
        self._next = (self._next + size) % len(self._lines)
        self._chunk = size
        self._left -= size
        self._sent_at = now
        self.call.queue_lines(chunk)
        return []

    def _finished(self) -> bool:
        return self._left == 0 and super()._finished()


#: The size of a warm-up's first chunk of lines (see :class:`WarmUpExchange`):
#: one, whose time says whether more fit.
WARM_UP_FIRST_CHUNK = 1


def warm_up_lines_usable(lines: Sequence[str]) -> bool:
    """Whether ``lines`` may warm up an engine: some lines, each an example
    with no label or tag (it starts with ``|``) and no line break, so that
    predicting them changes nothing in the model."""
    return bool(lines) and all(line[:1] == "|" and "\n" not in line and "\r" not in line
                               for line in lines)


class CleanupExchange(Exchange):
    """Wait until earlier calls' leftovers are all answered (and discarded)."""

    doing = "clearing earlier calls' leftovers"
    idle_before_deadline = True

    def __init__(self, channel: Channel, call: Call, deadline: Optional[float],
                 idle_s: Optional[float]) -> None:
        super().__init__(channel, call, deadline, idle_s, hard_deadline=True)

    def _advance(self, now: float) -> List[Any]:
        return []

    def _finished(self) -> bool:
        return self.channel.stale_lines == 0


class AuditExchange(Exchange):
    """Send one example in audit mode and wait for its three answer lines."""

    doing = "waiting for its audit"

    def __init__(self, channel: Channel, call: Call, line: str, idle_s: Optional[float]) -> None:
        super().__init__(channel, call, None, idle_s, hard_deadline=False)
        self._line: Optional[str] = line
        self.answer: List[bytes] = []

    def _advance(self, now: float) -> List[Any]:
        if self._line is not None:
            self.call.queue_lines([self._line])
            self._line = None
        self.answer += self.call.take_answers()
        return []

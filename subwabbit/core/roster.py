"""Which engine of a pool serves which call, without I/O or locks.

A pool runs several engines of one model (a *generation*; a reload starts the
next). A :class:`Roster` says which are free, how many one call may hold so
that concurrent calls share them fairly, and what to do with the engines of a
generation that a reload replaced: those that are free are closed at once,
those that a call still holds are closed when it gives them back, so that a
call that began on one model finishes on it.

The drivers (:mod:`subwabbit.pool` with a lock and a condition,
:mod:`subwabbit.asyncio_pool` on its event loop) hold the roster's state
consistent; the roster only decides.
"""

import collections
import math
from typing import Any, Deque, List, Optional

from .channel import Channel


class Slot:
    """One engine of the pool.

    :param engine: the engine (the driver's object)
    :param channel: its channel
    :param generation: the model generation it serves
    """

    __slots__ = ("engine", "channel", "generation", "held", "number", "close_on_return",
                 "since")

    def __init__(self, engine: Any, channel: Channel, generation: int, number: int) -> None:
        self.engine = engine
        self.channel = channel
        self.generation = generation
        #: whether a call holds it
        self.held = False
        #: a number for logs, unique in the pool
        self.number = number
        #: the pool was closed while a call held it: that call closes it when
        #: it gives it back (its pipes are the call's until then)
        self.close_on_return = False
        #: when it entered service (a clock value of the driver's; ``None``: not told)
        self.since: Optional[float] = None

    def note_progress(self, now: float) -> None:
        """Called when a call gives the engine back: start or stop the clock
        of an engine that owes answers and prints nothing
        (:meth:`Channel.note_progress <subwabbit.core.channel.Channel.note_progress>`)."""
        self.channel.note_progress(now)

    def stuck(self, now: float, idle_s: Optional[float]) -> bool:
        """Whether it has owed answers, with no byte of output, for ``idle_s``."""
        return self.channel.quiet_for(now, idle_s)

    def __repr__(self) -> str:
        return (f"<Slot #{self.number} generation={self.generation} held={self.held} "
                f"{self.channel.describe()}>")


class Ticket:
    """A call's place in the queue of calls waiting for a first engine.

    :param first_until: until when it comes before the calls that came
        after it (a clock value; ``None``: for as long as it waits)
    :param deadline: the call's deadline (``None``: none); after
        ``first_until`` it still comes before a call whose deadline is
        earlier (see :meth:`Roster.ahead_of`)
    """

    __slots__ = ("first_until", "deadline")

    def __init__(self, first_until: Optional[float], deadline: Optional[float] = None) -> None:
        self.first_until = first_until
        self.deadline = deadline


class Roster:
    """The engines of a pool and the calls that hold them.

    Calls that find no engine free wait in a queue, and free engines go to
    them in the order they came (:meth:`ahead_of`) for the first part of
    their time (a tenth, as the pools set it; all of it without a
    deadline): a call that arrives while others wait, or that a caller
    makes right after its last one ended, queues behind them instead of
    taking the engine the last call gave back. Before, a caller calling
    back to back kept a pool of one engine from every other call until
    their deadlines, and with 4 threads calling a pool of 2 with 10 ms
    deadlines on 2 vCPUs one thread got 0 to 182 predictions a second,
    against 13,000 to 32,000 now. A call that has waited longer comes
    first no more: an engine that went to it would have little time left
    to serve it, and under more load than the engines can serve every call
    got such a sliver (with the whole of their time, 16 threads got about
    30,000 predictions a second in all, against about 50,000 when a free
    engine went to whichever call asked first; with a tenth, 37,000 to
    74,000 against 38,000 to 63,000 in four rounds of 2 s taken in turns,
    and with 4 threads 101,000 to 156,000 against 96,000 to 141,000).
    After that part, a waiting call still comes before a call whose
    deadline is earlier than its own, which has less time left than it:
    with a tenth alone, a call of 50 ms waiting behind two callers calling
    a pool of one engine back to back with 10 ms deadlines got nothing in
    28 of 40 calls (its 5 ms ran out before the engine was free, and then
    every new 10 ms call came first; found by a review). Among calls of
    one budget, the one that asks has the latest deadline, so nothing
    changes for them.
    """

    def __init__(self) -> None:
        #: engines in service (failed and retired ones are taken out)
        self.slots: List[Slot] = []
        #: the generation new calls are served by
        self.generation = 0
        #: calls in progress (see :attr:`waiting` for those waiting for a first engine)
        self.calls = 0
        #: bumped at every change a call in progress may want to react to
        self.version = 0
        self._numbers = 0
        self._queue: Deque[Ticket] = collections.deque()

    # -------------------------------------------------------------- engines

    def add(self, engine: Any, generation: int, channel: Optional[Channel] = None) -> Slot:
        """Put an engine in service for ``generation``.

        :param channel: its channel (default: one for single-line scalar answers)
        """
        self._numbers += 1
        slot = Slot(engine, Channel(1) if channel is None else channel, generation,
                    self._numbers)
        self.slots.append(slot)
        self.version += 1
        return slot

    def remove(self, slot: Slot) -> bool:
        """Take a slot out of service (its engine failed, or the pool closes).

        :returns: whether it was in service
        """
        if slot not in self.slots:
            return False
        self.slots.remove(slot)
        self.version += 1
        return True

    def switch(self, generation: int) -> List[Slot]:
        """Serve new calls with ``generation`` from now on.

        :returns: the slots of earlier generations that no call holds: the
            driver closes them now; held ones are closed on :meth:`give_back`
        """
        self.generation = generation
        idle = [slot for slot in self.slots if slot.generation != generation and not slot.held]
        for slot in idle:
            self.slots.remove(slot)
        self.version += 1
        return idle

    def healthy(self, generation: int) -> int:
        """Engines in service for ``generation``."""
        return sum(1 for slot in self.slots if slot.generation == generation)

    # ---------------------------------------------------------------- calls

    @property
    def waiting(self) -> int:
        """Calls waiting for a first engine."""
        return len(self._queue)

    def wait(self, first_until: Optional[float], deadline: Optional[float] = None) -> Ticket:
        """A call found no engine it may take: queue it behind the calls
        already waiting.

        :param first_until: until when it comes before the calls that came
            after it (``None``: for as long as it waits)
        :param deadline: the call's deadline (``None``: none)
        :returns: its place, for :meth:`ahead_of` and :meth:`stop_waiting`
        """
        ticket = Ticket(first_until, deadline)
        self._queue.append(ticket)
        self.version += 1
        return ticket

    def stop_waiting(self, ticket: Ticket) -> None:
        """The call of ``ticket`` took its engines, or gave up waiting."""
        try:
            self._queue.remove(ticket)
        except ValueError:
            pass
        self.version += 1

    def ahead_of(self, ticket: Optional[Ticket], now: float,
                 deadline: Optional[float] = None) -> int:
        """How many waiting calls come before the call of ``ticket`` (of
        those that came before it, or all, for a call that does not wait
        yet): that many free engines are theirs. Calls within their
        :attr:`Ticket.first_until` count, and after it those whose deadline
        is no earlier than ``deadline``, the asking call's (``None``: none).
        """
        ahead = 0
        for queued in self._queue:
            if queued is ticket:
                break
            if (queued.first_until is None or queued.first_until > now
                    or (deadline is not None and queued.deadline is not None
                        and queued.deadline >= deadline)):
                ahead += 1
        return ahead

    def stuck(self, now: float, idle_s: Optional[float]) -> List[Slot]:
        """Free engines that have owed answers with no output for ``idle_s``
        (calls with deadlines left them behind): the driver replaces them."""
        return [slot for slot in self.slots if not slot.held and slot.stuck(now, idle_s)]

    def free(self, generation: int) -> List[Slot]:
        """Free engines of ``generation``, those with the least left in
        flight by earlier calls first. An engine whose channel an interrupted
        call left :attr:`~subwabbit.core.channel.Channel.torn` is never free:
        the next call that starts has it replaced."""
        free = [slot for slot in self.slots if slot.generation == generation and not slot.held
                and not slot.channel.torn]
        free.sort(key=lambda slot: slot.channel.in_flight_lines)
        return free

    def share(self, generation: int) -> int:
        """How many engines one call may hold: all of them when it is alone,
        an equal share when others run or wait (at least one)."""
        engines = self.healthy(generation)
        callers = max(1, self.calls + self.waiting)
        return max(1, math.ceil(engines / callers))

    def take(self, slot: Slot) -> None:
        """A call holds ``slot`` from now on."""
        if slot.held:
            raise ValueError(f"{slot!r} is already held")
        slot.held = True
        self.version += 1

    def give_back(self, slot: Slot) -> bool:
        """A call gives ``slot`` back.

        :returns: whether the driver must close it now (a reload replaced
            its generation, or it was taken out of service while held)
        """
        slot.held = False
        self.version += 1
        if slot not in self.slots:
            return True
        if slot.generation != self.generation:
            self.slots.remove(slot)
            return True
        return False

    def over_share(self, held: int, generation: int) -> bool:
        """Whether a call that holds ``held`` engines should give one back:
        other calls run or wait, and it holds more than its equal share."""
        return held > 1 and self.calls + self.waiting > 1 and held > self.share(generation)

    def describe(self, generation: Optional[int] = None) -> str:
        """A short account for reprs and logs."""
        generation = self.generation if generation is None else generation
        held = sum(1 for slot in self.slots if slot.held)
        return (f"generation={generation} engines={len(self.slots)} held={held} "
                f"calls={self.calls} waiting={self.waiting}")

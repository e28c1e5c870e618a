"""The protocol core without processes: the channel's bookkeeping and the
exchanges' decisions, against a simulated engine that answers each line with
its own number, with writes and reads cut at random places.

The invariant under test: an answer is never given to another item or
another call, whatever calls end early, time out or are superseded.
"""

import math
import random

import pytest

from subwabbit.core.channel import PROBE_LINE, Channel
from subwabbit.core.exchanges import (FIRST_FORMAT_ITEMS, CleanupExchange,
                                      MultiLinePredictExchange, Pacing, PredictExchange,
                                      ProbeExchange, SendExchange, format_next,
                                      items_to_format, new_predict_exchange)
from subwabbit.core.kinds import choose_kind
from subwabbit.errors import VowpalWabbitError, VowpalWabbitProtocolError, VowpalWabbitTimeoutError


class SimulatedEngine:
    """Reads bytes like vw: answers each example line ``|x N`` with ``N`` (per
    line ``per_line`` times), a probe with ``p``, a save command and an empty
    line with nothing. With ``multi_line``, it gathers lines until an empty
    line and answers the example with its items' numbers joined by commas
    (the shared line left out), then ``per_line - 1`` empty lines, as vw
    answers ``--cb_explore_adf``."""

    def __init__(self, per_line: int = 1, rng: random.Random = None,
                 multi_line: bool = False) -> None:
        self.per_line = per_line
        self.rng = rng or random.Random(0)
        self.multi_line = multi_line
        self.pending_in = b""
        self.out = b""
        self.lines_seen = []
        self.example = []

    @staticmethod
    def _answer(line: bytes) -> bytes:
        return b"p" if line == PROBE_LINE.split(b"\n")[0] else line.split()[-1]

    def write(self, view: memoryview) -> int:
        take = self.rng.randint(0, len(view)) if self.rng.random() < 0.5 else len(view)
        self.pending_in += bytes(view[:take])
        *lines, self.pending_in = self.pending_in.split(b"\n")
        for line in lines:
            self.lines_seen.append(line)
            if line.startswith(b"save_"):
                continue
            if not self.multi_line:
                if line:
                    self.out += (self._answer(line) + b"\n") * self.per_line
                continue
            if line:
                self.example.append(line)
            elif self.example:
                items = [item for item in self.example if not item.startswith(b"shared")]
                self.out += (b",".join(self._answer(item) for item in items) + b"\n"
                             + b"\n" * (self.per_line - 1))
                self.example = []
        return take

    def read(self) -> bytes:
        take = self.rng.randint(0, len(self.out))
        data, self.out = self.out[:take], self.out[take:]
        return data


def pump(channel: Channel, engine: SimulatedEngine) -> None:
    channel.write_with(engine.write)
    data = engine.read()
    if data:
        channel.receive(data)


class NumberFormatter:
    def format_common_features(self, common_features, debug_info=None):
        return "|c"

    def format_item_features(self, common_features, item_features, debug_info=None):
        return f"|x {item_features}"


def parse(lines):
    return [int(line) for line in lines]


def test_answers_go_to_their_own_call_in_order():
    channel = Channel()
    engine = SimulatedEngine()
    call = channel.begin()
    channel_lines = [f"|x {n}" for n in range(100)]
    call.queue_lines(channel_lines)
    got = []
    while len(got) < 100:
        pump(channel, engine)
        got += parse(call.take_answers())
    assert got == list(range(100))
    assert channel.in_flight_lines == 0 and channel.unwritten_bytes == 0


def test_an_ended_call_leftovers_are_discarded_not_given_to_the_next():
    channel = Channel()
    engine = SimulatedEngine(rng=random.Random(3))
    first = channel.begin()
    first.queue_lines([f"|x {n}" for n in range(50)])
    for _ in range(3):
        pump(channel, engine)
    first_got = parse(first.take_answers())
    channel.end(first)
    assert first_got == list(range(len(first_got)))
    second = channel.begin()
    second.queue_lines([f"|x {1000 + n}" for n in range(20)])
    got = []
    for _ in range(10000):
        if len(got) == 20:
            break
        pump(channel, engine)
        got += parse(second.take_answers())
    assert got == [1000 + n for n in range(20)]
    assert channel.stale_lines == 0


def test_unwritten_lines_of_an_ended_call_are_never_sent():
    channel = Channel()
    first = channel.begin()
    first.queue_lines([f"|x {n}" for n in range(10)])
    # the pipe takes 3 lines and half of the 4th
    line_bytes = len(b"|x 0\n")
    channel.write_with(lambda view: 3 * line_bytes + 2)
    channel.end(first)
    assert channel.in_flight_lines == 4  # the half-written line is completed, not dropped
    assert channel.stale_lines == 4
    assert channel.unwritten_bytes == line_bytes - 2
    sent = []
    channel.write_with(lambda view: sent.append(bytes(view)) or len(view))
    assert sent == [b" 3\n"]


def test_superseded_call_raises_instead_of_reading_the_next_calls_answers():
    channel = Channel()
    first = channel.begin()
    channel.begin()
    with pytest.raises(VowpalWabbitError, match="superseded"):
        first.check_active()
    with pytest.raises(VowpalWabbitError, match="superseded"):
        first.queue_lines(["|x 1"])


def test_an_abandoned_channels_call_raises_its_reason_and_owes_nothing():
    channel = Channel()
    call = channel.begin()
    call.queue_lines(["|x 1", "|x 2"])
    channel.write_with(lambda view: len(view))
    channel.abandon("the engine was replaced")
    assert channel.current is None and not call.active and call.owed_lines == 0
    assert channel.stale_lines == 2
    with pytest.raises(VowpalWabbitError, match="cannot go on: the engine was replaced"):
        call.check_active()
    channel.abandon("again")  # nothing active: nothing to do
    with pytest.raises(VowpalWabbitError, match="the engine was replaced"):
        call.check_active()


def test_an_unexpected_line_is_a_protocol_error():
    channel = Channel()
    with pytest.raises(VowpalWabbitProtocolError, match="no answer was expected"):
        channel.receive(b"0.5\n")


def test_control_lines_are_answered_by_nothing_and_probes_go_aside():
    channel = Channel()
    engine = SimulatedEngine(rng=random.Random(5))
    call = channel.begin()
    call.queue_lines(["|x 1"])
    call.queue_control(b"save_/tmp/x|\n")
    call.queue_probe()
    call.queue_lines(["|x 2"])
    while channel.in_flight_lines:
        pump(channel, engine)
    assert parse(call.take_answers()) == [1, 2]
    assert call.probe_answers == [b"p"]
    with pytest.raises(ValueError):
        call.queue_control(b"two\nlines\n")


def test_audit_mode_answers_come_in_whole_groups():
    channel = Channel(outputs_per_line=3)
    call = channel.begin()
    call.queue_lines(["|x 1", "|x 2"])
    channel.write_with(len)
    channel.receive(b"a\nb\nc\nd\n")
    assert call.take_answers() == [b"a", b"b", b"c"]
    assert channel.in_flight_lines == 1
    channel.receive(b"e\nf\n")
    assert call.take_answers() == [b"d", b"e", b"f"]
    assert channel.in_flight_lines == 0


def test_write_only_channel_owes_nothing():
    channel = Channel(outputs_per_line=0)
    call = channel.begin()
    call.queue_lines(["|x 1", "|x 2"])
    assert channel.in_flight_lines == 0 and channel.unwritten_bytes == 10
    assert channel.write_with(len) == 10


def test_write_with_releases_the_buffer_even_when_the_write_raises():
    """2.x-3.0's nonblocking class could not restart after a failed write:
    the view of its buffer outlived the error (BufferError)."""
    channel = Channel()
    call = channel.begin()
    call.queue_lines(["|x 1"])

    def broken(view):
        raise BrokenPipeError()

    with pytest.raises(BrokenPipeError):
        channel.write_with(broken)
    call.queue_lines(["|x 2"])  # the buffer can grow again
    channel.end(call)
    assert channel.unwritten_bytes == 0


@pytest.mark.parametrize("where", ["write", "read"])
def test_an_interrupt_between_moving_bytes_and_counting_them_leaves_the_channel_torn(where):
    # A KeyboardInterrupt lands between any two bytecodes: after the system
    # call took or gave bytes and before the channel counted them, who is
    # owed which answer is unknown. The channel says so instead of guessing.
    channel = Channel()
    engine = SimulatedEngine(rng=random.Random(3))
    call = channel.begin()
    call.queue_lines([f"|x {n}" for n in range(50)])
    assert not channel.torn

    def write(view):
        taken = len(view)
        engine.pending_in += bytes(view)
        *lines, engine.pending_in = engine.pending_in.split(b"\n")
        engine.out += b"".join(line.split()[-1] + b"\n" for line in lines)
        if where == "write":
            raise KeyboardInterrupt  # the bytes went; the count did not
        return taken

    def read(deadline):
        data, engine.out = engine.out, b""
        if where == "read":
            raise KeyboardInterrupt  # the bytes came; nobody got them
        return data

    with pytest.raises(KeyboardInterrupt):
        channel.write_with(write)
        channel.read_with(read)
    assert channel.torn
    # Only a cut write leaves what the engine was given unknown: after a cut
    # read its input is intact, and closing it may finish the lines it holds.
    assert channel.input_torn == (where == "write")


def test_an_exception_outside_the_channels_changes_leaves_it_exact():
    # A formatter's exception (or one in the caller's loop between two
    # predictions) comes between the channel's changes: the next call is exact.
    channel = Channel()
    engine = SimulatedEngine(rng=random.Random(4))

    class Interrupting(NumberFormatter):
        def format_item_features(self, common_features, item_features, debug_info=None):
            if item_features == 120:
                raise KeyboardInterrupt
            return super().format_item_features(common_features, item_features, debug_info)

    pacing = Pacing(batch_size=10, max_in_flight_lines=30, hard_deadline=True)
    exchange = PredictExchange(channel, channel.begin(), formatter=Interrupting(),
                               common_part="|c", common_features=None, items=range(200),
                               debug_info=None, parse=parse, pacing=pacing, deadline=None,
                               idle_s=None)
    with pytest.raises(KeyboardInterrupt):
        while True:
            exchange.step(0.0)
            pump(channel, engine)
    exchange.end()
    assert not channel.torn
    after = _predict(channel, list(range(1000, 1100)), pacing)
    got = []
    for _ in range(10_000):
        got += after.step(0.0)
        if len(got) == 100:
            break
        pump(channel, engine)
    assert got == list(range(1000, 1100))


@pytest.mark.parametrize("seed", range(40))
def test_random_calls_abandoned_at_random_points_each_get_their_own_answers(seed):
    rng = random.Random(seed)
    channel = Channel(outputs_per_line=rng.choice([1, 1, 2, 3]))
    engine = SimulatedEngine(per_line=channel.outputs_per_line, rng=rng)
    next_number = 0
    for _ in range(30):
        call = channel.begin()
        count = rng.randint(0, 120)
        numbers = list(range(next_number, next_number + count))
        next_number += count
        for start in range(0, count, 25):
            call.queue_lines([f"|x {n}" for n in numbers[start:start + 25]])
        got = []
        for _ in range(rng.randint(0, 60)):
            pump(channel, engine)
            raw = call.take_answers()
            got += parse(raw[::channel.outputs_per_line])
        assert got == numbers[:len(got)]  # a prefix of its own items, in order
        if rng.random() < 0.7:
            channel.end(call)  # abandoned, timed out, finished: all the same
    _drain(channel, engine)


def _drain(channel, engine):
    """End the call in progress; everything owed arrives and goes nowhere."""
    if channel.current is not None:
        channel.end(channel.current)
    for _ in range(100000):
        if not channel.in_flight_lines:
            break
        pump(channel, engine)
    assert channel.in_flight_lines == 0 and channel.stale_lines == 0


def _predict(channel, items, pacing, deadline=None, idle_s=None, now=0.0):
    call = channel.begin()
    return PredictExchange(channel, call, formatter=NumberFormatter(), common_part="|c",
                           common_features=None, items=items, debug_info=None, parse=parse,
                           pacing=pacing, deadline=deadline, idle_s=idle_s)


def test_predict_keeps_within_the_lines_in_flight_limit():
    channel = Channel()
    exchange = _predict(channel, range(100), Pacing(batch_size=8, max_in_flight_lines=20))
    exchange.step(0.0)
    assert channel.in_flight_lines == 8
    exchange.step(0.0)
    exchange.step(0.0)
    assert channel.in_flight_lines == 20  # 8 + 8 + 4
    exchange.step(0.0)
    assert channel.in_flight_lines == 20


def test_predict_blocking_pacing_formats_whole_batches_only():
    channel = Channel()
    exchange = _predict(channel, range(100), Pacing(batch_size=10, max_in_flight_lines=20,
                                                    min_batch=10, hard_deadline=False))
    exchange.step(0.0)
    exchange.step(0.0)
    assert channel.in_flight_lines == 20
    channel.write_with(len)
    channel.receive(b"0\n1\n")
    exchange.step(0.0)
    assert channel.in_flight_lines == 18  # no room for a whole batch yet


def _answer_all(channel, exchange, first, count, now):
    """Write everything queued and answer ``count`` lines numbered from ``first``."""
    channel.write_with(len)
    channel.receive(b"".join(b"%d\n" % n for n in range(first, first + count)))
    return exchange.step(now)


def _leave_leftovers(channel):
    """A call that sends lines 0-9 and ends before their answers come."""
    first = _predict(channel, range(100), Pacing(batch_size=10, max_in_flight_lines=10))
    first.step(0.0)
    channel.write_with(len)
    first.end()


def _tapering(**overrides):
    """A blocking pacing whose numbers all differ, so that a test shows which is used."""
    settings = dict(batch_size=10, max_in_flight_lines=60, min_batch=5, hard_deadline=False,
                    lines_at_deadline=15)
    settings.update(overrides)
    return Pacing(**settings)


def test_blocking_pacing_keeps_in_flight_what_the_engine_answers_by_the_deadline():
    channel = Channel()
    exchange = _predict(channel, range(1000), _tapering(), deadline=10.0)
    assert exchange.in_flight_limit(0.0) == 15 + 10  # no answers yet: one batch more
    for _ in range(5):
        exchange.step(0.0)
    assert channel.in_flight_lines == 25  # 10 + 10 + 5, then no room for min_batch
    # answered before the step takes them: still no rate, so refilled to 25
    assert _answer_all(channel, exchange, 0, 10, 1.0) == list(range(10))
    assert channel.in_flight_lines == 25
    # 10 answers in 1 s, 9 s left: 90 more expected, capped at 60
    assert exchange.in_flight_limit(1.0) == 60
    for _ in range(5):
        exchange.step(1.0)
    assert channel.in_flight_lines == 60
    # 40 answers in 8 s, 2 s left: 10 more expected, so 15 + 10
    assert _answer_all(channel, exchange, 10, 30, 8.0) == list(range(10, 40))
    assert exchange.in_flight_limit(8.0) == 25
    exchange.step(8.0)
    assert channel.in_flight_lines == 30  # over the limit: nothing sent
    # 20 more answered by 9.0 (40 in 9 s, 1 s left: 4 more expected): 19 allowed, 9 sent
    assert _answer_all(channel, exchange, 40, 20, 9.0) == list(range(40, 60))
    assert channel.in_flight_lines == 19
    assert exchange.in_flight_limit(9.0) == 15 + 6  # 60 in 9 s, 1 s left
    assert exchange.in_flight_limit(10.0) == 15
    assert exchange.in_flight_limit(12.0) == 15


def test_blocking_pacing_takes_an_infinite_deadline():
    channel = Channel()
    exchange = _predict(channel, range(1000), _tapering(), deadline=math.inf)
    for _ in range(5):
        exchange.step(0.0)
    assert _answer_all(channel, exchange, 0, 25, 1.0) == list(range(25))
    assert exchange.in_flight_limit(1.0) == 60
    for _ in range(8):
        exchange.step(2.0)
    assert channel.in_flight_lines == 60


def test_blocking_pacing_can_always_send_when_nothing_is_in_flight():
    # lines_at_deadline below min_batch: the limit never falls under min_batch,
    # so a call whose lines are all answered near its deadline still sends
    # (else it would wait for answers to nothing, up to io_timeout_s).
    channel = Channel()
    pacing = _tapering(min_batch=10, max_in_flight_lines=40, lines_at_deadline=5)
    exchange = _predict(channel, range(1000), pacing, deadline=10.0)
    exchange.step(0.0)
    exchange.step(0.0)
    assert channel.in_flight_lines == 10  # 5 + 10 = 15 allowed: one whole batch
    assert _answer_all(channel, exchange, 0, 10, 9.9) == list(range(10))
    assert channel.in_flight_lines == 10
    assert _answer_all(channel, exchange, 10, 10, 9.95) == list(range(10, 20))
    assert exchange.in_flight_limit(9.95) == 10  # 5 + 0 expected, raised to min_batch
    assert channel.in_flight_lines == 10 and exchange.producing and not exchange.done
    limits = _predict(Channel(), range(10), _tapering(max_in_flight_lines=3))
    assert limits.in_flight_limit(0.0) == 5  # no deadline: max_in_flight_lines, at least min_batch


def test_blocking_pacing_without_a_deadline_keeps_the_most_in_flight():
    channel = Channel()
    exchange = _predict(channel, range(1000), _tapering())
    for _ in range(8):
        exchange.step(0.0)
    assert channel.in_flight_lines == 60
    assert exchange.in_flight_limit(0.0) == 60


def test_answers_of_earlier_calls_slow_the_rate_down_not_up():
    # Leftovers answered during the call count as its time but not its answers,
    # so what it keeps in flight near its deadline can only be less.
    channel = Channel()
    _leave_leftovers(channel)  # lines 0-9, sent and abandoned
    second = _predict(channel, range(100, 200), _tapering(max_in_flight_lines=100),
                      deadline=10.0)
    second.step(0.0)
    assert channel.in_flight_lines == 20  # 10 leftovers + one batch, of 25 allowed
    channel.receive(b"".join(b"%d\n" % n for n in range(10)))  # the leftovers
    assert second.step(1.0) == []
    assert second.in_flight_limit(9.0) == 25  # still no answers of its own
    assert _answer_all(channel, second, 100, 10, 2.0) == list(range(100, 110))
    assert second.in_flight_limit(2.0) == 15 + 40  # 10 answers in 2 s, 8 s left


def test_hard_deadline_stops_sending_at_the_cutoff_and_ends_at_the_deadline():
    channel = Channel()
    exchange = _predict(channel, range(1000), Pacing(batch_size=10, max_in_flight_lines=30,
                                                     write_cutoff_s=0.5),
                        deadline=10.0)
    exchange.step(0.0)
    exchange.step(0.0)
    channel.write_with(lambda view: len(b"|c |x 0\n") + 3)  # one line and a bit of the next
    exchange.step(9.6)  # past the cut-off: unsent lines are forgotten
    assert not exchange.producing
    assert channel.in_flight_lines == 2 and not exchange.done
    assert exchange.wake_at() == 10.0
    exchange.step(10.0)
    assert exchange.done and exchange.timed_out


def test_soft_deadline_stops_formatting_but_waits_for_what_was_sent():
    channel = Channel()
    exchange = _predict(channel, range(1000), Pacing(batch_size=10, max_in_flight_lines=20,
                                                     hard_deadline=False), deadline=1.0)
    exchange.step(0.0)
    exchange.step(2.0)
    assert not exchange.producing and not exchange.done
    assert channel.in_flight_lines == 10
    channel.write_with(len)
    channel.receive(b"".join(b"%d\n" % n for n in range(10)))
    assert exchange.step(3.0) == list(range(10))
    assert exchange.done and not exchange.timed_out


def test_idle_timeout_applies_to_a_predict_call_before_its_deadline_too():
    """A call with a hard deadline further off than ``idle_s`` waited for
    its deadline on an engine that never answered: the idle limit held only
    without one. A deadline nearer than ``idle_s`` still ends the call first."""
    channel = Channel()
    exchange = _predict(channel, range(5), Pacing(batch_size=10, max_in_flight_lines=20),
                        idle_s=1.0)
    exchange.step(0.0)
    exchange.step(0.5)
    assert exchange.wake_at() == 1.0  # nothing moved since the first step
    exchange.step(1.0)  # (the pipe was last read at 0.5: the driver reads it now)
    with pytest.raises(VowpalWabbitTimeoutError, match="did not answer for 1 s"):
        exchange.step(1.0)
    channel = Channel()
    exchange = _predict(channel, range(5), Pacing(batch_size=10, max_in_flight_lines=20),
                        deadline=5.0, idle_s=1.0)
    exchange.step(0.0)
    exchange.step(0.5)
    assert exchange.wake_at() == 1.0  # the idle limit comes before the deadline
    exchange.step(1.0)
    assert exchange.wake_at() == 1.0  # at once, after the driver's read
    with pytest.raises(VowpalWabbitTimeoutError, match="did not answer for 1 s"):
        exchange.step(1.0)
    channel = Channel()
    exchange = _predict(channel, range(5), Pacing(batch_size=10, max_in_flight_lines=20),
                        deadline=0.5, idle_s=1.0)
    exchange.step(0.0)
    assert exchange.wake_at() == 0.5
    assert exchange.step(0.5) == [] and exchange.timed_out


def test_the_idle_limit_is_judged_as_of_the_last_read_of_the_pipe():
    """A step that comes late (an event loop that ran other tasks, a thread
    left without a core) finds the engine's answers unread in its pipe: the
    engine was quiet until the last step, after which the driver read the
    pipe, not until this one. It is stuck only when the pipe stays quiet
    for ``idle_s`` as of a step after which the driver read it."""
    channel = Channel()
    exchange = _predict(channel, range(5), Pacing(batch_size=10, max_in_flight_lines=20),
                        deadline=50.0, idle_s=1.0)
    exchange.step(0.0)
    channel.write_with(len)  # the engine takes the lines
    exchange.step(0.5)
    assert exchange.step(9.0) == []  # late: the driver reads the pipe after it
    channel.receive(b"1\n" * 5)  # what the engine had printed by then
    assert len(exchange.step(9.0)) == 5 and exchange.done
    # A pipe still quiet when read after a late step is the engine's silence:
    channel = Channel()
    exchange = _predict(channel, range(5), Pacing(batch_size=10, max_in_flight_lines=20),
                        deadline=50.0, idle_s=1.0)
    exchange.step(0.0)
    channel.write_with(len)
    exchange.step(0.5)
    exchange.step(9.0)
    with pytest.raises(VowpalWabbitTimeoutError, match="did not answer for 1 s"):
        exchange.step(9.0)


def test_a_save_with_a_deadline_is_bounded_by_its_deadline_not_the_idle_limit():
    """An engine writing its model prints nothing for as long as that takes:
    a save with a timeout waits for it, whatever ``idle_s``."""
    channel = Channel()
    exchange = ProbeExchange(channel, channel.begin(keep=False), 5.0, 1.0,
                             control=b"save_/m|\n")
    exchange.step(0.0)
    exchange.step(4.0)  # no idle error: the deadline bounds the call
    assert exchange.step(5.0) == [] and exchange.timed_out


def test_new_lines_wait_for_room_behind_leftovers_and_cleared_at_is_noted():
    channel = Channel()
    _leave_leftovers(channel)  # lines 0-9, sent and abandoned
    second = _predict(channel, range(100, 200), Pacing(batch_size=10, max_in_flight_lines=10))
    assert second.cleared_at is None
    second.step(1.0)
    assert channel.in_flight_lines == 10 and channel.stale_lines == 10  # no room yet
    channel.receive(b"".join(b"%d\n" % n for n in range(10)))
    assert second.step(2.0) == []
    assert second.cleared_at == 2.0 and channel.in_flight_lines == 10


def test_format_item_features_returning_none_names_the_method():
    class NoneFormatter(NumberFormatter):
        def format_item_features(self, common_features, item_features, debug_info=None):
            return None if item_features == 3 else super().format_item_features(
                common_features, item_features, debug_info)

    channel = Channel()
    call = channel.begin()
    exchange = PredictExchange(channel, call, formatter=NoneFormatter(), common_part="|c",
                               common_features=None, items=range(5), debug_info=None,
                               parse=parse, pacing=Pacing(batch_size=10, max_in_flight_lines=10),
                               deadline=None, idle_s=None)
    with pytest.raises(TypeError, match=r"format_item_features returned NoneType for item #3"):
        exchange.step(0.0)
    assert channel.in_flight_lines == 0  # nothing of the batch was queued


def test_train_probe_and_cleanup_exchanges_end_when_answered():
    channel = Channel()
    engine = SimulatedEngine(rng=random.Random(11))
    send = SendExchange(channel, channel.begin(keep=False), ["1 |x 1", "1 |x 2"], None)
    while not send.done:
        send.step(0.0)
        pump(channel, engine)
    probe = ProbeExchange(channel, channel.begin(), None, None, control=b"save_/m|\n")
    while not probe.done:
        probe.step(0.0)
        pump(channel, engine)
    assert probe.answer == [b"p"] and engine.lines_seen[-3:] == [b"save_/m|", b"|", b""]
    leftover = channel.begin()
    leftover.queue_lines(["|x 5"])
    channel.end(leftover)
    cleanup = CleanupExchange(channel, channel.begin(keep=False), 10.0, None)
    while not cleanup.done:
        cleanup.step(0.0)
        pump(channel, engine)
    assert channel.stale_lines == 0 and not cleanup.timed_out


def test_max_lateness_ends_a_soft_deadline_call_that_long_after_the_deadline():
    channel = Channel()
    exchange = _predict(channel, range(1000), Pacing(batch_size=10, max_in_flight_lines=20,
                                                     hard_deadline=False, max_lateness_s=0.5),
                        deadline=1.0, idle_s=30.0)
    exchange.step(0.0)
    exchange.step(1.2)  # formatting stopped; what was sent is still awaited
    assert not exchange.producing and not exchange.done
    assert exchange.wake_at() == 1.5  # the bound, not the idle limit
    exchange.step(1.5)
    assert exchange.done and exchange.timed_out


# ------------------------------------------------------- multi-line examples


class ItemNumbers:
    """A stand-in for a multi-line kind: the simulated engine answers an
    example with its items' numbers joined by commas, then an empty line."""

    multi_line = True

    @staticmethod
    def example_lines(common_part, item_parts, labels=None):
        return ["shared " + common_part] + list(item_parts)

    @staticmethod
    def parse_example(lines, items):
        assert len(lines) == 2 and lines[1] == b""
        numbers = [int(part) for part in lines[0].split(b",")]
        assert len(numbers) == items
        return numbers


def _example(numbers):
    return ["shared |c"] + [f"|x {n}" for n in numbers]


def test_a_multi_line_example_is_answered_once_and_counts_its_items_in_flight():
    channel = Channel(outputs_per_line=2, multi_line=True)
    engine = SimulatedEngine(per_line=2, multi_line=True, rng=random.Random(2))
    call = channel.begin()
    call.queue_example(_example([7, 8, 9]))
    assert channel.in_flight_lines == 3 and call.queued_lines == 3
    while channel.in_flight_lines:
        pump(channel, engine)
    assert call.take_answers() == [b"7,8,9", b""]
    assert engine.lines_seen == [b"shared |c", b"|x 7", b"|x 8", b"|x 9", b""]


def test_default_joining_checks_a_batch_from_its_parts_when_the_common_part_allows():
    from subwabbit import VowpalWabbitDummyFormatter  # pylint: disable=import-outside-toplevel
    from subwabbit.core.exchanges import _line_joiner  # pylint: disable=import-outside-toplevel
    from subwabbit.lines import (CheckedLines,  # pylint: disable=import-outside-toplevel
                                 PrefixedLines, encode_lines)

    class Custom(VowpalWabbitDummyFormatter):
        def get_formatted_example(self, common_line_part, item_line_part, label=None,
                                  weight=None, debug_info=None):
            return f"{common_line_part} {item_line_part}"

    default = VowpalWabbitDummyFormatter()
    # Checked from the parts, the lines are kept as the common part and the parts.
    lines = _line_joiner(default, "|u a", None)(["|i x", "save|i y"], 0)
    assert isinstance(lines, PrefixedLines) and list(lines) == ["|u a |i x", "|u a save|i y"]
    assert encode_lines(lines) == b"|u a |i x\n|u a save|i y\n"
    # Lines the parts cannot vouch for go to the full check of every line.
    for formatter, common, parts in [(default, "|u a", ["|i x", "|i y\n1 |i z"]),
                                     (default, "", ["|i x"]),
                                     (default, "'saved |u a", ["|i x"]),
                                     (Custom(), "|u a", ["|i x"])]:
        joined = _line_joiner(formatter, common, None)(parts, 0)
        assert not isinstance(joined, (CheckedLines, PrefixedLines))
    with pytest.raises(ValueError, match="#1 contains a line break"):
        encode_lines(_line_joiner(default, "|u a", None)(["|i x", "|i y\n1 |i z"], 0))
    with pytest.raises(TypeError, match="format_item_features returned int for item #4"):
        _line_joiner(default, "|u a", None)(["|i x", 7], 3)


def test_single_line_and_multi_line_queueing_do_not_mix():
    with pytest.raises(ValueError, match="queue_example"):
        Channel(multi_line=True).begin().queue_lines(["|x 1"])
    with pytest.raises(ValueError, match="queue_lines"):
        Channel().begin().queue_example(_example([1]))


@pytest.mark.parametrize("item, message", [
    ("", r"formatted item #1 is empty; vw reads an empty line as the end"),
    ("\ufeff", r"formatted item #1 is empty"),
    ("|x 1\n|x 2", r"formatted item #1 contains a line break"),
    ("|x 1\r", r"formatted item #1 contains a line break"),
    ("shared |x 1", r"formatted item #1 starts with 'shared'"),
    ("\ufeffshared |x 1", r"formatted item #1 starts with 'shared'"),  # vw drops the mark
    ("save_m|", r"formatted item #1 has a tag starting with 'save'"),
])
def test_a_line_that_would_split_or_merge_an_example_is_refused(item, message):
    channel = Channel(outputs_per_line=2, multi_line=True)
    call = channel.begin()
    with pytest.raises(ValueError, match=message):
        call.queue_example(["shared |c", "|x 0", item])
    assert channel.unwritten_bytes == 0 and channel.in_flight_lines == 0
    with pytest.raises(ValueError, match="at least one item"):
        call.queue_example(["shared |c"])
    with pytest.raises(ValueError, match="the shared line contains a line break"):
        call.queue_example(["shared |c\n", "|x 0"])


def test_a_partly_written_example_is_sent_whole_and_an_unwritten_one_is_forgotten():
    channel = Channel(outputs_per_line=2, multi_line=True)
    call = channel.begin()
    call.queue_example(_example([1, 2, 3]))
    call.queue_example(_example([4, 5]))
    first_bytes = len(b"shared |c\n|x 1\n|x 2\n|x 3\n\n")
    channel.write_with(lambda view: 12)  # into the first example's second line
    channel.end(call)
    # The first example reaches the engine whole, empty line included; the
    # second, of which nothing was written, never does.
    assert channel.unwritten_bytes == first_bytes - 12
    assert channel.in_flight_lines == 3 and channel.stale_lines == 3
    engine = SimulatedEngine(per_line=2, multi_line=True)
    engine.write(memoryview(b"shared |c\n|x"))
    next_call = channel.begin()
    next_call.queue_example(_example([6]))
    got = []
    for _ in range(1000):
        pump(channel, engine)
        got += next_call.take_answers()
        if got:
            break
    assert got == [b"6", b""] and channel.stale_lines == 0
    assert engine.lines_seen.count(b"") == 2  # two examples ended, none glued to another


def test_a_partly_written_probe_is_never_cut():
    """The probe is two lines (a featureless line and an empty one); cut
    after the first, a single-line engine would answer a probe nobody owes."""
    channel = Channel()
    call = channel.begin()
    call.queue_probe()
    channel.write_with(lambda view: 2)  # "|\n" written, the empty line not
    channel.end(call)
    assert channel.unwritten_bytes == 1 and channel.stale_lines == 1
    channel.write_with(len)
    channel.receive(b"0\n")
    assert channel.in_flight_lines == 0 and channel.stale_lines == 0


@pytest.mark.parametrize("seed", range(40))
def test_random_multi_line_calls_abandoned_at_random_points_get_all_their_items_or_none(seed):
    rng = random.Random(seed)
    channel = Channel(outputs_per_line=2, multi_line=True)
    engine = SimulatedEngine(per_line=2, rng=rng, multi_line=True)
    next_number = 0
    for _ in range(30):
        call = channel.begin()
        numbers = list(range(next_number, next_number + rng.randint(1, 30)))
        next_number += len(numbers)
        call.queue_example(_example(numbers))
        got = []
        for _ in range(rng.randint(0, 40)):
            pump(channel, engine)
            answers = call.take_answers()
            if answers:
                got += ItemNumbers.parse_example(answers, len(numbers))
        assert got in ([], numbers)
        if rng.random() < 0.7:
            channel.end(call)
    _drain(channel, engine)
    assert engine.example == []  # no example left open in the engine


def _predict_example(channel, items, pacing, deadline=None, now=0.0):
    return MultiLinePredictExchange(
        channel, channel.begin(), kind=ItemNumbers(), formatter=NumberFormatter(),
        common_part="|c", common_features=None, items=items, debug_info=None, pacing=pacing,
        deadline=deadline, idle_s=None)


def test_multi_line_predict_formats_in_batches_then_sends_one_example():
    channel = Channel(outputs_per_line=2, multi_line=True)
    exchange = _predict_example(channel, range(25), Pacing(batch_size=10, max_in_flight_lines=5))
    exchange.step(0.0)
    assert channel.in_flight_lines == 0 and exchange.wake_at() == 0.0  # more to format: at once
    exchange.step(0.1)
    exchange.step(0.2)  # the last items: the example is queued, whatever the room
    assert channel.in_flight_lines == 25 and exchange.producing is False
    assert exchange.wake_at() is None
    channel.write_with(len)
    channel.receive(b",".join(b"%d" % n for n in range(25)) + b"\n\n")
    assert exchange.step(0.3) == list(range(25))
    assert exchange.done and exchange.returned == 25


def test_multi_line_predict_waits_for_room_behind_leftovers():
    channel = Channel(outputs_per_line=2, multi_line=True)
    old = channel.begin()
    old.queue_example(_example([1, 2, 3]))
    channel.write_with(len)
    channel.end(old)
    exchange = _predict_example(channel, range(10, 14), Pacing(batch_size=10,
                                                               max_in_flight_lines=5))
    exchange.step(0.0)
    assert channel.in_flight_lines == 3  # 3 + 4 > 5: not queued yet
    channel.receive(b"1,2,3\n\n")
    assert exchange.step(0.1) == [] and channel.in_flight_lines == 4
    assert exchange.cleared_at == 0.1


def _with_cutoff(items):
    channel = Channel(outputs_per_line=2, multi_line=True)
    exchange = _predict_example(channel, items, Pacing(batch_size=10, max_in_flight_lines=50,
                                                       write_cutoff_s=0.5), deadline=1.0)
    exchange.step(0.0)
    return channel, exchange


def test_multi_line_predict_gives_nothing_when_the_cutoff_comes_first():
    channel, exchange = _with_cutoff(range(30))
    exchange.step(0.6)  # past the cut-off while formatting: nothing is sent
    assert exchange.done and channel.unwritten_bytes == 0 and channel.in_flight_lines == 0
    assert exchange.returned == 0


def test_multi_line_predict_at_the_cutoff_forgets_an_unwritten_example_and_keeps_a_written_one():
    channel, exchange = _with_cutoff(range(5))
    assert channel.in_flight_lines == 5
    exchange.step(0.6)  # nothing written yet: forgotten, the call is over
    assert exchange.done and channel.unwritten_bytes == 0 and channel.in_flight_lines == 0
    channel, exchange = _with_cutoff(range(5))
    channel.write_with(lambda view: 3)
    exchange.step(0.6)
    assert not exchange.done and channel.in_flight_lines == 5  # sent whole, awaited
    exchange.step(1.0)
    assert exchange.done and exchange.timed_out
    exchange.end()
    assert channel.stale_lines == 5


def test_soft_deadline_multi_line_predict_waits_for_an_example_sent_in_time():
    channel = Channel(outputs_per_line=2, multi_line=True)
    exchange = _predict_example(channel, range(3), Pacing(batch_size=10, max_in_flight_lines=50,
                                                          hard_deadline=False), deadline=1.0)
    exchange.step(0.0)
    channel.write_with(len)
    assert exchange.step(2.0) == [] and not exchange.done
    channel.receive(b"0,1,2\n\n")
    assert exchange.step(3.0) == [0, 1, 2] and exchange.done and not exchange.timed_out


def test_new_predict_exchange_follows_the_kind():
    channel = Channel(outputs_per_line=2, multi_line=True)
    kwargs = dict(formatter=NumberFormatter(), common_part="|c", common_features=None,
                  items=range(3), debug_info=None, pacing=Pacing(batch_size=10,
                                                                  max_in_flight_lines=10),
                  deadline=None, idle_s=None)
    assert isinstance(new_predict_exchange(channel, channel.begin(),
                                           kind=choose_kind(["--cb_explore_adf"]), **kwargs),
                      MultiLinePredictExchange)
    single = Channel(outputs_per_line=2)
    exchange = new_predict_exchange(single, single.begin(), kind=choose_kind(["--cb", "3"]),
                                    **kwargs)
    assert not isinstance(exchange, MultiLinePredictExchange)
    exchange.step(0.0)
    single.write_with(len)
    single.receive(b"0\n\n2\n\n1\n\n")
    assert exchange.step(0.0) == [1, 3, 2]  # vw 9 counts --cb actions from 0


def test_start_up_probes_are_checked_as_their_answers_arrive():
    channel = Channel(outputs_per_line=1)
    exchange = ProbeExchange(channel, channel.begin(), None, None, probes=2,
                             check=choose_kind([]).check_probe_answers)
    exchange.step(0.0)
    assert channel.in_flight_lines == 2
    channel.write_with(len)
    channel.receive(b"0\n")
    exchange.step(0.0)
    with pytest.raises(VowpalWabbitProtocolError, match="prediction_type="):
        channel.receive(b"\n")  # a --cb model's empty line, where a number is due
        exchange.step(0.0)


def test_an_example_answered_by_one_line_settles_all_its_items():
    channel = Channel(outputs_per_line=1, multi_line=True)
    call = channel.begin()
    call.queue_example(_example([1, 2, 3]))
    channel.write_with(len)
    channel.receive(b"1,2,3\n")
    assert channel.in_flight_lines == 0 and call.owed_lines == 0
    assert call.take_answers() == [b"1,2,3"]


def _reaching(**overrides):
    """A nonblocking pacing that keeps in flight what the engine answers by the deadline."""
    settings = dict(batch_size=40, max_in_flight_lines=100, reach_at_deadline=True)
    settings.update(overrides)
    return Pacing(**settings)


def test_reach_pacing_keeps_in_flight_what_the_engine_answers_by_the_deadline():
    channel = Channel()
    exchange = _predict(channel, range(1000), _reaching(), deadline=10.0)
    assert exchange.pace() is None
    for _ in range(5):
        exchange.step(0.0)
    assert channel.in_flight_lines == 100  # no pace known: max_in_flight_lines
    # 20 answered in 2 s of the call with lines in flight: 10 a second
    # (the step refilled before it took them: 100 in flight)
    assert _answer_all(channel, exchange, 0, 20, 2.0) == list(range(20))
    assert exchange.pace() == 10.0 and exchange.in_flight_limit(2.0) == 80  # 8 s left
    # 60 more by 6 s: 80 in 6 s, 4 s left: 53 expected, 40 in flight, 13 sent
    assert _answer_all(channel, exchange, 20, 60, 6.0) == list(range(20, 80))
    assert channel.in_flight_lines == 40
    exchange.step(6.0)
    assert channel.in_flight_lines == 53
    # 6.7 expected: 6, not a quarter batch (10), which this engine answers
    # after the deadline, leaving the next call to wait for them
    assert exchange.in_flight_limit(9.5) == 6
    assert exchange.in_flight_limit(9.99) == 1  # one line at least: the call can send
    exchange.end()
    assert channel.pace == 80 / 6.0  # for the next call on this engine


def test_reach_pacing_learns_a_slower_pace_from_the_leftovers_it_waits_for():
    """A call that spends its time on the last call's leftovers counts their
    answers in the engine's pace. Counting only its own, it measured none,
    kept the faster pace of a call before, and filled up again with lines
    answered after its deadline: on a machine that got loaded, call after
    call returned nothing."""
    channel = Channel()
    leftover = _predict(channel, range(100), Pacing(batch_size=50, max_in_flight_lines=100))
    leftover.step(0.0)
    leftover.step(0.0)
    channel.write_with(len)
    leftover.end()
    assert channel.stale_lines == 100
    channel.pace = 1000.0  # the engine's, before it slowed down
    exchange = _predict(channel, range(1000), _reaching(), deadline=1.0)
    exchange.step(0.0)
    assert channel.in_flight_lines == 100  # no room
    # 20 leftovers answered in 0.5 s: 40 a second, 20 more by the deadline
    assert _answer_all(channel, exchange, 0, 20, 0.5) == []
    assert exchange.pace() == 40.0
    assert channel.in_flight_lines == 80  # nothing added: 80 are owed already
    exchange.end()
    assert channel.pace == 40.0  # for the next call on this engine


def test_reach_pacing_starts_a_call_at_the_engines_last_pace():
    """A call deals by the engine's pace in its last call until it has
    measured its own: 5 lines a second with 4 s left, 20 lines; a channel
    no call measured gets ``max_in_flight_lines``; without the pacing, the
    last pace is ignored."""
    for pace, reach, expected in ((5.0, True, 20), (None, True, 100), (5.0, False, 100)):
        channel = Channel()
        channel.pace = pace
        exchange = _predict(channel, range(1000), _reaching(reach_at_deadline=reach),
                            deadline=4.0)
        for _ in range(5):
            exchange.step(0.0)
        assert channel.in_flight_lines == expected, (pace, reach)


def test_reach_pacing_takes_an_infinite_deadline():
    channel = Channel()
    channel.pace = 5.0
    exchange = _predict(channel, range(1000), _reaching(), deadline=math.inf)
    for _ in range(5):
        exchange.step(0.0)
    assert channel.in_flight_lines == 100


def _written(channel):
    sent = []
    channel.write_with(lambda view: sent.append(bytes(view)) or len(view))
    return b"".join(sent)


@pytest.mark.parametrize("after_blank", [True, False])
def test_a_byte_order_mark_that_continues_the_start_up_blank_is_sent_as_spaces(after_blank):
    # vw drops a byte order mark only where a line starts; after the start-up
    # blank it would stay in the first line's header. Three spaces, as long
    # as the mark, keep the channel's byte counts.
    channel = Channel(1, after_blank=after_blank)
    call = channel.begin()
    call.queue_lines(["\ufeff1 |a x", "\ufeff2 |a y"])
    written = _written(channel)
    first = b"   " if after_blank else "\ufeff".encode()
    assert written == first + b"1 |a x\n" + "\ufeff".encode() + b"2 |a y\n"
    assert channel.bytes_written == len(written)
    call.queue_lines(["\ufeff3 |a z"])  # only the first bytes queued continue the blank
    assert _written(channel) == "\ufeff3 |a z\n".encode()


def test_format_next_begins_no_item_at_or_after_stop_at():
    """A batch sized by the formatter's speed so far was formatted whole: a
    formatter slow for some items ran past the deadline by the whole batch."""
    now = [0.0]

    def format_item(common_features, item, debug_info=None):
        now[0] += 0.010 if item >= 3 else 0.0001
        return f"|i {item}"

    items = iter(range(100))
    parts, ran_out = format_next(format_item, None, items, 50, None, lambda: now[0], 0.020)
    # item 4 ends past 0.020: it is the last one begun
    assert parts == ["|i 0", "|i 1", "|i 2", "|i 3", "|i 4"] and not ran_out
    assert next(items) == 5  # the items not begun are left to the call
    assert format_next(format_item, None, iter(range(2)), 50, None, lambda: 0.0, 1.0) == (
        ["|i 0", "|i 1"], True)
    assert format_next(format_item, None, iter(range(9)), 5, None) == (
        [f"|i {n}" for n in range(5)], False)


def test_items_to_format_by_the_formatters_speed_and_the_time_left():
    """Without a deadline a batch is whole; with one, a batch is cut to
    what the formatter formats in about 1 ms at its last speed and before
    the write cut-off, with a first batch of FIRST_FORMAT_ITEMS while its
    speed is unknown, and none when not one item fits before the cut-off."""
    assert items_to_format(50, None, 0.0, None) == 50
    assert items_to_format(50, 0.001, 0.0, None) == 50
    assert items_to_format(50, None, 0.0, 0.010) == FIRST_FORMAT_ITEMS
    assert items_to_format(50, 1e-6, 0.0, 0.010) == 50  # a fast formatter: whole batches
    assert items_to_format(50, 0.0002, 0.0, 0.010) == 5  # 1 ms of a 0.2 ms formatter
    assert items_to_format(50, 0.002, 0.0, 0.010) == 1  # one item at least...
    assert items_to_format(50, 0.0002, 0.0096, 0.010) == 2  # ...and what fits before the cut-off
    assert items_to_format(50, 0.002, 0.009, 0.010) == 0  # none fits: stop sending now
    assert items_to_format(50, 0.0, 0.0, 0.010) == 50


def test_a_call_that_formats_nothing_keeps_half_the_formatters_speed():
    """A call whose deadline left room for no item at the kept speed (too
    slow once: a garbage collection) formats nothing and measures nothing:
    it keeps half that speed, so that a later call formats again (single-
    and multi-line kinds)."""
    pacing = Pacing(batch_size=50, max_in_flight_lines=500, hard_deadline=True)
    for multi in (False, True):
        channel = Channel()
        kwargs = dict(formatter=NumberFormatter(), common_part="|c", common_features=None,
                      items=range(5), debug_info=None, pacing=pacing, deadline=0.010,
                      idle_s=None, clock=lambda: 0.0, format_s_per_item=0.060)
        if multi:
            exchange = MultiLinePredictExchange(channel, channel.begin(), kind=ItemNumbers(),
                                                **kwargs)
        else:
            exchange = PredictExchange(channel, channel.begin(), parse=parse, **kwargs)
        exchange.step(0.0)
        assert not exchange.producing and channel.in_flight_lines == 0
        assert exchange.format_s_per_item == pytest.approx(0.030)

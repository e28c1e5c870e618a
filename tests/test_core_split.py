"""The pool's core without processes: one call split over several simulated
engines (:mod:`subwabbit.core.split`) and the roster that shares engines
between calls and model generations (:mod:`subwabbit.core.roster`).

The invariant under test: every item gets its own engine's answer, the call
hands out the longest answered prefix in item order, and nothing an ended or
failed lane left behind reaches another call.
"""

import collections
import math
import random

import pytest

from subwabbit.core.channel import Channel
from subwabbit.core.roster import Roster
from subwabbit.core.split import HEDGE_MIN_S, HEDGE_WAKE_AHEAD_S, SplitPredictExchange
from subwabbit.errors import VowpalWabbitTimeoutError

from test_core import NumberFormatter, SimulatedEngine, parse, pump


def _exchange(items, *, deadline=None, batch_size=10, in_flight=20, cutoff=0.0, idle_s=None,
              hedge=True):
    return SplitPredictExchange(
        formatter=NumberFormatter(), common_part="|c", common_features=None, items=items,
        debug_info=None, parse=parse, batch_size=batch_size, max_in_flight_lines=in_flight,
        deadline=deadline, write_cutoff_s=cutoff, idle_s=idle_s, hedge=hedge)


def _run(exchange, engines, now=0.0, steps=100000, rng=None, on_step=None):
    got = []
    for _ in range(steps):
        got += exchange.step(now)
        if exchange.done:
            return got
        if on_step is not None:
            on_step(exchange)
        lanes = list(exchange.lanes)
        if rng is not None:
            rng.shuffle(lanes)
        for lane in lanes:
            pump(lane.channel, engines[lane.key])
    raise AssertionError("the exchange did not finish")


@pytest.mark.parametrize("lanes", [1, 2, 3, 5])
def test_a_call_split_over_engines_gets_every_answer_in_item_order(lanes):
    rng = random.Random(lanes)
    engines = {k: SimulatedEngine(rng=random.Random(k)) for k in range(lanes)}
    exchange = _exchange(range(537))
    for key in engines:
        exchange.add_lane(key, Channel())
    assert _run(exchange, engines, rng=rng) == list(range(537))
    # Every engine did part of the work, in batches dealt in item order; a
    # line reached two engines only when its batch was hedged.
    assert all(engine.lines_seen for engine in engines.values())
    seen = [int(line.split()[-1]) for e in engines.values() for line in e.lines_seen]
    assert sorted(set(seen)) == list(range(537))
    assert len(seen) - 537 <= exchange.hedged_lines


def test_a_step_formats_at_most_one_batch():
    """However many engines have room: the driver checks the clock between
    steps, so a slow formatter delays the write cut-off and the deadline by
    one batch at most (and an event loop waits no longer for its turn)."""
    formatted = []

    class CountingFormatter(NumberFormatter):
        def format_item_features(self, common_features, item_features, debug_info=None):
            formatted.append(item_features)
            return super().format_item_features(common_features, item_features, debug_info)

    exchange = SplitPredictExchange(
        formatter=CountingFormatter(), common_part="|c", common_features=None,
        items=range(1000), debug_info=None, parse=parse, batch_size=10,
        max_in_flight_lines=40, deadline=None)
    for key in range(3):
        exchange.add_lane(key, Channel())
    for steps in range(1, 7):
        exchange.step(0.0)
        assert len(formatted) == 10 * steps
    # The three engines were dealt in turn, each while it had the most room.
    assert [lane.dealt_lines for lane in exchange.lanes] == [20, 20, 20]


def test_results_come_out_as_a_prefix_even_when_a_later_batch_answers_first():
    fast, slow = SimulatedEngine(), SimulatedEngine()
    exchange = _exchange(range(40), batch_size=10, in_flight=10, hedge=False)
    exchange.add_lane("slow", Channel())
    exchange.add_lane("fast", Channel())
    exchange.step(0.0)  # items 0-9 to one lane
    exchange.step(0.0)  # then 10-19 to the other (a batch per step)
    first = {lane.key: lane.shares[0].batch.start for lane in exchange.lanes}
    assert sorted(first.values()) == [0, 10]
    late_lane = next(lane for lane in exchange.lanes if first[lane.key] == 0)
    early_lane = next(lane for lane in exchange.lanes if first[lane.key] == 10)
    engines = {late_lane.key: slow, early_lane.key: fast}
    # Only the lane with items 10-19 answers: nothing may be handed out yet.
    for _ in range(50):
        pump(early_lane.channel, fast)
        assert exchange.step(0.0) == []
    assert early_lane.drained or early_lane.shares[0].batch.start != 10  # it did answer
    assert _run(exchange, engines) == list(range(40))


def test_a_failed_lane_batches_are_dealt_again_and_nothing_is_lost():
    engines = {"a": SimulatedEngine(rng=random.Random(1)), "b": SimulatedEngine(rng=random.Random(2))}
    exchange = _exchange(range(300), batch_size=10, in_flight=30)
    channels = {key: Channel() for key in engines}
    for key in engines:
        exchange.add_lane(key, channels[key])
    failed = []

    def fail_b_once(ex):
        lane = next((lane for lane in ex.lanes if lane.key == "b"), None)
        if lane is not None and not failed and lane.dealt_lines >= 50:
            failed.append(lane)
            ex.fail_lane(lane)

    assert _run(exchange, engines, on_step=fail_b_once) == list(range(300))
    assert exchange.failed_lanes == 1
    # The failed engine's channel owes nothing to anyone: its call has ended.
    assert channels["b"].current is None


def test_the_write_cutoff_drops_unsent_lines_and_ends_the_results_before_them():
    engines = {"a": SimulatedEngine(rng=random.Random(3)), "b": SimulatedEngine(rng=random.Random(4))}
    exchange = _exchange(range(1000), deadline=10.0, cutoff=1.0, batch_size=10, in_flight=40)
    for key in engines:
        exchange.add_lane(key, Channel())
    got = []
    for _ in range(30):  # some progress before the cut-off
        got += exchange.step(0.0)
        for lane in exchange.lanes:
            pump(lane.channel, engines[lane.key])
    got += _run(exchange, engines, now=9.5)  # past the cut-off, before the deadline
    assert got == list(range(len(got)))
    assert 0 < len(got) < 1000
    assert not exchange.timed_out  # everything that was sent got answered


def test_the_write_cutoff_forgets_what_a_silent_engine_never_took():
    """At the cut-off, the lines an engine has not taken are forgotten: the
    call ends, before its deadline, with the answers of the lines that
    reached an engine, up to the first forgotten one."""
    engines = {"a": SimulatedEngine(), "b": SimulatedEngine()}
    exchange = _exchange(range(100), deadline=10.0, cutoff=1.0, batch_size=10, in_flight=20,
                         hedge=False)
    lanes = {key: exchange.add_lane(key, Channel()) for key in engines}
    got = []
    for _ in range(5):  # b's engine takes nothing
        got += exchange.step(0.0)
        pump(lanes["a"].channel, engines["a"])
    first_of_b = lanes["b"].shares[0].batch.start
    for _ in range(100):
        got += exchange.step(9.5)  # past the cut-off
        if exchange.done:
            break
        pump(lanes["a"].channel, engines["a"])
    assert exchange.done and not exchange.timed_out
    assert got == list(range(first_of_b))


def test_after_the_cutoff_a_call_ends_once_its_results_are_out_not_at_its_deadline():
    """When the cut-off ends the results at a line one engine had not taken,
    what another engine still owes for later items can never be handed out:
    the call ends as soon as the results before that line are out, instead of
    holding both engines until its deadline."""
    exchange = _exchange(range(40), deadline=1.0, cutoff=0.5, batch_size=10, in_flight=10,
                         hedge=False)
    a, b = exchange.add_lane("a", Channel()), exchange.add_lane("b", Channel())
    assert exchange.step(0.0) == [] and exchange.step(0.0) == []
    assert [share.batch.start for share in a.shares] == [0]
    assert [share.batch.start for share in b.shares] == [10]
    line = len(b"|c |x 0\n")
    a.channel.write_with(lambda view: 4 * line)  # a's pipe takes 4 lines of its batch
    b.channel.write_with(len)  # b takes its whole batch, and answers nothing yet
    assert exchange.step(0.6) == []  # the cut-off: the results end at item 4
    assert not exchange.done
    a.channel.receive(b"0\n1\n2\n3\n")
    assert exchange.step(0.61) == [0, 1, 2, 3]
    assert exchange.done and not exchange.timed_out
    assert b.channel.in_flight_lines == 10  # left in flight, discarded as it arrives
    exchange.end()
    assert b.channel.stale_lines == 10


def test_the_deadline_ends_the_call_with_the_prefix_it_has():
    engine = SimulatedEngine()
    exchange = _exchange(range(100), deadline=1.0)
    exchange.add_lane("a", Channel())
    got = exchange.step(0.0)
    lane = exchange.lanes[0]
    pump(lane.channel, engine)
    got += exchange.step(2.0)
    assert exchange.done and exchange.timed_out
    assert got == list(range(len(got)))
    lanes = exchange.end()
    assert lanes == [lane] and lane.channel.current is None


def test_leftovers_of_a_timed_out_call_never_reach_the_next_call_on_that_engine():
    engine = SimulatedEngine(rng=random.Random(5))
    channel = Channel()
    first = _exchange(range(100), deadline=1.0, in_flight=60)
    first.add_lane("a", channel)
    first.step(0.0)
    pump(channel, engine)
    first.step(5.0)
    first.end()
    assert channel.stale_lines > 0
    second = _exchange(range(1000, 1100), in_flight=60)
    second.add_lane("a", channel)
    assert _run(second, {"a": engine}) == list(range(1000, 1100))


def test_a_retired_lane_is_dealt_nothing_more_and_released_when_drained():
    engines = {"a": SimulatedEngine(), "b": SimulatedEngine()}
    exchange = _exchange(range(200), batch_size=10, in_flight=20)
    for key in engines:
        exchange.add_lane(key, Channel())
    exchange.step(0.0)
    lane_b = next(lane for lane in exchange.lanes if lane.key == "b")
    dealt = lane_b.dealt_lines
    exchange.retire_lane(lane_b)
    released = []

    def release(ex):
        for lane in ex.releasable_lanes():
            ex.release_lane(lane)
            released.append(lane)

    assert _run(exchange, engines, on_step=release) == list(range(200))
    assert released == [lane_b] and lane_b.dealt_lines == dealt


def test_a_lane_that_owes_answers_and_stays_silent_is_reported_stuck():
    exchange = _exchange(range(10), idle_s=5.0)
    exchange.add_lane("a", Channel())
    exchange.step(0.0)
    lane = exchange.lanes[0]
    lane.channel.write_with(len)  # the engine took the lines and then said nothing
    assert exchange.stuck_lanes(0.0) == []
    assert exchange.stuck_lanes(4.0) == []
    assert exchange.stuck_lanes(5.0) == [lane]
    assert isinstance(exchange.idle_error(), VowpalWabbitTimeoutError)



def test_a_wait_right_after_the_first_lines_of_a_lane_ends_within_idle_s():
    """A driver that waits right after writing (no step between) calls
    note_progress first: the lane just dealt its first lines gets its idle
    clock, and the wait is bounded by idle_s even without a deadline (a
    stopped engine would otherwise hold the call forever)."""
    exchange = _exchange(range(5), idle_s=5.0)
    exchange.add_lane("a", Channel())
    exchange.step(0.0)  # deals the one batch: nothing more to deal, no deadline
    lane = exchange.lanes[0]
    lane.channel.write_with(len)
    assert exchange.wake_at() is None  # the lane's clock has not started
    exchange.note_progress(1.0)
    assert exchange.wake_at() == 6.0
    assert exchange.stuck_lanes(5.9) == []
    assert exchange.stuck_lanes(6.0) == [lane]
    # Progress restarts the clock; a lane that owes nothing has none.
    lane.channel.receive(b"0.5\n")
    exchange.note_progress(7.0)
    assert exchange.wake_at() == 12.0
    _exchange(range(10)).note_progress(0.0)  # without idle_s: nothing to do

def test_wants_lanes_while_items_are_left_and_not_after_the_cutoff():
    exchange = _exchange(range(100), deadline=1.0, cutoff=0.5, in_flight=20)
    exchange.add_lane("a", Channel())
    exchange.step(0.0)
    assert exchange.wants_lanes
    exchange.step(0.6)
    assert not exchange.wants_lanes


# ------------------------------------------------------------------ roster

def test_roster_queues_waiting_calls_in_the_order_they_came():
    roster = Roster()
    assert roster.ahead_of(None, 0.0) == 0  # nobody waits: a new call may take any engine
    first, second = roster.wait(None), roster.wait(5.0)
    assert roster.waiting == 2
    assert roster.ahead_of(first, 0.0) == 0
    assert roster.ahead_of(second, 0.0) == 1
    assert roster.ahead_of(None, 0.0) == 2  # a new call comes after both
    # a waiting call past its first_until comes first no more
    assert roster.ahead_of(None, 5.0) == 1 and roster.ahead_of(second, 5.0) == 1
    version = roster.version
    roster.stop_waiting(first)
    assert roster.version > version and roster.waiting == 1
    assert roster.ahead_of(second, 0.0) == 0 and roster.ahead_of(None, 0.0) == 1
    roster.stop_waiting(first)  # twice: no harm
    roster.stop_waiting(second)
    assert roster.waiting == 0 and roster.ahead_of(None, 0.0) == 0


def test_after_its_first_part_a_waiting_call_comes_before_calls_with_earlier_deadlines():
    roster = Roster()
    long_call = roster.wait(5.0, deadline=50.0)  # first for 5 of its 50
    assert roster.ahead_of(None, 1.0, deadline=11.0) == 1
    assert roster.ahead_of(None, 6.0, deadline=16.0) == 1  # past its part, later deadline
    assert roster.ahead_of(None, 45.0, deadline=55.0) == 0  # less time left than the caller
    assert roster.ahead_of(None, 6.0, deadline=50.0) == 1  # as much: it came first
    assert roster.ahead_of(None, 6.0) == 0  # a caller without a deadline
    short_call = roster.wait(7.0, deadline=16.0)
    assert roster.ahead_of(short_call, 8.0, deadline=16.0) == 1
    assert roster.ahead_of(long_call, 8.0, deadline=50.0) == 0
    no_deadline = roster.wait(None)
    assert roster.ahead_of(None, 100.0, deadline=200.0) == 1  # only the call without one
    roster.stop_waiting(no_deadline)


def test_roster_shares_engines_fairly_and_prefers_engines_without_leftovers():
    roster = Roster()
    slots = [roster.add(object(), 0) for _ in range(4)]
    slots[0].channel.begin().queue_lines(["|x 1"])  # a leftover in flight on slot 0
    assert roster.free(0)[-1] is slots[0]
    roster.calls = 1
    assert roster.share(0) == 4
    ticket = roster.wait(None)
    assert roster.waiting == 1
    assert roster.share(0) == 2
    assert roster.over_share(3, 0) and not roster.over_share(2, 0)
    roster.stop_waiting(ticket)
    roster.calls = 5
    assert roster.share(0) == 1
    assert not roster.over_share(1, 0)
    roster.calls = 2  # two calls running, none waiting: still an equal share each
    assert roster.over_share(3, 0) and not roster.over_share(2, 0)
    roster.calls = 1
    assert not roster.over_share(4, 0)


def test_roster_switch_closes_idle_old_engines_now_and_held_ones_on_give_back():
    roster = Roster()
    old = [roster.add(object(), 0) for _ in range(2)]
    roster.take(old[0])
    new = [roster.add(object(), 1) for _ in range(2)]
    assert roster.free(0) == [old[1]]
    closing = roster.switch(1)
    assert closing == [old[1]]
    assert roster.free(1) == new and roster.healthy(0) == 1
    assert roster.give_back(old[0]) is True  # its call ended: close it now
    assert roster.slots == new
    assert roster.give_back(new[0]) is False
    with pytest.raises(ValueError):
        roster.take(new[1]) or roster.take(new[1])


def test_roster_reports_an_engine_stuck_only_after_idle_s_of_silence_while_owing():
    roster = Roster()
    slot = roster.add(object(), 0)
    slot.note_progress(0.0)
    assert roster.stuck(100.0, 5.0) == []  # owes nothing
    slot.channel.begin().queue_lines(["|x 1"])
    slot.note_progress(1.0)
    assert roster.stuck(5.9, 5.0) == [] and roster.stuck(6.0, 5.0) == [slot]
    assert roster.stuck(6.0, None) == []
    slot.channel.receive(b"partial")  # any output is progress
    assert roster.stuck(60.0, 5.0) == []
    roster.take(slot)
    assert roster.stuck(1000.0, 0.1) == []  # a held engine is its call's business


def test_lanes_wanted_splits_only_requests_worth_it():
    from subwabbit.pool_base import SPLIT_MIN_ITEMS, lanes_wanted
    assert lanes_wanted(30, share=4, held=0) == 1
    assert lanes_wanted(SPLIT_MIN_ITEMS * 3, share=4, held=0) == 3
    assert lanes_wanted(SPLIT_MIN_ITEMS * 3, share=2, held=0) == 2
    assert lanes_wanted(SPLIT_MIN_ITEMS - 1, share=4, held=1) == 0
    assert lanes_wanted(None, share=4, held=1) == 3
    assert lanes_wanted(10000, share=2, held=2) == 0


def _run_paced(exchange, engines, every, steps, tick=1e-4):
    """Step ``exchange``, pumping each lane every ``every[key]`` steps (a lane
    pumped every third step answers at a third of the pace; ``0``: its engine
    takes the lines and answers nothing); the clock advances ``tick`` per step."""
    got = []
    for step in range(steps):
        got += exchange.step(step * tick)
        if exchange.done:
            break
        for lane in list(exchange.lanes):
            if not every[lane.key]:
                lane.channel.write_with(engines[lane.key].write)
            elif step % every[lane.key] == 0:
                pump(lane.channel, engines[lane.key])
    return got


def _answered_not_handed_out(exchange):
    return sum(len(batch.values) for batch in exchange._order) - exchange._handed


class PacedEngine(SimulatedEngine):
    """A simulated engine that answers at most ``lines`` lines per read: its
    pace is its own, whatever it is given."""

    def __init__(self, lines):
        super().__init__()
        self.lines = lines

    def read(self):
        cut = 0
        for _ in range(self.lines):
            found = self.out.find(b"\n", cut)
            if found < 0:
                break
            cut = found + 1
        data, self.out = self.out[:cut], self.out[cut:]
        return data


@pytest.mark.parametrize("pace", [True, False])
def test_a_lane_is_dealt_by_its_pace_so_a_slow_one_holds_little_back(pace):
    """One engine answers at a third of the other's pace. Dealt alike, the
    fast one races ahead of the slow one's batch and its answers wait; dealt
    by pace, the slow one gets smaller batches and fewer lines in flight."""
    engines = {"fast": PacedEngine(12), "slow": PacedEngine(4)}  # lines per step
    exchange = _exchange(range(100000), batch_size=40, in_flight=80, hedge=False)
    exchange._pace = pace
    for key in engines:
        exchange.add_lane(key, Channel())
    waiting, sizes = [], []
    give = exchange._give

    def record(lane, batch, first):
        if lane.key == "slow":
            sizes.append(len(batch.lines) - first)
        give(lane, batch, first)

    exchange._give = record
    got = []
    for step in range(3000):
        got += exchange.step(step * 1e-4)
        waiting.append(_answered_not_handed_out(exchange))
        for lane in exchange.lanes:
            pump(lane.channel, engines[lane.key])
    assert got == list(range(len(got)))
    assert len(got) > 0.95 * 16 * 3000  # both engines kept busy either way
    sizes = sizes[len(sizes) // 2:]
    late = sum(waiting[1000:]) / len(waiting[1000:])
    if pace:
        assert sizes and max(sizes) <= 40 // 2
        assert late < 30
    else:
        assert sizes and max(sizes) == 40
        assert late > 50


class StoppableEngine(PacedEngine):
    """A paced engine that, once ``stopped``, takes its lines and answers
    nothing (SIGSTOP, or starved of CPU)."""

    stopped = False

    def read(self):
        return b"" if self.stopped else super().read()


def _run_on_events(exchange, engines, on_step=None, tick=1e-4, steps=10000):
    """Step ``exchange`` as a pool's driver does: again after every pipe
    event, ``tick`` seconds apart; when no engine can move a byte or will
    answer, the driver sleeps until ``wake_at()``, or for good without one
    (then this returns)."""
    got = []
    now = 0.0
    for _ in range(steps):
        got += exchange.step(now)
        if exchange.done:
            break
        if on_step is not None:
            on_step(exchange)
        moved = False
        for lane in exchange.lanes:
            if lane.channel.write_with(engines[lane.key].write):
                moved = True
            data = engines[lane.key].read()
            if data:
                lane.channel.receive(data)
                moved = True
        if moved or any(engine.out and not engine.stopped for engine in engines.values()):
            now += tick
            continue
        wake = exchange.wake_at()
        if wake is None:
            break
        now = max(now + tick, wake)
    return got


class EveryNthRead(StoppableEngine):
    """An engine that answers everything it owes on every ``n``-th read."""

    def __init__(self, n):
        super().__init__(10 ** 9)
        self.n, self.reads = n, 0

    def read(self):
        self.reads += 1
        return super().read() if self.reads % self.n == 0 else b""


@pytest.mark.parametrize("stops_at", [None] + list(range(8, 20)))
def test_an_engine_that_stops_while_measured_fastest_holds_nothing_up(stops_at):
    """The fast engine stops (the one with the most room for its pace, and
    holding the last batch, at some of these moments): the slow one takes
    over what it holds, on the steps its own answers bring."""
    engines = {"fast": EveryNthRead(1), "slow": EveryNthRead(3)}
    exchange = _exchange(range(285), batch_size=20, in_flight=40)
    for key in engines:
        exchange.add_lane(key, Channel())
    steps = []

    def stop(ex):
        steps.append(None)
        if len(steps) == stops_at:
            engines["fast"].stopped = True

    got = _run_on_events(exchange, engines, on_step=stop)
    assert exchange.done and got == list(range(285))


def test_a_slow_lane_that_keeps_answering_is_not_dealt_a_copy():
    """A copy of a batch costs an engine's time: a lane that answers, however
    slowly, keeps its batches; only one that went quiet for two batches'
    time of the fastest lane loses them."""
    engines = {"fast": StoppableEngine(12), "slow": StoppableEngine(2)}
    exchange = _exchange(range(300), batch_size=20, in_flight=40)
    for key in engines:
        exchange.add_lane(key, Channel())
    got = _run_on_events(exchange, engines)
    assert exchange.done and got == list(range(300))
    assert exchange.hedged_lines == 0
    # two batches of the fast lane: 40 lines at about 12 per tick of 0.1 ms
    assert HEDGE_MIN_S < exchange._hedge_wait() < 0.0005


def test_no_wake_for_a_copy_that_no_lane_has_room_for():
    """Both engines stopped with every line dealt: no lane has room for a
    copy, so the call sleeps until its deadline (or a pipe event), never
    waking early for nothing."""
    engines = {"a": StoppableEngine(10), "b": StoppableEngine(10)}
    for engine in engines.values():
        engine.stopped = True
    exchange = _exchange(range(35), batch_size=10, in_flight=20, deadline=0.05)
    for key in engines:
        exchange.add_lane(key, Channel())
    for step in range(10):
        # (every line dealt before a lane is quiet long enough for a copy
        # while items are left: HEDGE_WHILE_DEALING_MIN_S)
        exchange.step(step * 0.0001)
        for lane in exchange.lanes:
            lane.channel.write_with(engines[lane.key].write)
    assert not exchange.dealing and not exchange.done
    assert sorted(lane.channel.in_flight_lines for lane in exchange.lanes) == [15, 20]
    assert exchange.wake_at() == 0.05


def test_a_lane_dealt_lines_after_owing_none_is_not_taken_for_quiet():
    """A lane that had nothing to answer for a while and is then dealt a
    failed lane's batch answers it on its next read: the batch is not
    copied to a third lane meanwhile."""
    engines = {"slow": StoppableEngine(1), "b": StoppableEngine(100),
               "c": StoppableEngine(100)}
    exchange = _exchange(range(60), batch_size=20, in_flight=40)
    lanes = {key: exchange.add_lane(key, Channel()) for key in engines}
    failed = []

    def fail_the_slow_lane_long_after_b_went_idle(ex):
        b = lanes["b"]
        if (not failed and not ex.dealing and lanes["slow"].shares and not b.shares
                and ex._now - b.answered_at > 2 * ex._hedge_wait()):
            failed.append(ex.hedged_lines)
            ex.fail_lane(lanes["slow"])

    got = _run_on_events(exchange, engines, on_step=fail_the_slow_lane_long_after_b_went_idle)
    assert failed and got == list(range(60))
    assert exchange.hedged_lines == failed[0]  # nothing copied after the failure


def test_a_retiring_lane_that_stopped_has_its_batches_taken_over():
    """A retiring lane is dealt nothing new, but what it holds may be dealt
    again to the call's other lane: the call ends once that is in."""
    engines = {"stopped": StoppableEngine(10), "other": StoppableEngine(10)}
    engines["stopped"].stopped = True
    exchange = _exchange(range(40), batch_size=10, in_flight=20)
    lanes = {key: exchange.add_lane(key, Channel()) for key in engines}

    def retire_once_all_is_dealt(ex):
        if ex.formatted == 40 and not lanes["stopped"].retiring:
            ex.retire_lane(lanes["stopped"])

    got = _run_on_events(exchange, engines, on_step=retire_once_all_is_dealt)
    assert exchange.done and got == list(range(40))
    assert lanes["stopped"].retiring and lanes["stopped"].drained
    assert exchange.hedged_lines == lanes["stopped"].dealt_lines > 0


@pytest.mark.parametrize("answering", [1, 2])
def test_once_no_item_is_left_an_idle_lane_takes_over_a_silent_lanes_batches(answering):
    engines = {"silent": SimulatedEngine()}
    engines.update((key, SimulatedEngine()) for key in "ab"[:answering])
    channels = {key: Channel() for key in engines}
    exchange = _exchange(range(100), batch_size=10, in_flight=20)
    for key in engines:
        exchange.add_lane(key, channels[key])
    every = {key: 1 for key in engines}
    every["silent"] = 0
    got = _run_paced(exchange, engines, every, 1000)
    assert exchange.done and not exchange.timed_out
    assert got == list(range(100))
    owed = channels["silent"].in_flight_lines
    assert owed >= 10 and exchange.hedged_lines >= owed
    # The copies' lanes answer them: no line reached three engines.
    for key, channel in channels.items():
        while channel.unwritten_bytes:
            channel.write_with(engines[key].write)
    seen = collections.Counter(line for engine in engines.values() for line in engine.lines_seen)
    assert set(seen.values()) <= {1, 2} and sum(seen.values()) == 100 + exchange.hedged_lines
    exchange.end()
    # What the silent engine owes goes to nobody when it answers at last.
    assert channels["silent"].stale_lines == owed
    second = _exchange(range(500, 560), batch_size=10, in_flight=20)
    second.add_lane("silent", channels["silent"])
    assert _run(second, {"silent": engines["silent"]}) == list(range(500, 560))


def test_without_hedging_a_silent_lane_holds_the_call_up():
    engines = {"a": SimulatedEngine(), "silent": SimulatedEngine()}
    exchange = _exchange(range(100), batch_size=10, in_flight=20, hedge=False)
    for key in engines:
        exchange.add_lane(key, Channel())
    got = _run_paced(exchange, engines, {"a": 1, "silent": 0}, 1000)
    assert not exchange.done and got == list(range(len(got))) and len(got) < 100


def test_a_failed_lane_whose_batch_was_hedged_is_not_dealt_again():
    engines = {"a": SimulatedEngine(), "b": SimulatedEngine()}
    exchange = _exchange(range(40), batch_size=10, in_flight=20)
    lanes = {key: exchange.add_lane(key, Channel()) for key in engines}
    # Every item is dealt, 20 lines to each engine, and nothing is answered.
    _run_paced(exchange, engines, {"a": 0, "b": 0}, 10)
    assert [lane.dealt_lines for lane in lanes.values()] == [20, 20]
    first = exchange._order[0]
    holder, other = (("a", "b") if any(share.batch is first for share in lanes["a"].shares)
                     else ("b", "a"))
    while lanes[other].channel.in_flight_lines:  # the other engine answers its two batches
        pump(lanes[other].channel, engines[other])
    got = exchange.step(1.0)  # finds no item left and deals the first batch again
    assert exchange.hedged_lines == 10 and lanes[other].dealt_lines == 30
    exchange.fail_lane(lanes[holder])
    # Only the failed engine's second batch is dealt again: its first one
    # is owed by the other engine already.
    got += _run(exchange, {other: engines[other]}, now=2.0)
    assert got == list(range(40))
    assert lanes[other].dealt_lines == 40 and exchange.failed_lanes == 1


@pytest.mark.parametrize("copy_lane", ["fails", "stops"])
def test_a_batch_is_copied_again_when_its_copy_lane_fails_or_stops_too(copy_lane):
    """"a" stops holding batches; once every item is dealt, the first of
    them is copied to another lane, whose engine then fails (or stops too):
    the third lane takes the batch over, and the call ends with every
    prediction long before its deadline."""
    engines = {key: StoppableEngine(10 ** 9) for key in "abc"}
    engines["a"].stopped = True
    exchange = _exchange(range(60), batch_size=10, in_flight=20, deadline=0.05)
    lanes = {key: exchange.add_lane(key, Channel()) for key in engines}
    copied = []

    def break_the_first_copy_lane(ex):
        if copied or not ex.hedged_lines:
            return
        copy = next(key for key, lane in lanes.items()
                    if key != "a" and lane in ex.lanes and lane.channel.in_flight_lines)
        copied.append(copy)
        if copy_lane == "fails":
            ex.fail_lane(lanes[copy])
        else:
            engines[copy].stopped = True

    got = _run_on_events(exchange, engines, on_step=break_the_first_copy_lane)
    assert copied and exchange.done and not exchange.timed_out
    assert got == list(range(60))
    assert exchange._now < 0.02


def test_a_lane_added_while_the_others_are_silent_is_dealt_at_once():
    """The call's only engine stopped with items left; a free engine joins
    the call (the roster adds it) and no pipe moves: the call wakes at once
    and deals to the new lane, rather than sleeping until its deadline."""
    engines = {"a": StoppableEngine(10 ** 9), "b": StoppableEngine(10 ** 9)}
    engines["a"].stopped = True
    exchange = _exchange(range(100), batch_size=10, in_flight=20, deadline=0.05)
    exchange.add_lane("a", Channel())
    for step in range(5):
        exchange.step(step * 1e-4)
        exchange.lanes[0].channel.write_with(engines["a"].write)
    assert exchange.wake_at() == 0.05  # one stopped lane, full: nothing to do till the end
    exchange.add_lane("b", Channel())
    assert exchange.wake_at() == exchange._now
    got = _run_on_events(exchange, engines)
    assert exchange.done and not exchange.timed_out and got == list(range(100))


def test_a_copy_wake_is_never_closer_than_an_event_loop_can_sleep():
    """A copy due in a fraction of a millisecond: the wake is set
    HEDGE_WAKE_AHEAD_S ahead (an event loop takes a closer one for "look
    again now" and would spin), and the step at it deals the copy."""
    engines = {"a": StoppableEngine(10 ** 9), "b": StoppableEngine(10 ** 9)}
    exchange = _exchange(range(35), batch_size=10, in_flight=20, deadline=0.05)
    lanes = {key: exchange.add_lane(key, Channel()) for key in engines}
    now = 0.0
    while exchange.dealing or any(lane.channel.unwritten_bytes for lane in exchange.lanes):
        exchange.step(now)
        for key, lane in lanes.items():
            lane.channel.write_with(engines[key].write)
        now += 1e-5
    engines["a"].stopped = True
    while lanes["b"].channel.in_flight_lines:  # b answers all it holds
        exchange.step(now)
        pump(lanes["b"].channel, engines["b"])
        now += 1e-5
    exchange.step(now)
    assert now < 0.001 and not exchange.dealing
    assert exchange.hedged_lines == 0 and lanes["a"].channel.in_flight_lines
    wake = exchange.wake_at()
    assert wake == pytest.approx(now + HEDGE_WAKE_AHEAD_S)
    exchange.step(wake)
    assert exchange.hedged_lines > 0


@pytest.mark.parametrize("seed", range(60))
def test_every_call_gets_a_prefix_of_its_own_answers_whatever_the_engines_do(seed):
    """Random paces, silent engines, failures, write cut-offs and deadlines:
    what a call hands out is always a prefix of its own items' answers, and
    the next call on every engine gets exactly its own."""
    rng = random.Random(seed)
    count = rng.randint(1, 400)
    keys = list(range(rng.randint(1, 4)))
    engines = {key: SimulatedEngine(rng=random.Random(seed * 10 + key)) for key in keys}
    channels = {key: Channel() for key in keys}
    deadline = rng.choice([None, rng.uniform(0.0, 0.06)])
    exchange = _exchange(range(count), deadline=deadline, batch_size=rng.randint(1, 30),
                         in_flight=rng.randint(1, 80), cutoff=rng.choice([0.0, 0.005]))
    exchange._pace = rng.random() < 0.8
    for key in keys:
        exchange.add_lane(key, channels[key])
    every = {key: rng.choice([0, 1, 1, 2, 3, 7]) for key in keys}
    if not any(every.values()):
        every[keys[0]] = 1
    failures = {key for key in keys[1:] if rng.random() < 0.3}
    # An engine may join the call, and one may be retired, as the roster does.
    join_at = rng.choice([None, rng.randint(0, 200)])
    retire_at = rng.choice([None, rng.randint(0, 200)])
    got = []
    for step in range(3000):
        got += exchange.step(step * 1e-4)
        if exchange.done:
            break
        if step == join_at:
            key = len(keys)
            keys.append(key)
            engines[key] = SimulatedEngine(rng=random.Random(seed * 10 + key))
            channels[key] = Channel()
            every[key] = rng.choice([1, 2, 5])
            exchange.add_lane(key, channels[key])
        if step == retire_at and len(exchange.lanes) > 1:
            exchange.retire_lane(rng.choice(exchange.lanes))
        for lane in exchange.releasable_lanes():
            exchange.release_lane(lane)
        for lane in list(exchange.lanes):
            if lane.key in failures and rng.random() < 0.02:
                failures.discard(lane.key)
                exchange.fail_lane(lane)
                continue
            if every[lane.key] and step % every[lane.key] == 0:
                pump(lane.channel, engines[lane.key])
    assert got == list(range(len(got)))
    if exchange.done and not exchange.timed_out and not exchange._cut_off:
        assert len(got) == count
    exchange.end()
    for key in keys:  # the engines catch up; a new call on each gets its own
        channel = channels[key]
        if channel.current is not None:
            continue
        second = _exchange(range(1000, 1050))
        second.add_lane(key, channel)
        assert _run(second, {key: engines[key]}) == list(range(1000, 1050))


def test_can_deal_now_says_whether_the_next_step_deals_without_an_answer():
    """The driver steps again instead of waiting exactly when a step would
    deal: an empty lane after another was dealt, not a full one, not after
    the write cut-off."""
    exchange = _exchange(range(100), deadline=1.0, cutoff=0.1, batch_size=10, in_flight=10)
    for key in range(2):
        exchange.add_lane(key, Channel())
    exchange.step(0.0)
    assert [lane.channel.in_flight_lines for lane in exchange.lanes] == [10, 0]
    assert exchange.can_deal_now()  # the second lane is empty
    exchange.step(0.0)
    assert [lane.channel.in_flight_lines for lane in exchange.lanes] == [10, 10]
    assert not exchange.can_deal_now()  # both full: only an answer makes room
    formatted = exchange.formatted
    exchange.step(0.0)
    assert exchange.formatted == formatted
    other = _exchange(range(100), deadline=1.0, cutoff=0.1)
    other.add_lane(0, Channel())
    other.step(0.95)  # past the write cut-off: nothing is dealt, ever
    assert not other.can_deal_now()


def _left_at_deadline(lanes, factor, deadline_steps=300, per_step=(6, 3)):
    """Lines still in flight when a call over ``lanes`` paced engines (each
    answering ``per_step`` lines per 0.1 ms step) meets its deadline, and the
    predictions it returned, with ``reach_factor`` ``factor``."""
    engines = {key: PacedEngine(per_step[key % len(per_step)]) for key in range(lanes)}
    exchange = _exchange(range(100000), batch_size=40, in_flight=120, hedge=False,
                         deadline=deadline_steps * 1e-4)
    exchange.reach_factor = factor
    for key in engines:
        exchange.add_lane(key, Channel())
    got = []
    for step in range(deadline_steps + 1):
        got += exchange.step(step * 1e-4)
        if exchange.done:
            break
        for lane in exchange.lanes:
            pump(lane.channel, engines[lane.key])
    assert exchange.done and step == deadline_steps  # (drained exactly at it, or cut)
    assert got == list(range(len(got)))
    return {lane.key: lane.channel.in_flight_lines for lane in exchange.lanes}, len(got)


def test_near_the_deadline_a_lane_of_a_split_call_holds_what_it_answers_in_time():
    """Each lane is dealt no more than it answers by the deadline at its
    pace: little is left in flight when the call ends (each lane's quarter
    batch at most, and what its last batch holds), and the call returns as
    much as when lanes are kept full to the end."""
    for lanes in (2, 3):
        full, full_got = _left_at_deadline(lanes, 0.0)
        paced, paced_got = _left_at_deadline(lanes, 1.0)
        assert sum(full.values()) >= 40 * lanes, full  # batches of 40 (20 on the slow lane)
        assert all(left <= 10 for left in paced.values()), paced  # a quarter batch at most
        assert paced_got >= full_got - 40


def test_the_deadline_limit_holds_for_a_call_on_one_lane_too():
    left, _ = _left_at_deadline(1, 1.0)
    assert left[0] <= 10, left
    assert _left_at_deadline(1, 0.0)[0][0] >= 40


def test_a_lane_deals_by_its_engines_last_pace_until_it_has_measured_its_own():
    """An engine answered at 3 lines per 0.1 ms step in its last call: the
    next call deals it, from its first batch, no more than it answers by the
    deadline (30 lines in 1 ms) instead of a whole batch of 40. A channel
    that no call measured gets the whole batch."""
    for carried, first in ((30000.0, 30), (None, 40)):
        channel = Channel()
        channel.pace = carried
        exchange = _exchange(range(1000), batch_size=40, in_flight=120, hedge=False,
                             deadline=0.001)
        lane = exchange.add_lane("a", channel)
        exchange.step(0.0)
        assert channel.in_flight_lines == first
        engine = PacedEngine(3)
        for step in range(1, 11):
            pump(channel, engine)
            exchange.step(step * 1e-4)
        assert exchange.done  # at the deadline, with nothing left that it could answer
        exchange.end()
        assert 25000 < channel.pace <= 30000  # this call's pace, for the next
        assert lane.answered >= 27


def test_a_lane_slower_than_a_quarter_batch_by_the_deadline_holds_what_it_answers():
    """An engine that answers 5 lines by the deadline (at 5,000 lines a
    second, 1 ms left) is dealt 5, and a line when it has time for less:
    kept to a quarter batch (10), it left lines that the next call on it
    waited for, and a loaded machine's calls returned nothing one in two."""
    channel = Channel()
    channel.pace = 5000.0
    exchange = _exchange(range(1000), batch_size=40, in_flight=120, hedge=False,
                         deadline=0.001)
    exchange.add_lane("a", channel)
    exchange.step(0.0)
    assert channel.in_flight_lines == 5
    late = Channel()
    late.pace = 5000.0
    exchange = _exchange(range(1000), batch_size=40, in_flight=120, hedge=False,
                         deadline=0.0001)
    exchange.add_lane("a", late)
    exchange.step(0.0)
    assert late.in_flight_lines == 1  # (half a line by the deadline)


def test_a_lane_with_a_known_pace_takes_an_infinite_deadline():
    channel = Channel()
    channel.pace = 1000.0
    exchange = _exchange(range(300), batch_size=40, in_flight=120, deadline=math.inf)
    exchange.add_lane("a", channel)
    assert _run(exchange, {"a": SimulatedEngine()}) == list(range(300))

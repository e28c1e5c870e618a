"""Schedules of the protocol core that the other fuzz tests do not make,
seeded and bounded, without processes:

* engines that print a line nobody is owed (the channel raises, and the
  lane fails without its answers, as a pool fails it on a
  :class:`~subwabbit.errors.VowpalWabbitProtocolError`), that answer with a
  line that is no prediction (the step raises; the call ends), and that die
  halfway through a line;
* single-engine exchanges (predict, train, probe, warm-up) on the pool's
  free engines between and beside split calls, ended at random points, so
  that a split lane starts on a channel another kind of call left lines on;
* a clock that the formatter moves, so that batches are cut to the
  formatter's speed and the write cut-off can come from inside a step;
* infinite and already passed deadlines, batches larger than the lines in
  flight allowed.

Every item's answer carries the item's number, so attribution is checked
exactly; the only exceptions allowed are those of the engines' misdeeds
(:class:`~subwabbit.errors.VowpalWabbitProtocolError`).
"""

import math
import random
import re

import pytest

from subwabbit.core.channel import Channel
from subwabbit.core.exchanges import (Pacing, PredictExchange, ProbeExchange, SendExchange,
                                      WarmUpExchange, new_predict_exchange)
from subwabbit.core.kinds import AdfKind
from subwabbit.core.split import SplitPredictExchange
from subwabbit.errors import VowpalWabbitProtocolError

from test_core_split_fuzz import Engine as SplitFuzzEngine, Formatter as SplitFuzzFormatter

SINGLE = re.compile(rb"^(?:1 )?(?:\|c )?\|x (\d+)(?: a+)?$")
ITEM = re.compile(rb"^\|x (\d+)(?: a+)?$")
JUNK = b"junk"


class Engine(SplitFuzzEngine):
    """Reads like vw and answers each example with its items' numbers (a
    probe with ``-1``); takes bytes at random amounts, answers ``speed``
    examples per tick (none while stalled), and is read in random pieces
    (:class:`test_core_split_fuzz.Engine`'s ``tick`` and ``read``). With
    ``garble``, an answer now and then is a line that is no prediction."""

    def __init__(self, rng, per_line, multi_line, garble):
        super().__init__(rng, per_line, multi_line)
        self.garble = garble
        #: whether it printed a line that is no prediction
        self.garbled = False

    def _answer(self, text):
        if self.garble and self.rng.random() < 0.01:
            text = JUNK
            self.garbled = True
        self.todo.append(text + b"\n" + b"\n" * (self.per_line - 1))

    def write(self, view):
        if self.dead:
            raise BrokenPipeError()
        take = self.rng.choice([0, len(view), len(view), self.rng.randint(0, len(view))])
        self.pending_in += bytes(view[:take])
        *lines, self.pending_in = self.pending_in.split(b"\n")
        for line in lines:
            if not self.multi_line:
                if not line:
                    continue  # (the end of a probe)
                if line == b"|":
                    self._answer(b"-1")
                    continue
                match = SINGLE.match(line)
                assert match, f"engine read a malformed line {line!r}"
                self._answer(match.group(1))
                continue
            if line:
                self.example.append(line)
                continue
            assert self.example, "an empty example"
            if self.example == [b"|"]:
                self._answer(b"0:-1")
            else:
                assert self.example[0] == b"shared |c", self.example
                numbers = [ITEM.match(item).group(1) for item in self.example[1:]]
                self._answer(b",".join(b"%d:%s" % pair for pair in enumerate(numbers)))
            self.example = []
        return take


class Time:
    """The clock of the run; the formatter moves it by ``cost`` per item."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Formatter(SplitFuzzFormatter):
    """test_core_split_fuzz's formatter, moving ``time`` by ``cost`` per item."""

    def __init__(self, time, cost, pad):
        super().__init__(pad)
        self.time, self.cost = time, cost

    def format_item_features(self, common_features, item_features, debug_info=None):
        self.time.now += self.cost
        return super().format_item_features(common_features, item_features, debug_info)


def make_parse(per_line):
    def parse(lines):
        assert len(lines) % per_line == 0
        for line in lines[1::per_line] if per_line > 1 else []:
            assert line == b""
        values = []
        for line in lines[0::per_line]:
            if line == JUNK:
                raise VowpalWabbitProtocolError(f"{line!r} is no prediction")
            values.append(int(line))
        return values
    return parse


class Slot:
    def __init__(self, rng, per_line, multi_line, garble):
        self.channel = Channel(outputs_per_line=per_line, multi_line=multi_line)
        self.engine = Engine(random.Random(rng.random()), per_line, multi_line, garble)
        self.holder = None


class Run:
    """One seed's pool, calls and misdeeds."""

    def __init__(self, seed):
        self.seed = seed
        rng = self.rng = random.Random(seed)
        self.multi_line = rng.random() < 0.25
        self.per_line = 2 if self.multi_line else rng.choice([1, 2, 3])
        self.kind = AdfKind() if self.multi_line else None
        self.parse = make_parse(self.per_line)
        self.garble = rng.random() < 0.3
        self.junk_p = rng.choice([0.0, 0.0, 0.002, 0.01])
        self.die_p = rng.choice([0.0, 0.001, 0.005])
        self.stall_p = rng.choice([0.003, 0.03])
        self.idle_s = rng.choice([None, 0.003, 0.02])
        self.time = Time()
        self.slots = {}
        self.next_key = 0
        for _ in range(rng.randint(1, 4)):
            self.new_slot()
        self.base = 0
        self.calls = []

    def new_slot(self):
        self.slots[self.next_key] = Slot(self.rng, self.per_line, self.multi_line, self.garble)
        self.next_key += 1

    def free(self):
        return [key for key, slot in self.slots.items() if slot.holder is None]

    def items(self, count):
        items = list(range(self.base, self.base + count))
        self.base += count + 1000
        return items

    # -------------------------------------------------------------- calls

    def deadline(self, now):
        rng = self.rng
        return rng.choice([None, math.inf, now - 0.001, now + rng.uniform(0.0002, 0.003),
                           now + rng.uniform(0.001, 0.03)])

    def start_split(self, now):
        rng = self.rng
        count = rng.randint(0, 40 if self.multi_line else 250)
        formatter = Formatter(self.time, rng.choice([0.0, 1e-6, 1e-5, 1e-4]),
                              rng.choice([0, 0, 2000]))
        kwargs = dict(kind=self.kind) if self.multi_line else dict(parse=self.parse)
        items = self.items(count)
        deadline = self.deadline(now)
        exchange = SplitPredictExchange(
            formatter=formatter, common_part="|c", common_features=None, items=items,
            debug_info=None, batch_size=rng.randint(1, 40),
            max_in_flight_lines=rng.randint(1, 60), deadline=deadline,
            write_cutoff_s=rng.choice([0.0, 0.0005, 0.002]), idle_s=self.idle_s,
            pace=rng.random() < 0.8, hedge=rng.random() < 0.8,
            clock=self.time if rng.random() < 0.7 else None,
            format_s_per_item=rng.choice([None, 0.0, 1e-5, 1e-3]), **kwargs)
        call = dict(split=True, exchange=exchange, items=items, got=[], deadline=deadline,
                    broken=False)
        free = self.free()
        rng.shuffle(free)
        wanted = rng.randint(1, max(1, len(free)))
        if exchange.max_lanes is not None:
            wanted = min(wanted, exchange.max_lanes)
        for key in free[:wanted]:
            exchange.add_lane(key, self.slots[key].channel)
            self.slots[key].holder = call
        self.calls.append(call)

    def start_solo(self, now):
        rng = self.rng
        free = self.free()
        if not free:
            return
        key = rng.choice(free)
        slot = self.slots[key]
        channel = slot.channel
        what = rng.choice(["predict", "predict", "train", "probe", "warm"])
        if self.multi_line and what == "warm":
            what = "predict"
        items = self.items(rng.randint(1, 60))
        deadline = self.deadline(now)
        if deadline is not None and math.isinf(deadline):
            deadline = None
        call = channel.begin(keep=what != "train")
        expect = None
        if what == "predict":
            hard = rng.random() < 0.7
            pacing = Pacing(batch_size=rng.randint(1, 20),
                            max_in_flight_lines=rng.randint(1, 40),
                            min_batch=rng.choice([1, 5]),
                            write_cutoff_s=rng.choice([0.0, 0.002]), hard_deadline=hard,
                            max_lateness_s=rng.choice([None, 0.001]),
                            lines_at_deadline=rng.choice([None, 5]),
                            reach_at_deadline=rng.random() < 0.3)
            settings = dict(formatter=Formatter(self.time, rng.choice([0.0, 1e-5]), 0),
                            common_part="|c", common_features=None, items=items,
                            debug_info=None, pacing=pacing, deadline=deadline, idle_s=None,
                            clock=self.time if rng.random() < 0.5 else None)
            if self.multi_line:
                exchange = new_predict_exchange(channel, call, kind=self.kind, **settings)
            else:
                exchange = PredictExchange(channel, call, parse=self.parse, **settings)
            expect = items
        elif what == "train":
            lines = (["shared |c"] + [f"|x {n}" for n in items] if self.multi_line
                     else [f"1 |x {n}" for n in items])
            exchange = SendExchange(channel, call, lines, None)
        elif what == "probe":
            exchange = ProbeExchange(channel, call, deadline, None, probes=rng.randint(1, 3))
        else:
            exchange = WarmUpExchange(channel, call, deadline, [f"|x {n}" for n in items],
                                      rounds=rng.randint(1, 3),
                                      largest_chunk=rng.randint(0, 10))
        solo = dict(split=False, exchange=exchange, items=expect, got=[], key=key,
                    deadline=deadline, broken=False, steps=0)
        slot.holder = solo
        self.calls.append(solo)

    def finish(self, call):
        exchange = call["exchange"]
        done = exchange.done and not exchange.timed_out
        if call["split"]:
            for lane in exchange.end():
                if lane.key in self.slots:
                    self.slots[lane.key].holder = None
        else:
            exchange.end()
            if call["key"] in self.slots:
                self.slots[call["key"]].holder = None
        self.calls.remove(call)
        complete = (done and not call["broken"] and call["items"] is not None
                    and call["deadline"] is None
                    and not getattr(exchange, "_cut_off", False))
        if complete:
            assert len(call["got"]) == len(call["items"]), (
                self.seed, len(call["got"]), len(call["items"]))

    def kill(self, key):
        """The engine of ``key`` is gone: a new one takes its place."""
        self.slots[key].engine.dead = True
        del self.slots[key]
        self.new_slot()

    def fail_lane(self, call, lane, keep_answers):
        """Fail ``lane`` as a pool does; ``False`` when that ended the call."""
        try:
            call["exchange"].fail_lane(lane, keep_answers=keep_answers)
        except VowpalWabbitProtocolError:
            # the answers it printed before it failed are no predictions:
            # the call raises (as a pool's does)
            assert keep_answers and self.slots[lane.key].engine.garbled
            self.kill(lane.key)
            call["broken"] = True
            self.finish(call)
            return False
        self.kill(lane.key)
        return True

    def step(self, call, now):
        exchange = call["exchange"]
        engines_garbled = any(slot.engine.garbled for slot in self.slots.values())
        try:
            results = exchange.step(now)
        except VowpalWabbitProtocolError:
            assert engines_garbled, "a protocol error from engines that printed no junk"
            if call["split"]:
                lane = exchange.unparsable_lane
                assert lane is not None and lane in exchange.lanes
                self.fail_lane(call, lane, keep_answers=False)
            else:
                self.kill(call["key"])
            call["broken"] = True
            self.finish(call)
            return
        if call["items"] is not None:
            call["got"] += results
            got, items = call["got"], call["items"]
            assert got == items[:len(got)], (self.seed, got[:30], items[:30])
        if exchange.end_at is not None and now >= exchange.end_at:
            assert exchange.done, "a call went on past its deadline"
        if exchange.done or self.rng.random() < 0.003:
            self.finish(call)
            return
        if call["split"]:
            self.change_lanes(call, now)

    def change_lanes(self, call, now):
        rng, exchange = self.rng, call["exchange"]
        for lane in exchange.releasable_lanes():
            exchange.release_lane(lane)
            self.slots[lane.key].holder = None
        for lane in exchange.stuck_lanes(now):
            if not self.fail_lane(call, lane, keep_answers=True):
                return
        if exchange.lanes and rng.random() < 0.02:
            exchange.retire_lane(rng.choice(exchange.lanes))
        free = self.free()
        limit = exchange.max_lanes
        if free and exchange.wants_lanes and (limit is None or len(exchange.lanes) < limit):
            if not exchange.lanes or rng.random() < 0.2:
                key = rng.choice(free)
                exchange.add_lane(key, self.slots[key].channel)
                self.slots[key].holder = call

    # -------------------------------------------------------------- pipes

    def lane_of(self, call, key):
        return next(lane for lane in call["exchange"].lanes if lane.key == key)

    def misdeed(self, key, keep_answers):
        """The engine of ``key`` failed: its holder learns it, it is replaced."""
        holder = self.slots[key].holder
        if holder is None:
            self.kill(key)
        elif holder["split"]:
            self.fail_lane(holder, self.lane_of(holder, key), keep_answers)
        else:
            self.kill(key)
            holder["broken"] = True
            self.finish(holder)

    def pump(self, now):
        rng = self.rng
        for key in list(self.slots):
            slot = self.slots.get(key)
            if slot is None:
                continue
            channel, engine = slot.channel, slot.engine
            try:
                channel.write_with(engine.write)
            except BrokenPipeError:
                pass
            engine.tick(now)
            if rng.random() < self.die_p:
                # it dies: what it printed, up to anywhere in a line, is read first
                cut = rng.randint(0, len(engine.out))
                if cut:
                    channel.receive(engine.out[:cut])
                self.misdeed(key, keep_answers=True)
                continue
            data = engine.read()
            if data:
                channel.receive(data)
            if (not channel.in_flight_lines and not engine.out and not engine.todo
                    and rng.random() < self.junk_p):
                # a line where no answer is owed: the channel refuses it
                with pytest.raises(VowpalWabbitProtocolError):
                    channel.receive(b"7\n")
                self.misdeed(key, keep_answers=False)
            assert 0 <= channel.stale_lines <= channel.in_flight_lines, channel

    # ---------------------------------------------------------------- run

    def run(self):
        rng = self.rng
        total = rng.randint(2, 10)
        started = 0
        for _ in range(30000):
            now = self.time.now
            if started < total and (not self.calls or (len(self.calls) < 4
                                                       and rng.random() < 0.05)):
                started += 1
                if rng.random() < 0.6:
                    self.start_split(now)
                else:
                    self.start_solo(now)
            for call in list(self.calls):
                if call in self.calls:
                    self.step(call, now)
            for slot in self.slots.values():
                if rng.random() < self.stall_p and (self.idle_s is not None
                                                    or rng.random() < 0.5):
                    slot.engine.stall_until = now + rng.choice([0.001, 0.01])
            self.pump(now)
            self.time.now += rng.choice([1e-5, 1e-4, 1e-4, 5e-4])
            if started == total and not self.calls:
                break
        else:
            raise AssertionError(f"seed {self.seed}: calls did not finish")
        # the engines catch up: every channel ends owing nothing
        self.die_p = self.junk_p = 0.0
        for _ in range(100000):
            if all(not slot.channel.in_flight_lines and not slot.channel.unwritten_bytes
                   for slot in self.slots.values()):
                break
            for slot in self.slots.values():
                slot.engine.stall_until = -1
            self.pump(self.time.now)
            self.time.now += 1e-4
        for slot in self.slots.values():
            channel = slot.channel
            assert channel.in_flight_lines == 0 and channel.stale_lines == 0, channel
            assert channel.current is None or not channel.current.active


@pytest.mark.parametrize("seed", range(300))
def test_fuzz_misdeeds_mixed_calls_and_a_moving_clock(seed):
    Run(seed).run()

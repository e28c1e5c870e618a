"""Adversarial fuzz of the split core: several concurrent calls sharing a pool
of simulated engines; random partial writes, reads split mid-line, engines
that stall, stop or fail, lanes added / retired / released / failed mid-call,
write cut-offs and deadlines, callers that abandon a call. Every item's
answer encodes the item's global index, so attribution is checked exactly."""

import random
import re

import pytest

from subwabbit.core.channel import Channel
from subwabbit.core.kinds import AdfKind
from subwabbit.core.split import SplitPredictExchange

LINE = re.compile(rb"^\|c \|x (\d+)(?: a+)?$")
ITEM = re.compile(rb"^\|x (\d+)(?: a+)?$")
SHARED = b"shared |c"


class Engine:
    """Reads like vw; answers each example with its item numbers. Bytes are
    taken at random amounts; answers are computed ``speed`` lines per tick
    (0: stalled) and readable in random pieces."""

    def __init__(self, rng, per_line, multi_line):
        self.rng = rng
        self.per_line = per_line
        self.multi_line = multi_line
        self.pending_in = b""
        self.todo = []        # answers computed on demand
        self.out = b""
        self.example = []
        self.speed = rng.choice([1, 1, 2, 5, 20])
        self.stall_until = -1.0
        self.dead = False

    def write(self, view):
        if self.dead:
            raise BrokenPipeError()
        take = self.rng.choice([0, len(view), len(view), self.rng.randint(0, len(view))])
        self.pending_in += bytes(view[:take])
        *lines, self.pending_in = self.pending_in.split(b"\n")
        for line in lines:
            if not self.multi_line:
                match = LINE.match(line)
                assert match, f"engine read a malformed line {line!r}"
                n = match.group(1)
                self.todo.append(n + b"\n" + b"\n" * (self.per_line - 1))
                continue
            if line:
                if not self.example:
                    assert line == SHARED, f"example without its shared line: {line!r}"
                else:
                    assert ITEM.match(line), f"engine read a malformed line {line!r}"
                self.example.append(line)
            else:
                assert self.example, "an empty example"
                items = [ITEM.match(item).group(1) for item in self.example[1:]]
                answer = b",".join(b"%d:%s" % (i, n) for i, n in enumerate(items))
                self.todo.append(answer + b"\n" + b"\n" * (self.per_line - 1))
                self.example = []
        return take

    def tick(self, now):
        if self.dead or now < self.stall_until:
            return
        for _ in range(min(self.speed, len(self.todo))):
            self.out += self.todo.pop(0)

    def read(self):
        if self.dead or not self.out:
            return b""
        take = self.rng.randint(0, len(self.out))
        data, self.out = self.out[:take], self.out[take:]
        return data

    @property
    def idle(self):
        return not self.todo and not self.out and not self.pending_in


class Formatter:
    def __init__(self, pad=0):
        self.pad = pad

    def format_common_features(self, common_features, debug_info=None):
        return "|c"

    def format_item_features(self, common_features, item_features, debug_info=None):
        if self.pad:
            return f"|x {item_features} " + "a" * (self.pad + item_features % 7)
        return f"|x {item_features}"


def make_parse(per_line):
    def parse(lines):
        assert len(lines) % per_line == 0
        for line in lines[1::per_line] if per_line > 1 else []:
            assert line == b""
        return [int(line) for line in lines[0::per_line]]
    return parse


class Pool:
    def __init__(self, rng, size, per_line, multi_line):
        self.rng = rng
        self.per_line = per_line
        self.multi_line = multi_line
        self.slots = {}
        self.holder = {}
        self.next_key = 0
        for _ in range(size):
            self.new_slot()

    def new_slot(self):
        key = self.next_key
        self.next_key += 1
        self.slots[key] = (Channel(outputs_per_line=self.per_line, multi_line=self.multi_line),
                           Engine(random.Random(self.rng.random()), self.per_line,
                                  self.multi_line))
        self.holder[key] = None
        return key

    def free(self):
        return [key for key, held in self.holder.items() if held is None]

    def pump(self, now):
        for key, (channel, engine) in list(self.slots.items()):
            if engine.dead:
                continue
            try:
                channel.write_with(engine.write)
            except BrokenPipeError:
                pass
            engine.tick(now)
            data = engine.read()
            if data:
                channel.receive(data)


class CallState:
    def __init__(self, exchange, base, count, deadline, cutoff):
        self.exchange = exchange
        self.base = base
        self.count = count
        self.got = []
        self.deadline = deadline
        self.cutoff = cutoff
        self.abandoned = False


def run_seed(seed, multi_line=False, hedgy=False):
    rng = random.Random(seed)
    per_line = 2 if multi_line else rng.choice([1, 1, 2, 3])
    pool = Pool(rng, rng.randint(1, 5), per_line, multi_line)
    kind = AdfKind() if multi_line else None
    idle_s = rng.choice([None, None, 0.003, 0.02])
    now = 0.0
    base = 0
    calls = []
    finished = 0
    total_calls = rng.randint(1, 6)
    pad = rng.choice([0, 0, 0, 1500, 3000])
    fail_p = rng.choice([0.0, 0.01, 0.05])
    retire_p = rng.choice([0.0, 0.01, 0.05])
    stall_p = rng.choice([0.003, 0.03, 0.1])
    add_p = rng.choice([0.05, 0.3])
    started = 0
    for tick in range(20000):
        # start calls (possibly concurrent)
        if started < total_calls and (not calls or (len(calls) < 3 and rng.random() < 0.05)):
            count = rng.randint(0 if rng.random() < 0.05 else 1, 300 if not multi_line else 40)
            deadline = rng.choice([None, now + rng.uniform(0.0005, 0.05)])
            if hedgy:
                count = rng.randint(1, 60)
                deadline = now + rng.uniform(0.001, 0.01)
            cutoff = rng.choice([0.0, 0.0, 0.001, 0.005])
            if hedgy:
                cutoff = rng.uniform(0.0, 0.004)
            kwargs = dict(kind=kind) if multi_line else dict(parse=make_parse(per_line))
            exchange = SplitPredictExchange(
                formatter=Formatter(pad), common_part="|c", common_features=None,
                items=range(base, base + count), debug_info=None,
                batch_size=rng.randint(1, 30), max_in_flight_lines=rng.randint(1, 80),
                deadline=deadline, write_cutoff_s=cutoff, idle_s=idle_s,
                pace=rng.random() < 0.8, hedge=hedgy or rng.random() < 0.85, **kwargs)
            call = CallState(exchange, base, count, deadline, cutoff)
            base += count + 1000
            calls.append(call)
            started += 1
            free = pool.free()
            rng.shuffle(free)
            wanted = rng.randint(1, max(1, len(free)))
            if exchange.max_lanes is not None:
                wanted = min(wanted, exchange.max_lanes)
            for key in free[:wanted]:
                exchange.add_lane(key, pool.slots[key][0])
                pool.holder[key] = call
        for call in list(calls):
            exchange = call.exchange
            results = exchange.step(now)
            call.got += results
            assert call.got == list(range(call.base, call.base + len(call.got))), (
                seed, call.got[:50])
            if exchange.end_at is not None and now >= exchange.end_at:
                assert exchange.done, "a call went on past its deadline"
            if not exchange.done and rng.random() < 0.002:
                call.abandoned = True
                exchange.done = True
            if exchange.done:
                for lane in exchange.end():
                    pool.holder[lane.key] = None
                calls.remove(call)
                finished += 1
                if not call.abandoned and not exchange.timed_out and not exchange._cut_off:
                    assert len(call.got) == call.count, (seed, len(call.got), call.count)
                if call.deadline is None and call.cutoff == 0.0 and not call.abandoned:
                    assert len(call.got) == call.count or exchange.timed_out
                continue
            # lane changes
            for lane in exchange.releasable_lanes():
                exchange.release_lane(lane)
                pool.holder[lane.key] = None
            if idle_s is not None:
                for lane in exchange.stuck_lanes(now):
                    exchange.fail_lane(lane)
                    pool.slots[lane.key][1].dead = True
                    del pool.slots[lane.key]
                    del pool.holder[lane.key]
                    pool.new_slot()
            if exchange.lanes and rng.random() < fail_p:
                lane = rng.choice(exchange.lanes)
                exchange.fail_lane(lane)
                pool.slots[lane.key][1].dead = True
                del pool.slots[lane.key]
                del pool.holder[lane.key]
                pool.new_slot()
            if exchange.lanes and rng.random() < retire_p:
                exchange.retire_lane(rng.choice(exchange.lanes))
            free = pool.free()
            limit = exchange.max_lanes
            if free and exchange.wants_lanes and (limit is None or len(exchange.lanes) < limit):
                if not exchange.lanes or rng.random() < add_p:
                    key = rng.choice(free)
                    exchange.add_lane(key, pool.slots[key][0])
                    pool.holder[key] = call
        # engines misbehave now and then
        for key, (channel, engine) in pool.slots.items():
            if rng.random() < stall_p:
                # stall: forever only if something will notice
                if idle_s is not None or rng.random() < 0.5:
                    engine.stall_until = now + rng.choice([0.001, 0.01, 0.1])
        pool.pump(now)
        now += rng.choice([1e-5, 1e-4, 1e-4, 5e-4])
        if started == total_calls and not calls:
            break
    else:
        raise AssertionError(f"seed {seed}: calls did not finish: "
                             f"{[(c.count, len(c.got), c.deadline) for c in calls]}")
    # the engines catch up: every channel ends owing nothing
    for _ in range(100000):
        if all(channel.in_flight_lines == 0 and channel.unwritten_bytes == 0
               for channel, _ in pool.slots.values()):
            break
        for _, engine in pool.slots.values():
            engine.stall_until = -1
        pool.pump(now)
        now += 1e-4
    for channel, engine in pool.slots.values():
        assert channel.in_flight_lines == 0 and channel.stale_lines == 0, channel
        assert channel.current is None


@pytest.mark.parametrize("seed", range(300))
def test_fuzz_single_line(seed):
    run_seed(seed)


@pytest.mark.parametrize("seed", range(100))
def test_fuzz_multi_line(seed):
    run_seed(seed, multi_line=True)


@pytest.mark.parametrize("seed", range(200))
def test_fuzz_hedges_near_the_cutoff(seed):
    run_seed(seed, hedgy=True)

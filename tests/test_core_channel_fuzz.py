"""Mixed single-engine exchanges (predict, multi-line predict, train, probe,
warm-up, clean-up, one-lane split) in random order on one channel, each
ended at a random point: every predict call gets a prefix of its own items."""

import random
import re

import pytest

from subwabbit.core.channel import Channel
from subwabbit.core.exchanges import (CleanupExchange, Pacing, PredictExchange, ProbeExchange,
                                      SendExchange, WarmUpExchange, new_predict_exchange)
from subwabbit.core.kinds import AdfKind
from subwabbit.core.split import SplitPredictExchange

ITEM = re.compile(rb"^(?:\|c )?\|x (\d+)(?: a+)?$")
TRAIN = re.compile(rb"^1 \|x (\d+)$")


class Engine:
    def __init__(self, rng, per_line, multi_line):
        self.rng, self.per_line, self.multi_line = rng, per_line, multi_line
        self.pending_in = b""
        self.out = b""
        self.example = []

    def _emit(self, answer):
        self.out += answer + b"\n" + b"\n" * (self.per_line - 1)

    def write(self, view):
        take = self.rng.choice([0, len(view), self.rng.randint(0, len(view))])
        self.pending_in += bytes(view[:take])
        *lines, self.pending_in = self.pending_in.split(b"\n")
        for line in lines:
            if line.startswith(b"save"):
                assert not self.example
                continue
            if not self.multi_line:
                if not line:
                    continue
                if line == b"|":
                    self._emit(b"p")
                    continue
                match = ITEM.match(line) or TRAIN.match(line)
                assert match, f"malformed line {line!r}"
                self._emit(match.group(1))
                continue
            if line:
                self.example.append(line)
                continue
            assert self.example
            if self.example == [b"|"]:
                self._emit(b"0:0")  # a probe: one featureless item
            else:
                assert self.example[0].startswith(b"shared"), self.example
                nums = [ITEM.match(item).group(1) for item in self.example[1:]]
                self._emit(b",".join(b"%d:%s" % (i, n) for i, n in enumerate(nums)))
            self.example = []
        return take

    def read(self):
        take = self.rng.randint(0, len(self.out))
        data, self.out = self.out[:take], self.out[take:]
        return data


class Formatter:
    def format_common_features(self, common_features, debug_info=None):
        return "|c"

    def format_item_features(self, common_features, item_features, debug_info=None):
        return f"|x {item_features}"


def _parse(per_line):
    def parse(lines):
        return [int(line) for line in lines[0::per_line]]
    return parse


def run(seed):
    rng = random.Random(seed)
    multi = rng.random() < 0.3
    per_line = 2 if multi else rng.choice([1, 1, 2, 3])
    channel = Channel(outputs_per_line=per_line, multi_line=multi)
    engine = Engine(random.Random(seed + 1), per_line, multi)
    kind = AdfKind() if multi else None
    base = 0
    now = 0.0
    for _ in range(25):
        what = rng.choice(["predict", "predict", "split", "train", "probe", "warm", "clean"])
        if multi and what in ("warm",):
            what = "predict"
        count = rng.randint(1, 60)
        items = list(range(base, base + count))
        base += count + 100
        deadline = rng.choice([None, now + rng.uniform(0.0, 0.01)])
        call = channel.begin(keep=what != "train")
        expect = None
        if what == "predict":
            hard = rng.random() < 0.7
            pacing = Pacing(batch_size=rng.randint(1, 20), max_in_flight_lines=rng.randint(1, 40),
                            min_batch=rng.choice([1, 5]),
                            write_cutoff_s=rng.choice([0.0, 0.002]), hard_deadline=hard,
                            max_lateness_s=rng.choice([None, 0.001]),
                            lines_at_deadline=rng.choice([None, 5]),
                            reach_at_deadline=rng.random() < 0.3)
            if multi:
                exchange = new_predict_exchange(
                    channel, call, kind=kind, formatter=Formatter(), common_part="|c",
                    common_features=None, items=items, debug_info=None, pacing=pacing,
                    deadline=deadline, idle_s=None)
            else:
                exchange = PredictExchange(
                    channel, call, formatter=Formatter(), common_part="|c",
                    common_features=None, items=items, debug_info=None,
                    parse=_parse(per_line), pacing=pacing, deadline=deadline, idle_s=None)
            expect = items
        elif what == "split":
            channel.end(call)
            exchange = SplitPredictExchange(
                formatter=Formatter(), common_part="|c", common_features=None, items=items,
                debug_info=None, batch_size=rng.randint(1, 20),
                max_in_flight_lines=rng.randint(1, 40), deadline=deadline,
                write_cutoff_s=rng.choice([0.0, 0.002]),
                **(dict(kind=kind) if multi else dict(parse=_parse(per_line))))
            exchange.add_lane("k", channel)
            expect = items
        elif what == "train":
            if multi:
                lines = ["shared |c"] + [f"|x {n}" for n in items]
            else:
                lines = [f"1 |x {n}" for n in items]
            exchange = SendExchange(channel, call, lines, None)
        elif what == "probe":
            exchange = ProbeExchange(channel, call, deadline, None,
                                     control=rng.choice([None, b"save_m\n"]),
                                     probes=rng.randint(1, 3))
        elif what == "warm":
            exchange = WarmUpExchange(channel, call, deadline, [f"|x {n}" for n in items],
                                      rounds=rng.randint(1, 3),
                                      largest_chunk=rng.randint(0, 10))
        else:
            exchange = CleanupExchange(channel, call, deadline, None)
        got = []
        abandon_after = rng.choice([None, rng.randint(0, 50)])
        for step in range(5000):
            results = exchange.step(now)
            if expect is not None:
                got += results
                assert got == expect[:len(got)], (seed, what, got[:20], expect[:20])
            if exchange.done or step == abandon_after:
                break
            channel.write_with(engine.write)
            data = engine.read()
            if data:
                channel.receive(data)
            now += rng.choice([1e-5, 1e-4, 5e-4])
        else:
            raise AssertionError(f"seed {seed}: {what} did not finish")
        if expect is not None and exchange.done and not exchange.timed_out and deadline is None:
            assert len(got) == count, (seed, what, len(got), count)
        exchange.end()
    # drain
    for _ in range(100000):
        if not channel.in_flight_lines and not channel.unwritten_bytes:
            break
        channel.write_with(engine.write)
        data = engine.read()
        if data:
            channel.receive(data)
    assert channel.in_flight_lines == 0 and channel.stale_lines == 0
    assert not engine.out and not engine.pending_in and not engine.example


@pytest.mark.parametrize("seed", range(400))
def test_mixed_exchanges_on_one_channel(seed):
    run(seed)

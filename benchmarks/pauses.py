"""How long the machine itself stops a process.

A virtual machine's vCPU can be paused by its host, and a kernel can keep a
running task off its CPU for its own work. Neither shows in a client's code,
but both make a call late. :func:`machine_pauses` spins on the clock with
nothing else of the benchmark running and records every gap between two
readings: on a quiet dedicated machine they stay in the microseconds.
:func:`sleep_overshoot` measures how late a thread that sleeps in ``select``
wakes up.

Run: ``python -m benchmarks.pauses [--seconds S]``.
"""

import argparse
import select
import time
from typing import Any, Dict, List

from .report import nearest_rank


def machine_pauses(seconds: float, threshold_s: float = 0.0002) -> Dict[str, Any]:
    """Spin for ``seconds`` and collect the gaps between clock readings.

    :returns: the number of gaps over 0.5 ms and over 1 ms, the longest ten
        (ms), and the spin's length
    """
    clock = time.perf_counter
    gaps = []
    last = started = clock()
    end = started + seconds
    while last < end:
        now = clock()
        if now - last > threshold_s:
            gaps.append(now - last)
        last = now
    gaps_ms = sorted(gap * 1000 for gap in gaps)
    return {"seconds": seconds,
            "over_0.5ms": sum(gap > 0.5 for gap in gaps_ms),
            "over_1ms": sum(gap > 1.0 for gap in gaps_ms),
            "longest_ms": [round(gap, 3) for gap in gaps_ms[-10:]],
            "method": "one busy loop reading time.perf_counter(); gaps between consecutive "
                      "readings"}


def sleep_overshoot(seconds: float, sleep_s: float = 0.001) -> Dict[str, Any]:
    """Sleep ``sleep_s`` at a time in ``select`` for ``seconds`` and collect how
    late each sleep ends.

    :returns: the number of sleeps, quantiles of the overshoot (ms) and how
        many overshot by more than 0.5 ms
    """
    clock = time.perf_counter
    late: List[float] = []
    end = clock() + seconds
    while clock() < end:
        began = clock()
        select.select([], [], [], sleep_s)
        late.append((clock() - began - sleep_s) * 1000)
    late.sort()

    def quantile(point: float) -> float:
        return round(nearest_rank(late, point), 3)

    return {"sleeps": len(late), "sleep_ms": sleep_s * 1000, "p50_ms": quantile(0.5),
            "p99_ms": quantile(0.99), "p99.9_ms": quantile(0.999), "max_ms": round(late[-1], 3),
            "over_0.5ms": sum(value > 0.5 for value in late)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="seconds of each measurement (default 20)")
    options = parser.parse_args()
    pauses = machine_pauses(options.seconds)
    print(f"busy loop, {options.seconds:g} s: {pauses['over_0.5ms']} pauses over 0.5 ms, "
          f"{pauses['over_1ms']} over 1 ms; longest (ms): {pauses['longest_ms']}")
    sleeps = sleep_overshoot(options.seconds)
    print(f"{sleeps['sleeps']} sleeps of {sleeps['sleep_ms']:g} ms in select: late by "
          f"p50 {sleeps['p50_ms']} ms, p99 {sleeps['p99_ms']} ms, p99.9 {sleeps['p99.9_ms']} ms, "
          f"max {sleeps['max_ms']} ms; {sleeps['over_0.5ms']} late by over 0.5 ms")


if __name__ == "__main__":
    main()

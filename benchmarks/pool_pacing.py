"""How much a pool keeps in flight near a deadline, and how far below the
caller its engines run, compared side by side.

Run: ``python -m benchmarks.pool_pacing [--items N] [--requests N]
[--turns N] [--calls N] [--warm-up N] [--size N] [--timeout S]
[--nice N ...] [--json PATH] [FACTOR ...]``. Each FACTOR is a value of
:attr:`subwabbit.core.split.SplitPredictExchange.reach_factor`: near the
deadline of a call dealt to several engines, an engine holds at most what it
answers at its pace in that fraction of the time left; ``0`` lets it hold
``max_pending_lines`` until the write cut-off. Default: ``0 1``.

One pool serves every factor, in turns of ``--calls`` back-to-back calls
(the first ``--warm-up`` of a turn unmeasured: they meet what the other
factor left in flight), the order of the factors reversed at every turn, so
that every factor meets the same engines, the same warm caches and the same
spells of a noisy machine: differences of a few percent, which separate
pools cannot show on a shared virtual machine, show here.

``--nice N ...`` compares instead the nice values of a pool's engines above
the caller's (each engine ``SCHED_BATCH``, as
:func:`~subwabbit.engine_group.lower_priority` runs them; the default is
:data:`~subwabbit.engine_group.LOW_PRIORITY_NICE`) at the default factor:
one pool per value (a process may raise its children's nice values, not
lower them back), all open at once and served in the same alternating
turns; the pools not in their turn sleep.

Prints, per setting, the mean and median predictions per call, the lines the
engines read per call (the bytes they read, ``/proc/PID/io``, over the mean
length of a line: lines read beyond those returned were answered too late,
or held back behind a slower engine's batch), the wall time (p99, max, and
the calls more than 0.5 ms late); then each setting's mean against the
first's.
"""

import argparse
import contextlib
import gc
import json
import os
import statistics
import tempfile
import time
from typing import Any, Dict, List, Optional

from subwabbit import VowpalWabbitPool
from subwabbit.core.split import SplitPredictExchange
from subwabbit.engine_process import threads_of

from .pool_cpu import bytes_read
from .report import nearest_rank
from .turns import train_model
from .workload import RecommenderFormatter, Workload, prediction_args


class _Setting:
    """One compared setting: its label, the pool that serves its turns, and
    what is set before each turn."""

    def __init__(self, label: str, pool: VowpalWabbitPool, factor: float) -> None:
        self.label = label
        self.pool = pool
        self.factor = factor
        self.calls: List[int] = []
        self.walls: List[float] = []
        self.lines_read = 0.0


def set_engines_nice(pool: VowpalWabbitPool, nice: int) -> None:
    """Run every thread of the pool's engines ``SCHED_BATCH`` at ``nice``
    steps above this process's nice value (raising only: see the module's text)."""
    target = min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    for pid in pool.engine_pids():
        for tid in threads_of(pid):
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, target)


def _open_pools(stack: contextlib.ExitStack, options: argparse.Namespace,
                formatter: RecommenderFormatter, model: str) -> List[_Setting]:
    args = prediction_args(model)
    if options.nice is None:
        pool = stack.enter_context(VowpalWabbitPool(formatter, args, size=options.size))
        return [_Setting(str(factor), pool, factor) for factor in options.factors]
    settings = []
    for nice in options.nice:
        pool = stack.enter_context(VowpalWabbitPool(formatter, args, size=options.size,
                                                    low_priority_engines=False))
        set_engines_nice(pool, nice)
        settings.append(_Setting(f"nice {nice}", pool, SplitPredictExchange.reach_factor))
    return settings


def compare(options: argparse.Namespace) -> Dict[str, Any]:
    """Every setting's calls, in alternating turns."""
    workload = Workload(options.requests, options.items)
    formatter = RecommenderFormatter()
    saved = SplitPredictExchange.reach_factor
    with tempfile.TemporaryDirectory() as directory, contextlib.ExitStack() as stack:
        model = os.path.join(directory, "model.vw")
        train_model(workload, model)
        sample = formatter.lines(workload.requests[0], workload.candidates[0])
        line_bytes = sum(len(line) + 1 for line in sample) / len(sample)
        settings = _open_pools(stack, options, formatter, model)
        size = settings[0].pool.size
        gc.collect()
        gc.freeze()  # as the main benchmark does and a service should
        enabled = gc.isenabled()
        gc.disable()
        try:
            call = 0
            for turn in range(options.turns):
                for setting in (settings if turn % 2 == 0 else settings[::-1]):
                    SplitPredictExchange.reach_factor = setting.factor
                    pool, pids = setting.pool, setting.pool.engine_pids()
                    for place in range(options.warm_up + options.calls):
                        index = call % len(workload)
                        call += 1
                        before = sum(map(bytes_read, pids))
                        start = time.perf_counter()
                        got = pool.predict(workload.requests[index], workload.candidates[index],
                                           timeout=options.timeout)
                        wall = time.perf_counter() - start
                        if place >= options.warm_up:
                            setting.calls.append(len(got))
                            setting.walls.append(wall)
                            setting.lines_read += (sum(map(bytes_read, pids))
                                                   - before) / line_bytes
        finally:
            SplitPredictExchange.reach_factor = saved
            if enabled:
                gc.enable()
    first = statistics.mean(settings[0].calls)
    results = {}
    for setting in settings:
        counts, times = setting.calls, sorted(setting.walls)
        results[setting.label] = {
            "calls": len(counts),
            "mean_predictions": statistics.mean(counts),
            "median_predictions": statistics.median(counts),
            "lines_read_per_call": setting.lines_read / len(counts),
            "wall_ms_p99": nearest_rank(times, 0.99) * 1e3,
            "wall_ms_max": times[-1] * 1e3,
            "late_calls": sum(1 for wall in times if wall > options.timeout + LATE_S),
            "vs_first": statistics.mean(counts) / max(first, 1e-9)}
    return {"items": options.items, "size": size, "timeout_s": options.timeout,
            "turns": options.turns, "calls_per_turn": options.calls,
            "compared": "nice" if options.nice is not None else "factor",
            "settings": results}


#: a call this much past its timeout counts as late in the printed table
LATE_S = 0.0005


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("factors", nargs="*", type=float, default=[0.0, 1.0],
                        help="values of reach_factor (0: no limit)")
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--requests", type=int, default=100,
                        help="distinct requests (the calls cycle through them)")
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20, help="measured calls per turn")
    parser.add_argument("--warm-up", type=int, default=5, help="unmeasured calls per turn")
    parser.add_argument("--size", type=int, default=None,
                        help="engines in the pool (default: the CPUs this process may use)")
    parser.add_argument("--timeout", type=float, default=0.010)
    parser.add_argument("--nice", type=int, nargs="+", default=None, metavar="N",
                        help="compare these nice values of the engines above the caller's "
                             "(one pool each) instead of factors")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    options = parser.parse_args(argv)
    if not options.factors or min(options.factors) < 0:
        parser.error("factors must be 0 or more")
    if options.nice is not None and not all(0 <= nice <= 19 for nice in options.nice):
        parser.error("nice values must be 0 to 19")
    result = compare(options)
    print(f"pool of {result['size']}, {options.items} items, timeout {options.timeout * 1e3:g} ms, "
          f"{options.turns} turns of {options.calls} calls ({options.warm_up} unmeasured first)")
    print(f"{result['compared']:>8}{'mean':>8}{'p50':>8}{'read/call':>11}{'p99 ms':>9}"
          f"{'max ms':>9}{'late':>6}{'vs first':>10}")
    for name, figures in result["settings"].items():
        print(f"{name:>8}{figures['mean_predictions']:>8.0f}{figures['median_predictions']:>8.0f}"
              f"{figures['lines_read_per_call']:>11.0f}{figures['wall_ms_p99']:>9.2f}"
              f"{figures['wall_ms_max']:>9.2f}{figures['late_calls']:>6}"
              f"{figures['vs_first']:>9.3f}x")
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()

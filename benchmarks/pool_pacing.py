"""How much a pool keeps in flight near a deadline, compared side by side.

Run: ``python -m benchmarks.pool_pacing [--items N] [--requests N]
[--turns N] [--calls N] [--warm-up N] [--size N] [--timeout S] [--json PATH]
[FACTOR ...]``. Each FACTOR is a value of
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

Prints, per factor, the mean and median predictions per call, the lines the
engines read per call (the bytes they read, ``/proc/PID/io``, over the mean
length of a line: lines read beyond those returned were answered too late,
or held back behind a slower engine's batch) and the wall time; then each
factor's mean against the first's.
"""

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from typing import Any, Dict, List, Optional

from subwabbit import VowpalWabbitPool
from subwabbit.core.split import SplitPredictExchange

from .pool_cpu import bytes_read
from .report import nearest_rank
from .turns import train_model
from .workload import RecommenderFormatter, Workload, prediction_args


def compare(factors: List[float], options: argparse.Namespace) -> Dict[str, Any]:
    """Every factor's calls, in alternating turns on one pool."""
    workload = Workload(options.requests, options.items)
    formatter = RecommenderFormatter()
    calls: Dict[float, List[int]] = {factor: [] for factor in factors}
    walls: Dict[float, List[float]] = {factor: [] for factor in factors}
    lines_read: Dict[float, float] = {factor: 0.0 for factor in factors}
    saved = SplitPredictExchange.reach_factor
    size = 0
    with tempfile.TemporaryDirectory() as directory:
        model = os.path.join(directory, "model.vw")
        train_model(workload, model)
        sample = formatter.lines(workload.requests[0], workload.candidates[0])
        line_bytes = sum(len(line) + 1 for line in sample) / len(sample)
        gc.collect()
        gc.freeze()  # as the main benchmark does and a service should
        enabled = gc.isenabled()
        gc.disable()
        try:
            with VowpalWabbitPool(formatter, prediction_args(model), size=options.size) as pool:
                pids, size = pool.engine_pids(), pool.size
                call = 0
                for turn in range(options.turns):
                    for factor in (factors if turn % 2 == 0 else factors[::-1]):
                        SplitPredictExchange.reach_factor = factor
                        for place in range(options.warm_up + options.calls):
                            index = call % len(workload)
                            call += 1
                            before = sum(map(bytes_read, pids))
                            start = time.perf_counter()
                            got = pool.predict(workload.requests[index],
                                               workload.candidates[index],
                                               timeout=options.timeout)
                            wall = time.perf_counter() - start
                            if place >= options.warm_up:
                                calls[factor].append(len(got))
                                walls[factor].append(wall)
                                lines_read[factor] += (sum(map(bytes_read, pids))
                                                       - before) / line_bytes
        finally:
            SplitPredictExchange.reach_factor = saved
            if enabled:
                gc.enable()
    results = {}
    for factor in factors:
        counts, times = calls[factor], sorted(walls[factor])
        results[str(factor)] = {
            "calls": len(counts),
            "mean_predictions": statistics.mean(counts),
            "median_predictions": statistics.median(counts),
            "lines_read_per_call": lines_read[factor] / len(counts),
            "wall_ms_p99": nearest_rank(times, 0.99) * 1e3,
            "wall_ms_max": times[-1] * 1e3,
            "vs_first": statistics.mean(counts) / max(statistics.mean(calls[factors[0]]), 1e-9)}
    return {"items": options.items, "size": size, "timeout_s": options.timeout,
            "turns": options.turns, "calls_per_turn": options.calls, "factors": results}


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
    parser.add_argument("--json", help="also write every figure to this JSON file")
    options = parser.parse_args(argv)
    if not options.factors or min(options.factors) < 0:
        parser.error("factors must be 0 or more")
    result = compare(options.factors, options)
    print(f"pool of {result['size']}, {options.items} items, timeout {options.timeout * 1e3:g} ms, "
          f"{options.turns} turns of {options.calls} calls ({options.warm_up} unmeasured first)")
    print(f"{'factor':>8}{'mean':>8}{'p50':>8}{'read/call':>11}{'p99 ms':>9}{'max ms':>9}"
          f"{'vs first':>10}")
    for name, figures in result["factors"].items():
        print(f"{name:>8}{figures['mean_predictions']:>8.0f}{figures['median_predictions']:>8.0f}"
              f"{figures['lines_read_per_call']:>11.0f}{figures['wall_ms_p99']:>9.2f}"
              f"{figures['wall_ms_max']:>9.2f}{figures['vs_first']:>9.3f}x")
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()

"""How much the blocking class keeps in flight, compared call by call in one process.

Run: ``python -m benchmarks.blocking_pacing [--requests N] [--items N] [PACING ...]``
where each PACING is ``default`` (the class's own), ``two-batches`` (at most
two batches in flight at any time, as before subwabbit 3.0's taper) or
``DEEP:AT`` (at most DEEP lines in flight, and near the deadline no more than
the engine is expected to answer by then plus AT lines; ``AT`` 0: DEEP at any
time).

One :class:`~subwabbit.blocking.VowpalWabbitProcess` serves every request once
per pacing, in an order reversed at each request, so that every pacing meets
the same engine, the same warm caches and the same spells of a noisy
machine: differences of a few percent, which separate processes taking turns
cannot show on a shared virtual machine, show here. Prints, per pacing, the
mean predictions per call, the wall time under the timeout and how many
calls ended more than 1 ms late.
"""

import argparse
import os
import statistics
import tempfile
import time
from typing import Callable, Dict, List

from subwabbit import VowpalWabbitProcess
from subwabbit.core.exchanges import Pacing

from .report import nearest_rank
from .turns import train_model
from .workload import RecommenderFormatter, Workload, prediction_args

DEFAULT_PACINGS = ["two-batches", "default"]


def pacing_of(name: str, process: VowpalWabbitProcess) -> Callable[[], Pacing]:
    """The pacing a name stands for, as a replacement of ``process._pacing``."""
    # pylint: disable=protected-access
    if name == "default":
        return process._pacing
    batch = process.batch_size
    if name == "two-batches":
        deep, at = 2 * batch, 0
    else:
        deep_text, _, at_text = name.partition(":")
        deep, at = int(deep_text), int(at_text or 0)
    pacing = Pacing(batch_size=batch, max_in_flight_lines=deep, min_batch=batch,
                    hard_deadline=False, lines_at_deadline=at or None)
    return lambda: pacing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pacings", nargs="*", default=DEFAULT_PACINGS,
                        help="pacings to compare: default, two-batches or DEEP:AT")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--timeout", type=float, default=0.010)
    options = parser.parse_args()
    workload = Workload(min(options.requests, 100), options.items)
    formatter = RecommenderFormatter()
    counts: Dict[str, List[int]] = {name: [] for name in options.pacings}
    walls: Dict[str, List[float]] = {name: [] for name in options.pacings}
    with tempfile.TemporaryDirectory() as directory:
        model = os.path.join(directory, "model.vw")
        train_model(workload, model)
        with VowpalWabbitProcess(formatter, prediction_args(model)) as process:
            pacings = {name: pacing_of(name, process) for name in options.pacings}
            for index in range(10):  # warm-up, unmeasured
                index %= len(workload)
                list(process.predict(workload.requests[index], workload.candidates[index]))
            for call in range(options.requests):
                request = workload.requests[call % len(workload)]
                items = workload.candidates[call % len(workload)]
                order = options.pacings if call % 2 else options.pacings[::-1]
                for name in order:
                    process._pacing = pacings[name]  # pylint: disable=protected-access
                    began = time.perf_counter()
                    got = list(process.predict(request, items, timeout=options.timeout))
                    walls[name].append(time.perf_counter() - began)
                    counts[name].append(len(got))
    print(f"{options.requests} calls per pacing x {options.items} items, "
          f"timeout {options.timeout * 1000:g} ms, one process taking turns call by call")
    first = statistics.mean(counts[options.pacings[0]])
    for name in options.pacings:
        mean = statistics.mean(counts[name])
        times = sorted(walls[name])
        late = sum(wall > options.timeout + 0.001 for wall in times)
        print(f"{name:>12}: predictions mean {mean:7.1f} ({mean / first:.3f}x)  wall ms mean "
              f"{statistics.mean(times) * 1000:.2f} p50 {nearest_rank(times, 0.50) * 1000:.2f} "
              f"p99 {nearest_rank(times, 0.99) * 1000:.2f} max {times[-1] * 1000:.2f}  "
              f">+1 ms late {late}")


if __name__ == "__main__":
    main()

"""How much the blocking class keeps in flight, compared side by side.

Run: ``python -m benchmarks.blocking_pacing [--requests N] [--items N]
[--turn N --idle S] [PACING ...]`` where each PACING is ``default`` (the
class's own), ``two-batches`` (at most two batches in flight at any time, as
subwabbit 2.x kept) or ``DEEP:AT`` (at most DEEP lines in flight, and near
the deadline no more than the engine is expected to answer by then plus AT
lines; ``AT`` 0: DEEP at any time).

Two ways to take turns:

* By default one :class:`~subwabbit.blocking.VowpalWabbitProcess` serves
  every request once per pacing, in an order reversed at each request, so
  that every pacing meets the same engine, the same warm caches and the same
  spells of a noisy machine: differences of a few percent, which separate
  processes cannot show on a shared virtual machine, show here.
* With ``--turn N`` each pacing has a process of its own, and the processes
  take turns of N calls, each turn after ``--idle`` seconds of idleness and
  one unmeasured call (as the main benchmark's timeout pass did until
  2026-11-24; it now begins a turn with 15): the engine and the client start
  each turn cold, which is where the tail of the lateness comes from.

Prints, per pacing, the mean predictions per call, the wall time under the
timeout and how many calls ended more than 0.5 and 1 ms late.
"""

import argparse
import os
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from subwabbit import VowpalWabbitProcess
from subwabbit.blocking import DEFAULT_BATCH_SIZE
from subwabbit.core.exchanges import Pacing

from .report import nearest_rank
from .turns import train_model
from .workload import RecommenderFormatter, Workload, prediction_args

DEFAULT_PACINGS = ["two-batches", "default"]


def parse_pacing(name: str, batch: int) -> Optional[Tuple[int, int]]:
    """``(DEEP, AT)`` for a pacing's name (``AT`` 0: none), ``None`` for ``default``.

    :raises ValueError: for a name that is not a pacing, or one under which a
        call could not send a whole batch of ``batch`` lines
    """
    if name == "default":
        return None
    if name == "two-batches":
        return 2 * batch, 0
    deep_text, _, at_text = name.partition(":")
    try:
        deep, at = int(deep_text), int(at_text or 0)
    except ValueError:
        raise ValueError(f"pacing {name!r}: default, two-batches or DEEP:AT") from None
    if deep < batch or at < 0 or 0 < at < batch:
        raise ValueError(f"pacing {name!r}: DEEP and a non-zero AT must be at least "
                         f"the batch size ({batch})")
    return deep, at


def pacing_of(name: str, process: VowpalWabbitProcess) -> Callable[[], Pacing]:
    """The pacing a name stands for, as a replacement of ``process._pacing``.

    :raises ValueError: see :func:`parse_pacing`
    """
    chosen = parse_pacing(name, process.batch_size)
    if chosen is None:
        return process._pacing  # pylint: disable=protected-access
    deep, at = chosen
    pacing = Pacing(batch_size=process.batch_size, max_in_flight_lines=deep,
                    min_batch=process.batch_size, hard_deadline=False,
                    lines_at_deadline=at or None)
    return lambda: pacing


def _call(process: VowpalWabbitProcess, workload: Workload, index: int,
          timeout: float) -> Sequence[float]:
    index %= len(workload)
    return list(process.predict(workload.requests[index], workload.candidates[index],
                                timeout=timeout))


def call_by_call(model: str, workload: Workload, names: List[str], calls: int,
                 timeout: float) -> Dict[str, List[List[float]]]:
    """One process, its pacing switched call by call.

    :returns: per pacing, ``[predictions per call, wall seconds per call]``
    """
    measured: Dict[str, List[List[float]]] = {name: [[], []] for name in names}
    with VowpalWabbitProcess(RecommenderFormatter(), prediction_args(model)) as process:
        pacings = {name: pacing_of(name, process) for name in names}
        for index in range(10):  # warm-up, unmeasured
            _call(process, workload, index, timeout)
        for call in range(calls):
            for name in (names if call % 2 else names[::-1]):
                process._pacing = pacings[name]  # pylint: disable=protected-access
                began = time.perf_counter()
                count = len(_call(process, workload, call, timeout))
                measured[name][1].append(time.perf_counter() - began)
                measured[name][0].append(count)
    return measured


def in_turns(model: str, workload: Workload, names: List[str], calls: int, timeout: float,
             turn: int, idle: float) -> Dict[str, List[List[float]]]:
    """A process per pacing, taking turns of ``turn`` calls after ``idle`` seconds.

    :returns: as :func:`call_by_call`
    """
    measured: Dict[str, List[List[float]]] = {name: [[], []] for name in names}
    processes = [VowpalWabbitProcess(RecommenderFormatter(), prediction_args(model))
                 for _ in names]
    try:
        for name, process in zip(names, processes):
            process._pacing = pacing_of(name, process)  # pylint: disable=protected-access
        for first in range(0, calls, turn):
            for name, process in zip(names, processes):
                time.sleep(idle)
                _call(process, workload, first - 1, timeout)  # unmeasured, as a warm-up
                for index in range(first, min(first + turn, calls)):
                    began = time.perf_counter()
                    count = len(_call(process, workload, index, timeout))
                    measured[name][1].append(time.perf_counter() - began)
                    measured[name][0].append(count)
    finally:
        for process in processes:
            process.close()
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pacings", nargs="*", default=DEFAULT_PACINGS,
                        help="pacings to compare: default, two-batches or DEEP:AT")
    parser.add_argument("--requests", type=int, default=1000, help="calls per pacing")
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--timeout", type=float, default=0.010)
    parser.add_argument("--turn", type=int, default=0,
                        help="a process per pacing, taking turns of this many calls "
                             "(default 0: one process, pacing switched call by call)")
    parser.add_argument("--idle", type=float, default=0.05,
                        help="with --turn: seconds of idleness before each turn (default 0.05)")
    options = parser.parse_args()
    names = options.pacings
    try:  # refuse a wrong name before the model is trained
        for name in names:
            parse_pacing(name, DEFAULT_BATCH_SIZE)
    except ValueError as exc:
        parser.error(str(exc))
    workload = Workload(min(options.requests, 100), options.items)
    with tempfile.TemporaryDirectory() as directory:
        model = os.path.join(directory, "model.vw")
        train_model(workload, model)
        if options.turn > 0:
            measured = in_turns(model, workload, names, options.requests, options.timeout,
                                options.turn, options.idle)
            how = (f"{len(names)} processes taking turns of {options.turn} calls, "
                   f"{options.idle * 1000:g} ms idle and one unmeasured call before each")
        else:
            measured = call_by_call(model, workload, names, options.requests, options.timeout)
            how = "one process, pacing switched call by call"
    print(f"{options.requests} calls per pacing x {options.items} items, "
          f"timeout {options.timeout * 1000:g} ms, {how}")
    first = statistics.mean(measured[names[0]][0]) or 1.0
    for name in names:
        counts, walls = measured[name]
        mean = statistics.mean(counts)
        times = sorted(walls)
        late = [sum(wall > options.timeout + over for wall in times) for over in (0.0005, 0.001)]
        print(f"{name:>12}: predictions mean {mean:7.1f} ({mean / first:.3f}x)  wall ms mean "
              f"{statistics.mean(times) * 1000:.2f} p50 {nearest_rank(times, 0.50) * 1000:.2f} "
              f"p99 {nearest_rank(times, 0.99) * 1000:.2f} max {times[-1] * 1000:.2f}  "
              f">+0.5 ms late {late[0]}  >+1 ms late {late[1]}")


if __name__ == "__main__":
    main()

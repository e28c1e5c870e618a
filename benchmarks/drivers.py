"""The wheel engine's two drivers behind subwabbit's pipes, on the benchmark workload.

Run: ``python -m benchmarks.drivers [--requests N] [--workers N ...]``

The engine of the ``vowpalwabbit`` wheel can read a client's lines with vw's
own driver (a parser thread and a learner thread) or with its one-thread loop
(see :mod:`subwabbit.engine.program`); ``SUBWABBIT_ENGINE_DRIVER`` chooses.
Two measurements, each with both drivers:

* **One caller.** One blocking and one nonblocking process per driver; every
  request is served by each of the four in turn (so that a change in the
  machine's speed hits all of them alike), with the timeout. Mean
  predictions per call and calls more than 1 ms late.
* **Worker processes.** ``N`` forked processes, each with its own
  nonblocking process, call ``predict`` back to back for a few seconds, as
  the workers of a saturated service would: predictions per second over all
  workers. With more workers than cores this is the CPU each driver spends
  per line that decides.
"""

import argparse
import os
import statistics
import tempfile
import time
from typing import Any, Dict, List, Optional

from subwabbit import VowpalWabbitNonBlockingProcess, VowpalWabbitProcess
from subwabbit.engine.program import DRIVER_ENV_VAR

from .turns import take_turns, train_model
from .workload import RecommenderFormatter, Workload, prediction_args

DRIVERS = ("loop", "vw")


def start(cls: Any, formatter: Any, args: List[str], driver: Optional[str],
          **options: Any) -> Any:
    """A process of ``cls`` whose engine runs ``driver`` (``None``: the default).

    The engine reads :data:`~subwabbit.engine.program.DRIVER_ENV_VAR` when it
    starts, so it is set for the constructor only."""
    before = os.environ.get(DRIVER_ENV_VAR)
    if driver is not None:
        os.environ[DRIVER_ENV_VAR] = driver
    try:
        return cls(formatter, args, **options)
    finally:
        if before is None:
            os.environ.pop(DRIVER_ENV_VAR, None)
        else:
            os.environ[DRIVER_ENV_VAR] = before


def one_caller(workload: Workload, args: List[str], timeout: float) -> Dict[str, Dict[str, float]]:
    """Mean predictions and late calls of each class on each driver, taking turns."""
    formatter = RecommenderFormatter()
    processes = {f"{cls.__name__} ({driver})": start(cls, formatter, args, driver)
                 for cls in (VowpalWabbitProcess, VowpalWabbitNonBlockingProcess)
                 for driver in DRIVERS}
    counts, walls = take_turns(list(processes.values()), workload, timeout)
    return {name: {"mean": statistics.mean(count),
                   "late": sum(1 for wall in call_walls if wall > timeout + 0.001)}
            for name, count, call_walls in zip(processes, counts, walls)}


def workers(workload: Workload, args: List[str], timeout: float, count: int, driver: str,
            seconds: float) -> Dict[str, float]:
    """Predictions per second of ``count`` forked workers calling back to back."""
    read_end, write_end = os.pipe()
    start_at = time.monotonic() + 2.0 + 0.2 * count  # after every engine has started
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:  # a worker: its own process, then calls until the time is up
            code = 1
            try:
                process = start(VowpalWabbitNonBlockingProcess, RecommenderFormatter(), args,
                                driver)
                time.sleep(max(0.0, start_at - time.monotonic()))
                predictions = calls = 0
                ends = time.monotonic() + seconds
                while time.monotonic() < ends:
                    request = workload.requests[calls % len(workload)]
                    items = workload.candidates[calls % len(workload)]
                    predictions += len(list(process.predict(request, items, timeout=timeout)))
                    calls += 1
                process.close()
                os.write(write_end, b"%d %d\n" % (predictions, calls))
                code = 0
            finally:
                os._exit(code)  # pylint: disable=protected-access
        pids.append(pid)
    os.close(write_end)
    for pid in pids:
        os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as reader:
        reports = [tuple(int(field) for field in line.split()) for line in reader.read().splitlines()]
    if len(reports) != count:
        raise RuntimeError(f"{count - len(reports)} of {count} workers failed")
    predictions = sum(report[0] for report in reports)
    calls = sum(report[1] for report in reports)
    return {"predictions_per_s": predictions / seconds, "per_call": predictions / max(calls, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--timeout", type=float, default=0.010)
    parser.add_argument("--workers", type=int, nargs="*", default=None,
                        help="worker counts to measure (default: the CPUs, and twice that)")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="how long each worker measurement runs")
    options = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    counts = options.workers if options.workers is not None else [cpus, 2 * cpus]
    workload = Workload(options.requests, options.items)
    with tempfile.TemporaryDirectory() as directory:
        model = os.path.join(directory, "model.vw")
        train_model(workload, model)
        args = prediction_args(model)
        print(f"One caller: {options.requests} requests x {options.items} items, "
              f"timeout {options.timeout * 1000:g} ms, {cpus} CPUs")
        for name, figures in one_caller(workload, args, options.timeout).items():
            print(f"  {name:>40}: predictions mean {figures['mean']:7.1f}"
                  f"  >+1 ms late {figures['late']}")
        for count in counts:
            print(f"{count} worker processes, each with a nonblocking process, "
                  f"{options.seconds:g} s:")
            for driver in DRIVERS:
                figures = workers(workload, args, options.timeout, count, driver, options.seconds)
                print(f"  {driver:>5}: {figures['predictions_per_s']:9,.0f} predictions/s,"
                      f" {figures['per_call']:7.1f} per call")


if __name__ == "__main__":
    main()

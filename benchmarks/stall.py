"""How late calls end when the engine stalls or dies.

Run: ``python -m benchmarks.stall [--calls N]``.

* nonblocking, engine stopped (SIGSTOP) before the call: ``predict`` with a
  10 ms timeout; lateness = wall time - timeout.
* nonblocking, engine stopped at a random moment during the call (by another
  process; calls that ended before the stop are not counted).
* blocking, engine stopped: ``predict`` without a timeout raises
  ``VowpalWabbitTimeoutError`` after ``io_timeout_s``; lateness = wall time -
  ``io_timeout_s``.
* both classes, engine killed (SIGKILL) mid-call: time from the kill to the
  ``VowpalWabbitEngineExitedError``.

Prints quantiles in milliseconds and writes them as JSON (``--out``).
"""

import argparse
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

from subwabbit import (VowpalWabbitEngineExitedError, VowpalWabbitNonBlockingProcess,
                       VowpalWabbitProcess, VowpalWabbitTimeoutError)

from .batch_size import BenchFormatter, workload
from .report import nearest_rank, write_json

VW_ARGS = ["--quiet", "-q", "ui", "--loss_function", "logistic", "-b", "20"]


def summarise(values: List[float]) -> Dict[str, float]:
    """Quantiles of seconds, in milliseconds."""
    ordered = sorted(values)

    def quantile(q: float) -> float:
        return round(nearest_rank(ordered, q) * 1000, 3)

    return {"n": len(ordered), "mean": round(statistics.mean(ordered) * 1000, 3),
            "p50": quantile(0.5), "p99": quantile(0.99), "max": round(ordered[-1] * 1000, 3)}


def nonblocking_stopped(data: List[Any], calls: int, timeout: float) -> Dict[str, float]:
    late = []
    with VowpalWabbitNonBlockingProcess(BenchFormatter(), VW_ARGS) as process:
        os.kill(process.pid, signal.SIGSTOP)
        try:
            for call in range(calls):
                common, items = data[call % len(data)]
                began = time.perf_counter()
                list(process.predict(common, items, timeout=timeout))
                late.append(time.perf_counter() - began - timeout)
        finally:
            os.kill(process.pid, signal.SIGCONT)
    return summarise(late)


# A separate process sends the SIGSTOP, so that no thread of ours competes
# with the call for the GIL (a threading.Timer does, and adds its own delay).
_STOPPER = """
import os, signal, sys, time
for line in sys.stdin:
    delay, pid = line.split()
    time.sleep(float(delay))
    os.kill(int(pid), signal.SIGSTOP)
    sys.stdout.write(f"{time.perf_counter()}\\n")  # CLOCK_MONOTONIC: shared by processes
    sys.stdout.flush()
"""


def nonblocking_stopped_mid_call(data: List[Any], calls: int, timeout: float) -> Dict[str, float]:
    late = []
    rng = random.Random(5)
    stopper = subprocess.Popen([sys.executable, "-c", _STOPPER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, bufsize=1)
    assert stopper.stdin is not None and stopper.stdout is not None
    try:
        with VowpalWabbitNonBlockingProcess(BenchFormatter(), VW_ARGS) as process:
            for call in range(calls):
                common, items = data[call % len(data)]
                began = time.perf_counter()
                stopper.stdin.write(f"{rng.uniform(0, timeout * 0.6)} {process.pid}\n")
                list(process.predict(common, items, timeout=timeout))
                ended = time.perf_counter()
                stopped_at = float(stopper.stdout.readline())
                os.kill(process.pid, signal.SIGCONT)
                if stopped_at < ended:  # the engine stalled during the call
                    late.append(ended - began - timeout)
    finally:
        stopper.stdin.close()
        stopper.wait()
    return summarise(late)


def blocking_io_timeout(data: List[Any], trials: int, io_timeout: float) -> Dict[str, float]:
    late = []
    common, items = data[0]
    with VowpalWabbitProcess(BenchFormatter(), VW_ARGS, io_timeout_s=io_timeout) as process:
        for _ in range(trials):
            stopped = process.pid
            os.kill(stopped, signal.SIGSTOP)
            began = time.perf_counter()
            try:
                list(process.predict(common, items))
            except VowpalWabbitTimeoutError:
                late.append(time.perf_counter() - began - io_timeout)
            process.restart()
            if _exists(stopped):
                os.kill(stopped, signal.SIGCONT)
    return summarise(late)


def killed_mid_call(cls: Any, data: List[Any], trials: int) -> Dict[str, float]:
    delays = []
    common, items = data[0]
    items = items * 5
    with cls(BenchFormatter(), VW_ARGS, restart_on_crash=True) as process:
        for _ in range(trials):
            iterator = process.predict(common, items, timeout=None if cls is VowpalWabbitProcess
                                       else 5.0)
            next(iterator)
            os.kill(process.pid, signal.SIGKILL)
            killed = time.perf_counter()
            try:
                for _ in iterator:
                    pass
            except VowpalWabbitEngineExitedError:
                delays.append(time.perf_counter() - killed)
    return summarise(delays)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=0.010)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--io-timeout", type=float, default=0.2)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "subwabbit-stall.json"),
                        help="where the JSON goes (default: %(default)s; the committed one is "
                             "benchmarks/results/stall.json)")
    options = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    data = workload(20, 1000)
    results = {
        "command": "python -m benchmarks.stall",
        "nonblocking_stopped_lateness_ms": nonblocking_stopped(data, options.calls, options.timeout),
        "nonblocking_stopped_mid_call_lateness_ms": nonblocking_stopped_mid_call(
            data, options.calls, options.timeout),
        "blocking_io_timeout_lateness_ms": blocking_io_timeout(data, options.trials,
                                                               options.io_timeout),
        "blocking_kill_to_error_ms": killed_mid_call(VowpalWabbitProcess, data, options.trials),
        "nonblocking_kill_to_error_ms": killed_mid_call(VowpalWabbitNonBlockingProcess, data,
                                                        options.trials),
    }
    for name, summary in results.items():
        if isinstance(summary, dict):
            print(f"{name:>42}: " + " ".join(f"{key} {value}" for key, value in summary.items()))
    write_json(results, options.out)


if __name__ == "__main__":
    main()

"""Where a pool's CPU goes: its calling thread and its engines, per line,
beside the same engine reading the same lines from a file, alone and two at
once.

Run: ``python -m benchmarks.pool_cpu [--items N] [--calls N] [--rounds N]
[--json PATH]``. About 15 seconds on 2 cores with the defaults. On a machine
with no more cores than engines plus one, a pool's calling thread and its
engines take turns on the cores, and what each of them costs per line
decides how many predictions a call returns. Each round measures, one right
after the other:

* **pool**: a pool of ``--size`` engines (default: the number of CPUs)
  serves ``--calls`` calls of ``--items`` items with ``--timeout``:
  predictions per call, the calling thread's CPU per prediction
  (``time.thread_time``), and the engines' CPU (``/proc/PID/task/*/schedstat``) per line
  they read (the bytes they read, ``/proc/PID/io``, over the mean length of
  a line: the lines a call dealt and did not get back in time are work too)
  and per prediction returned;
* **engine alone**: one engine as the pool runs it (the wheel's one-thread
  loop, ``SUBWABBIT_ENGINE_DRIVER=loop``) reading the same calls' lines on
  stdin from a file, its CPU per line with its start-up (a run on one line)
  subtracted;
* **two at once**: two such engines reading the file at the same time, the
  CPU of each per line.

The engines of a pool share the cores with the calling thread, which
formats the items between their turns; the engine alone shares them with
nothing. The ratio of the two costs per line is printed for each round.
"""

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

from subwabbit import VowpalWabbitPool
from subwabbit.pool_base import default_pool_size

from .cpu import process_cpu_seconds
from .limit import write_lines
from .turns import train_model
from .workload import RecommenderFormatter, Workload, prediction_args


def run_seconds(pid: int) -> float:
    """CPU time of every thread of the process so far, in nanoseconds'
    resolution (``/proc/PID/task/TID/schedstat``; ``/proc/PID/stat``'s
    clock ticks where the kernel keeps no scheduler statistics)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as handle:
                total += int(handle.read().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return process_cpu_seconds(pid)
    return total / 1e9


def bytes_read(pid: int) -> int:
    """Bytes the process has read so far (``rchar`` of ``/proc/PID/io``)."""
    with open(f"/proc/{pid}/io", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise RuntimeError(f"no rchar in /proc/{pid}/io")


def measure_pool(pool: VowpalWabbitPool, workload: Workload, calls: int, timeout: float,
                 line_bytes: float) -> Dict[str, Optional[float]]:
    """``calls`` calls on the pool, the garbage collector off."""
    pids = pool.engine_pids()
    requests = len(workload)
    enabled = gc.isenabled()
    gc.disable()
    try:
        engine_cpu, engine_bytes = sum(map(run_seconds, pids)), sum(map(bytes_read, pids))
        client_cpu, returned, hedged = time.thread_time(), 0, 0
        metrics: Dict[str, Any] = {}
        for call in range(calls):
            index = call % requests
            returned += len(pool.predict(workload.requests[index], workload.candidates[index],
                                         timeout=timeout, metrics=metrics))
            hedged += metrics["hedged_lines"]
        client_cpu = time.thread_time() - client_cpu
        engine_cpu = sum(map(run_seconds, pids)) - engine_cpu
        engine_lines = (sum(map(bytes_read, pids)) - engine_bytes) / line_bytes
    finally:
        if enabled:
            gc.enable()
    return {"predictions_per_call": returned / calls,
            "client_us_per_prediction": client_cpu / max(returned, 1) * 1e6,
            "engine_lines_per_call": engine_lines / calls,
            # lines dealt to a second engine when the first went quiet
            "hedged_lines_per_call": hedged / calls,
            "engine_us_per_line": engine_cpu / max(engine_lines, 1) * 1e6,
            "engine_us_per_prediction": engine_cpu / max(returned, 1) * 1e6}


def engines_on_file(args: Sequence[str], path: str, one_line: str,
                    count: int) -> Optional[float]:
    """CPU seconds per line of each of ``count`` loop engines reading the
    file at ``path`` on stdin at the same time, their start-up (the same
    engines on ``one_line``) subtracted; ``None`` when the start-up's noise
    exceeded the work (too few lines)."""
    command = [sys.executable, "-m", "subwabbit.engine"] + list(args) + ["-p", "stdout"]
    env = dict(os.environ, SUBWABBIT_ENGINE_DRIVER="loop")

    def cpu_of(data: str) -> float:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        handles = [open(data, "rb") for _ in range(count)]  # pylint: disable=consider-using-with
        try:
            engines = [subprocess.Popen(command, stdin=handle, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, env=env)
                       for handle in handles]
            for engine in engines:
                if engine.wait() != 0:
                    raise RuntimeError(f"the engine exited with {engine.returncode}: {command}")
        finally:
            for handle in handles:
                handle.close()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    with open(path, "rb") as handle:
        lines = sum(1 for _ in handle)
    work = cpu_of(path) - cpu_of(one_line)
    return work / count / (lines - 1) if work > 0 and lines > 1 else None


def run(options: argparse.Namespace) -> Dict[str, Any]:
    """Every round's figures, and their medians."""
    workload = Workload(options.requests, options.items)
    formatter = RecommenderFormatter()
    rounds: List[Dict[str, Optional[float]]] = []
    with tempfile.TemporaryDirectory() as directory:
        model = os.path.join(directory, "model.vw")
        train_model(workload, model)
        args = prediction_args(model)
        lines: List[str] = []
        for request, items in workload.pairs(range(len(workload))):
            lines += formatter.lines(request, items)
        data, one = os.path.join(directory, "lines.txt"), os.path.join(directory, "one.txt")
        write_lines(data, lines)
        write_lines(one, lines[:1])
        line_bytes = os.path.getsize(data) / len(lines)
        gc.collect()
        gc.freeze()  # as the main benchmark does and a service should
        with VowpalWabbitPool(formatter, args, size=options.size) as pool:
            for index in range(min(10, len(workload))):  # warm-up
                pool.predict(workload.requests[index], workload.candidates[index],
                             timeout=options.timeout)
            for number in range(options.rounds):
                figures = measure_pool(pool, workload, options.calls, options.timeout,
                                       line_bytes)
                alone = engines_on_file(args, data, one, 1)
                two = engines_on_file(args, data, one, 2)
                figures["alone_us_per_line"] = None if alone is None else alone * 1e6
                figures["two_at_once_us_per_line"] = None if two is None else two * 1e6
                in_pool = figures["engine_us_per_line"]
                figures["in_pool_vs_alone"] = (None if alone is None or in_pool is None
                                               else in_pool / (alone * 1e6))
                rounds.append(figures)
                _print_round(number + 1, figures)
    medians: Dict[str, Optional[float]] = {}
    for key in rounds[0]:
        values = [value for value in (r[key] for r in rounds) if value is not None]
        medians[key] = statistics.median(values) if values else None
    return {"size": options.size, "items": options.items, "calls": options.calls,
            "timeout_s": options.timeout, "line_bytes": line_bytes, "rounds": rounds,
            "medians": medians}


_COLUMNS = [("predictions_per_call", "pred/call", ".0f"),
            ("client_us_per_prediction", "client µs/pred", ".2f"),
            ("engine_us_per_line", "pool engines µs/line", ".2f"),
            ("hedged_lines_per_call", "hedged lines/call", ".0f"),
            ("alone_us_per_line", "alone µs/line", ".2f"),
            ("two_at_once_us_per_line", "two at once µs/line", ".2f"),
            ("in_pool_vs_alone", "in pool / alone", ".2f")]


def _print_header() -> None:
    print(f"{'round':>6}" + "".join(f"{title:>22}" for _, title, _ in _COLUMNS))


def _print_round(number: Any, figures: Dict[str, Optional[float]]) -> None:
    cells = ["-" if figures[key] is None else format(figures[key], spec)
             for key, _, spec in _COLUMNS]
    print(f"{number:>6}" + "".join(f"{cell:>22}" for cell in cells), flush=True)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=6000)
    parser.add_argument("--requests", type=int, default=40,
                        help="distinct requests (the calls cycle through them)")
    parser.add_argument("--calls", type=int, default=200, help="calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=default_pool_size(),
                        help="engines in the pool (default: the CPUs this process may use)")
    parser.add_argument("--timeout", type=float, default=0.010)
    parser.add_argument("--json", help="also write every figure to this JSON file")
    options = parser.parse_args(argv)
    print(f"pool of {options.size}, {options.calls} calls of {options.items} items per round, "
          f"timeout {options.timeout * 1000:g} ms; engines reading "
          f"{options.requests} x {options.items} lines from a file")
    _print_header()
    report = run(options)
    _print_round("median", report["medians"])
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()

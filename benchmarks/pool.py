"""The pool of engines on the benchmark workload: predictions within the
budget beside the single classes and the engine alone, throughput under
concurrent callers, memory, and scaling with cores.

Run: ``python -m benchmarks.pool [--requests N] [--json PATH]``. About a
minute and a half on 2 cores. Once the workload is built, ``gc.freeze()``
keeps its objects out of every garbage collection, as the main benchmark
does and a service should (see the serving guide). Sections:

* **one caller**: every request is served by each contender in turn (the
  blocking and nonblocking classes, a pool of 1 engine, a pool of the default
  size); predictions returned within ``--timeout`` and wall-time quantiles.
  The engine alone is the same engine reading the requests' lines from a
  file (:func:`benchmarks.limit.per_request_rates`).
* **concurrent callers**: 1, 4 and 16 threads call ``predict`` for
  ``--seconds`` each, on a pool of the default size, a pool of 1 and one
  nonblocking object shared by the threads; predictions per second, mean
  predictions per call, p99 wall time.
* **memory**: a model of the workload trained with ``-b 25``; each engine's
  RSS and the total PSS (``/proc/PID/smaps_rollup``) of a single process and
  of pools of 1 and 2 engines, with and without shared weights.
* **cores**: the one-caller section for the pool and the engine alone with the
  whole benchmark pinned to 1 and then 2 CPUs (``os.sched_setaffinity``).
* **priority**: a pool of the default size with its engines below the
  client's priority (``low_priority_engines=True``) and at the same priority,
  one after the other on the same requests, in rounds
  (``--only-priority`` runs this section alone).
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from subwabbit import VowpalWabbitNonBlockingProcess, VowpalWabbitPool, VowpalWabbitProcess
from subwabbit.pool_base import default_pool_size, smaps_rollup

from .limit import engine_command, lines_within, per_request_rates
from .report import nearest_rank
from .turns import take_turns, train_model
from .workload import RecommenderFormatter, Workload, prediction_args

MiB = 1 << 20


def _quantiles(values: Sequence[float]) -> Dict[str, float]:
    ordered = sorted(values)
    return {"mean": statistics.mean(ordered), "min": ordered[0],
            "p50": nearest_rank(ordered, 0.5), "p99": nearest_rank(ordered, 0.99),
            "p99.9": nearest_rank(ordered, 0.999), "max": ordered[-1]}


def one_caller(workload: Workload, model: str, timeout: float,
               sizes: Sequence[int], singles: bool = True) -> Dict[str, Any]:
    """Each request served by every contender in turn; and the engine alone."""
    formatter = RecommenderFormatter()
    args = prediction_args(model)
    contenders: List[Any] = []
    names: List[str] = []
    if singles:
        contenders += [VowpalWabbitProcess(formatter, args),
                       VowpalWabbitNonBlockingProcess(formatter, args)]
        names += ["blocking", "nonblocking"]
    for size in sizes:
        contenders.append(VowpalWabbitPool(formatter, args, size=size))
        names.append(f"pool of {size}")
    counts, walls = take_turns(contenders, workload, timeout)
    results: Dict[str, Any] = {}
    for name, count, wall in zip(names, counts, walls):
        results[name] = {"predictions": _quantiles(count),
                         "wall_ms": {key: value * 1000 for key, value in _quantiles(wall).items()},
                         "late_over_1ms": sum(1 for w in wall if w > timeout + 0.001)}
    with tempfile.TemporaryDirectory() as workdir:
        lines = [[formatter.get_formatted_example(
            formatter.format_common_features(request),
            formatter.format_item_features(request, item)) for item in items]
            for request, items in workload.pairs(range(len(workload)))]
        durations = per_request_rates(engine_command(), args, lines, workdir)
    # whole lines, as a call returns them (and as the main benchmark counts them)
    within = [lines_within(len(items), timeout, seconds)
              for items, seconds in zip(lines[1:], durations)]
    results["engine alone"] = {"predictions": _quantiles(within)}
    return results


def concurrent_callers(workload: Workload, model: str, timeout: float, callers: int,
                       seconds: float, size: int) -> Dict[str, Any]:
    """``callers`` threads calling for ``seconds`` on each contender in turn."""
    formatter = RecommenderFormatter()
    args = prediction_args(model)
    makers: Dict[str, Callable[[], Any]] = {
        f"pool of {size}": lambda: VowpalWabbitPool(formatter, args, size=size),
        "pool of 1": lambda: VowpalWabbitPool(formatter, args, size=1),
        "one shared nonblocking": lambda: VowpalWabbitNonBlockingProcess(formatter, args),
    }
    results = {}
    for name, make in makers.items():
        contender = make()
        counts: List[int] = []
        walls: List[float] = []
        lock = threading.Lock()
        stop_at = time.perf_counter() + seconds

        def caller(offset: int) -> None:
            index = offset
            mine_counts, mine_walls = [], []
            while time.perf_counter() < stop_at:
                request, items = workload.requests[index % len(workload)], \
                    workload.candidates[index % len(workload)]
                began = time.perf_counter()
                got = contender.predict(request, items, timeout=timeout)
                if not isinstance(got, list):
                    got = list(got)
                mine_walls.append(time.perf_counter() - began)
                mine_counts.append(len(got))
                index += callers
            with lock:
                counts.extend(mine_counts)
                walls.extend(mine_walls)

        threads = [threading.Thread(target=caller, args=(offset,)) for offset in range(callers)]
        began = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - began
        contender.close()
        results[name] = {"calls": len(counts), "predictions_per_s": sum(counts) / elapsed,
                         "mean_predictions": statistics.mean(counts),
                         "empty_calls": sum(1 for count in counts if count == 0),
                         "wall_ms_p99": nearest_rank(sorted(walls), 0.99) * 1000}
    return results


def memory(workload: Workload, directory: str) -> Dict[str, Any]:
    """RSS and PSS of one process and of pools, on a ``-b 25`` model."""
    model = os.path.join(directory, "model-b25.vw")
    train_model(workload, model, bits=25)
    formatter = RecommenderFormatter()
    args = prediction_args(model)
    request, items = workload.requests[0], workload.candidates[0]
    results: Dict[str, Any] = {"model_file_mib": os.path.getsize(model) / MiB}
    with VowpalWabbitNonBlockingProcess(formatter, args) as single:
        list(single.predict(request, items))
        fields = smaps_rollup(single.pid or 0)
        results["single process"] = {"engines": 1, "rss_mib_per_engine": [fields["Rss"] / MiB],
                                     "pss_mib_total": fields["Pss"] / MiB}
    for size, share in ((1, True), (2, True), (2, False)):
        with VowpalWabbitPool(formatter, args, size=size, share_weights=share) as pool:
            pool.predict(request, items)
            usage = pool.memory_usage()
            per_engine = [smaps_rollup(pid).get("Rss", 0) / MiB for pid in pool.engine_pids()]
            shares = pool.shares_weights()  # a pool of one never shares, whatever is asked
            results[f"pool of {size}, {'shared' if shares else 'a copy each'}"] = {
                "engines": size, "shares_weights": shares,
                "rss_mib_per_engine": per_engine, "pss_mib_total": usage["pss_bytes"] / MiB,
                "processes": usage["processes"]}
    return results


def pinned(cpus: str, options: argparse.Namespace) -> Dict[str, Any]:
    """The one-caller section for the pool and the engine alone, in a child
    process pinned to ``cpus``."""
    argv = [sys.executable, "-m", "benchmarks.pool", "--only-one-caller", "--cpus", cpus,
            "--requests", str(options.requests), "--items", str(options.items),
            "--timeout", str(options.timeout)]
    output = subprocess.run(argv, check=True, stdout=subprocess.PIPE, timeout=1800).stdout
    return json.loads(output)


def priority(workload: Workload, model: str, timeout: float, size: int,
             rounds: int = 2) -> Dict[str, Any]:
    """A pool with and without ``low_priority_engines``, each serving all the
    requests in turn (a pool runs alone, as in a service), in ``rounds``."""
    formatter = RecommenderFormatter()
    args = prediction_args(model)
    results: Dict[str, List[float]] = {"low priority": [], "same priority": []}
    for _ in range(rounds):
        for name, low in (("same priority", False), ("low priority", True)):
            with VowpalWabbitPool(formatter, args, size=size, low_priority_engines=low) as pool:
                for index in range(min(10, len(workload))):
                    pool.predict(workload.requests[index], workload.candidates[index],
                                 timeout=timeout)
                counts = [len(pool.predict(request, items, timeout=timeout))
                          for request, items in workload.pairs(range(len(workload)))]
            results[name].append(statistics.mean(counts))
    return results


def _print_one_caller(title: str, results: Dict[str, Any]) -> None:
    print(f"\n{title}")
    print(f"{'contender':<16}{'mean':>8}{'min':>8}{'p50':>8}   wall ms: {'p50':>6}{'p99':>7}"
          f"{'p99.9':>7}{'max':>7}  >+1 ms")
    for name, result in results.items():
        predictions = result["predictions"]
        line = f"{name:<16}{predictions['mean']:8.0f}{predictions['min']:8.0f}" \
               f"{predictions['p50']:8.0f}"
        if "wall_ms" in result:
            wall = result["wall_ms"]
            line += f"            {wall['p50']:6.2f}{wall['p99']:7.2f}{wall['p99.9']:7.2f}" \
                    f"{wall['max']:7.2f}  {result['late_over_1ms']:6d}"
        print(line)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--timeout", type=float, default=0.010)
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="how long each concurrent-callers measurement runs")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    parser.add_argument("--cpus", help=argparse.SUPPRESS)
    parser.add_argument("--only-one-caller", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only-priority", action="store_true",
                        help="measure only the pool with and without low_priority_engines")
    options = parser.parse_args(argv)
    if options.cpus:
        os.sched_setaffinity(0, {int(cpu) for cpu in options.cpus.split(",")})
    workload = Workload(options.requests, options.items)
    size = default_pool_size()
    with tempfile.TemporaryDirectory() as directory:
        model = os.path.join(directory, "model.vw")
        train_model(workload, model, bits=20)
        # As a service does after start-up (see the serving guide), and as
        # the main benchmark does: the workload's objects are never collected.
        gc.collect()
        gc.freeze()
        if options.only_one_caller:
            print(json.dumps(one_caller(workload, model, options.timeout, [size], singles=False)))
            return
        if options.only_priority:
            found = priority(workload, model, options.timeout, size)
            print(f"pool of {size}, mean predictions within {options.timeout * 1000:g} ms per "
                  f"round ({options.requests} requests each):")
            for name, means in found.items():
                print(f"  {name:<14} " + "  ".join(f"{mean:7.0f}" for mean in means))
            return
        report: Dict[str, Any] = {"cpus": size, "requests": options.requests,
                                  "items": options.items, "timeout_s": options.timeout}
        report["one_caller"] = one_caller(workload, model, options.timeout,
                                          sorted({1, size}))
        _print_one_caller(f"Predictions within {options.timeout * 1000:g} ms, one caller "
                          f"({options.requests} requests x {options.items} items, {size} CPUs):",
                          report["one_caller"])
        report["concurrent"] = {}
        print(f"\nConcurrent callers ({options.seconds:g} s each, timeout "
              f"{options.timeout * 1000:g} ms):")
        print(f"{'callers':>7}  {'contender':<24}{'pred/s':>10}{'mean/call':>11}{'empty':>7}"
              f"{'p99 ms':>8}")
        for callers in (1, 4, 16):
            result = concurrent_callers(workload, model, options.timeout, callers,
                                        options.seconds, size)
            report["concurrent"][callers] = result
            for name, figures in result.items():
                print(f"{callers:>7}  {name:<24}{figures['predictions_per_s']:10.0f}"
                      f"{figures['mean_predictions']:11.0f}{figures['empty_calls']:7d}"
                      f"{figures['wall_ms_p99']:8.2f}")
        report["memory"] = memory(workload, directory)
    print(f"\nMemory, a -b 25 model of the workload "
          f"({report['memory']['model_file_mib']:.1f} MiB on disk):")
    for name, figures in report["memory"].items():
        if isinstance(figures, dict):
            rss = ", ".join(f"{value:.0f}" for value in figures["rss_mib_per_engine"])
            print(f"  {name:<26} RSS per engine (MiB): {rss:<12} total PSS: "
                  f"{figures['pss_mib_total']:.0f} MiB")
    report["cores"] = {}
    available = sorted(os.sched_getaffinity(0))
    for count in (1, 2):
        if len(available) >= count:
            cpus = ",".join(str(cpu) for cpu in available[:count])
            report["cores"][count] = pinned(cpus, options)
            _print_one_caller(f"Pinned to {count} CPU{'s' if count > 1 else ''} ({cpus}):",
                              report["cores"][count])
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()

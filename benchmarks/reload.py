"""What a model reload costs the calls around it, on a pool serving without pause.

Run: ``python -m benchmarks.reload [--reloads N] [--size N] [--items N]
[--timeout S] [--every S] [--bits B] [--deaths N] [--closes N]``.

One thread calls a :class:`~subwabbit.pool.VowpalWabbitPool` without pause
(the workload's requests in turn, ``--timeout`` each) while the main thread
reloads the same model every ``--every`` seconds. It prints the mean
predictions per call of the calls before the first reload (after 20 calls),
of the calls that ran during a reload (the new model loading and its engines
starting), and of the first four calls on each reload's new engines, and
the fewest any first call got. Its figures are in the serving guide
(``docs/serving.rst``, "Refreshing the model").

With ``--deaths N`` it measures an engine's death instead: N times, with no
call running, one engine is killed, and 200 ms later one call is made; it
prints that call's predictions and those of the calls on the pool once it
is whole again.

With ``--closes N`` it measures closing instead: N pools, each closed after
a few calls; it prints the wall time of ``close()`` and the CPU that the
pool's engines and fork server spent from ``close()`` to their exit (the
CPU a reload's old engines take from the new ones as they close).
"""

import argparse
import os
import signal
import statistics
import tempfile
import threading
import time
from typing import Any, Dict, List, Tuple

from subwabbit import VowpalWabbitPool

from .cpu import children_cpu_seconds, parent_pid
from .pool_cpu import run_seconds
from .turns import train_model
from .workload import RecommenderFormatter, Workload, prediction_args

#: calls after the switch reported one by one
AFTER = 4
#: calls at the start that are not counted in the steady figure
WARM_UP_CALLS = 20


def measure(pool: VowpalWabbitPool, workload: Workload, args: List[str], reloads: int,
            every: float, timeout: float) -> Dict[str, Any]:
    """Call the pool from a thread, reload it ``reloads`` times meanwhile,
    and sum up the calls around the reloads."""
    calls: List[Tuple[float, int, int]] = []  # (ended at, predictions, generation)
    stop = threading.Event()

    def caller() -> None:
        index = 0
        while not stop.is_set():
            metrics: Dict[str, Any] = {}
            got = pool.predict(workload.requests[index % len(workload)],
                               workload.candidates[index % len(workload)],
                               timeout=timeout, metrics=metrics)
            calls.append((time.perf_counter(), len(got), metrics.get("model_generation", -1)))
            index += 1

    thread = threading.Thread(target=caller)
    thread.start()
    switches = []
    try:
        for _ in range(reloads):
            time.sleep(every)
            began = time.perf_counter()
            pool.reload(args)
            switches.append((began, time.perf_counter()))
        time.sleep(min(every, 0.5))
    finally:
        stop.set()
        thread.join()
    first_call: Dict[int, int] = {}
    for index, (_, _, generation) in enumerate(calls):
        first_call.setdefault(generation, index)
    steady = [count for _, count, generation in calls[WARM_UP_CALLS:] if generation == 0]
    during = [count for began, ended in switches
              for at, count, _ in calls if began <= at <= ended]
    after = [[calls[index + place][1] for generation, index in first_call.items()
              if generation > 0 and index + place < len(calls)] for place in range(AFTER)]
    return {"steady": statistics.mean(steady) if steady else float("nan"),
            "during": statistics.mean(during) if during else float("nan"),
            "after": [statistics.mean(place) if place else float("nan") for place in after],
            "fewest_first": min(after[0]) if after[0] else None,
            "reload_ms": statistics.mean((ended - began) * 1000 for began, ended in switches)}


def deaths(pool: VowpalWabbitPool, workload: Workload, count: int,
           timeout: float) -> Dict[str, Any]:
    """Kill an idle engine ``count`` times; the call 200 ms later against
    the calls once the pool is whole again."""
    after, whole = [], []
    for round_ in range(count):
        replaced = pool.stats()["engines_replaced"]
        os.kill(pool.engine_pids()[round_ % pool.size], signal.SIGKILL)
        time.sleep(0.2)
        index = round_ % len(workload)
        after.append(len(pool.predict(workload.requests[index], workload.candidates[index],
                                      timeout=timeout)))
        deadline = time.perf_counter() + 30
        while pool.stats()["engines_replaced"] <= replaced and time.perf_counter() < deadline:
            time.sleep(0.01)
        for offset in range(1, 6):
            index = (round_ + offset) % len(workload)
            whole.append(len(pool.predict(workload.requests[index], workload.candidates[index],
                                          timeout=timeout)))
    return {"after": after, "whole": statistics.mean(whole)}


def closes(args: List[str], size: int, workload: Workload, count: int,
           timeout: float) -> Dict[str, List[float]]:
    """Open ``count`` pools one after the other, make a few calls on each,
    and close it: the wall time of each ``close()`` and the CPU its
    processes spent in it (seconds).

    The CPU of the engines and their fork server up to ``close()`` is read
    from ``/proc/PID/task/*/schedstat``; what they spent in all is what this
    process's reaped children gained once they exited (the fork server reaps
    its engines), so the difference is what closing cost them.
    """
    walls, cpus = [], []
    for round_ in range(count):
        with VowpalWabbitPool(RecommenderFormatter(), args, size=size) as pool:
            for index in range(10):
                index = (round_ * 10 + index) % len(workload)
                pool.predict(workload.requests[index], workload.candidates[index],
                             timeout=timeout)
            pids = pool.engine_pids()
            servers = {parent_pid(pid) for pid in pids} - {os.getpid()}
            before = sum(run_seconds(pid) for pid in set(pids) | servers)
            reaped = children_cpu_seconds()
            began = time.perf_counter()
            pool.close()
            walls.append(time.perf_counter() - began)
            cpus.append(children_cpu_seconds() - reaped - before)
    return {"wall": walls, "cpu": cpus}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reloads", type=int, default=10)
    parser.add_argument("--every", type=float, default=1.0,
                        help="seconds between reloads (default 1)")
    parser.add_argument("--size", type=int, default=2, help="engines (default 2)")
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--timeout", type=float, default=0.010)
    parser.add_argument("--deaths", type=int, default=0,
                        help="measure this many engine deaths instead of reloads")
    parser.add_argument("--closes", type=int, default=0,
                        help="measure closing this many pools instead of reloads")
    parser.add_argument("--bits", type=int, default=20,
                        help="the model's -b (default 20; 25 for a recommender-sized model)")
    options = parser.parse_args()
    if options.reloads < 1 or options.every <= 0 or options.size < 1:
        parser.error("--reloads and --size must be at least 1, --every above 0")
    workload = Workload(50, options.items)
    with tempfile.TemporaryDirectory() as directory:
        model = os.path.join(directory, "model.vw")
        train_model(workload, model, bits=options.bits)
        args = prediction_args(model)
        if options.closes:
            closed = closes(args, options.size, workload, options.closes, options.timeout)
            print(f"pool of {options.size}, {options.closes} pools closed")
            print("close(): wall time " + ", ".join(f"{value * 1000:.0f}" for value in closed["wall"])
                  + " ms; CPU of its processes from close() to their exit "
                  + ", ".join(f"{value * 1000:.0f}" for value in closed["cpu"]) + " ms")
            return
        with VowpalWabbitPool(RecommenderFormatter(), args, size=options.size) as pool:
            for index in range(WARM_UP_CALLS):
                pool.predict(workload.requests[index], workload.candidates[index],
                             timeout=options.timeout)
            if options.deaths:
                died = deaths(pool, workload, options.deaths, options.timeout)
                print(f"pool of {options.size}, {options.items} items per call, timeout "
                      f"{options.timeout * 1000:g} ms, {options.deaths} engines killed")
                print(f"predictions of the call 200 ms after an engine died: "
                      f"{statistics.mean(died['after']):,.0f} on average ("
                      + ", ".join(map(str, died["after"]))
                      + f"); calls once the pool was whole again: {died['whole']:,.0f}")
                return
            result = measure(pool, workload, args, options.reloads, options.every,
                             options.timeout)
    print(f"pool of {options.size}, {options.items} items per call, timeout "
          f"{options.timeout * 1000:g} ms, -b {options.bits}, {options.reloads} reloads "
          f"(each {result['reload_ms']:.0f} ms on average)")
    print(f"predictions per call: steady {result['steady']:,.0f}; during a reload "
          f"{result['during']:,.0f}; calls 1-{AFTER} on the new engines "
          + ", ".join(f"{value:,.0f}" for value in result["after"])
          + f" (the fewest in a first call: {result['fewest_first']})")


if __name__ == "__main__":
    main()

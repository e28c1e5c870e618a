"""How slow a process's first calls are after it has waited, and what goes with it.

Run: ``python -m benchmarks.idle_ramp [--idle S] [--turns N] [--calls N]
[--nonblocking] [--driver vw|loop]``.

One process serves turns of ``--calls`` calls (10 ms each by default), each
turn after ``--idle`` seconds without a call, as a contender of the main
benchmark waits while the others take their turns. Per place in the turn it
prints the mean predictions per call and, from the scheduler's statistics of
the engine's threads (``/proc/PID/task/TID/sched``, where the kernel has them):

* ``util``: each thread's utilisation when the call ended (the kernel's load
  tracking, 0 to 1024). It decays while the process waits and takes about
  100 ms of work to build up again; schedulers that place threads or choose
  a CPU's speed by it treat the engine as nearly idle in the meantime;
* ``preempted``: how often each thread was switched out while it could
  still run, during the call;
* ``migrated``: how often each thread moved to another CPU, during the call.

The first calls of a turn return fewer predictions while the utilisation is
low and the engine's threads are preempted more often; that shows the two go
together, not which causes the slowness (a host's caches and its own
scheduling of the virtual CPUs may take part). The main benchmark begins
every contender's turn with unmeasured calls (``--warm-up-calls``) for this
reason.
"""

import argparse
import gc
import os
import statistics
import tempfile
import time
from typing import Dict, List, Optional

from subwabbit import VowpalWabbitNonBlockingProcess, VowpalWabbitProcess

from .drivers import start
from .turns import train_model
from .workload import RecommenderFormatter, Workload, prediction_args

#: the fields of ``/proc/PID/task/TID/sched`` read, by the name printed
FIELDS = {"util": "se.avg.util_avg", "preempted": "nr_involuntary_switches",
          "migrated": "se.nr_migrations"}


def thread_stats(pid: int) -> Optional[Dict[int, Dict[str, float]]]:
    """The scheduler's statistics of each of ``pid``'s threads, by thread id
    (``None`` where the kernel does not show them)."""
    stats: Dict[int, Dict[str, float]] = {}
    try:
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            values: Dict[str, float] = {}
            with open(f"/proc/{pid}/task/{tid}/sched", encoding="utf-8") as handle:
                for line in handle:
                    key, _, value = line.partition(":")
                    fields = value.split()
                    if fields:
                        try:
                            values[key.strip()] = float(fields[0])
                        except ValueError:
                            pass
            stats[int(tid)] = values
    except OSError:
        return None
    if not stats or any(name not in values for values in stats.values()
                        for name in FIELDS.values()):
        return None
    return stats


def measure(process: object, pid: int, workload: Workload, turns: int, calls: int, idle: float,
            timeout: float) -> List[List[Dict[str, object]]]:
    """Per place in the turn, one record per turn: ``predictions``, and per
    engine thread (in the order of their ids) ``util`` (at the call's end),
    ``preempted`` and ``migrated`` (during the call); without the kernel's
    statistics, or if the engine's threads changed during the call, only
    ``predictions``."""
    places: List[List[Dict[str, object]]] = [[] for _ in range(calls)]
    gc.disable()
    try:
        for turn in range(turns):
            time.sleep(idle)
            for place in range(calls):
                index = (turn * calls + place) % len(workload)
                before = thread_stats(pid)
                got = process.predict(  # type: ignore[attr-defined]
                    workload.requests[index], workload.candidates[index], timeout=timeout)
                count = len(list(got))
                after = thread_stats(pid)
                record: Dict[str, object] = {"predictions": count}
                if before and after and sorted(before) == sorted(after):
                    tids = sorted(after)
                    record["util"] = [after[tid][FIELDS["util"]] for tid in tids]
                    for name in ("preempted", "migrated"):
                        record[name] = [after[tid][FIELDS[name]] - before[tid][FIELDS[name]]
                                        for tid in tids]
                places[place].append(record)
    finally:
        gc.enable()
    return places


def summary(places: List[List[Dict[str, object]]]) -> List[str]:
    """One printed line per place in the turn: means over the turns."""
    lines = []
    for number, records in enumerate(places, start=1):
        line = f"{number:5d} {statistics.mean(r['predictions'] for r in records):11,.0f}"  # type: ignore[misc]
        for name in FIELDS:
            per_thread = [r[name] for r in records if name in r]
            if per_thread:
                means = [statistics.mean(values) for values in zip(*per_thread)]  # type: ignore[call-overload]
                line += f"  {name} " + "/".join(f"{mean:.0f}" if name == "util" else f"{mean:.1f}"
                                                for mean in means)
        lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=0.6,
                        help="seconds without a call before each turn (default 0.6, about "
                             "the main benchmark's wait between a contender's turns)")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--calls", type=int, default=20, help="calls per turn (default 20)")
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--timeout", type=float, default=0.010)
    parser.add_argument("--nonblocking", action="store_true",
                        help="the nonblocking class (default: the blocking class)")
    parser.add_argument("--driver", choices=("vw", "loop"), default=None,
                        help="the wheel engine's driver (default: the class's own choice)")
    options = parser.parse_args()
    if options.idle < 0 or options.turns < 1 or options.calls < 1:
        parser.error("--idle must be at least 0, --turns and --calls at least 1")
    cls = VowpalWabbitNonBlockingProcess if options.nonblocking else VowpalWabbitProcess
    workload = Workload(100, options.items)
    with tempfile.TemporaryDirectory() as directory:
        model = os.path.join(directory, "model.vw")
        train_model(workload, model)
        with start(cls, RecommenderFormatter(), prediction_args(model), options.driver) as process:
            stats = thread_stats(process.pid)
            places = measure(process, process.pid, workload, options.turns, options.calls,
                             options.idle, options.timeout)
    print(f"{cls.__name__}, {options.turns} turns of {options.calls} calls x {options.items} "
          f"items after {options.idle * 1000:g} ms idle, timeout {options.timeout * 1000:g} ms; "
          + (f"engine threads: {len(stats)} (per-thread figures in the order of their ids)"
             if stats else "(no scheduler statistics from /proc/PID/task/TID/sched here: "
             "predictions only)"))
    print("place predictions")
    for line in summary(places):
        print(line)


if __name__ == "__main__":
    main()

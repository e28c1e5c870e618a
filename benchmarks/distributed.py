"""Training on many Dask workers with VW's AllReduce: speed and accuracy.

Run: ``python -m benchmarks.distributed [--lines N] [--workers 1,2] [--out FILE]``
(``--quick`` for a smoke run, ``--skip-loss`` or ``--skip-speed`` for one part).

**Speed.** The benchmark's training workload (:mod:`benchmarks.workload`: a
logistic regression with 18 quadratic interactions, ``-b 20``) is learnt by
one write-only process in this Python process (the one-core reference), then
by :func:`subwabbit.distributed.run_job` on a ``LocalCluster`` of 1 and 2
worker processes (one thread each), the lines split evenly. For each job:
lines per second from submission to the last node's end, and where the time
went: starting (submission to the engines' start, shards sent included),
writing the shards, the engines' end of pass, waiting at the rendezvous for
the slowest node, and the averaging (from the tree's formation to the last
engine's exit, writing the model included): the share of the job spent in
the AllReduce.

**Accuracy.** A synthetic click log with a learnable signal (user segment x
item category, user and item biases) is learnt by one write-only process on
all of it (no AllReduce) and by :func:`~subwabbit.distributed.train` on 2 and
3 nodes of a ``LocalCluster``, with each of vw's recipes: online learning averaged
after one pass and after three, and BFGS. The held-out logistic loss of each
model is compared with the one process's.

Prints both tables; ``--out`` also writes them as JSON.
"""

import argparse
import logging
import math
import os
import random
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from subwabbit import VowpalWabbitBaseFormatter, VowpalWabbitProcess
from subwabbit.distributed import JobResult, run_job, train

from .report import write_json
from .workload import RecommenderFormatter, Workload, model_args

#: vw's recipes compared for accuracy: engine arguments after the model's.
RECIPES: Dict[str, List[str]] = {
    "online, 1 pass": [],
    "online, 3 passes": ["--passes", "3"],
    "bfgs, 40 passes": ["--bfgs", "--passes", "40", "--l2", "1", "--holdout_off",
                        "--termination", "0"],
}


def _cluster(workers: int, processes: bool) -> Tuple[Any, Any]:
    import distributed  # pylint: disable=import-outside-toplevel
    cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1,
                                       processes=processes, dashboard_address="127.0.0.1:0",
                                       silence_logs=logging.ERROR)
    return cluster, distributed.Client(cluster)


def _split(calls: Sequence[Any], count: int) -> List[List[Any]]:
    return [list(calls[node::count]) for node in range(count)]


# ------------------------------------------------------------------ speed

def one_process(batches: Sequence[Any], vw_args: List[str], directory: str) -> float:
    """Lines per second of one write-only process fed every batch here."""
    lines = sum(len(items) for _, items, _ in batches)
    started = time.perf_counter()
    with VowpalWabbitProcess(RecommenderFormatter(), vw_args + [
            "-f", os.path.join(directory, "one.vw")], write_only=True) as process:
        for request, items, labels in batches:
            process.train(request, items, labels)
    return lines / (time.perf_counter() - started)


def phases(result: JobResult) -> Dict[str, float]:
    """Where a job's time went, in seconds (the slowest node's, per phase)."""
    reports, states = result.reports, result.states
    return {
        "start": max(report.engine_started_at for report in reports) - result.started_at,
        "write shards": max(report.fed_at - report.engine_started_at for report in reports),
        "end of pass": max((state.engine_at or 0.0) - report.fed_at
                           for state, report in zip(states, reports)),
        "wait at rendezvous": result.waiting_seconds,
        "allreduce and save": result.allreduce_seconds,
    }


def measure_speed(lines: int, workers: Sequence[int], rounds: int) -> Dict[str, Any]:
    """The speed table: one process, then a LocalCluster of each size."""
    print(f"building the workload ({lines:,} training lines)...", flush=True)
    batches = Workload().training_batches(lines)
    vw_args = model_args() + ["--l2", "1e-6"]
    results: Dict[str, Any] = {"lines": lines, "vw_args": vw_args, "rounds": rounds}
    with tempfile.TemporaryDirectory() as directory:
        best = max(one_process(batches, vw_args, directory) for _ in range(rounds))
    results["one process"] = {"lines_per_s": best}
    print(f"one write-only process here: {best:,.0f} lines/s", flush=True)
    for count in workers:
        cluster, client = _cluster(count, processes=True)
        try:
            shards = _split(batches, count)
            runs = [run_job(client, shards, RecommenderFormatter(), vw_args, timeout_s=600)
                    for _ in range(rounds)]
        finally:
            client.close()
            cluster.close()
        fastest = min(runs, key=lambda run: run.seconds)
        split = phases(fastest)
        entry = {"lines_per_s": fastest.lines / fastest.seconds, "seconds": fastest.seconds,
                 "phases_s": split,
                 "allreduce_share": fastest.allreduce_seconds / fastest.seconds}
        results[f"{count} workers"] = entry
        print(f"{count} worker(s): {entry['lines_per_s']:,.0f} lines/s "
              f"({fastest.seconds:.2f} s; AllReduce and save {fastest.allreduce_seconds:.3f} s "
              f"= {100 * entry['allreduce_share']:.1f}% of the job)", flush=True)
        print("    " + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in split.items()),
              flush=True)
    alone = results.get("1 workers")
    bits = int(vw_args[vw_args.index("-b") + 1])
    for count in workers:
        entry = results[f"{count} workers"]
        if count > 1 and alone is not None:
            # One node sums nothing: its "allreduce and save" is the saving and
            # the exit. What more nodes add to it is the AllReduce.
            extra = entry["seconds"] * entry["allreduce_share"] - \
                alone["seconds"] * alone["allreduce_share"]
            entry["allreduce_alone_s"] = extra
            print(f"{count} workers: the AllReduce itself (their 'allreduce and save' less one "
                  f"worker's) {extra:.3f} s = {100 * extra / entry['seconds']:.1f}% of the job; "
                  f"each pass sums {4 << bits:,} bytes of learning rates and "
                  f"{16 << bits:,} of weights", flush=True)
    return results


# --------------------------------------------------------------- accuracy

class ClickFormatter(VowpalWabbitBaseFormatter):
    """``{'user': .., 'segment': ..}`` requests and ``{'item': .., 'category': ..}`` items."""

    def format_common_features(self, common_features: Dict[str, int],
                               debug_info: Any = None) -> str:
        return f"|u u{common_features['user']} s{common_features['segment']}"

    def format_item_features(self, common_features: Any, item_features: Dict[str, int],
                             debug_info: Any = None) -> str:
        return f"|i i{item_features['item']} c{item_features['category']}"


def click_log(requests: int, seed: int) -> List[Tuple[Dict[str, int], List[Dict[str, int]],
                                                       List[int]]]:
    """``train()`` calls of a synthetic click log: 20 items a request, a click
    with the probability of a hidden logistic model (segment x category
    effects, user and item biases); the world is the same for every seed."""
    world = random.Random(42)
    effects = [[world.gauss(0, 1.5) for _ in range(40)] for _ in range(50)]
    users = [(world.randrange(50), world.gauss(0, 0.5)) for _ in range(3000)]
    items = [(world.randrange(40), world.gauss(0, 0.5)) for _ in range(800)]
    rng = random.Random(seed)
    calls = []
    for _ in range(requests):
        user = rng.randrange(len(users))
        segment, user_bias = users[user]
        shown = rng.sample(range(len(items)), 20)
        labels = []
        for item in shown:
            category, item_bias = items[item]
            logit = effects[segment][category] + user_bias + item_bias - 1.0
            labels.append(1 if rng.random() < 1 / (1 + math.exp(-logit)) else -1)
        calls.append(({"user": user, "segment": segment},
                      [{"item": item, "category": items[item][0]} for item in shown], labels))
    return calls


def held_out_loss(model: str, calls: Sequence[Any], load_args: List[str]) -> float:
    """Mean logistic loss of the model's raw scores on ``calls``."""
    total, count = 0.0, 0
    with VowpalWabbitProcess(ClickFormatter(), ["-i", model, "-t", "--quiet"] + load_args) as scorer:
        for request, items, labels in calls:
            for score, label in zip(scorer.predict(request, items), labels):
                total += math.log1p(math.exp(-label * score))
                count += 1
    return total / count


def one_process_model(calls: Sequence[Any], vw_args: List[str], path: str) -> None:
    """Train one plain write-only process (no AllReduce) on every call."""
    args = list(vw_args) + ["-f", path]
    if "--passes" in vw_args:
        args += ["--cache_file", path + ".cache", "--kill_cache"]
    if "--bfgs" in vw_args:
        args.append("--predict_only_model")
    with VowpalWabbitProcess(ClickFormatter(), args, write_only=True) as process:
        for request, items, labels in calls:
            process.train(request, items, labels)


def measure_loss(requests: int, nodes: Sequence[int]) -> Dict[str, Any]:
    """The accuracy table: each recipe, one process against 2 and 3 nodes."""
    calls = click_log(requests, seed=1)
    test = click_log(max(200, requests // 6), seed=2)
    base = ["--quiet", "--loss_function", "logistic", "-q", "ui", "-b", "18"]
    results: Dict[str, Any] = {"training_lines": 20 * requests, "held_out_lines": 20 * len(test),
                               "vw_args": base, "recipes": {}}
    cluster, client = _cluster(max(nodes), processes=False)
    try:
        with tempfile.TemporaryDirectory() as directory:
            for name, recipe in RECIPES.items():
                load = ["--predict_only_model"] if "--bfgs" in recipe else []
                row: Dict[str, Any] = {"vw_args": recipe}
                path = os.path.join(directory, "one.vw")
                started = time.perf_counter()
                one_process_model(calls, base + recipe, path)
                row["one process"] = {"loss": held_out_loss(path, test, load),
                                      "seconds": time.perf_counter() - started}
                for count in nodes:
                    path = os.path.join(directory, f"{count}.vw")
                    started = time.perf_counter()
                    train(client, _split(calls, count), ClickFormatter(), base + recipe, path)
                    row[f"{count} nodes"] = {"loss": held_out_loss(path, test, load),
                                             "seconds": time.perf_counter() - started}
                one = row["one process"]["loss"]
                for count in nodes:
                    row[f"{count} nodes"]["vs_one_process"] = row[f"{count} nodes"]["loss"] / one - 1
                results["recipes"][name] = row
                print(f"{name}: one process {one:.4f}; " + "; ".join(
                    f"{count} nodes {row[f'{count} nodes']['loss']:.4f} "
                    f"({100 * row[f'{count} nodes']['vs_one_process']:+.1f}%)" for count in nodes),
                      flush=True)
    finally:
        client.close()
        cluster.close()
    return results


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.distributed",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000,
                        help="training lines of the speed measurement (default 200000)")
    parser.add_argument("--workers", default="1,2",
                        help="LocalCluster sizes of the speed measurement (default 1,2)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of the speed measurement; the fastest counts (default 2)")
    parser.add_argument("--requests", type=int, default=3000,
                        help="requests of 20 items in the accuracy measurement (default 3000)")
    parser.add_argument("--skip-speed", action="store_true", help="measure accuracy only")
    parser.add_argument("--skip-loss", action="store_true", help="measure speed only")
    parser.add_argument("--quick", action="store_true", help="a smoke run on little data")
    parser.add_argument("--out", help="also write the results as JSON to this file")
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for name in ("distributed", "tornado"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if options.quick:
        options.lines, options.rounds, options.requests = 20_000, 1, 300
    results: Dict[str, Any] = {}
    if not options.skip_speed:
        results["speed"] = measure_speed(options.lines,
                                         [int(count) for count in options.workers.split(",")],
                                         options.rounds)
    if not options.skip_loss:
        results["accuracy"] = measure_loss(options.requests, (2, 3))
    if options.out:
        write_json(results, options.out)


if __name__ == "__main__":
    main()

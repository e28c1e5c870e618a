"""Soak test: a long run through each process class, every prediction checked.

Run: ``python -m benchmarks.soak [--predictions N] [--classes blocking,nonblocking]``.

A model is trained with a write-only process on random labels; the engine
then scores every request from a file, which gives the expected value of
every (request, item) pair. Each class then serves requests until it has
returned ``--predictions`` predictions, with a mix of timeouts: no timeout,
10 ms, and a 1 ms budget that is too short for a whole request, so partial
answers and leftovers cleared by the next call happen all the time. Every
prediction returned is compared with the engine's, and the resident set size
(RSS) of this Python process is sampled along the way.

Prints a summary per class and writes it as JSON (``--out``).
"""

import argparse
import logging
import os
import random
import tempfile
import time
from typing import Any, Dict, List, Sequence, Tuple

from subwabbit import VowpalWabbitNonBlockingProcess, VowpalWabbitProcess

from .batch_size import BenchFormatter, workload
from .limit import engine_command, file_predictions
from .report import write_json

VW_ARGS = ["-q", "ui", "--loss_function", "logistic", "-b", "20"]
TIMEOUTS = (None, 0.010, 0.010, 0.001)
CLASSES = {"blocking": VowpalWabbitProcess, "nonblocking": VowpalWabbitNonBlockingProcess}


def rss_bytes() -> int:
    """This process's resident set size, from /proc/self/statm."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def prepare(directory: str, requests: int, items: int) -> Tuple[List[Any], List[List[float]], str]:
    """Train a model and let the engine score every request from a file."""
    formatter = BenchFormatter()
    data = workload(requests, items)
    rng = random.Random(11)
    model = os.path.join(directory, "model.vw")
    with VowpalWabbitProcess(formatter, VW_ARGS + ["--quiet", "-f", model],
                             write_only=True) as trainer:
        for common, request_items in data:
            trainer.train(common, request_items, [rng.choice((-1, 1)) for _ in request_items],
                          [None] * len(request_items))
    lines = []
    for common, request_items in data:
        common_part = formatter.format_common_features(common)
        lines += [formatter.get_formatted_example(common_part,
                                                  formatter.format_item_features(common, item))
                  for item in request_items]
    flat = file_predictions(engine_command(), ["-i", model, "-t", "--quiet"], lines, directory,
                            "score")
    expected = [flat[index * items:(index + 1) * items] for index in range(requests)]
    return data, expected, model


def soak(cls: Any, model: str, data: Sequence[Any], expected: Sequence[List[float]],
         target: int, samples: int) -> Dict[str, Any]:
    """Serve requests until ``target`` predictions; check each; sample RSS."""
    rng = random.Random(3)
    served = calls = partial = mismatches = 0
    curve: List[Tuple[int, int]] = []
    next_sample = 0
    started = time.perf_counter()
    with cls(BenchFormatter(), VW_ARGS + ["-i", model, "-t", "--quiet"]) as process:
        while served < target:
            if served >= next_sample:
                curve.append((served, rss_bytes()))
                next_sample += target // samples
            request = rng.randrange(len(data))
            common, items = data[request]
            timeout = TIMEOUTS[calls % len(TIMEOUTS)]
            got = list(process.predict(common, items, timeout=timeout))
            truth = expected[request]
            mismatches += sum(1 for value, want in zip(got, truth) if abs(value - want) > 1e-5)
            if timeout is None and len(got) != len(items):
                mismatches += 1
            partial += len(got) < len(items)
            served += len(got)
            calls += 1
    curve.append((served, rss_bytes()))
    elapsed = time.perf_counter() - started
    # The first samples include warm-up (imports, buffers); compare from the second.
    start_rss = curve[1][1] if len(curve) > 2 else curve[0][1]
    return {
        "predictions": served, "calls": calls, "partial_calls": partial,
        "mismatches": mismatches, "seconds": round(elapsed, 1),
        "rss_mib_first": round(curve[0][1] / 2**20, 1),
        "rss_mib_start": round(start_rss / 2**20, 1),
        "rss_mib_end": round(curve[-1][1] / 2**20, 1),
        "rss_mib_max": round(max(rss for _, rss in curve) / 2**20, 1),
        "rss_curve_mib": [(count, round(rss / 2**20, 2)) for count, rss in curve],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predictions", type=int, default=1_000_000,
                        help="predictions per class (default 1,000,000)")
    parser.add_argument("--classes", default="blocking,nonblocking")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=20, help="RSS samples per class")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "subwabbit-soak.json"),
                        help="where the JSON goes (default: %(default)s; the committed one is "
                             "benchmarks/results/soak.json)")
    options = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: Dict[str, Any] = {"command": "python -m benchmarks.soak", "vw_args": VW_ARGS,
                               "timeouts": TIMEOUTS, "classes": {}}
    with tempfile.TemporaryDirectory() as directory:
        data, expected, model = prepare(directory, options.requests, options.items)
        for name in options.classes.split(","):
            summary = soak(CLASSES[name], model, data, expected, options.predictions,
                           options.samples)
            results["classes"][name] = summary
            print(f"{name:>12}: {summary['predictions']:,} predictions in {summary['calls']:,} "
                  f"calls ({summary['partial_calls']:,} cut by a timeout), "
                  f"{summary['mismatches']} wrong, {summary['seconds']} s; RSS MiB "
                  f"start {summary['rss_mib_start']} end {summary['rss_mib_end']} "
                  f"max {summary['rss_mib_max']}")
    write_json(results, options.out)


if __name__ == "__main__":
    main()

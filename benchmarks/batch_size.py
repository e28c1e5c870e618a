"""Throughput of VowpalWabbitProcess.predict by batch size.

Run: ``python -m benchmarks.batch_size [--requests N] [--items N]``.

A synthetic recommender-like workload (request and item namespaces, a
quadratic interaction) is scored without a timeout; the script prints
predictions per second for each batch size, best of three rounds.
"""

import argparse
import random
import time
from typing import Any, Dict, List

from subwabbit import VowpalWabbitBaseFormatter, VowpalWabbitProcess


class BenchFormatter(VowpalWabbitBaseFormatter):
    """Formats ``{'user': .., 'tokens': [..]}`` requests and ``{'id': .., 'tags': [..]}`` items."""

    def format_common_features(self, common_features: Dict[str, Any], debug_info: Any = None) -> str:
        return f"|u u{common_features['user']} " + " ".join(common_features["tokens"])

    def format_item_features(self, common_features: Any, item_features: Dict[str, Any],
                             debug_info: Any = None) -> str:
        return f"|i i{item_features['id']} " + " ".join(item_features["tags"])


def workload(requests: int, items: int, seed: int = 7) -> List[Any]:
    rng = random.Random(seed)
    catalogue = [{"id": index, "tags": [f"t{rng.randrange(200)}" for _ in range(3)]}
                 for index in range(3000)]
    return [({"user": rng.randrange(10000), "tokens": [f"w{rng.randrange(5000)}" for _ in range(8)]},
             rng.sample(catalogue, items)) for _ in range(requests)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--batch-sizes", default="1,5,10,20,50,100,200,500")
    options = parser.parse_args()
    data = workload(options.requests, options.items)
    args = ["--quiet", "-q", "ui", "--loss_function", "logistic", "-b", "20"]
    print(f"{options.requests} requests x {options.items} items, vw args {args}")
    print(f"{'batch_size':>10} {'predictions/s':>14}")
    for batch_size in [int(size) for size in options.batch_sizes.split(",")]:
        with VowpalWabbitProcess(BenchFormatter(), args, batch_size=batch_size) as process:
            best = 0.0
            for _ in range(3):
                started = time.perf_counter()
                count = sum(len(list(process.predict(common, items))) for common, items in data)
                best = max(best, count / (time.perf_counter() - started))
        print(f"{batch_size:>10} {best:>14,.0f}")


if __name__ == "__main__":
    main()

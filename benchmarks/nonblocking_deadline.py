"""Wall time and predictions per call of VowpalWabbitNonBlockingProcess.predict
under a timeout.

Run: ``python -m benchmarks.nonblocking_deadline [--calls N] [--timeout S]``.
Uses the workload of :mod:`benchmarks.batch_size` (1,000 items per request).
"""

import argparse
import statistics
import time

from subwabbit import VowpalWabbitNonBlockingProcess

from .batch_size import BenchFormatter, workload
from .report import nearest_rank


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=0.010)
    options = parser.parse_args()
    data = workload(50, 1000)
    args = ["--quiet", "-q", "ui", "--loss_function", "logistic", "-b", "20"]
    walls, counts = [], []
    with VowpalWabbitNonBlockingProcess(BenchFormatter(), args) as process:
        for call in range(options.calls):
            common, items = data[call % len(data)]
            started = time.perf_counter()
            counts.append(sum(1 for _ in process.predict(common, items, timeout=options.timeout)))
            walls.append(time.perf_counter() - started)
    walls.sort()

    def quantile(q: float) -> float:
        return nearest_rank(walls, q) * 1000

    print(f"{options.calls} calls, timeout {options.timeout * 1000:.1f} ms, vw args {args}")
    print(f"wall ms: mean {statistics.mean(walls) * 1000:.3f} p50 {quantile(0.5):.3f} "
          f"p99 {quantile(0.99):.3f} max {walls[-1] * 1000:.3f}")
    print(f"predictions per call: mean {statistics.mean(counts):.0f} "
          f"min {min(counts)} max {max(counts)}")


if __name__ == "__main__":
    main()

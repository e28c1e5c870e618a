"""The longest event-loop stall while the asyncio client serves a request.

Run: ``python -m benchmarks.loop_stall [--requests N] [--timeout S]``.

Serves requests of the main benchmark's workload (3,000 items, 18 quadratic
interactions) through :class:`~subwabbit.AsyncVowpalWabbitProcess` while a
ticker task on the same loop yields back as often as it can, and reports the
longest gap between two ticks that fell within a call (a gap is time during
which the loop ran nothing else). For comparison it does the same with
:class:`~subwabbit.VowpalWabbitNonBlockingProcess` called straight from a
coroutine, which holds the loop for the whole call.
"""

import argparse
import asyncio
import logging
import os
import statistics
import tempfile
import time
from typing import Any, Awaitable, Callable, Dict, List

from subwabbit import AsyncVowpalWabbitProcess, VowpalWabbitNonBlockingProcess, VowpalWabbitProcess

from .report import nearest_rank
from .workload import RecommenderFormatter, Workload, prediction_args, training_args

logger = logging.getLogger(__name__)


async def _measure(call: Callable[[int], Awaitable[int]], requests: int) -> Dict[str, Any]:
    """Run ``call`` for each request with a ticker on the loop; collect gaps."""
    ticks: List[float] = []
    running = True

    async def ticker() -> None:
        while running:
            ticks.append(time.perf_counter())
            await asyncio.sleep(0)

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    worst_per_call, walls, counts = [], [], []
    for index in range(requests):
        ticks.clear()
        began = time.perf_counter()
        counts.append(await call(index))
        ended = time.perf_counter()
        walls.append(ended - began)
        inside = [began] + [tick for tick in ticks if began <= tick <= ended] + [ended]
        worst_per_call.append(max(b - a for a, b in zip(inside, inside[1:])))
    running = False
    await task
    worst_per_call.sort()
    return {"stall_max_ms": worst_per_call[-1] * 1000,
            "stall_p50_ms": nearest_rank(worst_per_call, 0.5) * 1000,
            "stall_p99_ms": nearest_rank(worst_per_call, 0.99) * 1000,
            "wall_mean_ms": statistics.mean(walls) * 1000,
            "predictions_mean": statistics.mean(counts)}


async def _run(options: argparse.Namespace, model_path: str, work: Workload) -> None:
    formatter = RecommenderFormatter()
    pairs = work.pairs(range(len(work)))
    timeout = options.timeout
    async with AsyncVowpalWabbitProcess(formatter, prediction_args(model_path)) as model:
        async def async_call(index: int) -> int:
            common, items = pairs[index % len(pairs)]
            return len(await model.predict(common, items, timeout=timeout))

        await _measure(async_call, 5)  # warm up
        result = await _measure(async_call, options.requests)
    _print("AsyncVowpalWabbitProcess", timeout, result)
    with VowpalWabbitNonBlockingProcess(formatter, prediction_args(model_path)) as process:
        async def blocking_call(index: int) -> int:
            common, items = pairs[index % len(pairs)]
            return len(list(process.predict(common, items, timeout=timeout)))

        result = await _measure(blocking_call, options.requests)
    _print("VowpalWabbitNonBlockingProcess called in a coroutine", timeout, result)


def _print(name: str, timeout: Any, result: Dict[str, Any]) -> None:
    print(f"{name} (timeout={timeout}): longest loop stall per call, ms: "
          f"p50 {result['stall_p50_ms']:.3f} p99 {result['stall_p99_ms']:.3f} "
          f"max {result['stall_max_ms']:.3f}; wall mean {result['wall_mean_ms']:.2f} ms; "
          f"predictions mean {result['predictions_mean']:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=0.010,
                        help="seconds per call (default 0.010)")
    parser.add_argument("--pretrain-lines", type=int, default=30000)
    options = parser.parse_args()
    work = Workload(requests=max(options.requests, 5), items=3000)
    with tempfile.TemporaryDirectory() as directory:
        model_path = os.path.join(directory, "model.vw")
        with VowpalWabbitProcess(RecommenderFormatter(), training_args(model_path),
                                 write_only=True) as trainer:
            for request, items, labels in work.training_batches(options.pretrain_lines):
                trainer.train(request, items, labels, [None] * len(items))
        asyncio.run(_run(options, model_path, work))


if __name__ == "__main__":
    main()

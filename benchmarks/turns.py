"""Processes that take turns on the benchmark workload, request by request.

What the side-by-side benchmarks (:mod:`benchmarks.pool`,
:mod:`benchmarks.nonblocking_settings`, :mod:`benchmarks.drivers`) share: a
pretrained model, and every request served by each process in turn, so that a
change in the machine's speed hits all of them alike.
"""

import gc
import time
from typing import Any, List, Sequence, Tuple

from subwabbit import VowpalWabbitProcess

from .workload import RecommenderFormatter, Workload, model_args


def train_model(workload: Workload, path: str, bits: int = 20, lines: int = 30000) -> None:
    """Pretrain the workload's model with a write-only process (``-b bits``)."""
    formatter = RecommenderFormatter()
    args = model_args(bits) + ["--l2", "1e-6", "-f", path]
    with VowpalWabbitProcess(formatter, args, write_only=True) as trainer:
        for request, items, labels in workload.training_batches(lines):
            trainer.train(request, items, labels, [None] * len(labels))


def take_turns(processes: Sequence[Any], workload: Workload, timeout: float,
               gap: float = 0.0) -> Tuple[List[List[int]], List[List[float]]]:
    """Serve every request of ``workload`` by each process in turn, with the
    garbage collector off, then close the processes.

    :param processes: anything with ``predict(request, items, timeout=)`` (a
        list or an iterator) and ``close()``
    :param gap: seconds of idleness before each call
    :returns: per process, the predictions of each call and its wall time in
        seconds
    """
    counts: List[List[int]] = [[] for _ in processes]
    walls: List[List[float]] = [[] for _ in processes]
    gc.disable()
    try:
        for index in range(len(workload)):
            request, items = workload.requests[index], workload.candidates[index]
            for number, process in enumerate(processes):
                if gap:
                    time.sleep(gap)
                began = time.perf_counter()
                got = process.predict(request, items, timeout=timeout)
                if not isinstance(got, list):
                    got = list(got)
                walls[number].append(time.perf_counter() - began)
                counts[number].append(len(got))
    finally:
        gc.enable()
        for process in processes:
            process.close()
    return counts, walls

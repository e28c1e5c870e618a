"""How long a call takes by the size of its request, when it gets every
prediction: a pool beside the single-process classes.

Run: ``python -m benchmarks.sizes [--sizes N,N,...] [--rounds N] [--calls N]
[--timeout S] [--json PATH]``. About a minute on 2 cores with the defaults.

The main benchmark asks how many predictions a call returns within 10 ms;
a service whose requests are small gets all of them well within its budget,
and what it sees is how long the call took. Every contender scores the
first N candidates of the workload's requests, one caller, back to back,
with a timeout long enough for all of them (``--timeout``, default 50 ms: a
call that returns fewer fails the run). The contenders take turns of
``--calls`` calls (ten unmeasured calls first), round after round, so that
a change in the machine's speed hits all of them alike; the table shows
each one's median over the rounds of its mean wall time per call, in
microseconds. The contenders: a pool of the default size, a pool of 1 (its
engine runs vw's own driver), the nonblocking and the blocking class.
"""

import argparse
import contextlib
import gc
import json
import os
import statistics
import tempfile
import time
from typing import Any, Dict, List, Sequence

from subwabbit import VowpalWabbitNonBlockingProcess, VowpalWabbitPool, VowpalWabbitProcess

from .turns import train_model
from .workload import RecommenderFormatter, Workload, prediction_args

#: request sizes measured by default
DEFAULT_SIZES = (30, 100, 300, 1000)


def _contenders(stack: contextlib.ExitStack, args: List[str]) -> Dict[str, Any]:
    """Open the contenders, each closed when ``stack`` is."""
    formatter = RecommenderFormatter()
    pool = stack.enter_context(VowpalWabbitPool(formatter, args))
    return {f"pool ({pool.size})": pool,
            "pool (1)": stack.enter_context(VowpalWabbitPool(formatter, args, size=1)),
            "nonblocking": stack.enter_context(VowpalWabbitNonBlockingProcess(formatter, args)),
            "blocking": stack.enter_context(VowpalWabbitProcess(formatter, args))}


def measure(workload: Workload, args: List[str], sizes: Sequence[int], rounds: int,
            calls: int, timeout: float) -> Dict[int, Dict[str, float]]:
    """Median over ``rounds`` of each contender's mean wall time per call, in
    seconds, for each request size.

    :raises RuntimeError: when a call returns fewer predictions than items
    """
    table: Dict[int, Dict[str, float]] = {}
    with contextlib.ExitStack() as stack:
        contenders = _contenders(stack, args)
        gc.disable()
        try:
            for size in sizes:
                means: Dict[str, List[float]] = {name: [] for name in contenders}
                for _ in range(rounds):
                    for name, model in contenders.items():
                        means[name].append(_turn(model, workload, size, calls, timeout, name))
                table[size] = {name: statistics.median(values) for name, values in means.items()}
        finally:
            gc.enable()
    return table


def _turn(model: Any, workload: Workload, size: int, calls: int, timeout: float,
          name: str) -> float:
    """Ten unmeasured calls, then ``calls`` measured: the mean wall time."""
    for index in range(10):
        list(model.predict(workload.requests[index % len(workload)],
                           workload.candidates[index % len(workload)][:size], timeout=timeout))
    began = time.perf_counter()
    for index in range(calls):
        got = list(model.predict(workload.requests[index % len(workload)],
                                 workload.candidates[index % len(workload)][:size],
                                 timeout=timeout))
        if len(got) != size:
            raise RuntimeError(f"{name} returned {len(got)} of {size} predictions within "
                               f"{timeout * 1000:g} ms: give a longer --timeout")
    return (time.perf_counter() - began) / calls


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                        help="request sizes, comma-separated (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100, help="measured calls per turn")
    parser.add_argument("--timeout", type=float, default=0.050)
    parser.add_argument("--json", help="also write the table to this file")
    options = parser.parse_args(argv)
    sizes = [int(size) for size in options.sizes.split(",")]
    if min(sizes) < 1 or options.rounds < 1 or options.calls < 1 or options.timeout <= 0:
        parser.error("sizes, --rounds and --calls must be at least 1, --timeout above 0")
    workload = Workload(50, max(sizes))
    with tempfile.TemporaryDirectory() as directory:
        model = os.path.join(directory, "model.vw")
        train_model(workload, model)
        table = measure(workload, prediction_args(model), sizes, options.rounds,
                        options.calls, options.timeout)
    names = list(next(iter(table.values())))
    print(f"wall time per call (µs), every prediction returned; median of {options.rounds} "
          f"rounds of {options.calls} calls, one caller, timeout {options.timeout * 1000:g} ms")
    width = max(len(name) for name in names) + 2
    print("items".rjust(6) + "".join(name.rjust(width) for name in names))
    for size, row in table.items():
        print(str(size).rjust(6) + "".join(f"{row[name] * 1e6:{width},.0f}" for name in names))
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump({"sizes": {str(size): row for size, row in table.items()},
                       "rounds": options.rounds, "calls": options.calls,
                       "timeout": options.timeout}, handle, indent=2)


if __name__ == "__main__":
    main()

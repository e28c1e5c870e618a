"""subwabbit 2.1.0's write-only ``train``, on the same labelled lines, for comparison.

subwabbit 2.1.0 runs ``vw`` from ``PATH``, so it is measured only when a vw
executable is given. It is installed with pip into a folder of its own
(``pip install --no-deps --target DIR subwabbit==2.1.0``, kept in the user's
cache folder) and run in a child Python whose ``sys.path`` starts with that
folder, so that it never shadows the subwabbit under test::

    python -m benchmarks.legacy --target DIR --lines 100000 --model MODEL

The child builds the benchmark's workload from the same seed, trains
``VowpalWabbitProcess(formatter, args, write_only=True)`` of 2.1.0 on the
same batches with the same formatter, and prints one JSON object: the time of
the ``train`` calls and ``close()``, minus the ``close()`` of an idle 2.1.0
write-only process (the shutdown the engine-alone figure has subtracted too).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

VERSION = "2.1.0"
#: Labelled items per request in :meth:`Workload.training_batches`.
PER_REQUEST = 500


def cache_dir() -> str:
    """Where 2.1.0 is installed: ``$XDG_CACHE_HOME`` (or ``~/.cache``)/subwabbit-benchmarks."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "subwabbit-benchmarks", f"subwabbit-{VERSION}")


def install(target: Optional[str] = None) -> str:
    """Install subwabbit 2.1.0 into ``target`` (once) and return ``target``.

    :raises RuntimeError: when pip cannot install it (no index, say), with pip's last words
    """
    target = target or cache_dir()
    if os.path.isfile(os.path.join(target, "subwabbit", "version.py")):
        return target
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
         "--target", target, f"subwabbit=={VERSION}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if done.returncode != 0:
        last = [line for line in done.stdout.splitlines() if not line.startswith("WARNING")]
        raise RuntimeError(f"pip could not install subwabbit=={VERSION}: "
                           + (" ".join(last[-3:]) or f"exit code {done.returncode}"))
    return target


def measure(target: str, vw_executable: str, requests: int, items: int, seed: int, lines: int,
            model: str) -> Dict[str, Any]:
    """Run the child that trains with 2.1.0 and return what it measured.

    :param vw_executable: the ``vw`` that 2.1.0 runs (its folder goes first on ``PATH``)
    :raises RuntimeError: when the child fails
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # The first requests are the same whatever their number, and the training
    # batches use one request each: the child needs no more than that.
    requests = min(requests, -(-lines // PER_REQUEST))
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(vw_executable) + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    argv = [sys.executable, "-m", "benchmarks.legacy", "--target", target, "--requests",
            str(requests), "--items", str(items), "--seed", str(seed), "--lines", str(lines),
            "--model", model]
    done = subprocess.run(argv, cwd=root, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"subwabbit {VERSION}'s train failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _train_in_child(options: argparse.Namespace) -> Dict[str, Any]:
    """In the child: 2.1.0's write-only train of the benchmark's batches."""
    sys.path.insert(0, options.target)
    # pylint: disable=import-outside-toplevel
    import subwabbit
    if getattr(subwabbit, "__version__", None) != VERSION or not os.path.abspath(
            subwabbit.__file__).startswith(os.path.abspath(options.target)):
        raise RuntimeError(f"expected subwabbit {VERSION} from {options.target}, "
                           f"imported {subwabbit.__file__}")
    from .workload import RecommenderFormatter, Workload, training_args

    formatter = RecommenderFormatter()
    workload = Workload(options.requests, options.items, options.seed)
    batches = workload.training_batches(options.lines)
    count = sum(len(labels) for _, _, labels in batches)
    formatter.lines(workload.requests[0], workload.items)  # fills the item cache, as elsewhere
    idle_model = options.model + ".idle"
    idle = subwabbit.VowpalWabbitProcess(formatter, training_args(idle_model), write_only=True)
    began = time.perf_counter()
    idle.close()
    close_idle = time.perf_counter() - began
    process = subwabbit.VowpalWabbitProcess(formatter, training_args(options.model),
                                            write_only=True)
    cpu = time.process_time()
    calls: List[float] = []
    began = time.perf_counter()
    for request, items, labels in batches:
        called = time.perf_counter()
        process.train(request, items, labels, [None] * len(labels))
        calls.append(time.perf_counter() - called)
    sent = time.perf_counter() - began
    process.close()
    elapsed = time.perf_counter() - began
    seconds = elapsed - close_idle
    return {"lines": count, "train_calls_s": sent, "until_closed_s": elapsed,
            "idle_close_s": close_idle, "seconds": seconds,
            "lines_per_s": count / seconds if seconds > 0 else None,
            "client_cpu_us_per_line": (time.process_time() - cpu) / count * 1e6,
            "call_seconds": calls, "subwabbit": subwabbit.__version__,
            "model_bytes": os.path.getsize(options.model),
            "method": f"subwabbit {VERSION} (pip install --target, run in a child Python): "
                      "train() calls and close(), minus the close() of an idle write-only "
                      "process"}


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.legacy",
                                     description=f"subwabbit {VERSION}'s write-only train "
                                                 "(run by python -m benchmarks)")
    parser.add_argument("--target", required=True, help=f"the folder subwabbit {VERSION} is in")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--model", required=True, help="where the model goes")
    options = parser.parse_args(argv)
    print(json.dumps(_train_in_child(options)))


if __name__ == "__main__":
    main()

"""Training throughput: the same labelled lines learnt by every trainer, in turns.

* the engine alone: each engine reading the lines from a file with ``-d``
  and writing a model with ``-f`` (start-up subtracted, see
  :class:`~benchmarks.limit.FileRuns`);
* subwabbit's write-only ``train`` on each engine: ``train`` calls of the
  workload's batches and ``close()`` (the model is on disk when it returns),
  minus the ``close()`` of an idle write-only process;
* subwabbit 2.1.0's write-only ``train`` the same way, where it can be
  installed and a vw executable is given (see :mod:`benchmarks.legacy`);
* pyvw learning line by line in this process.

The first round's write-only train on the default engine writes the model
every contender then loads.
"""

import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from subwabbit import VowpalWabbitProcess

from . import legacy
from .contenders import PyvwRunner
from .engines import Engine
from .limit import FileRuns
from .report import engine_alone
from .workload import RecommenderFormatter, training_args

Batch = Tuple[Any, List[Any], List[int]]


def write_only(name: str) -> str:
    """The name of the write-only train's row on an engine."""
    return f"write-only train ({name})"


#: The row of subwabbit 2.1.0 (it runs the vw executable).
SUBWABBIT_2 = f"subwabbit {legacy.VERSION} train (vw)"


class Training:
    """The training measurement of one run.

    :param engines: every engine; the first is the default one
    :param model_path: where the first round's write-only train on the
        default engine writes the model the contenders load
    :param legacy_reason: why 2.1.0 is not measured, or ``""`` to measure it
    """

    def __init__(self, formatter: RecommenderFormatter, batches: Sequence[Batch],
                 engines: Sequence[Engine], workdir: str, model_path: str,
                 workload_options: Dict[str, int], legacy_reason: str = "") -> None:
        self.formatter = formatter
        self.batches = list(batches)
        self.engines = list(engines)
        self.workdir = workdir
        self.model_path = model_path
        self.workload_options = workload_options
        self.legacy_reason = legacy_reason
        self.legacy_target = ""
        self.labelled: List[str] = []
        for request, items, labels in self.batches:
            self.labelled += formatter.lines(request, items, labels)
        #: per-call rows for the calls table
        self.calls: List[Dict[str, Any]] = []

    def engine_model(self, engine: Engine) -> str:
        """Where the engine alone writes its model."""
        return os.path.join(self.workdir, f"model-engine-{engine.name}.vw")

    def run(self, rounds: int, log: Callable[[str], None]) -> Dict[str, Any]:
        """Take turns, best of ``rounds`` for each trainer; the results for the report."""
        files = {engine.name: FileRuns(engine.command, training_args(self.engine_model(engine)),
                                       self.labelled, self.workdir, f"training-{engine.name}",
                                       predictions=False)
                 for engine in self.engines}
        executable = next((engine for engine in self.engines if engine.executable), None)
        if not self.legacy_reason:
            if executable is None:
                self.legacy_reason = (f"subwabbit {legacy.VERSION} runs a vw executable, and none "
                                      "was given")
            elif executable.command[0] == "taskset":
                self.legacy_reason = (f"subwabbit {legacy.VERSION} runs vw from PATH, which "
                                      "--engine-cpus cannot pin")
            else:
                try:
                    self.legacy_target = legacy.install()
                except RuntimeError as exc:
                    self.legacy_reason = str(exc)
        best: Dict[str, Dict[str, Any]] = {}
        # Rates round by round, each trainer's beside its engine alone's in the
        # same round: on a noisy machine their ratio varies less than the best of each.
        per_round: Dict[str, List[Optional[float]]] = {}

        def keep(name: str, result: Dict[str, Any]) -> None:
            per_round.setdefault(name, []).append(result["lines_per_s"])
            if name not in best or (result["lines_per_s"] or 0.0) > (
                    best[name]["lines_per_s"] or 0.0):
                best[name] = result

        for round_index in range(rounds):
            for engine in self.engines:
                runs = files[engine.name]
                runs.run()
                seconds = runs.full_runs[-1][0] - runs.one_runs[-1][0]
                per_round.setdefault(engine_alone(engine.name), []).append(
                    (runs.lines - 1) / seconds if seconds > 0 else None)
                model = (self.model_path if round_index == 0 and engine is self.engines[0]
                         else os.path.join(self.workdir, f"model-{engine.name}-{round_index}.vw"))
                keep(write_only(engine.name), self._write_only_train(engine, model, round_index))
            if self.legacy_target and executable is not None:
                keep(SUBWABBIT_2, self._subwabbit_2(executable, round_index))
            keep("pyvw", self._pyvw_learn())
        results: Dict[str, Any] = {
            "lines": len(self.labelled), "args": training_args("MODEL"), "rounds": rounds,
            "engines": {name: runs.result() for name, runs in files.items()},
            "write_only_train": {engine.name: best[write_only(engine.name)]
                                 for engine in self.engines},
            "pyvw": best["pyvw"],
            "subwabbit_2": best.get(SUBWABBIT_2, {"skipped": self.legacy_reason}),
            "per_round_lines_per_s": per_round}
        for engine in self.engines:
            results["write_only_train"][engine.name]["median_round_vs_engine"] = median_ratio(
                per_round[write_only(engine.name)], per_round[engine_alone(engine.name)])
        if SUBWABBIT_2 in per_round and executable is not None:
            results["subwabbit_2"]["median_round_vs_engine"] = median_ratio(
                per_round[SUBWABBIT_2], per_round[engine_alone(executable.name)])
        figures = [f"{engine_alone(name)} {_rate(data['lines_per_s'])}"
                   for name, data in results["engines"].items()]
        figures += [f"{write_only(name)} {_rate(data['lines_per_s'])}"
                    for name, data in results["write_only_train"].items()]
        if SUBWABBIT_2 in best:
            figures.append(f"{SUBWABBIT_2} {_rate(best[SUBWABBIT_2]['lines_per_s'])}")
        figures.append(f"pyvw {_rate(best['pyvw']['lines_per_s'])}")
        log("training: " + ", ".join(figures) + " lines/s"
            + (f" (subwabbit {legacy.VERSION} not measured: {self.legacy_reason})"
               if self.legacy_reason else ""))
        return results

    def _write_only_train(self, engine: Engine, model: str, round_index: int) -> Dict[str, Any]:
        """subwabbit's write-only train of the batches on ``engine``, writing ``model``."""
        fmt, lines = self.formatter, len(self.labelled)
        # An idle write-only process's close(): the shutdown that the
        # engine-alone figure has subtracted too.
        idle = VowpalWabbitProcess(fmt, training_args(os.path.join(self.workdir, "model-idle.vw")),
                                   write_only=True, vw_command=engine.command)
        began = time.perf_counter()
        idle.close()
        close_idle = time.perf_counter() - began
        process = VowpalWabbitProcess(fmt, training_args(model), write_only=True,
                                      vw_command=engine.command)
        clock = time.perf_counter
        calls: List[float] = []
        cpu = time.process_time()
        began = clock()
        for request, items, labels in self.batches:
            called = clock()
            process.train(request, items, labels)
            calls.append(clock() - called)
        sent = clock() - began
        process.close()
        elapsed = clock() - began
        seconds = elapsed - close_idle
        self._add_calls(write_only(engine.name), engine.name, round_index, calls)
        return {"lines": lines, "train_calls_s": sent, "until_closed_s": elapsed,
                "idle_close_s": close_idle, "seconds": seconds,
                # An idle close() slower than the whole run: noise beyond the work.
                "lines_per_s": lines / seconds if seconds > 0 else None,
                "client_cpu_us_per_line": (time.process_time() - cpu) / lines * 1e6,
                "method": "train() calls and close(), minus the close() of an idle write-only "
                          "process"}

    def _subwabbit_2(self, executable: Engine, round_index: int) -> Dict[str, Any]:
        assert executable.executable is not None
        options = self.workload_options
        result = legacy.measure(self.legacy_target, executable.executable, options["requests"],
                                options["items"], options["seed"], len(self.labelled),
                                os.path.join(self.workdir, f"model-2x-{round_index}.vw"))
        self._add_calls(SUBWABBIT_2, executable.name, round_index, result.pop("call_seconds"))
        return result

    def _pyvw_learn(self) -> Dict[str, Any]:
        learner = PyvwRunner(self.formatter,
                             training_args(os.path.join(self.workdir, "model-pyvw.vw")))
        began = time.perf_counter()
        learner.learn_lines(self.labelled)
        seconds = time.perf_counter() - began
        learner.close()
        return {"lines": len(self.labelled), "seconds": seconds,
                "lines_per_s": len(self.labelled) / seconds,
                "method": "Workspace._parse + pylibvw.vw.learn + _finish_example per line"}

    def _add_calls(self, contender: str, engine: str, round_index: int,
                   seconds: Sequence[float]) -> None:
        for index, (call_s, (_, _, labels)) in enumerate(zip(seconds, self.batches)):
            self.calls.append({"phase": "train", "contender": contender, "engine": engine,
                               "round": round_index, "request": index, "items": len(labels),
                               "wall_s": call_s})


def median_ratio(values: Sequence[Optional[float]],
                 references: Sequence[Optional[float]]) -> Optional[float]:
    """The median of ``value / reference`` over the rounds where both were measured."""
    ratios = [value / reference for value, reference in zip(values, references)
              if value and reference]
    return statistics.median(ratios) if ratios else None


def _rate(lines_per_s: Optional[float]) -> str:
    return "unmeasured" if lines_per_s is None else f"{lines_per_s:,.0f}"


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m benchmarks.training``: the main benchmark's training
    measurement alone, with more rounds if wanted."""
    # pylint: disable=import-outside-toplevel
    import argparse
    import tempfile

    from .engines import choose_engines, find_executable
    from .report import engine_of, summarize_training, training_table
    from .workload import Workload

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.training",
        description="Training throughput of the main benchmark's workload alone: each engine "
                    "reading the labelled lines from a file, the write-only train on each "
                    "engine, subwabbit 2.1.0 (with a vw executable) and pyvw, in turns.")
    parser.add_argument("--lines", type=int, default=100_000, help="labelled lines (default 100000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--vw-executable", default="", metavar="PATH",
                        help="a vw 9.x executable to measure beside the wheel's engine")
    parser.add_argument("--no-subwabbit-2", action="store_true",
                        help="do not install and measure subwabbit 2.1.0")
    options = parser.parse_args(argv)
    if options.vw_executable:
        try:
            options.vw_executable = find_executable(options.vw_executable)
        except ValueError as exc:
            parser.error(f"--vw-executable: {exc}")
    default, engines, note = choose_engines(options.vw_executable)
    print(note)
    formatter = RecommenderFormatter()
    # The main benchmark's workload (1,000 requests of 3,000 items, seed 2024)
    # and its pretraining batches.
    workload = Workload(1000, 3000, 2024)
    with tempfile.TemporaryDirectory(prefix="subwabbit-training-") as workdir:
        training = Training(formatter, workload.training_batches(options.lines), engines, workdir,
                            os.path.join(workdir, "model.vw"),
                            {"requests": 1000, "items": 3000, "seed": 2024},
                            "--no-subwabbit-2 was given" if options.no_subwabbit_2 else "")
        results = training.run(options.rounds, print)
    rows, _ = summarize_training(results, engine_of([engine.name for engine in engines],
                                                    default.name))
    print(training_table(rows))
    if "skipped" in results["subwabbit_2"]:
        print(f"subwabbit {legacy.VERSION} was not measured: {results['subwabbit_2']['skipped']}")


if __name__ == "__main__":
    main()

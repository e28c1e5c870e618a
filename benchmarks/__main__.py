"""Predictions within a 10 ms budget: pyvw, subwabbit's blocking and nonblocking
classes, and the engine alone, side by side.

Run from a checkout: ``python -m benchmarks`` (``--quick`` for a smoke run,
``--help`` for the options). The results go to a new folder outside the
source tree, ``subwabbit-benchmark-DATE-TIME`` in the system's temporary
folder, unless ``--out DIR`` names one; the run prints where. It writes
``results.rst`` (the report), ``results.json`` (every measurement and
summary), ``calls.csv.gz`` (one row per timed call, see
:mod:`benchmarks.calls`) and two plots. The report committed with the code in
``benchmarks/results/`` is refreshed only on purpose, with
``--out benchmarks/results``.

What is measured, in this order (each measurement takes turns between the
contenders and the engine alone, so that a change of load on the machine
hits all of them alike):

1. Training (:mod:`benchmarks.training`): the pretraining's labelled lines,
   learnt by each engine from a file, by ``VowpalWabbitProcess(write_only=True).train``
   on each engine (the default engine's writes the model every contender
   then loads), by subwabbit 2.1.0 where it can run, and by pyvw. Best of a
   few rounds.
2. Correctness: every contender's predictions for the first requests equal
   the engine's (the engine reading the same lines from a file with
   ``-t -i model -p``).
3. The ways to call pyvw, on the same lines; the fastest correct one is the
   ``pyvw`` contender, the fastest public-API one ``pyvw-public``.
4. ``timeout=0.010`` on every request, in blocks of requests: predictions
   returned and wall time per contender, CPU used by the client, by its
   engine and by the rest of the machine; and each engine alone on a sample
   of each block's requests (see :mod:`benchmarks.limit`).
5. Throughput without a timeout, best of a few rounds, and each engine alone
   on the same lines from a file and on stdin.
6. Where the time goes: ``detailed_metrics`` of the two subwabbit classes.

The model classes run on the engine subwabbit chooses by itself (the
wheel's, after a plain ``pip install``); ``--vw-executable PATH`` adds a vw
executable's rows beside the wheel engine's (see :mod:`benchmarks.engines`).

The garbage collector is treated alike for all: a full collection and
``gc.freeze()`` after the set-up, then it runs as it would in a service.
"""

import argparse
import gc
import os
import shlex
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Set

from subwabbit.command import ENGINE_ENV_VAR
from subwabbit.engine.program import DRIVER_ENV_VAR

from .contenders import (PYVW_METHODS, Contender, PyvwRunner, blocking_contender,
                         nonblocking_contender, pool_contender, pyvw_contender)
from .cpu import children_cpu_seconds, machine_busy_seconds, process_cpu_seconds
from .engines import Engine, choose_engines, find_executable
from .limit import FileRuns, file_predictions, lines_within, per_request_rates
from .pauses import machine_pauses
from .report import engine_alone, engine_stdin, machine_info, summarize, write_outputs
from .training import Training
from .workload import RecommenderFormatter, Workload, prediction_args

ALL_CONTENDERS = ("pyvw", "pyvw-public", "blocking", "nonblocking", "pool", "pool-1")
#: The folder of the report committed with the code (refreshed only on purpose).
COMMITTED_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def default_out_dir() -> str:
    """A new folder outside the source tree: ``subwabbit-benchmark-DATE-TIME``
    in the system's temporary folder."""
    return os.path.join(tempfile.gettempdir(),
                        "subwabbit-benchmark-" + time.strftime("%Y%m%d-%H%M%S"))


def requests_before(first: int, count: int, total: int) -> List[int]:
    """The ``count`` requests before request ``first`` of ``total`` (wrapping
    around), the nearest first: those that begin a turn unmeasured."""
    return [(first - 1 - call) % total for call in range(count)]


def parse_options(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Predictions within a 10 ms budget: pyvw, subwabbit's blocking and "
                    "nonblocking classes, and the engine alone.")
    parser.add_argument("--requests", type=int, default=1000, help="requests (default 1000)")
    parser.add_argument("--items", type=int, default=3000,
                        help="items in the catalogue; each request scores all (default 3000)")
    parser.add_argument("--seed", type=int, default=2024, help="workload seed (default 2024)")
    parser.add_argument("--timeout", type=float, default=0.010,
                        help="predict() timeout in seconds (default 0.010)")
    parser.add_argument("--contenders", default=",".join(ALL_CONTENDERS),
                        help="comma-separated subset of %(default)s; the engine alone always runs")
    parser.add_argument("--train-lines", type=int, default=100_000,
                        help="labelled lines of the pretraining (default 100000)")
    parser.add_argument("--train-rounds", type=int, default=3,
                        help="rounds of the training measurement; best counts (default 3)")
    parser.add_argument("--throughput-requests", type=int, default=20,
                        help="requests scored without a timeout, per round (default 20)")
    parser.add_argument("--rounds", type=int, default=6,
                        help="rounds of the throughput measurement; best counts (default 6)")
    parser.add_argument("--engine-requests", type=int, default=1000,
                        help="requests the engine alone is measured on, spread evenly "
                             "(default 1000: all of them)")
    parser.add_argument("--check-requests", type=int, default=3,
                        help="requests checked against the engine before timing (default 3)")
    parser.add_argument("--breakdown-requests", type=int, default=100,
                        help="requests run with detailed_metrics (default 100)")
    parser.add_argument("--block", type=int, default=20,
                        help="requests per turn of a contender in the timeout pass (default 20)")
    parser.add_argument("--warm-up-calls", type=int, default=15,
                        help="unmeasured calls that begin each turn of a contender in the "
                             "timeout pass, on the requests before the block; the engine "
                             "alone's turn begins with as many requests (at least one). An "
                             "engine that waited while the others ran is slow for about "
                             "100 ms (python -m benchmarks.idle_ramp); default 15, 0: none")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="batch_size of both subwabbit classes (default: the class default)")
    parser.add_argument("--max-pending-lines", type=int, default=None,
                        help="max_pending_lines of the nonblocking class (default: its default)")
    parser.add_argument("--engine-cpus", default="",
                        help="run every engine under 'taskset -c ENGINE_CPUS' (e.g. 1)")
    parser.add_argument("--client-cpus", default="",
                        help="pin this Python process (the client, and pyvw) to these CPUs "
                             "(e.g. 0); engines then default to all CPUs")
    parser.add_argument("--pause-probe", type=float, default=4.0,
                        help="seconds of busy loop, half before and half after the timeout "
                             "pass, that measure the machine's own pauses (default 4)")
    parser.add_argument("--out", default=None,
                        help="output folder (default: a new subwabbit-benchmark-DATE-TIME folder "
                             f"in {tempfile.gettempdir()}); the report committed with the code is "
                             "refreshed with --out benchmarks/results")
    parser.add_argument("--vw-executable", default="", metavar="PATH",
                        help="a vw 9.x executable to measure beside the wheel's engine: the "
                             "engine alone on both, the write-only train on both and subwabbit "
                             "2.1.0 (which needs one); the classes still run on the engine "
                             "subwabbit chooses by itself")
    parser.add_argument("--no-subwabbit-2", action="store_true",
                        help="do not install and measure subwabbit 2.1.0's training")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run in well under a minute (small sizes; overrides them)")
    options = parser.parse_args(argv)
    if options.quick:
        options.requests, options.items = 40, 1000
        options.train_lines, options.train_rounds = 20_000, 1
        options.throughput_requests, options.rounds = 20, 3
        options.engine_requests, options.check_requests, options.breakdown_requests = 20, 2, 10
        options.block, options.warm_up_calls = 5, 2
        options.pause_probe = 0.5
    options.contenders = [name.strip() for name in options.contenders.split(",") if name.strip()]
    unknown = set(options.contenders) - set(ALL_CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders: {', '.join(sorted(unknown))}")
    if options.timeout <= 0:
        parser.error("--timeout must be positive")
    if options.block < 1 or options.warm_up_calls < 0:
        parser.error("--block must be at least 1 and --warm-up-calls at least 0")
    if options.out is None:
        options.out = default_out_dir()
    if options.vw_executable:
        try:
            options.vw_executable = find_executable(options.vw_executable)
        except ValueError as exc:
            parser.error(f"--vw-executable: {exc}")
    for name in ("requests", "items", "train_lines", "train_rounds", "throughput_requests",
                 "rounds", "engine_requests", "check_requests", "breakdown_requests", "block"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return options


def _rate(lines_per_s: Optional[float]) -> str:
    return "unmeasured" if lines_per_s is None else f"{lines_per_s:,.0f}"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def isclose(a: float, b: float) -> bool:
    """pyvw's floats against the engine's printed ones (six decimals)."""
    return abs(a - b) <= 1e-6 + 1e-5 * abs(b)


class Benchmark:
    """One run: the workload, the contenders and everything measured."""

    def __init__(self, options: argparse.Namespace, workdir: str) -> None:
        self.options = options
        self.workdir = workdir
        self.results: Dict[str, Any] = {}
        self.formatter = RecommenderFormatter()
        self.model_path = os.path.join(workdir, "model.vw")
        self.contenders: Dict[str, Contender] = {}
        self.pyvw: Optional[PyvwRunner] = None
        default, engines, note = choose_engines(options.vw_executable, options.engine_cpus)
        #: the engine the classes run on, and every engine measured alone (default first)
        self.default: Engine = default
        self.engines: List[Engine] = engines
        self.command = default.command
        self.engine_model = ""
        #: one row per timed call (see benchmarks.calls)
        self.calls: List[Dict[str, Any]] = []
        self.results["engines"] = {
            "default": default.name, "note": note,
            "engines": [{"name": engine.name, "description": engine.description,
                         "command": engine.command} for engine in engines]}

    # ------------------------------------------------------------ set-up

    def build_workload(self) -> None:
        options = self.options
        started = time.perf_counter()
        self.workload = Workload(options.requests, options.items, options.seed)
        log(f"workload: {options.requests} requests x {options.items} items "
            f"({time.perf_counter() - started:.1f} s)")
        sample = self.formatter.lines(self.workload.requests[0], self.workload.candidates[0][:1])[0]
        self.results["workload"] = {
            "requests": options.requests, "items": options.items, "seed": options.seed,
            "lines_per_request": options.items, "example_line": sample,
            "mean_line_bytes": None}

    def train(self) -> None:
        """Pretrain with the write-only train, beside the other trainers (see
        :mod:`benchmarks.training`)."""
        options = self.options
        training = Training(
            self.formatter, self.workload.training_batches(options.train_lines), self.engines,
            self.workdir, self.model_path,
            {"requests": options.requests, "items": options.items, "seed": options.seed},
            legacy_reason="--no-subwabbit-2 was given" if options.no_subwabbit_2 else "")
        self.results["training"] = training.run(options.train_rounds, log)
        self.calls += training.calls
        self.engine_model = training.engine_model(self.default)

    def start_contenders(self) -> None:
        options = self.options
        args = prediction_args(self.model_path)
        self.pyvw = PyvwRunner(self.formatter, args)
        options_blocking: Dict[str, Any] = {"vw_command": self.command}
        options_nonblocking: Dict[str, Any] = {"vw_command": self.command}
        if options.batch_size:
            options_blocking["batch_size"] = options_nonblocking["batch_size"] = options.batch_size
        if options.max_pending_lines:
            options_nonblocking["max_pending_lines"] = options.max_pending_lines
        if "blocking" in options.contenders:
            self.contenders["blocking"] = blocking_contender(self.formatter, args, options_blocking)
        if "nonblocking" in options.contenders:
            self.contenders["nonblocking"] = nonblocking_contender(self.formatter, args,
                                                                   options_nonblocking)
        options_pool = dict(options_nonblocking)
        if "pool" in options.contenders:
            self.contenders["pool"] = pool_contender("pool", self.formatter, args, options_pool)
        if "pool-1" in options.contenders:
            self.contenders["pool-1"] = pool_contender("pool-1", self.formatter, args,
                                                       dict(options_pool, size=1))

    def close(self) -> None:
        for contender in self.contenders.values():
            contender.close()
        if self.pyvw is not None:
            self.pyvw.close()

    # -------------------------------------------------------- correctness

    def check(self) -> None:
        """Every contender and pyvw method against the engine reading a file."""
        fmt, workload = self.formatter, self.workload
        indices = range(min(self.options.check_requests, len(workload)))
        lines: List[str] = []
        for request, items in workload.pairs(indices):
            lines += fmt.lines(request, items)
        expected = file_predictions(self.command, prediction_args(self.model_path), lines,
                                    self.workdir)
        # The model of the write-only train against the one the engine trained from a file.
        self.results["training"]["same_predictions_as_engine_model"] = expected == file_predictions(
            self.command, prediction_args(self.engine_model), lines, self.workdir,
            "check-engine-model")
        checks: Dict[str, Any] = {}

        def compare(name: str, predict: Any, exact: bool) -> bool:
            got: List[float] = []
            for request, items in workload.pairs(indices):
                got += predict(request, items, None)
            worst = max((abs(a - b) for a, b in zip(got, expected)), default=0.0)
            equal = len(got) == len(expected) and all(
                (a == b) if exact else isclose(a, b) for a, b in zip(got, expected))
            checks[name] = {"lines": len(expected), "returned": len(got), "equal": equal,
                            "max_abs_difference": worst,
                            "comparison": "exact" if exact else "within the printed precision"}
            return equal

        assert self.pyvw is not None
        for method, spec in PYVW_METHODS.items():
            compare(f"pyvw: {method}", getattr(self.pyvw, spec["attr"]), exact=False)
        for name, contender in self.contenders.items():
            compare(name, contender.predict, exact=True)
        self.results["correctness"] = checks
        failed = [name for name, check in checks.items() if not check["equal"]]
        log(f"correctness: {len(expected)} lines of {len(indices)} requests; "
            + (f"MISMATCH: {', '.join(failed)}" if failed else "all equal to the engine"))
        for name in failed:
            self.contenders.pop(name, None)

    # ---------------------------------------------------------------- pyvw

    def choose_pyvw(self) -> None:
        """Measure every pyvw method (best of 3 rounds, in turns) and pick the fastest."""
        assert self.pyvw is not None
        pairs = self.workload.pairs(range(min(5, len(self.workload))))
        best = {method: 0.0 for method in PYVW_METHODS}
        for _ in range(3):
            for method, spec in PYVW_METHODS.items():
                function = getattr(self.pyvw, spec["attr"])
                began = time.perf_counter()
                count = sum(len(function(request, items, None)) for request, items in pairs)
                best[method] = max(best[method], count / (time.perf_counter() - began))
        methods: Dict[str, Any] = {}
        for method, spec in PYVW_METHODS.items():
            correct = self.results["correctness"][f"pyvw: {method}"]["equal"]
            methods[method] = {"lines_per_s": best[method], "correct": correct,
                               "public_api": spec["public"], "how": spec["how"]}
            log(f"pyvw {method}: {best[method]:,.0f} lines/s{'' if correct else ' (INCORRECT)'}")
        correct = [name for name, data in methods.items() if data["correct"]]
        public = [name for name in correct if methods[name]["public_api"]]
        fastest = max(correct, key=lambda name: methods[name]["lines_per_s"], default=None)
        fastest_public = max(public, key=lambda name: methods[name]["lines_per_s"], default=None)
        self.results["pyvw_methods"] = methods
        self.results["pyvw_choice"] = {"pyvw": fastest, "pyvw-public": fastest_public}
        chosen: Dict[str, Contender] = {}  # pyvw first in the tables
        if "pyvw" in self.options.contenders and fastest:
            chosen["pyvw"] = pyvw_contender("pyvw", self.pyvw, fastest)
        if "pyvw-public" in self.options.contenders and fastest_public:
            chosen["pyvw-public"] = pyvw_contender("pyvw-public", self.pyvw, fastest_public)
        self.contenders = {**chosen, **self.contenders}

    # ------------------------------------------------------------- timing

    def warm_up(self) -> None:
        pairs = self.workload.pairs(range(min(20, len(self.workload))))
        for contender in self.contenders.values():
            for request, items in pairs:
                contender.predict(request, items, self.options.timeout)

    def _engine_sample(self) -> List[int]:
        """The requests the engine alone is measured on: evenly spread."""
        count = max(1, min(self.options.engine_requests, len(self.workload)))
        step = len(self.workload) / count
        return sorted({int(index * step) for index in range(count)})

    def timeout_pass(self) -> None:
        """Every request through every contender with the timeout, and each
        engine alone on the sampled requests, taking turns block by block."""
        options, workload = self.options, self.workload
        data: Dict[str, Dict[str, Any]] = {
            name: {"requests": [], "lines": [], "wall_s": [], "client_cpu_s": 0.0,
                   "engine_cpu_s": 0.0, "other_cpu_s": 0.0, "elapsed_s": 0.0,
                   "in_process": contender.engine_pid is None}
            for name, contender in self.contenders.items()}
        sample = set(self._engine_sample())
        engines = {engine_alone(engine.name): engine for engine in self.engines}
        alone: Dict[str, Dict[str, Any]] = {
            engine.name: {"requests": [], "seconds": [], "lines": [], "other_cpu_s": 0.0,
                          "elapsed_s": 0.0} for engine in self.engines}
        for turn, start in enumerate(range(0, len(workload), options.block)):
            indices = list(range(start, min(start + options.block, len(workload))))
            for name in rotated(list(self.contenders) + list(engines), turn):
                if name in engines:
                    engine = engines[name]
                    self._engine_turn(engine, [index for index in indices if index in sample],
                                      alone[engine.name], turn)
                else:
                    self._contender_turn(self.contenders[name], indices, data[name], turn)
            if (indices[-1] + 1) * 4 // len(workload) > indices[0] * 4 // len(workload):
                log(f"timeout pass: {indices[-1] + 1}/{len(workload)} requests")
        for record in data.values():
            total = sum(record["lines"]) or 1
            record["client_cpu_us_per_line"] = record["client_cpu_s"] / total * 1e6
            record["engine_cpu_us_per_line"] = record["engine_cpu_s"] / total * 1e6
            record["other_load_cores"] = record["other_cpu_s"] / record["elapsed_s"]
        for record in alone.values():
            record["other_load_cores"] = record["other_cpu_s"] / max(record["elapsed_s"], 1e-9)
            record["lines_per_s"] = (sum(len(workload.candidates[index])
                                         for index in record["requests"])
                                     / sum(record["seconds"]))
            record["method"] = (
                "per block of requests, one engine reads the block's sampled requests from a "
                f"file (after {max(1, options.warm_up_calls)} warm-up request(s), the "
                "requests before the block's first sampled one) and writes its predictions "
                "to a pipe, read every "
                "2 ms and stamped evenly in between; a request's time runs from the last "
                "prediction of the request before it to its own last; lines within the timeout "
                "= min(n, n * timeout / time)")
        warm_ups: Dict[str, List[int]] = {}
        for call in self.calls:
            if call["phase"] == "warm-up":
                warm_ups.setdefault(call["contender"], []).append(call["predictions"])
        self.results["timeout_warm_up"] = {
            "calls_per_turn": options.warm_up_calls,
            "mean_predictions": {name: sum(counts) / len(counts)
                                 for name, counts in warm_ups.items()}}
        self.results["timeout"] = {"timeout_s": options.timeout, "block": options.block,
                                   "contenders": data}
        self.results["engine_per_request"] = alone
        log("engine alone per request: " + ", ".join(
            f"{name} {sum(record['lines']) / len(record['lines']):,.0f}"
            for name, record in alone.items())
            + f" lines within {options.timeout * 1000:g} ms on average")

    def _contender_turn(self, contender: Contender, indices: List[int],
                        record: Dict[str, Any], turn: int) -> None:
        """One contender's turn in the timeout pass."""
        predict, timeout = contender.predict, self.options.timeout
        block = self.workload.pairs(indices)
        clock = time.perf_counter
        self._warm_up_turn(contender, indices[0], turn)
        walls: List[float] = []
        counts: List[int] = []
        busy, cpu, engine_cpu = (machine_busy_seconds(), time.process_time(),
                                 process_cpu_seconds(contender.engine_pid))
        began = clock()
        for request, items in block:
            called = clock()
            count = len(predict(request, items, timeout))
            walls.append(clock() - called)
            counts.append(count)
        record["elapsed_s"] += clock() - began
        client = time.process_time() - cpu
        engine_used = process_cpu_seconds(contender.engine_pid) - engine_cpu
        record["client_cpu_s"] += client
        record["engine_cpu_s"] += engine_used
        record["other_cpu_s"] += machine_busy_seconds() - busy - client - engine_used
        record["wall_s"] += walls
        record["lines"] += counts
        record["requests"] += indices
        engine = "" if contender.engine_pid is None else self.default.name
        for index, wall, count in zip(indices, walls, counts):
            self.calls.append({"phase": "timeout", "contender": contender.name, "engine": engine,
                               "round": turn, "request": index, "items": len(block[0][1]),
                               "predictions": count, "wall_s": wall, "timeout_s": timeout})

    def _warm_up_turn(self, contender: Contender, first: int, turn: int) -> None:
        """The unmeasured calls that begin a contender's turn: the requests
        before the block, the nearest first, as many as the engine alone reads
        before its own. They are rows of phase ``warm-up`` in the calls, out of
        every table but the one by place in the turn."""
        engine = "" if contender.engine_pid is None else self.default.name
        for index in requests_before(first, self.options.warm_up_calls, len(self.workload)):
            [(request, items)] = self.workload.pairs([index])
            called = time.perf_counter()
            count = len(contender.predict(request, items, self.options.timeout))
            self.calls.append({"phase": "warm-up", "contender": contender.name,
                               "engine": engine, "round": turn, "request": index,
                               "items": len(items), "predictions": count,
                               "wall_s": time.perf_counter() - called,
                               "timeout_s": self.options.timeout})

    def _engine_turn(self, engine: Engine, sampled: List[int], record: Dict[str, Any],
                     turn: int) -> None:
        """An engine alone's turn in the timeout pass: the sampled requests of a block."""
        if not sampled:
            return
        workload, timeout = self.workload, self.options.timeout
        # The requests before the block lead the engine in, as many as a
        # contender's warm-up calls (at least one), and are not measured.
        lead = max(1, self.options.warm_up_calls)
        warm = requests_before(sampled[0], lead, len(workload))[::-1]  # in the file's order
        requests_lines = [self.formatter.lines(request, items)
                          for request, items in workload.pairs(warm + sampled)]
        busy, cpu, children = machine_busy_seconds(), time.process_time(), children_cpu_seconds()
        began = time.perf_counter()
        durations = per_request_rates(engine.command, prediction_args(self.model_path),
                                      requests_lines, self.workdir, warm_up=lead)
        if len(durations) != len(sampled):
            raise RuntimeError(f"the engine alone timed {len(durations)} requests of "
                               f"{len(sampled)}")
        record["elapsed_s"] += time.perf_counter() - began
        ours = time.process_time() - cpu + children_cpu_seconds() - children
        record["other_cpu_s"] += machine_busy_seconds() - busy - ours
        within = [lines_within(len(lines), timeout, seconds)
                  for lines, seconds in zip(requests_lines[lead:], durations)]
        record["requests"] += sampled
        record["seconds"] += durations
        record["lines"] += within
        for index, lines, seconds, count in zip(sampled, requests_lines[lead:], durations,
                                                    within):
            self.calls.append({"phase": "timeout", "contender": engine_alone(engine.name),
                               "engine": engine.name, "round": turn, "request": index,
                               "items": len(lines), "predictions": count, "engine_s": seconds,
                               "timeout_s": timeout})

    def record_pauses(self, before: Dict[str, Any], after: Dict[str, Any]) -> None:
        """The machine's own pauses, measured around the timeout pass."""
        self.results["machine_pauses"] = {
            "seconds": before["seconds"] + after["seconds"],
            "over_0.5ms": before["over_0.5ms"] + after["over_0.5ms"],
            "over_1ms": before["over_1ms"] + after["over_1ms"],
            "longest_ms": sorted(before["longest_ms"] + after["longest_ms"])[-10:],
            "method": before["method"] + ", half before and half after the timeout pass"}

    def throughput_pass(self) -> None:
        """Without a timeout: best of a few rounds per contender and for each
        engine alone on the same lines from a file and on stdin, taking turns."""
        options, workload = self.options, self.workload
        indices = list(range(min(options.throughput_requests, len(workload))))
        pairs = workload.pairs(indices)
        total = sum(len(items) for _, items in pairs)
        lines: List[str] = []
        for request, items in pairs:
            lines += self.formatter.lines(request, items)
        self.results["workload"]["mean_line_bytes"] = (sum(len(line) + 1 for line in lines)
                                                       / len(lines))
        args = prediction_args(self.model_path)
        runs: Dict[str, FileRuns] = {}
        for engine in self.engines:
            runs[engine_alone(engine.name)] = FileRuns(
                engine.command, args, lines, self.workdir, f"throughput-{engine.name}",
                predictions=True)
            runs[engine_stdin(engine.name)] = FileRuns(
                engine.command, args, lines, self.workdir, f"throughput-stdin-{engine.name}",
                predictions=True, via_stdin=True)
        del lines
        clock = time.perf_counter
        best: Dict[str, Dict[str, float]] = {}
        for round_index in range(options.rounds):
            for name in rotated(list(self.contenders) + list(runs), round_index):
                if name in runs:
                    runs[name].run()
                    continue
                contender = self.contenders[name]
                walls: List[float] = []
                counts: List[int] = []
                cpu, engine_cpu = time.process_time(), process_cpu_seconds(contender.engine_pid)
                began = clock()
                for request, items in pairs:
                    called = clock()
                    counts.append(len(contender.predict(request, items, None)))
                    walls.append(clock() - called)
                seconds = clock() - began
                count = sum(counts)
                if count != total:
                    raise RuntimeError(f"{name} returned {count} predictions for {total} lines")
                engine = "" if contender.engine_pid is None else self.default.name
                for index, wall, got in zip(indices, walls, counts):
                    self.calls.append({"phase": "throughput", "contender": name,
                                       "engine": engine, "round": round_index, "request": index,
                                       "items": got, "predictions": got, "wall_s": wall})
                rate = count / seconds
                if rate > best.get(name, {}).get("lines_per_s", 0.0):
                    best[name] = {
                        "lines": count, "seconds": seconds, "lines_per_s": rate,
                        "in_process": contender.engine_pid is None,
                        "client_cpu_us_per_line": (time.process_time() - cpu) / count * 1e6,
                        "engine_cpu_us_per_line":
                            (process_cpu_seconds(contender.engine_pid) - engine_cpu) / count * 1e6}
        engines = {engine.name: {"file": runs[engine_alone(engine.name)].result(),
                                 "stdin": runs[engine_stdin(engine.name)].result()}
                   for engine in self.engines}
        self.results["throughput"] = {"requests": len(pairs), "rounds": options.rounds,
                                      "contenders": best, "engines": engines}
        log("throughput: " + ", ".join(
            [f"{name} {_rate(data['lines_per_s'])}" for name, data in best.items()]
            + [f"{name} {_rate(run.result()['lines_per_s'])}" for name, run in runs.items()])
            + " lines/s")

    def breakdown(self) -> None:
        """Where a subwabbit call spends its time, from ``detailed_metrics``."""
        options, workload = self.options, self.workload
        indices = list(range(min(options.breakdown_requests, len(workload))))
        found: Dict[str, Any] = {}
        for name, contender in self.contenders.items():
            if contender.model is None:
                continue
            calls = []
            for index, (request, items) in zip(indices, workload.pairs(indices)):
                metrics: Dict[str, Any] = {}
                detailed: Dict[str, Any] = {}
                list(contender.model.predict(request, items, timeout=options.timeout,
                                             metrics=metrics, detailed_metrics=detailed))
                sums = {key: sum(value for _, value in series)
                        for key, series in detailed.items() if key.endswith("_time")}
                calls.append((metrics, sums))
                self.calls.append({
                    "phase": "breakdown", "contender": name, "engine": self.default.name,
                    "round": 0, "request": index, "items": len(items),
                    "predictions": metrics["num_lines"], "wall_s": metrics["total_time"],
                    "timeout_s": options.timeout,
                    **{key[:-len("_time")] + "_s": value for key, value in sums.items()},
                    "cleanup_s": metrics.get("cleanup_time")})
            found[name] = summarize_breakdown(calls)
        self.results["breakdown"] = {"requests": len(indices), "contenders": found}


def summarize_breakdown(calls: List[Any]) -> Dict[str, float]:
    """Mean milliseconds per call in each part of ``predict``."""
    count = len(calls)
    parts: Dict[str, float] = {}
    for metrics, sums in calls:
        for key, value in sums.items():
            parts[key] = parts.get(key, 0.0) + value
        for key in ("cleanup_time", "prepare_time", "total_time"):
            if key in metrics:
                parts[key] = parts.get(key, 0.0) + metrics[key]
        parts["num_lines"] = parts.get("num_lines", 0.0) + metrics["num_lines"]
        if "before_cleanup_pending_lines" in metrics:
            parts["leftover_lines"] = (parts.get("leftover_lines", 0.0)
                                       + metrics["before_cleanup_pending_lines"])
    means = {key: value / count for key, value in parts.items()}
    accounted = sum(means.get(key, 0.0) for key in (
        "generating_lines_time", "sending_lines_time", "receiving_lines_time", "cleanup_time"))
    means["other_time"] = means["total_time"] - accounted
    return {key: (value * 1000 if key.endswith("_time") else value) for key, value in means.items()}


def main(argv: Optional[List[str]] = None) -> None:
    options = parse_options(argv)
    started_wall = time.time()
    started = time.perf_counter()
    command = "python -m benchmarks" + "".join(
        " " + shlex.quote(arg) for arg in (sys.argv[1:] if argv is None else argv))
    machine_before = machine_info()
    if options.client_cpus:
        if not options.engine_cpus:  # children would inherit the client's CPUs
            options.engine_cpus = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))
        os.sched_setaffinity(0, parse_cpus(options.client_cpus))
    gc.collect()
    with tempfile.TemporaryDirectory(prefix="subwabbit-bench-") as workdir:
        bench = Benchmark(options, workdir)
        log(f"{command}: the classes run on {bench.default.description}; results go to "
            f"{options.out}")
        bench.results["machine_before"] = machine_before
        try:
            bench.build_workload()
            bench.train()
            bench.start_contenders()
            bench.check()
            bench.choose_pyvw()
            gc.collect()
            gc.freeze()
            bench.warm_up()
            before = machine_pauses(options.pause_probe / 2)
            bench.timeout_pass()
            bench.record_pauses(before, machine_pauses(options.pause_probe / 2))
            bench.throughput_pass()
            bench.breakdown()
        finally:
            bench.close()
            gc.unfreeze()
    results = bench.results
    results["command"] = command
    results["options"] = dict(vars(options))
    results["engine_command"] = bench.command
    results["environment"] = {name: os.environ[name] for name in (ENGINE_ENV_VAR, DRIVER_ENV_VAR)
                              if os.environ.get(name)}
    results["prediction_args"] = prediction_args("MODEL")
    results["started"] = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(started_wall))
    results["duration_s"] = time.perf_counter() - started
    results["machine"] = machine_info()
    results["contender_settings"] = {name: contender.settings
                                     for name, contender in bench.contenders.items()}
    summarize(results)
    text = write_outputs(results, options.out, bench.calls, plots=not options.no_plots)
    print()
    print(text)
    log(f"done in {results['duration_s']:.0f} s; results in {options.out}")
    if os.path.abspath(options.out) == COMMITTED_OUT:
        log("this run replaced the report committed with the code (benchmarks/results)")


def rotated(names: List[str], turn: int) -> List[str]:
    """``names`` starting at a different one each turn, so that none always goes first."""
    turn %= len(names)
    return names[turn:] + names[:turn]


def parse_cpus(text: str) -> Set[int]:
    """``'0'``, ``'0,2'`` or ``'0-3'`` as a set of CPU numbers."""
    cpus: Set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


if __name__ == "__main__":
    main()

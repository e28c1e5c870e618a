"""Summaries, targets, reST tables, JSON and plots of a benchmark run."""

import json
import math
import os
import platform
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy

def engine_stdin(name: str) -> str:
    """The row of an engine reading the file on stdin, as subwabbit's single
    processes feed it."""
    return f"engine alone, stdin ({name})"


def engine_alone(name: str) -> str:
    """The row of an engine reading the file with ``-d``."""
    return f"engine alone ({name})"


#: The issue's targets: (key, description). "best engine alone": the faster of
#: the engines measured alone reading the lines from a file.
TARGETS = (
    ("blocking_lines", "blocking: mean predictions per request >= 0.90x best engine alone"),
    ("nonblocking_lines", "nonblocking: mean predictions per request >= 0.85x best engine alone"),
    ("blocking_throughput", "blocking: throughput without timeout >= 0.90x its engine alone"),
    ("nonblocking_throughput", "nonblocking: throughput without timeout >= 0.90x its engine "
                               "alone"),
    ("nonblocking_p999", "nonblocking: p99.9 wall time <= deadline + 0.5 ms"),
    ("nonblocking_max", "nonblocking: max wall time <= deadline + 1 ms"),
    ("pool_lines", "pool (default size): mean predictions per request > best engine alone"),
)


# ------------------------------------------------------------------ machine

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> Dict[str, Any]:
    """The machine, the software and the load right now."""
    import vowpalwabbit  # pylint: disable=import-outside-toplevel

    import subwabbit  # pylint: disable=import-outside-toplevel
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "load_average": list(os.getloadavg()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "vowpalwabbit": getattr(vowpalwabbit, "__version__", "?"),
        "subwabbit": getattr(subwabbit, "__version__", "?"),
        "time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


# ---------------------------------------------------------------- summaries

def nearest_rank(ordered: Sequence[float], point: float) -> float:
    """The ``point`` quantile (0 to 1) of sorted values, by nearest rank: a
    value that was measured, never one interpolated between two."""
    return ordered[min(len(ordered) - 1, int(point * len(ordered)))]


def _percentiles(values: Sequence[float], points: Sequence[float]) -> List[float]:
    return [float(value) for value in numpy.percentile(numpy.asarray(values, dtype=float), points)]


def lines_summary(lines: Sequence[float]) -> Dict[str, float]:
    p1, p50, p99 = _percentiles(lines, (1, 50, 99))
    return {"mean": float(numpy.mean(lines)), "p50": p50, "p1": p1, "p99": p99,
            "min": float(min(lines)), "max": float(max(lines)), "requests": len(lines)}


def wall_summary(walls_s: Sequence[float], timeout_s: float) -> Dict[str, float]:
    walls = numpy.asarray(walls_s, dtype=float) * 1000
    p50, p99, p999 = _percentiles(walls, (50, 99, 99.9))
    deadline = timeout_s * 1000
    return {"mean": float(walls.mean()), "p50": p50, "p99": p99, "p99.9": p999,
            "max": float(walls.max()),
            "over_deadline_plus_0.5ms": int((walls > deadline + 0.5).sum()),
            "over_deadline_plus_1ms": int((walls > deadline + 1.0).sum()),
            "calls": len(walls)}


def _ratio(value: Optional[float], reference: Optional[float]) -> Optional[float]:
    if value is None or not reference:
        return None
    return value / reference


def _best(rates: Dict[str, Optional[float]]) -> Optional[str]:
    """The name with the highest rate (``None`` when none was measured)."""
    measured = {name: rate for name, rate in rates.items() if rate}
    return max(measured, key=lambda name: measured[name]) if measured else None


def engine_of(names: Sequence[str], default: str) -> Callable[[str, Dict[str, Any]], str]:
    """A function that names a row's own engine: the one in parentheses at the
    end of its name, the wheel's for pyvw (in this process), else ``default``."""
    def own_engine(row: str, data: Dict[str, Any]) -> str:
        for name in names:
            if row.endswith(f"({name})"):
                return name
        return "wheel" if data.get("in_process") and "wheel" in names else default
    return own_engine


def summarize_training(training: Dict[str, Any], own_engine: Callable[[str, Dict[str, Any]], str]
                       ) -> Tuple[Dict[str, Dict[str, Any]], Optional[str]]:
    """The rows of the training table with their ratios, and the best engine alone.

    :param training: ``results['training']`` (see :mod:`benchmarks.training`)
    :param own_engine: the name of a row's own engine
    """
    train: Dict[str, Dict[str, Any]] = {}
    for name, data in training["engines"].items():
        train[engine_alone(name)] = dict(data)
    for name, data in training["write_only_train"].items():
        train[f"write-only train ({name})"] = dict(data)
    if "lines_per_s" in training.get("subwabbit_2", {}):
        train["subwabbit 2.1.0 train (vw)"] = dict(training["subwabbit_2"])
    train["pyvw"] = dict(training["pyvw"], in_process=True)
    best = _best({name: data["lines_per_s"] for name, data in training["engines"].items()})
    for row, data in train.items():
        data["vs_engine"] = _ratio(data["lines_per_s"],
                                   training["engines"][own_engine(row, data)]["lines_per_s"])
        data["vs_best_engine"] = (None if best is None else _ratio(
            data["lines_per_s"], training["engines"][best]["lines_per_s"]))
    return train, best


def training_table(train: Dict[str, Dict[str, Any]]) -> str:
    """The training table of :func:`summarize_training`'s rows."""
    rows = [[name, _num(data["lines_per_s"]), _num(data.get("client_cpu_us_per_line"), 1),
             _x(data["vs_engine"]), _x(data.get("median_round_vs_engine")),
             _x(data["vs_best_engine"])]
            for name, data in train.items()]
    return simple_table(["trainer", "lines/s", "client µs/line", "vs engine",
                         "round by round", "vs best engine"], rows)


def paired_difference(requests: Sequence[int], counts: Sequence[float],
                      reference_requests: Sequence[int],
                      reference_counts: Sequence[float]) -> Optional[Dict[str, float]]:
    """A contender's predictions against a reference's on the same requests:
    the mean difference per request, its standard error, and on how many
    requests it returned more and fewer (``None`` without common requests).

    Both ran every request at different moments of the run, so the noise of
    the machine is in both; the pairing takes the requests' own differences
    (their items, their place in the file) out of the comparison.
    """
    reference = dict(zip(reference_requests, reference_counts))
    differences = [count - reference[request] for request, count in zip(requests, counts)
                   if request in reference]
    if not differences:
        return None
    mean = statistics.mean(differences)
    error = (statistics.stdev(differences) / math.sqrt(len(differences))
             if len(differences) > 1 else math.nan)
    return {"mean": mean, "standard_error": error, "requests": len(differences),
            "more": sum(1 for d in differences if d > 0),
            "fewer": sum(1 for d in differences if d < 0)}


def summarize(results: Dict[str, Any]) -> None:
    """Add ``results['summary']``: statistics, ratios and targets.

    Each row gets ``vs_pyvw``, ``vs_engine`` (against its own engine alone
    reading the file: the default engine for the classes, the wheel's for
    pyvw) and ``vs_best_engine`` (against the faster engine alone reading
    the file).
    """
    # pylint: disable=too-many-locals
    timeout = results["timeout"]["timeout_s"]
    default = results["engines"]["default"]
    names = [engine["name"] for engine in results["engines"]["engines"]]
    own_engine = engine_of(names, default)

    lines: Dict[str, Dict[str, Any]] = {}
    walls: Dict[str, Dict[str, Any]] = {}
    for name, record in results["timeout"]["contenders"].items():
        lines[name] = lines_summary(record["lines"])
        lines[name]["in_process"] = record["in_process"]
        walls[name] = wall_summary(record["wall_s"], timeout)
    for name, record in results["engine_per_request"].items():
        lines[engine_alone(name)] = lines_summary(record["lines"])
    best_lines = _best({name: lines[engine_alone(name)]["mean"] for name in names})
    reference = lines.get("pyvw", {}).get("mean")
    for row, summary in lines.items():
        summary["vs_pyvw"] = _ratio(summary["mean"], reference)
        summary["vs_engine"] = _ratio(summary["mean"],
                                      lines[engine_alone(own_engine(row, summary))]["mean"])
        summary["vs_best_engine"] = (None if best_lines is None else
                                     _ratio(summary["mean"], lines[engine_alone(best_lines)]["mean"]))

    if best_lines is not None:
        best_record = results["engine_per_request"][best_lines]
        for name, record in results["timeout"]["contenders"].items():
            lines[name]["paired_vs_best_engine"] = paired_difference(
                record.get("requests", []), record["lines"], best_record["requests"],
                best_record["lines"])

    throughput: Dict[str, Dict[str, Any]] = {}
    for name, record in results["throughput"]["contenders"].items():
        throughput[name] = dict(record)
    for name, record in results["throughput"]["engines"].items():
        throughput[engine_alone(name)] = dict(record["file"])
        throughput[engine_stdin(name)] = dict(record["stdin"])
    best_throughput = _best({name: throughput[engine_alone(name)]["lines_per_s"]
                             for name in names})
    reference = throughput.get("pyvw", {}).get("lines_per_s")
    for row, summary in throughput.items():
        summary["vs_pyvw"] = _ratio(summary["lines_per_s"], reference)
        summary["vs_engine"] = _ratio(
            summary["lines_per_s"],
            throughput[engine_alone(own_engine(row, summary))]["lines_per_s"])
        summary["vs_best_engine"] = (None if best_throughput is None else _ratio(
            summary["lines_per_s"], throughput[engine_alone(best_throughput)]["lines_per_s"]))

    training = results["training"]
    train, best_training = summarize_training(training, own_engine)

    deadline = timeout * 1000
    measured: Dict[str, Any] = {
        "blocking_lines": (lines.get("blocking", {}).get("vs_best_engine"), 0.90, ">="),
        "nonblocking_lines": (lines.get("nonblocking", {}).get("vs_best_engine"), 0.85, ">="),
        "blocking_throughput": (throughput.get("blocking", {}).get("vs_engine"), 0.90, ">="),
        "nonblocking_throughput": (throughput.get("nonblocking", {}).get("vs_engine"), 0.90, ">="),
        "nonblocking_p999": (walls.get("nonblocking", {}).get("p99.9"), deadline + 0.5, "<="),
        "nonblocking_max": (walls.get("nonblocking", {}).get("max"), deadline + 1.0, "<="),
        "pool_lines": (lines.get("pool", {}).get("vs_best_engine"), 1.0, ">"),
    }
    targets = [dict(target=key, description=description)
               for key, description in TARGETS]
    pool_size = results.get("contender_settings", {}).get("pool", {}).get("size")
    if pool_size:  # the default size follows the CPUs this process may use (--client-cpus)
        for target in targets:
            target["description"] = target["description"].replace(
                "pool (default size)",
                f"pool (default size, here {pool_size} engine{'s' if pool_size > 1 else ''})")
    for name in training["write_only_train"]:
        key = f"write_only_train_{name}"
        measured[key] = (train[f"write-only train ({name})"]["vs_engine"], 0.90, ">=")
        targets.append({"target": key, "description": f"write-only train ({name}) >= 0.90x "
                                                      f"engine alone ({name}) reading the file"})
    wrong = wrong_contenders(results)
    for target in targets:
        value, bound, sense = measured[target["target"]]
        met = None if value is None else (value >= bound if sense == ">=" else
                                          value > bound if sense == ">" else value <= bound)
        # A class left out of the timing for predicting wrong missed its targets.
        contender = target["target"].split("_")[0]
        is_wrong = contender in wrong
        # Without a figure, a target of a class that ran lacks its reference
        # (an engine alone's rate the start-up's noise hid): unmeasured, not "not run".
        ran = contender == "write" or contender in results["timeout"]["contenders"]
        target.update(value=value, bound=bound, met=False if is_wrong else met, wrong=is_wrong,
                      ran=ran, unit="ms" if target["target"].endswith(("p999", "max")) else "x")
    results["summary"] = {
        "lines": lines, "wall_ms": walls, "throughput": throughput, "training": train,
        "targets": targets,
        "best_engine": {"lines": best_lines, "throughput": best_throughput,
                        "training": best_training},
        "engine_vs_pyvw_public": _ratio(lines[engine_alone(default)]["mean"],
                                        lines.get("pyvw-public", {}).get("mean"))}


def target_figure(value: float, bound: float) -> str:
    """``value`` with two decimals, or as many more as it takes (up to six)
    not to print the bound itself: 1.0046 against a bound of 1 is "1.005",
    not "1.00", which would read as met and missed alike."""
    digits = 2
    while digits < 6 and f"{value:.{digits}f}" == f"{bound:.{digits}f}" and value != bound:
        digits += 1
    return f"{value:.{digits}f}"


def wrong_contenders(results: Dict[str, Any]) -> List[str]:
    """The contenders (not the ways to call pyvw, which have a table of their
    own) whose predictions differed from the engine's in the correctness
    check, and were therefore left out of every measurement."""
    return [name for name, check in results.get("correctness", {}).items()
            if not check["equal"] and not name.startswith("pyvw: ")]


def correctness_paragraph(results: Dict[str, Any]) -> str:
    """What the check before the timing found for subwabbit's classes (the
    ways to call pyvw have a table of their own); ``""`` when none ran."""
    checks = {name: check for name, check in results.get("correctness", {}).items()
              if not name.startswith("pyvw: ")}
    if not checks:
        return ""
    lines = next(iter(checks.values()))["lines"]
    right = [name for name, check in checks.items() if check["equal"]]
    parts = [f"{', '.join(right)} returned exactly the engine's predictions for the first "
             f"{lines:,} lines (the engine reading them from a file)"] if right else []
    parts += [f"{name} predicted differently from the engine (largest difference "
              f"{checks[name]['max_abs_difference']:.6g}, {checks[name]['returned']:,} "
              f"predictions for {lines:,} lines): left out of every table, its targets missed"
              for name in wrong_contenders(results)]
    return "Before the timing, " + "; ".join(parts) + "."


# ------------------------------------------------------------------ tables

def warm_up_paragraph(results: Dict[str, Any]) -> str:
    """How the contenders' turns begin in the timeout pass."""
    warm_up = results.get("timeout_warm_up") or {"calls_per_turn": 0, "mean_predictions": {}}
    block = results["timeout"]["block"]
    if not warm_up["calls_per_turn"]:
        return (f"The contenders take turns of {block} requests, every call measured, the "
                "first of a turn included.")
    means = ", ".join(f"{name} {_num(mean)}" for name, mean in warm_up["mean_predictions"].items())
    return (f"The contenders take turns of {block} requests. Each turn begins with "
            f"{warm_up['calls_per_turn']} unmeasured call(s) on the requests before the "
            "block, as the engine alone's begins with as many requests: a contender that "
            "waited while the others ran can be slow for its first calls (the table by place "
            "in the turn shows how much; ``python -m benchmarks.idle_ramp`` what goes with "
            "it). Those calls are the rows of phase ``warm-up`` in the calls file, left out "
            "of every table but the one by "
            f"place in the turn; their mean predictions per call: {means}.")


def turn_position_table(calls: Any, block: int) -> List[str]:
    """Mean predictions per call by the call's place in its turn (see
    :func:`benchmarks.calls.by_turn_position`), with its caption."""
    from .calls import by_turn_position  # pylint: disable=import-outside-toplevel

    table = by_turn_position(calls, block)
    if table.empty:
        return []
    rows = [[str(name)] + [_num(None if value != value else value)  # NaN: none at that place
                           for value in table.loc[name]] for name in table.index]
    return ["**Predictions per call by its place in the turn** (mean over the turns and "
            "over up to 5 places at a time; wN-M: a turn's warm-up calls N to M, unmeasured; "
            "N-M: its measured calls N to M): how much slower the first calls of a turn are "
            "than the rest, which the tables above measure",
            simple_table(["contender"] + [str(place) for place in table.columns], rows)]


def simple_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A reStructuredText simple table (first column left-aligned, the rest right)."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    border = "  ".join("=" * width for width in widths)

    def line(cells: Sequence[str]) -> str:
        parts = [str(cells[0]).ljust(widths[0])]
        parts += [str(cell).rjust(width) for cell, width in zip(cells[1:], widths[1:])]
        return "  ".join(parts).rstrip()

    return "\n".join([border, line(headers), border] + [line(row) for row in rows] + [border])


def _num(value: Optional[float], digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _x(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _engine_paragraphs(results: Dict[str, Any]) -> List[str]:
    engines = results["engines"]
    default = next(engine for engine in engines["engines"]
                   if engine["name"] == engines["default"])
    out = [f"The model classes ran on {default['description']} (``{' '.join(default['command'])} "
           f"{' '.join(results['prediction_args'])}``), the engine subwabbit chooses by itself "
           f"here. Each engine's rows carry its name in parentheses. {engines['note']}"]
    return out


def _ratio_rows(summary: Dict[str, Dict[str, Any]], cells: Any) -> List[List[str]]:
    return [[name] + cells(data) + [_x(data.get("vs_pyvw")), _x(data.get("vs_engine")),
                                    _x(data.get("vs_best_engine"))]
            for name, data in summary.items()]


def tables(results: Dict[str, Any], calls: Any = None) -> str:
    """The report as reST (no title, so that it can be included in a page).

    :param calls: the per-call DataFrame (:mod:`benchmarks.calls`), for the
        tables in the reference page's layout; ``None`` leaves them out
    """
    # pylint: disable=too-many-locals,too-many-statements
    summary = results["summary"]
    machine = results["machine"]
    timeout_ms = results["timeout"]["timeout_s"] * 1000
    out: List[str] = []
    environment = "".join(f"{name}={value} " for name, value in results.get("environment", {}).items())
    out.append(
        f"This report shows one run: ``{environment}{results['command']}``, started "
        f"{results['started']} on {machine['cpu']} ({results['machine_before']['usable_cores']} "
        f"usable cores of {machine['cores']}; {machine['platform']}), Python {machine['python']}, "
        f"vowpalwabbit {machine['vowpalwabbit']}, subwabbit {machine['subwabbit']}; load average "
        f"{results['machine_before']['load_average'][0]:.2f} at the start, "
        f"{machine['load_average'][0]:.2f} at the end; {results['duration_s']:.0f} s in all. "
        f"Every timed call is a row of ``{results.get('calls_file', 'calls.csv.gz')}`` beside "
        "this report (a pandas DataFrame saved as CSV).")
    out += _engine_paragraphs(results)
    options = results["options"]
    if options.get("client_cpus"):
        out.append(f"The client (this process, and pyvw in it) ran on CPUs "
                   f"{options['client_cpus']}, every engine on CPUs {options['engine_cpus']}.")
    workload = results["workload"]
    out.append(f"Workload: {workload['requests']:,} requests, each scoring all "
               f"{workload['items']:,} items of the catalogue (seed {workload['seed']}); "
               f"{workload['mean_line_bytes']:.0f} bytes per line on average; a logistic "
               "regression with 18 quadratic interactions.")

    checked = correctness_paragraph(results)
    if checked:
        out.append(checked)
    best = summary["best_engine"]
    out.append(f"**Predictions per request within timeout={timeout_ms:g} ms** (vs engine: "
               "against the engine it ran on reading the same lines from a file; vs best "
               f"engine: against the faster engine alone, here {best['lines'] or '-'})")
    rows = _ratio_rows(summary["lines"], lambda data: [
        _num(data["mean"]), _num(data["p50"]), _num(data["p1"]), _num(data["p99"])])
    out.append(simple_table(["contender", "mean", "p50", "p1", "p99", "vs pyvw", "vs engine",
                             "vs best engine"], rows))
    paired = [(name, data["paired_vs_best_engine"]) for name, data in summary["lines"].items()
              if data.get("paired_vs_best_engine")]
    if paired:
        out.append(
            f"The same calls paired request by request with the best engine alone ({best['lines']}) "
            "on the requests both served: the mean difference in predictions per request, "
            "its standard error, and on how many requests each returned more and fewer than "
            "the engine (the rest: as many, often all the items): " + "; ".join(
                f"{name} {pair['mean']:+,.1f} (SE {pair['standard_error']:.1f}; more on "
                f"{pair['more']:,}, fewer on {pair['fewer']:,} of {pair['requests']:,})"
                for name, pair in paired) + ".")
    method = next(iter(results["engine_per_request"].values()))["method"]
    out.append("Engine alone: " + "; ".join(
        f"{name}, {len(record['lines']):,} requests at "
        f"{_num(record['lines_per_s'])} lines/s (on a whole file, start-up subtracted: "
        f"{_num(results['throughput']['engines'][name]['file']['lines_per_s'])} lines/s)"
        for name, record in results["engine_per_request"].items())
        + f". Method: {method}.")
    out.append(warm_up_paragraph(results))
    if calls is not None:
        out += turn_position_table(calls, results["timeout"]["block"])

    out.append(f"**predict() wall time in ms with timeout={timeout_ms:g} ms**")
    rows = []
    for name, data in summary["wall_ms"].items():
        rows.append([name, _num(data["mean"], 2), _num(data["p50"], 2), _num(data["p99"], 2),
                     _num(data["p99.9"], 2), _num(data["max"], 2),
                     str(data["over_deadline_plus_0.5ms"]), str(data["over_deadline_plus_1ms"])])
    out.append(simple_table(["contender", "mean", "p50", "p99", "p99.9", "max", ">+0.5 ms",
                             ">+1 ms"], rows))
    if calls is not None:
        out += reference_layout_tables(calls)

    pauses = results.get("machine_pauses")
    if pauses:
        longest = pauses["longest_ms"][-1] if pauses["longest_ms"] else 0.0
        out.append(f"The machine's own pauses: a busy loop spinning for {pauses['seconds']:g} s "
                   f"around the timeout pass, with nothing else of the benchmark running, was "
                   f"stopped {pauses['over_0.5ms']} times for over 0.5 ms and "
                   f"{pauses['over_1ms']} times for over 1 ms, the longest {longest:.2f} ms. "
                   "A call that such a pause meets is late by it, whatever the client does.")

    timed = results["timeout"]["contenders"]
    out.append("**CPU in the timeout pass** (µs per prediction returned; client: this Python "
               "process, pyvw's work included; engine: the child process; cores: CPU seconds per "
               "second of the contender's turns, other: the rest of the machine meanwhile)")
    rows = [[name, _num(record["client_cpu_us_per_line"], 1),
             "-" if record["in_process"] else _num(record["engine_cpu_us_per_line"], 1),
             _num((record["client_cpu_s"] + record["engine_cpu_s"]) / record["elapsed_s"], 2),
             _num(record["other_load_cores"], 2)]
            for name, record in timed.items()]
    rows += [[engine_alone(name), "-", "-", "-", _num(record["other_load_cores"], 2)]
             for name, record in results["engine_per_request"].items()]
    out.append(simple_table(["contender", "client µs", "engine µs", "cores", "other cores"],
                            rows))

    throughput = results["throughput"]
    out.append(f"**Throughput without a timeout** ({throughput['requests']} requests, best of "
               f"{throughput['rounds']} rounds; the engine alone start-up subtracted; best "
               f"engine: {best['throughput'] or '-'})")
    rows = _ratio_rows(summary["throughput"], lambda data: [
        _num(data["lines_per_s"]), _num(data.get("client_cpu_us_per_line"), 1),
        _num(None if data.get("in_process") else data.get("engine_cpu_us_per_line"), 1)])
    out.append(simple_table(["contender", "lines/s", "client µs/line", "engine µs/line",
                             "vs pyvw", "vs engine", "vs best engine"], rows))
    out.append("engine alone (NAME): ``ENGINE -d FILE -p FILE`` (vw's own driver, a parser "
               "thread and a learner thread, in both engines); engine alone, stdin (NAME): "
               "``ENGINE -p stdout < FILE > OUT``, the way subwabbit's single processes feed the "
               "engine (the wheel engine runs vw's own driver there too, unless "
               "SUBWABBIT_ENGINE_DRIVER=loop; a pool's forked engines run the one-thread "
               "loop).")

    training = results["training"]
    out.append(f"**Training throughput** ({training['lines']:,} labelled lines, best of "
               f"{training['rounds']} rounds; write-only train: train() calls and close(), "
               "minus an idle close(); engine alone: ``ENGINE -d FILE -f MODEL``, start-up "
               f"subtracted; best engine: {best['training'] or '-'})")
    out.append(training_table(summary["training"]))
    out.append("vs engine: the best round against the best round of its engine alone reading "
               "the file; round by round: the median of the ratios of the same round (which "
               "varies less on a noisy machine).")
    skipped = training.get("subwabbit_2", {}).get("skipped")
    if skipped:
        out.append(f"subwabbit 2.1.0 was not measured: {skipped}.")
    same = training.get("same_predictions_as_engine_model")
    if same is not None:
        out.append("The model of the write-only train and the model the engine trained from the "
                   "file predict " + ("the same" if same else "DIFFERENTLY")
                   + " on the checked lines.")

    out.append("**Ways to call pyvw** (no timeout; every one checked against the engine)")
    choice = results["pyvw_choice"]
    rows = []
    for name, data in results["pyvw_methods"].items():
        picked = [label for label, method in choice.items() if method == name]
        rows.append([name, "public" if data["public_api"] else "binding", _num(data["lines_per_s"]),
                     "yes" if data["correct"] else "NO", ", ".join(picked) or "-"])
    out.append(simple_table(["method", "API", "lines/s", "correct", "used as"], rows))

    breakdown = results.get("breakdown", {}).get("contenders", {})
    if breakdown:
        out.append(f"**Where a subwabbit predict() call spends its time** (mean ms per call from "
                   f"detailed_metrics, {results['breakdown']['requests']} requests, "
                   f"timeout={timeout_ms:g} ms)")
        rows = []
        for name, data in breakdown.items():
            rows.append([name, _num(data.get("cleanup_time"), 2),
                         _num(data.get("generating_lines_time"), 2),
                         _num(data.get("sending_lines_time"), 2),
                         _num(data.get("receiving_lines_time"), 2), _num(data["other_time"], 2),
                         _num(data["total_time"], 2), _num(data["num_lines"]),
                         _num(data.get("leftover_lines"), 1)])
        out.append(simple_table(["contender", "cleanup", "formatting", "sending", "receiving",
                                 "other", "total", "lines", "leftovers"], rows))
        out.append("formatting, sending, receiving: the sums of the detailed_metrics series "
                   "(blocking's receiving includes waiting for the engine's answers); other: the "
                   "rest of the call (for nonblocking mostly waiting in select).")

    out.append("**Targets**")
    rows = []
    for target in summary["targets"]:
        unit = target["unit"]
        value = "-" if target["value"] is None else (
            f"{target_figure(target['value'], target['bound'])}"
            + (" ms" if unit == "ms" else "x"))
        if target.get("wrong"):
            value = "wrong predictions"
        met = {True: "met", False: "MISSED"}.get(
            target["met"], "unmeasured" if target.get("ran") else "not run")
        rows.append([target["description"], value, met])
    out.append(simple_table(["target", "measured", "result"], rows))
    ratio = summary.get("engine_vs_pyvw_public")
    if ratio:
        out.append(f"The engine alone returns {ratio:.1f}x the predictions of pyvw-public "
                   "within the timeout (the issue's author measured about 4.8x against pyvw).")
    settings = results.get("contender_settings", {})
    described = []
    for name, data in settings.items():
        if "method" in data:
            described.append(f"{name}: {data['how']}")
        else:
            extra = ", ".join(f"{key}={data[key]}" for key in (
                "size", "batch_size", "max_pending_lines", "write_cutoff_s") if key in data)
            described.append(f"{name}: {data['class']}({extra})")
    out.append("Contenders: " + "; ".join(described) + ".")
    return "\n\n".join(out) + "\n"


def reference_layout_tables(calls: Any) -> List[str]:
    """The wall time and the predictions of the timeout pass in the layout of
    subwabbit 2.x's documentation (see :mod:`benchmarks.calls`)."""
    from .calls import layout_table, reference_layout  # pylint: disable=import-outside-toplevel

    out = ["**The same in the layout of subwabbit 2.x's documentation** (pandas' ``describe`` "
           "of ``calls.csv.gz``, phase ``timeout``: percentiles interpolate between calls)"]
    walls = reference_layout(calls, "wall_s")
    if not walls.empty:
        out.append("predict() wall time in seconds:")
        out.append(layout_table(walls, 6, "seconds"))
    lines = reference_layout(calls, "predictions")
    if not lines.empty:
        out.append("Predicted lines per request (for the engine alone: the lines it finishes "
                   "within the timeout):")
        out.append(layout_table(lines, 1, "lines"))
    return out


# ------------------------------------------------------------------- plots

def make_plots(results: Dict[str, Any], out_dir: str) -> List[str]:
    """lines_per_request.png and wall_time.png."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

    timeout_ms = results["timeout"]["timeout_s"] * 1000
    series = {name: record["lines"] for name, record in results["timeout"]["contenders"].items()}
    for name, record in results["engine_per_request"].items():
        series[engine_alone(name)] = record["lines"]
    figure, axes = pyplot.subplots(figsize=(9, 5))
    top = max(max(values) for values in series.values())
    bins = numpy.linspace(0, top * 1.02 + 1, 60)
    for name, values in series.items():
        axes.hist(values, bins=bins, histtype="step", linewidth=1.6,
                  label=f"{name} (mean {numpy.mean(values):,.0f})")
    axes.set_xlabel(f"predictions returned per request within {timeout_ms:g} ms")
    axes.set_ylabel("requests")
    axes.set_title("Predictions per request")
    axes.legend()
    figure.tight_layout()
    lines_path = os.path.join(out_dir, "lines_per_request.png")
    figure.savefig(lines_path, dpi=110)
    pyplot.close(figure)

    wall_path = os.path.join(out_dir, "wall_time.png")
    plot_wall_times({name: record["wall_s"]
                     for name, record in results["timeout"]["contenders"].items()},
                    timeout_ms, wall_path)
    return [lines_path, wall_path]


def wall_time_window(timeout_ms: float) -> Tuple[float, float]:
    """The x range of the wall-time plot: from 0 to half the deadline past it."""
    return 0.0, timeout_ms * 1.5


def beyond_window_label(walls_ms: Any, high_ms: float) -> str:
    """The legend entry that counts the calls the plot's window leaves out."""
    walls = numpy.asarray(walls_ms, dtype=float)
    beyond = walls[walls > high_ms]
    if not len(beyond):  # pylint: disable=use-implicit-booleaness-not-len
        return f"none of {len(walls)} calls beyond {high_ms:g} ms"
    return (f"{len(beyond)} of {len(walls)} calls beyond {high_ms:g} ms, not shown "
            f"(slowest {beyond.max():.1f} ms)")


def plot_wall_times(walls_s: Dict[str, Sequence[float]], timeout_ms: float, path: str) -> None:
    """One panel per contender, sharing an x axis clipped to
    :func:`wall_time_window`, 0.1 ms bins and a log count scale; the calls
    beyond the window are counted in the panel's legend with the slowest."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

    from matplotlib import ticker  # pylint: disable=import-outside-toplevel

    low, high = wall_time_window(timeout_ms)
    bins = numpy.arange(low, high + 0.1, 0.1)
    figure, panels = pyplot.subplots(len(walls_s), 1, sharex=True, squeeze=False,
                                     figsize=(9, 1.8 + 1.6 * len(walls_s)))
    for axes, (name, values) in zip(panels[:, 0], walls_s.items()):
        walls = numpy.asarray(values, dtype=float) * 1000
        axes.hist(numpy.clip(walls, low, None), bins=bins, color="tab:blue",
                  label=f"{name}: p50 {numpy.percentile(walls, 50):.2f} ms, "
                        f"p99 {numpy.percentile(walls, 99):.2f} ms")
        axes.axvline(timeout_ms, color="black", linestyle="--", linewidth=1, label="deadline")
        axes.axvline(timeout_ms + 1, color="grey", linestyle=":", linewidth=1,
                     label="deadline + 1 ms")
        axes.plot([], [], " ", label=beyond_window_label(walls, high))
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        axes.yaxis.set_minor_formatter(ticker.NullFormatter())
        axes.set_ylabel("calls")
        axes.legend(loc="upper left", fontsize="small")
    panels[-1, 0].set_xlim(low, high)
    panels[-1, 0].set_xlabel("predict() wall time (ms)")
    figure.suptitle(f"predict() wall time with timeout={timeout_ms:g} ms")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def write_json(results: Dict[str, Any], path: str) -> None:
    """Write ``results`` as indented JSON to ``path`` (folders created), and say so."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    print(f"wrote {path}")


def write_outputs(results: Dict[str, Any], out_dir: str, calls: Sequence[Dict[str, Any]],
                  plots: bool = True) -> str:
    """Write calls.csv.gz, results.json, results.rst and the plots to
    ``out_dir``; return the reST text.

    :param calls: one row per timed call (see :mod:`benchmarks.calls`)
    """
    from .calls import FILE_NAME, calls_frame, save_calls  # pylint: disable=import-outside-toplevel

    os.makedirs(out_dir, exist_ok=True)
    frame = calls_frame(calls)
    save_calls(frame, out_dir)
    results["calls_file"] = FILE_NAME
    text = tables(results, frame)
    with open(os.path.join(out_dir, "results.rst"), "w", encoding="utf-8") as handle:
        handle.write(text)
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
        handle.write("\n")
    if plots:
        make_plots(results, out_dir)
    return text

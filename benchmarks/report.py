"""Summaries, targets, reST tables, JSON and plots of a benchmark run."""

import json
import os
import platform
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy

ENGINE = "engine alone"
#: The same file fed on stdin, as subwabbit feeds the engine (the wheel
#: engine's one-thread loop instead of vw's own driver).
ENGINE_STDIN = "engine alone, stdin"

#: The issue's targets: (key, description).
TARGETS = (
    ("blocking_lines", "blocking: mean predictions per request >= 0.90x engine alone"),
    ("nonblocking_lines", "nonblocking: mean predictions per request >= 0.85x engine alone"),
    ("blocking_throughput", "blocking: throughput without timeout >= 0.90x engine alone"),
    ("nonblocking_throughput", "nonblocking: throughput without timeout >= 0.90x engine alone"),
    ("nonblocking_p999", "nonblocking: p99.9 wall time <= deadline + 0.5 ms"),
    ("nonblocking_max", "nonblocking: max wall time <= deadline + 1 ms"),
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


def summarize(results: Dict[str, Any]) -> None:
    """Add ``results['summary']``: statistics, ratios and targets."""
    timeout = results["timeout"]["timeout_s"]
    lines: Dict[str, Dict[str, Any]] = {}
    walls: Dict[str, Dict[str, Any]] = {}
    for name, record in results["timeout"]["contenders"].items():
        lines[name] = lines_summary(record["lines"])
        walls[name] = wall_summary(record["wall_s"], timeout)
    lines[ENGINE] = lines_summary(results["engine_per_request"]["lines"])
    reference = lines.get("pyvw", {}).get("mean")
    for summary in lines.values():
        summary["vs_pyvw"] = _ratio(summary["mean"], reference)
        summary["vs_engine"] = _ratio(summary["mean"], lines[ENGINE]["mean"])

    throughput: Dict[str, Dict[str, Any]] = {}
    for name, record in results["throughput"]["contenders"].items():
        throughput[name] = dict(record)
    throughput[ENGINE] = dict(results["throughput"]["engine"])
    if "engine_stdin" in results["throughput"]:
        throughput[ENGINE_STDIN] = dict(results["throughput"]["engine_stdin"])
    reference = throughput.get("pyvw", {}).get("lines_per_s")
    for summary in throughput.values():
        summary["vs_pyvw"] = _ratio(summary["lines_per_s"], reference)
        summary["vs_engine"] = _ratio(summary["lines_per_s"], throughput[ENGINE]["lines_per_s"])

    training = results["training"]
    train = {ENGINE: training["engine"], "blocking, write-only train": training["write_only_train"],
             "pyvw": training["pyvw"]}
    train = {name: {**data, "vs_engine": _ratio(data["lines_per_s"],
                                                training["engine"]["lines_per_s"])}
             for name, data in train.items()}

    deadline = timeout * 1000
    measured: Dict[str, Any] = {
        "blocking_lines": (lines.get("blocking", {}).get("vs_engine"), 0.90, ">="),
        "nonblocking_lines": (lines.get("nonblocking", {}).get("vs_engine"), 0.85, ">="),
        "blocking_throughput": (throughput.get("blocking", {}).get("vs_engine"), 0.90, ">="),
        "nonblocking_throughput": (throughput.get("nonblocking", {}).get("vs_engine"), 0.90, ">="),
        "nonblocking_p999": (walls.get("nonblocking", {}).get("p99.9"), deadline + 0.5, "<="),
        "nonblocking_max": (walls.get("nonblocking", {}).get("max"), deadline + 1.0, "<="),
    }
    targets = []
    for key, description in TARGETS:
        value, bound, sense = measured[key]
        met = None if value is None else (value >= bound if sense == ">=" else value <= bound)
        targets.append({"target": key, "description": description, "value": value,
                        "bound": bound, "met": met,
                        "unit": "ms" if key.endswith(("p999", "max")) else "x"})
    results["summary"] = {"lines": lines, "wall_ms": walls, "throughput": throughput,
                          "training": train, "targets": targets,
                          "engine_vs_pyvw_public": _ratio(
                              lines[ENGINE]["mean"], lines.get("pyvw-public", {}).get("mean"))}


# ------------------------------------------------------------------ tables

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


def tables(results: Dict[str, Any]) -> str:
    """The report as reST (no title, so that it can be included in a page)."""
    summary = results["summary"]
    machine = results["machine"]
    timeout_ms = results["timeout"]["timeout_s"] * 1000
    out: List[str] = []
    out.append(
        f"Run of {results['started']} on {machine['cpu']}, "
        f"{results['machine_before']['usable_cores']} usable cores of {machine['cores']}, "
        f"Python {machine['python']}, vowpalwabbit {machine['vowpalwabbit']}, "
        f"subwabbit {machine['subwabbit']}; load average "
        f"{results['machine_before']['load_average'][0]:.2f} at the start, "
        f"{machine['load_average'][0]:.2f} at the end; {results['duration_s']:.0f} s in all.")
    environment = "".join(f"{name}={value} " for name, value in results.get("environment", {}).items())
    out.append(f"Command: ``{environment}{results['command']}``. Engine: "
               f"``{' '.join(results['engine_command'])} {' '.join(results['prediction_args'])}``.")
    options = results["options"]
    if options.get("client_cpus"):
        out.append(f"The client (this process, and pyvw in it) ran on CPUs "
                   f"{options['client_cpus']}, every engine on CPUs {options['engine_cpus']}.")
    workload = results["workload"]
    out.append(f"Workload: {workload['requests']:,} requests, each scoring all "
               f"{workload['items']:,} items of the catalogue (seed {workload['seed']}); "
               f"{workload['mean_line_bytes']:.0f} bytes per line on average; a logistic "
               "regression with 18 quadratic interactions.")

    out.append(f"**Predictions per request within timeout={timeout_ms:g} ms**")
    rows = []
    for name, data in summary["lines"].items():
        rows.append([name, _num(data["mean"]), _num(data["p50"]), _num(data["p1"]),
                     _num(data["p99"]), _x(data["vs_pyvw"]), _x(data["vs_engine"])])
    out.append(simple_table(["contender", "mean", "p50", "p1", "p99", "vs pyvw", "vs engine"],
                            rows))
    per_request = results["engine_per_request"]
    out.append(f"Engine alone: {len(per_request['lines']):,} requests; {per_request['method']}. "
               f"Over these requests the engine ran at {_num(per_request['lines_per_s'])} lines/s "
               f"(on a whole file, start-up subtracted: "
               f"{_num(results['throughput']['engine']['lines_per_s'])} lines/s, see below).")

    out.append(f"**predict() wall time in ms with timeout={timeout_ms:g} ms**")
    rows = []
    for name, data in summary["wall_ms"].items():
        rows.append([name, _num(data["mean"], 2), _num(data["p50"], 2), _num(data["p99"], 2),
                     _num(data["p99.9"], 2), _num(data["max"], 2),
                     str(data["over_deadline_plus_0.5ms"]), str(data["over_deadline_plus_1ms"])])
    out.append(simple_table(["contender", "mean", "p50", "p99", "p99.9", "max", ">+0.5 ms",
                             ">+1 ms"], rows))

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
    rows.append([ENGINE, "-", "-", "-", _num(results["engine_per_request"]["other_load_cores"], 2)])
    out.append(simple_table(["contender", "client µs", "engine µs", "cores", "other cores"],
                            rows))

    throughput = results["throughput"]
    out.append(f"**Throughput without a timeout** ({throughput['requests']} requests, best of "
               f"{throughput['rounds']} rounds; the engine alone start-up subtracted)")
    rows = []
    for name, data in summary["throughput"].items():
        engine = None if data.get("in_process") else data.get("engine_cpu_us_per_line")
        rows.append([name, _num(data["lines_per_s"]), _x(data["vs_pyvw"]), _x(data["vs_engine"]),
                     _num(data.get("client_cpu_us_per_line"), 1), _num(engine, 1)])
    out.append(simple_table(["contender", "lines/s", "vs pyvw", "vs engine", "client µs/line",
                             "engine µs/line"], rows))
    if ENGINE_STDIN in summary["throughput"]:
        out.append(f"{ENGINE}: ``ENGINE -d FILE -p FILE`` (the wheel engine runs vw's own driver, "
                   f"a parser thread and a learner thread); {ENGINE_STDIN}: "
                   "``ENGINE -p stdout < FILE > OUT``, the way subwabbit feeds the engine (the "
                   "wheel engine runs its one-thread loop). The targets compare with "
                   f"{ENGINE}.")

    training = results["training"]
    out.append(f"**Training throughput** ({training['lines']:,} labelled lines; write-only "
               "train: train() calls and close(), minus an idle close(); engine alone: start-up "
               "subtracted)")
    rows = [[name, _num(data["lines_per_s"]), _x(data["vs_engine"])]
            for name, data in summary["training"].items()]
    out.append(simple_table(["trainer", "lines/s", "vs engine"], rows))
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
            f"{target['value']:.2f} ms" if unit == "ms" else f"{target['value']:.2f}x")
        met = {True: "met", False: "MISSED", None: "not run"}[target["met"]]
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
            extra = ", ".join(f"{key}={data[key]}" for key in ("batch_size", "max_pending_lines",
                                                               "write_cutoff_s") if key in data)
            described.append(f"{name}: {data['class']}({extra})")
    out.append("Contenders: " + "; ".join(described) + ".")
    return "\n\n".join(out) + "\n"


# ------------------------------------------------------------------- plots

def make_plots(results: Dict[str, Any], out_dir: str) -> List[str]:
    """lines_per_request.png and wall_time.png."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

    timeout_ms = results["timeout"]["timeout_s"] * 1000
    series = {name: record["lines"] for name, record in results["timeout"]["contenders"].items()}
    series[ENGINE] = results["engine_per_request"]["lines"]
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

    figure, axes = pyplot.subplots(figsize=(9, 5))
    walls = {name: numpy.asarray(record["wall_s"]) * 1000
             for name, record in results["timeout"]["contenders"].items()}
    low = min(values.min() for values in walls.values())
    high = max(values.max() for values in walls.values())
    bins = numpy.linspace(min(low, timeout_ms - 1), max(high, timeout_ms + 1) + 0.05, 120)
    for name, values in walls.items():
        axes.hist(values, bins=bins, histtype="step", linewidth=1.6,
                  label=f"{name} (p99.9 {numpy.percentile(values, 99.9):.2f} ms)")
    axes.axvline(timeout_ms, color="black", linestyle="--", linewidth=1, label="deadline")
    axes.axvline(timeout_ms + 1, color="grey", linestyle=":", linewidth=1, label="deadline + 1 ms")
    axes.set_yscale("log")
    axes.set_xlabel("predict() wall time (ms)")
    axes.set_ylabel("calls (log scale)")
    axes.set_title(f"predict() wall time with timeout={timeout_ms:g} ms")
    axes.legend()
    figure.tight_layout()
    wall_path = os.path.join(out_dir, "wall_time.png")
    figure.savefig(wall_path, dpi=110)
    pyplot.close(figure)
    return [lines_path, wall_path]


def write_json(results: Dict[str, Any], path: str) -> None:
    """Write ``results`` as indented JSON to ``path`` (folders created), and say so."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    print(f"wrote {path}")


def write_outputs(results: Dict[str, Any], out_dir: str, plots: bool = True) -> str:
    """Write results.json, results.rst and the plots; return the reST text."""
    os.makedirs(out_dir, exist_ok=True)
    text = tables(results)
    with open(os.path.join(out_dir, "results.rst"), "w", encoding="utf-8") as handle:
        handle.write(text)
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
        handle.write("\n")
    if plots:
        make_plots(results, out_dir)
    return text

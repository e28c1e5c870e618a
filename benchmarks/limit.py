"""The engine alone: the same engine command reading the same lines from a file.

This is the upper limit for a client that runs the engine as a child process:
no Python formats lines, nothing crosses a pipe into the engine. Three
measurements, each with the engine's start-up (interpreter, model loading,
shutdown) subtracted:

* :class:`FileRuns` with predictions: lines per second on a whole file. The
  wall time of ``ENGINE -d FILE -p OUT`` minus the wall time of the same
  command on a one-line file, best of a few runs each. With ``-d`` the wheel
  engine runs vw's own driver (a parser thread and a learner thread); the
  same file on stdin (``via_stdin``) measures the engine as subwabbit's
  single processes feed it (vw's own driver too, unless
  ``SUBWABBIT_ENGINE_DRIVER=loop`` asks for the one-thread loop).
* :func:`per_request_rates`: how fast the engine gets through each request's
  lines. The requests' lines go into one file, read by one engine that writes
  its predictions to a pipe; a reader wakes every 2 milliseconds, stamps
  the predictions that arrived, and spreads the stamps evenly over the
  interval since its previous read. A request's time is from the last
  prediction of the request before it to its own last one, so start-up is
  excluded and the engine is in its steady state, its parser thread no more
  ahead than it is for any other request. The lines the engine finishes
  within a budget are then ``min(n, n * budget / time)``; the engine could
  not do better on a request it gets cold.
* :class:`FileRuns` without predictions, on labelled lines and with ``-f``:
  training throughput, the same way.
"""

import os
import subprocess
import time
from typing import Any, Dict, List, Sequence, Tuple

from subwabbit.command import resolve_engine_command

from .cpu import children_cpu_seconds


def engine_command(cpus: str = "") -> List[str]:
    """The engine command subwabbit itself would run (``vw`` on ``PATH``,
    ``$SUBWABBIT_VW`` or the wheel's engine), run by ``taskset -c CPUS`` if
    ``cpus`` is given."""
    command = resolve_engine_command(None)
    return ["taskset", "-c", cpus] + command if cpus else command


def write_lines(path: str, lines: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
        handle.write("\n")


def run_engine(command: Sequence[str], args: Sequence[str], data_path: str,
               predictions_path: str = "", via_stdin: bool = False) -> Tuple[float, float]:
    """Run the engine on a file.

    :param command: from :func:`engine_command`
    :param args: engine arguments (model, ``-t``, ...) without ``-d``/``-p``
    :param predictions_path: where the predictions go, or ``""`` for none
    :param via_stdin: feed the file on stdin and take the predictions from
        stdout (``-p stdout``), as subwabbit does, instead of ``-d FILE -p FILE``
        (the wheel engine's driver is then the one ``SUBWABBIT_ENGINE_DRIVER``
        chooses: vw's own by default)
    :returns: ``(wall seconds, CPU seconds)`` of the whole run
    """
    argv = list(command) + list(args)
    if not via_stdin:
        argv += ["-d", data_path] + (["-p", predictions_path] if predictions_path else [])
    elif predictions_path:
        argv += ["-p", "stdout"]
    cpu = children_cpu_seconds()
    started = time.perf_counter()
    with open(data_path if via_stdin else os.devnull, "rb") as stdin, \
            open(predictions_path if via_stdin and predictions_path else os.devnull, "wb") as stdout:
        subprocess.run(argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, check=True)
    return time.perf_counter() - started, children_cpu_seconds() - cpu


def file_predictions(command: Sequence[str], args: Sequence[str], lines: Sequence[str],
                     workdir: str, name: str = "check") -> List[float]:
    """What the engine predicts for ``lines`` read from a file (the ground truth)."""
    data, out = os.path.join(workdir, f"{name}.txt"), os.path.join(workdir, f"{name}.pred")
    write_lines(data, lines)
    run_engine(command, args, data, out)
    with open(out, encoding="utf-8") as handle:
        return [float(line.split()[0]) for line in handle if line.strip()]


class FileRuns:
    """Timed engine runs on ``lines`` and on their first line alone, taken in
    turns with other measurements; the difference of the best runs is the
    engine's time on the lines with its start-up and shutdown subtracted.

    :param command: from :func:`engine_command`
    :param args: engine arguments without ``-d``/``-p``
    :param predictions: whether the runs write predictions (``-p`` to a file)
    :param via_stdin: see :func:`run_engine`
    """

    def __init__(self, command: Sequence[str], args: Sequence[str], lines: Sequence[str],
                 workdir: str, name: str, predictions: bool, via_stdin: bool = False) -> None:
        self.command = list(command)
        self.args = list(args)
        self.via_stdin = via_stdin
        self.lines = len(lines)
        self.full = os.path.join(workdir, f"{name}.txt")
        self.one = os.path.join(workdir, f"{name}-one.txt")
        self.out = os.path.join(workdir, f"{name}.pred") if predictions else ""
        write_lines(self.full, lines)
        write_lines(self.one, lines[:1])
        self.full_runs: List[Tuple[float, float]] = []
        self.one_runs: List[Tuple[float, float]] = []

    def run(self) -> None:
        """One run on the first line and one on all lines.

        :raises RuntimeError: when the run on all lines did not print one
            prediction per line
        """
        self.one_runs.append(run_engine(self.command, self.args, self.one, self.out, self.via_stdin))
        self.full_runs.append(run_engine(self.command, self.args, self.full, self.out,
                                         self.via_stdin))
        if self.out:
            with open(self.out, "rb") as handle:
                printed = sum(1 for _ in handle)
            if printed != self.lines:
                raise RuntimeError(f"the engine printed {printed} predictions for {self.lines} "
                                   f"lines ({self.full})")

    def result(self) -> Dict[str, Any]:
        """The engine's rate on the lines with start-up subtracted.

        ``lines_per_s`` and ``engine_cpu_us_per_line`` are ``None``, with the
        reason in ``unmeasured``, when the best run on all lines was not slower
        than the best run on one line: the start-up's noise then exceeds the
        work, and a rate computed from it would be meaningless (negative, or
        far too high).
        """
        best_full, best_one = min(self.full_runs), min(self.one_runs)
        seconds = best_full[0] - best_one[0]
        measured = seconds > 0
        return {
            "lines": self.lines,
            "wall_s": best_full[0],
            "startup_s": best_one[0],
            "seconds": seconds,
            "lines_per_s": (self.lines - 1) / seconds if measured else None,
            "engine_cpu_us_per_line": ((best_full[1] - best_one[1]) / (self.lines - 1) * 1e6
                                       if measured else None),
            "unmeasured": None if measured else (
                "the run on all lines was not slower than the run on one line: the start-up's "
                "noise exceeds the work; give it more lines or rounds"),
            "runs": len(self.full_runs),
            "method": ("best wall time of ENGINE -p stdout < FILE" if self.via_stdin
                       else "best wall time of ENGINE -d FILE")
                      + " minus best wall time on the file's first line alone",
        }


def lines_within(count: int, timeout: float, seconds: float) -> int:
    """Whole lines of a request of ``count`` lines that the engine finishes
    within ``timeout``, at the ``seconds`` it took for all of them (all of
    them when that time is 0: a request whose predictions all came in the
    read that ended the one before it, as in a tiny run).
    """
    if seconds <= 0:
        return count
    return min(count, int(count * timeout / seconds))


def per_request_rates(command: Sequence[str], args: Sequence[str],
                      requests_lines: Sequence[Sequence[str]], workdir: str,
                      poll_s: float = 0.002, warm_up: int = 1) -> List[float]:
    """Seconds the engine spends on each request's lines (see the module doc).

    :param requests_lines: the lines of each request; the first ``warm_up``
        requests only warm the engine up and get no time of their own
    :param warm_up: how many requests lead in (at least 1: the first
        measured request's time starts at the last prediction before it)
    :returns: one duration per request after the first ``warm_up``
    """
    if warm_up < 1:
        raise ValueError(f"warm_up must be at least 1, not {warm_up}")
    path = os.path.join(workdir, "per-request.txt")
    with open(path, "w", encoding="utf-8") as handle:
        for lines in requests_lines:
            handle.write("\n".join(lines))
            handle.write("\n")
    argv = list(command) + list(args) + ["-d", path, "-p", "stdout"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, bufsize=0)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    reads: List[Tuple[float, int]] = []  # (time of the read, lines completed in it)
    clock, read, sleep = time.perf_counter, os.read, time.sleep
    try:
        while True:
            chunk = read(fd, 1 << 20)
            now = clock()
            if not chunk:
                break
            reads.append((now, chunk.count(b"\n")))
            sleep(poll_s)
    finally:
        proc.stdout.close()
        proc.wait()
    if proc.returncode:
        raise RuntimeError(f"the engine failed: {argv} exited with {proc.returncode}")
    if not reads:
        raise RuntimeError(f"the engine printed nothing: {argv}")
    # Stamp each prediction: spread evenly over the interval since the previous read.
    stamps: List[float] = []
    previous = reads[0][0]
    for now, count in reads:
        step = (now - previous) / count if count else 0.0
        stamps.extend(previous + step * (index + 1) for index in range(count))
        previous = now
    expected = sum(len(lines) for lines in requests_lines)
    if len(stamps) != expected:
        raise RuntimeError(f"the engine printed {len(stamps)} predictions for {expected} lines")
    durations = []
    end = sum(len(lines) for lines in requests_lines[:warm_up])
    for lines in requests_lines[warm_up:]:
        durations.append(stamps[end + len(lines) - 1] - stamps[end - 1])
        end += len(lines)
    return durations

"""The benchmark commands run end to end (tiny sizes; the figures are not judged here)."""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from benchmarks.pool_pacing import set_engines_nice
from subwabbit import VowpalWabbitDummyFormatter, VowpalWabbitPool, VowpalWabbitProcess
from subwabbit.engine_process import threads_of
from subwabbit.pool_base import default_pool_size

from conftest import DictFormatter, scoring_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_module(module, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, check=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout).stdout


def test_main_benchmark_quick_run_checks_every_contender(tmp_path):
    pytest.importorskip("numpy")
    pandas = pytest.importorskip("pandas")
    output = run_module("benchmarks", "--quick", "--no-plots", "--out", str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    text = (tmp_path / "results.rst").read_text()
    # every contender was compared with the engine before timing, and agreed
    assert results["correctness"] and all(check["equal"]
                                          for check in results["correctness"].values())
    for contender in ("pyvw", "blocking", "nonblocking", "pool", "pool-1",
                      "engine alone (wheel)"):
        assert results["summary"]["lines"][contender]["mean"] > 0, output
    assert "Targets" in text
    assert ("Before the timing, blocking, nonblocking, pool, pool-1 returned exactly the "
            "engine's predictions for the first") in text

    # one row per timed call, saved with the results
    calls = pandas.read_csv(tmp_path / "calls.csv.gz")
    timed = calls[calls["phase"] == "timeout"]
    per_contender = timed.groupby("contender").size().to_dict()
    assert per_contender == {"pyvw": 40, "pyvw-public": 40, "blocking": 40, "nonblocking": 40,
                             "pool": 40, "pool-1": 40,
                             "engine alone (wheel)": 20}  # --quick: 40 requests, 20 sampled
    assert set(calls["phase"]) == {"timeout", "warm-up", "throughput", "breakdown", "train"}
    # each turn of a contender began with unmeasured calls (--quick: 2) on the
    # requests before its block, the nearest first
    warm_up = calls[(calls["phase"] == "warm-up") & (calls["contender"] == "blocking")]
    block = results["timeout"]["block"]
    assert block == 5 and results["timeout_warm_up"]["calls_per_turn"] == 2
    assert list(warm_up["request"]) == [(start - call) % 40 for start in range(0, 40, block)
                                        for call in (1, 2)]
    assert "engine alone (wheel)" not in set(calls[calls["phase"] == "warm-up"]["contender"])
    assert "Each turn begins with 2 unmeasured call(s)" in text
    assert "after 2 warm-up request(s)" in results["engine_per_request"]["wheel"]["method"]
    blocking = timed[timed["contender"] == "blocking"]
    assert sorted(blocking["request"]) == list(range(40))
    # each contender paired request by request with the engine alone, on
    # the 20 requests it served too, from the same calls
    alone = timed[timed["contender"] == "engine alone (wheel)"].set_index("request")["predictions"]
    pool = timed[timed["contender"] == "pool"].set_index("request")["predictions"]
    paired = results["summary"]["lines"]["pool"]["paired_vs_best_engine"]
    assert paired["requests"] == 20
    assert paired["mean"] == pytest.approx((pool[alone.index] - alone).mean())
    assert paired["more"] + paired["fewer"] <= 20
    assert f"pool {paired['mean']:+,.1f} (SE" in text
    # the mean predictions per place in a turn (5 places a column), warm-up
    # calls first, from the same calls
    places = text[text.index("**Predictions per call by its place in the turn**"):]
    places = places.split("\n\n")[1].splitlines()
    assert places[1].split() == ["contender", "w1-2", "1-5"]
    row = next(line.split() for line in places[3:] if line.startswith("blocking "))
    assert row[1:] == [f"{warm_up['predictions'].mean():,.0f}",
                       f"{blocking['predictions'].mean():,.0f}"]
    engine_row = next(line.split() for line in places[3:] if line.startswith("engine alone"))
    assert engine_row[3] == "-"  # the engine alone has no warm-up calls of its own
    assert list(blocking["predictions"]) == results["timeout"]["contenders"]["blocking"]["lines"]
    assert (blocking["over_deadline_s"] - (blocking["wall_s"] - 0.010)).abs().max() < 1e-12
    assert set(calls[calls["phase"] == "train"]["contender"]) == {"write-only train (wheel)"}
    assert len(calls[calls["phase"] == "train"]) == 20_000 // 500  # --quick: one round
    assert results["training"]["write_only_train"]["wheel"]["median_round_vs_engine"] > 0

    # the summary tables again, in the layout of the 2.x documentation
    assert "layout of subwabbit 2.x's documentation" in text
    layout = text[text.index("predict() wall time in seconds:"):]
    table = layout.splitlines()[2:]  # border, header, border, the statistics, border
    rows = [line.split()[0] for line in table[3:11]]
    assert rows == ["mean", "min", "25%", "50%", "75%", "90%", "99%", "max"]
    assert table[1].split() == ["seconds", "pyvw", "pyvw-public", "blocking", "nonblocking",
                                "pool", "pool-1"]
    described = blocking["wall_s"].describe(percentiles=[0.25, 0.5, 0.75, 0.9, 0.99])
    assert table[3].split()[3] == f"{described['mean']:.6f}"
    assert table[9].split()[3] == f"{described['99%']:.6f}"
    assert "Predicted lines per request" in text

    # no vw executable given: its rows are left out, and the report says so
    assert "engine alone (vw)" not in text and "write-only train (vw)" not in text
    assert "No vw executable was given" in text
    assert "subwabbit 2.1.0 was not measured" in text
    assert results["training"]["subwabbit_2"]["skipped"]


def test_paired_difference_takes_the_requests_both_served():
    from benchmarks.report import paired_difference
    pair = paired_difference([3, 1, 2, 7], [10, 5, 8, 9], [1, 2, 3], [4, 8, 12])
    assert pair["requests"] == 3 and pair["mean"] == pytest.approx((1 + 0 - 2) / 3)
    assert (pair["more"], pair["fewer"]) == (1, 1)
    assert pair["standard_error"] == pytest.approx(1.5275252 / 3 ** 0.5)
    assert paired_difference([1], [3], [2], [3]) is None


def test_training_benchmark_runs_alone():
    output = run_module("benchmarks.training", "--lines", "2000", "--rounds", "1",
                        "--no-subwabbit-2")
    for row in ("engine alone (wheel)", "write-only train (wheel)", "pyvw"):
        assert f"\n{row} " in output, output
    assert "round by round" in output
    assert "subwabbit 2.1.0 was not measured: --no-subwabbit-2 was given" in output


def test_soak_finds_no_wrong_prediction(tmp_path):
    out = tmp_path / "soak.json"
    run_module("benchmarks.soak", "--predictions", "20000", "--requests", "8", "--out", str(out))
    results = json.loads(out.read_text())
    for summary in results["classes"].values():
        assert summary["predictions"] >= 20000
        assert summary["mismatches"] == 0
        assert summary["partial_calls"] > 0  # timeouts were hit


def test_stall_benchmark_runs(tmp_path):
    out = tmp_path / "stall.json"
    run_module("benchmarks.stall", "--calls", "20", "--trials", "2", "--out", str(out))
    results = json.loads(out.read_text())
    assert results["nonblocking_stopped_lateness_ms"]["n"] == 20
    assert results["blocking_kill_to_error_ms"]["n"] == 2


def test_nonblocking_settings_compares_settings():
    output = run_module("benchmarks.nonblocking_settings", "--requests", "3", "--gap", "0.01",
                        "max_pending_lines=10,write_cutoff_s=0.002", "blocking")
    assert "10 ms idle before each call" in output
    assert "max_pending_lines=10,write_cutoff_s=0.002: predictions mean" in output
    assert "blocking: predictions mean" in output


def test_drivers_benchmark_measures_both_drivers():
    output = run_module("benchmarks.drivers", "--requests", "3", "--items", "300",
                        "--workers", "2", "--seconds", "0.3")
    for driver in ("loop", "vw"):
        assert f"VowpalWabbitProcess ({driver}): predictions mean" in output
        assert f"VowpalWabbitNonBlockingProcess ({driver}): predictions mean" in output
        assert f"{driver}: " in output.split("2 worker processes")[1]
    assert "predictions/s" in output


def test_the_reload_benchmark_prints_the_calls_around_its_reloads():
    # a 1 s timeout: every call returns its 300 items, reload or not
    output = run_module("benchmarks.reload", "--reloads", "2", "--every", "0.2", "--items", "300",
                        "--timeout", "1")
    assert "pool of 2, 300 items per call, timeout 1000 ms, -b 20, 2 reloads" in output, output
    figures = output.split("predictions per call: ")[1]
    assert figures.startswith("steady 300; during a reload ") or \
        figures.startswith("steady nan; during a reload "), output
    assert "calls 1-4 on the new engines 300, 300, 300, 300 (the fewest in a first call: 300)" \
        in output, output


def test_the_reload_benchmark_measures_engine_deaths_on_request():
    output = run_module("benchmarks.reload", "--deaths", "2", "--items", "300", "--timeout", "1")
    assert "pool of 2, 300 items per call, timeout 1000 ms, 2 engines killed" in output, output
    assert ("predictions of the call 200 ms after an engine died: 300 on average (300, 300); "
            "calls once the pool was whole again: 300") in output, output


def test_the_sizes_benchmark_times_every_contender_at_every_size(tmp_path):
    out = tmp_path / "sizes.json"
    output = run_module("benchmarks.sizes", "--sizes", "5,40", "--rounds", "1", "--calls", "3",
                        "--timeout", "2", "--json", str(out))
    lines = output.splitlines()
    header = lines.index(next(line for line in lines if line.split()[:1] == ["items"]))
    assert [line.split()[0] for line in lines[header + 1:]] == ["5", "40"], output
    table = json.loads(out.read_text())["sizes"]
    assert set(table) == {"5", "40"}
    for row in table.values():
        assert set(row) == {f"pool ({default_pool_size()})", "pool (1)", "nonblocking",
                            "blocking"}, row
        assert all(0 < seconds < 2 for seconds in row.values()), row


def test_the_reload_benchmark_measures_closing_on_request():
    output = run_module("benchmarks.reload", "--closes", "2", "--items", "300", "--timeout", "1")
    assert "pool of 2, 2 pools closed" in output, output
    walls, cpus = output.split("close(): wall time ")[1].split(" ms; CPU of its processes from "
                                                            "close() to their exit ")
    assert len(walls.split(", ")) == 2 and all(float(value) > 0 for value in walls.split(", "))
    assert len(cpus.split(" ms")[0].split(", ")) == 2, output


def test_idle_ramp_prints_each_place_with_the_engine_threads_statistics():
    # a 1 s timeout: every call returns its 300 items, however cold the engine
    output = run_module("benchmarks.idle_ramp", "--turns", "2", "--calls", "3", "--items", "300",
                        "--idle", "0.01", "--timeout", "1")
    lines = output.splitlines()
    places = lines[lines.index("place predictions") + 1:]
    assert [line.split()[0] for line in places] == ["1", "2", "3"], output
    assert all(line.split()[1] == "300" for line in places), output
    if os.path.exists("/proc/self/sched"):  # a kernel that shows the scheduler's statistics
        threads = int(output.split("engine threads: ")[1].split()[0])
        for line in places:
            util = line.split("util ")[1].split()[0].split("/")
            assert len(util) == threads and all(0 <= int(value) <= 1024 for value in util)
            for name in ("preempted", "migrated"):
                counts = line.split(name + " ")[1].split()[0].split("/")
                assert len(counts) == threads and all(float(count) >= 0 for count in counts)
    else:
        assert "predictions only" in output


def test_thread_stats_reads_every_thread_of_a_process():
    from benchmarks.idle_ramp import FIELDS, thread_stats  # pylint: disable=import-outside-toplevel
    if not os.path.exists("/proc/self/sched"):
        assert thread_stats(os.getpid()) is None
        return
    ready, stop = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (ready.set(), stop.wait()))
    worker.start()
    try:
        ready.wait()
        stats = thread_stats(os.getpid())
        assert stats is not None
        assert worker.native_id in stats and threading.main_thread().native_id in stats
        assert all(set(FIELDS.values()) <= set(thread) for thread in stats.values())
    finally:
        stop.set()
        worker.join()
    # join() returns when the thread's Python part is done; its task may
    # linger in /proc for a moment after.
    give_up = time.monotonic() + 5
    while worker.native_id in (thread_stats(os.getpid()) or {}) and time.monotonic() < give_up:
        time.sleep(0.01)
    assert worker.native_id not in (thread_stats(os.getpid()) or {})
    assert thread_stats(2 ** 22 + 1) is None  # no such process


def test_engine_alone_per_request_leaves_out_its_lead_in_requests(tmp_path):
    from benchmarks.limit import engine_command, per_request_rates  # pylint: disable=import-outside-toplevel
    requests = [[f"|a r{index} i{item}" for item in range(50 * (index + 1))] for index in range(5)]
    for lead in (1, 3):
        durations = per_request_rates(engine_command(), ["--quiet"], requests, str(tmp_path),
                                      warm_up=lead)
        assert len(durations) == len(requests) - lead
        assert all(seconds >= 0 for seconds in durations)
    with pytest.raises(ValueError, match="warm_up"):
        per_request_rates(engine_command(), ["--quiet"], requests, str(tmp_path), warm_up=0)


def test_requests_before_a_block_wrap_around_and_never_include_the_block():
    from benchmarks.__main__ import requests_before  # pylint: disable=import-outside-toplevel
    assert requests_before(20, 3, 40) == [19, 18, 17]
    assert requests_before(0, 3, 40) == [39, 38, 37]
    assert requests_before(5, 0, 40) == []


def test_places_in_the_turn_group_warm_up_and_measured_calls_in_order():
    pandas = pytest.importorskip("pandas")
    from benchmarks.calls import by_turn_position  # pylint: disable=import-outside-toplevel
    block, warm_calls, rows = 12, 7, []
    for turn in range(2):
        first = turn * block
        for call in range(warm_calls):  # a warm-up call's predictions: 100 + its place
            rows.append({"phase": "warm-up", "contender": "c", "round": turn,
                         "request": (first - 1 - call) % 24, "predictions": 100 + call})
        for place in range(block):  # a measured call's: 1,000 + its place (+ 1,000 in turn 1)
            rows.append({"phase": "timeout", "contender": "c", "round": turn,
                         "request": first + place, "predictions": 1000 + place + 1000 * turn})
        rows.append({"phase": "timeout", "contender": "engine alone (x)", "round": turn,
                     "request": first, "predictions": 5000})
    table = by_turn_position(pandas.DataFrame(rows), block)
    assert list(table.columns) == ["w1-5", "w6-7", "1-5", "6-10", "11-12"]
    assert list(table.index) == ["c", "engine alone (x)"]
    assert list(table.loc["c"]) == [102, 105.5, 1502, 1507, 1510.5]
    assert table.loc["engine alone (x)"].isna().tolist() == [True, True, False, True, True]
    assert table.loc["engine alone (x)", "1-5"] == 5000
    # without warm-up calls, a place a column with group=1
    measured = pandas.DataFrame([row for row in rows if row["phase"] == "timeout"])
    table = by_turn_position(measured, block, group=1)
    assert list(table.columns) == [str(place) for place in range(1, block + 1)]
    assert table.loc["c", "12"] == 1511


def test_blocking_pacing_benchmark_compares_pacings_in_one_process():
    output = run_module("benchmarks.blocking_pacing", "--requests", "3", "--items", "300",
                        "two-batches", "default", "200:50")
    for name in ("two-batches", "default", "200:50"):
        assert f"{name}: predictions mean" in output
    output = run_module("benchmarks.blocking_pacing", "--requests", "4", "--items", "300",
                        "--turn", "2", "--idle", "0.01", "two-batches", "default")
    assert "2 processes taking turns of 2 calls" in output
    assert "default: predictions mean" in output
    refused = subprocess.run([sys.executable, "-m", "benchmarks.blocking_pacing", "30:0"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "at least the batch size (50)" in refused.stdout


def test_blocking_pacing_names():
    from benchmarks.blocking_pacing import pacing_of  # pylint: disable=import-outside-toplevel
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"], batch_size=20) as process:
        default = pacing_of("default", process)()
        assert (default.max_in_flight_lines, default.lines_at_deadline) == (80, 20)
        two = pacing_of("two-batches", process)()
        assert (two.max_in_flight_lines, two.lines_at_deadline, two.min_batch) == (40, None, 20)
        deep = pacing_of("200:0", process)()
        assert (deep.max_in_flight_lines, deep.lines_at_deadline) == (200, None)
        assert pacing_of("90:30", process)().lines_at_deadline == 30
        for wrong in ("10:0", "90:5", "fast", "90:x", "100:-5"):
            with pytest.raises(ValueError, match="pacing"):
                pacing_of(wrong, process)


def test_nonblocking_settings_start_each_engine_with_the_driver_it_names():
    from benchmarks.nonblocking_settings import parse_setting, start  # pylint: disable=import-outside-toplevel
    from benchmarks.workload import RecommenderFormatter  # pylint: disable=import-outside-toplevel
    assert parse_setting("batch_size=20,driver=loop,write_cutoff_s=0.001") == {
        "batch_size": 20, "driver": "loop", "write_cutoff_s": 0.001}
    threads = {}
    for setting in ("driver=loop", "blocking:driver=vw,batch_size=30", "blocking:driver=loop"):
        with start(RecommenderFormatter(), ["--quiet"], setting) as process:
            threads[setting] = len(os.listdir(f"/proc/{process.pid}/task"))
    assert threads == {"driver=loop": 1, "blocking:driver=vw,batch_size=30": 2,
                       "blocking:driver=loop": 1}
    assert "SUBWABBIT_ENGINE_DRIVER" not in os.environ


def test_pauses_probe_reports_both_measurements():
    output = run_module("benchmarks.pauses", "--seconds", "0.2")
    assert "busy loop, 0.2 s:" in output
    assert "sleeps of 1 ms in select: late by p50" in output


#: The smallest run of the main benchmark: a few calls of each kind.
TINY_RUN = ("--requests", "6", "--items", "200", "--train-lines", "1000", "--train-rounds", "1",
            "--rounds", "1", "--throughput-requests", "2", "--engine-requests", "6",
            "--check-requests", "2", "--breakdown-requests", "2", "--block", "3",
            "--warm-up-calls", "1", "--pause-probe", "0.1", "--no-subwabbit-2", "--no-plots")


def run_main_benchmark(out, *args, wrong=""):
    """The main benchmark in a child Python, with the contender named ``wrong``
    (if any) returning its real engine's predictions plus 0.5."""
    code = ("import sys\n"
            "import benchmarks.__main__ as bench\n"
            "def wrong(make):\n"
            "    def made(*args, **kwargs):\n"
            "        contender = make(*args, **kwargs)\n"
            "        predict = contender.predict\n"
            "        contender.predict = lambda *call: [p + 0.5 for p in predict(*call)]\n"
            "        return contender\n"
            "    return made\n"
            f"if {wrong!r}:\n"
            f"    name = {wrong!r} + '_contender'\n"
            "    setattr(bench, name, wrong(getattr(bench, name)))\n"
            "bench.main(sys.argv[1:])\n")
    return subprocess.run([sys.executable, "-c", code, *TINY_RUN, *args, "--out", str(out)],
                          cwd=ROOT, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300).stdout


def target_rows(text):
    """The rows of the report's table of targets: description -> (measured, result)."""
    table = text[text.index("**Targets**"):].split("\n\n")[1].splitlines()[3:-1]
    rows = {}
    for line in table:
        description, measured, result = re.split(r" {2,}", line.strip())
        rows[description] = (measured, result)
    return rows


def test_a_contender_that_predicts_wrong_misses_its_targets_and_the_report_says_so(tmp_path):
    """A class whose predictions differ from the engine's is left out of the
    timing, and the report says why: its targets are missed, not 'not run'."""
    pytest.importorskip("numpy")
    pytest.importorskip("pandas")
    output = run_main_benchmark(tmp_path, "--contenders", "blocking,nonblocking",
                                wrong="nonblocking")
    assert "MISMATCH: nonblocking" in output
    results = json.loads((tmp_path / "results.json").read_text())
    assert not results["correctness"]["nonblocking"]["equal"]
    assert results["correctness"]["blocking"]["equal"]
    assert "nonblocking" not in results["timeout"]["contenders"]
    text = (tmp_path / "results.rst").read_text()
    assert ("Before the timing, blocking returned exactly the engine's predictions for the "
            "first 400 lines") in text, text
    assert "; nonblocking predicted differently from the engine (largest difference 0.5" in text
    rows = target_rows(text)
    for description, (measured, result) in rows.items():
        if description.startswith("nonblocking:"):
            assert (measured, result) == ("wrong predictions", "MISSED"), rows
        if description.startswith("blocking:"):  # (a tiny run's throughput may be unmeasured)
            assert measured != "wrong predictions", rows
        if description.startswith("pool"):  # not asked for: not run
            assert (measured, result) == ("-", "not run"), rows
    assert rows["blocking: mean predictions per request >= 0.90x best engine alone"][1] in (
        "met", "MISSED")


def test_the_report_gives_each_pools_size(tmp_path):
    """The pool of the default size has as many engines as this process may
    use CPUs: with --client-cpus 0, one, like pool-1. The report says so."""
    pytest.importorskip("numpy")
    pytest.importorskip("pandas")
    run_main_benchmark(tmp_path, "--contenders", "pool,pool-1", "--client-cpus", "0")
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["contender_settings"]["pool"]["size"] == 1
    text = (tmp_path / "results.rst").read_text()
    assert "pool: subwabbit.VowpalWabbitPool(size=1, batch_size=" in text
    assert "pool-1: subwabbit.VowpalWabbitPool(size=1, batch_size=" in text
    assert ("pool (default size, here 1 engine): mean predictions per request > best engine "
            "alone") in target_rows(text)


def test_a_target_whose_reference_is_unmeasured_reads_unmeasured_not_not_run(tmp_path):
    """When the start-up's noise hides the engine alone's rate (FileRuns gives
    None, as on a loaded machine with little work), the throughput targets of
    the classes that ran have no figure: unmeasured, not 'not run'."""
    pytest.importorskip("numpy")
    pytest.importorskip("pandas")
    from benchmarks.report import summarize, tables  # pylint: disable=import-outside-toplevel
    run_main_benchmark(tmp_path, "--contenders", "blocking")
    results = json.loads((tmp_path / "results.json").read_text())
    results["throughput"]["engines"]["wheel"]["file"]["lines_per_s"] = None
    summarize(results)
    rows = target_rows(tables(results))
    assert rows["blocking: throughput without timeout >= 0.90x its engine alone"] == (
        "-", "unmeasured"), rows
    assert rows["blocking: mean predictions per request >= 0.90x best engine alone"][1] in (
        "met", "MISSED")
    assert rows["nonblocking: throughput without timeout >= 0.90x its engine alone"] == (
        "-", "not run"), rows  # not asked for


def test_the_pool_benchmarks_one_caller_table_names_its_columns_after_their_figures(capsys):
    """Its second column is each contender's fewest predictions in a call."""
    from benchmarks.pool import _print_one_caller  # pylint: disable=import-outside-toplevel
    _print_one_caller("one caller", {
        "pool of 2": {"predictions": {"mean": 2900.0, "min": 1200, "p50": 3000},
                      "wall_ms": {"p50": 9.0, "p99": 10.1, "p99.9": 10.2, "max": 10.3},
                      "late_over_1ms": 0},
        "engine alone": {"predictions": {"mean": 2950.0, "min": 1500, "p50": 3000}}})
    lines = capsys.readouterr().out.splitlines()
    header = lines[2].split()
    assert header[:4] == ["contender", "mean", "min", "p50"], lines
    assert lines[3].split()[:5] == ["pool", "of", "2", "2900", "1200"]
    assert lines[4].split()[:4] == ["engine", "alone", "2950", "1500"]


def test_the_pool_benchmarks_engine_alone_finishes_whole_lines_within_the_timeout(tmp_path):
    """With a timeout that cuts every request, the engine alone's lines within
    it are whole lines, as a call's predictions are."""
    from benchmarks.pool import one_caller  # pylint: disable=import-outside-toplevel
    from benchmarks.turns import train_model  # pylint: disable=import-outside-toplevel
    from benchmarks.workload import Workload  # pylint: disable=import-outside-toplevel
    workload = Workload(4, 300)
    model = str(tmp_path / "model.vw")
    train_model(workload, model, lines=600)
    results = one_caller(workload, model, 0.0002, [1], singles=False)
    alone = results["engine alone"]["predictions"]
    assert 0 <= alone["min"] < 300, results  # cut: 300 lines take longer than 0.2 ms
    for key in ("min", "p50", "max"):
        assert alone[key] == int(alone[key]), results


def test_a_target_measured_next_to_its_bound_shows_which_side_it_is_on(tmp_path):
    """The pool's target is "more than the best engine alone": a pool 0.4%
    ahead must not read "1.00x met", nor one 0.04% behind "1.00x MISSED"."""
    pytest.importorskip("numpy")
    pytest.importorskip("pandas")
    from benchmarks.report import summarize, tables  # pylint: disable=import-outside-toplevel
    run_main_benchmark(tmp_path, "--contenders", "pool")
    results = json.loads((tmp_path / "results.json").read_text())
    alone = results["engine_per_request"]["wheel"]
    for pool, shown in ((10_040, ("1.004x", "met")), (9_996, ("0.9996x", "MISSED")),
                        (10_000, ("1.00x", "MISSED")), (10_600, ("1.06x", "met"))):
        alone["lines"] = [10_000] * len(alone["lines"])
        results["timeout"]["contenders"]["pool"]["lines"] = [pool] * len(alone["lines"])
        summarize(results)
        [row] = [figures for description, figures in target_rows(tables(results)).items()
                 if description.startswith("pool (default size")]
        assert row == shown


def test_main_benchmark_writes_outside_the_tree_by_default_and_reports_the_engine_on_stdin():
    pytest.importorskip("numpy")
    pytest.importorskip("pandas")
    output = run_module("benchmarks", "--quick", "--no-plots", "--contenders", "blocking")
    out = output.rsplit("results in ", 1)[1].split()[0]
    try:
        assert os.path.isdir(out) and os.path.isabs(out)
        assert not os.path.abspath(out).startswith(ROOT + os.sep)
        assert os.path.basename(out).startswith("subwabbit-benchmark-")
        results = json.loads(open(os.path.join(out, "results.json"), encoding="utf-8").read())
        stdin = results["throughput"]["engines"]["wheel"]["stdin"]
        # every run printed one prediction per line (FileRuns.run checks it), and
        # the rate is either a real one or says why it is missing; a 2-core CI
        # machine's start-up noise may exceed the quick run's work
        assert stdin["runs"] == 3 and stdin["lines"] == 20 * 1000
        if stdin["lines_per_s"] is None:
            assert "start-up's noise" in stdin["unmeasured"]
        else:
            assert stdin["lines_per_s"] > 0 and stdin["unmeasured"] is None
        assert stdin["method"].startswith("best wall time of ENGINE -p stdout < FILE")
        assert results["machine_pauses"]["seconds"] > 0
        text = open(os.path.join(out, "results.rst"), encoding="utf-8").read()
        assert "engine alone, stdin (wheel)" in text and "The machine's own pauses" in text
        assert os.path.exists(os.path.join(out, "calls.csv.gz"))
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_default_output_folder_is_new_and_outside_the_source_tree():
    from benchmarks.__main__ import COMMITTED_OUT, parse_options
    first = parse_options([]).out
    assert not os.path.abspath(first).startswith(ROOT + os.sep)
    assert not os.path.exists(first)
    assert parse_options(["--out", "benchmarks/results"]).out == "benchmarks/results"
    assert COMMITTED_OUT == os.path.join(ROOT, "benchmarks", "results")


def test_main_benchmark_measures_a_vw_executable_beside_the_wheel_engine(tmp_path):
    """A stand-in "vw executable" (a script that runs the wheel's engine) gets
    rows of its own; the classes stay on the default engine."""
    pytest.importorskip("numpy")
    pandas = pytest.importorskip("pandas")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    vw = bin_dir / "vw"
    vw.write_text(f"#!/bin/sh\nexec {sys.executable} "
                  f"{os.path.join(ROOT, 'subwabbit', 'engine', 'program.py')} \"$@\"\n")
    vw.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--no-plots", "--contenders",
         "blocking", "--vw-executable", str(vw), "--out", str(out)],
        cwd=ROOT, env=env, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300).stdout
    results = json.loads((out / "results.json").read_text())
    text = (out / "results.rst").read_text()
    assert results["engines"]["default"] == "wheel"
    assert [engine["name"] for engine in results["engines"]["engines"]] == ["wheel", "vw"]
    for row in ("engine alone (wheel)", "engine alone (vw)", "engine alone, stdin (vw)",
                "write-only train (vw)", "write-only train (wheel)"):
        assert row in text, output
    assert set(results["engine_per_request"]) == {"wheel", "vw"}
    summary = results["summary"]
    best = summary["best_engine"]["lines"]
    assert best in ("wheel", "vw")
    means = {name: summary["lines"][f"engine alone ({name})"]["mean"] for name in ("wheel", "vw")}
    assert means[best] == max(means.values())
    assert summary["lines"]["blocking"]["vs_best_engine"] == pytest.approx(
        summary["lines"]["blocking"]["mean"] / means[best])
    calls = pandas.read_csv(out / "calls.csv.gz")
    timed = calls[calls["phase"] == "timeout"]
    assert set(timed[timed["contender"] == "blocking"]["engine"]) == {"wheel"}
    assert len(timed[timed["contender"] == "engine alone (vw)"]) == 20
    legacy = results["training"]["subwabbit_2"]
    if "skipped" in legacy:  # no package index here
        assert "pip could not install subwabbit==2.1.0" in legacy["skipped"], legacy
    else:
        assert legacy["subwabbit"] == "2.1.0" and legacy["lines_per_s"] > 0
        assert legacy["lines"] == 20_000 and legacy["model_bytes"] > 0
        assert "subwabbit 2.1.0 train (vw)" in text
        assert len(calls[calls["contender"] == "subwabbit 2.1.0 train (vw)"]) == 40


def test_wall_time_plot_counts_the_calls_beyond_its_window(tmp_path):
    from benchmarks.report import beyond_window_label, plot_wall_times, wall_time_window
    assert wall_time_window(10.0) == (0.0, 15.0)
    assert beyond_window_label([9.0, 10.2, 15.5, 460.0], 15.0) == (
        "2 of 4 calls beyond 15 ms, not shown (slowest 460.0 ms)")
    assert beyond_window_label([9.0, 14.9], 15.0) == "none of 2 calls beyond 15 ms"
    pytest.importorskip("matplotlib")
    path = tmp_path / "wall.png"
    plot_wall_times({"blocking": [0.009, 0.0102, 0.46], "nonblocking": [0.0095, 0.0101]},
                    10.0, str(path))
    assert path.stat().st_size > 0


def test_file_runs_refuse_a_rate_when_start_up_noise_exceeds_the_work(tmp_path):
    from benchmarks.limit import FileRuns
    runs = FileRuns(["vw"], [], ["1 |a x"] * 11, str(tmp_path), "noise", predictions=False)
    runs.one_runs, runs.full_runs = [(0.050, 0.04)], [(0.049, 0.05)]
    result = runs.result()
    assert result["lines_per_s"] is None and result["engine_cpu_us_per_line"] is None
    assert "start-up's noise" in result["unmeasured"]
    runs.full_runs.append((0.060, 0.06))
    runs.full_runs.remove((0.049, 0.05))
    result = runs.result()
    assert result["lines_per_s"] == pytest.approx(10 / 0.010)
    assert result["unmeasured"] is None


def test_file_runs_check_one_prediction_per_line_from_the_real_engine(tmp_path):
    from benchmarks.limit import FileRuns, engine_command
    model = str(tmp_path / "model.vw")
    subprocess.run(engine_command() + ["--quiet", "-f", model], input=b"1 |a x\n", check=True)
    args = ["--quiet", "-t", "-i", model]
    for via_stdin in (False, True):
        good = FileRuns(engine_command(), args, ["|a x"] * 5, str(tmp_path), "good",
                        predictions=True, via_stdin=via_stdin)
        good.run()
        assert good.result()["lines"] == 5
        # vw answers nothing for an empty line: the count check must catch it
        short = FileRuns(engine_command(), args, ["|a x", "", "|a y"], str(tmp_path), "short",
                         predictions=True, via_stdin=via_stdin)
        with pytest.raises(RuntimeError, match="printed 2 predictions for 3 lines"):
            short.run()


def test_loop_stall_benchmark_runs():
    output = run_module("benchmarks.loop_stall", "--requests", "3", "--pretrain-lines", "2000")
    assert "AsyncVowpalWabbitProcess (timeout=0.01): longest loop stall per call, ms: p50" in output
    assert "VowpalWabbitNonBlockingProcess called in a coroutine" in output


def test_distributed_benchmark_measures_one_and_two_workers(tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "distributed.json"
    output = run_module("benchmarks.distributed", "--lines", "4000", "--rounds", "1",
                        "--skip-loss", "--out", str(out))
    speed = json.loads(out.read_text())["speed"]
    for name in ("one process", "1 workers", "2 workers"):
        assert speed[name]["lines_per_s"] > 0, output
    assert 0 < speed["2 workers"]["allreduce_share"] < 1
    assert "the AllReduce itself" in output


def test_pool_cpu_benchmark_measures_the_pool_and_its_engine_alone(tmp_path):
    path = tmp_path / "pool_cpu.json"
    output = run_module("benchmarks.pool_cpu", "--items", "300", "--requests", "3", "--calls", "6",
                        "--rounds", "1", "--size", "2", "--timeout", "1", "--json", str(path))
    assert "pool of 2, 6 calls of 300 items per round, timeout 1000 ms" in output, output
    assert [line.split()[0] for line in output.splitlines()[-2:]] == ["1", "median"], output
    report = json.loads(path.read_text())
    assert len(report["rounds"]) == 1
    figures = report["rounds"][0]
    # A 1 s timeout: every call returns its 300 items, and the engines read
    # about as many lines (the mean line length is the file's), and once more
    # the lines of a batch dealt again to the other engine (on a busy machine
    # an engine can go quiet for longer than the pool waits before it hedges).
    assert figures["predictions_per_call"] == 300
    assert 250 <= figures["engine_lines_per_call"] - figures["hedged_lines_per_call"] <= 350, \
        figures
    assert figures["client_us_per_prediction"] > 0 and figures["engine_us_per_line"] > 0
    assert report["medians"]["predictions_per_call"] == 300


def test_pool_pacing_benchmark_compares_factors_on_one_pool(tmp_path):
    path = tmp_path / "pool_pacing.json"
    output = run_module("benchmarks.pool_pacing", "--items", "300", "--requests", "3",
                        "--turns", "2", "--calls", "3", "--warm-up", "1", "--size", "2",
                        "--timeout", "1", "--json", str(path), "0", "1")
    assert "pool of 2, 300 items, timeout 1000 ms, 2 turns of 3 calls (1 unmeasured first)" \
        in output, output
    report = json.loads(path.read_text())
    assert report["compared"] == "factor"
    assert list(report["settings"]) == ["0.0", "1.0"]
    for figures in report["settings"].values():
        # a 1 s timeout: every call returns all its items, each factor has
        # its 3 calls of each of the 2 turns measured
        assert figures["calls"] == 6 and figures["mean_predictions"] == 300, figures
        assert figures["lines_read_per_call"] >= 250, figures
        assert figures["late_calls"] == 0, figures
    assert report["settings"]["0.0"]["vs_first"] == 1.0
    for args, message in ((["--", "-1"], "factors must be 0 or more"),
                          (["--nice", "20"], "nice values must be 0 to 19")):
        refused = subprocess.run([sys.executable, "-m", "benchmarks.pool_pacing"] + args,
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, check=False)
        assert refused.returncode == 2 and message in refused.stdout, refused.stdout


def test_pool_pacing_benchmark_compares_engine_nice_values_one_pool_each(tmp_path):
    path = tmp_path / "pool_nice.json"
    output = run_module("benchmarks.pool_pacing", "--items", "300", "--requests", "3",
                        "--turns", "2", "--calls", "3", "--warm-up", "1", "--size", "2",
                        "--timeout", "1", "--json", str(path), "--nice", "0", "3")
    assert "nice 3" in output, output
    report = json.loads(path.read_text())
    assert report["compared"] == "nice" and list(report["settings"]) == ["nice 0", "nice 3"]
    for figures in report["settings"].values():
        assert figures["calls"] == 6 and figures["mean_predictions"] == 300, figures


def test_engines_nice_is_set_on_every_engine_thread(trained_model):
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2,
                          low_priority_engines=False) as pool:
        set_engines_nice(pool, 3)
        tids = [tid for pid in pool.engine_pids() for tid in threads_of(pid)]
        assert len(tids) >= 2
        for tid in tids:
            assert os.getpriority(os.PRIO_PROCESS, tid) == min(19, mine + 3)
            assert os.sched_getscheduler(tid) == os.SCHED_BATCH


def test_a_request_timed_at_no_time_counts_all_its_lines_within_the_timeout():
    """A request whose predictions all came in the read that ended the one
    before it is timed at 0 s (it happens in tiny runs): the main benchmark
    divided by it (ZeroDivisionError, a tiny run failed 1 time in 4)."""
    from benchmarks.limit import lines_within  # pylint: disable=import-outside-toplevel
    assert lines_within(300, 0.01, 0.0) == 300
    assert lines_within(300, 0.01, 0.02) == 150
    assert lines_within(300, 0.01, 0.0001) == 300
    assert lines_within(3, 0.01, 0.0299) == 1  # whole lines

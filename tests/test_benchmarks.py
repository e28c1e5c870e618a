"""The benchmark commands run end to end (tiny sizes; the figures are not judged here)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_module(module, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, check=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout).stdout


def test_main_benchmark_quick_run_checks_every_contender(tmp_path):
    pytest.importorskip("numpy")
    output = run_module("benchmarks", "--quick", "--no-plots", "--out", str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.rst").exists()
    # every contender was compared with the engine before timing, and agreed
    assert results["correctness"] and all(check["equal"]
                                          for check in results["correctness"].values())
    for contender in ("pyvw", "blocking", "nonblocking", "engine alone"):
        assert results["summary"]["lines"][contender]["mean"] > 0, output
    assert "Targets" in (tmp_path / "results.rst").read_text()


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
    output = run_module("benchmarks.nonblocking_settings", "--requests", "3",
                        "max_pending_lines=10,write_cutoff_s=0.002", "blocking")
    assert "max_pending_lines=10,write_cutoff_s=0.002: predictions mean" in output
    assert "blocking: predictions mean" in output


def test_pauses_probe_reports_both_measurements():
    output = run_module("benchmarks.pauses", "--seconds", "0.2")
    assert "busy loop, 0.2 s:" in output
    assert "sleeps of 1 ms in select: late by p50" in output


def test_main_benchmark_reports_the_engine_on_stdin_and_the_machine_pauses(tmp_path):
    pytest.importorskip("numpy")
    run_module("benchmarks", "--quick", "--no-plots", "--contenders", "blocking",
               "--out", str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    stdin = results["throughput"]["engine_stdin"]
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
    text = (tmp_path / "results.rst").read_text()
    assert "engine alone, stdin" in text and "The machine's own pauses" in text


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

"""Tests for the pure parts of subwabbit.command and for subwabbit.deadlines."""

import fractions
import math
import os
import pathlib
import sys
import time
import warnings

import pytest

from subwabbit.command import (ENGINE_ENV_VAR, build_argv, default_engine_command,
                               normalize_vw_args, quiet_but_errors, resolve_engine_command)
from subwabbit.deadlines import (LONGEST_WAIT_S, deadline_from_timeout, remaining,
                                 validate_seconds)

# ------------------------------------------------------------------ normalize_vw_args

REJECTED_ARGS = [
    ["-p"],
    ["-p", "out.txt"],
    ["-pstdout"],
    ["--predictions"],
    ["--predictions", "stdout"],
    ["--predictions=x"],
    ["-d"],
    ["-d", "train.txt"],
    ["-dtrain.txt"],
    ["--data", "train.txt"],
    ["--data=train.txt"],
    ["--daemon"],
    ["--port", "26542"],
    ["--port=26542"],
    ["--log_output", "stdout"],
    ["--log_output=stderr"],
    ["--driver_output", "stdout"],
    ["-a"],
    ["--audit"],
    ["-q", "ui", "--audit"],
    ["--raw_predictions", "stdout"],
    ["--raw_predictions=stdout"],
    ["--raw_predictions", "/dev/stdout"],
    ["-r", "stdout"],
    ["-r", "/dev/stdout"],
    ["-r", "/dev/fd/1"],
    ["-r", "/proc/self/fd/1"],
    ["-rstdout"],
    ["-r=stdout"],
    ["-q", "u\0i"],
    ["-f", "/tmp/model\0.vw"],
    "-q ui --audit",
    "-p stdout",
]


@pytest.mark.parametrize("args", REJECTED_ARGS)
def test_normalize_vw_args_rejects(args):
    with pytest.raises(ValueError):
        normalize_vw_args(args)


@pytest.mark.parametrize("args, pattern", [
    (["-q", "ui", "-p", "x"], r"must not contain '-p'"),
    (["--predictions=x"], r"must not contain '--predictions=x'"),
    (["--audit"], r"audit_mode=True"),
    (["-r", "stdout"], r"raw predictions to stdout"),
    (["-q", "ui", "-f", "m\0"], r"vw_args\[3\] contains a NUL byte"),
    (["--readable_model", "/dev/stdout"], r"must not have --readable_model write to '/dev/stdout'"),
    (["--invert_hash", "//dev//stdout"], r"must not have --invert_hash write to '//dev//stdout'"),
    (["--audit_regressor=/proc/thread-self/fd/1"], r"must not have --audit_regressor write"),
    (["-f", "/proc/4242/fd/1"], r"must not have -f write to '/proc/4242/fd/1'"),
    (["-r", "/tmp/../dev/fd/1"], r"must not have -r write to '/tmp/../dev/fd/1'"),
])
def test_normalize_vw_args_error_messages(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        normalize_vw_args(args)


@pytest.mark.parametrize("args, expected", [
    (["-q", "::"], ["-q", "::"]),
    (["-q::"], ["-q::"]),
    (["--loss_function=logistic"], ["--loss_function=logistic"]),
    (["--loss_function", "logistic", "-b", 24], ["--loss_function", "logistic", "-b", "24"]),
    (["--l2", 1e-06], ["--l2", "1e-06"]),
    (["--l1", -0.5], ["--l1", "-0.5"]),
    (["--l1", "-0.5"], ["--l1", "-0.5"]),
    (["--l1", "-.5"], ["--l1", "-.5"]),
    (["--power_t", 0], ["--power_t", "0"]),
    (["-r", "/tmp/raw.txt"], ["-r", "/tmp/raw.txt"]),
    (["--raw_predictions=/tmp/raw.txt"], ["--raw_predictions=/tmp/raw.txt"]),
    (["-r"], ["-r"]),
    (["-i", "/tmp/model.vw", "-t", "--quiet"], ["-i", "/tmp/model.vw", "-t", "--quiet"]),
    (["--plt", "10", "--top_k", "3"], ["--plt", "10", "--top_k", "3"]),
    (["--audit_regressor", "/tmp/a.txt"], ["--audit_regressor", "/tmp/a.txt"]),
    (["--cb", "4"], ["--cb", "4"]),
    (["-f", "stdout", "--readable_model", "/dev/fd/10"],
     ["-f", "stdout", "--readable_model", "/dev/fd/10"]),
    (["--invert_hash", "/tmp/stdout"], ["--invert_hash", "/tmp/stdout"]),
    (("-q", "ui"), ["-q", "ui"]),
    ([], []),
    ("", []),
    ("-q ui --l2 1e-6", ["-q", "ui", "--l2", "1e-6"]),
    ("-f '/tmp/my model.vw' --quiet", ["-f", "/tmp/my model.vw", "--quiet"]),
    ("--l1 -0.5 -r /tmp/raw.txt", ["--l1", "-0.5", "-r", "/tmp/raw.txt"]),
    (["-i", pathlib.Path("/tmp/my model.vw")], ["-i", "/tmp/my model.vw"]),
    (["--l2", fractions.Fraction(1, 4)], ["--l2", "0.25"]),
    ((token for token in ["-q", "ui"]), ["-q", "ui"]),
])
def test_normalize_vw_args_accepts(args, expected):
    result = normalize_vw_args(args)
    assert result == expected
    assert all(type(token) is str for token in result)


def test_normalize_vw_args_returns_a_new_list():
    args = ["-q", "ui"]
    result = normalize_vw_args(args)
    result.append("--quiet")
    assert args == ["-q", "ui"]


@pytest.mark.parametrize("args", [
    [True],
    ["--l2", False],
    [None],
    [b"-q"],
    [["-q", "ui"]],
    ["-q", object()],
])
def test_normalize_vw_args_rejects_other_types(args):
    with pytest.raises(TypeError, match="vw_args must hold strings, paths or numbers"):
        normalize_vw_args(args)


def test_normalize_vw_args_takes_numpy_numbers_as_numbers():
    """They were refused with a message that asked for numbers."""
    numpy = pytest.importorskip("numpy")
    assert normalize_vw_args(["-b", numpy.int64(24), "--l2", numpy.float64(1e-06)]) == [
        "-b", "24", "--l2", "1e-06"]
    with pytest.raises(TypeError, match="vw_args must hold strings, paths or numbers"):
        normalize_vw_args(["--l2", numpy.bool_(True)])


@pytest.mark.parametrize("args", [b"-q ui", bytearray(b"-q ui"), memoryview(b"-q"),
                                  {"-q": "ui"}, {"-q"}, frozenset(), None, 5,
                                  pathlib.Path("-q")])
def test_normalize_vw_args_rejects_what_is_neither_a_string_nor_a_list(args):
    """``b"-q ui"`` used to give ``['45', '113', ...]`` and a dict its keys."""
    with pytest.raises(TypeError, match="vw_args must be a list of engine arguments or one string"):
        normalize_vw_args(args)


# ------------------------------------------------------------------ build_argv


def test_build_argv_with_predictions():
    assert build_argv(["vw"], ["-q", "ui"], predictions=True, audit=False) == [
        "vw", "-p", "stdout", "--log_output", "stderr", "--driver_output_off", "-q", "ui"]


def test_build_argv_without_predictions():
    argv = build_argv(["vw"], ["-q", "ui"], predictions=False, audit=False)
    assert argv == ["vw", "--log_output", "stderr", "--driver_output_off", "-q", "ui"]
    assert "-p" not in argv


def test_build_argv_audit():
    argv = build_argv(["/usr/bin/vw"], ["-t"], predictions=True, audit=True)
    assert argv == ["/usr/bin/vw", "-p", "stdout", "--log_output", "stderr",
                    "--driver_output_off", "--audit", "-t"]


def test_build_argv_command_prefix_and_user_args_last():
    command = [sys.executable, "/x/engine.py"]
    user = normalize_vw_args("-i model.vw -t --quiet")
    argv = build_argv(command, user, predictions=True, audit=False)
    assert argv[:2] == command
    assert argv[2:4] == ["-p", "stdout"]
    # --quiet would also hide the message of a fatal example error
    assert argv[-5:] == ["--log_level", "error", "-i", "model.vw", "-t"]
    assert "--quiet" not in argv
    assert command == [sys.executable, "/x/engine.py"]  # not modified


@pytest.mark.parametrize("args, expected", [
    (["--quiet"], ["--log_level", "error"]),
    (["--quiet", "--log_level", "warn"], ["--quiet", "--log_level", "warn"]),
    (["--quiet", "--log_level=info"], ["--quiet", "--log_level=info"]),
    (["-t"], ["-t"]),
])
def test_quiet_keeps_fatal_errors_audible(args, expected):
    assert quiet_but_errors(args) == expected


def test_build_argv_does_not_share_the_command_list():
    command = ["vw"]
    argv = build_argv(command, [], predictions=False, audit=False)
    argv.append("--extra")
    assert command == ["vw"]


def test_build_argv_no_user_args():
    assert build_argv(("vw",), (), predictions=True, audit=True) == [
        "vw", "-p", "stdout", "--log_output", "stderr", "--driver_output_off", "--audit"]


# ------------------------------------------------------------------ resolve_engine_command


def _make_executable(path, mode=0o755):
    """A stand-in ``vw`` 9.x: it answers ``--version`` as vw does."""
    path.write_text("#!/bin/sh\necho '9.11.9 (git commit: 1ec9204b0)'\nexit 0\n")
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("vw_command, expected", [
    ("/opt/vw/bin/vw", ["/opt/vw/bin/vw"]),
    ("my vw", ["my vw"]),                                   # a string is one path, not split
    (["docker", "run", "vw"], ["docker", "run", "vw"]),
    (("python3", "-m", "subwabbit.engine"), ["python3", "-m", "subwabbit.engine"]),
])
def test_resolve_engine_command_explicit(monkeypatch, vw_command, expected):
    monkeypatch.setenv(ENGINE_ENV_VAR, "/from/env/vw")
    assert resolve_engine_command(vw_command) == expected


def test_resolve_engine_command_explicit_returns_a_list_copy():
    command = ["vw", "--foo"]
    result = resolve_engine_command(command)
    assert result == command
    assert result is not command


@pytest.mark.parametrize("vw_command", ["", [], ()])
def test_resolve_engine_command_rejects_empty(vw_command):
    with pytest.raises(ValueError, match="vw_command must name an executable"):
        resolve_engine_command(vw_command)


def test_resolve_engine_command_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv(ENGINE_ENV_VAR, "/opt/vw/bin/vw --some 'quoted arg'")
    _make_executable(tmp_path / "vw")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert resolve_engine_command() == ["/opt/vw/bin/vw", "--some", "quoted arg"]
    assert resolve_engine_command(None) == ["/opt/vw/bin/vw", "--some", "quoted arg"]


def test_env_var_name():
    assert ENGINE_ENV_VAR == "SUBWABBIT_VW"


def test_resolve_engine_command_from_path(monkeypatch, tmp_path):
    monkeypatch.delenv(ENGINE_ENV_VAR, raising=False)
    vw = _make_executable(tmp_path / "vw")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert resolve_engine_command() == [str(vw)]


@pytest.mark.parametrize("blank", ["", "   ", "\t"])
def test_resolve_engine_command_blank_env_falls_through_to_path(monkeypatch, tmp_path, blank):
    monkeypatch.setenv(ENGINE_ENV_VAR, blank)
    vw = _make_executable(tmp_path / "vw")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert resolve_engine_command() == [str(vw)]


def test_resolve_engine_command_ignores_non_executable_vw_on_path(monkeypatch, tmp_path):
    monkeypatch.delenv(ENGINE_ENV_VAR, raising=False)
    _make_executable(tmp_path / "vw", mode=0o644)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert resolve_engine_command() == default_engine_command()


def test_resolve_engine_command_default(monkeypatch, tmp_path):
    monkeypatch.delenv(ENGINE_ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no vw
    assert resolve_engine_command() == default_engine_command()


def test_default_engine_command_runs_the_bundled_engine():
    command = default_engine_command()
    assert command[0] == sys.executable
    assert len(command) == 2
    assert os.path.isabs(command[1])
    assert command[1].endswith(os.path.join("subwabbit", "engine", "program.py"))
    assert os.path.isfile(command[1])
    import subwabbit.engine.program
    assert os.path.samefile(command[1], subwabbit.engine.program.__file__)


# ------------------------------------------------------------------ deadlines


@pytest.mark.parametrize("value, expected", [(0, 0.0), (1, 1.0), (0.25, 0.25), (10**6, 1e6),
                                             (LONGEST_WAIT_S * 2, LONGEST_WAIT_S),
                                             (1e300, LONGEST_WAIT_S),
                                             (math.inf, LONGEST_WAIT_S)])
def test_validate_seconds_accepts(value, expected):
    result = validate_seconds(value, "timeout")
    assert result == expected
    assert type(result) is float


def test_validate_seconds_none():
    assert validate_seconds(None, "timeout") is None
    assert validate_seconds(None, "timeout", allow_none=True) is None
    with pytest.raises(ValueError, match="write_cutoff_s must be a number of seconds, not None"):
        validate_seconds(None, "write_cutoff_s", allow_none=False)


@pytest.mark.parametrize("value", [-1, -0.001, -math.inf, math.nan])
def test_validate_seconds_rejects_negative_and_nan(value):
    with pytest.raises(ValueError, match=r"^my_timeout must be a non-negative number"):
        validate_seconds(value, "my_timeout")


@pytest.mark.parametrize("value", [True, False, "1", b"1", [1], object()])
def test_validate_seconds_rejects_bools_and_non_numbers(value):
    with pytest.raises(TypeError, match=r"^my_timeout must be a number of seconds or None"):
        validate_seconds(value, "my_timeout")


def test_deadline_from_timeout_none_is_no_deadline():
    assert deadline_from_timeout(None) is None
    # no limit either, so that io_timeout_s still guards against a stuck engine
    assert deadline_from_timeout(math.inf) is None
    assert deadline_from_timeout(LONGEST_WAIT_S) is None
    assert deadline_from_timeout(LONGEST_WAIT_S / 2) is not None
    assert deadline_from_timeout(None, start=5.0) is None
    assert remaining(None) is None


def test_deadline_from_timeout_zero_is_already_reached():
    before = time.perf_counter()
    deadline = deadline_from_timeout(0)
    after = time.perf_counter()
    assert before <= deadline <= after
    assert remaining(deadline) == 0.0


def test_deadline_from_timeout_with_start():
    assert deadline_from_timeout(2.5, start=100.0) == 102.5
    assert deadline_from_timeout(0, start=100.0) == 100.0
    assert deadline_from_timeout(3, "t", 1.0) == 4.0


def test_deadline_from_timeout_relative_to_now():
    before = time.perf_counter()
    deadline = deadline_from_timeout(60)
    after = time.perf_counter()
    assert before + 60 <= deadline <= after + 60
    assert 59 < remaining(deadline) <= 60


@pytest.mark.parametrize("value, error", [(-1, ValueError), (math.nan, ValueError),
                                          (True, TypeError), ("5", TypeError)])
def test_deadline_from_timeout_rejects_with_parameter_name(value, error):
    with pytest.raises(error, match=r"^timeout "):
        deadline_from_timeout(value)
    with pytest.raises(error, match=r"^startup_timeout_s "):
        deadline_from_timeout(value, "startup_timeout_s")


def test_remaining_past_deadline_is_zero():
    assert remaining(time.perf_counter() - 10) == 0.0


def test_resolve_engine_command_accepts_path_objects(tmp_path):
    import pathlib
    assert resolve_engine_command(pathlib.Path("/opt/vw")) == ["/opt/vw"]
    assert resolve_engine_command([pathlib.Path("/usr/bin/python3"), "-m", "x"]) == [
        "/usr/bin/python3", "-m", "x"]


def test_huge_timeouts_are_value_errors():
    with pytest.raises(ValueError, match="timeout"):
        validate_seconds(10 ** 400, "timeout")


def test_an_infinite_timeout_is_no_milliseconds_mistake(monkeypatch):
    import subwabbit.deadlines as deadlines  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(deadlines, "_warned_about_timeout", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deadlines.warn_if_milliseconds(math.inf)
        assert caught == []
        deadlines.warn_if_milliseconds(10)
        assert len(caught) == 1 and "timeout=0.01 for 10 ms" in str(caught[0].message)

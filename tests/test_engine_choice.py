"""How the engine is chosen and started, with the real engine behind every route."""

import logging
import os
import stat
import subprocess
import sys

import pytest

from subwabbit import VowpalWabbitDummyFormatter, VowpalWabbitProcess, VowpalWabbitStartupError
from subwabbit.command import default_engine_command


def make_vw_shim(directory, marker):
    """An executable called ``vw`` that records its arguments and runs the wheel engine."""
    shim = directory / "vw"
    engine = " ".join(default_engine_command())
    shim.write_text(f'#!/bin/sh\necho "$@" > "{marker}"\nexec {engine} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return shim


def predict_one(**kwargs):
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"], **kwargs) as process:
        assert list(process.predict("|a x", ["|b y"])) == [0.0]
        return process.argv


def test_vw_on_path_is_used(tmp_path, monkeypatch):
    make_vw_shim(tmp_path, tmp_path / "args")
    monkeypatch.delenv("SUBWABBIT_VW", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    argv = predict_one()
    assert argv[0] == str(tmp_path / "vw")
    assert "-p stdout" in (tmp_path / "args").read_text()


def test_environment_variable_beats_path(tmp_path, monkeypatch):
    make_vw_shim(tmp_path, tmp_path / "path-args")
    other = tmp_path / "other"
    other.mkdir()
    shim = make_vw_shim(other, tmp_path / "env-args")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SUBWABBIT_VW", str(shim))
    predict_one()
    assert (tmp_path / "env-args").exists() and not (tmp_path / "path-args").exists()


def test_explicit_command_beats_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SUBWABBIT_VW", "/nonexistent/vw")
    argv = predict_one(vw_command=default_engine_command())
    assert argv[:2] == default_engine_command()


def test_without_vw_the_wheel_engine_is_used(monkeypatch, tmp_path):
    monkeypatch.delenv("SUBWABBIT_VW", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert predict_one()[:2] == default_engine_command()


def test_engine_module_behaves_like_vw(tmp_path):
    data = tmp_path / "in.txt"
    data.write_text("1 |a x\n|a x\n")
    ok = subprocess.run([sys.executable, "-m", "subwabbit.engine", "-p", "stdout", "--quiet"],
                        input=data.read_bytes(), stdout=subprocess.PIPE, check=True, timeout=60)
    assert len(ok.stdout.splitlines()) == 2
    bad = subprocess.run([sys.executable, "-m", "subwabbit.engine", "--bogus"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, check=False)
    assert bad.returncode == 1
    assert b"unrecognised option" in bad.stderr and b"Traceback" not in bad.stderr


def test_engine_module_reads_stdin_redirected_from_a_file(tmp_path):
    data = tmp_path / "in.txt"
    data.write_text("1 |a x\n|a x\n-1 |a y\n")
    with open(data, "rb") as stdin:
        done = subprocess.run([sys.executable, "-m", "subwabbit.engine", "-p", "stdout", "--quiet"],
                              stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 3


def test_engine_module_exits_1_when_an_example_stops_it():
    # A malformed multiclass label ends the wheel's driver early; vw exits 1 then.
    engine = subprocess.Popen([sys.executable, "-m", "subwabbit.engine", "--oaa", "3", "-p",
                               "stdout", "--log_output", "stderr", "--driver_output_off",
                               "--log_level", "error"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    engine.stdin.write(b"1 |f a\nabc |f b\n")
    engine.stdin.flush()
    try:
        engine.wait(timeout=30)  # stdin stays open: the engine stops by itself
    finally:
        engine.kill()
        engine.stdin.close()
    out, err = engine.stdout.read(), engine.stderr.read()
    engine.stdout.close()
    engine.stderr.close()
    assert engine.returncode == 1
    assert b"label" in err and out.splitlines()[0] == b"1"


def _save_into_a_file(driver, tmp_path, name, after):
    """The engine on a line, a save command into ``afile/NAME`` (``afile``
    being a file, not a directory), then the lines ``after``: it must exit 1."""
    (tmp_path / "afile").write_bytes(b"")
    lines = b"1 |a x\nsave_%s/%s|\n%s" % (os.fsencode(tmp_path / "afile"), name, after)
    done = subprocess.run([sys.executable, "-m", "subwabbit.engine", "-p", "stdout", "--quiet"],
                          input=lines, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=dict(os.environ, SUBWABBIT_ENGINE_DRIVER=driver), timeout=60,
                          check=False)
    assert done.returncode == 1, done.stderr
    return done


@pytest.mark.parametrize("driver", ["vw", "loop"])
def test_a_save_command_that_cannot_write_exits_1_as_vw_does(driver, tmp_path):
    # The vw executable prints the error and exits 1; vw's driver in the wheel
    # raised past its parser thread, whose teardown aborted the process.
    done = _save_into_a_file(driver, tmp_path, b"m.vw", b"1 |a y\n|a x\n")
    assert done.stdout == b"0\n"
    assert b"can't open" in done.stderr and b"terminate called" not in done.stderr


@pytest.mark.parametrize("driver", ["vw", "loop"])
def test_an_error_naming_a_path_that_is_not_utf8_is_printed_as_vw_prints_it(driver, tmp_path):
    # vw's message carries the path's bytes, which the bindings could not
    # decode: a UnicodeDecodeError, printed as a traceback with exit code 1
    # (the loop) or ending in SIGABRT (vw's driver).
    done = _save_into_a_file(driver, tmp_path, b"m\xff.vw", b"|a y\n")
    assert done.stdout == b"0\n"
    assert done.stderr.startswith(b"vw: can't open: ") and b"/m\\xff.vw.writing" in done.stderr
    assert b"Traceback" not in done.stderr


def test_write_only_training_that_an_example_stopped_fails_at_close(tmp_path, monkeypatch):
    # An --oaa model loaded with -i whose saved options cannot be read (a file
    # of another format) is taken for a scalar one, whose label strings go as
    # they come; a typo stops vw's driver, which must not pass for success.
    from subwabbit import VowpalWabbitEngineExitedError  # pylint: disable=import-outside-toplevel
    from subwabbit import client  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(client, "saved_options_of", lambda vw_args: [])
    base, out = str(tmp_path / "oaa.vw"), tmp_path / "out.vw"
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--oaa", "3", "--quiet", "-f", base],
                             write_only=True) as trainer:
        trainer.train("|u a", ["|i x", "|i y"], [1, 2])
    trainer = VowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                                  ["-i", base, "--quiet", "-f", str(out)], write_only=True)
    labels = ["1"] * 400 + ["l"] + ["2"] * 400
    trainer.train("|u a", [f"|i x{n}" for n in range(len(labels))], labels)
    # The engine exits 1 if it sees its input still open when it stops, else 0
    # as if its input had ended: either way close() raises.
    with pytest.raises(VowpalWabbitEngineExitedError,
                       match="were not learnt|failed while shutting down") as caught:
        trainer.close()
    assert "Malformed example" in caught.value.stderr_tail


def test_an_engine_that_exits_0_after_an_example_error_fails_at_close(tmp_path):
    # What the wheel's driver does once it holds all its input, whatever the timing.
    fake = tmp_path / "fake_vw.py"
    fake.write_text("import sys\n"
                    "sys.stdin.buffer.read(1)\n"  # the start-up probe arrives: ready
                    "sys.stdout.write('0\\n')\nsys.stdout.flush()\n"
                    "sys.stdin.buffer.read()\n"
                    "sys.stderr.write('[error] vw example #3(x.cc:1): Malformed example\\n')\n")
    from subwabbit import VowpalWabbitEngineExitedError  # pylint: disable=import-outside-toplevel
    trainer = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"], write_only=True,
                                  vw_command=[sys.executable, str(fake)])
    trainer.train("|u a", ["|i x", "|i y", "|i z"], [1, 0, 1])
    with pytest.raises(VowpalWabbitEngineExitedError, match="were not learnt") as caught:
        trainer.close()
    assert caught.value.returncode == 0


def test_engine_that_prints_errors_on_stdout_is_reported(tmp_path):
    """A real vw prints fatal option errors as '[critical]' lines on stdout."""
    fake = tmp_path / "fake_vw.py"
    fake.write_text("import sys\nsys.stdin.readline()\n"
                    "print(\"[critical] vw (main.cc:1): unrecognised option '--x'\")\nsys.exit(1)\n")
    with pytest.raises(VowpalWabbitStartupError, match="unrecognised option") as info:
        VowpalWabbitProcess(VowpalWabbitDummyFormatter(), [],
                            vw_command=[sys.executable, str(fake)])
    assert info.value.returncode == 1


def test_package_imports_without_posix_only_modules():
    """`import subwabbit` must work where fcntl and termios do not exist."""
    code = ("import builtins, sys\n"
            "real = builtins.__import__\n"
            "def fake(name, *args, **kwargs):\n"
            "    if name in ('fcntl', 'termios'):\n"
            "        raise ImportError(name)\n"
            "    return real(name, *args, **kwargs)\n"
            "builtins.__import__ = fake\n"
            "import subwabbit\n"
            "print(subwabbit.VowpalWabbitNonBlockingProcess.__name__)\n")
    result = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "VowpalWabbitNonBlockingProcess" in result.stdout


def test_python_m_subwabbit_engine_runs_without_a_runtime_warning():
    """``python -m subwabbit.engine`` used to warn that the module was already
    imported (``subwabbit`` imported it before runpy ran it)."""
    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "subwabbit.engine",
                           "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert b"RuntimeWarning" not in done.stderr
    assert done.stdout.strip()


@pytest.mark.parametrize("reported", ["8.10.1", "", "garbage"])
def test_an_old_vw_on_path_is_passed_over_with_a_warning(tmp_path, monkeypatch, caplog, reported):
    fake = tmp_path / "vw"
    fake.write_text(f"#!/bin/sh\necho '{reported}'\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SUBWABBIT_VW", raising=False)
    with caplog.at_level(logging.WARNING, logger="subwabbit"):
        with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"]) as model:
            assert model.argv[:2] == default_engine_command()
            assert list(model.predict("|a", ["|b c"])) == [0.0]
    assert any("not a vw 9.x engine" in record.getMessage() for record in caplog.records)


def test_a_vw_9_on_path_is_used(tmp_path, monkeypatch):
    fake = tmp_path / "vw"
    fake.write_text("#!/bin/sh\necho '9.11.9 (git commit: 1ec9204b0)'\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SUBWABBIT_VW", raising=False)
    from subwabbit.command import resolve_engine_command  # pylint: disable=import-outside-toplevel
    assert resolve_engine_command() == [str(fake)]

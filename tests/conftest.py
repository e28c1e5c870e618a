"""Shared fixtures: a real engine, a formatter, and the engine's own answers
for the same lines read from a file (the ground truth every test compares to)."""

import asyncio
import contextlib
import ctypes
import fcntl
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence

import pytest

from subwabbit import (AsyncVowpalWabbitPool, AsyncVowpalWabbitProcess,
                       VowpalWabbitBaseFormatter, VowpalWabbitNonBlockingProcess,
                       VowpalWabbitPool, VowpalWabbitProcess)
from subwabbit.command import default_engine_command

#: The client classes, as ``Client`` names them.
ALL_KINDS = ["blocking", "nonblocking", "asyncio"]


class DictFormatter(VowpalWabbitBaseFormatter):
    """Formats ``{'user': 'u1', 'ctx': ['a', 'b']}`` requests and ``{'id': 7}`` items,
    and records every ``debug_info`` it receives."""

    def __init__(self) -> None:
        self.debug_infos: List[Any] = []

    def format_common_features(self, common_features: Any, debug_info: Any = None) -> str:
        self.debug_infos.append(debug_info)
        return f"|u u{common_features['user']} " + " ".join(common_features.get("ctx", []))

    def format_item_features(self, common_features: Any, item_features: Any,
                             debug_info: Any = None) -> str:
        self.debug_infos.append(debug_info)
        return f"|i i{item_features['id']} c{item_features['id'] % 7}"


@pytest.fixture
def formatter() -> DictFormatter:
    return DictFormatter()


def engine_from_file(lines: Sequence[str], vw_args: Sequence[str], tmp_path: Any) -> List[bytes]:
    """The prediction lines the engine prints when it reads ``lines`` from a file."""
    data = tmp_path / f"input-{len(os.listdir(tmp_path))}.txt"
    data.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    result = subprocess.run(
        default_engine_command() + ["-d", str(data), "-p", "stdout", "--quiet"] + list(vw_args),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True, timeout=120)
    return result.stdout.splitlines()


def expected_scalars(lines: Sequence[str], vw_args: Sequence[str], tmp_path: Any) -> List[float]:
    return [float(line.split()[0]) for line in engine_from_file(lines, vw_args, tmp_path)]


def format_lines(formatter: VowpalWabbitBaseFormatter, common: Any, items: Sequence[Any],
                 labels: Sequence[Any] = ()) -> List[str]:
    common_part = formatter.format_common_features(common)
    labels = list(labels) or [None] * len(items)
    return [formatter.get_formatted_example(common_part,
                                            formatter.format_item_features(common, item),
                                            label=label)
            for item, label in zip(items, labels)]


@pytest.fixture(scope="session")
def trained_model(tmp_path_factory: Any) -> str:
    """A small logistic model with a quadratic interaction, trained from a file
    by the engine itself."""
    directory = tmp_path_factory.mktemp("model")
    formatter = DictFormatter()
    lines = []
    for request in range(60):
        common = {"user": request % 9, "ctx": [f"k{request % 4}"]}
        items = [{"id": (request * 7 + offset) % 50} for offset in range(10)]
        labels = [1 if (item["id"] + request) % 3 == 0 else -1 for item in items]
        lines += format_lines(formatter, common, items, labels)
    data = directory / "train.txt"
    data.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    model = directory / "model.vw"
    subprocess.run(default_engine_command() + ["-d", str(data), "-f", str(model), "--quiet",
                                               "--loss_function", "logistic", "-q", "ui",
                                               "--passes", "1"],
                   check=True, timeout=120, stdout=subprocess.DEVNULL)
    return str(model)


def items(count: int, start: int = 0) -> List[Any]:
    """``count`` items of DictFormatter's shape, ids cycling through 50 from ``start``."""
    return [{"id": (start + index) % 50} for index in range(count)]


def expected_for(formatter: VowpalWabbitBaseFormatter, trained_model: str, tmp_path: Any,
                 common: Any, its: Sequence[Any]) -> List[float]:
    """The engine's predictions for ``its`` under the trained model, read from a file."""
    return expected_scalars(format_lines(formatter, common, its), scoring_args(trained_model),
                            tmp_path)


#: A vw stand-in that answers every example with 0, ignores SIGTERM and does
#: not exit when its input closes (vw answers nothing to an empty line).
STUBBORN_ENGINE = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for line in sys.stdin:
        if line == "\\n":
            continue  # vw answers nothing to an empty line
        sys.stdout.write("0\\n")
        sys.stdout.flush()
    while True:  # input closed: a well-behaved engine would exit now
        time.sleep(1)
""")


def common(user: int) -> Any:
    """The common features of a request of ``user``, with a context token."""
    return {"user": user, "ctx": [f"k{user % 4}"]}


@pytest.fixture(scope="session")
def second_model(trained_model, tmp_path_factory):
    """Another model of the same features that scores differently."""
    directory = tmp_path_factory.mktemp("model2")
    formatter = DictFormatter()
    lines = []
    for request in range(60):
        batch = items(10, request * 3)
        labels = [1 if item["id"] % 2 else -1 for item in batch]
        lines += format_lines(formatter, common(request % 9), batch, labels)
    data = directory / "train.txt"
    data.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    model = directory / "model.vw"
    subprocess.run(default_engine_command() + ["-d", str(data), "-f", str(model), "--quiet",
                                               "--loss_function", "logistic", "-q", "ui"],
                   check=True, timeout=120, stdout=subprocess.DEVNULL)
    return str(model)


@pytest.fixture(scope="session")
def truth(trained_model, second_model, tmp_path_factory):
    """truth[model][user]: the engine's predictions for items(3000) of that user."""
    tmp_path = tmp_path_factory.mktemp("truth")
    formatter = DictFormatter()
    table = {}
    for model in (trained_model, second_model):
        table[model] = {}
        for user in range(6):
            lines = format_lines(formatter, common(user), items(3000))
            table[model][user] = expected_scalars(lines, scoring_args(model), tmp_path)
    return table


#: Arguments that load the trained model for scoring.
def scoring_args(model: str) -> List[str]:
    return ["-i", model, "-t", "--quiet", "--link", "logistic"]


def proc_stat(pid: int) -> Optional[List[str]]:
    """The fields of ``/proc/PID/stat`` after the command name (state first,
    then the parent's pid), or ``None`` once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_gone(pid: int, timeout_s: float = 10.0) -> bool:
    """Wait until ``pid`` has exited (gone, or a zombie); ``False`` after ``timeout_s``."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        stat = proc_stat(pid)
        if stat is None or stat[0] == "Z":
            return True
        time.sleep(0.02)
    return False


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll ``condition`` until it holds; ``False`` after ``timeout_s``."""
    deadline = time.time() + timeout_s
    while not condition():
        if time.time() >= deadline:
            return False
        time.sleep(0.01)
    return True


def children_of_this_process() -> List[int]:
    """Pids of this process's direct children that still exist (zombies included)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = proc_stat(int(entry))
        if fields is not None and int(fields[1]) == os.getpid():
            children.append(int(entry))
    return children


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


PYTHON = sys.executable


class Client:
    """One interface over the client classes, so each test runs on all of
    them: the three processes (``ALL_KINDS``), and the pools (``"pool"``,
    ``"asyncio-pool"``: pass their ``size``), which do not train."""

    _CLASSES = {"blocking": VowpalWabbitProcess, "nonblocking": VowpalWabbitNonBlockingProcess,
                "asyncio": AsyncVowpalWabbitProcess, "pool": VowpalWabbitPool,
                "asyncio-pool": AsyncVowpalWabbitPool}

    def __init__(self, kind, *args, **kwargs):
        self.kind = kind
        self.model = self._CLASSES[kind](*args, **kwargs)
        self.loop = None
        if kind.startswith("asyncio"):
            self.loop = asyncio.new_event_loop()
            self.loop.run_until_complete(self.model.start())

    @property
    def trains(self):
        """Whether the class has ``train`` (a pool refuses it)."""
        return "pool" not in self.kind

    def pids(self):
        """The process ids of the engines."""
        return self.model.engine_pids() if "pool" in self.kind else [self.model.pid]

    def predict(self, *args, **kwargs):
        if self.loop is not None:
            return self.loop.run_until_complete(self.model.predict(*args, **kwargs))
        return list(self.model.predict(*args, **kwargs))

    def restart(self):
        if self.loop is not None:
            return self.loop.run_until_complete(self.model.restart())
        return self.model.restart()

    def train(self, *args, **kwargs):
        if self.loop is not None:
            return self.loop.run_until_complete(self.model.train(*args, **kwargs))
        return self.model.train(*args, **kwargs)

    def reload(self, *args, **kwargs):
        if self.loop is not None:
            return self.loop.run_until_complete(self.model.reload(*args, **kwargs))
        return self.model.reload(*args, **kwargs)

    def close(self):
        if self.loop is not None:
            self.loop.run_until_complete(self.model.close())
            self.loop.close()
        else:
            self.model.close()

    def new_loop_after_fork(self):
        if self.loop is not None:
            # The parent's loop is kept, never collected in the child: closed
            # by the garbage collector, it took its wake-up pipe out of the
            # epoll set it shares with the parent's loop, which then slept
            # through the wake-ups of its executor (a test took 30 s for 0.5).
            _PARENTS_LOOPS.append(self.loop)
            self.loop = asyncio.new_event_loop()


#: the parent's event loops, kept in a forked child (see Client.new_loop_after_fork)
_PARENTS_LOOPS = []


def in_child(body, limit_s=None, fork=os.fork):
    """Run ``body()`` in a forked child; return what it printed as JSON (or its error).

    :param limit_s: whole seconds after which the child is ended (SIGALRM),
        so that a hang fails the test instead of stopping it
    :param fork: the function that forks (:func:`unhooked_fork`: one that
        runs none of Python's at-fork hooks); a child that hangs then
        reports a ``TimeoutError`` rather than being ended
    """
    read_end, write_end = os.pipe()
    pid = fork()
    assert pid >= 0
    if pid == 0:  # the child
        os.close(read_end)
        if limit_s is not None:
            if fork is not os.fork:
                def hung(*_):
                    raise TimeoutError(f"the child hung for {limit_s} s")

                signal.signal(signal.SIGALRM, hung)
            signal.alarm(limit_s)
        try:
            result = {"ok": body()}
        except BaseException as exc:  # pylint: disable=broad-except
            result = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_end, json.dumps(result).encode())
        os.close(write_end)
        os._exit(0)  # pylint: disable=protected-access
    os.close(write_end)
    chunks = []
    while True:
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    return json.loads(b"".join(chunks))


def unhooked_fork():
    """The C library's ``fork()``, which runs none of Python's at-fork hooks
    (as uWSGI forks its workers without ``py-call-uwsgi-fork-hooks``).
    Called through ``PyDLL``, so that it holds the interpreter lock, as the
    forking thread would."""
    return ctypes.PyDLL(None, use_errno=True).fork()


def pytest_configure(config: Any) -> None:
    # Tests that need a long budget pass timeout=5.0 and the like on purpose;
    # the warning that such a timeout may be milliseconds is tested on its own
    # (test_upgrade_from_2x), not printed for each run.
    config.addinivalue_line("filterwarnings", r"ignore:predict\(timeout=:UserWarning")


class CyclesLeft:
    """The subwabbit objects that calls made inside ``with`` left in
    reference cycles (found with ``gc.DEBUG_SAVEALL``): such objects are
    freed only by the garbage collector, whose pauses fall on later calls.
    Read :attr:`names` after the block."""

    def __enter__(self) -> "CyclesLeft":
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        self.names: List[str] = []
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            gc.collect()
            self.names = sorted(type(obj).__qualname__ for obj in gc.garbage
                                if type(obj).__module__.startswith("subwabbit"))
        finally:
            gc.set_debug(0)
            gc.garbage.clear()


def slow_starting_engine(tmp_path: Any, seconds: float) -> "tuple[Any, List[str]]":
    """An engine command that starts ``seconds`` late while a flag file
    exists, then runs the wheel's engine.

    :returns: the flag's path (create it to slow the next starts) and the command
    """
    flag = tmp_path / "slow"
    wrapper = tmp_path / "slow_start.py"
    wrapper.write_text(
        "import os, sys, time\n"
        f"if os.path.exists({str(flag)!r}):\n"
        f"    time.sleep({seconds!r})\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n")
    return flag, [sys.executable, str(wrapper)] + default_engine_command()


class PlantedPipe:
    """A pipe holding answers that are nobody's (:attr:`marker`), put on
    whichever of an engine's stdout and stdin descriptor numbers were freed
    (:attr:`numbers`): were a call to use the numbers of pipes closed under
    it, it would read from or write into this pipe (:attr:`left` tells)."""

    marker = b"0.5\n" * 1000

    def __init__(self) -> None:
        self.numbers: List[int] = []
        self.left = b""


@contextlib.contextmanager
def pipe_on_freed_numbers(engine: Any) -> Iterator[PlantedPipe]:
    """Plant a :class:`PlantedPipe` on ``engine``'s freed descriptor numbers;
    on exit, read what is left in it and close what was planted."""
    planted = PlantedPipe()
    read_end, write_end = (fcntl.fcntl(end, fcntl.F_DUPFD, 100) for end in os.pipe())
    try:
        os.set_blocking(read_end, False)
        os.write(write_end, planted.marker)
        for number, end in ((engine.stdout_fd, read_end), (engine.stdin_fd, write_end)):
            try:
                os.fstat(number)  # still open: the call's, left alone
            except OSError:
                os.dup2(end, number)
                planted.numbers.append(number)
        yield planted
        while True:
            try:
                chunk = os.read(read_end, 1 << 16)
            except BlockingIOError:
                break
            planted.left += chunk
    finally:
        for number in planted.numbers + [read_end, write_end]:
            os.close(number)


class WideItems(DictFormatter):
    """Items of ``features`` features each: with ``--interactions iiii`` about
    30 µs a line at 18 features, 200 to 400 µs at 28, a few ms at 60
    (2 vCPUs)."""

    def __init__(self, features):
        super().__init__()
        self.features = features

    def format_item_features(self, common_features, item_features, debug_info=None):
        return "|i " + " ".join(f"f{item_features['id']}_{k}" for k in range(self.features))


def wide_model(tmp_path, features):
    """Arguments to serve a model of ``--interactions iiii`` over items of
    ``features`` features, trained on a few of them."""
    model = str(tmp_path / "wide.vw")
    with VowpalWabbitProcess(WideItems(features), ["--interactions", "iiii", "-f", model,
                                                   "--quiet"], write_only=True) as trainer:
        trainer.train(common(0), items(40), [1 if k % 3 else -1 for k in range(40)], [None] * 40)
    return ["-i", model, "-t", "--quiet"]


def deadline_calls(predict, calls, known=3000, after_each=None, timeout=0.010):
    """``calls`` calls of ``predict`` (which returns a list) on 3,000 items
    with a deadline of ``timeout`` seconds, each checked against the first
    ``known`` items predicted without one, of which fewer must come back (the
    deadline ended the call): the calls' lengths, and what ``after_each()``
    returned after each (``None`` without it)."""
    truth = {user: predict(common(user), items(known)) for user in range(3)}
    assert len(set(truth[0][:50])) > 10
    lengths, after = [], []
    for call in range(calls):
        got = predict(common(call % 3), items(3000), timeout=timeout)
        assert got == truth[call % 3][:len(got)]
        assert len(got) < known  # the deadline ended the call
        lengths.append(len(got))
        after.append(after_each() if after_each is not None else None)
    return lengths, after


def warnings_of(logger_name):
    """The text of every WARNING (or worse) logged on ``logger_name`` from
    now on, in a list that fills as they come (a handler on the logger: for
    a forked child, where pytest's caplog does not reach)."""
    kept = []

    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                kept.append(record.getMessage())
    logging.getLogger(logger_name).addHandler(Keep())
    return kept

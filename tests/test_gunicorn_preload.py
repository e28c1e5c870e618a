"""A real ``gunicorn --preload`` with two workers, serving a WSGI app whose
:class:`~subwabbit.pool.VowpalWabbitPool` is created at import, in the master
(what docs/serving.rst recommends against but promises to work).

Every answer of every worker must be the engine's own predictions; each
worker must run engines of its own (not the master's, not the other
worker's); a reload in one worker must not change what the other serves; a
worker that exits takes its engines along, and the one forked in its place
serves the master's model; and once gunicorn has shut down no engine of the
app may be left.
"""

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Dict, List

import pytest

from conftest import DictFormatter, common, expected_for, items

gunicorn = pytest.importorskip("gunicorn")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")

APP = textwrap.dedent('''
    """The app gunicorn serves (imported once, in the master, with --preload)."""
    import json
    import os
    import time
    from urllib.parse import parse_qs

    from subwabbit import VowpalWabbitPool

    from conftest import DictFormatter, common, items, scoring_args

    MODEL = os.environ["SW_TEST_MODEL"]
    pool = VowpalWabbitPool(DictFormatter(), scoring_args(MODEL), size=1)
    with open(os.environ["SW_TEST_MASTER"], "w", encoding="utf-8") as handle:
        json.dump({"pid": os.getpid(), "engines": pool.engine_pids()}, handle)


    def app(environ, start_response):
        query = {key: values[0] for key, values in parse_qs(environ["QUERY_STRING"]).items()}
        if environ["PATH_INFO"] == "/reload":
            pool.reload(scoring_args(query["model"]), timeout=30)
            body = {"pid": os.getpid(), "generation": pool.generation}
        else:
            user, count = int(query["user"]), int(query["count"])
            predictions = [float(value) for value in pool.predict(common(user), items(count))]
            time.sleep(float(query.get("hold", 0)))  # so that concurrent requests spread
            body = {"pid": os.getpid(), "engines": pool.engine_pids(),
                    "predictions": predictions}
        data = json.dumps(body).encode()
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(data)))])
        return [data]
''')


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over the Unix socket gunicorn listens on."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(self.unix_path)


def get(path: str, url: str) -> Dict[str, Any]:
    connection = UnixHTTPConnection(path)
    try:
        connection.request("GET", url)
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200, body
        return json.loads(body)
    finally:
        connection.close()


def processes_mentioning(text: str) -> List[int]:
    """Live (not zombie) processes whose command line contains ``text``."""
    marker = text.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def concurrently(path: str, urls: List[str]) -> List[Dict[str, Any]]:
    """Send the requests at once (sync workers take one at a time, so they spread)."""
    answers: List[Any] = [None] * len(urls)
    errors: List[BaseException] = []

    def one(index: int) -> None:
        try:
            answers[index] = get(path, urls[index])
        except BaseException as exc:  # pylint: disable=broad-except
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(index,)) for index in range(len(urls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert not errors, errors
    return answers


def from_both_workers(path: str, count: int, limit_s: float = 60.0) -> List[Dict[str, Any]]:
    """Rounds of concurrent requests until both workers have answered."""
    answers: List[Dict[str, Any]] = []
    deadline = time.monotonic() + limit_s
    while len({answer["pid"] for answer in answers}) < 2:
        assert time.monotonic() < deadline, "one worker answered every request"
        answers += concurrently(path, [f"/score?user={user}&count={count}&hold=0.3"
                                       for user in range(4)])
    return answers


def test_gunicorn_preload_workers_serve_exact_predictions_and_leave_nothing(
        trained_model, second_model, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    served = str(models / "served-by-gunicorn.vw")  # a name only this test's engines carry
    other = str(models / "reloaded-by-gunicorn.vw")
    shutil.copyfile(trained_model, served)
    shutil.copyfile(second_model, other)
    (tmp_path / "app.py").write_text(APP, encoding="utf-8")
    socket_path = str(tmp_path / "gunicorn.sock")
    master_file = str(tmp_path / "master.json")
    count = 40
    formatter = DictFormatter()
    expected = {model: {user: expected_for(formatter, model, tmp_path, common(user), items(count))
                        for user in range(4)} for model in (served, other)}

    environment = dict(os.environ, SW_TEST_MODEL=served, SW_TEST_MASTER=master_file,
                       PYTHONPATH=os.pathsep.join([str(tmp_path), TESTS, ROOT]))
    server = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", "gunicorn", "--preload", "--workers", "2",
         "--worker-class", "sync", "--bind", f"unix:{socket_path}", "--graceful-timeout", "20",
         "--timeout", "60", "app:app"],
        cwd=str(tmp_path), env=environment, stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "gunicorn.log", "wb"))  # pylint: disable=consider-using-with
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(socket_path):
            assert server.poll() is None, (tmp_path / "gunicorn.log").read_text()
            assert time.monotonic() < deadline, "gunicorn did not start"
            time.sleep(0.1)
        with open(master_file, encoding="utf-8") as handle:
            master = json.load(handle)
        assert master["pid"] == server.pid and master["engines"]

        answers = from_both_workers(socket_path, count)
        for index, answer in enumerate(answers):
            assert answer["predictions"] == pytest.approx(expected[served][index % 4], abs=1e-6)
        engines = {}
        for answer in answers:
            engines.setdefault(answer["pid"], set()).update(answer["engines"])
        workers = sorted(engines)
        assert master["pid"] not in workers
        # each worker has engines of its own: not the master's, not the other's
        assert not engines[workers[0]] & engines[workers[1]]
        for pids in engines.values():
            assert pids and not pids & set(master["engines"])
        # the master's engines are left alone (idle, alive)
        assert all(alive(pid) for pid in master["engines"])
        ours = set(processes_mentioning(served))
        assert set(master["engines"]) | engines[workers[0]] | engines[workers[1]] <= ours

        # a reload in the worker that takes it changes only that worker's answers
        reloaded = get(socket_path, f"/reload?model={other}")["pid"]
        answers = from_both_workers(socket_path, count)
        for index, answer in enumerate(answers):
            model = other if answer["pid"] == reloaded else served
            assert answer["predictions"] == pytest.approx(expected[model][index % 4], abs=1e-6)
            if answer["pid"] == reloaded:
                reloaded_engines = set(answer["engines"])

        # a worker that exits (as with --max-requests) takes its engines along;
        # the worker gunicorn forks in its place serves the master's model
        os.kill(reloaded, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while (alive(reloaded) or any(alive(pid) for pid in reloaded_engines)) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(reloaded) and not any(alive(pid) for pid in reloaded_engines)
        assert processes_mentioning(other) == []
        answers = from_both_workers(socket_path, count)
        assert reloaded not in {answer["pid"] for answer in answers}
        for index, answer in enumerate(answers):
            assert answer["predictions"] == pytest.approx(expected[served][index % 4], abs=1e-6)
            assert not set(answer["engines"]) & set(master["engines"])
        assert all(alive(pid) for pid in master["engines"])
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
    log = (tmp_path / "gunicorn.log").read_text(errors="replace")
    assert server.returncode == 0, log
    deadline = time.monotonic() + 15
    while (processes_mentioning(served) or processes_mentioning(other)) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(served) == [] and processes_mentioning(other) == [], log

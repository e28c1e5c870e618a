"""The example service (``examples/fastapi_service``) run by uvicorn on
127.0.0.1: a bounded load over a few keep-alive connections, a model reload in
the middle, and every response checked against the engine for the model that
served it."""

import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time

from subwabbit.command import default_engine_command

from conftest import expected_scalars

HERE = os.path.dirname(os.path.abspath(__file__))
APP_DIR = os.path.join(HERE, os.pardir, "examples", "fastapi_service")
USERS = 8
ITEMS = list(range(400))


def _app_module():
    spec = importlib.util.spec_from_file_location("example_app", os.path.join(APP_DIR, "app.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(formatter, path, tmp_path, flip):
    lines = []
    for user in range(USERS):
        common = formatter.format_common_features({"user": user})
        for item in range(0, 400, 3):
            label = 1 if (item + user + flip) % 2 else -1
            lines.append(f"{label} {common} {formatter.format_item_features(None, item)}")
    data = tmp_path / f"train-{flip}.txt"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    subprocess.run(default_engine_command() + ["-d", str(data), "-f", str(path), "--quiet",
                                               "-q", "ui", "--link", "logistic",
                                               "--loss_function", "logistic"],
                   check=True, timeout=120)


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _post(connection, path, body):
    connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read() or b"null")


def test_the_example_service_serves_and_reloads_with_no_error(tmp_path):
    formatter = _app_module().Formatter()
    models = [tmp_path / "first.vw", tmp_path / "second.vw"]
    for flip, model in enumerate(models):
        _train(formatter, model, tmp_path, flip)
    truth = {}
    for generation, model in enumerate(models):
        for user in range(USERS):
            common = formatter.format_common_features({"user": user})
            lines = [f"{common} {formatter.format_item_features(None, item)}" for item in ITEMS]
            truth[generation, user] = expected_scalars(lines, ["-i", str(model), "-t"], tmp_path)
    assert truth[0, 0] != truth[1, 0]

    port = _free_port()
    env = dict(os.environ, MODEL_PATH=str(models[0]), POOL_SIZE="2")
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port", str(port),
         "--app-dir", APP_DIR, "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert server.poll() is None, server.stdout.read().decode()
                assert time.time() < deadline, "the service did not start"
                time.sleep(0.1)

        errors, seen, counts = [], {0: 0, 1: 0, None: 0}, []
        reloaded = threading.Event()

        def client(index):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                for request in range(400):
                    if time.time() > deadline_load:
                        errors.append("the load did not finish in time")
                        return
                    user = (index + request) % USERS
                    status, body = _post(connection, "/recommend",
                                         {"user": user, "items": ITEMS, "timeout_ms": 20})
                    if status != 200:
                        errors.append((status, body))
                        continue
                    generation = body["model_generation"]
                    seen[generation] += 1
                    scores = body["scores"]
                    counts.append(len(scores))
                    if generation is None:
                        if scores:
                            errors.append("scores without a model")
                        continue
                    if scores != truth[generation, user][:len(scores)]:
                        errors.append(("wrong or mixed", generation, user, len(scores)))
                    if index == 0 and request == 150:
                        status, body = _post(connection, "/reload",
                                             {"model_path": str(models[1])})
                        if status != 200 or body["generation"] != 1:
                            errors.append(("reload", status, body))
                        reloaded.set()
            finally:
                connection.close()

        deadline_load = time.time() + 120
        threads = [threading.Thread(target=client, args=(index,)) for index in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(150)
        assert errors == []
        assert reloaded.is_set()
        assert seen[0] > 0 and seen[1] > 0 and sum(seen.values()) == 1600
        assert sum(counts) > 0.5 * len(ITEMS) * len(counts)

        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        status, body = _post(connection, "/reload", {"model_path": str(tmp_path / "none.vw")})
        assert status == 400 and "did not load" in body["detail"]
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
        connection.close()
        assert "subwabbit_pool_generation 1.0" in text
        assert "subwabbit_call_duration_seconds_bucket" in text
        assert 'subwabbit_predictions_total{method="predict"}' in text
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    # No engine and no fork server outlives the service.
    deadline = time.time() + 10
    while _processes_using(tmp_path) and time.time() < deadline:
        time.sleep(0.1)
    assert _processes_using(tmp_path) == []


def _processes_using(folder):
    """Pids of processes whose command line names a file in ``folder``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if str(folder).encode() in cmdline.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found

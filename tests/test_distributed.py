"""Training on many Dask workers with VW's AllReduce (subwabbit.distributed).

The rendezvous and the tree are tested first on their own, with sockets that
speak vw's side of the spanning-tree protocol; then whole jobs run on
``LocalCluster``s of 2 and 3 workers (threads of this process, and one of
worker processes) with the real engine: exact weights, both of vw's recipes,
and every way a job can fail, each followed by a check that no engine, socket
or port is left and that the next job succeeds.
"""

import errno
import math
import os
import random
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import pytest

from subwabbit import VowpalWabbitDummyFormatter, VowpalWabbitError, VowpalWabbitProcess
from subwabbit.distributed import DistributedTrainingError, Rendezvous, run_job, train
from subwabbit.distributed import job as job_module
from subwabbit.distributed.args import check_user_args, node_args, passes
from subwabbit.distributed.rendezvous import CONTROL_MAGIC, FAILED, encode_message
from subwabbit.distributed.tree import chain_layout, tree_depth, tree_layout

distributed = pytest.importorskip("distributed")

ARGS = ["--quiet", "--loss_function", "logistic", "-q", "ab", "-b", "16"]


# ---------------------------------------------------------------- helpers

def make_calls(count: int, seed: int = 1, per_call: int = 20) -> List[Any]:
    """``train()`` calls of VW text features with a learnable label."""
    rng = random.Random(seed)
    calls = []
    for _ in range(count):
        user = rng.randrange(30)
        items, labels = [], []
        for _ in range(per_call):
            item = rng.randrange(40)
            items.append(f"|a u{user} g{user % 5} |b i{item} c{item % 7}")
            signal_ = math.sin(user) + math.cos(item) + (0.8 if (user % 5) == (item % 7) else -0.4)
            labels.append(1 if rng.random() < 1 / (1 + math.exp(-2 * signal_)) else -1)
        calls.append(("", items, labels))
    return calls


def split(calls: List[Any], count: int) -> List[List[Any]]:
    return [calls[node::count] for node in range(count)]


def model_weights(model: bytes, tmp_path: Any, extra: Optional[List[str]] = None) -> Dict[int, float]:
    """Every non-zero weight of a model file, exactly (as float32 values)."""
    import pylibvw  # pylint: disable=import-outside-toplevel
    path = tmp_path / f"weights-{len(os.listdir(tmp_path))}.vw"
    path.write_bytes(model)
    workspace = pylibvw.vw(["-i", str(path), "-t", "--quiet"] + list(extra or []))
    try:
        return {index: workspace.get_weight(index, 0) for index in range(workspace.num_weights())
                if workspace.get_weight(index, 0) != 0.0}
    finally:
        workspace.finish()


def held_out_loss(model_path: str, calls: List[Any], extra: Optional[List[str]] = None) -> float:
    """Mean logistic loss of a model's raw scores on ``calls``."""
    total = count = 0
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                             ["-i", model_path, "-t", "--quiet"] + list(extra or [])) as model:
        for common, items, labels in calls:
            for score, label in zip(model.predict(common, items), labels):
                total += math.log1p(math.exp(-label * score))
                count += 1
    return total / count


def engines_of_job(unique_id: int) -> List[int]:
    """Pids of processes (engines) started with this job's unique id."""
    marker = f"--unique_id\0{unique_id}\0".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if marker in handle.read():
                    pids.append(int(entry))
        except OSError:
            pass
    return pids


def listening_ports() -> set:
    """TCP ports in the LISTEN state (IPv4) on sockets of this process: the
    rendezvous's. (Another process may listen on a port the rendezvous let go
    of: a worker its nanny restarted took one once.)"""
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            ours.add(target[len("socket:["):-1])
    ports = set()
    with open("/proc/net/tcp", encoding="ascii") as handle:
        next(handle)
        for line in handle:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in ours:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.fixture
def rendezvous_log(monkeypatch):
    """Every Rendezvous that run_job starts, to check what it left behind."""
    started: List[Rendezvous] = []

    class Recorded(Rendezvous):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(job_module, "Rendezvous", Recorded)
    return started


def assert_nothing_left(rendezvous: Rendezvous, wait_s: float = 0.0) -> None:
    """No engine of the job runs, and the rendezvous port is closed."""
    deadline = time.monotonic() + wait_s
    while engines_of_job(rendezvous.unique_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engines_of_job(rendezvous.unique_id) == []
    assert rendezvous.port not in listening_ports()
    assert rendezvous._listener.fileno() == -1  # pylint: disable=protected-access


@pytest.fixture(scope="module")
def cluster3():
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=False,
                                  dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def cluster2():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def calls():
    return make_calls(240)


# ------------------------------------------------------------- the tree

@pytest.mark.parametrize("total", list(range(1, 34)) + [63, 64, 65, 100])
def test_tree_layout_is_one_binary_tree_of_least_depth(total):
    layout = tree_layout(total)
    roots = [node for node, parent in enumerate(layout.parents) if parent is None]
    assert roots == [layout.root]
    for node in range(total):
        kids = [child for child, parent in enumerate(layout.parents) if parent == node]
        assert len(kids) == layout.kid_counts[node] <= 2
        seen, current = set(), node  # every node reaches the root without a cycle
        while current is not None:
            assert current not in seen
            seen.add(current)
            current = layout.parents[current]
    assert tree_depth(layout) == total.bit_length()


def test_tree_layout_refuses_no_nodes():
    with pytest.raises(ValueError):
        tree_layout(0)
    with pytest.raises(ValueError):
        chain_layout(0)


@pytest.mark.parametrize("total", [1, 2, 3, 7])
def test_chain_layout_gives_every_node_one_child_at_most(total):
    layout = chain_layout(total)
    assert max(layout.kid_counts) <= 1
    assert tree_depth(layout) == total
    assert [parent for parent in layout.parents if parent is None] == [None]


# ---------------------------------------------------- the rendezvous alone

class FakeEngine:
    """vw's side of the spanning-tree protocol, on a socket."""

    def __init__(self, rendezvous: Rendezvous, unique_id: int, total: int, node: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", rendezvous.port), timeout=5)
        self.sock.sendall(struct.pack("<QQQ", unique_id, total, node))

    def recv(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def ok(self) -> int:
        return struct.unpack("<i", self.recv(4))[0]

    def tree(self, port: int) -> tuple:
        kids = struct.unpack("<H", self.recv(2))[0]
        self.sock.sendall(struct.pack("!H", port))
        address, parent_port = self.recv(4), self.recv(2)
        return kids, address, parent_port


class FakeTask:
    """A node task's control connection."""

    def __init__(self, rendezvous: Rendezvous, unique_id: int, node: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", rendezvous.port), timeout=5)
        self.sock.sendall(CONTROL_MAGIC + struct.pack("<QQ", unique_id, node))
        self.accepted = self.sock.recv(1) == b"\1"


def test_rendezvous_sends_each_engine_its_place_in_the_tree():
    with Rendezvous(77, 3, supervised=False) as rendezvous:
        engines = [FakeEngine(rendezvous, 77, 3, node) for node in (2, 0, 1)]  # any order
        assert [engine.ok() for engine in engines] == [1, 1, 1]
        answers: Dict[int, tuple] = {}
        threads = [threading.Thread(target=lambda e=engine, n=node: answers.__setitem__(
            n, e.tree(30000 + n))) for engine, node in zip(engines, (2, 0, 1))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(5)
        layout = tree_layout(3)  # one host: positions follow node numbers
        for node in range(3):
            kids, address, port = answers[node]
            assert kids == layout.kid_counts[node]
            parent = layout.parents[node]
            if parent is None:
                assert address + port == b"\xff" * 6
            else:
                assert address == socket.inet_aton("127.0.0.1")
                assert port == struct.pack("!H", 30000 + parent)
        assert rendezvous.finished
        assert all(state.engine_at is not None for state in rendezvous.snapshot())


def test_a_reproducible_chain_follows_the_node_numbers_wherever_the_nodes_run():
    """Which machine runs which node (Dask may place them otherwise from run
    to run) must not change the order of the sums: with the chain laid out
    by the engines' addresses, nodes 0, 1, 2 on 127.0.0.3, .2, .1 were
    summed ((v2 + v1) + v0) instead of ((v0 + v1) + v2) (found by a review)."""
    with Rendezvous(78, 3, supervised=False, reproducible=True) as rendezvous:
        engines = []
        for node, source in ((0, "127.0.0.3"), (1, "127.0.0.2"), (2, "127.0.0.1")):
            engine = FakeEngine.__new__(FakeEngine)
            engine.sock = socket.socket()
            engine.sock.settimeout(5)
            engine.sock.bind((source, 0))
            engine.sock.connect(("127.0.0.1", rendezvous.port))
            engine.sock.sendall(struct.pack("<QQQ", 78, 3, node))
            engines.append(engine)
        assert [engine.ok() for engine in engines] == [1, 1, 1]
        answers: Dict[int, tuple] = {}
        threads = [threading.Thread(target=lambda e=engine, n=node: answers.__setitem__(
            n, e.tree(30000 + n))) for node, engine in enumerate(engines)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(5)
        assert [answers[node][0] for node in range(3)] == [0, 1, 1]
        assert answers[0][2] == struct.pack("!H", 30001)  # node 0's parent is node 1
        assert answers[1][2] == struct.pack("!H", 30002)  # node 1's parent is node 2
        assert answers[2][1] + answers[2][2] == b"\xff" * 6  # node 2 is the root


def test_a_rendezvous_port_in_use_is_named_in_the_error(cluster2, calls, tmp_path):
    """'[Errno 98] Address already in use' said neither which address nor
    that it was the rendezvous'."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"rendezvous cannot listen on 127.0.0.1:{port} "
                                          r"\(Address already in use\): choose another "
                                          "rendezvous_port") as caught:
            train(cluster2, split(calls, 2), VowpalWabbitDummyFormatter(), ARGS,
                  tmp_path / "model.vw", rendezvous_port=port, timeout_s=30)
    assert caught.value.errno == errno.EADDRINUSE
    assert os.listdir(tmp_path) == []


def test_rendezvous_refuses_another_jobs_engine_and_a_second_node_zero():
    with Rendezvous(5, 2, supervised=False) as rendezvous:
        stranger = FakeEngine(rendezvous, 6, 2, 0)
        assert stranger.ok() == 0
        assert rendezvous.failure is None  # another job's engine is no failure of this one
        first = FakeEngine(rendezvous, 5, 2, 0)
        assert first.ok() == 1
        second = FakeEngine(rendezvous, 5, 2, 0)
        assert second.ok() == 0
        deadline = time.monotonic() + 5
        while rendezvous.failure is None and time.monotonic() < deadline:
            rendezvous.wait(0.05)
        assert rendezvous.failure[0] == 0
        assert "connected twice" in rendezvous.failure[1]


def test_supervised_rendezvous_forms_the_tree_only_when_every_shard_was_written():
    with Rendezvous(9, 2) as rendezvous:
        tasks = [FakeTask(rendezvous, 9, node) for node in range(2)]
        assert all(task.accepted for task in tasks)
        engines = [FakeEngine(rendezvous, 9, 2, node) for node in range(2)]
        assert [engine.ok() for engine in engines] == [1, 1]
        tasks[0].sock.sendall(b"F")
        for engine in engines:
            engine.sock.settimeout(0.3)
            with pytest.raises(socket.timeout):  # node 1 has not said its shard is written
                engine.recv(2)
        tasks[1].sock.sendall(b"F")
        kids = [struct.unpack("<H", engine.recv(2))[0] for engine in engines]
        assert sorted(kids) == [0, 1]
        assert [state.fed_at is not None for state in rendezvous.snapshot()] == [True, True]


def test_a_failed_node_aborts_the_others_with_its_words():
    with Rendezvous(11, 3) as rendezvous:
        tasks = [FakeTask(rendezvous, 11, node) for node in range(3)]
        waiting = FakeEngine(rendezvous, 11, 3, 0)
        assert waiting.ok() == 1
        message = "RuntimeError: bad row".encode()
        tasks[1].sock.sendall(b"E" + struct.pack("<I", len(message)) + message)
        for node in (0, 2):
            notice = tasks[node].sock.recv(100)
            assert notice[:1] == b"A" and b"node 1: RuntimeError: bad row" in notice
        with pytest.raises((EOFError, ConnectionError)):  # the waiting engine is let go
            waiting.recv(2)
        assert rendezvous.failure == (1, "RuntimeError: bad row")
        late = FakeTask(rendezvous, 11, 2)
        assert not late.accepted  # node 2 started twice
        for task in tasks:
            task.sock.close()
        assert rendezvous.wait_until_stopped(5) == []


def test_an_engine_lost_after_its_kid_count_fails_the_job_naming_it():
    """The tree is never formed without it, and the failure names the node
    (not "the rendezvous failed"), within the grace period."""
    with Rendezvous(13, 2) as rendezvous:
        tasks = [FakeTask(rendezvous, 13, node) for node in range(2)]
        engines = [FakeEngine(rendezvous, 13, 2, node) for node in range(2)]
        assert [engine.ok() for engine in engines] == [1, 1]
        for task in tasks:
            task.sock.sendall(b"F")
        kids = [struct.unpack("<H", engine.recv(2))[0] for engine in engines]
        parent = kids.index(1)  # the engine with a kid is the other's parent
        engines[parent].sock.close()  # dies before telling its listening port
        engines[1 - parent].sock.sendall(struct.pack("!H", 30000))
        deadline = time.monotonic() + 10
        while rendezvous.failure is None and time.monotonic() < deadline:
            rendezvous.wait(0.05)
        assert rendezvous.failure is not None and rendezvous.failure[0] == parent
        assert rendezvous.tree_formed_at is None
        for task in tasks:
            task.sock.close()


def test_a_failed_job_reports_what_each_node_was_doing_when_it_failed():
    """Not what the abort made of them: a node the abort stopped reports a
    failure of its own a moment later, and the job's error must not depend on
    whether that came before it was raised (it did, now and then, in
    test_a_node_that_never_reaches_the_rendezvous_times_the_job_out)."""
    with Rendezvous(21, 2) as rendezvous:
        tasks = [FakeTask(rendezvous, 21, node) for node in range(2)]
        tasks[1].sock.sendall(b"F")  # node 1 wrote its shard; node 0 is still writing
        deadline = time.monotonic() + 5
        while rendezvous.snapshot()[1].fed_at is None and time.monotonic() < deadline:
            rendezvous.wait(0.01)
        rendezvous.fail(None, "the job did not finish within timeout_s=3")
        tasks[1].sock.sendall(encode_message(FAILED, "stopped: the job was aborted"))
        while rendezvous.snapshot()[1].failure is None and time.monotonic() < deadline:
            rendezvous.wait(0.01)
        assert rendezvous.snapshot()[1].failure is not None  # the abort's report arrived
        error = job_module._job_error(rendezvous)  # pylint: disable=protected-access
        assert error.node_states == [
            "node 0: was writing its shard",
            "node 1: had written its shard; its engine had not reached the rendezvous"]
        for task in tasks:
            task.sock.close()


def formed_tree(rendezvous: Rendezvous, unique_id: int) -> List[FakeTask]:
    """Two fake nodes whose shards were written and whose engines got the tree."""
    tasks = [FakeTask(rendezvous, unique_id, node) for node in range(2)]
    engines = [FakeEngine(rendezvous, unique_id, 2, node) for node in range(2)]
    assert [engine.ok() for engine in engines] == [1, 1]
    for task in tasks:
        task.sock.sendall(b"F")
    threads = [threading.Thread(target=engine.tree, args=(30000 + node,))
               for node, engine in enumerate(engines)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert rendezvous.tree_formed_at is not None
    return tasks


PEER_LOST = ("the vw engine failed while shutting down\nengine exited with code 1\n"
             "engine stderr: vw: recv from parent: Connection reset by peer")


def test_a_node_that_lost_its_peer_does_not_take_the_blame_for_the_peers_death():
    """Once the tree is formed, an engine that dies takes its neighbours'
    engines with it (vw: "recv from parent: Connection reset by peer"); the
    neighbour's report often came first, and the job's error named it, not
    the node whose engine died."""
    with Rendezvous(31, 2) as rendezvous:
        tasks = formed_tree(rendezvous, 31)
        tasks[0].sock.sendall(encode_message(FAILED, PEER_LOST))
        time.sleep(0.2)
        assert rendezvous.failure is None  # it waits for the cause
        tasks[1].sock.sendall(encode_message(FAILED, "the vw engine failed while shutting "
                                             "down\nengine was killed by SIGKILL"))
        deadline = time.monotonic() + 5
        while rendezvous.failure is None and time.monotonic() < deadline:
            rendezvous.wait(0.05)
        assert rendezvous.failure is not None and rendezvous.failure[0] == 1
        assert "SIGKILL" in rendezvous.failure[1]
        states = job_module._job_error(rendezvous).node_states  # pylint: disable=protected-access
        assert states == ["node 0: failed", "node 1: failed"]
        for task in tasks:
            task.sock.close()


def test_a_lost_peer_alone_fails_the_job_within_its_grace():
    """The cause may never report (its worker froze): the node that lost its
    peer then fails the job (via the job's own check of its task too)."""
    with Rendezvous(32, 2) as rendezvous:
        tasks = formed_tree(rendezvous, 32)
        began = time.monotonic()
        rendezvous.fail(0, PEER_LOST)  # as the job does for a task that raised
        while rendezvous.failure is None and time.monotonic() - began < 10:
            rendezvous.wait(0.05)
        assert rendezvous.failure == (0, PEER_LOST)
        assert time.monotonic() - began < 5
        assert tasks[1].sock.recv(1) == b"A"
        for task in tasks:
            task.sock.close()


def test_an_engine_killed_after_the_tree_formed_is_the_node_the_job_names(cluster2,
                                                                          rendezvous_log):
    """A real engine killed while the nodes run their passes over the tree."""
    calls = make_calls(6000)
    killed: List[int] = []

    def kill_node_1_when_the_tree_is_formed():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                rendezvous_log and rendezvous_log[-1].tree_formed_at is not None):
            time.sleep(0.001)
        marker = b"--node\x001\x00"
        for pid in engines_of_job(rendezvous_log[-1].unique_id):
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if marker in handle.read():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

    killer = threading.Thread(target=kill_node_1_when_the_tree_is_formed, daemon=True)
    killer.start()
    began = time.monotonic()
    with pytest.raises(DistributedTrainingError) as caught:
        run_job(cluster2, split(calls, 2), VowpalWabbitDummyFormatter(),
                ARGS + ["--passes", "40", "--holdout_off"], timeout_s=60)
    killer.join(5)
    assert killed, "the job ended before node 1's engine could be killed"
    assert time.monotonic() - began < 20
    assert caught.value.node == 1, str(caught.value)
    assert "SIGKILL" in caught.value.reason
    assert_nothing_left(rendezvous_log[-1], wait_s=5)


def test_a_task_that_vanishes_fails_the_job():
    with Rendezvous(12, 2) as rendezvous:
        tasks = [FakeTask(rendezvous, 12, node) for node in range(2)]
        tasks[0].sock.close()
        deadline = time.monotonic() + 5
        while rendezvous.failure is None and time.monotonic() < deadline:
            rendezvous.wait(0.05)
        assert rendezvous.failure == (0, "its task went away without a word (its worker may "
                                         "have died)")
        assert tasks[1].sock.recv(1) == b"A"


def test_closing_the_rendezvous_tells_running_tasks_to_stop():
    rendezvous = Rendezvous(13, 1)
    task = FakeTask(rendezvous, 13, 0)
    rendezvous.close()
    assert task.sock.recv(1) == b"A"
    assert rendezvous.port not in listening_ports()


# ------------------------------------------------------------ arguments

@pytest.mark.parametrize("option", ["--span_server", "--unique_id", "--total", "--node", "-f",
                                    "--cache_file", "-c", "--readable_model", "--invert_hash"])
def test_options_the_job_sets_are_refused(option):
    with pytest.raises(ValueError, match=option):
        check_user_args(["--quiet", option, "x"])


@pytest.mark.parametrize("option", ["-r", "--raw_predictions",
                                    "--output_feature_regularizer_binary",
                                    "--output_feature_regularizer_text", "--extra_metrics",
                                    "--dump_json_weights_experimental"])
def test_options_that_make_every_node_write_one_file_are_refused(option):
    """Like --readable_model: every node would write the same path (found by
    a review: -r and --extra_metrics left one node's file, the regularizer
    outputs made the job fail after training, the binary one because vw then
    writes no -f model)."""
    with pytest.raises(ValueError, match=option):
        check_user_args(["--quiet", option, "x"])
    with pytest.raises(ValueError, match=option):
        check_user_args(["--quiet", f"{option}=x" if option.startswith("--") else option + "x"])


@pytest.mark.parametrize("option", ["-t", "--testonly"])
def test_test_only_is_refused(option):
    # A job with -t returned a model that had learnt nothing (found by a review).
    with pytest.raises(ValueError, match="learn nothing"):
        check_user_args(["--quiet", option])


@pytest.mark.parametrize("bad,error", [
    (dict(batch_size=0), ValueError), (dict(prediction_type="zzz"), ValueError),
    (dict(formatter=object()), TypeError), (dict(vw_args=ARGS + ["--top", "2"]), ValueError),
    (dict(vw_args=ARGS + ["--oaa", "3"], prediction_type="cb_explore_adf"), ValueError),
    (dict(rendezvous_port=70000), ValueError), (dict(rendezvous_port=-1), ValueError),
    (dict(rendezvous_port=True), TypeError), (dict(rendezvous_port="26600"), TypeError),
    (dict(keep_models=[True]), TypeError), (dict(keep_models=[0.0]), TypeError),
    (dict(keep_models=0), TypeError), (dict(keep_models=[1]), ValueError)],
    ids=["batch_size", "prediction_type", "formatter", "unservable-reduction",
         "prediction_type-contradicting-vw_args", "rendezvous_port-above-65535",
         "rendezvous_port-negative", "rendezvous_port-bool", "rendezvous_port-str",
         "keep_models-bool", "keep_models-float", "keep_models-int", "keep_models-no-such-node"])
def test_arguments_the_nodes_would_refuse_are_refused_before_the_job(bad, error):
    """Not by every node on the cluster, as a DistributedTrainingError (found
    by a review): the client is not even asked for its workers. A rendezvous
    port out of range raised OverflowError("bind(): port must be 0-65535."),
    not the documented ValueError, and True listened on port 1; keep_models
    took [True] as node 1 and [0.0] as node 0, and 0 raised "'int' object is
    not iterable"."""
    arguments = dict(formatter=VowpalWabbitDummyFormatter(), vw_args=ARGS)
    arguments.update(bad)
    options = {name: value for name, value in bad.items()
               if name not in ("formatter", "vw_args")}
    with pytest.raises(error):
        run_job(None, [[]], arguments["formatter"], arguments["vw_args"], timeout_s=10,
                **options)


def test_a_warm_start_with_probabilities_is_left_to_the_nodes_which_read_the_model_file():
    """The class count of a class_probabilities model may be in the file's
    header, which the nodes read, not the driver: the driver's check must
    not ask for --oaa K then, but does without a model file."""
    formatter = VowpalWabbitDummyFormatter()
    for prediction_type in ("multiclass", None):
        job_module._check_node_options(
            formatter, check_user_args(ARGS + ["-i", "warm.vw", "--probabilities"]), 50,
            prediction_type)
        with pytest.raises(ValueError, match="needs its class count"):
            job_module._check_node_options(formatter, check_user_args(ARGS + ["--probabilities"]),
                                           50, prediction_type)


def test_node_args_add_allreduce_a_cache_for_passes_and_predict_only_for_bfgs():
    base = dict(span_server="10.0.0.1", span_server_port=4000, unique_id=3, total=2, node=1,
                model_path="/m.vw", cache_path="/c")
    args = node_args(["-q", "ab"], **base)
    assert args == ["-q", "ab", "--span_server", "10.0.0.1", "--span_server_port", "4000",
                    "--unique_id", "3", "--total", "2", "--node", "1", "-f", "/m.vw"]
    assert args[-2:] == ["-f", "/m.vw"]
    assert node_args(["--passes", "3"], **base)[-3:] == ["--cache_file", "/c", "--kill_cache"]
    assert node_args(["--bfgs", "--passes", "3"], **base)[-1] == "--predict_only_model"
    assert passes(["--passes=4"]) == 4
    with pytest.raises(ValueError, match="--passes"):
        check_user_args(["--passes", "zero"])


def test_nodes_go_to_the_workers_the_scheduler_has_and_none_means_an_error(cluster3,
                                                                           monkeypatch):
    # Asked of the scheduler each time, not read from the client's cached
    # identity, which its periodic refresh can leave listing no worker (as
    # here): every worker, each once per thread.
    monkeypatch.setattr(cluster3, "scheduler_info", lambda *args, **kwargs: {"workers": {}})
    addresses = job_module._spread_over_workers(cluster3, 4)  # pylint: disable=protected-access
    assert len(set(addresses[:3])) == 3 and addresses[3] == addresses[0]
    assert set(addresses) == set(cluster3.nthreads())
    with distributed.LocalCluster(n_workers=0, processes=False,
                                  dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as empty:
        with pytest.raises(ValueError, match="has no worker"):
            run_job(empty, [["|a x"]], VowpalWabbitDummyFormatter(), ARGS, timeout_s=10)


def test_more_shards_than_worker_threads_still_run_at_once(cluster2, calls):
    result = run_job(cluster2, split(calls, 3), VowpalWabbitDummyFormatter(), ARGS,
                     timeout_s=60)
    assert len({report.node for report in result.reports}) == 3


def test_two_jobs_on_the_same_workers_at_once_each_give_their_own_model(cluster2, calls,
                                                                         tmp_path):
    """Two jobs of two nodes at once on two worker threads: both finish (the
    tasks give their threads back), and their engines never mix."""
    results: Dict[str, Any] = {}

    def run(name, job_calls):
        results[name] = run_job(cluster2, split(job_calls, 2), VowpalWabbitDummyFormatter(),
                                ARGS, timeout_s=60)

    threads = [threading.Thread(target=run, args=(name, job_calls))
               for name, job_calls in (("first", calls), ("second", calls[:120]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert set(results) == {"first", "second"}
    # Jobs at once do not mix: each model is what the job gives alone.
    for name, job_calls in (("first", calls), ("second", calls[:120])):
        alone = run_job(cluster2, split(job_calls, 2), VowpalWabbitDummyFormatter(), ARGS)
        assert model_weights(results[name].models[0], tmp_path) == model_weights(
            alone.models[0], tmp_path)


def test_shards_must_be_iterables(cluster2):
    with pytest.raises(TypeError, match="shards"):
        run_job(cluster2, 5, VowpalWabbitDummyFormatter(), ARGS)
    with pytest.raises(TypeError, match=r"shards\[1\]"):
        run_job(cluster2, [[], "text"], VowpalWabbitDummyFormatter(), ARGS)


# ------------------------------------------------------------ exactness

def by_hand(shards: List[List[Any]], vw_args: List[str], tmp_path: Any,
            reproducible: bool = False) -> List[bytes]:
    """The same shards fed to write-only processes by hand, with the same
    AllReduce arguments (and a rendezvous without supervision)."""
    total = len(shards)
    tokens = check_user_args(vw_args)
    with Rendezvous(4242, total, supervised=False, reproducible=reproducible) as rendezvous:
        processes = []
        for node, shard in enumerate(shards):
            args = node_args(tokens, span_server="127.0.0.1", span_server_port=rendezvous.port,
                             unique_id=4242, total=total, node=node,
                             model_path=str(tmp_path / f"hand{node}.vw"),
                             cache_path=str(tmp_path / f"hand{node}.cache"))
            process = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), args, write_only=True)
            processes.append(process)
            for call in shard:
                process.train(*call)
        closing = [threading.Thread(target=process.close) for process in processes]
        for thread in closing:
            thread.start()
        for thread in closing:
            thread.join(60)
    return [(tmp_path / f"hand{node}.vw").read_bytes() for node in range(total)]


def largest_difference(weights: Dict[int, float], other: Dict[int, float]) -> float:
    """The largest difference of two models' weights, relative to the largest weight."""
    return max(abs(weights.get(index, 0.0) - other.get(index, 0.0))
               for index in set(weights) | set(other)) / max(map(abs, weights.values()))


#: How far vw's binary tree leaves the weights of two runs of the same job
#: apart (measured: 1.4e-7 after one pass, 2.9e-7 after three, on three
#: nodes); a line lost or added moves them by 6e-2 or more.
SUM_ORDER_TOLERANCE = 1e-5


@pytest.mark.parametrize("nodes,extra,reproducible", [
    (2, [], False), (3, [], True), (2, ["--passes", "3"], False), (3, ["--passes", "3"], True),
    (3, ["--bfgs", "--passes", "4", "--l2", "1"], True)],
    ids=["2-nodes", "3-nodes", "2-nodes-3-passes", "3-nodes-3-passes", "3-nodes-bfgs"])
def test_every_node_ends_with_the_weights_of_the_same_shards_fed_by_hand(
        cluster3, calls, tmp_path, nodes, extra, reproducible):
    vw_args = ARGS + extra
    shards = split(calls, nodes)
    result = run_job(cluster3, shards, VowpalWabbitDummyFormatter(), vw_args,
                     keep_models=range(nodes), timeout_s=120, reproducible=reproducible)
    load = ["--predict_only_model"] if "--bfgs" in extra else []
    weights = [model_weights(result.models[node], tmp_path, load) for node in range(nodes)]
    assert len(weights[0]) > 100
    assert all(node_weights == weights[0] for node_weights in weights[1:])
    hand = [model_weights(model, tmp_path, load)
            for model in by_hand(shards, vw_args, tmp_path, reproducible)]
    assert all(node_weights == weights[0] for node_weights in hand)
    # The models were averaged: a node alone on its shard learns other weights.
    alone = run_job(cluster3, shards[:1], VowpalWabbitDummyFormatter(), vw_args, timeout_s=120)
    assert largest_difference(model_weights(alone.models[0], tmp_path, load), weights[0]) > 0.01
    assert result.lines == sum(len(call[1]) for call in calls)
    assert [report.lines for report in result.reports] == [
        sum(len(call[1]) for call in shard) for shard in shards]


@pytest.mark.parametrize("extra", [[], ["--passes", "3"]], ids=["1-pass", "3-passes"])
def test_three_nodes_on_vws_tree_agree_with_hand_fed_nodes_but_for_the_order_of_sums(
        cluster3, calls, tmp_path, extra):
    vw_args = ARGS + extra
    shards = split(calls, 3)
    result = run_job(cluster3, shards, VowpalWabbitDummyFormatter(), vw_args,
                     keep_models=range(3), timeout_s=120)
    weights = [model_weights(result.models[node], tmp_path) for node in range(3)]
    assert weights[1] == weights[0] and weights[2] == weights[0]
    hand = model_weights(by_hand(shards, vw_args, tmp_path)[0], tmp_path)
    assert largest_difference(hand, weights[0]) < SUM_ORDER_TOLERANCE
    # The tolerance tells a lost line: one item fewer in one call of node 1.
    common, items, labels = shards[1][5]
    shards[1][5] = (common, items[1:], labels[1:])
    short = model_weights(by_hand(shards, vw_args, tmp_path)[0], tmp_path)
    assert largest_difference(short, weights[0]) > 1000 * SUM_ORDER_TOLERANCE


def test_train_writes_node_0s_model_which_predicts(cluster2, calls, tmp_path):
    path = tmp_path / "model.vw"
    returned = train(cluster2, split(calls, 2), VowpalWabbitDummyFormatter(), ARGS, path,
                     timeout_s=120)
    assert returned == str(path)
    loss = held_out_loss(str(path), make_calls(20, seed=2))
    assert 0 < loss < math.log(2)  # learnt something


def test_a_model_path_that_cannot_be_written_fails_before_the_job(monkeypatch, tmp_path):
    def job_ran(*args, **kwargs):
        raise AssertionError("the job ran before model_path was checked")

    monkeypatch.setattr(job_module, "run_job", job_ran)
    with pytest.raises(FileNotFoundError):
        train(None, [[]], VowpalWabbitDummyFormatter(), ARGS, tmp_path / "missing" / "m.vw")
    assert os.listdir(tmp_path) == []


def test_a_dask_bag_with_one_partition_per_shard_gives_the_same_model(cluster2, calls, tmp_path):
    bag = pytest.importorskip("dask.bag")
    shards = split(calls, 2)
    from_lists = run_job(cluster2, shards, VowpalWabbitDummyFormatter(), ARGS)
    from_bag = run_job(cluster2, bag.from_sequence(shards[0] + shards[1], npartitions=2),
                       VowpalWabbitDummyFormatter(), ARGS)
    assert model_weights(from_bag.models[0], tmp_path) == model_weights(from_lists.models[0],
                                                                        tmp_path)


def test_bfgs_on_two_nodes_reaches_the_loss_of_one_process(cluster2, tmp_path):
    data = make_calls(600, seed=3)
    test = make_calls(100, seed=4)
    vw_args = ARGS + ["--bfgs", "--passes", "30", "--l2", "1", "--holdout_off",
                      "--termination", "0"]
    one = str(tmp_path / "one.vw")  # one plain process, no AllReduce
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), vw_args + [
            "-f", one, "--cache_file", one + ".cache", "-k", "--predict_only_model"],
            write_only=True) as process:
        for call in data:
            process.train(*call)
    two = train(cluster2, split(data, 2), VowpalWabbitDummyFormatter(), vw_args,
                tmp_path / "two.vw")
    one_loss = held_out_loss(one, test, ["--predict_only_model"])
    two_loss = held_out_loss(two, test, ["--predict_only_model"])
    assert abs(two_loss / one_loss - 1) < 0.01, (one_loss, two_loss)


# -------------------------------------------------------------- failures

class RaisingShard:
    def __init__(self, calls: List[Any], at: int) -> None:
        self.calls, self.at = calls, at

    def __iter__(self):
        for index, call in enumerate(self.calls):
            if index == self.at:
                raise RuntimeError(f"bad row {index} in the shard")
            yield call


class EngineKillingShard:
    """Kills its own node's engine (as the OOM killer would) halfway."""

    def __init__(self, calls: List[Any], node: int) -> None:
        self.calls, self.node = calls, node

    def __iter__(self):
        for index, call in enumerate(self.calls):
            if index == len(self.calls) // 2:
                marker = f"--node\0{self.node}\0".encode()
                for entry in os.listdir("/proc"):
                    try:
                        with open(f"/proc/{entry}/cmdline", "rb") as handle:
                            cmdline = handle.read()
                    except OSError:
                        continue
                    if b"--span_server" in cmdline and marker in cmdline and \
                            int(entry) in _children():
                        os.kill(int(entry), signal.SIGKILL)
            yield call


def _children() -> List[int]:
    from conftest import children_of_this_process  # pylint: disable=import-outside-toplevel
    return children_of_this_process()


class StallingShard:
    """Stops after a few calls until released (a source that hangs)."""

    release = threading.Event()

    def __init__(self, calls: List[Any]) -> None:
        self.calls = calls

    def __iter__(self):
        yield from self.calls[:3]
        StallingShard.release.wait(60)
        yield from self.calls[3:]


def test_a_shard_that_raises_fails_the_job_naming_the_node(cluster3, calls, rendezvous_log):
    shards = split(calls, 3)
    shards[1] = RaisingShard(shards[1], at=20)
    began = time.monotonic()
    with pytest.raises(DistributedTrainingError) as caught:
        run_job(cluster3, shards, VowpalWabbitDummyFormatter(), ARGS, timeout_s=60)
    assert time.monotonic() - began < 10
    error = caught.value
    assert isinstance(error, VowpalWabbitError)
    assert error.node == 1
    assert "node 1 failed: RuntimeError: bad row 20 in the shard" in str(error)
    assert error.node_states[1] == "node 1: failed"
    assert isinstance(error.__cause__, DistributedTrainingError)  # the node's own, chained
    assert_nothing_left(rendezvous_log[-1])
    assert run_job(cluster3, split(calls, 3), VowpalWabbitDummyFormatter(), ARGS).lines > 0


def test_an_engine_that_dies_fails_the_job_with_its_exit(cluster3, calls, rendezvous_log):
    shards = split(calls, 3)
    shards[2] = EngineKillingShard(shards[2], node=2)
    began = time.monotonic()
    with pytest.raises(DistributedTrainingError) as caught:
        run_job(cluster3, shards, VowpalWabbitDummyFormatter(), ARGS, timeout_s=60)
    assert time.monotonic() - began < 10
    assert caught.value.node == 2
    assert "node 2 failed" in str(caught.value) and "SIGKILL" in str(caught.value)
    assert_nothing_left(rendezvous_log[-1])
    assert run_job(cluster3, split(calls, 3), VowpalWabbitDummyFormatter(), ARGS).lines > 0


def test_a_node_that_never_reaches_the_rendezvous_times_the_job_out(cluster3, calls,
                                                                      rendezvous_log):
    shards = split(calls, 3)
    shards[0] = StallingShard(shards[0])
    StallingShard.release.clear()
    began = time.monotonic()
    try:
        with pytest.raises(DistributedTrainingError) as caught:
            run_job(cluster3, shards, VowpalWabbitDummyFormatter(), ARGS, timeout_s=3)
        elapsed = time.monotonic() - began
        # Its engine is stopped at once, though its task is still stuck in the shard.
        assert_nothing_left(rendezvous_log[-1])
    finally:
        StallingShard.release.set()
    assert 3 <= elapsed < 6
    error = caught.value
    assert error.node is None
    assert "did not finish within timeout_s=3" in str(error)
    assert error.node_states[0] == "node 0: was writing its shard"
    assert "rendezvous" in error.node_states[1]  # the others waited there
    assert run_job(cluster3, split(calls, 3), VowpalWabbitDummyFormatter(), ARGS).lines > 0


def test_a_client_closed_mid_job_fails_it_with_a_training_error(calls, rendezvous_log):
    """Closing the client while the job runs (its tasks are then cancelled)
    raised distributed's ClosedClientError("Client is closed. Can't send
    cancel-keys message.") from the clean-up, instead of the job's
    DistributedTrainingError."""
    shards: List[Any] = split(calls, 2)
    shards[0] = StallingShard(shards[0])
    StallingShard.release.clear()
    outcome: Dict[str, Any] = {}
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                      dashboard_address="127.0.0.1:0") as cluster, \
                distributed.Client(cluster) as client:

            def run():
                try:
                    run_job(client, shards, VowpalWabbitDummyFormatter(), ARGS, timeout_s=60)
                except BaseException as exc:  # pylint: disable=broad-except
                    outcome["error"] = exc

            thread = threading.Thread(target=run)
            thread.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (
                    rendezvous_log and rendezvous_log[-1].snapshot()[1].engine_at is not None):
                time.sleep(0.05)
            assert rendezvous_log[-1].snapshot()[1].engine_at is not None  # mid-job
            client.close()
            thread.join(30)
            assert not thread.is_alive()
        assert isinstance(outcome.get("error"), DistributedTrainingError), outcome
        assert "cancelled" in str(outcome["error"])
        assert_nothing_left(rendezvous_log[-1])
    finally:
        StallingShard.release.set()


def test_an_unreachable_rendezvous_fails_every_node_at_once(cluster2, calls, monkeypatch):
    class Misaddressed(Rendezvous):  # the nodes are told a port where nothing listens
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            spare = socket.socket()
            spare.bind(("127.0.0.1", 0))
            self.port = spare.getsockname()[1]
            spare.close()

    monkeypatch.setattr(job_module, "Rendezvous", Misaddressed)
    began = time.monotonic()
    with pytest.raises(DistributedTrainingError, match="cannot reach the job's rendezvous"):
        run_job(cluster2, split(calls, 2), VowpalWabbitDummyFormatter(), ARGS, timeout_s=30)
    assert time.monotonic() - began < 10


def test_a_worker_that_dies_fails_the_job_and_its_engine_dies_with_it(calls, rendezvous_log):
    cloudpickle = pytest.importorskip("cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address="127.0.0.1:0") as cluster, \
                distributed.Client(cluster) as client:
            shards: List[Any] = split(calls, 2)
            shards[1] = WorkerKillingShard(shards[1])
            began = time.monotonic()
            with pytest.raises(DistributedTrainingError) as caught:
                run_job(client, shards, VowpalWabbitDummyFormatter(), ARGS, timeout_s=60)
            assert time.monotonic() - began < 10
            assert caught.value.node == 1
            assert "its worker may have died" in str(caught.value)
            assert_nothing_left(rendezvous_log[-1], wait_s=5)  # the orphan got SIGKILL
            client.wait_for_workers(2, timeout=60)  # the nanny restarted the worker
            assert run_job(client, split(calls, 2), VowpalWabbitDummyFormatter(),
                           ARGS).lines > 0
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _run_job_while_stopped(client: Any, calls: Any, timeout_s: float,
                           resume: Callable[[], None]) -> Dict[str, Any]:
    """Run a 2-node job with ``timeout_s`` on a thread of its own, give it
    20 s, then ``resume()`` the workers a test stopped and let it end.

    :returns: the job's ``error`` (if any) and how long it took (``elapsed``,
        missing when the job was still running after 50 s)
    """
    outcome: Dict[str, Any] = {}

    def run():
        began = time.monotonic()
        try:
            run_job(client, split(calls, 2), VowpalWabbitDummyFormatter(), ARGS,
                    timeout_s=timeout_s)
        except BaseException as exc:  # pylint: disable=broad-except
            outcome["error"] = exc
        outcome["elapsed"] = time.monotonic() - began

    thread = threading.Thread(target=run, daemon=True)
    try:
        thread.start()
        thread.join(20)
    finally:
        resume()
    thread.join(30)
    return outcome


def test_a_stopped_worker_cannot_hold_the_job_past_its_timeout(calls, rendezvous_log):
    """Dask's scatter of a shard to a stopped worker (SIGSTOP) never
    returned, and run_job waited in it long past its timeout_s (200 s and
    more with timeout_s=3); the deadline now bounds it and names the node."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as client:
        stuck = sorted(client.nthreads())[1]  # node 1's worker
        pid = client.run(os.getpid, workers=[stuck])[stuck]
        os.kill(pid, signal.SIGSTOP)
        outcome = _run_job_while_stopped(client, calls, 3,
                                         lambda: os.kill(pid, signal.SIGCONT))
        assert "elapsed" in outcome, "run_job was still running 20 s into a 3 s job"
        assert outcome["elapsed"] < 10
        error = outcome["error"]
        assert isinstance(error, DistributedTrainingError), repr(error)
        assert error.node == 1
        assert f"not on its worker {stuck} within timeout_s=3" in str(error)
        assert_nothing_left(rendezvous_log[-1], wait_s=5)


def test_a_worker_stopped_before_its_report_is_gathered_cannot_hold_the_job(
        calls, rendezvous_log, monkeypatch):
    """Every node finished, then node 1's worker was stopped (SIGSTOP)
    before the client gathered the reports: Dask's gather waited for it
    for as long as it stayed stopped, past timeout_s; the deadline now
    bounds it and names the node."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as client:
        pids = client.run(os.getpid)
        supervise = job_module._supervise  # pylint: disable=protected-access
        held: List[int] = []  # the nodes whose reports are on the stopped worker
        stopped: List[int] = []

        def supervise_then_stop(rendezvous, futures, *args, **kwargs):
            supervise(rendezvous, futures, *args, **kwargs)
            # (Dask may have moved node 1's task: stop the worker it ran on)
            who_has = client.who_has(futures)
            stuck = who_has[futures[1].key][0]
            held.extend(node for node, future in enumerate(futures)
                        if stuck in who_has[future.key])
            os.kill(pids[stuck], signal.SIGSTOP)
            stopped.append(pids[stuck])

        monkeypatch.setattr(job_module, "_supervise", supervise_then_stop)

        def resume():
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)

        outcome = _run_job_while_stopped(client, calls, 5, resume)
        assert "elapsed" in outcome, "run_job was still running 20 s into a 5 s job"
        assert outcome["elapsed"] < 10
        error = outcome["error"]
        assert isinstance(error, DistributedTrainingError), repr(error)
        assert error.node == min(held)
        assert "report" in error.reason and "timeout_s=5" in error.reason
        assert_nothing_left(rendezvous_log[-1], wait_s=5)


def test_a_worker_that_dies_holding_a_shard_before_its_node_starts_is_named(calls,
                                                                          rendezvous_log):
    """The only worker holding node 1's scattered shard died before the
    node's task began (both workers' threads were busy): Dask cancelled the
    task, and the job said only "its Dask task was cancelled", as if someone
    had cancelled it; it now says that the shard was lost with its worker."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as client:
        pids = client.run(os.getpid)
        holder = sorted(pids)[1]  # node 1's worker
        busy = [client.submit(time.sleep, 20, workers=[address], pure=False)
                for address in sorted(pids)]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(client.processing().get(address)
                                                      for address in pids):
            time.sleep(0.05)
        assert all(client.processing().get(address) for address in pids)
        outcome: Dict[str, Any] = {}

        def run():
            try:
                run_job(client, split(calls, 2), VowpalWabbitDummyFormatter(), ARGS,
                        timeout_s=60)
            except BaseException as exc:  # pylint: disable=broad-except
                outcome["error"] = exc
            outcome["ended"] = time.monotonic()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
                key.startswith("subwabbit-node-1-")
                for key in client.processing().get(holder, ())):
            time.sleep(0.05)
        assert any(holder in who for key, who in client.who_has().items()
                   if key.startswith("list-")), "node 1's shard is not on its worker"
        killed_at = time.monotonic()
        os.kill(pids[holder], signal.SIGKILL)
        thread.join(30)
        assert "ended" in outcome
        assert outcome["ended"] - killed_at < 10  # not at timeout_s
        error = outcome["error"]
        assert isinstance(error, DistributedTrainingError), repr(error)
        assert error.node == 1
        assert "its shard was lost before its task ran" in error.reason, error.reason
        assert_nothing_left(rendezvous_log[-1], wait_s=5)
        del busy


class WorkerKillingShard:
    """Kills the worker process that iterates it (as the OOM killer would)."""

    def __init__(self, calls: List[Any]) -> None:
        self.calls = calls

    def __iter__(self):
        for index, call in enumerate(self.calls):
            if index == 10:
                os.kill(os.getpid(), signal.SIGKILL)
            yield call


def test_a_warm_start_from_a_bandit_model_file_trains_with_prediction_type(cluster2, tmp_path):
    """A ``-i`` model file carries its reductions: ``prediction_type=`` tells
    the nodes to lay out multi-line examples (shared line, one line per
    action, an empty line), and the model they make serves as a bandit."""
    from subwabbit import VowpalWabbitNonBlockingProcess, VowpalWabbitProcess

    formatter = VowpalWabbitDummyFormatter()
    actions = [f"|a x{index}" for index in range(4)]

    def example(user, shown):
        labels = [(float(user % 2 != shown % 2), 0.25) if position == shown else None
                  for position in range(4)]
        return (f"|u u{user % 3}", actions, labels)

    start = str(tmp_path / "start.vw")
    with VowpalWabbitProcess(formatter, ["--cb_explore_adf", "--quiet", "-f", start],
                             write_only=True) as trainer:
        for user in range(20):
            trainer.train(*example(user, user % 4))
    shards = [[example(user, (user * 3) % 4) for user in range(node, 80, 2)]
              for node in range(2)]
    model = str(tmp_path / "model.vw")
    train(cluster2, shards, formatter, ["-i", start, "--quiet"], model, timeout_s=120,
          prediction_type="cb_explore_adf")
    with VowpalWabbitNonBlockingProcess(formatter, ["-i", model, "-t", "--quiet"],
                                        prediction_type="cb_explore_adf") as served:
        probabilities = list(served.predict("|u u1", actions))
    assert len(probabilities) == 4 and abs(sum(probabilities) - 1.0) < 1e-3


def test_nodes_without_holdout_examples_fail_saying_why_there_is_no_model(cluster2,
                                                                         rendezvous_log):
    """With --passes, vw writes the model at a pass that improves the holdout
    loss; over AllReduce a node without holdout examples counts as an
    infinite loss, so with none on any node no model is written. The job
    failed with "FileNotFoundError: [Errno 2] No such file or directory:
    '/tmp/subwabbit-node0-.../model.vw'"."""
    shards = split(make_calls(4, per_call=3), 2)  # 6 examples a node: none held out
    with pytest.raises(DistributedTrainingError) as caught:
        run_job(cluster2, shards, VowpalWabbitDummyFormatter(), ARGS + ["--passes", "3"],
                timeout_s=60)
    assert caught.value.node == 0
    assert caught.value.reason.startswith("its engine finished without an error but wrote "
                                          "no model")
    assert "--holdout_off" in caught.value.reason
    assert_nothing_left(rendezvous_log[-1])
    result = run_job(cluster2, shards, VowpalWabbitDummyFormatter(),
                     ARGS + ["--passes", "3", "--holdout_off"], timeout_s=60)
    assert result.lines == 12 and result.models[0]


@pytest.mark.parametrize("learner", [["--ftrl"], ["--ksvm"]], ids=["ftrl", "ksvm"])
def test_a_learner_that_never_averages_fails_the_job_instead_of_writing_one_nodes_model(
        cluster2, calls, tmp_path, rendezvous_log, learner):
    """vw's FTRL (and --coin, --pistol, --OjaNewton, --svrg, --ksvm) never
    sums over AllReduce: each engine learnt its own shard, exited without
    coming to the rendezvous, and the job ended with a bare AssertionError
    (under python -O it would have written node 0's model of half the data)."""
    with pytest.raises(DistributedTrainingError, match="none ever reached the rendezvous") as caught:
        train(cluster2, split(calls, 2), VowpalWabbitDummyFormatter(), ARGS + learner,
              tmp_path / "model.vw", timeout_s=60)
    assert caught.value.node is None
    assert "does not average over AllReduce" in caught.value.reason
    assert os.listdir(tmp_path) == []
    assert_nothing_left(rendezvous_log[-1])


def test_a_model_path_that_is_a_directory_fails_before_the_job(monkeypatch, tmp_path):
    def job_ran(*args, **kwargs):
        raise AssertionError("the job ran before model_path was checked")

    monkeypatch.setattr(job_module, "run_job", job_ran)
    with pytest.raises(IsADirectoryError):
        train(None, [[]], VowpalWabbitDummyFormatter(), ARGS, tmp_path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("host", ["192.0.2.1", "::1"])
def test_a_rendezvous_host_it_cannot_listen_on_is_named_with_the_right_hint(host):
    """An address not on this machine (or not IPv4) said "choose another
    rendezvous_port", which would not help (found by a review)."""
    with pytest.raises(OSError, match=r"rendezvous cannot listen on .*: give a "
                                      "rendezvous_host that is an IPv4 address"):
        Rendezvous(5, 2, host=host, supervised=False)

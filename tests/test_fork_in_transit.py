"""A fork while engines are in transit: started on a thread (a reload's new
engines, a replacement, a fork server's fork), or closed by one (a reload's
old engines). No client or pool lists them then, yet a forked child must
hold none of their pipes: a child that keeps an engine's input open keeps
the engine running after its parent closed it (until SIGTERM), and one that
holds its output could read the parent's predictions.

Each test pauses a real start or close at a hook, forks with real
``os.fork()`` while it is paused, and compares the child's descriptors with
the engines' pipes (``/proc/PID/fd``).
"""

import asyncio
import os
import signal
import threading
import time

import pytest

from subwabbit import AsyncVowpalWabbitPool, VowpalWabbitPool, VowpalWabbitProcess
from subwabbit import engine_group, pool as pool_module, process_model
from subwabbit.fork_server import ForkServer, can_share_weights
from subwabbit.command import build_argv, default_engine_command, normalize_vw_args

from conftest import DictFormatter, common, in_child, items, scoring_args

#: How long a paused start or close waits to be let go (never reached)
PAUSE_LIMIT_S = 60


def pipes_of(pids):
    """What fds 0, 1 and 2 of each process are (``pipe:[inode]``)."""
    links = set()
    for pid in pids:
        for fd in (0, 1, 2):
            links.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    assert all(link.startswith("pipe:") for link in links), links
    return links


def held_by_a_child(links):
    """Which of ``links`` a child forked now holds."""
    def child():
        held = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                link = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if link in links:
                held.append(link)
        return sorted(held)

    result = in_child(child, limit_s=30)
    assert "ok" in result, result
    return result["ok"]


class Pause:
    """Pauses a thread at a hook until the test lets it go."""

    def __init__(self):
        self.reached = threading.Event()
        self.go_on = threading.Event()
        self.seen = []

    def here(self, *seen):
        self.seen.extend(seen)
        self.reached.set()
        self.go_on.wait(PAUSE_LIMIT_S)

    def wait(self):
        assert self.reached.wait(PAUSE_LIMIT_S)


def pausing_group_start(pause):
    """An ``EngineGroup.start`` that pauses with the new engines' (and their
    fork server's) pids once they run."""
    real_start = engine_group.EngineGroup.start

    def paused_start(group, count):
        engines = real_start(group, count)
        server = [group.server.pid] if group.server is not None else []
        pause.here(*[engine.pid for engine in engines], *server)
        return engines

    return paused_start


def held_while_paused(pause, target, *args):
    """Run ``target(*args)`` on a thread; once it reaches ``pause``, which of
    the pipes of the processes it paused with a child forked then holds."""
    thread = threading.Thread(target=target, args=args)
    thread.start()
    try:
        pause.wait()
        return held_by_a_child(pipes_of(pause.seen))
    finally:
        pause.go_on.set()
        thread.join(PAUSE_LIMIT_S)


def test_a_reloads_new_engines_starting_on_a_thread(trained_model, monkeypatch):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        pause = Pause()
        paused_start = pausing_group_start(pause)
        monkeypatch.setattr(engine_group.EngineGroup, "start", paused_start)
        assert held_while_paused(pause, pool.reload, scoring_args(trained_model)) == []
        assert set(pool.engine_pids()) <= set(pause.seen)


def test_a_replacement_starting_on_a_thread_and_the_pool_closes_at_once(trained_model,
                                                                         monkeypatch):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        pause = Pause()
        real_add = engine_group.EngineGroup.add_one

        def paused_add(group):
            engine = real_add(group)
            pause.here(engine.pid)
            return engine

        monkeypatch.setattr(engine_group.EngineGroup, "add_one", paused_add)
        victim = pool.engine_pids()[0]
        os.kill(victim, signal.SIGKILL)
        pool.predict(common(1), items(3000), timeout=1.0)  # finds it dead: replaces it
        pause.wait()
        # A child that lives on while the parent closes its pool.
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)  # pylint: disable=protected-access
        try:
            pause.go_on.set()
            deadline = time.monotonic() + PAUSE_LIMIT_S
            while pause.seen[0] not in pool.engine_pids() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert pause.seen[0] in pool.engine_pids()
            began = time.perf_counter()
            pool.close(timeout=10.0)
            # The engines see EOF at once, not SIGTERM 9 s later.
            assert time.perf_counter() - began < 5.0
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_a_reloads_old_engines_closing_on_a_thread(trained_model, monkeypatch):
    with VowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2) as pool:
        old = pool.engine_pids()
        pause = Pause()
        real_retire = pool_module._retire_all  # pylint: disable=protected-access

        def paused_retire(engines, timeout):
            pause.here()
            real_retire(engines, timeout)

        monkeypatch.setattr(pool_module, "_retire_all", paused_retire)
        pool.reload(scoring_args(trained_model))
        try:
            pause.wait()
            links = pipes_of(old)
            held = held_by_a_child(links)
        finally:
            pause.go_on.set()
        assert held == []


def test_a_single_process_reloads_new_engine(trained_model, monkeypatch):
    with VowpalWabbitProcess(DictFormatter(), scoring_args(trained_model)) as model:
        pause = Pause()
        model_class = process_model.VowpalWabbitProcessModel
        real_start = model_class._start_engine  # pylint: disable=protected-access

        def paused_start(self, *args, **kwargs):
            engine = real_start(self, *args, **kwargs)
            pause.here(engine.pid)
            return engine

        monkeypatch.setattr(model_class, "_start_engine", paused_start)
        assert held_while_paused(pause, model.reload, scoring_args(trained_model)) == []
        assert model.pid == pause.seen[0]


def test_an_asyncio_pools_reload_starting_on_the_executor(trained_model, monkeypatch):
    pause = Pause()
    paused_start = pausing_group_start(pause)
    async def main():
        async with AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model),
                                         size=2) as pool:
            await pool.predict(common(1), items(10))
            monkeypatch.setattr(engine_group.EngineGroup, "start", paused_start)
            reload = asyncio.ensure_future(pool.reload(scoring_args(trained_model)))
            try:
                await asyncio.get_running_loop().run_in_executor(None, pause.wait)
                held = held_by_a_child(pipes_of(pause.seen))
            finally:
                pause.go_on.set()
                await reload
            return held

    assert asyncio.run(main()) == []


@pytest.mark.skipif(not can_share_weights(default_engine_command()),
                    reason="the engine has no fork server")
def test_an_engine_a_fork_server_is_forking(trained_model):
    argv = build_argv(default_engine_command(), normalize_vw_args(scoring_args(trained_model)),
                      predictions=True, audit=False)
    server = ForkServer(argv, 30.0)
    pause = Pause()

    class PausedReplies:  # the server's answer arrived; the engine is not made yet
        def __init__(self, replies):
            self.replies = replies

        def get(self, timeout=None):
            reply = self.replies.get(timeout=timeout)
            pause.here(int(reply.split()[1]))
            return reply

        def put(self, item):
            self.replies.put(item)

    server._replies = PausedReplies(server._replies)  # pylint: disable=protected-access
    forked = []
    fork = threading.Thread(target=lambda: forked.append(server.fork_engine(30.0)))
    fork.start()
    try:
        pause.wait()
        links = pipes_of(pause.seen + [server.pid])
        sock = server._sock  # pylint: disable=protected-access
        links.add(os.readlink(f"/proc/self/fd/{sock.fileno()}"))
        held = held_by_a_child(links)
    finally:
        pause.go_on.set()
        fork.join(PAUSE_LIMIT_S)
        for engine in forked:
            engine.close(5.0)
        server.close(5.0)
    assert held == []
    assert [engine.pid for engine in forked] == pause.seen

"""close() while an engine of the object is starting (a reload's, a restart
within a call, a background replacement): that engine does not outlive
close(), and the calls waiting for it are told that the object was closed.
The same for the pools (a reload's engines, a replacement of a dead one)."""

import asyncio
import contextlib
import os
import signal
import threading
import time

import pytest

from subwabbit import (AsyncVowpalWabbitPool, AsyncVowpalWabbitProcess, VowpalWabbitError,
                       VowpalWabbitNonBlockingProcess, VowpalWabbitPool, VowpalWabbitProcess,
                       VowpalWabbitStartupError)

from conftest import (DictFormatter, children_of_this_process, common, items, proc_stat,
                      slow_starting_engine, wait_until)

SYNC = {"blocking": VowpalWabbitProcess, "nonblocking": VowpalWabbitNonBlockingProcess}

#: How late the engines start once the flag is set: far longer than any close() here.
SLOW_START_S = 20.0


def new_children(known):
    """This process's children that are not in ``known`` (zombies included)."""
    return [pid for pid in children_of_this_process() if pid not in known]


def in_thread(body, outcome):
    """Run ``body()`` on a thread; ``outcome`` receives its result or its error."""
    def run():
        try:
            outcome["result"] = body()
        except Exception as exc:  # pylint: disable=broad-except
            outcome["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def assert_told_closed(outcome):
    error = outcome.get("error")
    assert isinstance(error, VowpalWabbitError), outcome
    assert not isinstance(error, VowpalWabbitStartupError), repr(error)
    assert "closed" in str(error) and error.returncode is None, str(error)


def close_and_check(model, starting, timeout=2.0):
    """close() within its timeout leaves none of ``starting`` (pids) behind,
    not even as a zombie."""
    began = time.perf_counter()
    model.close(timeout)
    assert time.perf_counter() - began < timeout + 0.5
    assert [pid for pid in starting if proc_stat(pid) is not None] == []


def close_while(model, body, known, count=1, settle_s=0.0):
    """Run ``body()`` (a reload, or a call that restarts the engine) on a
    thread; once ``count`` new children of this process (not in ``known``)
    exist, and ``settle_s`` later, close ``model`` (:func:`close_and_check`)
    and check that ``body`` was told that it was closed."""
    outcome = {}
    thread = in_thread(body, outcome)
    assert wait_until(lambda: len(new_children(known)) >= count, 10.0)
    time.sleep(settle_s)
    close_and_check(model, new_children(known))
    thread.join(10.0)
    assert_told_closed(outcome)


async def close_and_check_async(model, starting, task, timeout=2.0):
    """:func:`close_and_check` for the asyncio classes; then ``task``, the
    reload or restart that was starting them, is told that the object was
    closed."""
    began = time.perf_counter()
    await model.close(timeout)
    assert time.perf_counter() - began < timeout + 0.5
    assert [pid for pid in starting if proc_stat(pid) is not None] == []
    outcome = {}
    try:
        await asyncio.wait_for(task, 10.0)
    except Exception as exc:  # pylint: disable=broad-except
        outcome["error"] = exc
    assert_told_closed(outcome)


@pytest.mark.parametrize("kind", sorted(SYNC))
def test_close_stops_the_engine_a_reload_is_starting(kind, tmp_path):
    flag, command = slow_starting_engine(tmp_path, SLOW_START_S)
    model = SYNC[kind](DictFormatter(), ["--quiet"], vw_command=command)
    known = children_of_this_process()
    flag.touch()
    close_while(model, lambda: model.reload(["--quiet"]), known)


def test_close_stops_the_engine_a_call_is_restarting(tmp_path):
    flag, command = slow_starting_engine(tmp_path, SLOW_START_S)
    model = VowpalWabbitProcess(DictFormatter(), ["--quiet"], vw_command=command,
                                restart_on_crash=True)
    os.kill(model.pid, signal.SIGKILL)
    with pytest.raises(VowpalWabbitError):
        list(model.predict(common(1), items(5)))
    known = children_of_this_process()
    flag.touch()
    close_while(model, lambda: list(model.predict(common(1), items(5))), known)


def test_a_call_waiting_for_a_replacement_that_close_stops_is_told_closed(tmp_path):
    flag, command = slow_starting_engine(tmp_path, SLOW_START_S)
    model = VowpalWabbitNonBlockingProcess(DictFormatter(), ["--quiet"], vw_command=command,
                                           restart_on_crash=True)
    flag.touch()
    known = children_of_this_process()
    os.kill(model.pid, signal.SIGKILL)
    with pytest.raises(VowpalWabbitError):  # the failure starts the replacement
        list(model.predict(common(1), items(5)))
    # (0.2 s: the call waits for the replacement)
    close_while(model, lambda: list(model.predict(common(1), items(5))), known, settle_s=0.2)


def test_close_stops_the_engines_a_pool_reload_is_starting(tmp_path):
    flag, command = slow_starting_engine(tmp_path, SLOW_START_S)
    pool = VowpalWabbitPool(DictFormatter(), ["--quiet"], size=2, vw_command=command)
    known = children_of_this_process()
    flag.touch()
    close_while(pool, lambda: pool.reload(["--quiet"]), known, count=2)


def test_close_stops_the_engine_replacing_a_dead_one_in_a_pool(tmp_path):
    flag, command = slow_starting_engine(tmp_path, SLOW_START_S)
    pool = VowpalWabbitPool(DictFormatter(), ["--quiet"], size=2, vw_command=command)
    flag.touch()
    known = children_of_this_process()
    os.kill(pool.engine_pids()[0], signal.SIGKILL)
    pool.predict(common(1), items(5), timeout=1.0)  # finds it dead: a replacement starts
    assert wait_until(lambda: [pid for pid in new_children(known)
                               if (proc_stat(pid) or ["Z"])[0] != "Z"], 10.0)
    close_and_check(pool, new_children(known))


def test_close_stops_the_fork_server_a_pool_reload_is_starting():
    """With the wheel's engine the reload's engines are forked from a new
    server that loads the model first; one that never says it is ready
    (stopped) is killed by close(), and the reload raises 'closed' (it waited
    for the start-up timeout)."""
    pool = VowpalWabbitPool(DictFormatter(), ["--quiet"], size=2, startup_timeout_s=60)
    known = children_of_this_process()  # its fork server among them
    outcome = {}
    thread = in_thread(lambda: pool.reload(["--quiet"]), outcome)
    assert wait_until(lambda: new_children(known), 10.0)
    server = new_children(known)
    try:
        for pid in server:
            os.kill(pid, signal.SIGSTOP)
        close_and_check(pool, server)
    finally:  # (never left stopped)
        for pid in server:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    thread.join(10.0)
    assert_told_closed(outcome)


def test_close_stops_the_engines_an_asyncio_pool_reload_is_starting(tmp_path):
    flag, command = slow_starting_engine(tmp_path, SLOW_START_S)

    async def main():
        pool = AsyncVowpalWabbitPool(DictFormatter(), ["--quiet"], size=2, vw_command=command)
        await pool.start()
        known = children_of_this_process()
        flag.touch()
        reloading = asyncio.ensure_future(pool.reload(["--quiet"]))
        while len(new_children(known)) < 2:
            await asyncio.sleep(0.01)
        await close_and_check_async(pool, new_children(known), reloading)

    asyncio.run(asyncio.wait_for(main(), 30.0))


@pytest.mark.parametrize("how", ["reload", "restart"])
def test_close_stops_the_engine_an_asyncio_process_is_starting(tmp_path, how):
    flag, command = slow_starting_engine(tmp_path, SLOW_START_S)

    async def main():
        model = AsyncVowpalWabbitProcess(DictFormatter(), ["--quiet"], vw_command=command)
        await model.start()
        known = children_of_this_process() + [model.pid]
        flag.touch()
        starting = asyncio.ensure_future(model.reload(["--quiet"]) if how == "reload"
                                         else model.restart())
        while not [pid for pid in new_children(known)
                   if (proc_stat(pid) or ["Z"])[0] != "Z"]:
            await asyncio.sleep(0.01)
        await close_and_check_async(model, new_children(known), starting)

    asyncio.run(asyncio.wait_for(main(), 30.0))

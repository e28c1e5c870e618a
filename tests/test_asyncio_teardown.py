"""The asyncio classes when closing and reloading go wrong: a ``close()`` or a
``reload()`` that is cancelled, and a fork server that stops answering. On
real event loops, with real engines, ``SIGSTOP`` and task cancellation.

What must hold: the loop is never blocked for long (never forever), every
engine and fork server the object started is stopped, and a cancelled call
is cancelled (it does not take effect anyway)."""

import asyncio
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

from subwabbit import AsyncVowpalWabbitPool, AsyncVowpalWabbitProcess, VowpalWabbitError
from subwabbit.command import default_engine_command

from conftest import (DictFormatter, children_of_this_process, common, items, proc_stat,
                      process_gone, scoring_args, slow_starting_engine, wait_until)

#: How long a loop may go without a turn before it counts as blocked: far
#: above a turn's cost, far below a stuck fork server's "forever".
BLOCKED_S = 0.25


def run_with_limit(main, limit_s: float):
    """Run ``main()`` on a loop of its own thread; ``(True, None)`` if the
    loop has not ended after ``limit_s`` (it is left to its daemon thread)."""
    result = {}

    def body():
        try:
            result["value"] = asyncio.run(main())
        except BaseException as exc:  # pylint: disable=broad-except
            result["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        return True, None
    if "error" in result:
        raise result["error"]
    return False, result["value"]


class LoopGaps:
    """A task that notes the longest time the loop went without a turn."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    async def stop(self) -> float:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.longest


@pytest.mark.parametrize("how", ["pool closed", "reload cancelled"])
def test_a_reload_whose_fork_server_is_stopped_never_blocks_the_loop(trained_model, second_model,
                                                                     how):
    """The new model's engines have started when its fork server stops
    (SIGSTOP) and the reload is abandoned, because the pool was closed or
    the reload cancelled. Its engines are killed, and the server cannot reap
    them: waiting for that on the loop blocked it for good."""
    stopped = []

    async def main():
        loop = asyncio.get_running_loop()
        pool = AsyncVowpalWabbitPool(DictFormatter(), scoring_args(trained_model), size=2)
        await pool.start()
        new_group = pool._new_group
        abandoned = threading.Event()

        def group_whose_server_stops(argv, vw_args):
            group = new_group(argv, vw_args)
            start = group.start

            def start_then_stop(count):  # on the loop's executor
                engines = start(count)
                stopped.append(group.server.pid)
                os.kill(group.server.pid, signal.SIGSTOP)
                if how == "pool closed":
                    asyncio.run_coroutine_threadsafe(pool.close(2.0), loop).result(10)
                else:
                    loop.call_soon_threadsafe(reloading.cancel)
                    abandoned.wait(10)
                return engines

            group.start = start_then_stop
            return group

        pool._new_group = group_whose_server_stops
        reloading = asyncio.ensure_future(pool.reload(scoring_args(second_model)))
        reloading.add_done_callback(lambda _: abandoned.set())
        gaps = LoopGaps()
        with contextlib.suppress(VowpalWabbitError, asyncio.CancelledError):
            await reloading
        await asyncio.sleep(0.5)  # what the abandoned reload started is being stopped
        longest = await gaps.stop()
        await pool.close(2.0)
        return longest, reloading.cancelled(), time.perf_counter()

    try:
        hung, value = run_with_limit(main, 30.0)
        ended = time.perf_counter()
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert not hung, "the event loop was blocked by the stopped fork server"
    longest, cancelled, main_ended = value
    assert longest < BLOCKED_S
    assert cancelled == (how == "reload cancelled")
    assert process_gone(stopped[0])
    # asyncio.run() waits for the discarding on its executor: one bounded
    # wait for the server (1 s), not ABORT_WAIT_S (5 s) per engine it forked
    assert ended - main_ended < 4.0


def _start_object(kind: str, model: str):
    if kind == "pool":
        return AsyncVowpalWabbitPool(DictFormatter(), scoring_args(model), size=2)
    return AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(model))


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "call in flight"])
@pytest.mark.parametrize("kind", ["pool", "process"])
def test_a_cancelled_close_still_stops_every_engine(trained_model, truth, kind, busy):
    """``asyncio.wait_for(obj.close(), t)`` or a shutdown cancels close():
    the engines and the fork server still go (the object stays referenced,
    so that no garbage collection does it instead), a second close() waits
    for the first one's, and a call in flight ends with a prefix of its own."""

    async def main():
        loop = asyncio.get_running_loop()
        before = set(children_of_this_process())
        obj = _start_object(kind, trained_model)
        await obj.start()
        assert await obj.predict(common(1), items(20), timeout=5.0) == truth[trained_model][1][:20]
        ours = set(children_of_this_process()) - before
        ours |= set(obj.engine_pids()) if kind == "pool" else {obj.pid}
        call = None
        if busy:
            call = asyncio.ensure_future(obj.predict(common(2), items(3000) * 20))
            await asyncio.sleep(0.005)
        closing = asyncio.ensure_future(obj.close(4.0))
        await asyncio.sleep(0)  # close() has taken its first step
        closing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await closing
        await obj.close(4.0)
        if call is not None:
            await asyncio.wait({call}, timeout=10)
            if call.exception() is None:
                got = call.result()
                assert got == (truth[trained_model][2] * 20)[:len(got)]
            else:
                assert isinstance(call.exception(), VowpalWabbitError)
        gone = [await loop.run_in_executor(None, process_gone, pid, 10.0) for pid in sorted(ours)]
        return obj, ours, gone

    obj, ours, gone = asyncio.run(main())
    assert len(ours) >= (3 if kind == "pool" else 1)  # the server and its two engines
    assert all(gone), f"still running after close(): {sorted(ours)}, gone: {gone}"
    del obj


def slow_to_start(tmp_path, model: str):
    """An engine command that starts ``model`` 3 s late while a flag file
    exists (other models at once).

    :returns: the flag's path and the command
    """
    flag = tmp_path / "slow"
    wrapper = tmp_path / "slow_for_one_model.py"
    wrapper.write_text(
        "import os, sys, time\n"
        f"if os.path.exists({str(flag)!r}) and {model!r} in sys.argv:\n"
        "    time.sleep(3)\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n")
    return flag, [sys.executable, str(wrapper)] + default_engine_command()


async def starting_slowly(model: str, command, flag):
    """A process whose start() is under way (a task), slowed by ``flag``."""
    flag.write_text("")
    process = AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(model), vw_command=command)
    starting = asyncio.ensure_future(process.start())
    await asyncio.sleep(0.2)
    return process, starting


async def crashed_with_a_slow_replacement(model: str, command, flag):
    """A started process (``restart_on_crash``) whose engine was killed and
    met by a call: its replacement is starting, slowly while ``flag`` exists."""
    process = AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(model), vw_command=command,
                                       restart_on_crash=True)
    await process.start()
    flag.write_text("")
    os.kill(process.pid, signal.SIGKILL)
    with contextlib.suppress(VowpalWabbitError):
        await process.predict(common(1), items(3000), timeout=None)  # meets the crash
    return process


def test_a_reload_cancelled_while_it_stops_a_replacement_start_is_cancelled(
        trained_model, second_model, truth, tmp_path):
    """A crashed engine's replacement is starting (slowly) when reload()
    comes; the reload stops that start, and is cancelled while it waits for
    it. The cancellation was swallowed there: the reload went on and the
    object served the new model."""
    flag, command = slow_to_start(tmp_path, trained_model)

    async def main():
        model = await crashed_with_a_slow_replacement(trained_model, command, flag)
        replacement = model._starting  # observed only, to time the cancel
        assert replacement is not None and not replacement.done()
        reloading = asyncio.ensure_future(model.reload(scoring_args(second_model)))
        landed = False
        while not reloading.done():
            if not landed and replacement.cancelling():  # the reload is stopping it
                reloading.cancel()
                landed = True
            await asyncio.sleep(0)
        flag.unlink()
        got = await model.predict(common(3), items(3000), timeout=None)
        await model.close()
        return landed, reloading.cancelled(), got

    landed, cancelled, got = asyncio.run(main())
    assert landed
    assert cancelled
    assert got == truth[trained_model][3]  # the old model: the reload did not happen


@pytest.mark.parametrize("kind", ["pool", "process"])
def test_a_close_with_a_short_timeout_leaves_no_pipe_open(trained_model, kind):
    """With a timeout too short for the engine to exit, close() gave up on
    its stderr reader and left the pipe to the garbage collector."""

    async def main():
        for _ in range(3):
            obj = _start_object(kind, trained_model)
            await obj.start()
            await obj.predict(common(1), items(20), timeout=5.0)
            await obj.close(0.005)
            pids = obj.engine_pids() if kind == "pool" else [obj.pid]
            del obj
            for pid in pids:
                process_gone(pid)
            await asyncio.sleep(0.2)  # the readers see EOF

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(main())
        gc.collect()
    unclosed = [str(warning.message) for warning in caught
                if issubclass(warning.category, ResourceWarning)]
    assert unclosed == []


def descendants() -> set:
    """Pids of this process's descendants still running (not zombies)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None and stat[0] != "Z":
                parents[int(entry)] = int(stat[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.mark.parametrize("kind", ["pool", "process"])
def test_a_start_cancelled_as_the_loop_ends_leaves_nothing_running(trained_model, kind, caplog):
    """``asyncio.wait_for(obj.start(), t)`` gives up, ``main()`` returns, and
    the start still under way on the executor finishes while ``asyncio.run()``
    shuts that executor down: its clean-up cannot go there any more."""
    before = descendants()

    async def main():
        obj = _start_object(kind, trained_model)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(obj.start(), 0.05 if kind == "pool" else 0.001)
        await obj.close(5.0)

    for _ in range(2):
        asyncio.run(main())
    deadline = time.time() + 10
    while descendants() - before and time.time() < deadline:
        time.sleep(0.05)
    assert descendants() - before == set()
    assert not [record for record in caplog.records if record.levelno >= 40], caplog.text


@pytest.mark.parametrize("kind", ["pool", "process"])
def test_a_second_close_on_another_loop_returns(trained_model, kind):
    """A second close() on another event loop than the first one's: after
    that loop has ended (``async with`` in one ``asyncio.run``, close() in
    another), or from another thread's loop while the first close() runs."""
    obj = _start_object(kind, trained_model)

    async def use_and_close():
        async with obj:
            await obj.predict(common(1), items(20), timeout=5.0)

    asyncio.run(use_and_close())
    asyncio.run(obj.close(2.0))  # the first loop is closed

    obj = _start_object(kind, trained_model)
    asyncio.run(obj.start())  # its engines are this loop's no more than any other's
    first_began = threading.Event()
    took = []

    def second():
        first_began.wait(10)
        began = time.perf_counter()
        asyncio.run(obj.close(2.0))
        took.append(time.perf_counter() - began)

    async def first():
        closing = asyncio.ensure_future(obj.close(2.0))
        await asyncio.sleep(0)
        first_began.set()
        await closing

    thread = threading.Thread(target=second, daemon=True)
    thread.start()
    asyncio.run(first())
    thread.join(10)
    assert not thread.is_alive(), "the second close() never returned"
    assert took[0] < 2.0 + 0.5


@pytest.mark.parametrize("kind", ["pool", "process"])
def test_a_second_close_returns_within_its_own_timeout(trained_model, kind):
    """The first close() waits for a stopped engine; a second close(0.2)
    returns after its own 0.2 s, not the first one's."""

    async def main():
        obj = _start_object(kind, trained_model)
        await obj.start()
        pid = obj.engine_pids()[0] if kind == "pool" else obj.pid
        call = asyncio.ensure_future(obj.predict(common(1), items(3000) * 200))
        await asyncio.sleep(0.1)
        os.kill(pid, signal.SIGSTOP)  # the call holds an engine that answers no more
        await asyncio.sleep(0.05)
        first = asyncio.ensure_future(obj.close(6.0))
        await asyncio.sleep(0.01)
        began = time.perf_counter()
        await obj.close(0.2)
        took = time.perf_counter() - began
        await first
        await asyncio.wait({call}, timeout=10)
        return took, pid

    took, pid = asyncio.run(main())
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    assert took < 0.2 + 0.5


@pytest.mark.parametrize("kind", ["pool", "process"])
def test_a_second_close_finishes_a_closing_whose_loop_was_closed(trained_model, kind):
    """The first close() gave up waiting (``wait_for``) and its loop was then
    closed with the closing still pending, so that closing can never end. A
    close() on another loop finishes it instead of waiting for it."""
    loop = asyncio.new_event_loop()
    obj = _start_object(kind, trained_model)
    loop.run_until_complete(obj.start())
    pids = obj.engine_pids() if kind == "pool" else [obj.pid]
    kept = []  # the pending tasks are kept, so that no garbage collection closes anything

    async def give_up_closing():
        kept.append(asyncio.ensure_future(obj.predict(common(1), items(3000) * 200)))
        await asyncio.sleep(0.05)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(obj.close(10.0), 0.01)
        kept.append(obj._closing)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        loop.run_until_complete(give_up_closing())
        loop.close()
    if kind == "process":  # the call holds the engine: nothing has closed it
        assert not process_gone(pids[0], 0.5)
    began = time.perf_counter()
    asyncio.run(obj.close(3.0))
    assert time.perf_counter() - began < 3.0 + 0.5
    assert all(process_gone(pid, 5.0) for pid in pids)


_CLOSE_AT_EXIT = """
import asyncio, atexit, json, sys
sys.path[:0] = {path!r}
from conftest import DictFormatter, children_of_this_process, common, items, proc_stat, scoring_args
from subwabbit import AsyncVowpalWabbitPool, AsyncVowpalWabbitProcess
obj = ({kind}(DictFormatter(), scoring_args({model!r}), **{options!r}))
pids = []

async def use():
    await obj.start()
    await obj.predict(common(1), items(20), timeout=5.0)
    pids.extend(obj.engine_pids() if hasattr(obj, "engine_pids") else [obj.pid])
    pids.extend(children_of_this_process())  # the pool's fork server

def running(pid):
    stat = proc_stat(pid)
    return stat is not None and stat[0] != "Z"

def close_at_exit():  # concurrent.futures takes no more work by now
    asyncio.run(obj.close(5.0))
    print(json.dumps([pid for pid in pids if running(pid)]))

asyncio.run(use())
atexit.register(close_at_exit)
"""


@pytest.mark.parametrize("kind", ["AsyncVowpalWabbitPool", "AsyncVowpalWabbitProcess"])
def test_close_at_interpreter_exit_stops_the_engines_before_it_returns(trained_model, kind):
    """An ``atexit`` handler closes the object: the executor takes no more
    work then, and a thread started then is waited for by nobody; close()
    must still have stopped every engine when it returns."""
    options = {"size": 2} if kind == "AsyncVowpalWabbitPool" else {}
    program = _CLOSE_AT_EXIT.format(path=[os.path.dirname(__file__)] + sys.path, kind=kind,
                                    model=trained_model, options=options)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [], done.stdout + done.stderr


def test_a_start_that_close_stops_raises_closed_not_cancelled(tmp_path, trained_model):
    """close() stops an engine start under way. The tasks that awaited it,
    start() and a call waiting for a replacement, were not cancelled
    themselves: they get the error of a closed object, not CancelledError
    (which, since Python 3.11, a task takes for its own cancellation)."""
    flag, command = slow_starting_engine(tmp_path, 1.0)

    async def main():
        first, starting = await starting_slowly(trained_model, command, flag)
        await first.close(2.0)
        outcomes = [await asyncio.gather(starting, return_exceptions=True)]

        flag.unlink()
        second = await crashed_with_a_slow_replacement(trained_model, command, flag)
        waiting = asyncio.ensure_future(second.predict(common(1), items(20), timeout=None))
        await asyncio.sleep(0.2)  # it waits for the replacement, which is slow to start
        await second.close(2.0)
        outcomes.append(await asyncio.gather(waiting, return_exceptions=True))
        return [outcome[0] for outcome in outcomes]

    for outcome in asyncio.run(main()):
        assert isinstance(outcome, VowpalWabbitError) and "closed" in str(outcome), repr(outcome)


def test_a_closing_cancelled_with_a_call_on_the_engine_closes_its_pipes_after_the_call(
        trained_model):
    """``main()`` returns while close() waits for calls in flight, and
    ``asyncio.run()`` cancels both: the engine is killed at once, and its
    pipes, which the call may still be waiting on, are closed as soon as the
    call gives its turn back (they were left to garbage collection)."""

    def fds():
        return set(os.listdir("/proc/self/fd"))

    kept = []
    for delay in (0, 0.0005, 0.002, 0.01):
        before = fds()

        async def main():
            model = _start_object("process", trained_model)
            kept.append(model)  # no garbage collection closes anything
            await model.start()
            await model.predict(common(1), items(20), timeout=5.0)
            for user in range(3):
                asyncio.ensure_future(model.predict(common(user), items(3000), timeout=None))
            await asyncio.sleep(0.002)
            asyncio.ensure_future(model.close(3.0))
            await asyncio.sleep(delay)

        asyncio.run(main())
        assert process_gone(kept[-1].pid)
        deadline = time.time() + 3.0
        while fds() - before and time.time() < deadline:
            time.sleep(0.05)  # the stderr reader closes its pipe at EOF
        assert fds() - before == set(), f"left open after close() was cancelled at {delay} s"


def test_a_start_that_a_reload_replaces_returns_and_the_reload_serves(
        trained_model, second_model, truth, tmp_path):
    """start() waits for a slow engine start when another task's reload()
    stops it to start its own: start() returns (the object is not closed,
    and the reload's engine serves), rather than raise."""
    flag, command = slow_to_start(tmp_path, trained_model)

    async def main():
        model, starting = await starting_slowly(trained_model, command, flag)
        await model.reload(scoring_args(second_model))
        started = await asyncio.gather(starting, return_exceptions=True)
        got = await model.predict(common(2), items(3000), timeout=None)
        await model.close()
        return started[0] is model, got

    started, got = asyncio.run(main())
    assert started
    assert got == truth[second_model][2]


def test_start_waits_its_turn_behind_a_restart_and_a_call_starting_the_engine(tmp_path,
                                                                              trained_model,
                                                                              truth):
    """start() raced what else starts an engine. Called while restart() was
    starting one, it started a second and both were adopted: one engine ran
    on after close(). Called while a call waited for the first start, it
    adopted the engine again and the call failed ('moved to another engine')."""
    flag, command = slow_starting_engine(tmp_path, 0.6)

    async def main():
        before = set(children_of_this_process())
        model = AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(trained_model),
                                         vw_command=command)
        await model.start()
        flag.write_text("")
        restarting = asyncio.ensure_future(model.restart())
        await asyncio.sleep(0.2)  # the restart is starting its engine (slowly)
        flag.unlink()
        await asyncio.gather(restarting, model.start())
        running = set(children_of_this_process()) - before
        await model.close()
        left = [pid for pid in running if not process_gone(pid, 5.0)]

        fresh = AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(trained_model))
        got, _ = await asyncio.gather(fresh.predict(common(1), items(3000), timeout=None),
                                      fresh.start())
        restarts = fresh._restart_count
        await fresh.close()
        return running, left, got, restarts

    running, left, got, restarts = asyncio.run(main())
    assert len(running) == 1 and left == []
    assert got == truth[trained_model][1] and restarts == 0


def test_a_task_that_once_swallowed_a_cancellation_gets_closed_not_cancelled(tmp_path,
                                                                             trained_model):
    """Python 3.11's ``asyncio.wait_for`` can leave a task's count of
    cancellation requests at 1 (a cancel that came as its inner task ended).
    Such a task is not being cancelled: a start() that close() stops must
    still raise the closed object's error, not CancelledError."""
    flag, command = slow_starting_engine(tmp_path, 1.0)

    async def main():
        model = AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(trained_model),
                                         vw_command=command)

        async def swallow_then_start():
            asyncio.current_task().cancel()
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                pass  # swallowed, with no uncancel()
            flag.write_text("")
            await model.start()

        starting = asyncio.ensure_future(swallow_then_start())
        await asyncio.sleep(0.3)
        await model.close(2.0)
        return (await asyncio.gather(starting, return_exceptions=True))[0]

    outcome = asyncio.run(main())
    assert isinstance(outcome, VowpalWabbitError) and "closed" in str(outcome), repr(outcome)


@pytest.mark.parametrize("how", ["restart cancelled", "loop ends after reload"])
def test_an_engine_replaced_while_its_closing_is_cut_short_is_still_stopped(trained_model,
                                                                             truth, how):
    """restart() closes the old engine itself, reload() in a background task:
    a cancellation while that engine is shutting down (here stopped, so that
    it does not exit when its input closes) left it stopped, unreaped and
    with its pipes open for good."""
    model = AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(trained_model))

    async def main():
        await model.start()
        old = model.pid
        os.kill(old, signal.SIGSTOP)
        if how == "restart cancelled":
            restart = asyncio.ensure_future(model.restart(timeout=2.0))
            await asyncio.sleep(0.2)  # the old engine's input is closed; it has not exited
            restart.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await restart
        else:
            await model.reload(scoring_args(trained_model), timeout=2.0)
            await asyncio.sleep(0.1)  # asyncio.run() cancels the closing of the old engine
        return old

    old = asyncio.run(main())
    try:
        assert wait_until(lambda: proc_stat(old) is None, 10.0), proc_stat(old)

        async def then():
            assert await model.predict(common(1), items(3000), timeout=10.0) == \
                truth[trained_model][1]
            await model.close()

        asyncio.run(then())
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(old, signal.SIGKILL)


@pytest.mark.parametrize("how", ["reload", "restart"])
def test_an_engine_being_checked_when_its_loop_is_closed_is_reaped_with_its_pipes(
        trained_model, truth, tmp_path, how):
    """The loop is closed (not by ``asyncio.run()``: no task is cancelled)
    while a reload's or a restart's new engine answers its start-up probe,
    and the dropped task's coroutine is then closed by the garbage
    collector. Its clean-up looked for a running loop to reap the engine
    on: it raised ``RuntimeError`` and left the killed engine a zombie with
    its pipes open."""
    flag, command = slow_starting_engine(tmp_path, 3.0)
    model = AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(trained_model),
                                     vw_command=command)
    fds_before = len(os.listdir("/proc/self/fd"))
    loop = asyncio.new_event_loop()
    loop.run_until_complete(model.start())
    serving = set(children_of_this_process())
    flag.write_text("")  # the next engine answers its probe 3 s late
    task = loop.create_task(model.reload(scoring_args(trained_model)) if how == "reload"
                            else model.restart())

    async def spawned():
        while not set(children_of_this_process()) - serving:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # spawned (on the executor): its probe is under way

    loop.run_until_complete(asyncio.wait_for(spawned(), 10.0))
    new = (set(children_of_this_process()) - serving).pop()
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            loop.close()
            del task
            gc.collect()
    finally:
        sys.unraisablehook = hook
    assert [str(failure.exc_value) for failure in unraisable] == []
    assert wait_until(lambda: proc_stat(new) is None, 10.0), proc_stat(new)  # reaped
    flag.unlink()

    async def then():
        assert await model.predict(common(1), items(3000), timeout=10.0) == \
            truth[trained_model][1]
        await model.close()

    asyncio.run(then())
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_a_start_cancelled_just_as_its_engine_answered_leaves_it_to_the_next_call(
        trained_model, truth):
    """start() is cancelled in the loop turn in which its engine's start
    ends (the cancellation comes from that start's own done callback, so
    that it lands between the two). start() dropped the engine it had
    started: it ran on, served by nobody, after close() and the loop."""
    before = descendants()

    async def main():
        model = AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(trained_model))
        start = asyncio.ensure_future(model.start())
        while model._starting is None:  # pylint: disable=protected-access
            await asyncio.sleep(0)
        model._starting.add_done_callback(lambda _: start.cancel())  # pylint: disable=protected-access
        with pytest.raises(asyncio.CancelledError):
            await start
        started = descendants() - before
        try:
            assert await model.predict(common(1), items(3000), timeout=10.0) == \
                truth[trained_model][1]
            assert descendants() - before == started  # the call took that engine
        finally:
            await model.close()

    asyncio.run(main())
    assert wait_until(lambda: not descendants() - before, 10.0), descendants() - before


def test_a_restart_cancelled_while_it_stops_a_finished_start_stops_that_engine(trained_model,
                                                                               truth):
    """A call returned at its deadline while the engine started in the
    background; the start has ended, no call has taken its engine yet, and a
    restart() is cancelled as it stops that start. The engine was dropped
    unstopped: it ran on after close() and after the loop."""
    before = descendants()

    async def main():
        model = AsyncVowpalWabbitProcess(DictFormatter(), scoring_args(trained_model))
        try:
            assert await model.predict(common(1), items(3000), timeout=0.001) == []
            # (no reference to the start is kept here: the object's are all there are)
            await asyncio.wait({model._starting}, timeout=30.0)  # pylint: disable=protected-access
            assert model._starting.done()  # pylint: disable=protected-access
            restart = asyncio.ensure_future(model.restart())
            await asyncio.sleep(0)  # it waits for the start it stopped
            restart.cancel()
            with pytest.raises(asyncio.CancelledError):
                await restart
            gc.collect()
            assert await model.predict(common(2), items(3000), timeout=10.0) == \
                truth[trained_model][2]
        finally:
            await model.close()

    asyncio.run(main())
    assert wait_until(lambda: not descendants() - before, 10.0), descendants() - before

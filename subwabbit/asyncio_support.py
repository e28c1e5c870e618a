"""What both asyncio classes need besides waiting on pipes: blocking clean-up
handed off the event loop, and waiting for a closing that another call (or
another loop) began.

Clean-up is often started from a done callback, at any moment of the loop's
life, including while ``asyncio.run()`` shuts the loop's executor down, after
the loop was closed, or at interpreter exit; it must still run then, or
engines are left behind.
"""

import asyncio
import logging
import time
from typing import Any, Callable, List, Optional, Sequence

from .engine_group import EngineGroup
from .engine_process import EngineProcess, close_quietly

logger = logging.getLogger("subwabbit")

_clock = time.perf_counter


def hand_off(loop: asyncio.AbstractEventLoop, function: Callable[..., Any], *args: Any
             ) -> Optional["asyncio.Future[Any]"]:
    """Run a blocking ``function(*args)`` off the loop, without waiting for it.

    On the loop's default executor. Once there is none (``asyncio.run()``
    shut it down, the loop is closed, or the interpreter is exiting and
    ``concurrent.futures`` takes no more work) the loop is ending and nothing
    else waits for a thread: ``function`` then runs here, before this returns
    (each clean-up is bounded in time).

    :returns: the executor's future, or ``None`` when it ran here
    """
    try:
        return loop.run_in_executor(None, function, *args)
    except RuntimeError:  # executor shut down, loop closed, interpreter exiting
        logger.debug("the loop's executor is gone: %s runs at once",
                     getattr(function, "__name__", function))
        _quietly(function, *args)
        return None


def _quietly(function: Callable[..., Any], *args: Any) -> None:
    try:
        function(*args)
    except Exception:  # pylint: disable=broad-except
        logger.exception("clean-up of a vw engine failed")


async def wait_for_closing(closing: "asyncio.Future[Any]", timeout: float) -> bool:
    """Wait up to ``timeout`` for a closing that an earlier ``close()`` began,
    without raising what it raises (that call reports it). The closing may
    belong to another event loop (another thread's): then it is looked at
    every few milliseconds.

    :returns: ``False`` at once when the closing can never end: its loop was
        closed while it ran (the caller must finish the closing itself);
        ``True`` otherwise
    """
    if closing.done():
        return True
    if closing.get_loop() is asyncio.get_running_loop():
        await asyncio.wait({closing}, timeout=timeout)
        return True
    until = _clock() + timeout
    while not closing.done() and _clock() < until:
        if closing.get_loop().is_closed():
            return False
        await asyncio.sleep(min(0.005, max(0.0, until - _clock())))
    return True


def hand_off_closing(loop: asyncio.AbstractEventLoop, engines: Sequence[EngineProcess],
                     groups: Sequence[EngineGroup], deadline: float
                     ) -> "List[asyncio.Future[Any]]":
    """Close engines (``close_quietly``) and engine groups off the loop
    (:func:`hand_off`), each within what is left until ``deadline`` (a
    :func:`time.perf_counter` value) when it runs: when there is no executor
    they run one after another, and share it.

    :returns: the executor's futures (none for what ran here)
    """
    handed = [hand_off(loop, _close_engine_by, engine, deadline) for engine in engines]
    handed += [hand_off(loop, _close_group_by, group, deadline) for group in groups]
    return [future for future in handed if future is not None]


def _close_engine_by(engine: EngineProcess, deadline: float) -> None:
    close_quietly(engine, max(0.0, deadline - _clock()))


def _close_group_by(group: EngineGroup, deadline: float) -> None:
    group.close(max(0.0, deadline - _clock()))


async def close_left_behind(engines: Sequence[EngineProcess], groups: Sequence[EngineGroup],
                            timeout: float) -> None:
    """Close what a closing whose loop was closed under it left: engines and
    engine groups, off the loop, within ``timeout``. No call uses their pipes
    any more: the calls' loop is closed too."""
    jobs = hand_off_closing(asyncio.get_running_loop(), engines, groups, _clock() + timeout)
    if jobs:
        await asyncio.wait(jobs, timeout=max(0.001, timeout))

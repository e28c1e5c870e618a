"""What both asyncio classes need besides waiting on pipes: blocking clean-up
handed off the event loop, and waiting for a closing that another call (or
another loop) began.

Clean-up is often started from a done callback, at any moment of the loop's
life, including while ``asyncio.run()`` shuts the loop's executor down; it
must still run then, or engines are left behind.
"""

import asyncio
import logging
import threading
import time
from typing import Any, Callable, Optional

logger = logging.getLogger("subwabbit")

_clock = time.perf_counter


def hand_off(loop: asyncio.AbstractEventLoop, function: Callable[..., Any], *args: Any
             ) -> Optional["asyncio.Future[Any]"]:
    """Run a blocking ``function(*args)`` off the loop, without waiting for it.

    On the loop's default executor; once that is shut down (or the loop
    closed), on a thread of its own, which the interpreter waits for at exit.

    :returns: the executor's future, or ``None`` when a thread runs it
    """
    try:
        return loop.run_in_executor(None, function, *args)
    except RuntimeError:  # executor shut down, loop closed
        logger.debug("the loop's executor is gone: %s runs on a thread of its own",
                     getattr(function, "__name__", function))
        threading.Thread(target=_quietly, args=(function,) + args,
                         name="subwabbit-cleanup").start()
        return None


def _quietly(function: Callable[..., Any], *args: Any) -> None:
    try:
        function(*args)
    except Exception:  # pylint: disable=broad-except
        logger.exception("clean-up of a vw engine failed")


async def wait_for_closing(closing: "asyncio.Future[Any]", timeout: float) -> None:
    """Wait up to ``timeout`` for a closing that an earlier ``close()`` began,
    without raising what it raises (that call reports it). The closing may
    belong to another event loop (another thread's, or one that has ended):
    then it is looked at every few milliseconds."""
    if closing.done():
        return
    if closing.get_loop() is asyncio.get_running_loop():
        await asyncio.wait({closing}, timeout=timeout)
        return
    until = _clock() + timeout
    while not closing.done() and _clock() < until:
        await asyncio.sleep(min(0.005, max(0.0, until - _clock())))

"""The engines a client does not serve, which its ``close()`` must not
leave behind: those it has started and not yet put in service, and those a
reload retired that are still closing.

A reload's new engine, a restart's, a replacement for a dead one, a fork
server loading a pool's model: each is spawned on some thread, takes up to
its start-up timeout to answer, and only then is put in service. A
``close()`` meanwhile kills it, so that no engine outlives the object by its
start-up time, and the start that it cuts short fails (the client then says
that it was closed). The single processes, the asyncio process and a pool's
engine groups each keep one :class:`StartingEngines`.

The engines a reload (or a pool's failure) took out of service close on
other threads, within the reload's timeout; ``close()`` ends those still
running within its own (:class:`RetiringEngines`, one per client).
"""

import contextlib
import logging
import os
import subprocess
import threading
import time
import weakref
from typing import Callable, Iterator, List, Optional, Sequence

from .engine_process import EngineProcess, shutdown_schedule

logger = logging.getLogger("subwabbit")

#: The longest :meth:`StartingEngines.kill_all` waits for a spawn under way
#: (fork and exec: milliseconds) to be noted, so that it kills that one too.
SPAWN_WAIT_S = 1.0


class StartingEngines:
    """Engines spawned for one owner and not yet handed over to its service.

    Thread-safe; its lock is held only briefly, and never while an engine
    starts.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition(threading.Lock())
        self._engines: "weakref.WeakSet[EngineProcess]" = weakref.WeakSet()
        self._spawns = 0
        #: set by :meth:`kill_all`: engines noted from then on are killed at once
        self.closed = False

    @contextlib.contextmanager
    def spawning(self) -> Iterator[Callable[[EngineProcess], None]]:
        """Around a start: gives the function to call with the engine as soon
        as it is spawned (:meth:`note`). Until then (fork and exec:
        milliseconds), or until the block ends without an engine,
        :meth:`kill_all` waits for it, so that an engine spawned as the
        owner closes is killed too."""
        spawning = [True]

        def spawned(engine: EngineProcess) -> None:
            self._note(engine, spawning)

        with self._lock:
            self._spawns += 1
        try:
            yield spawned
        finally:
            with self._lock:
                self._end_spawn(spawning)

    def note(self, engine: EngineProcess) -> None:
        """``engine`` was just spawned for the owner: killed at once if the
        owner has closed (its start then fails), else kept until
        :meth:`handed_over` or :meth:`kill_all`."""
        self._note(engine, None)

    def _note(self, engine: EngineProcess, spawning: Optional[List[bool]]) -> None:
        with self._lock:
            self._engines.add(engine)
            self._end_spawn(spawning)
            closed = self.closed
        if closed:
            engine.kill()

    def _end_spawn(self, spawning: Optional[List[bool]]) -> None:
        """(with the lock held) A spawn is over, once."""
        if spawning is not None and spawning[0]:
            spawning[0] = False
            self._spawns -= 1
            self._lock.notify_all()

    def handed_over(self, engines: Sequence[EngineProcess]) -> None:
        """The owner serves ``engines`` now (and closes them itself)."""
        with self._lock:
            for engine in engines:
                self._engines.discard(engine)

    def kill_all(self, spawn_wait_s: float = SPAWN_WAIT_S) -> List[EngineProcess]:
        """For the owner's ``close()``: from now on every engine noted is
        killed; kill those noted and not handed over, after waiting up to
        ``spawn_wait_s`` for the spawns under way. Their starters close
        their pipes (they may be reading them): wait for their exit with
        :func:`await_exits`.

        :returns: the engines killed (a parent's, in a forked child, are
            left alone)
        """
        with self._lock:
            self.closed = True
            self._lock.wait_for(lambda: not self._spawns, max(0.0, spawn_wait_s))
            engines = [engine for engine in self._engines if engine.owner_pid == os.getpid()]
        for engine in engines:
            engine.kill()
        return engines

    def reset_in_fork(self) -> None:
        """In a forked child: the parent's engines are the parent's to stop,
        and its threads may have held the lock at the fork."""
        self._lock = threading.Condition(threading.Lock())
        self._engines = weakref.WeakSet()
        self._spawns = 0


def await_exits(engines: Sequence[EngineProcess], until: float) -> None:
    """Wait until ``until`` (a :func:`time.perf_counter` value) for killed
    ``engines`` to exit, logging those that have not."""
    for engine in engines:
        try:
            engine.proc.wait(max(0.0, until - time.perf_counter()))
        except subprocess.TimeoutExpired:
            logger.warning("vw[%d] was killed as its client closed but has not exited",
                           engine.pid)


class RetiringEngines:
    """Engines a client took out of service that close on other threads.

    Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engines: "weakref.WeakSet[EngineProcess]" = weakref.WeakSet()

    def add(self, engines: Sequence[EngineProcess]) -> None:
        """``engines`` are closing in the background from now on."""
        with self._lock:
            for engine in engines:
                self._engines.add(engine)

    def end(self, deadline: float) -> None:
        """For the client's close() (blocking: the asyncio classes run it on
        their executor): those still running are given until shortly before
        ``deadline`` (a :func:`time.perf_counter` value;
        :func:`~subwabbit.engine_process.shutdown_schedule`'s SIGKILL moment)
        to finish, then killed and waited for until ``deadline``, so that
        none outlives the client. A parent's, in a forked child, are left
        alone."""
        with self._lock:
            engines = [engine for engine in self._engines if engine.owner_pid == os.getpid()]
        _, kill_at = shutdown_schedule(deadline, max(0.0, deadline - time.perf_counter()))
        for engine in engines:
            try:
                engine.proc.wait(max(0.0, kill_at - time.perf_counter()))
                continue
            except subprocess.TimeoutExpired:
                pass
            logger.warning("vw[%d], retired, is still closing as its client closes; killing it",
                           engine.pid)
            engine.kill()
            await_exits([engine], deadline)

    def reset_in_fork(self) -> None:
        """In a forked child: the parent's engines are the parent's to stop,
        and its threads may have held the lock at the fork."""
        self._lock = threading.Lock()
        self._engines = weakref.WeakSet()

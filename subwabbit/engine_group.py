"""The engines a pool runs for one model: started together, checked, replaced,
sharing one copy of the model where the engine allows it.

With the wheel's engine (and no ``-f``) one process loads the model and the
engines are forked from it (:mod:`subwabbit.fork_server`), so that N engines
cost about one model's memory; otherwise each engine is started on its own.
A group of one engine has nothing to share: its engine is started on its own
and runs vw's two-thread driver, which gives one engine more predictions
within a deadline than the forked engines' one-thread loop.
Everything here blocks; the asyncio pool runs it on its executor.
"""

import concurrent.futures
import logging
import os
import threading
import time
from typing import Callable, List, Optional, Sequence

from .core.exchanges import warm_up_lines_usable
from .core.kinds import PredictionKind
from .engine_process import EngineProcess, lower_for_exit, threads_of
from .errors import VowpalWabbitError, VowpalWabbitStartupError
from .fork_server import ForkServer, ForkServerUnavailable, can_share_weights
from .model_file import FileIdentity, file_identity
from .unserved_engines import SPAWN_WAIT_S, StartingEngines, await_exits
from .sync_driver import check_answers_probe, start_engine, warm_up

logger = logging.getLogger("subwabbit")

_clock = time.perf_counter

#: The most a new engine's warm-up may plan to take: a new engine of the
#: benchmark's model took 7 to 11 ms for its 400 lines (first uses
#: included); one that is slow per line is warmed on the lines that fit.
WARM_UP_BUDGET_S = 0.05


class EngineGroup:
    """The engines of one model (one generation of a pool).

    :param argv: the engine command line
    :param startup_timeout_s: how long loading the model and each engine's
        first answer may take
    :param share_weights: fork the engines from one process that loaded the
        model, where the engine allows it
    :param outputs_per_line: answer lines per example (the model kind's)
    :param kind: the model's kind, whose shape the start-up probes' answers
        must have (``None``: any)
    :param low_priority: run the engines below the client's priority (see
        :func:`lower_priority`)
    :param warm_up_lines: returns lines a recent call sent (or ``None``);
        each engine predicts them before it is handed over (see
        :func:`~subwabbit.sync_driver.warm_up`), so that the first calls
        after a reload or a replacement are not slowed by a new engine
    :param on_engine_exit: called with the pid of a forked engine that
        ended, as soon as its fork server reports it (on the thread that
        reads the server's messages: it must not block)
    :param model_path: the model file the engines load (``-i`` of the vw
        arguments; see :func:`~subwabbit.model_file.model_file_path`): no
        engine of the group loads another file found at that path later
    """

    def __init__(self, argv: List[str], startup_timeout_s: float, share_weights: bool,
                 outputs_per_line: int = 1, kind: Optional[PredictionKind] = None,
                 low_priority: bool = False,
                 warm_up_lines: Optional[Callable[[], Optional[Sequence[str]]]] = None,
                 on_engine_exit: Optional[Callable[[int], None]] = None, *,
                 model_path: Optional[str] = None) -> None:
        self.argv = argv
        self.startup_timeout_s = startup_timeout_s
        self.outputs_per_line = outputs_per_line
        self.kind = kind
        self.low_priority = low_priority
        self._warm_up_lines = warm_up_lines
        self._on_engine_exit = on_engine_exit
        self.server: Optional[ForkServer] = None
        self._share = share_weights and can_share_weights(argv)
        #: guards :attr:`server` and the closing (held only briefly)
        self._server_lock = threading.Lock()
        #: held while a replacement starts a new fork server (see
        #: :meth:`_server_for_replacement`)
        self._restart_lock = threading.Lock()
        self._closed = False
        #: the processes the group spawned that no pool serves yet (engines
        #: starting or started, a fork server loading the model): close()
        #: kills them (see :meth:`hand_over`)
        self._new_engines = StartingEngines()
        #: the model file the engines load, and which file was there when
        #: they loaded it (see :meth:`_check_model_file`)
        self._model_path = model_path
        self._model_file: Optional[FileIdentity] = None

    @property
    def model_file(self) -> Optional[FileIdentity]:
        """The identity of the model file the group's engines loaded
        (``None``: no path in the arguments, no file there, or not started)."""
        return self._model_file

    @property
    def shares_weights(self) -> bool:
        """Whether the engines are forked from one copy of the model."""
        return self.server is not None

    def start(self, count: int) -> List[EngineProcess]:
        """Start ``count`` engines and check that each answers.

        :raises VowpalWabbitStartupError: the first failure (every engine
            started is stopped), or the model file changed while they loaded it
        """
        self._model_file = file_identity(self._model_path)
        if self._share and count > 1:
            self.server = self._start_server()
        if self.server is not None:
            forked: List[EngineProcess] = []
            try:
                self._check_model_file("the pool's fork server loaded it")
                for _ in range(count):
                    forked.append(self.add_one())
            except BaseException:
                for engine in forked:
                    engine.abort()
                self.close()
                raise
            return forked
        with concurrent.futures.ThreadPoolExecutor(
                max_workers=count, thread_name_prefix="subwabbit-pool-start") as executor:
            futures = [executor.submit(self._start_copy) for _ in range(count)]
            concurrent.futures.wait(futures)
        engines = [future.result() for future in futures if future.exception() is None]
        errors = [future.exception() for future in futures if future.exception() is not None]
        if not errors:
            try:
                self._check_model_file("the pool's engines loaded it")
            except VowpalWabbitStartupError as changed:
                errors.append(changed)
        if errors:
            for engine in engines:
                engine.abort()
            raise errors[0]  # type: ignore[misc]
        if self.low_priority:
            for engine in engines:
                lower_priority(engine.pid)
        return engines

    def _start_server(self) -> Optional[ForkServer]:
        """Start a fork server that loads the model (``None``: the model
        needs vw's own driver, and the engines load a copy each)."""
        try:
            with self._new_engines.spawning() as note:
                server = ForkServer(self.argv, self.startup_timeout_s, note)
        except ForkServerUnavailable:
            logger.info("the model needs vw's own driver: the pool's engines load a copy each")
            self._share = False
            return None
        self.hand_over([server.engine])  # the group's own: close() stops it
        server.on_exit = self._on_engine_exit
        if self.low_priority:
            lower_priority(server.pid)  # its forks inherit it
        return server

    def _server_for_replacement(self) -> Optional[ForkServer]:
        """The fork server a replacement is forked from (``None``: the
        engines load a copy each). If the last one ended, or stopped
        answering forks (a late answer would be taken for the next fork's),
        it is stopped and a new one started, one at a time: a replacement
        due meanwhile waits for it and forks from it too, so that
        replacements go on sharing one copy of the model and having their
        exits reported. When the new one cannot start, the old one stays
        recorded, and the next replacement tries again.

        :raises VowpalWabbitStartupError: when the new server cannot start,
            or another model file is at the path now (checked before and
            after it loads: nothing is loaded for a file the group would refuse)
        :raises VowpalWabbitError: when the group was closed (the pool closed
            or moved to another model) before or while the server started
        """
        with self._restart_lock:
            with self._server_lock:
                self._raise_if_closed()
                old = self.server
            if old is None or not old.closed:
                return old
            if not old.died and not old.engine.closed:
                logger.warning("the pool's fork server vw[%s] did not answer a fork within "
                               "%g s, or was stopped (SIGSTOP, a debugger): killing it and "
                               "starting a new one", old.pid, self.startup_timeout_s)
                old.engine.kill()  # (it frees its copy of the model at once)
            old.close(1.0)  # reaps it (it has ended, or was just killed)
            self._check_model_file("the pool's engines loaded it")
            server = self._start_server()
            with self._server_lock:
                if server is None:  # the model needs vw's own driver after all
                    if self.server is old:
                        self.server = None
                    return None
            try:
                self._check_model_file("the pool's first fork server loaded it")
                with self._server_lock:
                    self._raise_if_closed()
                    self.server = server
            except BaseException:
                server.close()
                raise
        logger.warning("started a new fork server for the pool: vw[%s]", server.pid)
        return server

    def _raise_if_closed(self) -> None:
        if self._closed:
            raise VowpalWabbitError("the engines of this model were closed (the pool closed "
                                    "or serves another model): no replacement is started",
                                    argv=self.argv)

    def _check_model_file(self, when: str) -> None:
        """Refuse to serve a model file other than the one the group's
        engines loaded: an engine that loads it later (a replacement) would
        answer calls of this generation with another model's predictions.

        :raises VowpalWabbitStartupError: when another file is at the path now
        """
        if self._model_file is not None and file_identity(self._model_path) != self._model_file:
            raise VowpalWabbitStartupError(
                f"the model file {self._model_path} changed since {when}: an engine that "
                "loads it would serve another model than the others; reload() the pool to "
                "serve the new file (write new models under new names, or move them over "
                "the old name only with a reload right after)", argv=self.argv)

    def add_one(self) -> EngineProcess:
        """Start one more engine (a replacement) and check that it answers.
        A fork server that ends or stops answering during the fork is
        replaced, and the engine forked from the new one.

        :raises VowpalWabbitStartupError: when it cannot start, or when it
            would load a model file other than the group's first engines did
            (a copy is not started then)
        """
        for attempt in (1, 2):
            server = self._server_for_replacement()
            if server is None:
                return self._add_copy()
            deadline = _clock() + self.startup_timeout_s
            try:
                engine = server.fork_engine(self.startup_timeout_s)
            except VowpalWabbitError:
                if attempt == 2 or not server.closed:
                    raise
                continue  # the server is gone or stuck: once more, from a new one
            try:
                self._new_engines.note(engine)
                check_answers_probe(engine, self.outputs_per_line, deadline, self.kind)
                self._warm_up(engine, deadline)
            except BaseException:
                engine.abort()
                raise
            return engine
        raise AssertionError("unreachable")  # pragma: no cover

    def _add_copy(self) -> EngineProcess:
        """Start a replacement that loads its own copy of the model, if the
        model file is still the one the group loaded (checked before and
        after it loads)."""
        self._check_model_file("the pool's engines loaded it")
        engine = self._start_copy()
        try:
            self._check_model_file("the pool's engines loaded it")
        except VowpalWabbitStartupError:
            engine.abort()
            raise
        if self.low_priority:
            lower_priority(engine.pid)
        return engine

    def _start_copy(self) -> EngineProcess:
        """Start an engine that loads its own copy of the model, check that
        it answers, and warm it up."""
        deadline = _clock() + self.startup_timeout_s
        with self._new_engines.spawning() as note:
            engine = start_engine(self.argv, self.outputs_per_line, self.startup_timeout_s,
                                  note, self.kind)
        try:
            self._warm_up(engine, deadline)
        except BaseException:
            engine.abort()
            raise
        return engine

    def _warm_up(self, engine: EngineProcess, deadline: float) -> None:
        """Have a started engine predict lines a recent call sent, if any:
        as many as fit in :data:`WARM_UP_BUDGET_S` at its pace, within what
        is left of the start-up timeout (``deadline``). The engine is then
        served on the channel the warm-up leaves on it
        (:attr:`EngineProcess.warm_channel`)."""
        recent = self._warm_up_lines() if self._warm_up_lines is not None else None
        lines = list(recent) if recent else []  # (a call's lines may be kept as their parts)
        if lines and warm_up_lines_usable(lines) and self.outputs_per_line:
            budget_end = min(deadline, _clock() + WARM_UP_BUDGET_S)
            # A call keeps up to two batches in flight on an engine, which
            # reads them at once: the warm-up grows to that, four times over.
            engine.warm_channel = warm_up(engine, lines, self.outputs_per_line, deadline,
                                          budget_end, rounds=4, largest_chunk=2 * len(lines))

    def hand_over(self, engines: Sequence[EngineProcess]) -> None:
        """The pool serves ``engines`` now (it closes them): :meth:`close`
        leaves them alone."""
        self._new_engines.handed_over(engines)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the fork server, if any (its engines are closed one by one),
        and kill the engines started and not handed over (a start this cuts
        short fails), waiting within ``timeout_s`` for them to exit."""
        deadline = _clock() + timeout_s
        with self._server_lock:
            self._closed = True
            server, self.server = self.server, None
        # (a spawn under way takes milliseconds: let it end, and kill it too)
        starting = self._new_engines.kill_all(min(timeout_s, SPAWN_WAIT_S))
        if server is not None:
            try:
                server.close(timeout_s)
            except VowpalWabbitError as exc:
                logger.debug("closing the pool's fork server: %s", exc)
        await_exits(starting, deadline)  # (their starters close their pipes)

    def retire(self, timeout_s: float = 5.0) -> None:
        """Stop the fork server of a model no longer served, at the lowest
        CPU priority (it frees the model on its way out: see
        :func:`~subwabbit.engine_process.retire_quietly`)."""
        if self.server is not None:
            lower_for_exit(self.server.engine)
        self.close(timeout_s)

    def abandon_in_fork(self) -> None:
        """In a forked client process: let go of the server without touching it."""
        # (threads of the parent may have held them at the fork)
        self._server_lock = threading.Lock()
        self._restart_lock = threading.Lock()
        self._new_engines.reset_in_fork()  # (the parent's to stop)
        server, self.server = self.server, None
        if server is not None:
            server.abandon_in_fork()


#: How much lower than the client an engine of a crowded pool runs (nice
#: steps). 10 rather than 5, on 2 vCPUs with a pool of 2 and timeout=10 ms:
#: +2.6% to +3.7% predictions per call in three runs that changed the nice
#: value of one pool's engines between turns, but 0.972x and 0.992x in two
#: runs of ``python -m benchmarks.pool_pacing --nice 5 10`` (one pool per
#: value): no setting clearly better.
LOW_PRIORITY_NICE = 5


def lower_priority(pid: int) -> None:
    """Run an engine below the client: ``SCHED_BATCH`` (a woken engine does
    not preempt the thread that woke it) and ``LOW_PRIORITY_NICE`` more nice.

    When a pool's engines and the calling thread are more than the cores, a
    write that wakes an engine otherwise often hands it the writer's core:
    measured on 2 cores with a pool of 2 (cProfile of 20 calls of the
    benchmark's 3,000 items, no timeout), the client's writes took 5.4 ms per
    call, 0.5 ms with the engines lowered. The client's formatting is what
    feeds every engine, so it must not wait for them. Failures (another OS, limits)
    are logged and ignored.
    """
    # On Linux both settings belong to each thread: every thread of the
    # engine (vw's own driver has a parser and a learner thread) is lowered.
    for tid in threads_of(pid):
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        except (AttributeError, OSError) as exc:
            logger.debug("cannot set SCHED_BATCH on vw[%d] thread %d: %s", pid, tid, exc)
        try:
            current = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, current + LOW_PRIORITY_NICE))
        except (AttributeError, OSError) as exc:
            logger.debug("cannot lower the priority of vw[%d] thread %d: %s", pid, tid, exc)

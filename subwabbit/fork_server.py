"""Engines that share one copy of a model: the client side of the wheel
engine's fork server.

A recommender model is large (``-b 25`` with adaptive and normalized updates
is hundreds of MiB), and N engines that each load it cost N times that. VW's
daemon mode loads the model once and forks its children, which share the
weights' memory pages as long as nobody writes them. The wheel's engine does
the same for a pool: started with :data:`~subwabbit.engine.program.FORK_SERVER_ENV_VAR`
it loads the model and then forks one engine per request, handing each the
pipes the client created (over a Unix socket, ``SCM_RIGHTS``). Each forked
engine speaks the usual pipe protocol; it is a :class:`~subwabbit.engine_process.EngineProcess`
whose process handle is a :class:`ForkedProcess`.

Only the wheel's engine can do this, with the one-thread loop (scalar
predictions) and without ``-f`` (every child would write the model at exit).
A ``vw`` executable has no such mode on pipes (its ``--daemon`` serves TCP
connections), so a pool of executables loads one copy per engine.
"""

import logging
import os
import queue
import select
import signal
import socket
import subprocess
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

from .command import default_engine_command
from .engine.program import FORK_SERVER_ENV_VAR, chosen_driver, option_name
from .engine_process import (STOPPED_POLL_S, EngineProcess, LooseDescriptors, in_transit,
                             track_for_fork)
from .errors import (UNKNOWN_EXIT_STATUS, VowpalWabbitError, VowpalWabbitStartupError,
                     describe_returncode)

logger = logging.getLogger("subwabbit")

_clock = time.perf_counter

#: How long the report of a fork server that died waits for its exit status.
_DEATH_STATUS_WAIT_S = 1.0


def can_share_weights(argv: Sequence[str]) -> bool:
    """Whether engines of ``argv`` can be forked from one that loaded the
    model: the wheel's engine, with no ``-f`` (and no ``SUBWABBIT_ENGINE_DRIVER=vw``)."""
    engine = default_engine_command()
    if list(argv[:len(engine)]) != engine:
        return False
    if chosen_driver() == "vw":
        return False
    return not any(option_name(token) in ("-f", "--final_regressor") for token in argv)


class ForkedProcess:
    """A ``subprocess.Popen``-like handle on an engine forked by a fork server.

    The engine is not this process's child: the fork server reaps it and
    reports its exit status. Signals go through a pidfd where the system has
    them, so that a signal can never reach another process that reused the pid.
    """

    def __init__(self, pid: int, stdin_fd: int, stdout_fd: int, stderr_fd: int,
                 server: "ForkServer") -> None:
        self.pid = pid
        self.stdin = os.fdopen(stdin_fd, "wb", buffering=0)
        self.stdout = os.fdopen(stdout_fd, "rb", buffering=0)
        self.stderr = os.fdopen(stderr_fd, "rb", buffering=0)
        self.returncode: Optional[int] = None
        self._server = server
        self._pidfd: Optional[int] = None
        try:
            self._pidfd = os.pidfd_open(pid)  # type: ignore[attr-defined]
        except (AttributeError, OSError):
            pass

    def poll(self) -> Optional[int]:
        """The exit status, once known (``None`` while it runs)."""
        if self.returncode is None:
            code = self._server.exit_status(self.pid)
            if code is None and (self._server.died or self._server.stopped) and self.has_ended():
                # Ended, and the server will send no status any more (if it
                # has not just before it ended): it died (unknown), or we
                # stopped it and let the engine go on until its input closed
                # (0, as asked). Otherwise the status is on its way.
                code = self._server.exit_status(self.pid)
                if code is None:
                    code = UNKNOWN_EXIT_STATUS if self._server.died else 0
            if code is not None:
                self.returncode = code
                self._close_pidfd()
        return self.returncode

    def has_ended(self) -> bool:
        """Whether the engine has ended, its exit status known or not (through
        its pidfd where the system has one: its pid may be another's then)."""
        if self._pidfd is not None:
            return bool(select.select([self._pidfd], [], [], 0)[0])
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for the exit status.

        :raises subprocess.TimeoutExpired: when ``timeout`` passes first
        """
        deadline = None if timeout is None else _clock() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and _clock() >= deadline:
                raise subprocess.TimeoutExpired(["vw", str(self.pid)], timeout or 0.0)
            time.sleep(delay if deadline is None else min(delay, max(0.0, deadline - _clock())))
            delay = min(delay * 2, 0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)  # type: ignore[attr-defined]
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __del__(self) -> None:
        self._close_pidfd()


class ForkServer:
    """A wheel engine that loaded the model once and forks engines that share it.

    :param argv: the engine command line (see :func:`can_share_weights`)
    :param startup_timeout_s: how long loading the model may take
    :param on_spawn: called with the server's engine as soon as it is
        spawned (so that another thread can kill it while it loads the model)
    :raises VowpalWabbitStartupError: when the engine cannot load the model
    :raises ForkServerUnavailable: when the model needs vw's own driver
    """

    def __init__(self, argv: List[str], startup_timeout_s: float,
                 on_spawn: Optional[Callable[[EngineProcess], None]] = None) -> None:
        self.argv = argv
        self.closed = False
        #: stopped by :meth:`close` (or let go in a fork): no statuses come any more
        self.stopped = False
        with in_transit():  # a forked child closes the socket and the server's pipes
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._sock = ours
            env = dict(os.environ)
            env[FORK_SERVER_ENV_VAR] = str(theirs.fileno())
            try:
                self.engine = EngineProcess(argv, prints_answers=False, env=env,
                                            pass_fds=(theirs.fileno(),))
            finally:
                theirs.close()
            track_for_fork(self)
        if on_spawn is not None:
            on_spawn(self.engine)
        self.engine.drain_stdout_in_background()
        self._lock = threading.Lock()
        self._replies: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self._exits: Dict[int, int] = {}
        #: called with an engine's pid when its exit status arrives (on the
        #: thread that reads the server's messages: it must not block)
        self.on_exit: Optional[Callable[[int], None]] = None
        #: it ended without being asked: the statuses it had not sent are lost
        self.died = False
        ready = self._first_message(startup_timeout_s)
        if ready == b"nofork":
            self.close()
            raise ForkServerUnavailable("the model needs vw's own driver, which cannot fork")
        if ready != b"ready":
            error = self.engine.startup_error(
                "the vw engine failed to load the model for a pool", wait_for_exit=True)
            self.close()
            raise error
        self._reader = threading.Thread(target=self._read_messages, daemon=True,
                                        name=f"subwabbit-vw{self.engine.pid}-forks")
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.engine.pid

    def _first_message(self, timeout_s: float) -> bytes:
        ready, _, _ = select.select([self._sock], [], [], timeout_s)
        if not ready:
            # Killed, not asked to exit: it serves nothing and has nothing to
            # save, and a server stuck loading (or stopped) took the close's
            # whole schedule, 4 s past startup_timeout_s, to be terminated.
            self.engine.kill()
            self.close()
            raise VowpalWabbitStartupError(
                f"the vw engine did not load the model within {timeout_s:g} s",
                argv=self.argv, stderr_tail=self.engine.stderr_tail())
        try:
            return self._sock.recv(64)
        except OSError:
            return b""

    def _read_messages(self) -> None:
        while True:
            try:
                message = self._sock.recv(64)
            except OSError:
                message = b""
            if not message:
                # (died first: a server seen closed and not died is taken
                # for one that stopped answering)
                self.died = not self.stopped
                self.closed = True
                self._replies.put(None)
                # (under the lock: a fork_engine() that sent a request has
                # its answer, None, and no other sends one now)
                with self._lock:
                    self._sock.close()
                if self.died:
                    self._report_death()
                return
            if message.startswith(b"exit "):
                _, pid, code = message.split()
                self._exits[int(pid)] = int(code)
                if self.on_exit is not None:
                    try:
                        self.on_exit(int(pid))
                    except Exception:  # pylint: disable=broad-except
                        logger.exception("reporting the exit of vw[%s]", pid.decode())
            else:
                self._replies.put(message)

    def _report_death(self) -> None:
        """Log an end nobody asked for, once its status is known, and reap
        the server (no zombie is left until the pool closes)."""
        try:
            status: Optional[int] = self.engine.proc.wait(timeout=_DEATH_STATUS_WAIT_S)
        except subprocess.TimeoutExpired:
            status = None
        tail = self.engine.stderr_tail()
        logger.warning("the pool's fork server vw[%s] %s; its engines serve on, and the next "
                       "replacement starts a new server%s", self.pid,
                       "is ending" if status is None else describe_returncode(status),
                       f" (vw said: {tail})" if tail else "")

    def exit_status(self, pid: int) -> Optional[int]:
        """The exit status of a forked engine, once the server reported it."""
        return self._exits.get(pid)

    def fork_engine(self, timeout_s: float = 5.0) -> EngineProcess:
        """Fork one more engine of the model.

        :raises VowpalWabbitError: when the server is gone or does not answer
        """
        # Until the engine holds them, a forked child closes its copies.
        with in_transit():
            pipes = LooseDescriptors(())
            try:
                for _ in range(3):
                    pipes.fds.extend(os.pipe())
            except BaseException:
                pipes.close()
                raise
        stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w = pipes.fds
        theirs = [stdin_r, stdout_w, stderr_w]
        try:
            with self._lock:
                if self.closed:
                    raise VowpalWabbitError("the pool's fork server has exited",
                                            argv=self.argv)
                socket.send_fds(self._sock, [b"fork"], theirs)
                reply = self._reply(timeout_s)
        except (OSError, queue.Empty) as exc:
            # A late answer would be taken for the next request's: no more requests.
            self.closed = True
            pipes.close()
            raise VowpalWabbitError(f"the pool's fork server did not fork an engine: {exc!r}",
                                    argv=self.argv, stderr_tail=self.engine.stderr_tail()
                                    ) from exc
        except BaseException:
            pipes.close()
            raise
        pipes.close(theirs)
        if reply is None or not reply.startswith(b"pid "):
            pipes.close()
            raise VowpalWabbitError(f"the pool's fork server answered {reply!r}", argv=self.argv,
                                    stderr_tail=self.engine.stderr_tail())
        pid = int(reply.split()[1])
        self._exits.pop(pid, None)  # an earlier engine's status, if the pid was reused
        with in_transit():
            process = ForkedProcess(pid, stdin_w, stdout_r, stderr_r, self)
            engine = EngineProcess(self.argv, prints_answers=True, proc=process)
            pipes.hand_over()
        return engine

    def _reply(self, timeout_s: float) -> Optional[bytes]:
        """The server's answer to a request, within ``timeout_s``.

        :raises queue.Empty: when none comes by then, or sooner when the
            server stays stopped (SIGSTOP, a debugger: see
            :meth:`~subwabbit.engine_process.EngineProcess.stayed_stopped`),
            which would have held a replacement up for the whole start-up
            timeout
        """
        deadline = time.perf_counter() + timeout_s
        while True:
            now = time.perf_counter()
            try:
                return self._replies.get(timeout=max(0.0, min(deadline - now, STOPPED_POLL_S)))
            except queue.Empty:
                now = time.perf_counter()
                if self.engine.stayed_stopped(now):
                    raise queue.Empty("it is stopped (SIGSTOP, a debugger)") from None
                if now >= deadline:
                    raise queue.Empty(f"no answer within {timeout_s:g} s") from None

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the server (the engines it forked go on until their input closes)."""
        self.closed = self.stopped = True
        try:
            self._sock.close()
        except OSError:
            pass
        try:
            self.engine.close(timeout_s)
        except VowpalWabbitError as exc:
            logger.debug("the pool's fork server: %s", exc)

    def abandon_in_fork(self) -> None:
        """In a forked client process: let go without touching the server."""
        self.closed = self.stopped = True
        try:
            self._sock.close()
        except OSError:
            pass
        self.engine.abandon_in_fork()


class ForkServerUnavailable(VowpalWabbitError):
    """The model cannot be served by forked engines (it needs vw's own driver)."""

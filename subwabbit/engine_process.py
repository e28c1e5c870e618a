"""One running vw engine: spawning, pipe I/O and shutdown.

:class:`EngineProcess` knows nothing about lines, calls or predictions (that
is :mod:`subwabbit.core`). It owns the child process and its three pipes,
keeps the engine's stderr drained (so the engine can never block on it) and
remembers its tail for error messages, and offers the primitives the drivers
build on: write what the pipe takes, read what it holds, wait for a pipe with
a deadline, close; and, in a forked child, let go of a parent's engine
without touching it.
"""

import collections
import errno
import logging
import os
import re
import select
import struct
import subprocess
import sys
import threading
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Sequence

try:  # POSIX only; `import subwabbit` must still work elsewhere
    import fcntl
    import termios
except ImportError:  # pragma: no cover - not on Linux
    fcntl = termios = None  # type: ignore[assignment]

from .errors import (VowpalWabbitEngineExitedError, VowpalWabbitError, VowpalWabbitStartupError,
                     VowpalWabbitTimeoutError, describe_returncode)

if TYPE_CHECKING:  # for the annotation of warm_channel only
    from .core.channel import Channel

logger = logging.getLogger("subwabbit.engine")

#: How vw reports an example that stopped its driver (``[error] vw example
#: #12(multiclass.cc:52): Malformed example: ...``).
_EXAMPLE_ERROR = re.compile(r"vw:? example #\d+")

_READ_CHUNK = 1 << 16
_STDERR_TAIL_LINES = 50
#: The bytes of one stderr line that are logged and kept for error messages.
_STDERR_LINE_LIMIT = 4096
# select() takes a timeout with microsecond resolution (poll() rounds to whole
# milliseconds, which is a tenth of a 10 ms budget); it only handles fds below
# FD_SETSIZE, so poll() is the fallback for busy processes.
SELECT_FD_LIMIT = 1024
# How long an error report waits for a dead engine's exit status and last words.
_EXIT_STATUS_WAIT_S = 1.0

#: How long :meth:`EngineProcess.abort` waits for a killed engine to be reaped.
ABORT_WAIT_S = 5.0

#: How long a closing engine may stay stopped (SIGSTOP, a debugger) before
#: it is killed: a stopped engine never reads the end of its input, and
#: waiting for it took most of ``close()``'s timeout.
STOPPED_GRACE_S = 0.2
#: How often the state of an engine (or fork server) is looked at while
#: close() waits for it to exit (or a fork request for its answer).
STOPPED_POLL_S = 0.05


class _SharedStream:
    """A stream that a reader thread and the engine's owner both use: it is
    closed by whichever of them lets go last, so that the thread never reads
    a closed (or reused) descriptor and the owner, who may stop waiting for
    the thread, never leaves it open."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._holders = {"reader", "owner"}

    def let_go(self, holder: str) -> None:
        with self._lock:
            self._holders.discard(holder)
            last = not self._holders
        if last:
            self._stream.close()


def _forward_stderr(fd: int, tail: Deque[str], pid: int, shared: _SharedStream) -> None:
    """Thread body: read the engine's stderr until EOF, log it, keep its tail."""
    try:
        _log_stderr(fd, tail, pid)
    finally:
        shared.let_go("reader")


def _log_stderr(fd: int, tail: Deque[str], pid: int) -> None:
    # Only the new chunk is split, and a line keeps its first
    # _STDERR_LINE_LIMIT bytes: splitting all that a line without a newline
    # had printed so far at every read made an engine that printed a long one
    # wait for its stderr pipe (a line of N bytes cost O(N**2)), and the whole
    # line went into the log and into error messages.
    head = b""  # the start of the line whose newline has not come
    dropped = 0  # the bytes of that line beyond _STDERR_LINE_LIMIT
    while True:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except OSError:
            chunk = b""
        if not chunk:
            break
        pieces = chunk.split(b"\n")
        last = len(pieces) - 1
        for index, piece in enumerate(pieces):
            room = _STDERR_LINE_LIMIT - len(head)
            if len(piece) > room:
                dropped += len(piece) - room
                piece = piece[:room]
            head += piece
            if index < last:  # its newline came
                _log_stderr_line(head, dropped, tail, pid, complete=True)
                head, dropped = b"", 0
    _log_stderr_line(head, dropped, tail, pid, complete=False)


def _log_stderr_line(raw: bytes, dropped: int, tail: Deque[str], pid: int,
                     complete: bool) -> None:
    """Log one line of the engine's stderr and keep it in ``tail`` (not an empty one).

    :param dropped: how many bytes of the line were not kept
    :param complete: whether its newline came (else it is logged as a warning)
    """
    line = raw.decode("utf-8", "replace").rstrip()
    if dropped:
        line += f" [... {dropped} more bytes]"
    if not line:
        return
    tail.append(line)
    level = logging.INFO if complete and line.startswith("[info]") else logging.WARNING
    logger.log(level, "vw[%d]: %s", pid, line)


def _discard_stdout(fd: int, pid: int, shared: _SharedStream) -> None:
    """Thread body for write-only engines: stdout should stay silent; log what is not."""
    try:
        while True:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except OSError:
                return
            if not chunk:
                return
            logger.warning("vw[%d] wrote to stdout of a write-only process: %r", pid,
                           chunk[:200])
    finally:
        shared.let_go("reader")


def wait_for_fds(read_fd: Optional[int], write_fd: Optional[int],
                 deadline: Optional[float]) -> bool:
    """Sleep until ``read_fd`` is readable or ``write_fd`` writable, or the deadline.

    EOF and errors count as ready: the next read or write reports them.

    :param read_fd: a descriptor to watch for input, or ``None``
    :param write_fd: a descriptor to watch for space to write, or ``None``
    :param deadline: a :func:`time.perf_counter` value, or ``None`` to wait indefinitely
    :returns: whether a descriptor is ready (``False``: the deadline passed)
    """
    if deadline is None:
        timeout: Optional[float] = None
    else:
        timeout = deadline - time.perf_counter()
        if timeout <= 0:
            timeout = 0.0
    readers = [] if read_fd is None else [read_fd]
    writers = [] if write_fd is None else [write_fd]
    if max(readers + writers, default=0) < SELECT_FD_LIMIT:
        ready_r, ready_w, _ = select.select(readers, writers, [], timeout)
        return bool(ready_r or ready_w)
    poller = select.poll()
    if read_fd is not None:
        poller.register(read_fd, select.POLLIN)
    if write_fd is not None:
        poller.register(write_fd, select.POLLOUT)
    # Round down: waking a little early costs one more loop, waking late misses the deadline.
    return bool(poller.poll(None if timeout is None else int(timeout * 1000)))


def shutdown_schedule(deadline: float, timeout_s: float) -> "tuple[float, float]":
    """When a shutdown that must end by ``deadline`` (``timeout_s`` from its
    start) sends SIGTERM and SIGKILL: a second and a fifth of a second before
    the end, at most half and a quarter of ``timeout_s``.

    :returns: ``(terminate_at, kill_at)``
    """
    return deadline - min(1.0, timeout_s / 2), deadline - min(0.2, timeout_s / 4)


#: ``Popen`` arguments that start an engine in a process group of its own
#: (Python 3.11 and later; before, it shares the client's and gets its ^C).
_OWN_PROCESS_GROUP: Dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {}


def _process_state(pid: int) -> Optional[str]:
    """The state letter of ``/proc/PID/stat`` (``None`` when unknown)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


# ---------------------------------------------------------------- fork safety

#: Held while an engine's descriptors are created and handed to an object
#: that :data:`_HOLDERS` tracks (see :func:`in_transit`); ``os.fork()`` takes
#: it too, so that a fork never copies descriptors that nothing tracks yet.
#: Reentrant: a fork server's start holds it while its engine spawns.
_TRANSIT_LOCK = threading.RLock()

#: Every object of this process that holds descriptors of an engine, from
#: their creation on: engines, fork servers and a fork's pipes not yet an
#: engine's (:class:`LooseDescriptors`). Those a client or pool lists are
#: also let go by its own at-fork hook; this covers the others, those in
#: transit: started or closed on another thread (a replacement, a reload's
#: new and old engines, a fork server spawning) or held by a task.
_HOLDERS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def in_transit() -> "threading.RLock":
    """The lock under which engine descriptors are created and tracked
    (``with in_transit(): ... track_for_fork(holder)``)."""
    return _TRANSIT_LOCK


def track_for_fork(holder: Any) -> None:
    """Let ``holder`` go (``holder.abandon_in_fork()``) in every process
    forked from this one (call with :func:`in_transit` held)."""
    _HOLDERS.add(holder)


def _before_fork() -> None:
    _TRANSIT_LOCK.acquire()  # pylint: disable=consider-using-with


def _after_fork_in_parent() -> None:
    _TRANSIT_LOCK.release()


def after_fork_in_child() -> None:
    """In a forked child: let go of every engine descriptor the parent held
    (closing only this process's copies: the parent's engines still see EOF
    when the parent closes them, and no output of theirs is read here).
    Registered as an at-fork hook; see also
    :func:`~subwabbit.client.let_go_after_unhooked_fork`."""
    global _TRANSIT_LOCK  # pylint: disable=global-statement
    _TRANSIT_LOCK = threading.RLock()
    holders = list(_HOLDERS)
    _HOLDERS.clear()
    for holder in holders:
        try:
            holder.abandon_in_fork()
        except Exception:  # pylint: disable=broad-except
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=after_fork_in_child)


class LooseDescriptors:
    """Raw descriptors of an engine being made (a fork server's fork):
    closed in a forked child until :meth:`hand_over` gives them to an
    engine. Create it, and hand it over, with :func:`in_transit` held."""

    def __init__(self, fds: Sequence[int]) -> None:
        self.fds = list(fds)
        track_for_fork(self)

    def close(self, fds: Optional[Sequence[int]] = None) -> None:
        """Close ``fds`` (default: all still held)."""
        with _TRANSIT_LOCK:
            for fd in list(self.fds if fds is None else fds):
                if fd in self.fds:
                    self.fds.remove(fd)
                    os.close(fd)

    def hand_over(self) -> None:
        """Forget the descriptors: an engine tracked for fork holds them now."""
        self.fds = []

    def abandon_in_fork(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


class EngineProcess:
    """A running engine with pipes on stdin, stdout and stderr.

    The constructor only spawns the child; the drivers check that it answers
    (:func:`subwabbit.sync_driver.start_engine`, or the asyncio client's own).

    :param argv: the full command line
    :param prints_answers: whether the engine prints answers on stdout (a
        write-only engine does not: a thread then drains and logs its stdout)
    :raises VowpalWabbitStartupError: when the engine cannot be run at all
    """

    def __init__(self, argv: Sequence[str], *, prints_answers: bool = True,
                 proc: Optional[Any] = None, env: Optional[Dict[str, str]] = None,
                 pass_fds: Sequence[int] = ()) -> None:
        self.argv = list(argv)
        self.prints_answers = prints_answers
        self._stderr_tail: Deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
        self._closed = False
        #: whether the engine was started with a blank (core.channel.START_BLANK),
        #: which the first line written continues (see core.channel.Channel)
        self.started_with_blank = False
        self._abandoned = False
        self._killed_by_us = False
        self._failure_reported = False
        #: when the engine was first seen stopped, and is still (see stayed_stopped)
        self._stopped_since: Optional[float] = None
        #: when it was last seen stopped
        self._stopped_seen_at = 0.0
        if proc is not None:
            # Started elsewhere (a fork server's child): a Popen-like object
            # with pid, stdin, stdout, stderr, returncode, poll, wait, kill,
            # terminate.
            with _TRANSIT_LOCK:
                self.proc = proc
                track_for_fork(self)
        else:
            try:
                # In a process group of its own: the terminal's ^C (or a signal
                # to the client's process group) reaches the client, which closes
                # the engine when it is done, and not the engine under a call
                # that a graceful shutdown still serves. An engine whose client
                # died ends all the same: its input closes. (Not a session of
                # its own: with the kernel's autogroup scheduling, a new session
                # is scheduled as a group apart from the client, which gave a
                # pool of 2 on 2 cores 8% fewer predictions within 10 ms.)
                with _TRANSIT_LOCK:  # (no fork between the pipes' creation and this)
                    self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                        self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, bufsize=0, env=env, pass_fds=tuple(pass_fds),
                        **_OWN_PROCESS_GROUP)
                    track_for_fork(self)
            except OSError as exc:
                raise VowpalWabbitStartupError(
                    f"cannot run the vw engine {self.argv[0]!r}: {exc}", argv=self.argv) from exc
        self.pid = self.proc.pid
        #: the process that started the engine (a forked child must not touch it)
        self.owner_pid = os.getpid()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None
        self.stdin_fd = self.proc.stdin.fileno()
        self.stdout_fd = self.proc.stdout.fileno()
        # Every wait goes through select/poll (or the event loop) with a
        # deadline, so that no call can hang in a read or a write.
        os.set_blocking(self.stdin_fd, False)
        os.set_blocking(self.stdout_fd, False)
        self._stderr = _SharedStream(self.proc.stderr)
        self._stderr_thread = threading.Thread(
            target=_forward_stderr,
            args=(self.proc.stderr.fileno(), self._stderr_tail, self.pid, self._stderr),
            name=f"subwabbit-vw{self.pid}-stderr", daemon=True)
        self._stderr_thread.start()
        self._stdout_thread: Optional[threading.Thread] = None
        #: a write-only engine's stdout, which its reader thread shares
        self._stdout: Optional[_SharedStream] = None
        #: the channel a warm-up left, for the pool to serve the engine on
        #: (it may owe the answers to warm-up lines to no call: see
        #: :func:`~subwabbit.sync_driver.warm_up`); ``None``: a new one
        self.warm_channel: Optional["Channel"] = None
        logger.info("started vw[%d]: %s", self.pid, " ".join(self.argv))

    def drain_stdout_in_background(self) -> None:
        """For a write-only engine, once it has started: a thread reads and
        logs whatever it prints on stdout (it should print nothing)."""
        os.set_blocking(self.stdout_fd, True)  # the reader thread blocks in read()
        self._stdout = _SharedStream(self.proc.stdout)
        self._stdout_thread = threading.Thread(
            target=_discard_stdout, args=(self.stdout_fd, self.pid, self._stdout),
            name=f"subwabbit-vw{self.pid}-stdout", daemon=True)
        self._stdout_thread.start()

    # ------------------------------------------------------------------ state

    @property
    def returncode(self) -> Optional[int]:
        """The engine's exit status, or ``None`` while it runs."""
        return self.proc.poll()

    def certainly_running(self) -> bool:
        """Whether the engine runs, so that its pid is still its own: a
        forked engine (not this process's child) is also asked through its
        pidfd, since its exit status comes later than its end."""
        if self.proc.poll() is not None:
            return False
        has_ended = getattr(self.proc, "has_ended", None)
        return has_ended is None or not has_ended()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (or the engine was let go in a fork)."""
        return self._closed

    def stderr_tail(self) -> str:
        """The last lines the engine wrote to stderr."""
        return "\n".join(self._stderr_tail)

    def describe(self) -> str:
        """``running``, ``exited with code N`` or ``killed by SIGX``, for reprs and logs."""
        if self._abandoned:
            return f"left to process {self.owner_pid}"
        code = self.returncode
        return "running" if code is None else describe_returncode(code)

    def add_context(self, error: VowpalWabbitError) -> VowpalWabbitError:
        """Fill in the argv, exit status and stderr tail of an error raised
        by the protocol core, which knows none of them."""
        if error.argv is None:
            error.argv = list(self.argv)
        if error.returncode is None and not self._abandoned:
            error.returncode = self.returncode
        if not error.stderr_tail:
            error.stderr_tail = self.stderr_tail()
        return error

    # -------------------------------------------------------------------- I/O

    def write_some(self, data: memoryview, deadline: Optional[float] = None) -> int:
        """Write what the stdin pipe takes now.

        :param deadline: how long an error report may wait for the exit status
        :returns: the number of bytes written (0 when the pipe is full)
        :raises VowpalWabbitEngineExitedError: when the engine closed its stdin
        :raises VowpalWabbitError: when this engine was closed or let go: its
            descriptors' numbers may belong to another engine or file by now
        """
        if self._closed:
            raise self._closed_error()
        try:
            return os.write(self.stdin_fd, data)
        except BlockingIOError:
            return 0
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise self.exited_error("the vw engine stopped reading its input",
                                    deadline=deadline) from exc

    def read_some(self, deadline: Optional[float] = None) -> bytes:
        """Read what stdout holds now.

        :param deadline: how long an error report may wait for the exit status
        :returns: the bytes (empty when nothing is there yet)
        :raises VowpalWabbitEngineExitedError: at EOF
        :raises VowpalWabbitError: when this engine was closed or let go
        """
        if self._closed:
            raise self._closed_error()
        try:
            chunk = os.read(self.stdout_fd, _READ_CHUNK)
        except BlockingIOError:
            return b""
        if not chunk:
            raise self.exited_error("the vw engine closed its output", deadline=deadline)
        return chunk

    def _closed_error(self) -> VowpalWabbitError:
        return VowpalWabbitError(
            f"vw[{self.pid}] was closed or let go (restart, reload, close or fork): nothing "
            "more is read from it or written to it", argv=list(self.argv))

    def wait(self, read: bool, write: bool, until: Optional[float]) -> bool:
        """Sleep until stdout is readable (``read``), stdin writable
        (``write``), or ``until`` (a :func:`time.perf_counter` value; ``None``:
        no limit).

        :returns: whether a pipe is ready
        """
        return wait_for_fds(self.stdout_fd if read else None, self.stdin_fd if write else None,
                            until)

    def read_until_eof(self, deadline: float) -> bytes:
        """Collect what stdout still holds, until EOF or the deadline (for the
        message of an engine that failed at start-up)."""
        data = b""
        while wait_for_fds(self.stdout_fd, None, deadline):
            try:
                chunk = os.read(self.stdout_fd, _READ_CHUNK)
            except BlockingIOError:
                continue
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        return data

    def unread_input_bytes(self) -> Optional[int]:
        """Bytes written to stdin that the engine has not read (``None``: unknown)."""
        if fcntl is None or termios is None:
            return None
        try:
            raw = fcntl.ioctl(self.stdin_fd, termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return None
        return int(struct.unpack("i", raw)[0])

    def exited_error(self, message: str, output: bytes = b"",
                     deadline: Optional[float] = None) -> VowpalWabbitEngineExitedError:
        """Build the error for an engine that closed its pipes, with its exit
        status and the tail of its stderr.

        :param message: what the caller was doing
        :param output: stdout text that explains the failure
        :param deadline: the caller's deadline: the exit status and the last
            stderr lines are awaited until then, one second at most
        """
        until = time.perf_counter() + _EXIT_STATUS_WAIT_S
        if deadline is not None:
            until = min(until, deadline)
        returncode = self._wait_until(until)
        self._stderr_thread.join(timeout=max(0.0, until - time.perf_counter()))
        self._failure_reported = True
        return VowpalWabbitEngineExitedError(
            message, argv=self.argv, returncode=returncode, stderr_tail=self.stderr_tail(),
            output=output.decode("utf-8", "replace"))

    def startup_error(self, message: str, output: bytes = b"",
                      wait_for_exit: bool = True) -> VowpalWabbitStartupError:
        """Build the error for an engine that failed to start.

        :param wait_for_exit: wait (a second at most) for the exit status and
            the last stderr lines; ``False`` for an engine that is still running
            (it is killed by the caller)
        """
        if wait_for_exit:
            error: VowpalWabbitError = self.exited_error(message, output=output)
        else:
            error = VowpalWabbitError(message, argv=self.argv, stderr_tail=self.stderr_tail(),
                                      output=output.decode("utf-8", "replace"))
        return VowpalWabbitStartupError(error.message, argv=self.argv, returncode=error.returncode,
                                        stderr_tail=error.stderr_tail, output=error.output)

    def exited_at_startup(self, output: bytes = b"", read_s: float = 1.0
                          ) -> VowpalWabbitStartupError:
        """The error for an engine that exited during start-up: what it still
        prints on stdout (a real vw prints fatal errors there) is read for up
        to ``read_s`` and goes into the message with ``output``."""
        output += self.read_until_eof(time.perf_counter() + read_s)
        return self.startup_error("the vw engine exited during start-up", output)

    def set_pipe_size(self, size_bytes: int) -> int:
        """Resize the stdin pipe (Linux ``F_SETPIPE_SZ``); returns the size granted.

        :raises ValueError: when the system refuses the size (``size_bytes``
            is the client's ``pipe_buffer_size_bytes``)
        """
        try:
            return fcntl.fcntl(self.stdin_fd, 1031, size_bytes)  # F_SETPIPE_SZ
        except OSError as exc:
            raise ValueError(
                f"pipe_buffer_size_bytes={size_bytes!r}: the system refused to resize the "
                f"engine's input pipe to it ({exc.strerror}); without CAP_SYS_RESOURCE a "
                "process may ask for at most /proc/sys/fs/pipe-max-size bytes") from exc

    # -------------------------------------------------------------- shutdown

    def abort(self, timeout: float = ABORT_WAIT_S) -> None:
        """Tear down at once: kill, reap, close pipes (after a failed start).

        Returns within about ``timeout``: an engine that a stopped fork server
        forked is not reaped until the server runs again, and its exit status
        is then left to the server (logged).
        """
        if self._abandoned:
            return
        self._closed = True
        self._killed_by_us = True
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            logger.warning("vw[%d] was killed but not reaped within %g s; leaving it", self.pid,
                           timeout)
        self._close_pipes()

    def abandon_in_fork(self) -> None:
        """In a forked child: let go of the parent's engine without touching
        it: no signal, no EOF (the parent still holds its own ends of the
        pipes), no wait. Only this process's copies of the pipes are closed,
        so that the engine sees EOF when the parent closes it."""
        if self._abandoned:
            return
        self._abandoned = self._closed = True
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        # Not our child: subprocess must never wait for it or signal it here.
        self.proc.returncode = 0

    def _own_pipes(self) -> List[Any]:
        """The pipes to the engine that this object alone closes: stdin, and
        stdout unless a reader thread shares it (a write-only engine's: see
        :meth:`_let_go_of_shared_streams`)."""
        return [self.proc.stdin] if self._stdout else [self.proc.stdin, self.proc.stdout]

    def _close_pipes(self, deadline: Optional[float] = None) -> None:
        for stream in self._own_pipes():
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        if self._stderr_thread.is_alive():
            wait_s = 1.0 if deadline is None else max(0.0, deadline - time.perf_counter())
            self._stderr_thread.join(timeout=wait_s)
        self._let_go_of_shared_streams()

    def _let_go_of_shared_streams(self) -> None:
        """Our share of the streams a reader thread also reads: a stream still
        held open by a grandchild (or by an engine not yet reaped) is closed
        by its reader thread when it sees EOF."""
        if self._stdout is not None:
            self._stdout.let_go("owner")
        self._stderr.let_go("owner")

    def final_model_lost(self, timeout_s: float, stopped: bool = False
                         ) -> VowpalWabbitTimeoutError:
        """The error of a close that had to terminate an engine started with
        ``-f``: its model is not written, or not completely. (subwabbit 2.x
        raised ``subprocess.TimeoutExpired`` there: returning would pass off
        a missing, or an older, model file as written.)

        :param stopped: the engine was killed because it stayed stopped
            (:meth:`stayed_stopped`), not for want of time
        """
        if stopped:
            message = ("the vw engine was stopped (SIGSTOP, a debugger) when close() ran "
                       "and was killed: its -f model was not written (or not completely)")
        else:
            message = (f"the vw engine did not finish within close()'s timeout of "
                       f"{timeout_s:g} s and was terminated: its -f model was not written "
                       "(or not completely); pass close() a longer timeout")
        return VowpalWabbitTimeoutError(message, argv=self.argv,
                                        returncode=self.proc.returncode,
                                        stderr_tail=self.stderr_tail())

    def stayed_stopped(self, now: float) -> bool:
        """Whether the engine has been stopped (SIGSTOP, a debugger) for
        :data:`STOPPED_GRACE_S` by ``now``, as seen by the calls of this
        method: the first call that finds it stopped starts the count, and
        so does one that comes more than :data:`STOPPED_GRACE_S` after the
        last (the engine may have run in between: an earlier stop, seen by
        an earlier close or fork request, is not this one). A stopped engine
        cannot finish, so a close kills it then."""
        if _process_state(self.pid) not in ("T", "t"):
            self._stopped_since = None
            return False
        if self._stopped_since is None or now - self._stopped_seen_at > STOPPED_GRACE_S:
            self._stopped_since = now
        self._stopped_seen_at = now
        return now - self._stopped_since >= STOPPED_GRACE_S

    def _drain_stdout(self, until: float) -> bool:
        """Read and drop what the engine prints until ``until``.

        :returns: ``False`` once stdout is at its end (or failed)
        """
        try:
            while time.perf_counter() < until and wait_for_fds(self.stdout_fd, None, until):
                if not os.read(self.stdout_fd, _READ_CHUNK):
                    return False
        except OSError:
            return False
        return True

    def _exit_unless_stopped(self, until: float) -> "tuple[Optional[int], bool]":
        """Wait until ``until`` for the engine to exit, discarding what it
        prints (unless a reader thread does), and give up early once it has
        stayed stopped (:meth:`stayed_stopped`).

        :returns: the exit status (``None``: it still runs), and whether it
            is stopped
        """
        drain = self._stdout_thread is None
        while True:
            step_end = min(until, time.perf_counter() + STOPPED_POLL_S)
            if drain:
                drain = self._drain_stdout(step_end)
            code = self._wait_until(step_end)
            if code is not None:
                return code, False
            now = time.perf_counter()
            if self.stayed_stopped(now):
                return None, True
            if now >= until:
                return None, False

    def close(self, timeout_s: float = 30.0, *, final_model: bool = False) -> Optional[int]:
        """Close stdin so that the engine finishes (and writes ``-f`` models),
        discard what it still prints, and reap it; idempotent.

        Returns within ``timeout_s``: an engine still running when most of it
        has passed gets SIGTERM, and SIGKILL shortly before the end (a second
        and a fifth of a second before, at most half and a quarter of
        ``timeout_s``). An engine that stays stopped (SIGSTOP, a debugger)
        for :data:`STOPPED_GRACE_S` meanwhile cannot finish: it gets SIGKILL
        then.

        :param final_model: the engine writes a ``-f`` model as it exits: an
            engine that has to be terminated (or killed) has not written it,
            which raises
        :returns: the exit status (``None`` if even SIGKILL did not end the
            engine in time; a background thread then reaps it)
        :raises VowpalWabbitEngineExitedError: when the engine exits with a
            non-zero status of its own after a clean shutdown request, or
            with 0 after reporting an example that stopped it, and no
            earlier error reported its failure
        :raises VowpalWabbitTimeoutError: with ``final_model``, when the
            engine had to be terminated (its model is not written)
        """
        if self._closed:
            return self.proc.returncode
        self._closed = True
        deadline = time.perf_counter() + timeout_s
        terminate_at, kill_at = shutdown_schedule(deadline, timeout_s)
        term_margin = deadline - terminate_at
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        code, stopped = self._exit_unless_stopped(terminate_at)
        terminate_sent = code is None
        if stopped:
            self._killed_by_us = True
            logger.warning("vw[%d] is stopped (SIGSTOP, a debugger) and cannot finish; "
                           "killing it", self.pid)
            self.proc.kill()
            code = self._wait_until(deadline)
        elif terminate_sent:
            self._killed_by_us = True
            logger.warning("vw[%d] did not exit within %.1f s of closing its input; terminating",
                           self.pid, timeout_s - term_margin)
            self.proc.terminate()
            code = self._wait_until(kill_at)
        if code is None and not stopped:
            logger.warning("vw[%d] ignored SIGTERM; killing it", self.pid)
            self.proc.kill()
            code = self._wait_until(deadline)
        if code is None:
            logger.error("vw[%d] survived SIGKILL for %.2f s; reaping it in the background",
                         self.pid, timeout_s)
            self._reap_in_background()
        if self._stdout_thread is not None:
            self._stdout_thread.join(timeout=max(0.0, deadline - time.perf_counter()))
        self._close_pipes(deadline)
        if final_model and terminate_sent:
            raise self.final_model_lost(timeout_s, stopped)
        if code is None:
            return None
        logger.info("vw[%d] %s", self.pid, describe_returncode(code))
        failure = self.own_failure(code)
        if failure is not None:
            raise failure
        return code

    def own_failure(self, code: int) -> Optional[VowpalWabbitEngineExitedError]:
        """The error of an engine that exited with status ``code`` on its own
        (not killed by this object) after a failure no earlier error
        reported, or ``None``; the failure counts as reported from then on.
        A non-zero status is one; so is 0 after reporting an example that
        stopped it: the wheel's driver stops at an example it cannot read and
        exits 0 as if its input had ended (the vw executable exits 1)."""
        if self._killed_by_us or self._failure_reported:
            return None
        if code != 0:
            self._failure_reported = True
            return VowpalWabbitEngineExitedError(
                "the vw engine failed while shutting down", argv=self.argv, returncode=code,
                stderr_tail=self.stderr_tail())
        if _EXAMPLE_ERROR.search(self.stderr_tail()):
            self._failure_reported = True
            return VowpalWabbitEngineExitedError(
                "the vw engine stopped at an example it could not read: the examples sent "
                "after it were not learnt, and a -f model it wrote (over any file of that "
                "name) lacks them",
                argv=self.argv, returncode=code, stderr_tail=self.stderr_tail())
        return None

    def close_killed(self) -> None:
        """Kill the engine (if it still runs), close its pipes now and reap it
        in the background: never waits (for a call that had to leave its
        engine's pipes open until it ended; see ``close()`` of the model
        classes). Idempotent."""
        if self._closed or self._abandoned:
            return
        self._closed = True
        self._killed_by_us = True
        if self.proc.poll() is None:
            self.proc.kill()
        self._close_pipes(time.perf_counter())
        if self.proc.poll() is None:
            self._reap_in_background()

    def _reap_in_background(self) -> None:
        """Wait for the engine's exit status on a thread of its own."""
        threading.Thread(target=self.proc.wait, name=f"subwabbit-vw{self.pid}-reaper",
                         daemon=True).start()

    def close_input(self) -> None:
        """Close the engine's stdin (it then finishes, writes a ``-f`` model and exits)."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass

    def discard_output(self) -> bool:
        """Read and drop what stdout holds now (while the engine shuts down).

        :returns: ``False`` at EOF (or when stdout is another thread's)
        """
        if self._stdout_thread is not None:
            return False
        try:
            return bool(os.read(self.stdout_fd, _READ_CHUNK))
        except BlockingIOError:
            return True
        except OSError:
            return False

    def terminate(self) -> None:
        """Send SIGTERM now."""
        self._killed_by_us = True
        if self.proc.poll() is None:
            self.proc.terminate()

    def kill(self) -> None:
        """Send SIGKILL now, unless the engine has exited already (then its
        exit status is its own); the pipes stay open until :meth:`close`."""
        if self.proc.poll() is None:
            self._killed_by_us = True
            self.proc.kill()

    def _await_exit_unless_stopped(self, wait_s: float) -> None:
        """Wait for the engine to exit, up to ``wait_s``; give up at once if it
        is stopped (SIGSTOP, a debugger): it would never finish."""
        deadline = time.perf_counter() + wait_s
        while time.perf_counter() < deadline:
            if self._wait_until(min(deadline, time.perf_counter() + 0.05)) is not None:
                return
            if _process_state(self.pid) in ("T", "t", "Z", None):
                return

    def _wait_until(self, deadline: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            return None

    def release(self, final_model_wait_s: float = 0.0) -> None:
        """Cleanup for a process that was never closed: close our ends of the
        pipes (the engine then exits by itself) and reap it from a background
        thread.

        :param final_model_wait_s: for an engine that writes a ``-f`` model at
            the end: wait up to this long for it to exit (so that the model is
            on disk when this returns), unless it is stopped; 0: never wait
        """
        if self._closed:
            return
        self._closed = True
        for stream in self._own_pipes():
            try:
                if stream is not None:
                    stream.close()
            except OSError as exc:
                if exc.errno != errno.EBADF:
                    raise
        self._let_go_of_shared_streams()
        if final_model_wait_s > 0:
            self._await_exit_unless_stopped(final_model_wait_s)
        if self.proc.poll() is None and not sys.is_finalizing():
            # (At interpreter exit no thread can start: the engine, its input
            # closed, exits by itself and is reaped by the system.)
            self._reap_in_background()
        # Last: where ResourceWarning is an error (-W error, pytest's
        # filterwarnings = error), it raises, and the engine must be let go first.
        warnings.warn(f"subwabbit: vw[{self.pid}] was not closed; call close() or use 'with'",
                      ResourceWarning, stacklevel=3)


def close_quietly(engine: EngineProcess, timeout: float) -> None:
    """Close an engine, logging (not raising) its failure."""
    try:
        engine.close(timeout)
    except VowpalWabbitError as exc:
        logger.debug("closing vw[%d]: %s", engine.pid, exc)


#: The nice value an engine gets when it is retired (see :func:`retire_quietly`).
RETIRING_NICE = 19


def retire_quietly(engine: EngineProcess, timeout: float) -> None:
    """Close an engine that serves no more while others do (an old model's
    engine after a reload, a failed one), at the lowest CPU priority.

    What a process does on its way out (a fork server frees the model, every
    engine gives back its memory) otherwise takes CPU from the calls in
    progress. With this and the new engines' warm-up (see
    :class:`~subwabbit.engine_group.EngineGroup`), the first call on a
    reloaded pool of 2 returned about 1,700 predictions within 10 ms on 2
    cores instead of 560 to 800 (``python -m benchmarks.reload``; steady
    calls about 2,900). Failures are logged and ignored.
    """
    lower_for_exit(engine)
    close_quietly(engine, timeout)


def lower_for_exit(engine: EngineProcess) -> None:
    """Lower every thread of a running engine (or fork server) that is about
    to be closed to :data:`RETIRING_NICE` (see :func:`retire_quietly`; a
    process may always lower its own children). An engine that has ended is
    left alone: its pid might be another process's once it has been reaped."""
    if not engine.certainly_running():
        return
    for tid in threads_of(engine.pid):
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < RETIRING_NICE:
                os.setpriority(os.PRIO_PROCESS, tid, RETIRING_NICE)
        except (AttributeError, OSError) as exc:
            logger.debug("cannot lower the priority of vw[%d] thread %d: %s", engine.pid, tid,
                         exc)


def threads_of(pid: int) -> List[int]:
    """The thread ids of process ``pid`` (Linux: each has its own nice value
    and scheduling policy), or ``[pid]`` where they cannot be listed."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]

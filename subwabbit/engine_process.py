"""One running vw engine: spawning, the start-up check, pipe I/O and shutdown.

:class:`EngineProcess` knows nothing about formatters or requests. It owns the
child process and its three pipes, keeps the engine's stderr drained (so the
engine can never block on it) and remembers its tail for error messages, and
offers the primitives the model classes build on: write bytes, read whole
lines, wait for a pipe with a deadline, save the model, close.
"""

import collections
import errno
import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time
import uuid
import warnings
from typing import Deque, List, Optional, Sequence

try:  # POSIX only; `import subwabbit` must still work elsewhere
    import fcntl
    import termios
except ImportError:  # pragma: no cover - not on Linux
    fcntl = termios = None  # type: ignore[assignment]

from .errors import (VowpalWabbitEngineExitedError, VowpalWabbitError, VowpalWabbitStartupError,
                     VowpalWabbitTimeoutError, describe_returncode)

logger = logging.getLogger("subwabbit.engine")

#: A featureless, unlabelled example: it produces exactly one prediction and
#: teaches the model nothing. Used to see that the engine is alive and to
#: mark a point in the output stream.
PROBE_LINE = b"|\n"

_READ_CHUNK = 1 << 16
_STDERR_TAIL_LINES = 50
# select() takes a timeout with microsecond resolution (poll() rounds to whole
# milliseconds, which is a tenth of a 10 ms budget); it only handles fds below
# FD_SETSIZE, so poll() is the fallback for busy processes.
_SELECT_FD_LIMIT = 1024
# How long an error report waits for a dead engine's exit status and last words.
_EXIT_STATUS_WAIT_S = 1.0


def _forward_stderr(fd: int, tail: Deque[str], pid: int) -> None:
    """Thread body: read the engine's stderr until EOF, log it, keep its tail."""
    pending = b""
    while True:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except OSError:
            chunk = b""
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip()
            if not line:
                continue
            tail.append(line)
            level = logging.INFO if line.startswith("[info]") else logging.WARNING
            logger.log(level, "vw[%d]: %s", pid, line)
    if pending.strip():
        line = pending.decode("utf-8", "replace").rstrip()
        tail.append(line)
        logger.warning("vw[%d]: %s", pid, line)


def _discard_stdout(fd: int, pid: int) -> None:
    """Thread body for write-only engines: stdout should stay silent; log what is not."""
    while True:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except OSError:
            return
        if not chunk:
            return
        logger.warning("vw[%d] wrote to stdout of a write-only process: %r", pid, chunk[:200])


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
    if max(readers + writers, default=0) < _SELECT_FD_LIMIT:
        ready_r, ready_w, _ = select.select(readers, writers, [], timeout)
        return bool(ready_r or ready_w)
    poller = select.poll()
    if read_fd is not None:
        poller.register(read_fd, select.POLLIN)
    if write_fd is not None:
        poller.register(write_fd, select.POLLOUT)
    # Round down: waking a little early costs one more loop, waking late misses the deadline.
    return bool(poller.poll(None if timeout is None else int(timeout * 1000)))


class EngineProcess:
    """A running engine with pipes on stdin, stdout and stderr.

    :param argv: the full command line
    :param predictions_per_probe: how many stdout lines the engine prints for one
        example (1, or 3 in audit mode), or ``None`` when it prints no predictions
        (write-only)
    :param startup_timeout_s: how long the engine may take to show it is ready
    :raises VowpalWabbitStartupError: when the engine cannot be run, exits during
        start-up (invalid arguments, unreadable model), or stays silent too long
    """

    def __init__(self, argv: Sequence[str], *, predictions_per_probe: Optional[int],
                 startup_timeout_s: float) -> None:
        self.argv = list(argv)
        self._stderr_tail: Deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
        self._rbuf = bytearray()
        self._rbuf_lines = 0
        self._closed = False
        self._killed_by_us = False
        self._failure_reported = False
        try:
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, bufsize=0)
        except OSError as exc:
            raise VowpalWabbitStartupError(
                f"cannot run the vw engine {self.argv[0]!r}: {exc}", argv=self.argv) from exc
        self.pid = self.proc.pid
        assert self.proc.stdin is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None
        self.stdin_fd = self.proc.stdin.fileno()
        self.stdout_fd = self.proc.stdout.fileno()
        # Every wait goes through select/poll with a deadline, so that no call
        # can hang in a read or write on an engine that stopped answering.
        os.set_blocking(self.stdin_fd, False)
        os.set_blocking(self.stdout_fd, False)
        self._stderr_thread = threading.Thread(
            target=_forward_stderr, args=(self.proc.stderr.fileno(), self._stderr_tail, self.pid),
            name=f"subwabbit-vw{self.pid}-stderr", daemon=True)
        self._stderr_thread.start()
        self._stdout_thread: Optional[threading.Thread] = None
        logger.info("started vw[%d]: %s", self.pid, " ".join(self.argv))
        try:
            if predictions_per_probe is None:
                self._await_input_consumed(time.perf_counter() + startup_timeout_s)
                os.set_blocking(self.stdout_fd, True)  # its reader thread blocks in read()
                self._stdout_thread = threading.Thread(
                    target=_discard_stdout, args=(self.stdout_fd, self.pid),
                    name=f"subwabbit-vw{self.pid}-stdout", daemon=True)
                self._stdout_thread.start()
            else:
                self._await_probe(predictions_per_probe, time.perf_counter() + startup_timeout_s)
        except BaseException:
            self._abort()
            raise

    # ------------------------------------------------------------------ state

    @property
    def returncode(self) -> Optional[int]:
        """The engine's exit status, or ``None`` while it runs."""
        return self.proc.poll()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._closed

    def stderr_tail(self) -> str:
        """The last lines the engine wrote to stderr."""
        return "\n".join(self._stderr_tail)

    def describe(self) -> str:
        """``running``, ``exited with code N`` or ``killed by SIGX``, for reprs and logs."""
        code = self.returncode
        return "running" if code is None else describe_returncode(code)

    # --------------------------------------------------------------- start-up

    def _startup_failure(self, message: str, output: bytes = b"") -> VowpalWabbitStartupError:
        error = self.exited_error(message, output=output)
        return VowpalWabbitStartupError(error.message, argv=self.argv, returncode=error.returncode,
                                        stderr_tail=error.stderr_tail, output=error.output)

    def _read_until_eof(self, deadline: float) -> bytes:
        """Collect what stdout still holds, until EOF or the deadline."""
        data = bytes(self._rbuf)
        while wait_for_fds(self.stdout_fd, None, deadline):
            try:
                chunk = os.read(self.stdout_fd, _READ_CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                break
            data += chunk
        return data

    def _await_probe(self, lines: int, deadline: float) -> None:
        """Send :data:`PROBE_LINE` and wait for its prediction."""
        try:
            self.write_all(PROBE_LINE, deadline)
            answer = self.read_lines(lines, deadline)
        except VowpalWabbitEngineExitedError as exc:
            output = self._read_until_eof(time.perf_counter() + 1.0)
            raise self._startup_failure("the vw engine exited during start-up", output) from exc
        except VowpalWabbitTimeoutError as exc:
            raise self._startup_failure(
                "the vw engine did not answer a probe example during start-up "
                "(is the model multi-line, or is it still loading?)") from exc
        if answer[0].startswith(b"["):
            # A real vw prints fatal errors as log lines on stdout, then exits.
            output = b"\n".join(answer) + b"\n" + self._read_until_eof(time.perf_counter() + 2.0)
            raise self._startup_failure("the vw engine failed during start-up", output)

    def _unread_input_bytes(self) -> Optional[int]:
        if fcntl is None or termios is None:
            return None
        try:
            raw = fcntl.ioctl(self.stdin_fd, termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return None
        return int(struct.unpack("i", raw)[0])

    def _await_input_consumed(self, deadline: float) -> None:
        """Write-only start-up check: the engine reads stdin only once its
        arguments are accepted and its model loaded, so wait until it has read
        a probe example (or exited)."""
        self.write_all(PROBE_LINE, deadline)
        output = b""
        delay = 0.0005
        while True:
            unread = self._unread_input_bytes()
            if unread == 0 or unread is None:
                return
            if wait_for_fds(self.stdout_fd, None, min(deadline, time.perf_counter() + delay)):
                chunk = os.read(self.stdout_fd, _READ_CHUNK)
                if not chunk:
                    raise self._startup_failure("the vw engine exited during start-up", output)
                output += chunk
            if self.proc.poll() is not None:
                output += self._read_until_eof(time.perf_counter() + 1.0)
                raise self._startup_failure("the vw engine exited during start-up", output)
            if time.perf_counter() >= deadline:
                raise self._startup_failure(
                    "the vw engine did not start reading examples within the start-up timeout",
                    output)
            delay = min(delay * 2, 0.01)

    # -------------------------------------------------------------------- I/O

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

    def set_pipe_size(self, size_bytes: int) -> int:
        """Resize the stdin pipe (Linux ``F_SETPIPE_SZ``); returns the size granted."""
        return fcntl.fcntl(self.stdin_fd, 1031, size_bytes)  # F_SETPIPE_SZ

    def wait(self, read: bool, write: bool, deadline: Optional[float],
             idle_s: Optional[float], doing: str) -> bool:
        """Sleep until stdout is readable (``read``) or stdin writable (``write``).

        :param deadline: the caller's deadline (:func:`time.perf_counter`), or ``None``
        :param idle_s: the longest wait without the engine becoming ready; ``None``: no limit
        :param doing: what the caller was doing, for the error message
        :returns: ``True`` when ready, ``False`` when ``deadline`` passed first
        :raises VowpalWabbitTimeoutError: when ``idle_s`` passed first
        """
        limit = deadline
        idle_limit = None if idle_s is None else time.perf_counter() + idle_s
        if idle_limit is not None and (limit is None or idle_limit < limit):
            limit = idle_limit
        if wait_for_fds(self.stdout_fd if read else None, self.stdin_fd if write else None, limit):
            return True
        if limit is idle_limit:
            raise VowpalWabbitTimeoutError(
                f"the vw engine did not answer for {idle_s:g} s while {doing} "
                "(io_timeout_s); it may be stopped or stuck", argv=self.argv,
                returncode=self.returncode, stderr_tail=self.stderr_tail())
        return False

    def write_some(self, data: memoryview, deadline: Optional[float] = None) -> int:
        """Write what the stdin pipe takes now.

        :param deadline: how long an error report may wait for the exit status
        :returns: the number of bytes written (0 when the pipe is full)
        :raises VowpalWabbitEngineExitedError: when the engine closed its stdin
        """
        try:
            return os.write(self.stdin_fd, data)
        except BlockingIOError:
            return 0
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise self.exited_error("the vw engine stopped reading its input",
                                    deadline=deadline) from exc

    def write_all(self, data: bytes, deadline: Optional[float] = None,
                  idle_s: Optional[float] = None) -> None:
        """Write all of ``data``, waiting for pipe space.

        :param deadline: give up at this :func:`time.perf_counter` value
        :param idle_s: give up when the engine takes nothing for this many seconds
        :raises VowpalWabbitTimeoutError: when the deadline or ``idle_s`` passes first
        :raises VowpalWabbitEngineExitedError: when the engine closed its stdin
        """
        view = memoryview(data)
        while True:
            view = view[self.write_some(view, deadline):]
            if not view:
                return
            if not self.wait(False, True, deadline, idle_s, "writing to it") or (
                    deadline is not None and time.perf_counter() >= deadline):
                raise VowpalWabbitTimeoutError(
                    "timed out writing to the vw engine", argv=self.argv,
                    returncode=self.returncode, stderr_tail=self.stderr_tail())

    def read_available(self, deadline: Optional[float] = None) -> int:
        """Move what stdout holds now into the line buffer.

        :param deadline: how long an error report may wait for the exit status
        :returns: the number of bytes read (0: nothing available yet)
        :raises VowpalWabbitEngineExitedError: at EOF
        """
        try:
            chunk = os.read(self.stdout_fd, _READ_CHUNK)
        except BlockingIOError:
            return 0
        if not chunk:
            raise self.exited_error("the vw engine closed its output", deadline=deadline)
        self._rbuf += chunk
        self._rbuf_lines += chunk.count(b"\n")
        return len(chunk)

    @property
    def buffered_lines(self) -> int:
        """Complete lines read from stdout and not yet taken."""
        return self._rbuf_lines

    def take_lines(self, count: int) -> List[bytes]:
        """Take up to ``count`` complete lines (without their newlines) from the buffer."""
        count = min(count, self._rbuf_lines)
        if count <= 0:
            return []
        if count == self._rbuf_lines:
            end = self._rbuf.rfind(b"\n") + 1
            lines = bytes(self._rbuf[:end]).split(b"\n")
            del self._rbuf[:end]
            lines.pop()
        else:
            lines = bytes(self._rbuf).split(b"\n", count)
            self._rbuf = bytearray(lines.pop())
        self._rbuf_lines -= count
        return lines

    def read_lines(self, count: int, deadline: Optional[float] = None,
                   idle_s: Optional[float] = None) -> List[bytes]:
        """Read exactly ``count`` lines from stdout.

        :param deadline: give up at this :func:`time.perf_counter` value
        :param idle_s: give up when the engine prints nothing for this many seconds
        :raises VowpalWabbitTimeoutError: when the deadline or ``idle_s`` passes first
        :raises VowpalWabbitEngineExitedError: at EOF
        """
        while self._rbuf_lines < count:
            if self.read_available(deadline):
                continue
            if not self.wait(True, False, deadline, idle_s, "waiting for its predictions"):
                raise VowpalWabbitTimeoutError(
                    f"timed out waiting for {count - self._rbuf_lines} line(s) from the vw engine",
                    argv=self.argv, returncode=self.returncode, stderr_tail=self.stderr_tail())
        return self.take_lines(count)

    # ------------------------------------------------------------------- save

    def save_model(self, path: str, deadline: Optional[float],
                   probe_lines: Optional[int], idle_s: Optional[float] = None) -> None:
        """Have the engine write its model now, and place it at ``path`` atomically.

        The engine saves through its ``save_PATH|`` control example, which
        produces no prediction. It writes to a side file and renames it when
        done, so a file that appears under the name it was given is complete.
        subwabbit gives it a unique name beside ``path`` and renames that to
        ``path`` afterwards. When the engine prints predictions, a probe example
        after the save line tells when the save has been processed; otherwise
        the file's appearance does. The caller must make sure that no earlier
        predictions are waiting on stdout.

        :param probe_lines: output lines per example, or ``None`` for a write-only engine
        :param idle_s: give up when the engine shows no progress for this many seconds
        :raises VowpalWabbitTimeoutError: when the save does not finish by ``deadline``
            (or makes no progress for ``idle_s``)
        :raises VowpalWabbitEngineExitedError: when the engine dies meanwhile
        :raises VowpalWabbitError: when the engine processed the save but wrote no file
        """
        target = os.path.abspath(path)
        directory = os.path.dirname(target)
        os.makedirs(directory, exist_ok=True)
        side = os.path.join(directory, f".{os.path.basename(target)}.subwabbit-{uuid.uuid4().hex}")
        if any(ch.isspace() or ch == "|" for ch in side):
            raise ValueError(f"vw cannot save to {target!r}: its save command takes no spaces "
                             "or '|' in the path")
        command = f"save_{side}|\n".encode()
        try:
            if probe_lines is not None:
                self.write_all(command + PROBE_LINE, deadline, idle_s)
                self.read_lines(probe_lines, deadline, idle_s)
            else:
                self.write_all(command, deadline, idle_s)
                delay = 0.0005
                # A write-only engine has at most a pipe's worth of examples to
                # learn before the save: io_timeout_s bounds the whole wait.
                if idle_s is not None:
                    idle_deadline = time.perf_counter() + idle_s
                    deadline = idle_deadline if deadline is None else min(deadline, idle_deadline)
                while not os.path.exists(side):
                    if self.proc.poll() is not None:
                        raise self.exited_error("the vw engine exited while saving its model")
                    if deadline is not None and time.perf_counter() >= deadline:
                        raise VowpalWabbitTimeoutError(
                            f"timed out saving the model to {target}", argv=self.argv,
                            stderr_tail=self.stderr_tail())
                    time.sleep(delay)
                    delay = min(delay * 2, 0.02)
            if not os.path.exists(side):
                raise VowpalWabbitError(f"the vw engine did not write its model to {target}",
                                        argv=self.argv, stderr_tail=self.stderr_tail())
            os.replace(side, target)
        finally:
            for leftover in (side, side + ".writing"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
        logger.info("vw[%d] saved its model to %s", self.pid, target)

    # -------------------------------------------------------------- shutdown

    def _abort(self) -> None:
        """Tear down after a failed start: kill, reap, close pipes."""
        self._closed = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._close_pipes()

    def _close_pipes(self, deadline: Optional[float] = None) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        if self._stderr_thread.is_alive():
            wait_s = 1.0 if deadline is None else max(0.0, deadline - time.perf_counter())
            self._stderr_thread.join(timeout=wait_s)
        # The reader thread closes nothing; a stderr still held open by a
        # grandchild stays open until that thread sees EOF.
        if not self._stderr_thread.is_alive() and self.proc.stderr is not None:
            self.proc.stderr.close()

    def close(self, timeout_s: float = 30.0) -> Optional[int]:
        """Close stdin so that the engine finishes (and writes ``-f`` models),
        discard what it still prints, and reap it; idempotent.

        Returns within ``timeout_s``: an engine still running when most of it
        has passed gets SIGTERM, and SIGKILL shortly before the end (a second
        and a fifth of a second before, at most half and a quarter of
        ``timeout_s``).

        :returns: the exit status (``None`` if even SIGKILL did not end the
            engine in time; a background thread then reaps it)
        :raises VowpalWabbitEngineExitedError: when the engine exits with a
            non-zero status of its own after a clean shutdown request and no
            earlier error reported its failure
        """
        if self._closed:
            return self.proc.returncode
        self._closed = True
        deadline = time.perf_counter() + timeout_s
        term_margin = min(1.0, timeout_s / 2)  # SIGTERM this long before the end
        terminate_at = deadline - term_margin
        kill_at = deadline - min(0.2, timeout_s / 4)
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        if self._stdout_thread is None:
            try:
                while wait_for_fds(self.stdout_fd, None, terminate_at):
                    if not os.read(self.stdout_fd, _READ_CHUNK):
                        break
            except OSError:
                pass
        code = self._wait_until(terminate_at)
        if code is None:
            self._killed_by_us = True
            logger.warning("vw[%d] did not exit within %.1f s of closing its input; terminating",
                           self.pid, timeout_s - term_margin)
            self.proc.terminate()
            code = self._wait_until(kill_at)
        if code is None:
            logger.warning("vw[%d] ignored SIGTERM; killing it", self.pid)
            self.proc.kill()
            code = self._wait_until(deadline)
        if code is None:
            logger.error("vw[%d] survived SIGKILL for %.2f s; reaping it in the background",
                         self.pid, timeout_s)
            threading.Thread(target=self.proc.wait, name=f"subwabbit-vw{self.pid}-reaper",
                             daemon=True).start()
        if self._stdout_thread is not None:
            self._stdout_thread.join(timeout=max(0.0, deadline - time.perf_counter()))
        self._close_pipes(deadline)
        if code is None:
            return None
        logger.info("vw[%d] %s", self.pid, describe_returncode(code))
        if code != 0 and not self._killed_by_us and not self._failure_reported:
            self._failure_reported = True
            raise VowpalWabbitEngineExitedError(
                "the vw engine failed while shutting down", argv=self.argv, returncode=code,
                stderr_tail=self.stderr_tail())
        return code

    def kill(self) -> None:
        """Send SIGKILL now (the pipes stay open until :meth:`close`)."""
        self._killed_by_us = True
        if self.proc.poll() is None:
            self.proc.kill()

    def _wait_until(self, deadline: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            return None

    def release(self) -> None:
        """Non-blocking cleanup for a process that was never closed: close our
        ends of the pipes (the engine then exits by itself) and reap it from a
        background thread."""
        if self._closed:
            return
        self._closed = True
        warnings.warn(f"subwabbit: vw[{self.pid}] was not closed; call close() or use 'with'",
                      ResourceWarning, stacklevel=3)
        # A write-only engine's stdout belongs to its reader thread, which ends at EOF.
        streams = [self.proc.stdin] if self._stdout_thread else [self.proc.stdin, self.proc.stdout]
        for stream in streams:
            try:
                if stream is not None:
                    stream.close()
            except OSError as exc:
                if exc.errno != errno.EBADF:
                    raise
        if self.proc.poll() is None and not sys.is_finalizing():
            # (At interpreter exit no thread can start: the engine, its input
            # closed, exits by itself and is reaped by the system.)
            threading.Thread(target=self.proc.wait, name=f"subwabbit-vw{self.pid}-reaper",
                             daemon=True).start()

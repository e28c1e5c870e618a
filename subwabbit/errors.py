"""Exceptions raised by subwabbit.

Everything the library raises because of the engine derives from
:class:`VowpalWabbitError`. Invalid arguments from the caller stay
:class:`ValueError` / :class:`TypeError` and are raised before anything is
sent to the engine; an item that ``predict`` formats into a bad line is
found before its batch is sent (the earlier batches' answers are
discarded: nothing is misattributed).
"""

import signal
from typing import Optional, Sequence


class VowpalWabbitError(Exception):
    """Base class of errors about the vw engine or the use of a process object.

    :ivar argv: the engine's command line, when the error is about an engine
    :ivar returncode: the engine's exit code (negative: killed by that signal;
        :data:`UNKNOWN_EXIT_STATUS`: it ended, nobody could learn how), or
        ``None`` while it runs or when unknown
    :ivar stderr_tail: the last lines the engine wrote to its stderr
    :ivar output: what the engine printed on stdout when that explains the
        error (a real ``vw`` prints fatal argument errors there)
    """

    def __init__(
        self,
        *args: object,
        argv: Optional[Sequence[str]] = None,
        returncode: Optional[int] = None,
        stderr_tail: str = "",
        output: str = "",
    ) -> None:
        super().__init__(*args)
        #: the first argument as text (subwabbit always passes one message)
        self.message = "" if not args else str(args[0]) if len(args) == 1 else str(args)
        self.argv = list(argv) if argv is not None else None
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        self.output = output

    def __str__(self) -> str:
        parts = [self.message]
        if self.returncode is not None:
            parts.append(f"engine {describe_returncode(self.returncode)}")
        if self.output.strip():
            parts.append(f"engine stdout: {self.output.strip()}")
        if self.stderr_tail.strip():
            parts.append(f"engine stderr: {self.stderr_tail.strip()}")
        if self.argv is not None:
            parts.append(f"argv: {self.argv}")
        return "\n".join(parts)


class VowpalWabbitStartupError(VowpalWabbitError):
    """The engine could not be started: missing executable, invalid arguments,
    unreadable model, or no sign of life within the start-up timeout."""


class VowpalWabbitEngineExitedError(VowpalWabbitError):
    """The engine exited (or closed its pipes) while a call needed it."""


class VowpalWabbitTimeoutError(VowpalWabbitError):
    """The engine did not answer within an I/O timeout (``io_timeout_s`` or
    a save's timeout; an engine silent for its whole start-up timeout raises
    :class:`VowpalWabbitStartupError` instead). The engine's output can no
    longer be matched to the calls that sent input, so the process object
    must be restarted (:meth:`~subwabbit.process_model.VowpalWabbitProcessModel.restart`,
    or ``restart_on_crash=True``) or closed.

    Also raised, with the object still usable, by a call whose deadline (a
    save's timeout) passed while a replacement engine was starting in the
    background (a later call uses it), and by a ``close()`` that had to
    terminate an engine started with ``-f`` before it wrote its model."""


class VowpalWabbitBusyError(VowpalWabbitError):
    """Another thread's call held the process for longer than this call could
    wait (``io_timeout_s`` for a call without a deadline). Calls on one
    process object are serialised; an unfinished ``predict`` iterator holds
    the process until it is exhausted, closed or garbage-collected."""


class VowpalWabbitProtocolError(VowpalWabbitError):
    """The engine printed something that is not a prediction of the expected
    shape; the process object can no longer tell which prediction is whose and
    must be restarted (:meth:`~subwabbit.process_model.VowpalWabbitProcessModel.restart`,
    or ``restart_on_crash=True``) or closed."""


#: The exit status of an engine that ended when nobody could learn how: one
#: forked by a pool's fork server, which reaps it, after that server died.
UNKNOWN_EXIT_STATUS = -(1 << 16)


def describe_returncode(returncode: int) -> str:
    """Describe an exit status as ``exited with code N`` or ``killed by SIGX``.

    :param returncode: a :attr:`subprocess.Popen.returncode`, or
        :data:`UNKNOWN_EXIT_STATUS`
    :returns: a short human-readable phrase
    """
    if returncode == UNKNOWN_EXIT_STATUS:
        return "ended with an unknown status (the fork server that reaped it is gone)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode}"

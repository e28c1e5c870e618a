"""Saving a running engine's model to a path, atomically.

The engine saves through its ``save_PATH|`` control example, which produces
no answer. It writes to a side file and renames it when done, so a file that
appears under the name it was given is complete. subwabbit gives it a unique
name beside the target and renames that to the target afterwards.
"""

import errno
import logging
import os
import threading
import time
import uuid
from typing import Any, Optional, Union

from .errors import VowpalWabbitError

logger = logging.getLogger("subwabbit")
#: the logger of each engine's life (started, saved a model, exited)
engine_logger = logging.getLogger("subwabbit.engine")

#: What ``save`` takes as a path (see :class:`ModelSave`).
SavePath = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


def _check_command_path(target: str) -> None:
    """Refuse a path that the one-line ``save_PATH|`` command cannot carry
    to the engine as it is: a NUL byte (no file has it), whitespace (it
    ends the tag there; a line break would end the line and make the rest
    an example), ``|`` (it ends the tag), or an undecodable byte of a
    ``bytes`` path (the command is UTF-8).

    :raises ValueError: naming the path and what it cannot hold
    """
    if "\0" in target:
        raise ValueError(f"cannot save the model to {target!r}: a path holds no NUL byte")
    if any(ch.isspace() or ch == "|" for ch in target):
        raise ValueError(f"vw cannot save to {target!r}: its save command takes no whitespace "
                         "(spaces, tabs, line breaks) or '|' in the path")
    try:
        target.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"vw cannot save to {target!r}: its save command takes only paths "
                         "that are UTF-8 text") from None


class ModelSave:
    """One save: the side file, the control line, and the final rename.

    :param path: where the model should end up, a ``str``, ``bytes`` or
        :class:`os.PathLike` path (parent directories are created)
    :raises TypeError: for anything else (``None``)
    :raises ValueError: for a path the save command cannot carry (any
        whitespace, line breaks included, ``|``, a NUL byte, or bytes that
        are not UTF-8), or an empty one: found before any directory is
        created or anything is sent
    :raises OSError: when the directory cannot be created, a file cannot be
        created in it, or the path is a directory: found here, before the
        engine is asked, because a save it cannot write ends the engine
        (the vw executable hangs instead when many lines follow it)
    """

    def __init__(self, path: SavePath) -> None:
        text = os.fsdecode(path)
        if not text:
            raise ValueError("the path to save the model to is empty")
        self.target = os.path.abspath(text)
        _check_command_path(self.target)
        if os.path.isdir(self.target):
            raise IsADirectoryError(errno.EISDIR, "cannot save the model over a directory",
                                    self.target)
        directory = os.path.dirname(self.target)
        os.makedirs(directory, exist_ok=True)
        self.side = os.path.join(directory,
                                 f".{os.path.basename(self.target)}.subwabbit-{uuid.uuid4().hex}")
        # The engine runs as this process's user, so a file it could not
        # create is one this process cannot create either.
        os.close(os.open(self.side, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(self.side)
        #: the control line that makes the engine save
        self.command = f"save_{self.side}|\n".encode()

    def written(self) -> bool:
        """Whether the engine has written the side file."""
        return os.path.exists(self.side)

    def finish(self, engine: Any) -> None:
        """Move the side file to the target, and log the save at INFO on
        the ``subwabbit.engine`` logger.

        :param engine: the :class:`~subwabbit.engine_process.EngineProcess`, for the
            error and the log record
        :raises VowpalWabbitError: when the engine wrote no file
        """
        if not self.written():
            raise VowpalWabbitError(f"the vw engine did not write its model to {self.target}",
                                    argv=engine.argv, stderr_tail=engine.stderr_tail())
        os.replace(self.side, self.target)
        engine_logger.info("vw[%d] saved its model to %s", engine.pid, self.target)

    def clean_up(self) -> None:
        """Remove what a failed or abandoned save left beside the target."""
        for leftover in (self.side, self.side + ".writing"):
            if os.path.exists(leftover):
                os.unlink(leftover)

    def clean_up_after(self, engine: Any, saved: bool, command_sent: bool,
                       limit_s: Optional[float]) -> None:
        """What a save leaves, removed when it ends however it ends: now when
        it finished or its command never reached the engine, else once the
        engine is done (:meth:`clean_up_later`).

        :param engine: the :class:`~subwabbit.engine_process.EngineProcess`
        :param saved: whether the save finished (the target is in place)
        :param command_sent: whether any of the save command was written
        :param limit_s: see :meth:`clean_up_later`
        """
        if saved or not command_sent:
            self.clean_up()
        else:  # the engine may be saving now (a timeout, an interruption)
            self.clean_up_later(engine, limit_s)

    def clean_up_later(self, engine: Any, limit_s: Optional[float]) -> None:
        """:meth:`clean_up` once the engine is done with this save, on a
        thread of its own: for a save that ended (timed out, cancelled,
        interrupted) after its command reached the engine, which may be
        writing the side file now. Removing it under the engine makes vw
        abort; a file it writes later would stay beside the target.

        :param engine: the :class:`~subwabbit.engine_process.EngineProcess`
        :param limit_s: the longest wait (``None``: 60 s)
        """
        threading.Thread(target=self._clean_up_when_done, args=(engine, limit_s),
                         name="subwabbit-save-clean-up", daemon=True).start()

    def _clean_up_when_done(self, engine: Any, limit_s: Optional[float]) -> None:
        until = time.perf_counter() + (60.0 if limit_s is None else limit_s)
        while time.perf_counter() < until and engine.returncode is None:
            if self.written() and not os.path.exists(self.side + ".writing"):
                break
            time.sleep(0.02)
        try:
            self.clean_up()
        except OSError as exc:
            logger.warning("could not remove what an unfinished save left: %s", exc)

"""Run a command that dies with the process that started it (Linux).

A node's engine is started through this script::

    python guard.py PARENT_PID ENGINE_COMMAND...

It asks the kernel to send the engine SIGKILL when its parent goes away
(``prctl(PR_SET_PDEATHSIG)``, kept across ``exec``), then becomes the engine.
Without it, an engine whose Dask worker was killed (out of memory, say)
would see the end of its input, finish a partial pass and then try, for
100 s, to reach a rendezvous that is gone.

The kernel sends the signal when the *thread* that started the child ends;
a node's task thread outlives its engine, so that is the same here.

Like :mod:`subwabbit.engine.program`, this file imports nothing from
subwabbit, so that it starts fast as a plain script.
"""

import ctypes
import os
import signal
import sys
from typing import List, Optional

_PR_SET_PDEATHSIG = 1


def main(argv: Optional[List[str]] = None) -> int:
    """Arm the parent-death signal and ``exec`` the command.

    :param argv: the parent's pid, then the command (default: ``sys.argv[1:]``)
    :returns: an exit status, only when the command could not be run
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or not args[0].isdigit():
        sys.stderr.write("usage: guard.py PARENT_PID COMMAND...\n")
        return 2
    parent, command = int(args[0]), args[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        sys.stderr.write(f"guard.py: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(error)}\n")
        return 1
    if os.getppid() != parent:  # the parent died before the signal was armed
        return 1
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"guard.py: cannot run {command[0]!r}: {exc}\n")
        return 127
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())

"""A ``vw``-compatible command backed by the engine in the ``vowpalwabbit`` wheel.

``pip install vowpalwabbit`` ships the engine as a Python extension but no
``vw`` executable. This module stands in for one::

    python -m subwabbit.engine -p stdout --quiet -i model.vw < examples.txt

It accepts the same arguments, reads examples from stdin unless ``-d`` names
a file, and writes predictions as the engine produces them. Errors in the
arguments are printed on stderr as one line and end the process with exit
code 1, like the executable.

This file imports nothing from subwabbit so that it can run as a plain script.
"""

import os
import signal
import stat
import sys
from typing import List, Optional

_DATA_OPTIONS = ("-d", "--data")


def _reads_data_file(args: List[str]) -> bool:
    for arg in args:
        if arg in _DATA_OPTIONS or arg.startswith("--data=") or (
                arg.startswith("-d") and not arg.startswith("--")):
            return True
    return False


def main(argv: Optional[List[str]] = None) -> int:
    """Run the engine with ``argv`` (default: ``sys.argv[1:]``).

    :returns: the process exit code
    """
    args = list(sys.argv[1:] if argv is None else argv)
    # Behave like a C program: die quietly when the reader goes away or on ^C.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        import pylibvw  # pylint: disable=import-outside-toplevel,import-error
    except ImportError as exc:
        sys.stderr.write(f"subwabbit.engine: cannot import pylibvw from the vowpalwabbit package: {exc}\n")
        return 1
    from_stdin = not _reads_data_file(args)
    if from_stdin:
        args += ["--data", "/dev/stdin"]
    try:
        workspace = pylibvw.vw(args)
        workspace.run_parser()
        if from_stdin and not _input_exhausted():
            # The wheel's driver logs a fatal example error (a malformed
            # multiclass label, say) and returns as if the input had ended;
            # the vw executable exits with code 1 instead. So do we, without
            # writing a -f model.
            sys.stderr.write("vw: stopped before the end of its input after an error\n")
            sys.stderr.flush()
            return 1
        workspace.finish()
    except RuntimeError as exc:
        sys.stderr.write(f"vw: {exc}\n")
        sys.stderr.flush()
        return 1
    return 0


def _input_exhausted() -> bool:
    """Whether a stdin pipe is at end of file (the writer closed it and all was read).

    Only a pipe can tell: the engine reads ``/dev/stdin`` through a descriptor
    of its own, which for a regular file has its own offset.
    """
    try:
        if not stat.S_ISFIFO(os.fstat(0).st_mode):
            return True
        os.set_blocking(0, False)
        return os.read(0, 1) == b""
    except BlockingIOError:  # the writer is still there: the parser gave up early
        return False
    except OSError:  # nothing we can query; trust the driver
        return True


if __name__ == "__main__":
    sys.exit(main())

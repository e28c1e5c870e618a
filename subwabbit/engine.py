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

import signal
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
    if not _reads_data_file(args):
        args += ["--data", "/dev/stdin"]
    try:
        workspace = pylibvw.vw(args)
        workspace.run_parser()
        workspace.finish()
    except RuntimeError as exc:
        sys.stderr.write(f"vw: {exc}\n")
        sys.stderr.flush()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

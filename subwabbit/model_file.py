"""What a vw model file says about itself: the options it was trained with.

A model file starts with a header that holds, among other things, the
options that shape the model (its reductions, ``--named_labels``,
``--indexing``, interactions) as one text: ``" --named_labels walk,run
--oaa 2"``. vw applies them again when it loads the file with ``-i``, so a
model's kind, and the names of its classes, can be read from the file
before the engine starts, and labels checked against them before anything
reaches the engine (see :func:`~subwabbit.core.kinds.choose_kind`).

The header is read without parsing its fields one by one, which change with
vw's versions: the option text is the first length-prefixed, NUL-terminated
text in the header that starts with ``--``. A file whose header has no
such text (a model with no options saved, one of another format, a path
that is not a regular file) gives no options, and the engine's start-up
probe is then the only check, as before.
"""

import gzip
import logging
import os
import re
import struct
from typing import List, Optional, Sequence

from .engine.program import option_name

logger = logging.getLogger(__name__)

#: how much of a file is searched for the option text
HEADER_BYTES = 1 << 16

# a little-endian length, then that many bytes: printable text from "--" to a NUL
_OPTION_TEXT = re.compile(rb"(?s)(.{4})( ?--[\x20-\x7e]*)\x00")


def model_file_path(vw_args: Sequence[str]) -> Optional[str]:
    """The first model file that ``vw_args`` load (``-i``, ``--initial_regressor``),
    or ``None``."""
    for index, token in enumerate(vw_args):
        name = option_name(token)
        if name not in ("-i", "--initial_regressor"):
            continue
        if "=" in token and token.startswith("--"):
            return token.split("=", 1)[1]
        if name == "-i" and len(token) > 2:
            return token[2:]
        return vw_args[index + 1] if index + 1 < len(vw_args) else None
    return None


def saved_options(path: str) -> Optional[List[str]]:
    """The options saved in the model file at ``path``, as tokens, or
    ``None`` when they cannot be read (see the module's text)."""
    try:
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as stream:
            header = stream.read(HEADER_BYTES)
        if header[:2] == b"\x1f\x8b":
            with gzip.open(path, "rb") as stream:
                header = stream.read(HEADER_BYTES)
    except (OSError, EOFError) as exc:
        logger.debug("cannot read the header of the model file %s: %r", path, exc)
        return None
    for found in _OPTION_TEXT.finditer(header):
        text = found.group(2)
        if struct.unpack("<I", found.group(1))[0] == len(text) + 1:
            return text.decode("ascii").split()
    return None


def saved_options_of(vw_args: Sequence[str]) -> List[str]:
    """The options saved in the model file that ``vw_args`` load (``[]``
    without one, or when they cannot be read)."""
    path = model_file_path(vw_args)
    return (saved_options(path) or []) if path else []

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
text without control characters in the header that starts with ``--``
(UTF-8: class names need not be ASCII), beginning in the file's first
:data:`HEADER_BYTES`. A file whose header has no
such text (a model with no options saved, one of another format, a path
that is not a regular file) gives no options, and the engine's start-up
probe is then the only check, as before.
"""

import gzip
import logging
import os
import re
import struct
import zlib
from typing import BinaryIO, List, Optional, Sequence, Tuple

from .engine.program import option_name

logger = logging.getLogger(__name__)

#: how much of a file is searched for the start of the option text (which
#: may run past it: a long ``--named_labels`` list)
HEADER_BYTES = 1 << 16
#: the longest option text read
MAX_OPTION_TEXT = 1 << 26

# a little-endian length, then the option text's first bytes (every place
# where they may begin: the matches may overlap)
_OPTION_START = re.compile(rb"(?s)(?=(.{4}) ?--)")
# the rest of it: no control character but the NUL that ends it
_OPTION_TEXT = re.compile(rb"[^\x00-\x1f\x7f]*\x00")


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


#: What tells one model file from another written at the same path later.
FileIdentity = Tuple[int, int, int]


def file_identity(path: Optional[str]) -> Optional[FileIdentity]:
    """The inode, size and modification time of the file at ``path``
    (following links), or ``None`` without a path or a file there.

    A new file moved over the path (a rename, a link repointed) has another
    inode; one written over in place another size or modification time. The
    device is left out: a network file system mounted again (autofs) gets
    another device number for the same file.
    """
    if not path:
        return None
    try:
        stat = os.stat(path)
    except (OSError, ValueError):
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def saved_options(path: str) -> Optional[List[str]]:
    """The options saved in the model file at ``path``, as tokens, or
    ``None`` when they cannot be read (see the module's text)."""
    try:
        if not os.path.isfile(path):
            return None
        with _open(path) as stream:
            header = stream.read(HEADER_BYTES)
            for found in _OPTION_START.finditer(header):
                length = struct.unpack("<I", found.group(1))[0]
                if not 3 <= length <= MAX_OPTION_TEXT:
                    continue
                start = found.start() + 4
                if start + length > len(header):  # a long text: read the rest of it
                    header += stream.read(start + length - len(header))
                text = header[start:start + length]
                if len(text) == length and _OPTION_TEXT.fullmatch(text):
                    return text[:-1].decode("utf-8").split()
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        logger.debug("cannot read the options saved in the model file %s: %r", path, exc)
    return None


def _open(path: str) -> BinaryIO:
    """``path`` opened for reading, decompressed when it is gzipped."""
    stream: BinaryIO = open(path, "rb")  # pylint: disable=consider-using-with
    if stream.read(2) == b"\x1f\x8b":
        stream.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    stream.seek(0)
    return stream


def saved_options_of(vw_args: Sequence[str]) -> List[str]:
    """The options saved in the model file that ``vw_args`` load (``[]``
    without one, or when they cannot be read)."""
    path = model_file_path(vw_args)
    return (saved_options(path) or []) if path else []

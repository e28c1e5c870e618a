"""Checking VW text lines before they are sent, and parsing prediction lines.

The client counts one prediction per line it sends, so every line must be
one the engine answers exactly once: no embedded line breaks (two examples),
not empty (no answer; vw drops a byte order mark at the start of a line, so
a line of only that is empty too), and no tag starting with ``save`` (the
engine's save command, which answers nothing).

A multi-line example (``--cb_adf``, ``--cb_explore_adf``) is answered once,
after the empty line that ends it, so none of its lines may be one that vw
reads as that end (:func:`encode_example`), nor one whose label vw cannot
take: its engine exits on a line with more than one cost (:func:`label_words`).

vw drops everything before a tab in a line's header (the text before its
first ``|``): a labelled line and every line of a multi-line example must
have nothing but spaces before such a tab, or the label (or ``shared``) is
lost without a word
(:func:`check_header_without_tab`).

The label words vw reads in a single-line example's header
(:func:`label_words`) must be a label of the model's kind as vw reads it
(:func:`check_line_labels`, with the kind's rule): under ``--oaa`` a word
such as ``x`` or ``1:2`` ends the engine, and under ``--csoaa`` it makes a
nonsense prediction without a word.
"""

import re
from typing import Callable, Iterator, List, Optional, Sequence, Union, overload

from .errors import VowpalWabbitProtocolError


def check_line_part(part: str, what: str) -> None:
    """Check a piece of a line (for example the common part of a request).

    :param part: the text
    :param what: how to name it in the error message
    :raises TypeError: when ``part`` is not a string
    :raises ValueError: when it contains a line break
    """
    if not isinstance(part, str):
        raise TypeError(f"{what} must be a str, got {type(part).__name__}")
    if "\n" in part or "\r" in part:
        raise ValueError(f"{what} contains a line break, which would split the example: {part!r}")


_VW_WHITESPACE = re.compile(r"[ \t]+")

#: A UTF-8 byte order mark, which vw drops at the start of a line.
_BOM = "\ufeff"


def _vw_tokens(text: str) -> List[str]:
    """Split like vw does: on spaces and tabs only (not on other Unicode whitespace)."""
    return [token for token in _VW_WHITESPACE.split(text) if token]


def has_save_tag(line: str) -> bool:
    """Whether vw could take ``line`` as its save command.

    vw saves its model instead of answering an example whose tag starts with
    ``save`` when the example has at most one namespace left after parsing:
    none but the constant feature's, or one with ``--noconstant``, or none
    after ``--ignore`` or zero-valued features drop what it had. The client
    cannot see all of that, so any token before the first ``|`` (where the
    tag is) that starts with ``save`` counts.
    """
    return any(token.lstrip("'").startswith("save") for token in header_tokens(line))


def header_tokens(line: str) -> List[str]:
    """The tokens vw reads before the first ``|`` of ``line`` (label, weight,
    tag, or ``shared``), after dropping a byte order mark that starts the
    line, as vw's line reader does."""
    header = line.split("|", 1)[0]
    if header.startswith(_BOM):
        header = header[1:]
    return _vw_tokens(header)


def check_header_without_tab(line: str, what: str) -> None:
    """Check that vw reads the whole header of ``line``: it drops everything
    up to a tab before the first ``|``, so a tab there after a label (an
    example then trains nothing) or the word ``shared`` (the shared line of
    a multi-line example becomes an item) would drop it. Nothing but spaces
    before such a tab is fine.

    :param line: a line already checked by :func:`check_line` (or a line of
        a multi-line example)
    :param what: how to name it in the error message
    :raises ValueError: for a tab before the first ``|`` after anything but spaces
    """
    header = line.split("|", 1)[0] if "\t" in line else ""
    dropped = header.split("\t", 1)[0].strip(" " + _BOM) if "\t" in header else ""
    if dropped:
        raise ValueError(f"{what} has a tab before its first '|', and vw drops everything "
                         f"before such a tab (here {dropped!r}): {line!r}")


def check_labelled_lines(lines: Sequence[str]) -> None:
    """:func:`check_header_without_tab` for lines of training examples."""
    if any("\t" in line for line in lines):
        for index, line in enumerate(lines):
            check_header_without_tab(line, f"training example #{index}")


def _check_text(line: str, what: str, split: str, empty: str, instead: str) -> None:
    """The checks every line sent to the engine passes, with the words of
    the error messages: what a line break would do, what vw does with an
    empty line, and what a save command would take the place of."""
    if not isinstance(line, str):
        raise TypeError(f"{what} must be a str, got {type(line).__name__}")
    if "\n" in line or "\r" in line:
        raise ValueError(f"{what} contains a line break, which would {split}: {line!r}")
    if not line or line == _BOM:
        raise ValueError(f"{what} is empty; {empty}")
    if "save" in line and has_save_tag(line):
        raise ValueError(f"{what} has a tag starting with 'save', which vw can take as a command "
                         f"to save its model instead of {instead}: {line!r}")


def check_line(line: str, index: int = 0) -> None:
    """Check that ``line`` is one example that yields exactly one prediction.

    :param line: a formatted example, without its newline
    :param index: its position in the request, for the error message
    :raises TypeError: when ``line`` is not a string
    :raises ValueError: for a line break, an empty line or a save command
    """
    _check_text(line, f"formatted example #{index}", "make it two examples",
                "vw answers nothing to an empty line", "an example")


def audit_line(vw_line: str) -> str:
    """The example ``explain_vw_line`` sends: ``vw_line`` without one
    trailing newline (``\\n`` or ``\\r\\n``, as a line read from a file ends;
    subwabbit 2.x stripped it), checked with :func:`check_line`.

    :raises TypeError: when ``vw_line`` is not a string
    :raises ValueError: for a line break inside it, an empty line or a save command
    """
    if isinstance(vw_line, str) and vw_line.endswith("\n"):
        vw_line = vw_line[:-2] if vw_line.endswith("\r\n") else vw_line[:-1]
    check_line(vw_line)
    return vw_line


class CheckedLines(List[str]):
    """Lines already checked with :func:`check_lines` (or an equivalent check
    of their parts): :func:`encode_lines` does not check them again."""

    __slots__ = ()


class PrefixedLines(Sequence[str]):
    """Checked lines that all begin with one prefix (a request's common
    part and a space), kept as the prefix and each line's rest (an item's
    part): :func:`encode_lines` joins them into bytes at once, without
    making each line a string of its own (a third of the client's cost of
    joining and encoding a line, measured on the benchmark's 250-byte
    lines). Lines are made only when they are read one by one.

    :param prefix: what every line begins with
    :param parts: the rest of each line, checked (no line break, nothing
        that makes a line other than one example)
    """

    __slots__ = ("prefix", "parts")

    def __init__(self, prefix: str, parts: List[str]) -> None:
        self.prefix = prefix
        self.parts = parts

    def __len__(self) -> int:
        return len(self.parts)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> "PrefixedLines": ...

    def __getitem__(self, index: Union[int, slice]) -> Union[str, "PrefixedLines"]:
        if isinstance(index, slice):
            return PrefixedLines(self.prefix, self.parts[index])
        return self.prefix + self.parts[index]

    def __iter__(self) -> Iterator[str]:
        prefix = self.prefix
        return (prefix + part for part in self.parts)

    def __repr__(self) -> str:
        return f"PrefixedLines({self.prefix!r}, {self.parts!r})"

    def encode(self, first_index: int = 0) -> bytes:
        """The lines, each ended by a newline, as UTF-8.

        :param first_index: the request position of the first line, for error messages
        :raises UnicodeEncodeError: naming the line (or the common part) with
            text that UTF-8 cannot encode (a lone surrogate)
        """
        if not self.parts:
            return b""
        prefix = self.prefix
        try:
            return (prefix + ("\n" + prefix).join(self.parts) + "\n").encode("utf-8")
        except UnicodeEncodeError as exc:
            raise (unencodable_line_error([prefix], "the formatted common features")
                   or unencodable_line_error(self.parts, "formatted item", first_index)
                   or exc) from None


_SAVE = re.compile("save")


def _all_one_example(lines: Sequence[str]) -> bool:
    """Whether every line is surely one example, from one join and a few scans
    (``False`` also when a line may fail: :func:`check_line` then decides)."""
    try:
        # Joined without separators, a line break can only come from inside a line.
        flat = "".join(lines)
    except TypeError:
        return False
    return (bool(flat) and "\n" not in flat and "\r" not in flat and "" not in lines
            and _BOM not in flat and _SAVE.search(flat) is None)


def common_part_holds_the_header(common: str) -> bool:
    """Whether ``common`` holds a ``|`` before which no tag starts with
    ``save``: then in a line made of ``common``, a space and an item's part
    (after a number label, if any), no part can put a tag into the line's
    header, and a part that breaks no line makes the line one example.

    :param common: a common part already checked by :func:`check_line_part`
    """
    return "|" in common and not ("save" in common and has_save_tag(common))


def breaks_no_line(text: str) -> bool:
    """Whether ``text`` (say, the item parts of a batch joined) holds no line break."""
    return "\n" not in text and "\r" not in text


def check_lines(lines: Sequence[str], first_index: int = 0) -> CheckedLines:
    """:func:`check_line` for every line, at the cost of a join when all are fine.

    :param first_index: the position of ``lines[0]``, for error messages
    :returns: the lines, marked as checked
    :raises TypeError: see :func:`check_line`
    :raises ValueError: see :func:`check_line`, for the first line that fails
    """
    if lines and not _all_one_example(lines):
        for offset, line in enumerate(lines):
            check_line(line, first_index + offset)
    return lines if isinstance(lines, CheckedLines) else CheckedLines(lines)


def encode_lines(lines: Sequence[str], first_index: int = 0) -> bytes:
    """Check ``lines`` (unless they are :class:`CheckedLines` or
    :class:`PrefixedLines`) and encode them as newline-terminated UTF-8.

    :param lines: formatted examples
    :param first_index: the request position of ``lines[0]``, for error messages
    :returns: the bytes to send
    :raises ValueError: see :func:`check_line`
    :raises UnicodeEncodeError: (a ``ValueError``) for text that UTF-8
        cannot encode (a lone surrogate), naming the line
        (:func:`unencodable_line_error`)
    """
    if type(lines) is PrefixedLines:  # pylint: disable=unidiomatic-typecheck
        return lines.encode(first_index)
    if not lines:
        return b""
    if not isinstance(lines, CheckedLines) and not _all_one_example(lines):
        for offset, line in enumerate(lines):
            check_line(line, first_index + offset)
    try:
        return ("\n".join(lines) + "\n").encode("utf-8")
    except UnicodeEncodeError as exc:
        raise unencodable_line_error(lines, "formatted example", first_index) or exc from None


def unencodable_line_error(lines: Sequence[str], what: str,
                           first_index: Optional[int] = None) -> Optional[UnicodeEncodeError]:
    """The error to raise when encoding ``lines`` (joined) failed: UTF-8's
    own, at its place in the first line that cannot be encoded, named with
    ``what`` (and its request position), where an error in a whole batch
    gives only a position in the batch's text. Called only once encoding has
    failed: lines are not encoded one by one otherwise.

    :param what: how to name a line in the error message
    :param first_index: the request position of ``lines[0]``, written after
        ``what`` (``None``: ``what`` names the one line)
    :returns: ``None`` when every line encodes on its own
    """
    for offset, line in enumerate(lines):
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as exc:
            name = what if first_index is None else f"{what} #{first_index + offset}"
            return UnicodeEncodeError(exc.encoding, exc.object, exc.start, exc.end,
                                      f"{exc.reason}, in {name}: {line!r}")
    return None


def label_words(line: str) -> List[str]:
    """The words vw's label parser reads in ``line``, as vw 9 splits its
    header (the text before the first ``|``): after a byte order mark that
    starts the line and anything up to a tab, on spaces, without the tag
    (the last word, when it starts with ``'`` or touches the ``|``).
    ``'shared 1 |u a'`` gives ``['shared', '1']``; ``"'t |i x"`` and ``'|i x'`` none."""
    bar = line.find("|")
    header = line if bar < 0 else line[:bar]
    if header.startswith(_BOM):
        header = header[1:]
    header = header.split("\t", 1)[-1]  # vw drops up to the first tab
    words = [word for word in header.split(" ") if word]
    if words and (not header.endswith(" ") or words[-1].startswith("'")):
        words.pop()  # the tag
    return words


#: A kind's rule for the label words of a single-line example: the problem
#: with ``words`` (from :func:`label_words`), or ``None`` when vw reads them
#: as written (:meth:`PredictionKind.label_words_problem
#: <subwabbit.core.kinds.PredictionKind.label_words_problem>`).
LabelRule = Callable[[List[str]], Optional[str]]


def label_problem(words: List[str], what: str, rule: LabelRule, line: str) -> Optional[str]:
    """The message of the ValueError for ``what`` when ``rule`` refuses
    ``words``, the label words of ``line`` (``None``: no problem)."""
    problem = rule(words) if words else None
    if problem is None:
        return None
    return (f"{what} has {' '.join(words)!r} before its first '|', which vw reads as the "
            f"label of the example: {problem}: {line!r}")


def check_line_labels(lines: Sequence[str], rule: LabelRule, first_index: int = 0,
                      what: str = "formatted example") -> None:
    """Check the label words vw reads in each of ``lines`` (single-line
    examples, already checked by :func:`check_line`) with a kind's ``rule``:
    a line starting with ``|`` has none.

    :param first_index: the position of ``lines[0]``, for error messages
    :param what: how to name a line in the error message (``#N`` follows)
    :raises ValueError: for the first line whose label ``rule`` refuses
    """
    for offset, line in enumerate(lines):
        bar = line.find("|")
        if bar >= 0 and not line[:bar].strip(" "):
            continue  # (a blank header has no label words: the common case, cheaply)
        message = label_problem(label_words(line), f"{what} #{first_index + offset}", rule, line)
        if message is not None:
            raise ValueError(message)


def shared_header(common: str, parts: Sequence[str]) -> Optional[str]:
    """The header (the text before the first ``|``) that the common part
    gives every line made of ``common``, a space and one of ``parts`` (the
    default joining; a label may come first), when it is the same in all:
    ``common`` holds a ``|``, or every part starts with one. ``None``
    otherwise: each line has its own header.

    :param common: a common part already checked by :func:`check_line_part`
    :param parts: the item parts, all ``str``
    """
    bar = common.find("|")
    if bar >= 0:
        return common[:bar]
    # (a set of first characters: the cheapest scan, a third of a generator's cost)
    return common + " " if parts and {part[:1] for part in parts} == {"|"} else None


def parts_add_no_label_words(common: str, parts: Sequence[str]) -> bool:
    """Whether training lines made of a label (and weight), ``common``, a
    space and each of ``parts`` (the default joining) have no label words
    but the label's: the header :func:`shared_header` finds has none, and
    no tab (which would drop the label: :func:`check_header_without_tab`)."""
    header = shared_header(common, parts)
    # (a byte order mark after the label is no line's start: vw reads it as a word)
    return header is not None and "\t" not in header and not label_words(" " + header + "|")


def cost_parts(word: str) -> List[str]:
    """The parts vw's contextual-bandit label parser reads in a label word:
    its ``:``-separated parts, empty ones dropped (two or more: a cost)."""
    return [part for part in word.split(":") if part]


def _check_example_label(line: str, what: str, item: bool) -> None:
    """Check that vw's contextual-bandit label parser takes the label of one
    line of a multi-line example without ending the engine: the shared line
    carries no cost (only ``shared``, or vw's ``shared graph ...``), an item
    line one at most (``action:cost:probability``, three parts at most, not
    only colons: vw stops on ``::``, a malformed cost)."""
    words = label_words(line)
    if not item:
        if words[1:] and words[1] != "graph":
            raise ValueError(f"{what} has {' '.join(words[1:])!r} before its first '|', which "
                             "vw reads as costs of the shared line, and its engine then exits: "
                             "format_common_features must return the request's features (and "
                             f"a tag) without a label: {line!r}")
        return
    if len(words) > 1 or (words and words[0].count(":") > 2):
        raise ValueError(f"{what} has the label {' '.join(words)!r} before its first '|', and "
                         "vw's engine exits on a line of a multi-line example with more than "
                         f"one cost or a cost of more than three parts: {line!r}")
    if words and not cost_parts(words[0]):
        raise ValueError(f"{what} has the label {words[0]!r} before its first '|', which vw "
                         "reads as a malformed cost, and its engine then stops reading: "
                         f"{line!r}")


def _check_one_cost(lines: Sequence[str], shared_lines: int) -> None:
    """Check that at most one item line of a multi-line example carries a
    cost (a label word of two parts or more): vw's engine exits on an
    example with two, whether a formatter or ``train`` wrote them."""
    costed = [index - shared_lines for index, line in enumerate(lines)
              if index >= shared_lines
              and any(len(cost_parts(word)) > 1 for word in label_words(line))]
    if len(costed) > 1:
        raise ValueError(f"formatted items #{costed[0]} and #{costed[1]} both have a cost "
                         "before their first '|', and vw's engine exits on a multi-line "
                         "example with more than one line that has a cost: only the item "
                         "that was shown is labelled")


def check_example_line(line: str, what: str, item: bool = True) -> None:
    """Check one line of a multi-line example.

    :param line: the line, without its newline
    :param what: how to name it in the error message
    :param item: whether it is an item (action) line, which must not be a
        ``shared`` line
    :raises TypeError: when ``line`` is not a string
    :raises ValueError: for a line break (it would split the example), an
        empty line (vw reads it as the end of the example), a save command,
        an item line that vw would read as the shared line, or a label vw's
        engine exits on (:func:`_check_example_label`)
    """
    _check_text(line, what, "split the multi-line example",
                "vw reads an empty line as the end of a multi-line example",
                "a line of the example")
    check_header_without_tab(line, what)
    if item and "shared" in line:
        header = header_tokens(line)
        if header and header[0] == "shared":
            raise ValueError(f"{what} starts with 'shared', which makes it the shared line of "
                             f"the example instead of an item: {line!r}")
    _check_example_label(line, what, item)


def encode_example(lines: Sequence[str]) -> bytes:
    """Check the lines of one multi-line example and encode them, with the
    empty line that ends the example, as UTF-8.

    :param lines: the example's lines without newlines: its shared line
        first, then the item lines
    :returns: the bytes to send
    :raises ValueError: see :func:`check_example_line`, naming the item by
        its position; also for an example without item lines
    :raises UnicodeEncodeError: (a ``ValueError``) for text that UTF-8
        cannot encode (a lone surrogate), naming the line
    """
    shared_lines = 1
    if len(lines) <= shared_lines:
        raise ValueError("a multi-line example needs at least one item line")
    try:
        flat = "".join(lines)
        items_flat = "".join(lines[shared_lines:])
        text = "\n".join(lines)
    except TypeError:
        flat = items_flat = text = ""
    # (item lines that all start with '|' carry no label: one count, not a check each)
    if (not items_flat or "\n" in flat or "\r" in flat or "" in lines or "save" in flat
            or _BOM in flat or "shared" in items_flat or "\t" in flat
            or text.count("\n|") != len(lines) - shared_lines
            or len(label_words(lines[0])) != 1):
        for index, line in enumerate(lines):
            if index < shared_lines:
                check_example_line(line, "the shared line", item=False)
            else:
                check_example_line(line, f"formatted item #{index - shared_lines}")
        _check_one_cost(lines, shared_lines)
    try:
        return (text + "\n\n").encode("utf-8")
    except UnicodeEncodeError as exc:
        raise (unencodable_line_error(lines[:shared_lines], "the shared line")
               or unencodable_line_error(lines[shared_lines:], "formatted item", 0)
               or exc) from None


def parse_scalar(line: bytes) -> float:
    """Parse a prediction line such as ``0.703793`` or ``0.703793 tag``.

    :raises VowpalWabbitProtocolError: when the line holds no number
    """
    try:
        return float(line)
    except ValueError:
        pass
    try:
        return float(line.split(None, 1)[0])
    except (ValueError, IndexError):
        raise VowpalWabbitProtocolError(
            f"the vw engine printed {line[:200]!r} where a prediction was expected") from None


def parse_scalars(lines: List[bytes]) -> List[float]:
    """Parse prediction lines into floats (fast path for plain numbers)."""
    try:
        return list(map(float, lines))
    except ValueError:
        return [parse_scalar(line) for line in lines]


def parse_labels(lines: List[bytes]) -> List[str]:
    """Parse label-list predictions such as ``0,1 `` (``--plt``) into ``'0,1'``.

    vw ends the list with a space (a lone space when no label applies) and
    prints an example's tag after it: ``0,1  tag`` gives ``'0,1'`` and
    ``  tag`` gives ``''``, never the tag.
    """
    return [line.split(b" ", 1)[0].decode("utf-8", "replace").strip() for line in lines]

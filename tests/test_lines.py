"""Tests for subwabbit.lines: checking VW text lines and parsing prediction lines."""

import pytest

from subwabbit.errors import VowpalWabbitError, VowpalWabbitProtocolError
from subwabbit.lines import (CheckedLines, PrefixedLines, check_header_without_tab, check_line,
                             check_line_part, encode_example, encode_lines, label_words,
                             parse_labels, parse_scalar, parse_scalars)

# ------------------------------------------------------------------ check_line_part


@pytest.mark.parametrize("part", ["", "|u u1 k2", "   ", "|u a:0.5 b", "save|", "ünïcödé"])
def test_check_line_part_accepts_single_line_text(part):
    assert check_line_part(part, "the common part") is None


@pytest.mark.parametrize("part", ["|u a\n|i b", "|u a\r", "\n", "\r\n", "|u a\rb"])
def test_check_line_part_rejects_line_breaks_and_names_the_part(part):
    with pytest.raises(ValueError, match="the common part contains a line break"):
        check_line_part(part, "the common part")


@pytest.mark.parametrize("part", [None, b"|u a", 1, ["|u a"]])
def test_check_line_part_rejects_non_strings(part):
    with pytest.raises(TypeError, match=r"^the common part must be a str, got " + type(part).__name__):
        check_line_part(part, "the common part")


# ------------------------------------------------------------------ check_line

ACCEPTED_LINES = [
    "|u u1 |i i7",
    "1 |u u1 |i i7",
    "1 2.0 'tag |u u1",
    " ",                   # only spaces: vw answers it (an example with the constant only)
    "   ",
    "|",
    "1 |",                 # featureless, but not tagged save
    "|save a",             # a namespace named save with feature a
    "| saved_feature",     # a feature named saved_feature
    "|u saveme",
    "'1save |",            # the tag does not start with save
    "unsaved |",
    "1 'tag |u u1 save",
    " \ufeffsave_x|",       # vw drops a byte order mark only at the very start of a line
    "\ufeff\ufeffsave_x|",  # and only one
]


@pytest.mark.parametrize("line", ACCEPTED_LINES)
def test_check_line_accepts_one_example(line):
    assert check_line(line, 3) is None


@pytest.mark.parametrize("line", ["|u a\n|i b", "|u a\n", "\n", "|u a\r|i b", "|u a\r", "\r\n"])
def test_check_line_rejects_embedded_line_breaks(line):
    with pytest.raises(ValueError, match=r"formatted example #5 contains a line break"):
        check_line(line, 5)


def test_check_line_rejects_empty_line():
    with pytest.raises(ValueError, match=r"formatted example #2 is empty"):
        check_line("", 2)


def test_check_line_default_index_is_zero():
    with pytest.raises(ValueError, match=r"formatted example #0 is empty"):
        check_line("")


SAVE_COMMANDS = [
    "save|",
    "save_/tmp/m.vw|",
    "1 save_x|",
    "foo bar save_y|",
    "'save_z |",
    "1 'saveme |",
    "save",
    "1 save",
    "'save",
    "save_x|a",           # a namespace named a without features
    "save|a ",
    "save|\t",
    "save_x| |a",
    "save_x|\x0b",
    # With features: vw still saves instead of answering when it is left with
    # one namespace (--noconstant) or none (--ignore, zero values).
    "1 save_x| a",
    "save | a",
    "save |a b",
    "save |a |b c",
    "'save_x |a:2 x",
    "save_x|\ta",
    "1 'saved_item |i x",
    "\ufeffsave_x|",        # vw drops the byte order mark, then reads its save command
    "\ufeff'save_x |a",
    "\ufeffsave",
]


@pytest.mark.parametrize("line", SAVE_COMMANDS)
def test_check_line_rejects_tags_starting_with_save(line):
    with pytest.raises(ValueError, match=r"formatted example #7 has a tag starting with 'save'"):
        check_line(line, 7)


@pytest.mark.parametrize("line", [None, b"|u a", 3, 1.5])
def test_check_line_rejects_non_strings(line):
    with pytest.raises(TypeError, match=r"formatted example #4 must be a str"):
        check_line(line, 4)


@pytest.mark.parametrize("line", ["save_x| a:0", "save_x| a:0 b:0.0", "save_x|ns b:0"])
def test_check_line_rejects_save_tag_with_only_zero_valued_features(line):
    with pytest.raises(ValueError):
        check_line(line)


@pytest.mark.parametrize("line", ["save_x|a\xa0b", "save_x|a\x0cb", "save_x|a\u2028b"])
def test_check_line_rejects_save_tag_when_only_non_vw_whitespace_separates_tokens(line):
    with pytest.raises(ValueError):
        check_line(line)


# ------------------------------------------------------------------ encode_lines


def test_encode_lines_joins_with_newlines_and_terminates():
    assert encode_lines(["1 |u a", "|u b"]) == b"1 |u a\n|u b\n"


def test_encode_lines_single_line():
    assert encode_lines(["|u a"]) == b"|u a\n"


def test_encode_lines_encodes_utf8():
    assert encode_lines(["|u \u017elu\u0165ou\u010dk\u00fd", "|i \U0001f600"]) == (
        "|u \u017elu\u0165ou\u010dk\u00fd\n|i \U0001f600\n".encode("utf-8"))


def test_encode_lines_accepts_spaces_only_and_save_named_features():
    assert encode_lines([" ", "|save a", "1 |u saved"]) == b" \n|save a\n1 |u saved\n"


def test_encode_lines_accepts_tuple():
    assert encode_lines(("|a x", "|b y"), 4) == b"|a x\n|b y\n"


@pytest.mark.parametrize("lines, offset, message", [
    (["|a x", "|b y", "|c\nz"], 2, "contains a line break"),
    (["|a x", "|b y", "|c\rz"], 2, "contains a line break"),
    (["|a x", "|b y\n"], 1, "contains a line break"),
    (["|a x", ""], 1, "is empty"),
    ([""], 0, "is empty"),
    (["", ""], 0, "is empty"),
    (["|a x", "|b y", "save_q|"], 2, "has a tag starting with 'save'"),
    (["1 'save_model |", "|a x"], 0, "has a tag starting with 'save'"),
])
def test_encode_lines_names_the_bad_line_by_request_index(lines, offset, message):
    with pytest.raises(ValueError, match=rf"formatted example #{10 + offset} {message}"):
        encode_lines(lines, 10)
    with pytest.raises(ValueError, match=rf"formatted example #{offset} {message}"):
        encode_lines(lines)


def test_encode_lines_catches_several_breaks_in_one_line():
    with pytest.raises(ValueError, match=r"#1 "):
        encode_lines(["|a x", "|b\n\ny", "|c"], 0)


@pytest.mark.parametrize("lines, index", [(["|a x", None], 6), ([b"|a x"], 5), ([1, "|a"], 5)])
def test_encode_lines_rejects_non_strings_with_index(lines, index):
    with pytest.raises(TypeError, match=rf"formatted example #{index} must be a str"):
        encode_lines(lines, 5)


@pytest.mark.parametrize("lines", [["|a \ud800"], ["|a x", "|b \udfff"]])
def test_encode_lines_rejects_lone_surrogates(lines):
    with pytest.raises(ValueError):
        encode_lines(lines)
    with pytest.raises(UnicodeEncodeError):
        encode_lines(lines)


@pytest.mark.parametrize("lines, first_index, name", [
    (["|a x", "|b y", "|c \udfff"], 0, "formatted example #2"),
    (["|a x", "|b \ud800 z"], 40, "formatted example #41"),
    (CheckedLines(["|a \ud800"]), 7, "formatted example #7"),
    (PrefixedLines("|u a", ["|i x", "|i \ud800"]), 10, "formatted item #11"),
    (PrefixedLines("|u \ud800", ["|i x", "|i y"]), 10, "the formatted common features"),
])
def test_encode_lines_names_the_line_utf8_cannot_encode(lines, first_index, name):
    # (before, only a position in the batch's text: "... in position 11")
    with pytest.raises(UnicodeEncodeError, match=rf"surrogates not allowed, in {name}: '") as error:
        encode_lines(lines, first_index)
    assert error.value.object[error.value.start] in "\ud800\udfff"


@pytest.mark.parametrize("lines, name", [
    (["shared |u a", "|i x", "|i \ud800"], "formatted item #1"),
    (["shared |u \ud800", "|i x"], "the shared line"),
])
def test_encode_example_names_the_line_utf8_cannot_encode(lines, name):
    with pytest.raises(UnicodeEncodeError, match=rf"in {name}: '"):
        encode_example(lines)


# ------------------------------------------------------------------ parse_scalar(s)


@pytest.mark.parametrize("line, expected", [
    (b"0.703793", 0.703793),
    (b"1", 1.0),
    (b"-0.25", -0.25),
    (b"0.7 item42", 0.7),
    (b"0.7\titem42", 0.7),
    (b"1e-05 tag with spaces", 1e-05),
    (b"0.5\n", 0.5),
    (b"  0.5  ", 0.5),
])
def test_parse_scalar(line, expected):
    value = parse_scalar(line)
    assert isinstance(value, float)
    assert value == pytest.approx(expected, rel=0, abs=0)


@pytest.mark.parametrize("line", [b"", b"abc", b"   ", b"abc 0.5", b"\n", b"1,2"])
def test_parse_scalar_rejects_non_numbers(line):
    with pytest.raises(VowpalWabbitProtocolError) as info:
        parse_scalar(line)
    assert isinstance(info.value, VowpalWabbitError)
    assert repr(line) in str(info.value)
    assert "where a prediction was expected" in str(info.value)


def test_parse_scalars_plain_numbers():
    assert parse_scalars([b"0.703793", b"1", b"-2.5"]) == [0.703793, 1.0, -2.5]


def test_parse_scalars_with_tags_falls_back_per_line():
    assert parse_scalars([b"0.1", b"0.7 item42", b"3 t"]) == [0.1, 0.7, 3.0]


def test_parse_scalars_empty():
    assert parse_scalars([]) == []


@pytest.mark.parametrize("bad", [b"", b"abc"])
def test_parse_scalars_rejects_a_bad_line(bad):
    with pytest.raises(VowpalWabbitProtocolError, match=repr(bad).replace("'", ".")):
        parse_scalars([b"0.5", bad, b"0.25"])


# ------------------------------------------------------------------ parse_labels


@pytest.mark.parametrize("line, expected", [
    (b"0,1 ", "0,1"),
    (b" ", ""),
    (b"", ""),
    (b"3", "3"),
    (b"2,5,7\r", "2,5,7"),
    (b"0,1  tag", "0,1"),  # vw prints the example's tag after the list
    (b"  tag", ""),
])
def test_parse_labels(line, expected):
    assert parse_labels([line]) == [expected]


def test_parse_labels_keeps_order_and_count():
    assert parse_labels([b"0,1 ", b" ", b"4 "]) == ["0,1", "", "4"]


def test_parse_labels_replaces_invalid_utf8():
    assert parse_labels([b"1,\xff "]) == ["1,\ufffd"]


def test_encode_lines_of_nothing_is_nothing():
    assert encode_lines([]) == b""


# ------------------------------------------------------- training lines, checked once

_PIECES = ["|u", "|i", " ", "\t", "a", "b:1", "save", "save_x", "'save", "'", "|", "\n", "\r", ""]


def _random_part(rng):
    return "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 5)))


def _reference_training_lines(common, parts, labels):
    """What train() must send: the default joining, each line checked alone."""
    from subwabbit import VowpalWabbitDummyFormatter
    formatter = VowpalWabbitDummyFormatter()
    lines = [formatter.get_formatted_example(common, part, label=label)
             for part, label in zip(parts, labels)]
    for index, line in enumerate(lines):
        check_line(line, index)
    for index, line in enumerate(lines):  # then no label lost to a tab
        check_header_without_tab(line, f"training example #{index}")
    return lines


def _outcome(function):
    try:
        return "ok", list(function())
    except (ValueError, TypeError) as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("seed", range(40))
def test_training_lines_checked_by_their_parts_equal_lines_checked_one_by_one(seed):
    """train() checks lines of the default joining from their parts (one scan
    of the item parts, the common part's header once); it must accept, refuse
    and name exactly what a check of every line would."""
    import random
    from types import SimpleNamespace

    from subwabbit import VowpalWabbitDummyFormatter
    from subwabbit.client import ClientBase
    from subwabbit.lines import CheckedLines

    rng = random.Random(seed)
    from subwabbit.core.kinds import choose_kind
    me = SimpleNamespace(formatter=VowpalWabbitDummyFormatter(), prediction_kind=choose_kind([]))
    for _ in range(50):
        common = rng.choice(["|u a", "|u a b", "", "x |u a", "save_x |u a", "'save|u", "a b",
                             "|u save"])
        parts = [_random_part(rng) for _ in range(rng.randint(1, 4))]
        labels = [rng.choice([1, -1, 0.5, 2]) for _ in parts]
        expected = _outcome(lambda: _reference_training_lines(common, parts, labels))
        got = _outcome(lambda: ClientBase._format_training_lines(me, common, parts, labels,
                                                                 None, None))
        assert got == expected, (common, parts, labels)
        if got[0] == "ok":
            lines = ClientBase._format_training_lines(me, common, parts, labels, None, None)
            assert isinstance(lines, CheckedLines)
            assert encode_lines(lines) == ("\n".join(expected[1]) + "\n").encode()


def test_encode_lines_does_not_check_checked_lines_again():
    from subwabbit.lines import CheckedLines, check_lines
    assert encode_lines(CheckedLines(["|a x", "|a y"])) == b"|a x\n|a y\n"
    checked = check_lines(["1 |a x", "|a save_x"])
    assert isinstance(checked, CheckedLines) and checked == ["1 |a x", "|a save_x"]
    with pytest.raises(ValueError, match="#3 contains a line break"):
        check_lines(["|a", "|a\nb"], first_index=2)
    # marked as checked, it is sent as it is: the mark is the caller's promise
    assert encode_lines(CheckedLines(["|a", ""])) == b"|a\n\n"


# ------------------------------------------------ lines kept as a prefix and parts


def test_prefixed_lines_stand_for_the_lines_they_join():
    from subwabbit.lines import PrefixedLines
    parts = ["|i a", "|i b c", "|i é"]
    lines = PrefixedLines("|u x ", parts)
    expected = ["|u x |i a", "|u x |i b c", "|u x |i é"]
    assert len(lines) == 3 and list(lines) == expected
    assert lines[0] == expected[0] and lines[-1] == expected[-1]
    assert isinstance(lines[1:], PrefixedLines) and list(lines[1:]) == expected[1:]
    assert list(lines[::2]) == expected[::2] and list(lines[5:]) == []
    assert "|u x |i b c" in lines and lines.index("|u x |i é") == 2
    # encoded at once, exactly as the lines one by one
    assert encode_lines(lines) == ("\n".join(expected) + "\n").encode("utf-8")
    assert encode_lines(lines[1:2]) == "|u x |i b c\n".encode()
    assert encode_lines(lines[3:]) == b"" and PrefixedLines("|u ", []).encode() == b""
    with pytest.raises(IndexError):
        lines[3]  # pylint: disable=pointless-statement



@pytest.mark.parametrize("line", ["1 \t|u a |i b", "1 x\t|u a", "shared \t|u a", "0:1:0.5\t|i c",
                                  "1 |u a\t", "\ufeff1\t|a x"])
def test_a_tab_in_the_header_after_anything_but_spaces_is_refused(line):
    # vw drops everything before a tab in the header: the label or 'shared'.
    if line == "1 |u a\t":  # after the first '|': not in the header
        check_header_without_tab(line, "the line")
        return
    with pytest.raises(ValueError, match="tab before its first"):
        check_header_without_tab(line, "the line")


@pytest.mark.parametrize("line", ["\t|u a", "  \t|u a", "|u\ta", "\ufeff\t|a x", "1 |u a"])
def test_a_tab_with_nothing_but_spaces_before_it_drops_nothing(line):
    check_header_without_tab(line, "the line")


@pytest.mark.parametrize("line, words", [
    ("shared |u a", ["shared"]),
    ("shared 1 |u a", ["shared", "1"]),
    ("shared 'req |u a", ["shared"]),   # a tag starts with '
    ("shared req|u a", ["shared"]),     # or touches the |
    ("|i x", []),
    ("0:1:0.5 |i x", ["0:1:0.5"]),
    ("x y|i x", ["x"]),
    ("\ufeff1 2 |x", ["1", "2"]),
    ("junk \t 1 2 |x", ["1", "2"]),     # vw drops what comes before a tab
])
def test_label_words_split_the_header_as_vw_does(line, words):
    assert label_words(line) == words


def _no_x(words):
    return "no x" if "x" in words else None


def test_check_line_labels_names_the_line_and_skips_blank_headers():
    from subwabbit.lines import check_line_labels  # pylint: disable=import-outside-toplevel
    check_line_labels(["|u x", "  |u x", "'x |u a", "y|u a"], _no_x)
    with pytest.raises(ValueError, match=r"training example #4 has 'x' before its first '\|'"
                                         r".*: no x: 'x \|u a'"):
        check_line_labels(["|u a", "x |u a"], _no_x, first_index=3, what="training example")


@pytest.mark.parametrize("common, parts, header", [
    ("t |u a", ["x |i b"], "t "),        # the common part holds the header
    ("'t", ["|i a", "|i b"], "'t "),     # every part starts with '|'
    ("", ["|i a", "2 |i b"], None),      # each line has its own
    ("", [], None),
])
def test_shared_header_is_the_common_parts_when_every_line_has_it(common, parts, header):
    from subwabbit.lines import shared_header  # pylint: disable=import-outside-toplevel
    assert shared_header(common, parts) == header

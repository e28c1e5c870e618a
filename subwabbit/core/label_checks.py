"""Label parts as vw reads them: numbers, weights, probabilities.

vw reads the numbers of a label (a cost, a probability, an importance
weight) as 32-bit floats with a parser of its own, which misreads some
texts. These checks refuse what it would misread before a line is written.
Nothing in this module does I/O.
"""

import decimal
import math
import numbers
import re
from typing import Any, Optional


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


#: The largest magnitude vw reads as a finite number: it reads labels, costs
#: and weights as 32-bit floats, and a larger one as an infinity (one cost of
#: 1e39 made a --cb_adf model answer nan for ever; found by a review).
FLOAT32_MAX = 3.4028234663852886e38


def check_number(value: Any, what: str) -> None:
    """Check a label part or weight: a real number that vw reads as finite.

    :raises TypeError: for something that is not a number (``bool`` included)
    :raises ValueError: for NaN, an infinity, a magnitude over
        :data:`FLOAT32_MAX`, or one so small (below about ``1e-110``) that
        vw's parser misreads the number as written (:func:`vw_number`:
        ``1e-200`` is read as an infinity, ``1e-250`` as ``1e6``)
    """
    kind = type(value)
    if (kind is int or kind is float) and -FLOAT32_MAX <= value <= FLOAT32_MAX and (
            not -TINY < value < TINY or value == 0):
        return  # (NaN fails both comparisons)
    # (a Decimal, as a database's NUMERIC column gives, is written as str() writes it)
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise TypeError(f"{what} must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = FLOAT32_MAX * 2
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, got {value!r}")
    if abs(number) > FLOAT32_MAX:
        raise ValueError(f"{what} must be at most {FLOAT32_MAX:g} in magnitude (vw reads it "
                         f"as a 32-bit float, and reads a larger one as an infinity), "
                         f"got {value!r}")
    # (as the lines write it: no int is that small, and other reals print as floats)
    if number != 0 and abs(number) < TINY and vw_number(repr(number)) is None:
        raise ValueError(f"{what} is {value!r}, written {number!r}, which vw's "
                         "number parser misreads (its power of ten wraps around 8 bits: "
                         "1e-200 is read as an infinity); as a 32-bit float, as vw keeps it, "
                         "it is 0: pass 0")


#: Below this magnitude the text of a float may hold a power of ten that
#: vw's number parser wraps (see :func:`vw_number`); at or above it none does
#: (``repr`` writes 17 digits at most).
TINY = 1e-110


#: A number that vw's label parsers read in full: digits, an optional sign,
#: ``.`` and exponent. vw's own fast parser reads one without a ``+``; one
#: with a ``+`` (``+3``, ``1e+16``, as Python's ``repr`` writes 1e16) goes
#: to C's ``strtof``, which reads it in full too. Anything else ``strtof``
#: reads a prefix of (``2x`` as 2), or as ``inf`` or hexadecimal.
VW_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\Z")
#: A class label or label as ``strtol`` reads it in full (``--oaa``, ``--multilabel_oaa``).
STRTOL_INT = re.compile(r"\+?[0-9]+\Z")
#: A class or action as vw's hash of a name reads it as a number (``--csoaa``,
#: ``--cb``): digits only; any other word is hashed to some number.
DIGITS = re.compile(r"[0-9]+\Z")


def vw_number(word: str) -> Optional[float]:
    """The number vw reads in a label word (a weight, a cost, a
    probability), when it reads the word as written; ``None`` otherwise:
    vw reads ``x`` and ``nan`` as 0, ``2x`` as 2, a magnitude over
    :data:`FLOAT32_MAX` as an infinity, and a power of ten beyond its
    parser's 8-bit exponent (``1e-200``) as another number (a word with
    a ``+``, such as ``1e+16``, is read by ``strtof``, which has no such limit).
    """
    if VW_NUMBER.match(word) is None:
        return None
    if "+" not in word:  # vw's fast parser
        mantissa, _, exponent = word.lower().partition("e")
        decimals = min(len(mantissa.partition(".")[2]), 35)  # vw counts 35 at most
        if not -128 <= int(exponent or "0") - decimals <= 127:
            return None
    value = float(word)
    return value if abs(value) <= FLOAT32_MAX else None


def weight_problem(word: str) -> Optional[str]:
    """What is wrong with an importance weight word (``None``: nothing)."""
    weight = vw_number(word)
    if weight is None or weight < 0:
        return f"the importance weight {word!r} is not a number >= 0 that vw reads as written"
    return None


def check_scalar_label(label: Any, index: int) -> None:
    """A label of a scalar model: a finite number, or a label string without
    spaces or ``|`` (such as ``'0,1'``, as subwabbit 2.x took).

    :raises ValueError: for ``None``, an empty or malformed string, or a number that is not finite
    :raises TypeError: for something that is neither
    """
    if label is None:
        raise ValueError(f"labels[{index}] is None; every trained item needs a label")
    if isinstance(label, str):
        if not label or any(ch.isspace() or ch in "|" for ch in label):
            raise ValueError(f"labels[{index}] must be a non-empty label without spaces or '|', "
                             f"got {label!r}")
        return
    check_number(label, f"labels[{index}]")


def check_probability(value: Any, what: str) -> None:
    check_number(value, what)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{what} must be a probability in (0, 1] (the probability with which "
                         f"the action was chosen), got {value!r}")

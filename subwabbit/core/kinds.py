"""Kinds of models: what the engine prints for an example, and what it reads as a label.

A vw model's *kind* follows from its reductions. Each kind is one object
that every client (and a pool of engines) uses the same way:

* how an example is laid out: one line per item, or (:attr:`PredictionKind.multi_line`)
  one example per call made of a ``shared`` line, one line per item and an
  empty line;
* how many output lines the engine prints per example
  (:attr:`PredictionKind.answer_lines`), which the
  :class:`~subwabbit.core.channel.Channel` counts;
* how those lines become the typed predictions ``predict`` gives, in item
  order (:meth:`PredictionKind.parse_answers`, :meth:`PredictionKind.parse_example`);
* how a training label is checked and written (:meth:`PredictionKind.check_labels`).

:func:`choose_kind` picks the kind from the engine arguments, from the
options saved in a model file loaded with ``-i`` (which the arguments then
do not show; :mod:`subwabbit.model_file` reads them), or from an explicit
``prediction_type``. Output formats were measured on vw 9.x (both vw's own
driver and the wheel's engine):

============================ ======================================= ==============
reduction                    one example's output                    kind
============================ ======================================= ==============
(none), ``--binary``, ...    ``0.703793``                            ``scalar``
``--oaa 3`` (``--ect``, ...) ``2``                                   ``multiclass``
``--csoaa 3``                ``2``                                   ``cost_sensitive``
``--oaa 3 --probabilities``  ``1:0.49 2:0.22 3:0.28``                ``class_probabilities``
``--multilabel_oaa 3``       ``0,2`` and a space (a space for none)  ``multilabel``
``--plt 10 --top_k 2``       ``4,0`` and a space                     ``multilabel``
``--cb 3``                   ``1`` then an empty line (0-based)      ``cb``
``--cb_explore 3``           ``1:0.97,0:0.02,2:0.01`` then empty     ``cb_explore``
``--cb_adf --rank_all``      ``1:0.38,0:0.57`` then empty            ``cb_adf``
``--cb_explore_adf``         ``1:0.975,0:0.025`` then empty          ``cb_explore_adf``
============================ ======================================= ==============

A tag on the example (the shared line's, for the multi-line kinds) is
printed after a space, and ignored here. Nothing in this module does I/O.
"""

import decimal
import math
import numbers
import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

from ..base import _format_number as _number_text  # a number as vw reads it
from ..engine.program import learns, option_name
from ..errors import VowpalWabbitProtocolError
from ..lines import cost_parts, label_words, parse_labels, parse_scalar, parse_scalars

#: ``prediction_type`` values, each naming a kind.
SCALAR = "scalar"
MULTICLASS = "multiclass"
COST_SENSITIVE = "cost_sensitive"
CLASS_PROBABILITIES = "class_probabilities"
CLASS_SCORES = "class_scores"
MULTILABEL = "multilabel"
LABEL_STRINGS = "label_strings"
CB = "cb"
CB_EXPLORE = "cb_explore"
CB_ADF = "cb_adf"
CB_EXPLORE_ADF = "cb_explore_adf"

#: Reductions whose output subwabbit cannot serve, with the reason.
UNSERVABLE: Dict[str, str] = {
    "--ccb_explore_adf": "conditional contextual bandits answer one line per slot",
    "--slates": "slates answer one line per slot",
    "--csoaa_ldf": "cost-sensitive examples with label-dependent features are multi-line "
                   "examples of another layout",
    "--wap_ldf": "cost-sensitive examples with label-dependent features are multi-line "
                 "examples of another layout",
    "--cbify": "it simulates a bandit from a multiclass data set (an offline tool)",
    "--cbify_ldf": "it simulates a bandit from a data set (an offline tool)",
    "--warm_cb": "it simulates a bandit from a data set (an offline tool)",
    "--explore_eval": "it evaluates exploration offline",
    "--top": "top-k answers several lines per example",
    "--lda": "topic models answer a vector of topic weights",
    "--cats": "continuous actions answer an action and a density",
    "--cats_pdf": "continuous actions answer a density",
    "--cats_tree": "continuous actions are not served",
    "--cb_continuous": "continuous actions are not served",
    "--memory_tree": "its class predictions are not served yet",
    "--emt": "its class predictions are not served yet (vw reads any uint as its label)",
    "--ot": "the offset tree answers a probability per action on one line, which a "
            "scalar model would cut to the first",
    "--cs_active": "active cost-sensitive predictions are not served",
    "--cbzo": "continuous actions are not served",
    "--sample_pdf": "continuous actions are not served",
    "--get_pmf": "continuous actions are not served",
    "--pmf_to_pdf": "continuous actions are not served",
    "--cb_explore_pdf": "continuous actions are not served",
    "--experimental_igl": "interaction-grounded learning is not served",
    "--sendto": "it sends examples to other vw processes",
}

#: Prefix of the learning-to-search options, none of which can be served.
_SEARCH_PREFIX = "--search"


def _protocol_error(line: bytes, expected: str) -> VowpalWabbitProtocolError:
    return VowpalWabbitProtocolError(
        f"the vw engine printed {line[:200]!r} where {expected} was expected")


def _first_token(line: bytes) -> bytes:
    """The text before the first space (the prediction without a tag)."""
    return line.split(b" ", 1)[0]


def _is_int(value: Any) -> bool:
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
            not -_TINY < value < _TINY or value == 0):
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
    if number != 0 and abs(number) < _TINY and vw_number(repr(number)) is None:
        raise ValueError(f"{what} is {value!r}, written {number!r}, which vw's "
                         "number parser misreads (its power of ten wraps around 8 bits: "
                         "1e-200 is read as an infinity); as a 32-bit float, as vw keeps it, "
                         "it is 0: pass 0")


#: Below this magnitude the text of a float may hold a power of ten that
#: vw's number parser wraps (see :func:`vw_number`); at or above it none does
#: (``repr`` writes 17 digits at most).
_TINY = 1e-110


#: A number that vw's label parsers read in full: digits, an optional sign,
#: ``.`` and exponent. vw's own fast parser reads one without a ``+``; one
#: with a ``+`` (``+3``, ``1e+16``, as Python's ``repr`` writes 1e16) goes
#: to C's ``strtof``, which reads it in full too. Anything else ``strtof``
#: reads a prefix of (``2x`` as 2), or as ``inf`` or hexadecimal.
_VW_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\Z")
#: A class label or label as ``strtol`` reads it in full (``--oaa``, ``--multilabel_oaa``).
_STRTOL_INT = re.compile(r"\+?[0-9]+\Z")
#: A class or action as vw's hash of a name reads it as a number (``--csoaa``,
#: ``--cb``): digits only; any other word is hashed to some number.
_DIGITS = re.compile(r"[0-9]+\Z")


def vw_number(word: str) -> Optional[float]:
    """The number vw reads in a label word (a weight, a cost, a
    probability), when it reads the word as written; ``None`` otherwise:
    vw reads ``x`` and ``nan`` as 0, ``2x`` as 2, a magnitude over
    :data:`FLOAT32_MAX` as an infinity, and a power of ten beyond its
    parser's 8-bit exponent (``1e-200``) as another number (a word with
    a ``+``, such as ``1e+16``, is read by ``strtof``, which has no such limit).
    """
    if _VW_NUMBER.match(word) is None:
        return None
    if "+" not in word:  # vw's fast parser
        mantissa, _, exponent = word.lower().partition("e")
        decimals = min(len(mantissa.partition(".")[2]), 35)  # vw counts 35 at most
        if not -128 <= int(exponent or "0") - decimals <= 127:
            return None
    value = float(word)
    return value if abs(value) <= FLOAT32_MAX else None


def _weight_problem(word: str) -> Optional[str]:
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


def _check_probability(value: Any, what: str) -> None:
    check_number(value, what)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{what} must be a probability in (0, 1] (the probability with which "
                         f"the action was chosen), got {value!r}")


class PredictionKind:
    """What the engine prints for one kind of model, and how it reads labels.

    :param origin: what chose the kind, for messages (``'--oaa 3'``,
        ``"prediction_type='multiclass'"``)
    """

    #: the ``prediction_type`` value that names the kind
    name = SCALAR
    #: output lines the engine prints per example (the answer, then for the
    #: contextual-bandit kinds an empty line)
    answer_lines = 1
    #: whether one example is several lines (a ``shared`` line, one line per
    #: item, an empty line that ends it): one ``predict`` call is one example
    multi_line = False
    #: whether a label may carry an importance weight in VW's text format
    weighted = True
    #: what ``predict`` gives per item, for messages and docs
    gives = "a float"

    def __init__(self, origin: str = "") -> None:
        self.origin = origin or f"prediction_type={self.name!r}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} from {self.origin}>"

    def serves_like(self, other: "PredictionKind") -> bool:
        """Whether ``other`` reads answers and takes labels exactly as this
        kind does: the same kind, with the same classes (count, first label,
        names) and answer layout; only what chose it may differ.

        A ``reload()`` may switch only to a model of which this holds: a
        call is read with the kind it was begun with, and what ``predict``
        returns must not change shape under a service.
        """
        return type(self) is type(other) and _settings(self) == _settings(other)

    def summary(self) -> str:
        """The kind in a few words, for messages (``"a 'multiclass' model
        (--oaa 3) whose class label is an int from 1 to 3"``)."""
        return f"a {self.name!r} model ({self.origin})"

    # ------------------------------------------------------------ engine

    def engine_args(self, vw_args: Sequence[str]) -> List[str]:
        """The engine arguments this kind needs: ``vw_args`` and any the
        output format depends on (``--rank_all`` for ``--cb_adf``)."""
        return list(vw_args)

    # ----------------------------------------------------------- answers

    def parse_line(self, line: bytes) -> Any:
        """One example's answer (its first output line) as a prediction.

        :raises VowpalWabbitProtocolError: when it is not one
        """
        return parse_scalar(line)

    def parse_answers(self, lines: List[bytes]) -> List[Any]:
        """Whole answers of single-line examples (``answer_lines`` lines
        each) as predictions, one per example.

        :raises VowpalWabbitProtocolError: when a line is not what the kind prints
        """
        if self.answer_lines == 1:
            return [self.parse_line(line) for line in lines]
        step = self.answer_lines
        for line in lines[1::step]:
            if line:
                raise _protocol_error(line, "the empty line that ends an answer")
        return [self.parse_line(line) for line in lines[0::step]]

    def parse_example(self, lines: List[bytes], items: int) -> List[Any]:
        """The answer to one multi-line example as one prediction per item,
        in item order (multi-line kinds only)."""
        raise NotImplementedError(f"{self.name} examples are single lines")

    def check_probe_answers(self, lines: List[bytes]) -> None:
        """Check that the answer lines to probe examples (a featureless line
        and an empty line, see :data:`~subwabbit.core.channel.PROBE_LINE`)
        have this kind's shape, as they arrive; a start-up check that the
        model is of this kind.

        :raises VowpalWabbitProtocolError: naming the kind, when they are not
        """
        step = self.answer_lines
        for index, line in enumerate(lines):
            try:
                if index % step:
                    if line:
                        raise _protocol_error(line, "the empty line that ends an answer")
                elif self.multi_line:
                    self.parse_example([line, b""], 1)
                else:
                    self.parse_line(line)
            except VowpalWabbitProtocolError as exc:
                raise VowpalWabbitProtocolError(
                    f"the vw engine answered a probe example with {lines!r}, which is not what "
                    f"a {self.name!r} model prints ({self.gives} per item; the kind comes from "
                    f"{self.origin}): {exc.message}. A model file carries its reductions: pass "
                    f"prediction_type= to say which kind of model it is (one of "
                    f"{', '.join(sorted(KINDS))})") from None

    # ------------------------------------------------------------ labels

    def check_labels(self, labels: List[Any]) -> List[Any]:
        """Check every label and return what goes in front of each item's
        features (for a scalar model, the labels themselves, formatted by
        the formatter as in subwabbit 2.x; ``None`` for an unlabelled item
        of a multi-line example).

        :raises ValueError: naming the item and the rule it breaks
        :raises TypeError: for a label of the wrong type
        """
        for index, label in enumerate(labels):
            kind = type(label)
            # Plain ints and floats that vw reads as written pass without a call.
            if not ((kind is int or kind is float) and -FLOAT32_MAX <= label <= FLOAT32_MAX
                    and (not -_TINY < label < _TINY or label == 0)):
                check_scalar_label(label, index)
        return labels

    #: whether :meth:`label_words_problem` checks anything (single-line
    #: kinds whose label grammar is known; a scalar model's is not: see
    #: :meth:`label_words_problem`)
    checks_label_words = False
    #: the labels this kind reads before a line's first ``|``, for messages
    label_rule = "a number"

    def label_words_problem(self, words: List[str]) -> Optional[str]:
        """What vw would misread, or exit on, in the label words of one
        line of a single-line example (:func:`~subwabbit.lines.label_words`:
        what the formatter or a label put before the line's first ``|``,
        without a tag); ``None`` when vw reads them as written.

        A scalar model checks nothing: vw's simple-label parser answers one
        prediction per line whatever the words (it warns and reads a bad
        word as 0), and the scalar kind is also what subwabbit serves when
        it cannot see a model's reductions, whose labels it then cannot
        know (label strings go as they come, as in subwabbit 2.x).

        :param words: one or more label words
        """
        return None

    def label_words_rule(self) -> Optional[Callable[[List[str]], Optional[str]]]:
        """:meth:`label_words_problem`, for the kinds that check label words
        (``None`` for the others, and for the multi-line kinds, whose lines
        :func:`~subwabbit.lines.encode_example` checks)."""
        if self.checks_label_words and not self.multi_line:
            return self.label_words_problem
        return None

    def _refuse_words(self, problem: str) -> str:
        return f"{problem}; {self.origin} reads {self.label_rule} there"

    def check_weights(self, weights: List[Optional[float]]) -> None:
        """Check the importance weights (``None``: none for that item).

        :raises ValueError: for a negative weight, or any weight where the
            kind's labels cannot carry one
        :raises TypeError: for a weight that is not a number (or a number's
            text, which vw must read as written)
        """
        for index, weight in enumerate(weights):
            if weight is None:
                continue
            if not self.weighted:
                raise ValueError(f"weights[{index}] is {weight!r}, but {self.name} labels "
                                 f"({self.origin}) carry no importance weight in VW's text "
                                 "format; pass weights=None")
            if isinstance(weight, str):  # as 2.x wrote it (read from a CSV file, say)
                problem = _weight_problem(weight)
                if problem is not None:
                    raise ValueError(f"weights[{index}]: {problem}")
                continue
            check_number(weight, f"weights[{index}]")
            if weight < 0:
                raise ValueError(f"weights[{index}] is negative: {weight!r}")

    def example_lines(self, common_part: str, item_parts: List[str],
                      labels: Optional[List[Optional[str]]] = None) -> List[str]:
        """The lines of one multi-line example (multi-line kinds only)."""
        raise NotImplementedError(f"{self.name} examples are single lines")


class ScalarKind(PredictionKind):
    """Regression, logistic, ``--binary`` and every reduction that prints one
    number per example: a ``float`` per item; labels are numbers."""

    def parse_answers(self, lines: List[bytes]) -> List[Any]:
        return parse_scalars(lines)


class LabelStringsKind(PredictionKind):
    """The label string the engine prints (``'0,1'``, ``''`` for none), as
    :class:`~subwabbit.plt.VowpalWabbitPLTProcess` gave in subwabbit 2.x.
    With a multilabel reduction (``--plt K``, ``--multilabel_oaa K``:
    ``count`` is ``K``) labels are checked as :class:`MultilabelKind`
    checks them (label strings such as ``'0,1'``, ints, lists of ints, all
    from 0 to K-1; no weights): vw reads ``'a'`` as label 0, ``'1.5'`` as 1,
    learns nothing right from a label out of range and nothing at all from
    a weighted line. Without one, labels as for a scalar model (numbers or
    label strings)."""

    name = LABEL_STRINGS
    gives = "a label string such as '0,1'"

    def __init__(self, origin: str = "", count: Optional[int] = None,
                 ordered: bool = False) -> None:
        super().__init__(origin)
        self.count = count
        self.ordered = ordered
        if count is not None:
            self.weighted = False
            self.checks_label_words = True
            self.label_rule = MultilabelKind.label_rule

    def _multilabel(self) -> "MultilabelKind":
        return MultilabelKind(self.origin, self.count, self.ordered)

    def label_words_problem(self, words: List[str]) -> Optional[str]:
        if self.count is None:
            return super().label_words_problem(words)
        return self._multilabel().label_words_problem(words)

    def check_labels(self, labels: List[Any]) -> List[Any]:
        if self.count is None:
            return super().check_labels(labels)
        for index, label in enumerate(labels):
            if label is None:  # a ValueError, as for every label kind of 2.x
                raise ValueError(f"labels[{index}] is None; every trained item needs a label")
        # A whole float (2.0) was a label in 2.x, and vw reads it as the int.
        labels = [int(label) if type(label) is float and label.is_integer() else label
                  for label in labels]
        return self._multilabel().check_labels(labels)

    def parse_line(self, line: bytes) -> Any:
        if not line:
            raise _protocol_error(line, "a label list (vw prints a space even for none)")
        return parse_labels([line])[0]

    def parse_answers(self, lines: List[bytes]) -> List[Any]:
        if b"" in lines:
            raise _protocol_error(b"", "a label list (vw prints a space even for none)")
        return parse_labels(lines)


class _Classes(NamedTuple):
    """The class labels a multiclass model knows."""

    # (the field hides tuple.count(), which mypy refuses; kept: read as kind.classes.count)
    count: Optional[int]  # type: ignore[assignment]  # K, when the arguments say it
    first: int                    # 1, or 0 with --indexing 0
    names: Optional[Tuple[str, ...]]  # --named_labels

    def describe(self) -> str:
        if self.names is not None:
            return f"one of {', '.join(self.names)} (--named_labels)"
        if self.count is None:
            return f"an int from {self.first}"
        return f"an int from {self.first} to {self.first + self.count - 1}"

    def check(self, label: Any, what: str, origin: str) -> str:
        """Check a class label; return it as vw reads it."""
        if self.names is not None:
            if isinstance(label, str) and label in self.names:
                return label
            raise ValueError(f"{what} must be a class label, {self.describe()} ({origin}), "
                             f"got {label!r}")
        if not _is_int(label):
            if label is None:
                raise ValueError(f"{what} is None; every trained item needs a label")
            raise TypeError(f"{what} must be a class label, {self.describe()} ({origin}), "
                            f"got {label!r}")
        last = None if self.count is None else self.first + self.count - 1
        if label < self.first or (last is not None and label > last):
            rule = ("vw's class labels start at 1" if self.first == 1 and label == 0
                    else f"it must be {self.describe()}")
            raise ValueError(f"{what} is {label!r}; {rule} ({origin})")
        return str(int(label))

    def word_problem(self, word: str, plus_sign: bool) -> Optional[str]:
        """What is wrong with a class label word (``None``: vw reads it as
        this class). A name must be one of ``--named_labels`` (vw reads
        another as class 0); a number, digits (with a ``+`` when
        ``plus_sign``: ``strtol`` reads it), in range: vw exits on ``x`` or
        ``1.5`` under ``--oaa``, hashes it to some class under ``--csoaa``,
        and class 0 makes ``--oaa`` count its classes from 0 from then on."""
        if self.names is not None:
            return None if word in self.names else f"{word!r} is not a class, {self.describe()}"
        if (_STRTOL_INT if plus_sign else _DIGITS).match(word) is None:
            return f"{word!r} is not a class label, {self.describe()}"
        label = int(word)
        if label < self.first or (self.count is not None
                                  and label > self.first + self.count - 1):
            return f"the class {word!r} is out of range: class labels are {self.describe()}"
        return None

    def parse(self, token: bytes, line: bytes) -> Any:
        if self.names is not None:
            text = token.decode("utf-8", "replace")
            if text in self.names:
                return text
            raise _protocol_error(line, "a class label")
        try:
            return int(token)
        except ValueError:
            raise _protocol_error(line, "a class label") from None


class MulticlassKind(PredictionKind):
    """``--oaa``, ``--ect``, ``--log_multi``, ``--recall_tree``: the class
    label per item (an ``int``; a ``str`` with ``--named_labels``); labels
    are class labels, with optional importance weights."""

    name = MULTICLASS
    gives = "a class label"

    def __init__(self, origin: str = "", classes: _Classes = _Classes(None, 1, None)) -> None:
        super().__init__(origin)
        self.classes = classes

    def summary(self) -> str:
        return f"{super().summary()} whose class label is {self.classes.describe()}"

    def parse_line(self, line: bytes) -> Any:
        return self.classes.parse(_first_token(line), line)

    def check_labels(self, labels: List[Any]) -> List[Any]:
        return [self.classes.check(label, f"labels[{index}]", self.origin)
                for index, label in enumerate(labels)]

    checks_label_words = True
    label_rule = "a class label and an optional importance weight"

    def label_words_problem(self, words: List[str]) -> Optional[str]:
        if len(words) > 2:  # vw exits
            return self._refuse_words(f"{len(words)} words")
        problem = self.classes.word_problem(words[0], plus_sign=True)
        if problem is None and len(words) == 2:
            problem = _weight_problem(words[1])
        return None if problem is None else self._refuse_words(problem)


class CostSensitiveKind(MulticlassKind):
    """``--csoaa``: the class label per item; labels are dicts ``{class: cost}``
    (VW's text, such as ``'1:0 2:1 3:1'``, is taken too)."""

    name = COST_SENSITIVE
    weighted = False

    def check_labels(self, labels: List[Any]) -> List[Any]:
        texts = []
        for index, label in enumerate(labels):
            what = f"labels[{index}]"
            if isinstance(label, str):
                label = self._from_text(label, what)
            if not isinstance(label, dict) or not label:
                raise TypeError(f"{what} must be a non-empty dict {{class label: cost}} for a "
                                f"cost-sensitive model ({self.origin}), got {label!r}")
            parts = []
            for klass, cost in label.items():
                text = self.classes.check(klass, f"a class of {what}", self.origin)
                check_number(cost, f"the cost of class {klass!r} in {what}")
                parts.append(f"{text}:{_number_text(cost)}")
            texts.append(" ".join(parts))
        return texts

    def _from_text(self, text: str, what: str) -> Dict[Any, float]:
        """``'1:0 2:1'`` as ``{1: 0.0, 2: 1.0}``, to be checked as a dict."""
        costs: Dict[Any, float] = {}
        for token in text.split():
            klass, colon, cost = token.partition(":")
            try:
                if not colon:
                    raise ValueError()
                key = klass if self.classes.names is not None else int(klass)
                value = float(cost)
            except ValueError:
                raise ValueError(f"{what} must be a dict {{class label: cost}} or VW's text "
                                 f"such as '1:0 2:1', got {text!r}") from None
            if key in costs:  # a dict would keep the last cost alone
                raise ValueError(f"{what} gives the class {klass!r} twice, in {text!r}; each "
                                 "class has one cost")
            costs[key] = value
        return costs

    label_rule = "class:cost words (a class alone: one it may predict), each class once"

    def label_words_problem(self, words: List[str]) -> Optional[str]:
        seen = set()
        for word in words:
            klass, colon, cost = word.partition(":")
            problem = self.classes.word_problem(klass, plus_sign=False)
            if problem is None and colon and vw_number(cost) is None:
                problem = f"the cost in {word!r} is not a number that vw reads as written"
            if problem is None and klass in seen:
                problem = f"the class {klass!r} comes twice"
            if problem is not None:
                return self._refuse_words(problem)
            seen.add(klass)
        return None


class ClassScoresKind(MulticlassKind):
    """``--oaa K --probabilities`` (or ``--scores``): a ``dict`` per item,
    ``{class label: probability}`` (or raw score), in class order; labels
    are class labels."""

    name = CLASS_PROBABILITIES
    gives = "a dict {class label: probability}"

    def parse_line(self, line: bytes) -> Any:
        scores: Dict[Any, float] = {}
        count = self.classes.count
        for token in line.split():
            if count is not None and len(scores) == count:
                break  # a tag follows
            # (the value is last: a --named_labels name may hold a ':')
            klass, colon, value = token.rpartition(b":")
            try:
                if not colon:
                    raise ValueError()
                scores[self.classes.parse(klass, line)] = float(value)
            except (ValueError, VowpalWabbitProtocolError):
                if count is None and scores:
                    break  # a tag follows
                raise _protocol_error(line, "class:probability pairs") from None
        if not scores or (count is not None and len(scores) != count):
            raise _protocol_error(line, f"{count or 'some'} class:probability pairs")
        return scores


class ClassRawScoresKind(ClassScoresKind):
    """``--oaa K --scores``: a ``dict`` ``{class label: raw score}`` per item."""

    name = CLASS_SCORES
    gives = "a dict {class label: score}"


class MultilabelKind(PredictionKind):
    """``--multilabel_oaa``, ``--plt``: a ``list`` of ``int`` labels per item
    (0-based, as vw numbers them; empty when none applies); labels are lists
    of ints (a label string such as ``'0,2'`` is taken too)."""

    name = MULTILABEL
    weighted = False
    gives = "a list of int labels"
    checks_label_words = True
    label_rule = "one comma-separated list of labels"

    def __init__(self, origin: str = "", count: Optional[int] = None,
                 ordered: bool = False) -> None:
        super().__init__(origin)
        self.count = count
        #: whether vw reads a label list in increasing order only
        #: (``--multilabel_oaa``: ``2,0`` learns class 2 alone)
        self.ordered = ordered

    def summary(self) -> str:
        known = "" if self.count is None else f" of {self.count} labels"
        return f"{super().summary()}{known}"

    def parse_line(self, line: bytes) -> Any:
        if b" " not in line:  # vw ends the list with a space, even an empty one
            raise _protocol_error(line, "a label list")
        text = _first_token(line)
        if not text:
            return []
        try:
            return [int(part) for part in text.split(b",")]
        except ValueError:
            raise _protocol_error(line, "a label list") from None

    def check_labels(self, labels: List[Any]) -> List[Any]:
        texts = []
        rule = ("ints from 0" if self.count is None
                else f"ints from 0 to {self.count - 1}")
        for index, label in enumerate(labels):
            what = f"labels[{index}]"
            values = label
            if isinstance(label, str):
                try:
                    values = [int(part) for part in label.split(",")]
                except ValueError:
                    raise ValueError(f"{what} must be a list of labels ({rule}) or a string "
                                     f"such as '0,2', got {label!r}") from None
            elif _is_int(label):
                values = [label]
            elif not isinstance(label, (list, tuple)):
                raise TypeError(f"{what} must be a list of labels ({rule}), got {label!r}")
            if not values:
                raise ValueError(f"{what} is empty; VW's text format has no way to say that no "
                                 "label applies (an example without labels is not learnt)")
            for value in values:
                if not _is_int(value) or value < 0 or (self.count is not None
                                                       and value >= self.count):
                    raise ValueError(f"{what} holds {value!r}; labels of {self.origin} are "
                                     f"{rule}")
            # in increasing order, each once, as --multilabel_oaa reads them
            texts.append(",".join(str(value) for value in sorted({int(v) for v in values})))
        return texts

    def label_words_problem(self, words: List[str]) -> Optional[str]:
        rule = "ints from 0" if self.count is None else f"ints from 0 to {self.count - 1}"
        if len(words) > 1:  # vw reads no label, with an error in its log
            return self._refuse_words(f"{len(words)} words (the labels are {rule}, "
                                      "without a weight)")
        labels = words[0].split(",")
        for label in labels:
            if (_STRTOL_INT.match(label) is None
                    or (self.count is not None and int(label) >= self.count)):
                return self._refuse_words(f"{label!r} is not a label: labels are {rule}")
        numbers = [int(label) for label in labels]
        if self.ordered and any(a >= b for a, b in zip(numbers, numbers[1:])):
            return self._refuse_words(f"{self.origin} reads labels in increasing order "
                                      "only, each once")
        return None


class _BanditLabels:
    """Labels ``(action, cost, probability)`` of ``--cb`` and ``--cb_explore``."""

    count: Optional[int]
    origin: str
    name: str

    def check_labels(self, labels: List[Any]) -> List[Any]:
        texts = []
        for index, label in enumerate(labels):
            what = f"labels[{index}]"
            if not isinstance(label, (tuple, list)) or len(label) != 3:
                raise TypeError(f"{what} must be (action, cost, probability) for {self.origin}, "
                                f"got {label!r}")
            action, cost, probability = label
            last = "K" if self.count is None else str(self.count)
            if not _is_int(action) or action < 1 or (self.count is not None
                                                     and action > self.count):
                raise ValueError(f"the action of {what} is {action!r}; actions are ints from 1 "
                                 f"to {last} ({self.origin})")
            check_number(cost, f"the cost of {what}")
            _check_probability(probability, f"the probability of {what}")
            texts.append(f"{int(action)}:{_number_text(cost)}:{_number_text(probability)}")
        return texts

    checks_label_words = True
    label_rule = ("actions (ints from 1), at most one of them as action:cost:probability "
                  "(a probability in (0, 1])")

    def label_words_problem(self, words: List[str]) -> Optional[str]:
        costs = 0
        for word in words:
            parts = word.split(":")
            problem = self._action_problem(parts[0])
            if problem is None and len(parts) == 2:  # vw reads probability 0: no label
                problem = f"{word!r} has a cost but no probability"
            elif problem is None and len(parts) > 2:
                costs += 1
                problem = self._cost_problem(word, parts)
            if problem is None and costs > 1:  # vw learns from the first only
                problem = "more than one action has a cost"
            if problem is not None:
                return self._refuse_words(problem)  # type: ignore[attr-defined]
        return None

    def _action_problem(self, action: str) -> Optional[str]:
        """What is wrong with an action word (vw hashes one that is not digits)."""
        if _DIGITS.match(action) is None or int(action) < 1 or (
                self.count is not None and int(action) > self.count):
            last = "K" if self.count is None else str(self.count)
            return f"{action!r} is not an action, an int from 1 to {last}"
        return None

    @staticmethod
    def _cost_problem(word: str, parts: List[str]) -> Optional[str]:
        """What is wrong with ``action:cost:probability`` (vw exits on more parts)."""
        if len(parts) > 3:
            return f"{word!r} has more than three parts"
        probability = vw_number(parts[2])
        if vw_number(parts[1]) is None or probability is None or not 0 < probability <= 1:
            return (f"{word!r} is not action:cost:probability with numbers vw reads as "
                    "written and a probability in (0, 1]")
        return None


class CbKind(_BanditLabels, PredictionKind):
    """``--cb K``: the chosen action per item (an ``int`` from 1 to K);
    labels are ``(action, cost, probability)``.

    vw 9 prints the action counted from 0, then an empty line; with
    ``--cb_force_legacy`` it prints the action counted from 1 on one line.
    """

    name = CB
    weighted = False
    gives = "an action (int from 1)"

    def __init__(self, origin: str = "", count: Optional[int] = None,
                 legacy: bool = False) -> None:
        super().__init__(origin)
        self.count = count
        self.legacy = legacy
        self.answer_lines = 1 if legacy else 2

    def summary(self) -> str:
        known = "" if self.count is None else f" of {self.count} actions"
        return f"{super().summary()}{known}{' in the legacy format' if self.legacy else ''}"

    def parse_line(self, line: bytes) -> Any:
        try:
            action = int(_first_token(line))
        except ValueError:
            raise _protocol_error(line, "an action") from None
        return action if self.legacy else action + 1


class CbExploreKind(CbKind):
    """``--cb_explore K``: a ``list`` of K probabilities per item, action 1
    first; labels are ``(action, cost, probability)``.

    vw 9 prints ``action:probability`` pairs (actions from 0) sorted by
    probability, then an empty line; with ``--cb_force_legacy`` the
    probabilities in action order on one line.
    """

    name = CB_EXPLORE
    gives = "a list of probabilities, action 1 first"

    def parse_line(self, line: bytes) -> Any:
        if self.legacy:
            # vw ends each probability with a space, and prints the tag
            # after one more: the first empty word ends the probabilities
            values: List[float] = []
            for token in line.split(b" "):
                if not token or (self.count is not None and len(values) == self.count):
                    break  # a tag follows, or nothing
                try:
                    values.append(float(token))
                except ValueError:
                    if values and self.count is None:
                        break
                    raise _protocol_error(line, "probabilities") from None
            if not values or (self.count is not None and len(values) != self.count):
                raise _protocol_error(line, f"{self.count or 'some'} probabilities")
            return values
        values = parse_action_values(line, None)
        if self.count is not None and len(values) != self.count:
            raise _protocol_error(line, f"{self.count} action:probability pairs")
        return values


def parse_action_values(line: bytes, count: Optional[int]) -> List[float]:
    """``1:0.975,0:0.025`` (actions from 0, any order, a tag after a space)
    as the values in action order.

    :param count: how many actions there must be (``None``: as many as printed)
    :raises VowpalWabbitProtocolError: when the actions are not exactly 0..count-1
    """
    pairs = _first_token(line).split(b",")
    if count is None:
        count = len(pairs)
    values: List[Optional[float]] = [None] * count
    if len(pairs) != count:
        raise _protocol_error(line, f"{count} action:value pairs (one per item)")
    try:
        for pair in pairs:
            action, _, value = pair.partition(b":")
            index = int(action)
            if index < 0 or values[index] is not None:
                raise ValueError()
            values[index] = float(value)
    except (ValueError, IndexError):
        raise _protocol_error(line, f"{count} action:value pairs (one per item)") from None
    return values  # type: ignore[return-value]  # all set: count distinct indexes < count


class AdfKind(PredictionKind):
    """``--cb_adf``: one multi-line example per call; the predicted cost of
    each item (its score; lower is better), in item order. vw is run with
    ``--rank_all`` so that it prints every item's score, not only the best.

    Labels: ``None`` for every item but the one that was shown, whose label
    is ``(cost, probability)``.
    """

    name = CB_ADF
    answer_lines = 2
    multi_line = True
    weighted = False
    gives = "the item's score (its predicted cost)"

    def engine_args(self, vw_args: Sequence[str]) -> List[str]:
        args = list(vw_args)
        if "--rank_all" not in args:
            args.append("--rank_all")
        return args

    def parse_example(self, lines: List[bytes], items: int) -> List[Any]:
        if len(lines) != 2 or lines[1]:
            raise _protocol_error(b"\n".join(lines), "one answer line and an empty line")
        return parse_action_values(lines[0], items)

    def check_labels(self, labels: List[Any]) -> List[Any]:
        texts: List[Optional[str]] = []
        for index, label in enumerate(labels):
            if label is None:
                texts.append(None)
                continue
            what = f"labels[{index}]"
            if not isinstance(label, (tuple, list)) or len(label) != 2:
                raise TypeError(f"{what} must be None or (cost, probability) for the item that "
                                f"was shown ({self.origin}), got {label!r}")
            cost, probability = label
            check_number(cost, f"the cost of {what}")
            _check_probability(probability, f"the probability of {what}")
            texts.append(f"0:{_number_text(cost)}:{_number_text(probability)}")
        labelled = [index for index, text in enumerate(texts) if text is not None]
        if len(labelled) != 1:
            raise ValueError(
                f"exactly one item of a {self.origin} example is labelled (cost, probability): "
                f"the item that was shown; the others are None. Got "
                f"{len(labelled)} labelled items"
                + (f" (labels{labelled[:5]})" if labelled else ""))
        return texts

    def example_lines(self, common_part: str, item_parts: List[str],
                      labels: Optional[List[Optional[str]]] = None) -> List[str]:
        """The lines of one example: the shared line, ``shared`` and the
        common part (``shared |`` when the common part is blank: vw learns
        and predicts the same as without a shared line), then each item's
        part, with its label in front when it has one. The empty line that
        ends the example is added by the channel.

        :param common_part: the result of ``format_common_features``
        :param item_parts: the results of ``format_item_features``
        :param labels: from :meth:`check_labels`, or ``None`` to predict
        """
        _check_item_costs(item_parts)
        if labels is None:
            lines = list(item_parts)
        else:
            lines = [part if text is None else f"{text} {part}"
                     for part, text in zip(item_parts, labels)]
        lines.insert(0, "shared " + common_part if common_part.strip() else "shared |")
        return lines


def _check_item_costs(item_parts: List[str]) -> None:
    """Check the costs that formatted items of a multi-line example carry
    before their ``|`` (a word of two or more non-empty ``:``-separated
    parts, as vw's parser reads a cost): ``action:cost:probability`` with
    numbers vw reads as written and a probability in (0, 1], as ``train``
    writes for the item shown. vw reads a cost of ``1e-200`` or ``1e39`` as an
    infinity, after which a ``--cb_adf`` model answers nan for ever, and
    learns nothing from ``0:1`` (no probability) or ``0:1:0``. (Words of more
    than three parts are refused by :func:`~subwabbit.lines.encode_example`.)

    :raises ValueError: naming the item
    """
    for index, part in enumerate(item_parts):
        if part[:1] == "|" or not isinstance(part, str):
            continue
        for word in label_words(part):
            parts = word.split(":")
            if len(parts) > 3 or len(cost_parts(word)) < 2:
                continue
            problem = (f"{word!r} has a cost but no probability" if len(parts) == 2
                       else _BanditLabels._cost_problem(word, parts))
            if problem is not None:
                raise ValueError(f"formatted item #{index} has the label {word!r} before its "
                                 f"first '|', which vw does not read as written: {problem}: "
                                 f"{part!r}")


class ExploreAdfKind(AdfKind):
    """``--cb_explore_adf``: one multi-line example per call; the
    probability of each item, in item order, to sample the item to show
    from (:func:`~subwabbit.exploration.sample_item`). Labels as ``--cb_adf``."""

    name = CB_EXPLORE_ADF
    gives = "the item's probability"

    def engine_args(self, vw_args: Sequence[str]) -> List[str]:
        return list(vw_args)


#: The kinds by ``prediction_type``, and what each gives per item.
KINDS: Dict[str, str] = {
    SCALAR: "float",
    MULTICLASS: "int class label",
    COST_SENSITIVE: "int class label (train with {label: cost} dicts)",
    CLASS_PROBABILITIES: "dict {class label: probability}",
    CLASS_SCORES: "dict {class label: raw score}",
    MULTILABEL: "list of int labels",
    LABEL_STRINGS: "label string such as '0,1'",
    CB: "int action from 1",
    CB_EXPLORE: "list of probabilities, action 1 first",
    CB_ADF: "the item's score (multi-line)",
    CB_EXPLORE_ADF: "the item's probability (multi-line)",
}

#: Reductions that decide the kind, in order of precedence (a reduction
#: built on another one comes first): option -> prediction_type.
_REDUCTIONS: Tuple[Tuple[str, str], ...] = (
    ("--cb_explore_adf", CB_EXPLORE_ADF),
    ("--cb_adf", CB_ADF),
    ("--cb_explore", CB_EXPLORE),
    ("--cb", CB),
    ("--multilabel_oaa", MULTILABEL),
    ("--plt", MULTILABEL),
    ("--csoaa", COST_SENSITIVE),
    ("--oaa", MULTICLASS),
    ("--ect", MULTICLASS),
    ("--log_multi", MULTICLASS),
    ("--recall_tree", MULTICLASS),
)

#: The same, in the order they decide the kind of a model file: a file
#: saves the reductions a reduction is built on (``--cb 3`` saves ``--cb_adf``
#: as well, ``--cb_explore 3`` both ``--cb_explore_adf`` and ``--cb_adf``).
_SAVED_CB_REDUCTIONS: Tuple[str, ...] = ("--cb_explore", "--cb", "--cb_explore_adf",
                                           "--cb_adf")
_SAVED_REDUCTIONS: Tuple[str, ...] = _SAVED_CB_REDUCTIONS + (
    "--multilabel_oaa", "--plt", "--csoaa", "--oaa", "--ect", "--log_multi", "--recall_tree")

#: What a file saves for the contextual-bandit reductions it is built on
#: (their cost-sensitive learner), not reductions of its own
_SAVED_INTERNALS = ("--csoaa_ldf", "--csoaa_rank")

#: Families of kinds: an explicit prediction_type may refine what the
#: arguments say within a family (``--probabilities`` given again with a
#: model file, say), not contradict it.
_FAMILY = {CLASS_PROBABILITIES: MULTICLASS, CLASS_SCORES: MULTICLASS,
           LABEL_STRINGS: MULTILABEL}


def _option_value(args: Sequence[str], name: str) -> Optional[str]:
    """The value of the last ``name`` option in ``args`` (``''`` when it has none)."""
    value = None
    for index, token in enumerate(args):
        if option_name(token) != name:
            continue
        if "=" in token:
            value = token.split("=", 1)[1]
        elif index + 1 < len(args) and option_name(args[index + 1]) is None:
            value = args[index + 1]
        else:
            value = ""
    return value


def _count(args: Sequence[str], name: str) -> Optional[int]:
    value = _option_value(args, name)
    try:
        return int(value) if value else None
    except ValueError:
        return None


def refuse_unservable(vw_args: Sequence[str], source: str = "vw_args contains") -> None:
    """Refuse reductions whose output subwabbit cannot read.

    :param source: what the messages say holds the options
    :raises ValueError: naming the argument and why
    """
    names = [option_name(token) for token in vw_args]
    for name in names:
        if name is None:
            continue
        if name in UNSERVABLE:
            raise ValueError(f"{source} {name}: subwabbit cannot serve it "
                             f"({UNSERVABLE[name]})")
        if name.startswith(_SEARCH_PREFIX):
            raise ValueError(f"{source} {name}: subwabbit cannot serve learning to "
                             "search (its examples and answers are sequences)")
    if "--probabilities" in names:
        others = [option for option, _ in _REDUCTIONS if option in names and option != "--oaa"]
        if others:
            raise ValueError(f"{source} --probabilities with {others[0]}: subwabbit "
                             "serves --probabilities with --oaa only (with the others vw "
                             "ignores it, refuses it, or prints a second line per example)")


#: Reductions that learn by the parity of a running count of the lines the
#: engine reads, empty lines and save commands included (vw hands each line
#: an example from its pool): a control line the caller did not write must
#: not change that parity (:func:`learns_by_line_count`).
LINE_COUNTING = ("--lrq", "--lrqfa")


def learns_by_line_count(options: Sequence[str]) -> bool:
    """Whether the engine options (arguments and the model file's saved
    options) include a reduction of :data:`LINE_COUNTING`."""
    return any(option_name(token) in LINE_COUNTING for token in options)


#: Reductions whose learning the probe examples would move (an unlabelled
#: example teaches other reductions nothing), measured on vw 9.x: for each
#: example a learning engine reads, ``--bootstrap`` and ``--active``
#: (``--simulation``) draw from the engine's random numbers, and
#: ``--stage_poly`` schedules its support updates by the count of lines read
#: (empty lines and save commands too); ``--rank`` (matrix factorisation)
#: learns differently after an unlabelled example. (``--lrq`` and ``--lrqfa``, which
#: learn by that count's parity, are not moved by a probe's two lines:
#: :data:`LINE_COUNTING`.)
MOVED_BY_EVERY_EXAMPLE = ("--bootstrap", "--active", "--stage_poly", "--rank")


def probes_would_teach(vw_args: Sequence[str], saved_options: Sequence[str]) -> Optional[str]:
    """The reduction of :data:`MOVED_BY_EVERY_EXAMPLE` that a learning engine
    (no ``-t``) runs, from its arguments or the options saved in the model
    file it loads; ``None`` for any other engine. Such an engine is started
    and saved without probe examples (see
    :data:`~subwabbit.core.channel.START_BLANK`).
    """
    if not learns(vw_args):
        return None
    for token in list(vw_args) + list(saved_options):
        name = option_name(token)
        if name in MOVED_BY_EVERY_EXAMPLE:
            return name
    return None


#: Reductions that call the learner under them more than once per example:
#: in audit mode vw then prints more than the three lines per example that
#: audit mode reads, depending on the example (a labelled one, a tree's path).
AUDIT_UNSERVABLE = ("--plt", "--lrq", "--lrqfa", "--multilabel_oaa", "--nn", "--bootstrap",
                    "--boosting", "--autolink", "--interact", "--new_mf", "--stage_poly",
                    "--ksvm")

#: Reductions that, while they learn (no ``-t``), make vw print a second
#: audit record for a labelled line, or a replayed example's record later:
#: three labelled lines gave 15 audit lines (165 with ``--active_cover``)
#: where audit mode reads 9. With ``-t`` they print three lines per
#: example and are served (found by a review).
AUDIT_UNSERVABLE_WHILE_LEARNING = ("--ftrl", "--coin", "--classweight", "--active",
                                   "--active_cover", "--replay_b", "--replay_c", "--baseline")


#: Learners under which vw prints no audit record at all (the prediction
#: line only): audit mode, which reads three lines per example, found out
#: only when its start-up probe went unanswered for ``startup_timeout_s``
#: (found by a review: 60 s, then "did not answer a probe example").
AUDIT_SILENT = ("--OjaNewton", "--svrg", "--noop", "--print")


def refuse_in_audit_mode(vw_args: Sequence[str]) -> None:
    """Refuse, for audit mode, reductions that print several audit lines per
    example (:data:`AUDIT_UNSERVABLE`, and
    :data:`AUDIT_UNSERVABLE_WHILE_LEARNING` without ``-t``) or none
    (:data:`AUDIT_SILENT`). A model loaded
    with ``-i`` carries its reductions in the file: pass the options it
    saved with ``vw_args``; the start-up probe catches some of the others.

    :raises ValueError: naming the argument
    """
    learning = learns(vw_args)
    for token in vw_args:
        name = option_name(token)
        if name in AUDIT_UNSERVABLE:
            raise ValueError(f"audit_mode cannot serve {name}: vw prints more than one "
                             "audit record per example with it, and how many depends on the "
                             "example")
        if name in AUDIT_SILENT:
            raise ValueError(f"audit_mode cannot serve {name}: vw prints no audit record "
                             "with it")
        if learning and name in AUDIT_UNSERVABLE_WHILE_LEARNING:
            raise ValueError(f"audit_mode cannot serve {name} while it learns: vw prints more "
                             "than one audit record for a labelled line with it; explain "
                             "with -t")


def choose_kind(vw_args: Sequence[str], prediction_type: Optional[str] = None,
                default: Optional[str] = None,
                saved_options: Optional[Sequence[str]] = ()) -> PredictionKind:
    """The kind of model the engine arguments, the model file's saved options
    or ``prediction_type`` describe.

    :param vw_args: normalised engine arguments
    :param prediction_type: one of :data:`KINDS`, for a model file whose
        reductions neither the arguments nor its saved options show; it must
        agree with the reductions they do show
    :param default: the kind of a client class when none of them says one
        (:class:`~subwabbit.plt.VowpalWabbitPLTProcess`: ``'label_strings'``,
        used for ``--plt``/``--multilabel_oaa`` or no reduction)
    :param saved_options: the options saved in the model file that
        ``vw_args`` load (:func:`subwabbit.model_file.saved_options_of`):
        its reduction decides the kind when ``vw_args`` name none, and its
        ``--named_labels``, ``--indexing`` and ``--cb_force_legacy`` count
        (vw refuses to start when ``vw_args`` give other values); ``None``
        when they are not read here (a distributed job's driver: each
        node reads them), which leaves what they may tell (a class count)
        to the nodes' own check
    :raises ValueError: for an unknown ``prediction_type``, one that
        contradicts the arguments or the file, or a reduction subwabbit
        cannot serve
    """
    args = list(vw_args)
    refuse_unservable(args)
    if prediction_type is not None and prediction_type not in KINDS:
        raise ValueError(f"prediction_type must be one of {', '.join(sorted(KINDS))}, "
                         f"got {prediction_type!r}")
    names = {option_name(token) for token in args}
    option = next((option for option, _ in _REDUCTIONS if option in names), None)
    where = "in vw_args"
    source = args
    saved = list(saved_options or ())
    if option is None and saved:
        option = _saved_reduction(saved)
        if option is not None:
            where, source = "saved in the model file", saved
            if "--probabilities" in names and option != "--oaa":
                raise ValueError(f"vw_args contain --probabilities for a model file of "
                                 f"{option}: subwabbit serves --probabilities with --oaa only")
    inferred = dict(_REDUCTIONS).get(option) if option else None
    if inferred in (MULTICLASS, None) and "--probabilities" in names:
        inferred = CLASS_PROBABILITIES
    elif inferred == MULTICLASS and "--scores" in names and option == "--oaa":
        inferred = CLASS_SCORES  # (vw ignores --scores with the other reductions)
    if option is not None:
        count = _option_value(source, option)
        reduction = f"{option} {count}" if count else option
        origin = reduction + (", saved in the model file" if source is saved else "")
    else:
        reduction = origin = "--probabilities" if inferred else "no reduction in vw_args"
    if prediction_type is not None:
        chosen = prediction_type
        if chosen == MULTICLASS and inferred in (CLASS_PROBABILITIES, CLASS_SCORES):
            chosen = inferred  # --probabilities given again with a model file
        if inferred is not None and (_FAMILY.get(chosen, chosen)
                                     != _FAMILY.get(inferred, inferred)):
            raise ValueError(f"prediction_type={prediction_type!r} contradicts {reduction} "
                             f"{where}, which makes a {inferred!r} model")
        origin = f"prediction_type={prediction_type!r}"
    elif default is not None and inferred in (None, MULTILABEL):
        chosen = default
    else:
        chosen = inferred or SCALAR
    classes = _count(source, option) if option else None
    if chosen in (CLASS_PROBABILITIES, CLASS_SCORES):
        _check_class_scores(chosen, origin, names, option)
        if (classes is None and saved_options is not None
                and not _option_value(saved + args, "--named_labels")):
            raise ValueError(
                f"a {chosen!r} model ({origin}) needs its class count, which neither vw_args "
                "nor the model file show: pass --oaa K in vw_args, as the model was trained "
                "(vw takes it again with -i); without it the tag an answer may carry after "
                "its class pairs (such as '4:9') would be read as one more class")
    # What the arguments say last counts: the file's options come first.
    return _build(chosen, saved + args, origin, classes, option)


def _check_class_scores(chosen: str, origin: str, names: Set[Optional[str]],
                        option: Optional[str]) -> None:
    """Refuse a ``class_probabilities`` or ``class_scores`` model whose answers
    vw would print otherwise.

    vw prints a ``class:value`` pair per class with ``--oaa`` and
    ``--probabilities`` (probabilities, whatever ``--scores`` says) or
    ``--scores`` (raw scores); neither is kept in a model file, and without
    them vw prints the class alone.

    :param origin: what chose the kind, for messages
    :raises ValueError: naming what is missing or contradicts ``chosen``
    """
    flag = "--probabilities" if chosen == CLASS_PROBABILITIES else "--scores"
    what = f"a {chosen!r} model ({origin})"
    if option not in (None, "--oaa"):
        raise ValueError(f"{what} is served with --oaa only; {option} prints the class alone")
    if chosen == CLASS_SCORES and "--probabilities" in names:
        raise ValueError(f"{what} contradicts --probabilities in vw_args, with which vw prints "
                         "probabilities, not raw scores: pass prediction_type="
                         "'class_probabilities', or leave --probabilities out")
    if flag not in names:
        raise ValueError(f"{what} needs {flag} in vw_args: without it vw prints the class "
                         f"alone (vw does not keep {flag} in a model file)")


def _saved_reduction(saved: List[str]) -> Optional[str]:
    """The reduction that decides the kind of a model file with these saved
    options (``None``: none of :data:`_REDUCTIONS`).

    :raises ValueError: for a reduction subwabbit cannot serve
    """
    names = [option_name(token) for token in saved]
    option = next((option for option in _SAVED_REDUCTIONS if option in names), None)
    internal = _SAVED_INTERNALS if option in _SAVED_CB_REDUCTIONS else ()
    refuse_unservable([token for token in saved if option_name(token) not in internal],
                      source="the model file was trained with")
    return option


#: The reductions that read ``--indexing`` (vw ignores it with ``--ect``,
#: ``--log_multi`` and ``--recall_tree``, whose classes count from 1)
_INDEXED = ("--oaa", "--csoaa")


def _build(chosen: str, args: List[str], origin: str, count: Optional[int],
           option: Optional[str]) -> PredictionKind:
    if chosen in (MULTICLASS, COST_SENSITIVE, CLASS_PROBABILITIES, CLASS_SCORES):
        names_value = _option_value(args, "--named_labels")
        names = tuple(names_value.split(",")) if names_value else None
        first = 0 if (_option_value(args, "--indexing") == "0"
                      and option in (None,) + _INDEXED) else 1
        if names is not None and first == 0:
            raise ValueError(f"{origin}: subwabbit cannot serve --named_labels with --indexing "
                             "0: vw numbers the names from 1 and the classes from 0, so it "
                             "cannot learn the last name, and answers class 0 with an empty "
                             "line")
        classes = _Classes(len(names) if names else count, first, names)
        factory: Callable[..., PredictionKind] = {
            MULTICLASS: MulticlassKind, COST_SENSITIVE: CostSensitiveKind,
            CLASS_PROBABILITIES: ClassScoresKind, CLASS_SCORES: ClassRawScoresKind}[chosen]
        return factory(origin, classes)
    ordered = any(option_name(token) == "--multilabel_oaa" for token in args)
    if chosen == MULTILABEL:
        return MultilabelKind(origin, count, ordered)
    if chosen in (CB, CB_EXPLORE):
        factory = CbExploreKind if chosen == CB_EXPLORE else CbKind
        return factory(origin, count, "--cb_force_legacy" in args)
    if chosen == CB_ADF:
        return AdfKind(origin)
    if chosen == CB_EXPLORE_ADF:
        return ExploreAdfKind(origin)
    if chosen == LABEL_STRINGS:
        # (a count: the multilabel reduction's K, whose labels are checked)
        return LabelStringsKind(origin, count, ordered)
    return ScalarKind(origin)


def _settings(kind: PredictionKind) -> List[Any]:
    """A kind's own settings (classes, counts, answer layout), but what chose it."""
    return sorted((key, value) for key, value in vars(kind).items() if key != "origin")

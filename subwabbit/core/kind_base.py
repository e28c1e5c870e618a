"""The base of every kind of model: the names of the kinds, what a kind
does (:class:`PredictionKind`) and the scalar kind. The other kinds are in
:mod:`subwabbit.core.class_kinds` and :mod:`subwabbit.core.bandit_kinds`;
:mod:`subwabbit.core.kinds` chooses one. Nothing in this module does I/O.
"""

from typing import Any, Callable, Dict, List, Optional, Sequence

from ..errors import VowpalWabbitProtocolError
from ..lines import parse_scalar, parse_scalars
from .label_checks import FLOAT32_MAX, TINY, check_number, check_scalar_label, weight_problem

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


def protocol_error(line: bytes, expected: str) -> VowpalWabbitProtocolError:
    return VowpalWabbitProtocolError(
        f"the vw engine printed {line[:200]!r} where {expected} was expected")


def first_token(line: bytes) -> bytes:
    """The text before the first space (the prediction without a tag)."""
    return line.split(b" ", 1)[0]


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
                raise protocol_error(line, "the empty line that ends an answer")
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
                        raise protocol_error(line, "the empty line that ends an answer")
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
                    and (not -TINY < label < TINY or label == 0)):
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
                problem = weight_problem(weight)
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


def _settings(kind: PredictionKind) -> List[Any]:
    """A kind's own settings (classes, counts, answer layout), but what chose it."""
    return sorted((key, value) for key, value in vars(kind).items() if key != "origin")

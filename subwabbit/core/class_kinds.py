"""The kinds of classifiers: multiclass (``--oaa``, ``--ect``, ...),
cost-sensitive (``--csoaa``), class probabilities and scores, multilabel
(``--multilabel_oaa``, ``--plt``) and label strings. Nothing in this module
does I/O.
"""

from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ..base import _format_number as _number_text  # a number as vw reads it
from ..errors import VowpalWabbitProtocolError
from ..lines import parse_labels
from .kind_base import (CLASS_PROBABILITIES, CLASS_SCORES, COST_SENSITIVE, LABEL_STRINGS,
                        MULTICLASS, MULTILABEL, PredictionKind, first_token, protocol_error)
from .label_checks import DIGITS, STRTOL_INT, check_number, is_int, vw_number, weight_problem


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
            raise protocol_error(line, "a label list (vw prints a space even for none)")
        return parse_labels([line])[0]

    def parse_answers(self, lines: List[bytes]) -> List[Any]:
        if b"" in lines:
            raise protocol_error(b"", "a label list (vw prints a space even for none)")
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
        if not is_int(label):
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
        if (STRTOL_INT if plus_sign else DIGITS).match(word) is None:
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
            raise protocol_error(line, "a class label")
        try:
            return int(token)
        except ValueError:
            raise protocol_error(line, "a class label") from None


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
        return self.classes.parse(first_token(line), line)

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
            problem = weight_problem(words[1])
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
                raise protocol_error(line, "class:probability pairs") from None
        if not scores or (count is not None and len(scores) != count):
            raise protocol_error(line, f"{count or 'some'} class:probability pairs")
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
            raise protocol_error(line, "a label list")
        text = first_token(line)
        if not text:
            return []
        try:
            return [int(part) for part in text.split(b",")]
        except ValueError:
            raise protocol_error(line, "a label list") from None

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
            elif is_int(label):
                values = [label]
            elif not isinstance(label, (list, tuple)):
                raise TypeError(f"{what} must be a list of labels ({rule}), got {label!r}")
            if not values:
                raise ValueError(f"{what} is empty; VW's text format has no way to say that no "
                                 "label applies (an example without labels is not learnt)")
            for value in values:
                if not is_int(value) or value < 0 or (self.count is not None
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
            if (STRTOL_INT.match(label) is None
                    or (self.count is not None and int(label) >= self.count)):
                return self._refuse_words(f"{label!r} is not a label: labels are {rule}")
        numbers = [int(label) for label in labels]
        if self.ordered and any(a >= b for a, b in zip(numbers, numbers[1:])):
            return self._refuse_words(f"{self.origin} reads labels in increasing order "
                                      "only, each once")
        return None

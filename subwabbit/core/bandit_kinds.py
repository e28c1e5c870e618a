"""The kinds of contextual bandits: ``--cb``, ``--cb_explore`` (one line
per item) and ``--cb_adf``, ``--cb_explore_adf`` (one multi-line example per
call). Nothing in this module does I/O.
"""

from typing import Any, List, Optional, Sequence

from ..base import _format_number as _number_text  # a number as vw reads it
from ..lines import cost_parts, label_words
from .kind_base import (CB, CB_ADF, CB_EXPLORE, CB_EXPLORE_ADF, PredictionKind, first_token,
                        protocol_error)
from .label_checks import DIGITS, check_number, check_probability, is_int, vw_number


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
            if not is_int(action) or action < 1 or (self.count is not None
                                                     and action > self.count):
                raise ValueError(f"the action of {what} is {action!r}; actions are ints from 1 "
                                 f"to {last} ({self.origin})")
            check_number(cost, f"the cost of {what}")
            check_probability(probability, f"the probability of {what}")
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
        if DIGITS.match(action) is None or int(action) < 1 or (
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
            action = int(first_token(line))
        except ValueError:
            raise protocol_error(line, "an action") from None
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
                    raise protocol_error(line, "probabilities") from None
            if not values or (self.count is not None and len(values) != self.count):
                raise protocol_error(line, f"{self.count or 'some'} probabilities")
            return values
        values = parse_action_values(line, None)
        if self.count is not None and len(values) != self.count:
            raise protocol_error(line, f"{self.count} action:probability pairs")
        return values


def parse_action_values(line: bytes, count: Optional[int]) -> List[float]:
    """``1:0.975,0:0.025`` (actions from 0, any order, a tag after a space)
    as the values in action order.

    :param count: how many actions there must be (``None``: as many as printed)
    :raises VowpalWabbitProtocolError: when the actions are not exactly 0..count-1
    """
    pairs = first_token(line).split(b",")
    if count is None:
        count = len(pairs)
    values: List[Optional[float]] = [None] * count
    if len(pairs) != count:
        raise protocol_error(line, f"{count} action:value pairs (one per item)")
    try:
        for pair in pairs:
            action, _, value = pair.partition(b":")
            index = int(action)
            if index < 0 or values[index] is not None:
                raise ValueError()
            values[index] = float(value)
    except (ValueError, IndexError):
        raise protocol_error(line, f"{count} action:value pairs (one per item)") from None
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
            # first: an option left without its value at the end of vw_args
            # (--readable_model) would take it as its value
            args.insert(0, "--rank_all")
        return args

    def parse_example(self, lines: List[bytes], items: int) -> List[Any]:
        if len(lines) != 2 or lines[1]:
            raise protocol_error(b"\n".join(lines), "one answer line and an empty line")
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
            check_probability(probability, f"the probability of {what}")
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

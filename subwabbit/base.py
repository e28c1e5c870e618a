"""The formatter and model interfaces (import path kept from subwabbit 2.x)."""

import numbers
from abc import ABC, abstractmethod
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from .errors import VowpalWabbitError
from .explanation import HtmlExplanation, explain_features, explanation_html

__all__ = ["VowpalWabbitBaseFormatter", "VowpalWabbitDummyFormatter", "VowpalWabbitBaseModel",
           "VowpalWabbitError"]

Label = Union[float, int, str]


def _format_number(value: Union[float, int, str]) -> str:
    """A label or weight as vw reads it (NumPy scalars print as plain numbers)."""
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is float:
        return repr(value)
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return str(int(value))
    return repr(float(value))


class VowpalWabbitBaseFormatter(ABC):
    """Turns a request's objects into VW text examples.

    A model calls :meth:`format_common_features` once per ``predict``/``train``
    call and :meth:`format_item_features` once per item, then joins the two
    parts with :meth:`get_formatted_example`. Subclasses may also translate
    VW feature names back into readable ones in :meth:`parse_element`.

    Every formatted example must be a single line: the model checks this and
    raises :class:`ValueError` otherwise.

    For the multi-line kinds (``--cb_adf``, ``--cb_explore_adf``) the parts
    are not joined: the items of one call make one example, whose first line
    is ``shared`` followed by what :meth:`format_common_features` returns
    (the request's features, without a label), then one line per item with
    what :meth:`format_item_features` returns (see :doc:`model_kinds`).
    """

    @abstractmethod
    def format_common_features(self, common_features: Any, debug_info: Any = None) -> str:
        """Format the features shared by every item of one call.

        :param common_features: the request's features (user, context, ...)
        :param debug_info: the object passed to ``predict``/``train``, for debugging
        :returns: a part of a VW line, normally starting with ``|namespace``
        """
        raise NotImplementedError()

    @abstractmethod
    def format_item_features(self, common_features: Any, item_features: Any,
                             debug_info: Any = None) -> str:
        """Format the features of one item (caching the result is a good idea).

        :param common_features: the request's features
        :param item_features: this item's features
        :param debug_info: the object passed to ``predict``/``train``
        :returns: a part of a VW line, normally starting with ``|namespace``
        """
        raise NotImplementedError()

    def get_formatted_example(self, common_line_part: str, item_line_part: str,
                              label: Optional[Label] = None, weight: Optional[float] = None,
                              debug_info: Any = None) -> str:  # pylint: disable=unused-argument
        """Join the common and item parts into one VW example, with an optional
        label and importance weight in front.

        :param common_line_part: the result of :meth:`format_common_features`
        :param item_line_part: the result of :meth:`format_item_features`
        :param label: the label (a number, or a string such as ``'0,1'`` for ``--plt``)
        :param weight: the importance weight; needs a label
        :param debug_info: the object passed to ``predict``/``train``
        :returns: one line of VW input format, without the newline
        """
        if label is None:
            if weight is not None:
                raise ValueError("a weight needs a label")
            return f"{common_line_part} {item_line_part}"
        if weight is None:
            return f"{_format_number(label)} {common_line_part} {item_line_part}"
        return f"{_format_number(label)} {_format_number(weight)} {common_line_part} {item_line_part}"

    def get_human_readable_explanation(self, explanation_string: str,
                                       feature_translator: Any = None) -> List[Dict[str, Any]]:
        """Turn an explanation from ``explain_vw_line`` into dicts sorted by
        contribution to the score, largest first::

            {
                'names': [('User', 'age 30-40'), ('Item', 'Sports')],  # one pair per
                                                # element of an interaction
                'original_feature_name': 'u^a3*i^c8',
                'hashindex': 123,
                'value': 1.0,
                'weight': -0.534,
                'potential': -0.534,            # value * weight
                'relative_potential': 0.25,     # abs(potential) / sum of abs(potentials)
            }

        :param explanation_string: the second item ``explain_vw_line`` returns
            (a leading tab, as 9.x prints it, is accepted)
        :param feature_translator: passed to :meth:`parse_element`, e.g. a database handle
        :returns: the features, most important first
        """
        return explain_features(explanation_string, self.parse_element, feature_translator)

    def get_human_readable_explanation_html(self, explanation_string: str,
                                            feature_translator: Any = None,
                                            max_rows: Optional[int] = None) -> HtmlExplanation:
        """Render :meth:`get_human_readable_explanation` as an HTML table.

        The result is a ``str`` subclass with ``_repr_html_``, so Jupyter shows
        it as a table; IPython is not needed.

        :param explanation_string: the second item ``explain_vw_line`` returns
        :param feature_translator: passed to :meth:`parse_element`
        :param max_rows: show only this many of the most important features
        """
        rows = self.get_human_readable_explanation(explanation_string, feature_translator)
        return explanation_html(rows, max_rows)

    def parse_element(self, element: str,
                      feature_translator: Any = None) -> Tuple[str, str]:  # pylint: disable=unused-argument
        """Translate one ``namespace^feature`` element into readable names.

        :param element: e.g. ``'i^i123'``; ``'Constant'`` has no namespace
        :param feature_translator: whatever helps the translation
        :returns: ``(namespace name, feature name)``
        """
        namespace, caret, feature = element.partition("^")
        if not caret:
            return "", element
        return namespace, feature


def example_joiner(formatter: Any) -> Optional[Any]:
    """The formatter's own ``get_formatted_example``, or ``None`` when it
    joins the parts the default way.

    Only a method its class defines counts: a duck-typed formatter without
    one, or a :class:`unittest.mock.Mock` (whose attributes exist on the
    instance only), gets the default joining.
    """
    method = getattr(type(formatter), "get_formatted_example", None)
    if method is None or method is VowpalWabbitBaseFormatter.get_formatted_example:
        return None
    return formatter.get_formatted_example


class VowpalWabbitDummyFormatter(VowpalWabbitBaseFormatter):
    """A formatter for features that are already VW text: common and item
    features are used as given."""

    def format_common_features(self, common_features: str, debug_info: Any = None) -> str:
        return common_features

    def format_item_features(self, common_features: Any, item_features: str,
                             debug_info: Any = None) -> str:
        return item_features


class VowpalWabbitBaseModel(ABC):
    """The interface of a VW model: predictions, training and explanations."""

    def __init__(self, formatter: VowpalWabbitBaseFormatter) -> None:
        self.formatter = formatter

    @abstractmethod
    def predict(self, common_features: Any, items_features: Iterable[Any],
                timeout: Optional[float] = None, debug_info: Any = None,
                metrics: Optional[Dict[str, Any]] = None,
                detailed_metrics: Optional[Dict[str, Any]] = None) -> Iterator[Any]:
        """Predictions for the items, in item order.

        :param common_features: features shared by all items
        :param items_features: one entry per item
        :param timeout: seconds for the call; with a timeout fewer predictions
            than items may come back. ``None``: no limit
        :param debug_info: passed to every formatter call
        :param metrics: a dict to fill with the call's metrics
        :param detailed_metrics: a dict to fill with timing series
        """
        raise NotImplementedError()

    @abstractmethod
    def train(self, common_features: Any, items_features: Iterable[Any],
              labels: Iterable[Label], weights: Optional[Iterable[Optional[float]]] = None,
              debug_info: Any = None) -> None:
        """Learn from labelled items.

        :param common_features: features shared by all items
        :param items_features: one entry per item
        :param labels: one label per item
        :param weights: one importance weight (or ``None``) per item
        :param debug_info: passed to every formatter call
        """
        raise NotImplementedError()

    @abstractmethod
    def explain_vw_line(self, vw_line: str, link_function: bool = False) -> Tuple[float, str]:
        """Audit one example.

        :param vw_line: one example in VW text format
        :param link_function: accepted for compatibility
        :returns: ``(raw prediction, explanation string)``
        """
        raise NotImplementedError()

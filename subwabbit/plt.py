"""A blocking model for Probabilistic Label Tree (``--plt``) engines."""

from typing import Any, Callable, List

from .blocking import VowpalWabbitProcess
from .lines import parse_labels


class VowpalWabbitPLTProcess(VowpalWabbitProcess):
    """:class:`~subwabbit.blocking.VowpalWabbitProcess` for ``--plt`` models:
    each prediction is the label string the engine prints, such as ``'0,1'``
    (``''`` when no label passes the threshold). Train with label strings
    (``'0,1'``) or integer labels. Takes the same arguments."""

    parse_predictions: Callable[[List[bytes]], List[Any]] = staticmethod(parse_labels)

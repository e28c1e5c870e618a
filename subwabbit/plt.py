"""A blocking model for Probabilistic Label Tree (``--plt``) engines."""

from .blocking import VowpalWabbitProcess
from .core.kinds import LABEL_STRINGS


class VowpalWabbitPLTProcess(VowpalWabbitProcess):
    """:class:`~subwabbit.blocking.VowpalWabbitProcess` for ``--plt`` models,
    as in subwabbit 2.x: each prediction is the label string the engine
    prints, such as ``'0,1'`` (``''`` when no label passes the threshold).
    Train with label strings (``'0,1'``) or integer labels. Takes the same
    arguments.

    (A :class:`~subwabbit.blocking.VowpalWabbitProcess` with ``--plt`` in
    ``vw_args`` gives lists of ints instead: see :doc:`model_kinds`.)
    """

    _default_prediction_type = LABEL_STRINGS

"""The blocking model: best throughput, blocking pipes."""

from typing import Any, Dict, Iterable, Iterator, Optional, Sequence, Union

# VowpalWabbitBaseModel and VowpalWabbitError: 2.x code imports them from here.
from .base import Label, VowpalWabbitBaseFormatter, VowpalWabbitBaseModel  # pylint: disable=unused-import
from .client import DEFAULT_IO_TIMEOUT_S, MetricsHook
from .command import VwArgs
from .core.exchanges import Pacing
from .deadlines import validate_seconds
from .errors import VowpalWabbitError  # pylint: disable=unused-import
from .process_model import VowpalWabbitProcessModel

#: Default lines per write. Measured with ``python -m benchmarks.batch_size``
#: (30 requests of 1,000 items, a quadratic interaction, 2-core machine, two
#: batches in flight and the engine's one-thread loop):
#: 51k predictions/s at 1, 151k at 10, 191k at 20, 206k at 50, 222k at 100,
#: 193k at 200, 145k at 500. 50 is within 8% of the peak while keeping the
#: work in flight after a deadline (about one batch) small.
DEFAULT_BATCH_SIZE = 50

#: The most batches a call keeps in flight while its deadline is far (and
#: always, without a timeout). With a timeout, a call keeps two batches until
#: its first predictions arrive, and as the deadline nears only what the
#: engine is expected to answer by then plus one batch, so what it usually
#: waits for after its deadline is about one batch (at most this many, if the
#: engine slows down near the deadline). ``python -m benchmarks.blocking_pacing
#: --items 6000 two-batches default 200:100 200:0`` (one process, 1,000 calls
#: each, 10 ms): 1.020x the predictions of two batches at any time, with a
#: mean wall time of 10.29 ms against 10.39 (see :doc:`throughput` for more).
MAX_BATCHES_IN_FLIGHT = 4


class VowpalWabbitProcess(VowpalWabbitProcessModel):
    """A VW model served by a vw engine over blocking pipes.

    ``predict`` formats items in batches and writes batch *k+1* before it
    reads the predictions of batch *k* (up to :data:`MAX_BATCHES_IN_FLIGHT`
    batches ahead while the deadline is far), so the engine is never idle
    while Python formats lines. A timeout stops the formatting of new items; the
    predictions of what was already sent are still read (so a call can end a
    little after its deadline: use :class:`~subwabbit.nonblocking.VowpalWabbitNonBlockingProcess`
    for a hard deadline).

    :param formatter: turns common and item features into VW lines
    :param vw_args: engine arguments, e.g. ``['-i', 'model.vw', '-t', '--quiet']``;
        ``-p``, ``-d``, ``--audit`` and ``--log_output`` are set by subwabbit
        and rejected here (an ``-a``/``--audit`` is dropped with ``audit_mode=True``)
    :param batch_size: lines per write; see :data:`DEFAULT_BATCH_SIZE`
    :param write_only: the engine prints no predictions: fastest online
        training, but ``predict`` is unavailable
    :param audit_mode: run the engine with ``--audit`` for :meth:`explain_vw_line`
        (``predict`` and ``train`` are then unavailable)
    :param vw_command: the engine command (a path or an argv list); default:
        ``$SUBWABBIT_VW``, else ``vw`` on ``PATH``, else the engine of the
        ``vowpalwabbit`` wheel
    :param metrics_hook: called with each call's metrics dict when the call ends
    :param startup_timeout_s: how long the engine may take to start (model loading included);
        positive (0 is a :class:`ValueError`)
    :param io_timeout_s: the longest the engine may leave a read or a write
        waiting; then the call raises :class:`~subwabbit.errors.VowpalWabbitTimeoutError`
        and the process counts as failed. ``None``: wait forever (subwabbit 2.x)
    :param restart_on_crash: after the engine fails, start a fresh one at the
        next call (counted in ``metrics['restarts']`` and :attr:`restart_count`,
        logged) instead of raising until :meth:`restart`
    :param restart_after_fork: in a process forked after this object was
        created, start an engine of its own at the first call (``True``) or
        raise :class:`~subwabbit.errors.VowpalWabbitError` (``False``); the
        parent's engine is never touched
    :param max_lateness_s: with a timeout, return at the latest this long after
        the deadline with the predictions that have arrived; what is still in
        flight is discarded by the next call. ``None`` (the default): read the
        predictions of everything sent before the deadline, however long that
        takes. See :doc:`throughput` for what a bound costs in predictions
    :param prediction_type: the kind of model, when ``vw_args`` do not show
        it (a model file carries its reductions): ``'multiclass'``,
        ``'cb_explore_adf'``, ... (see :doc:`model_kinds`); ``None``: from
        ``vw_args``. It decides what ``predict`` gives and ``train`` takes
    :raises VowpalWabbitStartupError: when the engine cannot start (the message
        carries the engine's own words)
    :raises ValueError: for invalid arguments
    """

    def __init__(self, formatter: VowpalWabbitBaseFormatter, vw_args: VwArgs,
                 batch_size: int = DEFAULT_BATCH_SIZE, write_only: bool = False,
                 audit_mode: bool = False, vw_command: Union[str, Sequence[str], None] = None, *,
                 metrics_hook: Optional[MetricsHook] = None,
                 startup_timeout_s: float = 60.0,
                 io_timeout_s: Optional[float] = DEFAULT_IO_TIMEOUT_S,
                 restart_on_crash: bool = False, restart_after_fork: bool = True,
                 max_lateness_s: Optional[float] = None,
                 prediction_type: Optional[str] = None) -> None:
        self.max_lateness_s = validate_seconds(max_lateness_s, "max_lateness_s")
        super().__init__(formatter, vw_args, batch_size, write_only=write_only,
                         audit_mode=audit_mode, vw_command=vw_command,
                         metrics_hook=metrics_hook, startup_timeout_s=startup_timeout_s,
                         io_timeout_s=io_timeout_s, restart_on_crash=restart_on_crash,
                         restart_after_fork=restart_after_fork, prediction_type=prediction_type)

    _detailed_keys = ("generating_lines_time", "sending_lines_time", "receiving_lines_time")
    _timing_per_line = True  # as subwabbit 2.x documented

    def _pacing(self) -> Pacing:
        # Whole batches, up to MAX_BATCHES_IN_FLIGHT ahead of the engine (at
        # least batch k+1 is written before the answers of batch k are read);
        # as the deadline nears, no more than the engine can answer by then
        # plus one batch. The deadline stops formatting only.
        return Pacing(batch_size=self.batch_size,
                      max_in_flight_lines=MAX_BATCHES_IN_FLIGHT * self.batch_size,
                      min_batch=self.batch_size, hard_deadline=False,
                      max_lateness_s=self.max_lateness_s, lines_at_deadline=self.batch_size)

    # ------------------------------------------------------------ predict

    def predict(self, common_features: Any, items_features: Iterable[Any],
                timeout: Optional[float] = None, debug_info: Any = None,
                metrics: Optional[Dict[str, Any]] = None,
                detailed_metrics: Optional[Dict[str, Any]] = None) -> Iterator[Any]:
        """Predictions for the items, in item order.

        The timeout counts from this call. The returned iterator does the work
        as it is consumed; abandoning it is safe (the next call discards what
        it left in flight), but resuming it after another call on this process
        raises :class:`~subwabbit.errors.VowpalWabbitError`.

        :param common_features: passed to ``format_common_features``
        :param items_features: one entry per item, passed to ``format_item_features``
        :param timeout: seconds; when they are up no new item is formatted and
            the predictions of the items already sent are returned. ``None``: no limit;
            ``0``: nothing is sent
        :param debug_info: passed to every formatter call
        :param metrics: filled with ``prepare_time`` (from the call to the first
            line, common features included), ``total_time``, ``num_lines``
            (predictions returned), ``lock_wait_time`` (waiting for another
            thread's call), ``waited_for_other_call`` (1 when it had to wait),
            ``restarts`` (1 when this call started a new engine: after a failed
            one, or the first call in a forked child) and ``engine_failures`` (1
            when its engine failed during it); with a ``metrics_hook``, the hook
            gets ``method`` (``"predict"``) besides
        :param detailed_metrics: filled with lists of ``(perf_counter time, value)``
            tuples: ``generating_lines_time`` (seconds per line, each line's share
            of its batch, as in 2.x), ``sending_lines_time`` and
            ``receiving_lines_time`` (seconds per write and per read)
        :returns: an iterator over predictions, typed by the kind of model
            (floats for scalar models; ``int`` classes for ``--oaa``; label
            strings for :class:`~subwabbit.plt.VowpalWabbitPLTProcess`; see
            :doc:`model_kinds`). For ``--cb_adf`` and ``--cb_explore_adf`` the
            items make one example: a timeout gives all of them or none
        :raises VowpalWabbitError: on a write-only or audit-mode process, or when the
            engine fails (:class:`~subwabbit.errors.VowpalWabbitEngineExitedError`,
            :class:`~subwabbit.errors.VowpalWabbitTimeoutError` after ``io_timeout_s``)
        :raises ValueError: when a formatted line is not exactly one example
            (raised before that line's batch is sent)
        """
        return super().predict(common_features, items_features, timeout, debug_info,
                               metrics, detailed_metrics)

    # -------------------------------------------------------------- train

    def train(self, common_features: Any, items_features: Iterable[Any],
              labels: Iterable[Label], weights: Optional[Iterable[Optional[float]]] = None,
              debug_info: Any = None) -> None:
        """Learn from labelled items.

        Every example is formatted and checked before the first one is sent, so
        a bad item leaves the model untouched. On a ``write_only`` process the
        lines are written and the call returns once the pipe has taken them
        (the engine learns from them in order, before any later call's lines);
        otherwise the engine's predictions for them are read and discarded.

        :param common_features: passed to ``format_common_features``
        :param items_features: one entry per item
        :param labels: one label per item, as the kind of model takes it (a
            number, or a label string such as ``'0,1'``, for scalar models;
            an ``int`` class for ``--oaa``; ``None`` or ``(cost, probability)``
            for ``--cb_explore_adf``; see :doc:`model_kinds`), checked before
            anything is sent
        :param weights: one importance weight or ``None`` per item (``None``:
            no weights). Lists must match the items in length; other
            iterables (``itertools.repeat(None)``) are read as far as the items go
        :param debug_info: passed to every formatter call
        :raises ValueError: for mismatched lengths, a label the kind of model
            does not take (naming the item and the rule), non-finite or
            negative weights (or weights where the kind's labels carry none),
            or a formatted line that is not exactly one example
        """
        super().train(common_features, items_features, labels, weights, debug_info)


def __getattr__(name: str) -> Any:
    """``from subwabbit.blocking import VowpalWabbitPLTProcess`` as in subwabbit 2.x
    (the class lives in :mod:`subwabbit.plt`, which imports this module)."""
    if name == "VowpalWabbitPLTProcess":
        from .plt import VowpalWabbitPLTProcess  # pylint: disable=import-outside-toplevel
        return VowpalWabbitPLTProcess
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

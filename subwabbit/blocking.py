"""The blocking model: best throughput, blocking pipes."""

import collections
import time
from typing import Any, Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Union

from .base import Label, VowpalWabbitBaseFormatter
from .command import VwArgs
from .deadlines import deadline_from_timeout
from .errors import VowpalWabbitError
from .lines import check_line_part, encode_lines
from .process_model import DEFAULT_IO_TIMEOUT_S, MetricsHook, VowpalWabbitProcessModel

#: Default lines per write. Measured with ``python -m benchmarks.batch_size``
#: (30 requests of 1,000 items, a quadratic interaction, 2-core machine):
#: 51k predictions/s at 1, 151k at 10, 191k at 20, 206k at 50, 222k at 100,
#: 193k at 200, 145k at 500. 50 is within 8% of the peak while keeping the
#: work in flight after a deadline (two batches) small.
DEFAULT_BATCH_SIZE = 50


class VowpalWabbitProcess(VowpalWabbitProcessModel):
    """A VW model served by a vw engine over blocking pipes.

    ``predict`` formats items in batches and writes batch *k+1* before it
    reads the predictions of batch *k*, so the engine is never idle while
    Python formats lines. A timeout stops the formatting of new items; the
    predictions of what was already sent are still read (so a call can end a
    little after its deadline: use :class:`~subwabbit.nonblocking.VowpalWabbitNonBlockingProcess`
    for a hard deadline).

    :param formatter: turns common and item features into VW lines
    :param vw_args: engine arguments, e.g. ``['-i', 'model.vw', '-t', '--quiet']``;
        ``-p``, ``-d``, ``--audit`` and ``--log_output`` are set by subwabbit
        and rejected here
    :param batch_size: lines per write; see :data:`DEFAULT_BATCH_SIZE`
    :param write_only: the engine prints no predictions: fastest online
        training, but ``predict`` is unavailable
    :param audit_mode: run the engine with ``--audit`` for :meth:`explain_vw_line`
        (``predict`` and ``train`` are then unavailable)
    :param vw_command: the engine command (a path or an argv list); default:
        ``$SUBWABBIT_VW``, else ``vw`` on ``PATH``, else the engine of the
        ``vowpalwabbit`` wheel
    :param metrics_hook: called with each call's metrics dict when the call ends
    :param startup_timeout_s: how long the engine may take to start (model loading included)
    :param io_timeout_s: the longest the engine may leave a read or a write
        waiting; then the call raises :class:`~subwabbit.errors.VowpalWabbitTimeoutError`
        and the process counts as failed. ``None``: wait forever (subwabbit 2.x)
    :param restart_on_crash: after the engine fails, start a fresh one at the
        next call (counted in ``metrics['restarts']`` and :attr:`restart_count`,
        logged) instead of raising until :meth:`restart`
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
                 restart_on_crash: bool = False) -> None:
        super().__init__(formatter, vw_args, batch_size, write_only=write_only,
                         audit_mode=audit_mode, vw_command=vw_command,
                         metrics_hook=metrics_hook, startup_timeout_s=startup_timeout_s,
                         io_timeout_s=io_timeout_s, restart_on_crash=restart_on_crash)

    def _clear_in_flight(self, deadline: Optional[float]) -> bool:
        engine = self._engine_or_raise()
        engine.read_lines(self._pending * self._lines_per_example, None, self.io_timeout_s)
        self._pending = 0
        return True

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
            thread's call) and ``restarts`` (1 when this call restarted a failed engine)
        :param detailed_metrics: filled with lists of ``(perf_counter time, value)``
            tuples: ``generating_lines_time``, ``sending_lines_time``,
            ``receiving_lines_time`` (seconds per batch)
        :returns: an iterator over predictions (floats; label strings for
            :class:`~subwabbit.plt.VowpalWabbitPLTProcess`)
        :raises VowpalWabbitError: on a write-only or audit-mode process, or when the
            engine fails (:class:`~subwabbit.errors.VowpalWabbitEngineExitedError`,
            :class:`~subwabbit.errors.VowpalWabbitTimeoutError` after ``io_timeout_s``)
        :raises ValueError: when a formatted line is not exactly one example
            (raised before that line's batch is sent)
        """
        start = time.perf_counter()
        deadline = deadline_from_timeout(timeout, start=start)
        self._require_predictions("predict")
        self._check_usable()
        metrics = self._prepare_metrics(metrics, detailed_metrics, (
            "generating_lines_time", "sending_lines_time", "receiving_lines_time"))
        return self._predict(start, deadline, common_features, items_features, debug_info,
                             metrics, detailed_metrics)

    def _format_batch(self, common_features: Any, common_part: str, items: Iterator[Any],
                      deadline: Optional[float], debug_info: Any) -> List[str]:
        formatter = self.formatter
        format_item = formatter.format_item_features
        join = formatter.get_formatted_example
        lines: List[str] = []
        batch_size = self.batch_size
        if deadline is None:
            for item in items:
                lines.append(join(common_part, format_item(common_features, item,
                                                           debug_info=debug_info),
                                  debug_info=debug_info))
                if len(lines) >= batch_size:
                    break
            return lines
        clock = time.perf_counter
        while clock() < deadline:
            item = next(items, _END)
            if item is _END:
                break
            lines.append(join(common_part, format_item(common_features, item, debug_info=debug_info),
                              debug_info=debug_info))
            if len(lines) >= batch_size:
                break
        return lines

    def _predict(self, start: float, deadline: Optional[float], common_features: Any,
                 items_features: Iterable[Any], debug_info: Any,
                 metrics: Optional[Dict[str, Any]],
                 detailed: Optional[Dict[str, Any]]) -> Iterator[Any]:
        clock = time.perf_counter
        yielded = 0
        token: Optional[object] = None
        try:
            begun = self._begin_call(deadline, metrics, quiet_deadline=True)
            if begun is None:
                return
            token = begun[0]
            engine = self._engine_or_raise()
            io_timeout = self.io_timeout_s
            common_part = self.formatter.format_common_features(common_features,
                                                                debug_info=debug_info)
            check_line_part(common_part, "the formatted common features")
            if metrics is not None:
                metrics["prepare_time"] = clock() - start
            items = iter(items_features)
            in_flight: Deque[int] = collections.deque()
            sent = 0
            more = True
            parse = self.parse_predictions
            while True:
                lines: List[str] = []
                if more:
                    began = clock()
                    lines = self._format_batch(common_features, common_part, items, deadline,
                                               debug_info)
                    more = len(lines) == self.batch_size and (deadline is None or clock() < deadline)
                    if detailed is not None:
                        detailed["generating_lines_time"].append((clock(), clock() - began))
                if lines:
                    data = encode_lines(lines, sent)
                    self._check_token(token)
                    began = clock()
                    self._guard(engine.write_all, data, None, io_timeout)
                    self._pending += len(lines)
                    sent += len(lines)
                    in_flight.append(len(lines))
                    if detailed is not None:
                        detailed["sending_lines_time"].append((clock(), clock() - began))
                if not in_flight:
                    break
                if len(in_flight) == 1 and more:
                    continue  # keep one batch ahead of the engine
                count = in_flight.popleft()
                self._check_token(token)
                began = clock()
                raw = self._guard(engine.read_lines, count, None, io_timeout)
                self._pending -= count
                predictions = self._guard(parse, raw)
                if detailed is not None:
                    detailed["receiving_lines_time"].append((clock(), clock() - began))
                for prediction in predictions:
                    yielded += 1  # counted before the caller can stop at this yield
                    yield prediction
        finally:
            if token is not None:
                self._end_turn(token)
            if metrics is not None:
                metrics["num_lines"] = yielded
                metrics["total_time"] = clock() - start
            self._finish_call("predict", metrics)

    # -------------------------------------------------------------- train

    def train(self, common_features: Any, items_features: Iterable[Any],
              labels: Iterable[Label], weights: Iterable[Optional[float]],
              debug_info: Any = None) -> None:
        """Learn from labelled items.

        Every example is formatted and checked before the first one is sent, so
        a bad item leaves the model untouched. On a ``write_only`` process the
        lines are written and the call returns once the pipe has taken them
        (the engine learns from them in order, before any later call's lines);
        otherwise the engine's predictions for them are read and discarded.

        :param common_features: passed to ``format_common_features``
        :param items_features: one entry per item
        :param labels: one label per item (a number, or a label string such as ``'0,1'``)
        :param weights: one importance weight or ``None`` per item
        :param debug_info: passed to every formatter call
        :raises ValueError: for mismatched lengths, non-finite labels or weights,
            or a formatted line that is not exactly one example
        """
        start = time.perf_counter()
        if self.audit_mode:
            raise VowpalWabbitError("train() is not available in audit mode; use explain_vw_line()")
        self._check_usable()
        lines = self._format_training_lines(common_features, items_features, labels, weights,
                                            debug_info)
        metrics = self._train_metrics()
        io_timeout = self.io_timeout_s
        learnt = 0
        try:
            with self._call(None, metrics):
                engine = self._engine_or_raise()
                if self.write_only:
                    if lines:
                        self._guard(engine.write_all, encode_lines(lines), None, io_timeout)
                else:
                    in_flight: Deque[int] = collections.deque()
                    for offset in range(0, len(lines), self.batch_size):
                        batch = lines[offset:offset + self.batch_size]
                        self._guard(engine.write_all, encode_lines(batch, offset), None, io_timeout)
                        self._pending += len(batch)
                        in_flight.append(len(batch))
                        if len(in_flight) > 1:
                            self._read_and_discard(in_flight.popleft())
                    while in_flight:
                        self._read_and_discard(in_flight.popleft())
            learnt = len(lines)
        finally:
            self._finish_train(metrics, start, learnt)

    def _read_and_discard(self, count: int) -> None:
        self._guard(self._engine_or_raise().read_lines, count, None, self.io_timeout_s)
        self._pending -= count


_END = object()


def __getattr__(name: str) -> Any:
    """``from subwabbit.blocking import VowpalWabbitPLTProcess`` as in subwabbit 2.x
    (the class lives in :mod:`subwabbit.plt`, which imports this module)."""
    if name == "VowpalWabbitPLTProcess":
        from .plt import VowpalWabbitPLTProcess  # pylint: disable=import-outside-toplevel
        return VowpalWabbitPLTProcess
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

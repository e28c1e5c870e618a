"""The nonblocking model: returns by its deadline, non-blocking pipes (Linux only)."""

import sys
import time
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Union

from .base import Label, VowpalWabbitBaseFormatter
from .command import VwArgs
from .deadlines import deadline_from_timeout, validate_seconds
from .engine_process import EngineProcess
from .lines import check_line_part, encode_lines
from .process_model import DEFAULT_IO_TIMEOUT_S, MetricsHook, VowpalWabbitProcessModel

_COMPACT_BYTES = 1 << 16

#: Defaults of ``batch_size``, ``max_pending_lines`` and ``write_cutoff_s``,
#: measured with ``python -m benchmarks.nonblocking_settings --requests 400``
#: (the benchmark workload: 3,000 items of 260-byte lines per request, 18
#: quadratic interactions, timeout 10 ms; 2-core machine, the wheel engine's
#: one-thread loop): 20 lines a batch and 40 in flight returned 2,143 and
#: 2,032 predictions per call in two runs, 50 and 100 returned 2,453 and
#: 2,713 (the blocking class: 2,487 and 2,750). A cut-off of 0.4 ms returned
#: fewer (2,291 and 2,698): more work ran into the deadline. The engine
#: answers 100 such lines in about 0.35 ms.
DEFAULT_BATCH_SIZE = 50
DEFAULT_MAX_PENDING_LINES = 100
DEFAULT_WRITE_CUTOFF_S = 0.0005


class VowpalWabbitNonBlockingProcess(VowpalWabbitProcessModel):
    """A VW model served by a vw engine over non-blocking pipes, for hard deadlines.

    ``predict`` never blocks in a system call: it formats lines while fewer
    than ``max_pending_lines`` are in flight, writes what the pipe takes,
    reads what has arrived, and sleeps in ``select``/``poll`` until the engine
    is ready or the deadline comes. It returns by the deadline with the
    predictions it has. Lines still in flight then are cleared (their
    predictions read and discarded) at the start of the next call, within
    that call's budget, or by :meth:`cleanup`.

    Available on Linux only.

    :param formatter: turns common and item features into VW lines
    :param vw_args: engine arguments (``-p``, ``-d``, ``--audit`` and
        ``--log_output`` are set by subwabbit and rejected here)
    :param batch_size: the most lines formatted and written at a time
    :param audit_mode: run the engine with ``--audit`` for :meth:`explain_vw_line`
    :param max_pending_lines: the most lines in flight (sent, prediction not yet
        read); larger means more throughput and more leftovers after a timeout
    :param write_timeout_ms: deprecated alias of ``write_cutoff_s`` (despite its
        name it held seconds in subwabbit 2.x)
    :param pipe_buffer_size_bytes: resize the engine's stdin pipe (``F_SETPIPE_SZ``)
    :param vw_command: the engine command; see :class:`~subwabbit.blocking.VowpalWabbitProcess`
    :param write_cutoff_s: stop sending new lines this many seconds before the
        deadline, so that the engine can answer what is in flight in time;
        it should cover the engine's time for ``max_pending_lines`` lines
    :param metrics_hook: called with each call's metrics dict when the call ends
    :param startup_timeout_s: how long the engine may take to start
    :param io_timeout_s: for calls without a deadline (``train``, ``save``,
        ``predict(timeout=None)``, ``cleanup(None)``): the longest the engine
        may stay silent before :class:`~subwabbit.errors.VowpalWabbitTimeoutError`;
        ``None``: wait forever. Calls with a deadline return by it instead
    :param restart_on_crash: after the engine fails, start a fresh one at the
        next call (counted in ``metrics['restarts']`` and :attr:`restart_count`, logged)
    :raises NotImplementedError: on an operating system other than Linux
    """

    def __init__(self, formatter: VowpalWabbitBaseFormatter, vw_args: VwArgs,
                 batch_size: int = DEFAULT_BATCH_SIZE, audit_mode: bool = False,
                 max_pending_lines: int = DEFAULT_MAX_PENDING_LINES,
                 write_timeout_ms: Optional[float] = None,
                 pipe_buffer_size_bytes: Optional[int] = None,
                 vw_command: Union[str, Sequence[str], None] = None, *,
                 write_cutoff_s: float = DEFAULT_WRITE_CUTOFF_S, metrics_hook: Optional[MetricsHook] = None,
                 startup_timeout_s: float = 60.0,
                 io_timeout_s: Optional[float] = DEFAULT_IO_TIMEOUT_S,
                 restart_on_crash: bool = False) -> None:
        if not sys.platform.startswith("linux"):
            raise NotImplementedError("VowpalWabbitNonBlockingProcess is available on Linux only; "
                                      "use VowpalWabbitProcess")
        if write_timeout_ms is not None:
            warnings.warn("write_timeout_ms is deprecated (it held seconds); use write_cutoff_s",
                          DeprecationWarning, stacklevel=2)
            write_cutoff_s = write_timeout_ms
        self.write_cutoff_s = validate_seconds(write_cutoff_s, "write_cutoff_s", allow_none=False)
        if isinstance(max_pending_lines, bool) or not isinstance(max_pending_lines, int) \
                or max_pending_lines < 1:
            raise ValueError(f"max_pending_lines must be a positive int, got {max_pending_lines!r}")
        if pipe_buffer_size_bytes is not None and (
                isinstance(pipe_buffer_size_bytes, bool)
                or not isinstance(pipe_buffer_size_bytes, int) or pipe_buffer_size_bytes < 1):
            raise ValueError("pipe_buffer_size_bytes must be a positive int or None, "
                             f"got {pipe_buffer_size_bytes!r}")
        self.max_pending_lines = max_pending_lines
        self.pipe_buffer_size_bytes = pipe_buffer_size_bytes
        # Bytes formatted but not yet taken by the pipe; _woff is where writing resumes.
        # The buffer always starts at a line boundary.
        self._wbuf = bytearray()
        self._woff = 0
        # How many of the oldest pending predictions belong to calls that ended.
        self._discard = 0
        # Bytes the last read brought (for detailed metrics).
        self._received_bytes = 0
        super().__init__(formatter, vw_args, batch_size, write_only=False, audit_mode=audit_mode,
                         vw_command=vw_command, metrics_hook=metrics_hook,
                         startup_timeout_s=startup_timeout_s, io_timeout_s=io_timeout_s,
                         restart_on_crash=restart_on_crash)

    @property
    def write_timeout_ms(self) -> float:
        """Deprecated alias of ``write_cutoff_s`` (seconds)."""
        return self.write_cutoff_s

    def _after_start(self, engine: EngineProcess) -> None:
        if self.pipe_buffer_size_bytes is not None:
            engine.set_pipe_size(self.pipe_buffer_size_bytes)

    def _forget_in_flight(self) -> None:
        super()._forget_in_flight()
        del self._wbuf[:]
        self._woff = 0
        self._discard = 0

    # ------------------------------------------------------- pipe plumbing

    def _write_some(self, deadline: Optional[float] = None) -> int:
        """Write what the pipe takes now; returns the number of bytes written."""
        engine = self._engine_or_raise()
        written = engine.write_some(memoryview(self._wbuf)[self._woff:], deadline)
        self._woff += written
        if self._woff == len(self._wbuf):
            del self._wbuf[:]
            self._woff = 0
        elif self._woff > _COMPACT_BYTES:
            cut = self._wbuf.rfind(b"\n", 0, self._woff) + 1
            del self._wbuf[:cut]
            self._woff -= cut
        return written

    def _drop_unwritten_lines(self) -> int:
        """Forget the lines that no byte of has reached the pipe.

        :returns: how many lines were dropped
        """
        buf, offset = self._wbuf, self._woff
        if offset >= len(buf):
            return 0
        start = offset if offset == 0 or buf[offset - 1] == 0x0A else buf.index(b"\n", offset) + 1
        dropped = buf.count(b"\n", start)
        del buf[start:]
        if not buf:
            self._woff = 0
        self._pending -= dropped
        return dropped

    def _receive(self, deadline: Optional[float] = None) -> Optional[List[Any]]:
        """Read what the engine has printed; discard leftovers of earlier calls.

        :param deadline: how long an error report may wait for a dead engine's exit status
        :returns: ``None`` when nothing arrived, else the predictions (maybe
            none) that belong to the current call
        """
        engine = self._engine_or_raise()
        self._received_bytes = engine.read_available(deadline)
        if not self._received_bytes:
            return None
        complete = engine.buffered_lines
        if self._discard:
            stale = min(self._discard, complete)
            engine.take_lines(stale)
            self._discard -= stale
            self._pending -= stale
            complete -= stale
        if not complete:
            return []
        self._pending -= complete
        return self.parse_predictions(engine.take_lines(complete))

    def _wait(self, deadline: Optional[float]) -> None:
        """Sleep until the engine can take or give more, or the deadline;
        without a deadline, raise after ``io_timeout_s`` of silence."""
        self._engine_or_raise().wait(True, self._woff < len(self._wbuf), deadline,
                                     self.io_timeout_s if deadline is None else None,
                                     "waiting for its predictions")

    def _clear_in_flight(self, deadline: Optional[float]) -> bool:
        self._discard = self._pending
        self._discard -= self._drop_unwritten_lines()
        while self._discard:
            progressed = bool(self._woff < len(self._wbuf) and self._write_some(deadline))
            if self._receive(deadline) is not None:
                progressed = True
            if not self._discard:
                break
            if deadline is not None and time.perf_counter() >= deadline:
                return False
            if not progressed:
                self._wait(deadline)
        return True

    def cleanup(self, deadline: Optional[float] = None, debug_info: Any = None) -> bool:
        """Read and discard the predictions earlier calls left in flight.

        ``predict`` does this itself at its start; call it between requests to
        take the work off the next request's budget.

        :param deadline: a :func:`time.perf_counter` value to stop at, or ``None``
        :param debug_info: unused; kept for compatibility
        :returns: whether nothing is left in flight
        """
        del debug_info
        self._check_usable()
        begun = self._begin_call(deadline, quiet_deadline=True)
        if begun is None:
            return False
        self._end_turn(begun[0])
        return begun[1]

    # ------------------------------------------------------------ predict

    def predict(self, common_features: Any, items_features: Iterable[Any],
                timeout: Optional[float] = None, debug_info: Any = None,
                metrics: Optional[Dict[str, Any]] = None,
                detailed_metrics: Optional[Dict[str, Any]] = None) -> Iterator[Any]:
        """Predictions for the items, in item order, by the deadline.

        The timeout counts from this call. With a timeout the iterator returns
        by the deadline (plus the time the caller spends between items) with as
        many predictions as the engine gave, possibly none; without one it
        returns every prediction. Abandoning the iterator is safe; resuming it
        after another call on this process raises
        :class:`~subwabbit.errors.VowpalWabbitError`.

        :param common_features: passed to ``format_common_features``
        :param items_features: one entry per item
        :param timeout: seconds; ``None``: no limit
        :param debug_info: passed to every formatter call
        :param metrics: filled with ``cleanup_time``, ``before_cleanup_pending_lines``,
            ``after_cleanup_pending_lines`` (leftovers of earlier calls),
            ``prepare_time``, ``total_time``, ``num_lines``, ``lock_wait_time``
            (waiting for another thread's call, part of ``cleanup_time``) and
            ``restarts`` (1 when this call restarted a failed engine)
        :param detailed_metrics: filled with lists of ``(perf_counter time, value)``:
            ``sending_bytes``, ``receiving_bytes``, ``pending_lines``,
            ``generating_lines_time``, ``sending_lines_time``, ``receiving_lines_time``
        :returns: an iterator over predictions
        :raises ValueError: when a formatted line is not exactly one example
        :raises VowpalWabbitEngineExitedError: when the engine dies (within the
            deadline); :class:`~subwabbit.errors.VowpalWabbitTimeoutError` only
            without a deadline, after ``io_timeout_s`` of silence
        """
        start = time.perf_counter()
        deadline = deadline_from_timeout(timeout, start=start)
        self._require_predictions("predict")
        self._check_usable()
        metrics = self._prepare_metrics(metrics, detailed_metrics, (
            "sending_bytes", "receiving_bytes", "pending_lines", "generating_lines_time",
            "sending_lines_time", "receiving_lines_time"))
        return self._predict(start, deadline, common_features, items_features, debug_info,
                             metrics, detailed_metrics)

    def _predict(self, start: float, deadline: Optional[float], common_features: Any,
                 items_features: Iterable[Any], debug_info: Any,
                 metrics: Optional[Dict[str, Any]],
                 detailed: Optional[Dict[str, Any]]) -> Iterator[Any]:
        # pylint: disable=too-many-branches,too-many-statements,too-many-locals
        clock = time.perf_counter
        yielded = 0
        token: Optional[object] = None
        try:
            if metrics is not None:
                metrics["before_cleanup_pending_lines"] = self._pending
            began = clock()
            begun = self._begin_call(deadline, metrics, quiet_deadline=True)
            if metrics is not None:
                metrics["cleanup_time"] = clock() - began
                metrics["after_cleanup_pending_lines"] = self._pending
            if begun is None:
                return
            token, cleared = begun
            if not cleared:
                return
            write_deadline = None if deadline is None else deadline - self.write_cutoff_s
            formatter = self.formatter
            format_item = formatter.format_item_features
            join = formatter.get_formatted_example
            common_part = formatter.format_common_features(common_features, debug_info=debug_info)
            check_line_part(common_part, "the formatted common features")
            if metrics is not None:
                metrics["prepare_time"] = clock() - start
            items = iter(items_features)
            producing = True
            produced = 0
            batch_size, max_pending = self.batch_size, self.max_pending_lines
            while True:
                now = clock()
                if deadline is not None and now >= deadline:
                    break
                progressed = False
                # 1. format more lines while there is room in flight
                if producing and write_deadline is not None and now >= write_deadline:
                    producing = False
                    self._drop_unwritten_lines()
                if producing and self._pending < max_pending:
                    began = now
                    want = min(batch_size, max_pending - self._pending)
                    lines: List[str] = []
                    for item in items:
                        lines.append(join(common_part,
                                          format_item(common_features, item, debug_info=debug_info),
                                          debug_info=debug_info))
                        if len(lines) >= want:
                            break
                    else:
                        producing = False
                    if lines:
                        self._wbuf += encode_lines(lines, produced)
                        self._pending += len(lines)
                        produced += len(lines)
                        progressed = True
                    if detailed is not None:
                        detailed["generating_lines_time"].append((clock(), clock() - began))
                # 2. write what the pipe takes
                if self._woff < len(self._wbuf):
                    began = clock()
                    written = self._guard(self._write_some, deadline)
                    progressed = progressed or written > 0
                    if detailed is not None:
                        detailed["sending_lines_time"].append((clock(), clock() - began))
                        detailed["sending_bytes"].append((clock(), written))
                # 3. read what has arrived
                began = clock()
                predictions = self._guard(self._receive, deadline)
                if detailed is not None:
                    detailed["receiving_lines_time"].append((clock(), clock() - began))
                    detailed["receiving_bytes"].append((clock(), self._received_bytes))
                    detailed["pending_lines"].append((clock(), self._pending))
                if predictions is not None:
                    progressed = True
                    for prediction in predictions:
                        yielded += 1  # counted before the caller can stop at this yield
                        yield prediction
                    self._check_token(token)
                # 4. done, or 5. sleep until the engine can take or give more
                if not producing and not self._pending:
                    break
                if not progressed:
                    self._guard(self._wait, deadline)
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
        """Learn from labelled items, waiting without a deadline.

        Every example is formatted and checked before the first one is sent.
        The lines are written as the pipe takes them and the engine's
        predictions for them are read and discarded, so the call returns once
        the engine has learnt from all of them. For high-volume online
        learning prefer a ``VowpalWabbitProcess(..., write_only=True)``.

        :raises ValueError: see :meth:`VowpalWabbitProcess.train
            <subwabbit.blocking.VowpalWabbitProcess.train>`
        """
        start = time.perf_counter()
        self._require_predictions("train")
        self._check_usable()
        lines = self._format_training_lines(common_features, items_features, labels, weights,
                                            debug_info)
        metrics = self._train_metrics()
        learnt = 0
        try:
            with self._call(None, metrics):
                if lines:
                    self._wbuf += encode_lines(lines)
                    self._pending += len(lines)
                    while self._pending:
                        progressed = (self._woff < len(self._wbuf)
                                      and self._guard(self._write_some) > 0)
                        if self._guard(self._receive) is not None:
                            progressed = True
                        if self._pending and not progressed:
                            self._guard(self._wait, None)
                learnt = len(lines)
        finally:
            self._finish_train(metrics, start, learnt)

"""The nonblocking model: returns by its deadline, non-blocking pipes (Linux only)."""

import sys
import warnings
from typing import Any, Dict, Iterable, Iterator, NamedTuple, Optional, Sequence, Union

# VowpalWabbitBaseModel and VowpalWabbitError: 2.x code imports them from here.
from .base import Label, VowpalWabbitBaseFormatter, VowpalWabbitBaseModel  # pylint: disable=unused-import
from .client import DEFAULT_IO_TIMEOUT_S, MetricsHook, positive_int
from .command import VwArgs
from .core.exchanges import Pacing
from .deadlines import validate_deadline, validate_seconds
from .engine_process import EngineProcess
from .errors import VowpalWabbitError  # pylint: disable=unused-import
from .process_model import VowpalWabbitProcessModel


#: Defaults of ``batch_size``, ``max_pending_lines`` and ``write_cutoff_s``,
#: measured with ``python -m benchmarks.nonblocking_settings --requests 400``
#: (the benchmark workload: 3,000 items of 260-byte lines per request, 18
#: quadratic interactions, timeout 10 ms; 2-core machine, the wheel engine's
#: one-thread loop): 20 lines a batch and 40 in flight returned 2,143 and
#: 2,032 predictions per call in two runs, 50 and 100 returned 2,453 and
#: 2,713 (the blocking class: 2,487 and 2,750). A cut-off of 0.4 ms returned
#: fewer (2,291 and 2,698): more work ran into the deadline. The engine
#: answers 100 such lines in about 0.35 ms. With vw's own driver behind the
#: pipes (the default since 2026-11-24), ``python -m benchmarks.nonblocking_settings
#: --requests 400 "" batch_size=100,max_pending_lines=200
#: batch_size=75,max_pending_lines=150 batch_size=100,max_pending_lines=300``
#: gave 2,092, 1,993, 2,168 and 1,827: no setting clearly better.
DEFAULT_BATCH_SIZE = 50
#: Default of ``max_pending_lines`` (see :data:`DEFAULT_BATCH_SIZE`).
DEFAULT_MAX_PENDING_LINES = 100
#: Default of ``write_cutoff_s``, in seconds (see :data:`DEFAULT_BATCH_SIZE`).
DEFAULT_WRITE_CUTOFF_S = 0.0005


#: The largest ``pipe_buffer_size_bytes``: Linux refuses a larger pipe, and
#: ``fcntl`` passes the size as a C int, so a size of 2**32 bytes or more
#: would wrap around to a small one.
MAX_PIPE_SIZE_BYTES = 2 ** 31


class DeadlineSettings(NamedTuple):
    """The checked settings of a class that returns by a deadline."""

    #: seconds (``write_timeout_ms``, deprecated, wins over ``write_cutoff_s``)
    write_cutoff_s: float
    max_pending_lines: int
    pipe_buffer_size_bytes: Optional[int]


def check_deadline_settings(max_pending_lines: int, pipe_buffer_size_bytes: Optional[int],
                            write_timeout_ms: Optional[float],
                            write_cutoff_s: float) -> DeadlineSettings:
    """Check the settings of the classes that return by a deadline.

    :returns: the settings, the counts as ints
    :raises ValueError: for a setting out of range
    """
    name = "write_cutoff_s"
    if write_timeout_ms is not None:
        warnings.warn("write_timeout_ms is deprecated (it held seconds); use write_cutoff_s",
                      DeprecationWarning, stacklevel=3)
        write_cutoff_s, name = write_timeout_ms, "write_timeout_ms"
    cutoff = validate_seconds(write_cutoff_s, name, allow_none=False)
    assert cutoff is not None
    return DeadlineSettings(
        cutoff, positive_int(max_pending_lines, "max_pending_lines"),
        None if pipe_buffer_size_bytes is None
        else positive_int(pipe_buffer_size_bytes, "pipe_buffer_size_bytes", MAX_PIPE_SIZE_BYTES,
                          or_none=True))


class VowpalWabbitNonBlockingProcess(VowpalWabbitProcessModel):
    """A VW model served by a vw engine over non-blocking pipes, for hard deadlines.

    ``predict`` never blocks in a system call: it formats lines while fewer
    than ``max_pending_lines`` are in flight (and fewer than the engine
    answers by the deadline at its pace), writes what the pipe takes,
    reads what has arrived, and sleeps in ``select``/``poll`` until the engine
    is ready or the deadline comes. It returns by the deadline with the
    predictions it has. Lines still in flight then are cleared (their
    predictions read and discarded) at the start of the next call, within
    that call's budget, or by :meth:`cleanup`.

    Available on Linux only.

    :param formatter: turns common and item features into VW lines
    :param vw_args: engine arguments (``-p``, ``-d``, ``--audit`` and
        ``--log_output`` are set by subwabbit and rejected here; an
        ``-a``/``--audit`` is dropped with ``audit_mode=True``)
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
    :param io_timeout_s: the longest the engine may stay silent while it owes
        a call answers (``train``, ``save``, ``predict``, ``cleanup``) before
        :class:`~subwabbit.errors.VowpalWabbitTimeoutError`; ``None``: wait
        forever. A call with a nearer deadline returns by it instead (a
        ``save`` with a timeout: by its timeout only)
    :param restart_on_crash: after the engine fails, start a fresh one in the
        background at once; a call never waits for it past its deadline (it
        returns ``[]`` until the new engine answers its probe), and it is
        counted in ``metrics['restarts']`` and :attr:`restart_count`, and logged
    :param restart_after_fork: in a process forked after this object was
        created, start an engine of its own (in the background, as above) at
        the first call, or raise :class:`~subwabbit.errors.VowpalWabbitError`
        with ``False``; the parent's engine is never touched
    :param prediction_type: the kind of model, for a model file; see
        :class:`~subwabbit.blocking.VowpalWabbitProcess` and :doc:`model_kinds`
    :raises NotImplementedError: on an operating system other than Linux
    """

    #: Keep in flight no more lines than the engine answers by the deadline
    #: at its pace (see :attr:`subwabbit.core.exchanges.Pacing.reach_at_deadline`):
    #: with a model at a few hundred µs a line, up to ``max_pending_lines``
    #: in flight outlasted a 10 ms call and most calls returned nothing.
    #: ``False`` on an instance keeps ``max_pending_lines`` in flight to the
    #: write cut-off, as earlier 3.0 code did (benchmarks compare the two).
    reach_at_deadline = True

    def __init__(self, formatter: VowpalWabbitBaseFormatter, vw_args: VwArgs,
                 batch_size: int = DEFAULT_BATCH_SIZE, audit_mode: bool = False,
                 max_pending_lines: int = DEFAULT_MAX_PENDING_LINES,
                 write_timeout_ms: Optional[float] = None,
                 pipe_buffer_size_bytes: Optional[int] = None,
                 vw_command: Union[str, Sequence[str], None] = None, *,
                 write_cutoff_s: float = DEFAULT_WRITE_CUTOFF_S, metrics_hook: Optional[MetricsHook] = None,
                 startup_timeout_s: float = 60.0,
                 io_timeout_s: Optional[float] = DEFAULT_IO_TIMEOUT_S,
                 restart_on_crash: bool = False, restart_after_fork: bool = True,
                 prediction_type: Optional[str] = None) -> None:
        if not sys.platform.startswith("linux"):
            raise NotImplementedError("VowpalWabbitNonBlockingProcess is available on Linux only; "
                                      "use VowpalWabbitProcess")
        self.write_cutoff_s, self.max_pending_lines, self.pipe_buffer_size_bytes = \
            check_deadline_settings(max_pending_lines, pipe_buffer_size_bytes, write_timeout_ms,
                                    write_cutoff_s)
        super().__init__(formatter, vw_args, batch_size, write_only=False, audit_mode=audit_mode,
                         vw_command=vw_command, metrics_hook=metrics_hook,
                         startup_timeout_s=startup_timeout_s, io_timeout_s=io_timeout_s,
                         restart_on_crash=restart_on_crash, restart_after_fork=restart_after_fork,
                         prediction_type=prediction_type)

    _detailed_keys = ("sending_bytes", "receiving_bytes", "pending_lines",
                      "generating_lines_time", "sending_lines_time", "receiving_lines_time")
    _background_restarts = True

    def _pacing(self) -> Pacing:
        return Pacing(batch_size=self.batch_size, max_in_flight_lines=self.max_pending_lines,
                      write_cutoff_s=self.write_cutoff_s, hard_deadline=True,
                      reach_at_deadline=self.reach_at_deadline)

    @property
    def write_timeout_ms(self) -> float:
        """Deprecated alias of ``write_cutoff_s`` (seconds); setting it, as
        subwabbit 2.x allowed between calls, sets ``write_cutoff_s``."""
        return self.write_cutoff_s

    @write_timeout_ms.setter
    def write_timeout_ms(self, value: float) -> None:
        warnings.warn("write_timeout_ms is deprecated (it held seconds); use write_cutoff_s",
                      DeprecationWarning, stacklevel=2)
        cutoff = validate_seconds(value, "write_timeout_ms", allow_none=False)
        assert cutoff is not None
        self.write_cutoff_s = cutoff

    def _after_start(self, engine: EngineProcess) -> None:
        if self.pipe_buffer_size_bytes is not None:
            engine.set_pipe_size(self.pipe_buffer_size_bytes)

    def cleanup(self, deadline: Optional[float] = None, debug_info: Any = None) -> bool:
        """Read and discard the predictions earlier calls left in flight.

        ``predict`` does this itself as it goes; call it between requests to
        take the work off the next request's budget.

        :param deadline: a :func:`time.perf_counter` value to stop at, or ``None``
        :param debug_info: unused; kept for compatibility
        :returns: whether nothing is left in flight
        :raises TypeError: for a ``deadline`` that is not a number (or is a bool)
        :raises ValueError: for a NaN ``deadline``
        """
        del debug_info
        deadline = validate_deadline(deadline)
        self._check_usable()
        return self._cleanup(deadline)

    # ------------------------------------------------------------ predict

    def predict(self, common_features: Any, items_features: Iterable[Any],
                timeout: Optional[float] = None, debug_info: Any = None,
                metrics: Optional[Dict[str, Any]] = None,
                detailed_metrics: Optional[Dict[str, Any]] = None) -> Iterator[Any]:
        """Predictions for the items, in item order, by the deadline.

        The timeout counts from this call. With a timeout the iterator returns
        by the deadline (plus the time the caller spends between items, and at
        most one item's formatting: no item is begun after the write cut-off) with as
        many predictions as the engine gave, possibly none; without one it
        returns every prediction. Abandoning the iterator is safe; resuming it
        after another call on this process raises
        :class:`~subwabbit.errors.VowpalWabbitError`.

        :param common_features: passed to ``format_common_features``
        :param items_features: one entry per item
        :param timeout: seconds; ``None``: no limit
        :param debug_info: passed to every formatter call
        :param metrics: filled with ``before_cleanup_pending_lines`` (leftovers
            of earlier calls in flight when the call began),
            ``after_cleanup_pending_lines`` (those still in flight when it
            returned), ``cleanup_time`` (from the call until the leftovers were
            all answered; new lines are sent meanwhile), ``prepare_time``,
            ``total_time``, ``num_lines``, ``lock_wait_time`` (waiting for
            another thread's call), ``waited_for_other_call`` (1 when it had to
            wait), ``restarts`` (1 when this call started or waited for a
            replacement engine: after a failed one, or the first call in a
            forked child) and ``engine_failures`` (1 when its engine failed
            during it); with a ``metrics_hook``, the hook gets ``method``
            (``"predict"``) besides
        :param detailed_metrics: filled with lists of ``(perf_counter time, value)``:
            ``sending_bytes``, ``receiving_bytes``, ``pending_lines``,
            ``generating_lines_time``, ``sending_lines_time``, ``receiving_lines_time``
        :returns: an iterator over predictions, typed by the kind of model
            (see :doc:`model_kinds`); for ``--cb_adf`` and ``--cb_explore_adf``
            all the items' predictions or none
        :raises ValueError: when a formatted line is not exactly one example
        :raises VowpalWabbitEngineExitedError: when the engine dies (within the
            deadline); :class:`~subwabbit.errors.VowpalWabbitTimeoutError`
            after ``io_timeout_s`` of silence, unless the deadline comes first
        """
        return super().predict(common_features, items_features, timeout, debug_info,
                               metrics, detailed_metrics)

    # -------------------------------------------------------------- train

    def train(self, common_features: Any, items_features: Iterable[Any],
              labels: Iterable[Label], weights: Optional[Iterable[Optional[float]]] = None,
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
        self._require_predictions("train")
        super().train(common_features, items_features, labels, weights, debug_info)

"""What the blocking and nonblocking models share: the engine's lifecycle, the
bookkeeping that keeps every prediction with its own call, saving, audit
explanations and the metrics hook."""

import contextlib
import logging
import math
import numbers
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from .base import Label, VowpalWabbitBaseFormatter, VowpalWabbitBaseModel
from .command import VwArgs, build_argv, normalize_vw_args, resolve_engine_command
from .deadlines import deadline_from_timeout, validate_seconds
from .engine_process import EngineProcess
from .errors import (VowpalWabbitBusyError, VowpalWabbitEngineExitedError, VowpalWabbitError,
                     VowpalWabbitProtocolError, VowpalWabbitTimeoutError)
from .lines import check_line, check_line_part, encode_lines, parse_scalar, parse_scalars

logger = logging.getLogger("subwabbit")

#: Receives each call's metrics dict when the call ends, however it ended.
MetricsHook = Callable[[Dict[str, Any]], None]

#: Default of ``io_timeout_s``: generous, so that only an engine that has
#: stopped or hung trips it (a busy engine answers a batch in milliseconds).
DEFAULT_IO_TIMEOUT_S = 30.0

# How long restart() gives an engine that already failed to exit before SIGKILL.
_FAILED_ENGINE_CLOSE_S = 0.5

#: Lines of engine output per example in audit mode (with ``-p``): the raw
#: score, the features, the prediction.
AUDIT_LINES_PER_EXAMPLE = 3


class VowpalWabbitProcessModel(VowpalWabbitBaseModel):
    """Base class of the models that run a vw engine as a child process.

    It owns the :class:`~subwabbit.engine_process.EngineProcess`, the count of
    examples sent whose predictions have not been read (``pending``), and the
    *call token*: each call (``predict``, ``train``, ``save``,
    ``explain_vw_line``) takes the process over; predictions left in flight by
    an earlier call are read and thrown away first, and an earlier
    ``predict`` iterator resumed afterwards raises instead of reading
    predictions that are not its own.

    Calls are serialised: a call holds the process from its start until it
    returns (for ``predict``: until its iterator is exhausted, closed or
    garbage-collected). A call from another thread waits for it, until its
    own deadline (a ``predict`` with a timeout then yields nothing) or for
    ``io_timeout_s`` (then :class:`~subwabbit.errors.VowpalWabbitBusyError`).
    A new call from the thread that holds the process supersedes its
    unfinished iterator.

    After the engine fails (it exits, prints something unexpected, or does not
    answer within ``io_timeout_s``) every call raises
    :class:`~subwabbit.errors.VowpalWabbitError` until :meth:`restart`; with
    ``restart_on_crash=True`` the next call restarts the engine itself.
    """

    #: turns raw prediction lines into the values ``predict`` yields
    parse_predictions: Callable[[List[bytes]], List[Any]] = staticmethod(parse_scalars)

    def __init__(self, formatter: VowpalWabbitBaseFormatter, vw_args: VwArgs, batch_size: int, *,
                 write_only: bool, audit_mode: bool,
                 vw_command: Union[str, Sequence[str], None],
                 metrics_hook: Optional[MetricsHook], startup_timeout_s: float,
                 io_timeout_s: Optional[float], restart_on_crash: bool) -> None:
        super().__init__(formatter)
        self._engine: Optional[EngineProcess] = None
        self._closed = False
        if not isinstance(formatter, VowpalWabbitBaseFormatter):
            raise TypeError("formatter must be a VowpalWabbitBaseFormatter, "
                            f"got {type(formatter).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if write_only and audit_mode:
            raise ValueError("write_only and audit_mode exclude each other: audit mode reads "
                             "the engine's output")
        if metrics_hook is not None and not callable(metrics_hook):
            raise TypeError("metrics_hook must be callable")
        self.vw_args = normalize_vw_args(vw_args)
        self.batch_size = batch_size
        self.write_only = bool(write_only)
        self.audit_mode = bool(audit_mode)
        self.metrics_hook = metrics_hook
        self.startup_timeout_s = validate_seconds(startup_timeout_s, "startup_timeout_s",
                                                  allow_none=False)
        self.io_timeout_s = validate_seconds(io_timeout_s, "io_timeout_s")
        if self.io_timeout_s == 0:
            raise ValueError("io_timeout_s must be positive, or None for no limit")
        self.restart_on_crash = bool(restart_on_crash)
        self.vw_command = resolve_engine_command(vw_command)
        self.argv = build_argv(self.vw_command, self.vw_args, predictions=not self.write_only,
                               audit=self.audit_mode)
        self._lines_per_example = AUDIT_LINES_PER_EXAMPLE if self.audit_mode else 1
        self._pending = 0
        self._broken: Optional[BaseException] = None
        self._restart_count = 0
        # (thread id, token) of the call holding the process, guarded by _turn
        self._holder: Optional[Tuple[int, object]] = None
        self._turn = threading.Condition(threading.Lock())
        self._engine = self._start_engine()

    def _start_engine(self) -> EngineProcess:
        engine = EngineProcess(
            self.argv, startup_timeout_s=self.startup_timeout_s,
            predictions_per_probe=None if self.write_only else self._lines_per_example)
        try:
            self._after_start(engine)
        except BaseException:
            engine.close(1.0)
            raise
        self._engine = engine
        return engine

    # ------------------------------------------------------- subclass hooks

    def _after_start(self, engine: EngineProcess) -> None:
        """Prepare the pipes of a newly started engine."""

    def _clear_in_flight(self, deadline: Optional[float]) -> bool:
        """Read and discard what earlier calls left in flight, until ``deadline``.

        :returns: whether nothing is left in flight
        """
        raise NotImplementedError()

    def _forget_in_flight(self) -> None:
        """Drop every trace of the old engine's pipes before a restart."""
        self._pending = 0

    # -------------------------------------------------------------- status

    @property
    def pending_lines(self) -> int:
        """Examples sent to the engine whose predictions have not been read."""
        return self._pending

    @property
    def restart_count(self) -> int:
        """How many times the engine was restarted (by :meth:`restart` or ``restart_on_crash``)."""
        return self._restart_count

    @property
    def pid(self) -> Optional[int]:
        """The engine's process id."""
        return self._engine.pid if self._engine is not None else None

    def __repr__(self) -> str:
        if self._engine is None:
            return f"<{type(self).__name__} not started>"
        state = self._engine.describe()
        if self._engine.closed:
            state = f"closed, {state}"
        return (f"<{type(self).__name__} pid={self._engine.pid} {state} "
                f"pending_lines={self._pending} argv={self.argv!r}>")

    # -------------------------------------------------------- call control

    def _engine_or_raise(self) -> EngineProcess:
        engine = self._engine
        if self._closed or engine is None:
            raise VowpalWabbitError(f"{type(self).__name__} is closed")
        if self._broken is not None:
            raise VowpalWabbitError(
                f"the vw engine of this {type(self).__name__} failed earlier and can no longer "
                "be used; call restart() (or create the process with restart_on_crash=True) or "
                f"close() it (cause: {self._broken.args[0]})"
            ) from self._broken
        if engine.closed:
            raise VowpalWabbitError(f"{type(self).__name__} is closed")
        return engine

    def _check_usable(self) -> None:
        """Raise now, at the call, what the call would raise once it starts."""
        if self._broken is None or not self.restart_on_crash or self._closed:
            self._engine_or_raise()

    def _wait_for_turn(self, token: object, wait_until: Optional[float]) -> bool:
        """Hold the process for the call ``token``, waiting for another thread's call.

        :returns: ``False`` when ``wait_until`` passed first
        """
        me = threading.get_ident()
        with self._turn:
            while self._holder is not None and self._holder[0] != me:
                left = None if wait_until is None else wait_until - time.perf_counter()
                if left is not None and left <= 0:
                    return False
                self._turn.wait(left)
            self._holder = (me, token)
            return True

    def _turn_limit(self, began: float, deadline: Optional[float]) -> Optional[float]:
        """How long a call may wait for another thread's: until its deadline,
        else ``io_timeout_s`` from ``began``."""
        if deadline is not None or self.io_timeout_s is None:
            return deadline
        return began + self.io_timeout_s

    def _end_turn(self, token: object) -> None:
        with self._turn:
            if self._holder is not None and self._holder[1] is token:
                self._holder = None
                self._turn.notify_all()

    def _busy_error(self, waited: float) -> VowpalWabbitBusyError:
        return VowpalWabbitBusyError(
            f"another thread's call held this {type(self).__name__} for {waited:.3g} s; "
            "calls on one process are serialised (an unfinished predict() iterator holds "
            "the process until it is exhausted or closed)", argv=self.argv)

    def _begin_call(self, deadline: Optional[float] = None,
                    metrics: Optional[Dict[str, Any]] = None,
                    quiet_deadline: bool = False) -> Optional[Tuple[object, bool]]:
        """Take the process over for a new call: wait for other threads' calls,
        restart a failed engine when allowed, clear earlier calls' leftovers.

        :param deadline: the call's deadline, also the longest wait for the
            process (``io_timeout_s`` without one)
        :param metrics: receives ``lock_wait_time`` and ``restarts``
        :param quiet_deadline: return ``None`` instead of raising when the
            deadline passes while waiting for another thread
        :returns: the call's token and whether earlier calls' leftovers are all
            cleared; ``None`` (with ``quiet_deadline``) when the deadline passed
        :raises VowpalWabbitBusyError: when the process stayed held too long
        """
        began = time.perf_counter()
        token = object()
        if not self._wait_for_turn(token, self._turn_limit(began, deadline)):
            if metrics is not None:
                metrics["lock_wait_time"] = time.perf_counter() - began
                metrics["restarts"] = 0
            if quiet_deadline and deadline is not None:
                return None
            raise self._busy_error(time.perf_counter() - began)
        try:
            if metrics is not None:
                metrics["lock_wait_time"] = time.perf_counter() - began
                metrics["restarts"] = 0
            if self._broken is not None and self.restart_on_crash and not self._closed:
                self._restart_engine(f"the previous engine failed: {self._broken.args[0]}")
                if metrics is not None:
                    metrics["restarts"] = 1
            self._engine_or_raise()
            cleared = self._pending == 0 or self._guard(self._clear_in_flight, deadline)
        except BaseException:
            self._end_turn(token)
            raise
        return token, cleared

    @contextlib.contextmanager
    def _call(self, deadline: Optional[float] = None,
              metrics: Optional[Dict[str, Any]] = None) -> Iterator[object]:
        """Hold the process for a call that does all its work before returning."""
        begun = self._begin_call(deadline, metrics)
        assert begun is not None
        try:
            yield begun[0]
        finally:
            self._end_turn(begun[0])

    def _check_token(self, token: object) -> None:
        holder = self._holder
        if holder is None or holder[1] is not token:
            raise VowpalWabbitError(
                "this predict() iterator was superseded by a later call on the same process; "
                "its remaining predictions were discarded")

    def _guard(self, function: Callable[..., Any], *args: Any) -> Any:
        """Run an engine operation; remember engine failures so that later
        calls refuse to guess which prediction is whose."""
        try:
            return function(*args)
        except (VowpalWabbitEngineExitedError, VowpalWabbitProtocolError,
                VowpalWabbitTimeoutError) as exc:
            self._broken = exc
            logger.error("the vw engine of %r failed: %s", self, exc.message)
            raise

    # ------------------------------------------------------------- restart

    def _restart_engine(self, reason: str, timeout: float = 5.0) -> None:
        old = self._engine
        old_pid = old.pid if old is not None else None
        if old is not None and not old.closed:
            if self._broken is not None:
                # A failed engine has nothing worth waiting for: it is dead, or
                # stuck, or its output can no longer be trusted.
                timeout = min(timeout, _FAILED_ENGINE_CLOSE_S)
            try:
                old.close(timeout)
            except VowpalWabbitError as exc:
                logger.warning("the replaced vw engine failed: %s", exc)
        self._forget_in_flight()
        try:
            self._start_engine()
        except VowpalWabbitError as exc:
            self._broken = exc
            logger.error("restarting the vw engine failed: %s", exc)
            raise
        self._broken = None
        self._restart_count += 1
        logger.warning("restarted the vw engine (%s): vw[%s] -> vw[%s], restart #%d",
                       reason, old_pid, self.pid, self._restart_count)

    def restart(self, timeout: float = 5.0) -> None:
        """Replace the engine with a fresh one started with the same command line.

        The old engine is closed first (its input is closed, so a ``-f`` model
        is written; SIGTERM and SIGKILL follow within ``timeout``). Predictions
        still in flight are lost, and unfinished ``predict`` iterators raise if
        resumed. Works on a healthy or a failed process, not a closed one.

        :param timeout: seconds the old engine gets to exit
        :raises VowpalWabbitStartupError: when the new engine cannot start (the
            process stays failed; call ``restart()`` again)
        :raises VowpalWabbitBusyError: when another thread's call holds the
            process for longer than ``io_timeout_s``
        """
        validate_seconds(timeout, "timeout", allow_none=False)
        began = time.perf_counter()
        token = object()
        if not self._wait_for_turn(token, self._turn_limit(began, None)):
            raise self._busy_error(time.perf_counter() - began)
        try:
            if self._closed:
                raise VowpalWabbitError(f"{type(self).__name__} is closed")
            self._restart_engine("restart() was called", timeout)
        finally:
            self._end_turn(token)

    def _finish_call(self, method: str, metrics: Optional[Dict[str, Any]]) -> None:
        if self.metrics_hook is None or metrics is None:
            return
        metrics.setdefault("method", method)
        try:
            self.metrics_hook(metrics)
        except Exception:  # pylint: disable=broad-except
            logger.exception("metrics_hook raised; ignoring it")

    def _prepare_metrics(self, metrics: Optional[Dict[str, Any]],
                         detailed: Optional[Dict[str, Any]],
                         detailed_keys: Sequence[str]) -> Optional[Dict[str, Any]]:
        """Reset the caller's metrics dicts for a new call; with a hook and no
        dict of the caller's, make one so the hook still gets the metrics."""
        if metrics is None and self.metrics_hook is not None:
            metrics = {}
        if metrics is not None:
            metrics["num_lines"] = 0
        if detailed is not None:
            for key in detailed_keys:
                detailed[key] = []
        return metrics

    def _require_predictions(self, method: str) -> None:
        if self.write_only:
            raise VowpalWabbitError(f"{method}() needs predictions, but this process is "
                                    "write-only (write_only=True)")
        if self.audit_mode:
            raise VowpalWabbitError(f"{method}() is not available in audit mode; "
                                    "use explain_vw_line()")

    # ------------------------------------------------------------ training

    def _format_training_lines(self, common_features: Any, items_features: Any, labels: Any,
                               weights: Any, debug_info: Any) -> List[str]:
        """Format and check every labelled example before anything is sent."""
        items, labels, weights = list(items_features), list(labels), list(weights)
        if not len(items) == len(labels) == len(weights):
            raise ValueError(f"items_features, labels and weights differ in length: "
                             f"{len(items)}, {len(labels)}, {len(weights)}")
        for index, label in enumerate(labels):
            _check_label(label, index)
        for index, weight in enumerate(weights):
            if weight is not None:
                _check_number(weight, f"weights[{index}]")
                if weight < 0:
                    raise ValueError(f"weights[{index}] is negative: {weight!r}")
        formatter = self.formatter
        common = formatter.format_common_features(common_features, debug_info=debug_info)
        check_line_part(common, "the formatted common features")
        lines = [
            formatter.get_formatted_example(
                common, formatter.format_item_features(common_features, item, debug_info=debug_info),
                label=label, weight=weight, debug_info=debug_info)
            for item, label, weight in zip(items, labels, weights)]
        for index, line in enumerate(lines):
            check_line(line, index)
        return lines

    def _train_metrics(self) -> Optional[Dict[str, Any]]:
        """A metrics dict for a ``train`` call, when a hook will receive it."""
        return None if self.metrics_hook is None else {}

    def _finish_train(self, metrics: Optional[Dict[str, Any]], start: float,
                      num_lines: int) -> None:
        """Hand a ``train`` call's metrics to the hook, however the call ended;
        ``num_lines`` is 0 when it failed."""
        if metrics is not None:
            metrics["num_lines"] = num_lines
            metrics["total_time"] = time.perf_counter() - start
        self._finish_call("train", metrics)

    # ---------------------------------------------------- save and explain

    def save(self, path: str, timeout: Optional[float] = None) -> None:
        """Save the model to ``path`` now, while the engine keeps running.

        The engine writes its model through its ``save_...|`` control example,
        which yields no prediction, so the count of predictions is not
        disturbed. The file appears atomically (written beside ``path``, then
        renamed) and is complete when this method returns.

        .. note:: The engine saves what it has. A process running with ``-t``
           saves its weights without the learning state, and in vw 9.x such a
           model scores differently once loaded (``vw -i m -t -f copy`` does the
           same); save from a process without ``-t`` to keep a model intact.

        :param path: where to write the model (parent directories are created)
        :param timeout: seconds to wait for the engine; ``None``: no limit but
            ``io_timeout_s`` without progress
        :raises VowpalWabbitError: when the engine fails or times out (a
            timed-out save leaves the process failed: restart or close it)
        """
        deadline = deadline_from_timeout(timeout)
        self._check_usable()
        with self._call(deadline):
            self._guard(self._engine_or_raise().save_model, str(path), deadline,
                        None if self.write_only else self._lines_per_example, self.io_timeout_s)

    def explain_vw_line(self, vw_line: str, link_function: bool = False) -> Tuple[float, str]:
        """Audit one example: its raw score and the features that made it.

        Needs ``audit_mode=True``. In audit mode the engine prints three lines
        per example (raw score, features, final prediction), which are read
        together, so calls can follow each other indefinitely. A labelled line
        also trains the model unless the engine runs with ``-t``.

        :param vw_line: one example in VW text format
        :param link_function: accepted for compatibility with subwabbit 2.x;
            the output shape no longer depends on it
        :returns: ``(raw prediction, explanation string)``, the explanation being
            tab-separated ``namespace^feature:hashindex:value:weight`` entries for
            :meth:`~subwabbit.base.VowpalWabbitBaseFormatter.get_human_readable_explanation`
        :raises VowpalWabbitError: when the process is not in audit mode
        :raises ValueError: when ``vw_line`` is not exactly one example
        """
        del link_function
        if not self.audit_mode:
            raise VowpalWabbitError("explain_vw_line() needs a process created with audit_mode=True")
        check_line(vw_line)
        data = encode_lines([vw_line])
        self._check_usable()
        with self._call():
            engine = self._engine_or_raise()
            self._guard(engine.write_all, data, None, self.io_timeout_s)
            self._pending += 1
            raw, features, _prediction = self._guard(engine.read_lines, AUDIT_LINES_PER_EXAMPLE,
                                                     None, self.io_timeout_s)
            self._pending -= 1
            score = self._guard(parse_scalar, raw)
        return score, features.decode("utf-8", "replace").strip("\t\r ")

    # ------------------------------------------------------------- lifecycle

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine: close its input so that it finishes (and writes a
        ``-f`` model), then SIGTERM and SIGKILL it if it has not exited near
        the end of ``timeout``. Returns within ``timeout`` seconds (another
        thread's running call is given half of it to finish first). Closing
        twice is harmless.

        :raises VowpalWabbitEngineExitedError: when the engine exits with an
            error of its own that no earlier call reported
        """
        validate_seconds(timeout, "timeout", allow_none=False)
        if self._closed:
            return
        began = time.perf_counter()
        token = object()
        held = self._wait_for_turn(token, began + timeout / 2)
        if not held and self._engine is not None and self._engine.returncode is None:
            # Another thread's call is still running: kill the engine so that
            # it fails at once, and let it end before the pipes are closed.
            logger.warning("close(): another thread's call still holds %r; killing the engine",
                           self)
            self._engine.kill()
            held = self._wait_for_turn(token, began + timeout * 0.75)
        try:
            self._closed = True
            if self._engine is not None:
                self._engine.close(max(0.0, timeout - (time.perf_counter() - began)))
        finally:
            if held:
                self._end_turn(token)

    def __enter__(self) -> "VowpalWabbitProcessModel":
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        try:
            self.close()
        except VowpalWabbitError:
            if exc_type is None:
                raise
            logger.exception("closing the vw engine failed while another exception propagated")

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None and not engine.closed:
            engine.release()


def _check_number(value: Any, what: str) -> None:
    kind = type(value)
    if kind is int:
        return
    if kind is float and value - value == 0.0:  # finite (inf - inf and nan - nan are nan)
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value!r}")


def _check_label(label: Label, index: int) -> None:
    if isinstance(label, str):
        if not label or any(ch.isspace() or ch in "|" for ch in label):
            raise ValueError(f"labels[{index}] must be a non-empty label without spaces or '|', "
                             f"got {label!r}")
        return
    _check_number(label, f"labels[{index}]")

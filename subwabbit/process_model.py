"""What the blocking and nonblocking models share: the engine's lifecycle, the
bookkeeping that keeps every prediction with its own call, saving, audit
explanations and the metrics hook."""

import logging
import math
import numbers
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .base import Label, VowpalWabbitBaseFormatter, VowpalWabbitBaseModel
from .command import VwArgs, build_argv, normalize_vw_args, resolve_engine_command
from .deadlines import deadline_from_timeout, validate_seconds
from .engine_process import EngineProcess
from .errors import VowpalWabbitEngineExitedError, VowpalWabbitError, VowpalWabbitProtocolError
from .lines import check_line, check_line_part, encode_lines, parse_scalar, parse_scalars

logger = logging.getLogger("subwabbit")

#: Receives each call's metrics dict when the call ends, however it ended.
MetricsHook = Callable[[Dict[str, Any]], None]

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
    """

    #: turns raw prediction lines into the values ``predict`` yields
    parse_predictions: Callable[[List[bytes]], List[Any]] = staticmethod(parse_scalars)

    def __init__(self, formatter: VowpalWabbitBaseFormatter, vw_args: VwArgs, batch_size: int, *,
                 write_only: bool, audit_mode: bool,
                 vw_command: Union[str, Sequence[str], None],
                 metrics_hook: Optional[MetricsHook], startup_timeout_s: float) -> None:
        super().__init__(formatter)
        self._engine: Optional[EngineProcess] = None
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
        self.vw_command = resolve_engine_command(vw_command)
        self.argv = build_argv(self.vw_command, self.vw_args, predictions=not self.write_only,
                               audit=self.audit_mode)
        self._lines_per_example = AUDIT_LINES_PER_EXAMPLE if self.audit_mode else 1
        self._pending = 0
        self._call_token: Optional[object] = None
        self._broken: Optional[BaseException] = None
        self._engine = EngineProcess(
            self.argv, startup_timeout_s=self.startup_timeout_s,
            predictions_per_probe=None if self.write_only else self._lines_per_example)
        self._after_start()

    # ------------------------------------------------------- subclass hooks

    def _after_start(self) -> None:
        """Prepare the pipes once the engine runs."""

    def _clear_in_flight(self, deadline: Optional[float]) -> bool:
        """Read and discard what earlier calls left in flight, until ``deadline``.

        :returns: whether nothing is left in flight
        """
        raise NotImplementedError()

    # -------------------------------------------------------------- status

    @property
    def pending_lines(self) -> int:
        """Examples sent to the engine whose predictions have not been read."""
        return self._pending

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
        if engine is None or engine.closed:
            raise VowpalWabbitError(f"{type(self).__name__} is closed")
        if self._broken is not None:
            raise VowpalWabbitError(
                f"the vw engine of this {type(self).__name__} failed earlier and can no longer "
                f"be used; close it and create a new one (cause: {self._broken.args[0]})"
            ) from self._broken
        return engine

    def _start_call(self, deadline: Optional[float] = None) -> Tuple[object, bool]:
        """Take the process over for a new call.

        :returns: the call's token and whether earlier calls' leftovers are all cleared
        """
        self._engine_or_raise()
        token = object()
        self._call_token = token
        cleared = self._pending == 0 or self._guard(self._clear_in_flight, deadline)
        return token, cleared

    def _check_token(self, token: object) -> None:
        if self._call_token is not token:
            raise VowpalWabbitError(
                "this predict() iterator was superseded by a later call on the same process; "
                "its remaining predictions were discarded")

    def _guard(self, function: Callable[..., Any], *args: Any) -> Any:
        """Run an engine operation; remember engine failures so that later
        calls refuse to guess which prediction is whose."""
        try:
            return function(*args)
        except (VowpalWabbitEngineExitedError, VowpalWabbitProtocolError) as exc:
            self._broken = exc
            raise

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

    def _train_metrics(self, start: float, num_lines: int) -> Optional[Dict[str, Any]]:
        if self.metrics_hook is None:
            return None
        return {"num_lines": num_lines, "total_time": time.perf_counter() - start}

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
        :param timeout: seconds to wait for the engine; ``None``: no limit
        :raises VowpalWabbitError: when the engine fails or times out
        """
        deadline = deadline_from_timeout(timeout)
        engine = self._engine_or_raise()
        self._start_call()
        self._guard(engine.save_model, str(path), deadline,
                    None if self.write_only else self._lines_per_example)

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
        engine = self._engine_or_raise()
        self._start_call()
        self._guard(engine.write_all, data)
        self._pending += 1
        raw, features, _prediction = self._guard(engine.read_lines, AUDIT_LINES_PER_EXAMPLE)
        self._pending -= 1
        return self._guard(parse_scalar, raw), features.decode("utf-8", "replace").strip("\t\r ")

    # ------------------------------------------------------------- lifecycle

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine: close its input so that it finishes (and writes a
        ``-f`` model), wait up to ``timeout`` seconds, then terminate and kill
        it. Closing twice is harmless.

        :raises VowpalWabbitEngineExitedError: when the engine exits with an
            error of its own that no earlier call reported
        """
        validate_seconds(timeout, "timeout", allow_none=False)
        if self._engine is not None:
            self._call_token = None
            self._engine.close(timeout)

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

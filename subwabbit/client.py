"""What every client class shares apart from I/O: checking its settings,
building the engine's command line, metrics, the metrics hook, preparing
training lines, and knowing which process it belongs to (fork safety).

The blocking and nonblocking classes (:mod:`subwabbit.process_model`) and
the asyncio class (:mod:`subwabbit.asyncio_process`) build on
:class:`ClientBase`, the way httpx's ``Client`` and ``AsyncClient`` share a
base: the I/O is theirs, everything else is here once.
"""

import atexit
import collections
import itertools
import logging
import math
import numbers
import os
import threading
import time
import weakref
from collections.abc import Iterable, MutableMapping
from functools import partial
from typing import (Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple,
                    Union)

from .base import VowpalWabbitBaseFormatter, example_joiner
from .command import (VwArgs, build_argv, normalize_vw_args, refuse_stale_cache,
                      resolve_engine_command)
from .engine.program import option_name
from .core.channel import Channel
from .core.exchanges import (CleanupExchange, Exchange, Pacing, ProbeExchange, check_item_parts,
                             format_common_part)
from .core.kinds import (LABEL_STRINGS, SCALAR, PredictionKind, choose_kind,
                         learns_by_line_count, makes_passes, probes_would_teach,
                         refuse_in_audit_mode)
from .model_file import saved_options_of
from .saving import ModelSave
from .deadlines import required_seconds, validate_seconds
from . import engine_process
from .errors import VowpalWabbitError
from .transfer import finish_example
from .lines import (CheckedLines, breaks_no_line, check_labelled_lines, check_line_labels,
                    check_lines, common_part_holds_the_header, parts_add_no_label_words,
                    encode_example)

logger = logging.getLogger("subwabbit")

#: Receives each call's metrics dict when the call ends, however it ended.
MetricsHook = Callable[[Dict[str, Any]], None]

#: Default of ``io_timeout_s``: generous, so that only an engine that has
#: stopped or hung trips it (a busy engine answers a batch in milliseconds).
DEFAULT_IO_TIMEOUT_S = 30.0

#: Lines of engine output per example in audit mode (with ``-p``): the raw
#: score, the features, the prediction.
AUDIT_LINES_PER_EXAMPLE = 3

#: Metrics a ``predict`` call sets only on some of its ways (see
#: :meth:`ClientBase._prepare_metrics`).
_CALL_ONLY_METRICS = ("prepare_time", "total_time", "cleanup_time",
                      "before_cleanup_pending_lines", "after_cleanup_pending_lines")

#: How long a client dropped without ``close()`` (``__del__``, interpreter
#: exit) waits for an engine that writes a ``-f`` model to finish it. The
#: engine needs to learn what is left in the pipe (a pipe holds at most 1 MiB)
#: and write its weights (``-b 25``: 128 MiB at most), a second or two on a
#: slow disk; 30 s is ``close()``'s own default. A stopped engine is never
#: waited for.
FINAL_MODEL_WAIT_S = 30.0

#: How long a client dropped without ``close()`` may take to write the rest
#: of an example that a cut call left partly written to an engine that
#: writes a ``-f`` model (see :meth:`ClientBase._release`).
FINISH_EXAMPLE_AT_RELEASE_S = 1.0

#: How often, at most, a client logs that calls wait for one another.
CONTENTION_LOG_INTERVAL_S = 60.0

_FORMATTER_METHODS = ("format_common_features", "format_item_features")


def check_formatter_and_batch_size(formatter: Any, batch_size: Any) -> int:
    """Check a client's ``formatter`` and ``batch_size`` arguments.

    :returns: ``batch_size`` as an int
    :raises TypeError: for a formatter class rather than an instance (its
        methods would take the request's features for ``self``), or a
        formatter without the formatter methods
    :raises ValueError: for a ``batch_size`` that is not a positive int
        (:func:`positive_int`)
    """
    if isinstance(formatter, type):
        raise TypeError(f"formatter must be a formatter object, not the class "
                        f"{formatter.__name__}: pass {formatter.__name__}()")
    missing = [name for name in _FORMATTER_METHODS if not callable(getattr(formatter, name, None))]
    if missing:
        raise TypeError(f"formatter must have the methods {', '.join(_FORMATTER_METHODS)} "
                        f"(a VowpalWabbitBaseFormatter); {type(formatter).__name__} lacks "
                        f"{', '.join(missing)}")
    return positive_int(batch_size, "batch_size")


def positive_int(value: Any, name: str, most: Optional[int] = None,
                 or_none: bool = False) -> int:
    """A count setting (``batch_size``, ``max_pending_lines``, a pool's
    ``size``...) as an int: NumPy's integers are ints here, as in subwabbit 2.x.

    :param most: the largest value taken, if any
    :param or_none: the setting may also be ``None`` (which the caller
        handles): the error says so
    :raises ValueError: for a bool, a non-integer, or a value below 1 (or above ``most``)
    """
    number = None if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
        else int(value)
    if number is None or number < 1 or (most is not None and number > most):
        bound = "" if most is None else f" up to {most}"
        raise ValueError(f"{name} must be a positive int{bound}{' or None' if or_none else ''}, "
                         f"got {value!r}")
    return number


def client_vw_args(vw_args: VwArgs, audit_mode: bool = False) -> List[str]:
    """``vw_args`` as a client's engine takes them, at construction and at
    ``reload()``: normalised (:func:`~subwabbit.command.normalize_vw_args`;
    in audit mode without the ``-a``/``--audit`` that subwabbit adds itself),
    without a cache file that vw would read instead of stdin
    (:func:`~subwabbit.command.refuse_stale_cache`).

    :raises ValueError: for options a client cannot take
    :raises TypeError: for tokens that are not strings, paths or numbers
    """
    tokens = normalize_vw_args(vw_args, audit_mode)
    refuse_stale_cache(tokens)
    return tokens


class ReloadPlan(NamedTuple):
    """What a ``reload()`` switches to, worked out before any engine starts."""

    #: the new engine arguments, normalised
    vw_args: List[str]
    #: the kind of model they (and the model file they load) make
    kind: PredictionKind
    #: the new engines' command line
    argv: List[str]
    #: whether the model learns by the parity of the lines it reads
    #: (:func:`~subwabbit.core.kinds.learns_by_line_count`)
    counts_lines: bool
    #: the reduction that probe examples would teach (see
    #: :func:`~subwabbit.core.kinds.probes_would_teach`), or ``None``
    probes_teach: Optional[str] = None


class FifoLock:
    """A lock that threads get in the order they asked for it, which
    reloads take so that the last one asked for serves. A
    ``threading.Lock`` is not fair: the thread that releases it takes it
    again before a waiting thread wakes, so a reload asked for after one
    that waits (a retry at once, say) ran before it, and the older model
    served."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        #: the threads' turns; the first one holds the lock
        self._turns: "collections.deque[object]" = collections.deque()

    def __enter__(self) -> None:
        turn = object()
        with self._cond:
            self._turns.append(turn)
            try:
                while self._turns[0] is not turn:
                    self._cond.wait()
            except BaseException:  # (interrupted while waiting: give up the turn)
                self._turns.remove(turn)
                self._cond.notify_all()
                raise

    def __exit__(self, *exc_info: Any) -> None:
        with self._cond:
            self._turns.popleft()
            self._cond.notify_all()


class ClientBase:
    """Settings and I/O-free behaviour of a client of one engine.

    :param formatter: an object with ``format_common_features`` and
        ``format_item_features`` (normally a
        :class:`~subwabbit.base.VowpalWabbitBaseFormatter`)
    :param restart_after_fork: in a process forked after this object was
        created, start a new engine at the first call (``True``) or raise
        :class:`~subwabbit.errors.VowpalWabbitError` (``False``)
    :param prediction_type: the kind of model (see :mod:`subwabbit.core.kinds`),
        when ``vw_args`` do not show it (a model file carries its reductions)
    """

    #: the kind of model a class serves when neither ``vw_args`` nor
    #: ``prediction_type`` says one (see :func:`~subwabbit.core.kinds.choose_kind`)
    _default_prediction_type: Optional[str] = None
    #: seconds the formatter took per item in the last call's last batch
    #: (``None``: not measured yet); with a deadline, a call formats no more
    #: at a time than that speed allows (see
    #: :func:`~subwabbit.core.exchanges.items_to_format`)
    _format_s_per_item: Optional[float] = None

    def _configure(self, formatter: Any, vw_args: VwArgs, batch_size: int, *,
                   write_only: bool, audit_mode: bool,
                   vw_command: Union[str, Sequence[str], None],
                   metrics_hook: Optional[MetricsHook], startup_timeout_s: float,
                   io_timeout_s: Optional[float], restart_on_crash: bool,
                   restart_after_fork: bool, prediction_type: Optional[str] = None) -> None:
        batch_size = check_formatter_and_batch_size(formatter, batch_size)
        write_only, audit_mode = flag(write_only, "write_only"), flag(audit_mode, "audit_mode")
        if write_only and audit_mode:
            raise ValueError("write_only and audit_mode exclude each other: audit mode reads "
                             "the engine's output")
        if metrics_hook is not None and not callable(metrics_hook):
            raise TypeError("metrics_hook must be callable")
        self.formatter = formatter
        self.vw_args = client_vw_args(vw_args, audit_mode)
        #: the ``prediction_type`` argument as given (``None``: from ``vw_args``)
        self.prediction_type = prediction_type
        #: the kind of model served: how its examples are laid out, what
        #: ``predict`` gives and what ``train`` takes (:mod:`subwabbit.core.kinds`)
        self.prediction_kind: PredictionKind
        # _probes_teach: the reduction of a learning engine that probe examples
        # would teach (core.kinds.probes_would_teach): such an engine is started
        # and saved without them; None for any other
        self.prediction_kind, self._counts_lines, self._probes_teach = self._kind_for(
            self.vw_args, audit_mode)
        self.batch_size = batch_size
        self.write_only = write_only
        self.audit_mode = audit_mode
        self.metrics_hook = metrics_hook
        self.startup_timeout_s = required_seconds(startup_timeout_s, "startup_timeout_s")
        if self.startup_timeout_s == 0:
            raise ValueError("startup_timeout_s must be positive: no engine answers its start-up "
                             f"probe in no time, got {startup_timeout_s!r}")
        self.io_timeout_s = validate_seconds(io_timeout_s, "io_timeout_s")
        if self.io_timeout_s == 0:
            raise ValueError("io_timeout_s must be positive, or None for no limit")
        self.restart_on_crash = flag(restart_on_crash, "restart_on_crash")
        self.restart_after_fork = flag(restart_after_fork, "restart_after_fork")
        self.vw_command = resolve_engine_command(vw_command)
        self.argv = build_argv(self.vw_command, self.prediction_kind.engine_args(self.vw_args),
                               predictions=not self.write_only, audit=self.audit_mode)
        self._outputs_per_line = (0 if self.write_only else
                                  AUDIT_LINES_PER_EXAMPLE if self.audit_mode else
                                  self.prediction_kind.answer_lines)
        self._restart_count = 0
        self._writes_final_model = any(option_name(token) in ("-f", "--final_regressor")
                                       for token in self.vw_args)
        #: the process this object's engine belongs to
        self._owner_pid = os.getpid()
        self._last_contention_log = -math.inf
        _track_for_fork(self)

    # ---------------------------------------------------------------- reload

    def _plan_reload(self, vw_args: VwArgs) -> ReloadPlan:
        """What a :meth:`reload` with ``vw_args`` switches to, checked as the
        constructor checks its arguments. The model file's header is read
        here, once: the asyncio classes call this on a worker thread, and
        nothing is read again while calls wait for the switch.

        :raises ValueError: when ``vw_args`` make another kind of model, or
            one with other classes (a reload swaps the model, not what
            ``predict`` returns: see :meth:`PredictionKind.serves_like
            <subwabbit.core.kinds.PredictionKind.serves_like>`)
        """
        normalized = client_vw_args(vw_args, self.audit_mode)
        kind, counts_lines, probes_teach = self._kind_for(normalized, self.audit_mode)
        if not kind.serves_like(self.prediction_kind):
            raise ValueError(f"reload() cannot change the kind of model or its classes: this "
                             f"object serves {self.prediction_kind.summary()} and the new "
                             f"arguments make {kind.summary()}; create a new object")
        argv = build_argv(self.vw_command, kind.engine_args(normalized),
                          predictions=not self.write_only, audit=self.audit_mode)
        return ReloadPlan(normalized, kind, argv, counts_lines, probes_teach)

    def _reloaded(self, plan: ReloadPlan) -> None:
        """Remember what the engine a reload switched to serves."""
        self.vw_args = plan.vw_args
        self.prediction_kind = plan.kind
        self.argv = plan.argv
        self._counts_lines = plan.counts_lines
        self._probes_teach = plan.probes_teach
        self._writes_final_model = any(option_name(token) in ("-f", "--final_regressor")
                                       for token in self.vw_args)

    # --------------------------------------------------------------- status

    @property
    def restart_count(self) -> int:
        """How many times the engine was restarted (by :meth:`restart`,
        ``restart_on_crash`` or after a fork)."""
        return self._restart_count

    # --------------------------------------------------------------- kind

    def _kind_for(self, vw_args: Sequence[str],
                  audit_mode: bool) -> Tuple[PredictionKind, bool, Optional[str]]:
        """The kind of model that ``vw_args`` (normalised), the options saved
        in the model file they load (:mod:`subwabbit.model_file`) and this
        object's ``prediction_type`` describe; the engine's command line follows from
        it (:meth:`PredictionKind.engine_args
        <subwabbit.core.kinds.PredictionKind.engine_args>`), and so do the
        answer lines per example. Also whether the model learns by the parity
        of the lines it reads (:func:`~subwabbit.core.kinds.learns_by_line_count`),
        and which of its reductions probe examples would teach
        (:func:`~subwabbit.core.kinds.probes_would_teach`).

        :raises ValueError: for a reduction that cannot be served, a
            ``prediction_type`` that contradicts ``vw_args``, or audit mode
            on a model whose predictions are not scalars
        """
        saved = saved_options_of(vw_args)
        kind = choose_kind(vw_args, self.prediction_type, self._default_prediction_type,
                           saved_options=saved)
        if audit_mode and kind.name not in (SCALAR, LABEL_STRINGS):
            raise ValueError(f"audit_mode serves models with scalar predictions only; this is "
                             f"a {kind.name!r} model ({kind.origin})")
        if audit_mode:
            refuse_in_audit_mode(list(vw_args) + saved)
        return (kind, learns_by_line_count(list(vw_args) + saved),
                probes_would_teach(vw_args, saved))

    def _save_command(self, save: ModelSave) -> List[bytes]:
        """The control lines that make the engine save: the save command,
        and for a model that learns by the parity of the lines it reads, an
        empty line, so that the save leaves that parity as it was (with
        ``--lrq`` one save in a stream of training lines changed every later
        update; found by a review). A save's probe is two lines."""
        return [save.command, b"\n"] if self._counts_lines else [save.command]

    def _refuse_save_of_passes(self) -> None:
        """Refuse ``save()`` on an engine that makes several passes
        (:func:`~subwabbit.core.kinds.makes_passes`), before anything is sent:
        vw caches the save command with the examples and carries it out again
        in every later pass (rewriting a temporary file after the save had
        renamed it, which stayed beside ``path``), and counts it among the
        examples of which every 10th is held out.

        :raises VowpalWabbitError: for such an engine
        """
        if makes_passes(self.vw_args):
            raise VowpalWabbitError("save() is not available with --passes above 1: vw would "
                                    "save again in every later pass; pass -f, which writes the "
                                    "model once the process is closed and vw has made its "
                                    "passes")

    @property
    def _save_probes(self) -> bool:
        """Whether a save command is followed by a probe, whose answer shows
        the save done: not on a write-only engine (it answers none), nor on
        one the probe would teach (see
        :func:`~subwabbit.core.kinds.probes_would_teach`); those wait for
        the file instead (:meth:`_save_file_limit`)."""
        return not self.write_only and self._probes_teach is None

    def _save_exchanges(self, channel: Channel, save: ModelSave,
                        deadline: Optional[float]) -> Iterator[Exchange]:
        """The exchanges of a save, for the driver to run one after the
        other: the save command (and its probe, see :attr:`_save_probes`);
        without a probe, then the answers earlier calls left in flight, read
        and dropped, as an engine blocked writing them would never reach the
        save. The save timed out if one of them did."""
        probe = self._save_probes
        exchange = ProbeExchange(channel, channel.begin(keep=False), deadline, self.io_timeout_s,
                                 control=self._save_command(save), probe=probe)
        yield exchange
        if not exchange.timed_out and not probe and channel.stale_lines:
            yield CleanupExchange(channel, channel.begin(keep=False), deadline, self.io_timeout_s)

    def _save_file_limit(self, deadline: Optional[float]) -> Optional[float]:
        """Until when a save with no probe waits for its file: the engine
        has at most a pipe's worth of examples to learn before the save, so
        ``io_timeout_s`` bounds the whole wait (as well as ``deadline``)."""
        if self.io_timeout_s is None:
            return deadline
        idle_end = time.perf_counter() + self.io_timeout_s
        return idle_end if deadline is None else min(deadline, idle_end)

    # ------------------------------------------------------------ channel

    def _new_channel(self, after_blank: bool = False) -> Channel:
        """A channel for a newly started engine, laid out for the model's kind
        (``after_blank``: see :class:`~subwabbit.core.channel.Channel`)."""
        return Channel(self._outputs_per_line, self.prediction_kind.multi_line, after_blank)

    @property
    def _probe_kind(self) -> Optional[PredictionKind]:
        """The kind whose shape the start-up probes' answers must have
        (``None`` in audit mode, whose answers are three lines of another shape)."""
        return None if self.audit_mode else self.prediction_kind

    # ----------------------------------------------------------- pacing

    def _pacing(self) -> Pacing:
        """How ``predict`` feeds the engine; the classes set their own."""
        raise NotImplementedError()

    # ------------------------------------------------------------- metrics

    def _prepare_metrics(self, metrics: Optional[Dict[str, Any]],
                         detailed: Optional[Dict[str, Any]],
                         detailed_keys: Sequence[str]) -> Optional[Dict[str, Any]]:
        """Reset the caller's metrics dicts for a new call; with a hook and no
        dict of the caller's, make one so the hook still gets the metrics.

        :raises TypeError: for a ``metrics`` or ``detailed_metrics`` that is
            neither ``None`` nor a dict (any mutable mapping)
        """
        # (a dict needs no check against the ABC: a call's cost)
        if metrics is not None and type(metrics) is not dict:  # pylint: disable=unidiomatic-typecheck
            _check_fillable(metrics, "metrics")
        if detailed is not None and type(detailed) is not dict:  # pylint: disable=unidiomatic-typecheck
            _check_fillable(detailed, "detailed_metrics")
        if metrics is None and self.metrics_hook is not None:
            metrics = {}
        if metrics is not None:
            # A dict reused across calls: drop what only some calls set (one
            # that returns before it begins sets no prepare_time), so that it
            # never shows an earlier call's value as this one's.
            for key in _CALL_ONLY_METRICS:
                metrics.pop(key, None)
            metrics["num_lines"] = 0
            metrics["restarts"] = 0
            metrics["engine_failures"] = 0
            metrics["lock_wait_time"] = 0.0
            metrics["waited_for_other_call"] = 0
        if detailed is not None:
            for key in detailed_keys:
                detailed[key] = []
        return metrics

    def _finish_call(self, method: str, metrics: Optional[Dict[str, Any]]) -> None:
        if self.metrics_hook is None or metrics is None:
            return
        metrics.setdefault("method", method)
        try:
            self.metrics_hook(metrics)
        except Exception:  # pylint: disable=broad-except
            logger.exception("metrics_hook raised; ignoring it")

    @staticmethod
    def _finish_predict_metrics(metrics: Optional[Dict[str, Any]], exchange: Any, start: float,
                                pending_lines: int, leftovers: bool) -> None:
        """Fill a ``predict`` call's closing metrics, however it ended.

        :param exchange: the call's :class:`~subwabbit.core.exchanges.PredictExchange`,
            or ``None`` when it never began
        :param pending_lines: earlier calls' leftovers in flight (not the
            lines of a call in progress), for a call that never began
        :param leftovers: whether the class reports earlier calls' leftovers
            (``cleanup_time`` and the ``*_cleanup_pending_lines`` keys)
        """
        if metrics is None:
            return
        now = time.perf_counter()
        if leftovers:
            if exchange is not None:
                cleared = exchange.cleared_at
                metrics["cleanup_time"] = (now if cleared is None else max(cleared, start)) - start
                metrics["after_cleanup_pending_lines"] = exchange.channel.stale_lines
            else:
                metrics.setdefault("before_cleanup_pending_lines", pending_lines)
                metrics["cleanup_time"] = now - start if pending_lines else 0.0
                metrics["after_cleanup_pending_lines"] = pending_lines
        metrics["num_lines"] = exchange.returned if exchange is not None else 0
        metrics["total_time"] = now - start

    def _note_contention(self, waited_s: float, metrics: Optional[Dict[str, Any]]) -> None:
        """Count and (once a minute at most) log that a call waited for another."""
        if metrics is not None:
            metrics["waited_for_other_call"] = 1
        now = time.monotonic()
        if now - self._last_contention_log >= CONTENTION_LOG_INTERVAL_S:
            self._last_contention_log = now
            logger.warning(
                "a call on %s waited %.3g s for another call on the same object; calls on one "
                "object are served one at a time: use one object per thread or task (or a "
                "pool of engines) for concurrent requests", type(self).__name__, waited_s)

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
        """Format and check every labelled example before anything is sent.

        :returns: one line per item, or, for a multi-line kind, the lines of
            the one example the items make (none without items)
        """
        check_per_item(items_features, "items_features")
        check_per_item(labels, "labels")
        if weights is not None:
            check_per_item(weights, "weights")
        items = list(items_features)
        labels = _take_along(labels, len(items), "labels")
        weighted = weights is not None
        weights = (_take_along(weights, len(items), "weights") if weighted
                   else [None] * len(items))
        kind = self.prediction_kind
        if kind.multi_line and not items:
            return []  # no example at all (a multi-line example needs its items)
        labels = kind.check_labels(labels)
        kind.check_weights(weights)
        formatter = self.formatter
        common = format_common_part(formatter, common_features, debug_info)
        parts = [formatter.format_item_features(common_features, item, debug_info=debug_info)
                 for item in items]
        flat = check_item_parts(parts)
        if kind.multi_line:
            if not items:
                return []
            lines = kind.example_lines(common, parts, labels)
            encode_example(lines)  # checks that the lines make exactly one example
            return lines
        join = example_joiner(formatter)
        # With the default joining, a common part that holds the header and
        # adds no label word leaves each line the label (and weight) checked above.
        rule = kind.label_words_rule()
        if rule is not None and join is None and parts_add_no_label_words(common, parts):
            rule = None
        if join is None and not weighted and all(type(label) in _PLAIN_LABELS
                                                 for label in labels):
            # The default joining, inline: "LABEL COMMON ITEM" (plain numbers
            # print as str() prints them, as get_formatted_example does).
            middle = f" {common} "
            lines = CheckedLines(f"{label}{middle}{part}" for label, part in zip(labels, parts))
            if (rule is None and common_part_holds_the_header(common) and breaks_no_line(flat)
                    and "\t" not in common.split("|", 1)[0]):
                return lines
        else:
            join = join or partial(VowpalWabbitBaseFormatter.get_formatted_example, formatter)
            lines = [join(common, part, label=label, weight=weight, debug_info=debug_info)
                     for part, label, weight in zip(parts, labels, weights)]
        checked = check_lines(lines)
        check_labelled_lines(checked)
        if rule is not None:
            check_line_labels(checked, rule, what="training example")
        return checked

    def _train_metrics(self) -> Optional[Dict[str, Any]]:
        """A metrics dict for a ``train`` call, when a hook will receive it
        (with the keys every call has from its start, as ``predict``'s)."""
        if self.metrics_hook is None:
            return None
        return {"num_lines": 0, "restarts": 0, "engine_failures": 0, "lock_wait_time": 0.0,
                "waited_for_other_call": 0}

    @staticmethod
    def _count_failure(metrics: Optional[Dict[str, Any]]) -> None:
        """Note in a call's metrics that its engine failed during it."""
        if metrics is not None:
            metrics["engine_failures"] = 1

    def _finish_train(self, metrics: Optional[Dict[str, Any]], start: float,
                      num_lines: int) -> None:
        """Hand a ``train`` call's metrics to the hook, however the call ended;
        ``num_lines`` is 0 when it failed."""
        if metrics is not None:
            metrics["num_lines"] = num_lines
            metrics["total_time"] = time.perf_counter() - start
        self._finish_call("train", metrics)

    def _leftover_lines(self) -> int:
        """Lines in flight that ended calls left on a single process's engine
        (not those of the call in progress, which may be another thread's or
        task's)."""
        channel = getattr(self, "_channel", None)
        return channel.stale_lines if channel is not None else 0

    def _closed_error(self) -> VowpalWabbitError:
        """What a call on the closed object raises."""
        return VowpalWabbitError(f"{type(self).__name__} is closed")

    def _closed_while_starting(self) -> VowpalWabbitError:
        """What a start that close() cut short raises."""
        return VowpalWabbitError(f"{type(self).__name__} was closed while its new engine "
                                 "started")

    # ----------------------------------------------------------------- fork

    def _in_forked_child(self) -> bool:
        """Whether this process is not the one the engine belongs to."""
        return os.getpid() != self._owner_pid

    def _fork_error(self) -> VowpalWabbitError:
        return VowpalWabbitError(
            f"this {type(self).__name__} was created in process {self._owner_pid} and this "
            f"process ({os.getpid()}) is a fork of it; its engine belongs to the parent. Create "
            "the object after the fork, or pass restart_after_fork=True to start a new engine "
            "here at the first call")

    def _after_fork_in_child(self) -> None:
        """Let go of the parent's engine (see :func:`_track_for_fork`)."""
        raise NotImplementedError()

    def _abandon_channel(self, reason: str, in_fork: bool = False) -> None:
        """End the call in progress on the current channel, if any, before the
        channel is let go (its engine replaced, closed or left to the parent
        of a fork): resumed, the call raises ``reason`` rather than read from
        whatever engine comes next.

        :param in_fork: in a forked child (see :meth:`Channel.let_go_in_fork
            <subwabbit.core.channel.Channel.let_go_in_fork>`)
        """
        channel = getattr(self, "_channel", None)
        if channel is not None:
            if in_fork:
                channel.let_go_in_fork(reason)
            else:
                channel.abandon(reason)

    def _release(self) -> None:
        """Let go of an engine that was never closed (``__del__``, interpreter
        exit) without blocking, except to let a ``-f`` model be written.

        An engine that writes a ``-f`` model and was left with part of an
        example (a train call cut off in the middle of a line) is first given
        the rest of it, within :data:`FINISH_EXAMPLE_AT_RELEASE_S`; when that
        cannot be done (the engine does not take it, the stream is torn, a
        call is still under way on another thread at exit), the engine is
        killed, so that it saves nothing rather than learn the cut line: a
        model file from before stays as it was."""
        engine = getattr(self, "_engine", None)
        if engine is not None and not engine.closed and engine.owner_pid == os.getpid():
            writes_model = getattr(self, "_writes_final_model", False)
            channel = getattr(self, "_channel", None)
            if writes_model and channel is not None and not _input_ends_whole(engine, channel):
                logger.warning("vw[%d] was dropped without close() with part of an example "
                               "written: killed, it saves no -f model", engine.pid)
                engine.kill()
                writes_model = False
            engine.release(FINAL_MODEL_WAIT_S if writes_model else 0.0)


def _input_ends_whole(engine: engine_process.EngineProcess, channel: Channel) -> bool:
    """For :meth:`ClientBase._release`: whether the engine's input ends on
    a whole line, once the rest of a partly written example, if any, is
    written (:func:`~subwabbit.transfer.finish_example`, which writes nothing
    after a cut write). Nothing is written either on a channel whose call is
    still under way (on another thread, at interpreter exit): written there,
    the bytes would race it."""
    if channel.current is not None:
        return not channel.unwritten_bytes
    return finish_example(engine, channel,
                          time.perf_counter() + FINISH_EXAMPLE_AT_RELEASE_S)


# ---------------------------------------------------------------- fork safety

_LIVE_CLIENTS: "weakref.WeakSet[ClientBase]" = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()

#: The process whose clients hold engines of their own: this one, or the
#: last forked child whose at-fork hooks ran (see :func:`let_go_after_unhooked_fork`)
_HOOKS_RAN_IN = os.getpid()

#: One lock per process that lets go of its parent's engines without the
#: at-fork hooks (made there, so never inherited held)
_UNHOOKED_FORK_LOCKS: Dict[int, Any] = {}


def _track_for_fork(client: ClientBase) -> None:
    let_go_after_unhooked_fork()  # (before a new client's engine is tracked)
    with _LIVE_LOCK:
        _LIVE_CLIENTS.add(client)


def let_go_after_unhooked_fork() -> None:
    """In a process forked by a ``fork()`` that ran none of Python's at-fork
    hooks (C code's own: uWSGI's workers without ``py-call-osafterfork``, an
    extension module), let go of the parent's engines now, as the hooks
    would have at the fork; a no-op elsewhere. Every client calls it first
    thing in its calls and at its creation: without it, the clients of such
    a process used their parent's engines, writing to them and reading their
    answers."""
    pid = os.getpid()
    if pid == _HOOKS_RAN_IN:
        return
    # (dict.setdefault is atomic: the process's threads all get one lock)
    with _UNHOOKED_FORK_LOCKS.setdefault(pid, threading.Lock()):
        if pid != _HOOKS_RAN_IN:
            logger.info("this process (%d) was forked without Python's at-fork hooks: letting "
                        "go of its parent's vw engines", pid)
            engine_process.after_fork_in_child()
            _after_fork_in_child()


def _after_fork_in_child() -> None:
    """In a forked child, every client lets go of its parent's engine at once:
    it closes only its own copies of the pipes (so that the parent's engine
    still sees EOF when the parent closes it), and resets its locks, which
    another thread of the parent may have held at the fork."""
    global _LIVE_LOCK, _HOOKS_RAN_IN  # pylint: disable=global-statement
    _LIVE_LOCK = threading.Lock()
    for client in list(_LIVE_CLIENTS):
        try:
            client._after_fork_in_child()  # pylint: disable=protected-access
        except Exception:  # pylint: disable=broad-except
            pass
    _HOOKS_RAN_IN = os.getpid()  # (last: a call that sees it goes on at once)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _release_at_exit() -> None:
    """At interpreter exit, let go of every engine still open, and let those
    that write a ``-f`` model finish it (as 2.x left it on disk)."""
    for client in list(_LIVE_CLIENTS):
        try:
            client._release()  # pylint: disable=protected-access
        except Exception:  # pylint: disable=broad-except
            pass


atexit.register(_release_at_exit)


def check_per_item(values: Any, name: str) -> None:
    """Check that a call's ``items_features`` (or ``labels``, ``weights``)
    holds one entry per item: an iterable that is not one string. Iterated,
    a string would be one item per character (a
    :class:`~subwabbit.base.VowpalWabbitDummyFormatter` would send each
    character as an example); a number or ``None`` would fail later with
    Python's bare "object is not iterable".

    :raises TypeError: for a ``str``, ``bytes`` or ``bytearray``, or what is
        not iterable
    """
    if isinstance(values, (str, bytes, bytearray)):
        raise TypeError(f"{name} must hold one entry per item (a list, say), not a "
                        f"{type(values).__name__}, which would be read as one item per "
                        f"character: {values[:40]!r}")
    if not isinstance(values, Iterable) and not hasattr(values, "__getitem__"):
        raise TypeError(f"{name} must hold one entry per item (a list, say), not "
                        f"{type(values).__name__} {_short_repr(values)}")


def _short_repr(value: Any) -> str:
    """``repr(value)``, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def flag(value: Any, name: str) -> bool:
    """A yes-or-no argument as a ``bool``: ``True``, ``False`` or what equals
    one of them (``1``, ``0``, NumPy's booleans); ``None`` reads as ``False``,
    as it always has.

    :raises TypeError: for anything else, a string above all: ``bool("no")``
        is ``True``
    """
    if value is None or value is False:
        return False
    if value is True:
        return True
    if not isinstance(value, (str, bytes, bytearray)):
        try:
            if value == 1:
                return True
            if value == 0:
                return False
        except (TypeError, ValueError):  # an array, say: no single truth
            pass
    raise TypeError(f"{name} must be True or False, not {type(value).__name__} "
                    f"{_short_repr(value)}")


def _check_fillable(value: Any, name: str) -> None:
    """Check that a call's ``metrics`` or ``detailed_metrics`` is a dict (any
    mutable mapping) it can fill.

    :raises TypeError: when it is not
    """
    if not isinstance(value, MutableMapping):
        raise TypeError(f"{name} must be a dict for the call to fill, or None; got "
                        f"{type(value).__name__} {value!r}")


def _take_along(values: Any, count: int, what: str) -> List[Any]:
    """The first ``count`` values of ``values``, one per item.

    A sized collection (a list, a NumPy array) must have exactly ``count``
    values: a different length is almost always a bug that would pair labels
    with the wrong items. Any other iterable (a generator,
    ``itertools.repeat(None)``) is read only as far as the items go, as 2.x's
    ``zip`` did.

    :raises ValueError: when the lengths differ, or the iterable runs out first
    """
    if hasattr(values, "__len__"):
        taken = list(values)
        if len(taken) != count:
            raise ValueError(f"items_features and {what} differ in length: {count} items, "
                             f"{len(taken)} {what}")
        return taken
    taken = list(itertools.islice(values, count))
    if len(taken) < count:
        raise ValueError(f"{what} ran out after {len(taken)} of {count} items")
    return taken


#: Label types whose text is str(label): the fast path of training lines.
_PLAIN_LABELS = (int, float)



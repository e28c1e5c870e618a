"""The contenders: pyvw (in-process bindings) and subwabbit's two model classes.

Every contender scores a request with the same :class:`~benchmarks.workload.RecommenderFormatter`
instance: the request's common part once, then ``get_formatted_example(common, item part)``
per item, and returns its predictions as a list (the subwabbit iterators are
consumed with ``list()``). With a timeout, a contender formats no new line
once the deadline has passed.

pyvw can be driven several ways; :data:`PYVW_METHODS` holds the ones measured.
The benchmark checks each against the engine and runs the fastest correct one
as ``pyvw`` (and the fastest one that keeps to the public ``Workspace`` API as
``pyvw-public``).
"""

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import pylibvw
from vowpalwabbit import PredictionType, Workspace

from subwabbit import VowpalWabbitNonBlockingProcess, VowpalWabbitPool, VowpalWabbitProcess

from .workload import Item, RecommenderFormatter, Request

PredictFunction = Callable[[Request, Sequence[Item], Optional[float]], List[float]]


class Contender:
    """Something that predicts a request's items.

    :param name: the name in the tables
    :param predict: ``predict(request, items, timeout)`` -> list of predictions
    :param settings: how it is configured, for the report
    :param engine_pid: the pid of its engine process, or the pids of a
        pool's engines (``None``: in-process)
    :param model: the subwabbit model object, if any (for ``detailed_metrics``)
    :param close: releases its resources
    """

    def __init__(self, name: str, predict: PredictFunction, settings: Dict[str, Any],
                 engine_pid: Union[int, List[int], None] = None, model: Any = None,
                 close: Callable[[], None] = lambda: None) -> None:
        self.name = name
        self.predict = predict
        self.settings = settings
        self.engine_pid = engine_pid
        self.model = model
        self.close = close


# ---------------------------------------------------------------------- pyvw

class PyvwRunner:
    """One ``vowpalwabbit.Workspace`` with the model loaded, and the ways to
    ask it for predictions."""

    def __init__(self, formatter: RecommenderFormatter, vw_args: Sequence[str]) -> None:
        self.formatter = formatter
        self.vw_args = list(vw_args)
        self.workspace = Workspace(arg_list=self.vw_args)

    def close(self) -> None:
        self.workspace.finish()

    def _lines(self, request: Request, items: Sequence[Item], deadline: Optional[float]):
        """The request's lines, one at a time, until the deadline."""
        formatter = self.formatter
        common = formatter.format_common_features(request)
        join, format_item = formatter.get_formatted_example, formatter.format_item_features
        if deadline is None:
            for item in items:
                yield join(common, format_item(request, item))
            return
        clock = time.perf_counter
        for item in items:
            if clock() >= deadline:
                return
            yield join(common, format_item(request, item))

    # Each method below is one way to get the predictions from pyvw.

    def predict_str(self, request: Request, items: Sequence[Item],
                    timeout: Optional[float]) -> List[float]:
        """Public API: ``Workspace.predict(line)`` per line (parses, predicts, finishes)."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        predict = self.workspace.predict
        return [predict(line) for line in self._lines(request, items, deadline)]

    def parse_predict_finish(self, request: Request, items: Sequence[Item],
                             timeout: Optional[float]) -> List[float]:
        """Public API: ``Workspace.parse(line)``, ``Workspace.predict(example,
        PredictionType.SCALAR)``, ``Workspace.finish_example(example)`` per line."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        workspace = self.workspace
        parse, predict, finish = workspace.parse, workspace.predict, workspace.finish_example
        scalar = PredictionType.SCALAR
        predictions = []
        for line in self._lines(request, items, deadline):
            example = parse(line)
            predictions.append(predict(example, scalar))
            finish(example)
        return predictions

    def binding_per_line(self, request: Request, items: Sequence[Item],
                         timeout: Optional[float]) -> List[float]:
        """The binding class underneath ``Workspace``: ``_parse(line)``,
        ``pylibvw.vw.predict``, ``get_simplelabel_prediction``, ``_finish_example``
        per line. Skips the Python wrappers; ``_parse`` and ``_finish_example``
        are not public API."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        workspace = self.workspace
        parse, predict, finish = workspace._parse, pylibvw.vw.predict, pylibvw.vw._finish_example
        predictions = []
        for line in self._lines(request, items, deadline):
            example = parse(line)[0]
            predict(workspace, example)
            predictions.append(example.get_simplelabel_prediction())
            finish(workspace, example)
        return predictions

    def binding_multi_line(self, request: Request, items: Sequence[Item],
                           timeout: Optional[float], chunk: int = 50) -> List[float]:
        """Like :meth:`binding_per_line`, but ``_parse`` gets ``chunk`` lines at a
        time (one call, one list of examples). After the deadline, examples
        parsed but not predicted are finished without a prediction."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        workspace = self.workspace
        parse, predict, finish = workspace._parse, pylibvw.vw.predict, pylibvw.vw._finish_example
        clock = time.perf_counter
        predictions: List[float] = []
        lines = self._lines(request, items, deadline)
        while True:
            batch = []
            for line in lines:
                batch.append(line)
                if len(batch) == chunk:
                    break
            if not batch:
                return predictions
            for example in parse("\n".join(batch)):
                if deadline is None or clock() < deadline:
                    predict(workspace, example)
                    predictions.append(example.get_simplelabel_prediction())
                finish(workspace, example)

    def learn_lines(self, lines: Sequence[str]) -> None:
        """Train on labelled lines, the fastest way found for prediction
        (binding-level parse, ``learn``, finish)."""
        workspace = self.workspace
        parse, learn, finish = workspace._parse, pylibvw.vw.learn, pylibvw.vw._finish_example
        for line in lines:
            example = parse(line)[0]
            learn(workspace, example)
            finish(workspace, example)


#: name -> (method name on PyvwRunner, whether it sticks to the public API, description)
PYVW_METHODS: Dict[str, Dict[str, Any]] = {
    "predict(str)": {"attr": "predict_str", "public": True,
                     "how": "Workspace.predict(line) per line"},
    "parse+predict+finish": {"attr": "parse_predict_finish", "public": True,
                             "how": "Workspace.parse(line), Workspace.predict(ex, "
                                    "PredictionType.SCALAR), Workspace.finish_example(ex)"},
    "binding per line": {"attr": "binding_per_line", "public": False,
                         "how": "Workspace._parse(line)[0], pylibvw.vw.predict(ws, ex), "
                                "ex.get_simplelabel_prediction(), "
                                "pylibvw.vw._finish_example(ws, ex)"},
    "binding 50 lines/parse": {"attr": "binding_multi_line", "public": False,
                               "how": "Workspace._parse of 50 joined lines, then as "
                                      "'binding per line' for each example"},
}


def pyvw_contender(name: str, runner: PyvwRunner, method: str) -> Contender:
    spec = PYVW_METHODS[method]
    return Contender(name, getattr(runner, spec["attr"]),
                     {"class": "vowpalwabbit.Workspace", "method": method, "how": spec["how"],
                      "public_api": spec["public"], "vw_args": runner.vw_args})


# ----------------------------------------------------------------- subwabbit

def subwabbit_contender(name: str, cls: type, formatter: RecommenderFormatter,
                        vw_args: Sequence[str], options: Dict[str, Any]) -> Contender:
    """A contender around a subwabbit model class, started now.

    :param options: keyword arguments of the class (batch size, ...)
    """
    model = cls(formatter, list(vw_args), **options)

    def predict(request: Request, items: Sequence[Item], timeout: Optional[float]) -> List[float]:
        return list(model.predict(request, items, timeout=timeout))

    settings = {"class": f"subwabbit.{cls.__name__}", "vw_args": list(vw_args),
                "argv": list(model.argv)}
    for key in ("batch_size", "max_pending_lines", "write_cutoff_s"):
        if hasattr(model, key):
            settings[key] = getattr(model, key)
    return Contender(name, predict, settings, engine_pid=model.pid, model=model, close=model.close)


def blocking_contender(formatter: RecommenderFormatter, vw_args: Sequence[str],
                       options: Dict[str, Any]) -> Contender:
    return subwabbit_contender("blocking", VowpalWabbitProcess, formatter, vw_args, options)


def nonblocking_contender(formatter: RecommenderFormatter, vw_args: Sequence[str],
                          options: Dict[str, Any]) -> Contender:
    return subwabbit_contender("nonblocking", VowpalWabbitNonBlockingProcess, formatter, vw_args,
                               options)


def pool_contender(name: str, formatter: RecommenderFormatter, vw_args: Sequence[str],
                   options: Dict[str, Any]) -> Contender:
    """A :class:`~subwabbit.pool.VowpalWabbitPool` (``options`` may set its
    ``size``; default: the CPUs this process may use). It has no
    ``detailed_metrics``, so it is left out of the breakdown."""
    pool = VowpalWabbitPool(formatter, list(vw_args), **options)

    def predict(request: Request, items: Sequence[Item], timeout: Optional[float]) -> List[float]:
        return pool.predict(request, items, timeout=timeout)

    settings = {"class": "subwabbit.VowpalWabbitPool", "vw_args": list(vw_args),
                "argv": list(pool.argv), "size": pool.size,
                "shares_weights": pool.shares_weights(), "batch_size": pool.batch_size,
                "max_pending_lines": pool.max_pending_lines,
                "write_cutoff_s": pool.write_cutoff_s}
    return Contender(name, predict, settings, engine_pid=pool.engine_pids(), close=pool.close)

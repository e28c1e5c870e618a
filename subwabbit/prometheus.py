"""Prometheus metrics for subwabbit clients and pools (the ``prometheus``
extra, ``pip install '.[prometheus]'`` from a checkout, brings ``prometheus_client``).

:func:`metrics_hook` returns a ``metrics_hook`` for any client or pool: it
turns each call's metrics dict into Prometheus counters and histograms.
:func:`register_pool` adds a pool's gauges (engines in service, busy, model
generation) and counters (failures, replacements, reloads) to a registry::

    from prometheus_client import CollectorRegistry
    from subwabbit.prometheus import metrics_hook, register_pool

    registry = CollectorRegistry()
    pool = VowpalWabbitPool(formatter, vw_args, metrics_hook=metrics_hook(registry))
    collector = register_pool(pool, registry)
    ...
    pool.close()
    registry.unregister(collector)
"""

from typing import Any, Callable, Dict, Iterator, Optional

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

#: Buckets of the call-duration histogram, in seconds: fine around the usual
#: 5-20 ms budgets of a recommender request.
DURATION_BUCKETS = (0.001, 0.002, 0.004, 0.006, 0.008, 0.009, 0.010, 0.011, 0.012, 0.015,
                    0.020, 0.050, 0.100, 0.500, 1.0, 5.0)


#: The ``method`` label's values: the calls whose metrics reach the hook.
METHODS = ("predict", "train")


def metrics_hook(registry: Optional[CollectorRegistry] = None,
                 prefix: str = "subwabbit") -> Callable[[Dict[str, Any]], None]:
    """A ``metrics_hook`` that records every call in ``registry``.

    Recorded, labelled by ``method`` (``predict``, ``train``, ...):
    ``<prefix>_call_duration_seconds`` (histogram of ``total_time``),
    ``<prefix>_predictions_total`` (``num_lines``),
    ``<prefix>_calls_waited_total`` (calls that waited for an engine or
    another call), ``<prefix>_engine_failures_total`` and
    ``<prefix>_restarts_total``. Each has a series for each of
    :data:`METHODS` from the start, at 0, so that a rate or an alert on a
    count that has not yet moved has a series to read.

    The hook holds no state of any one client: give the same hook to every
    client and pool whose calls it should count, and call this function
    once per registry and prefix (a second call raises ``ValueError``, its
    names being taken), not once per client or per start of a service.

    :param registry: where to register (default: prometheus_client's global registry)
    :param prefix: the metric names' prefix
    :raises ValueError: when ``registry`` already has these names
    """
    registry = REGISTRY if registry is None else registry
    duration = Histogram(f"{prefix}_call_duration_seconds", "Duration of subwabbit calls",
                         ["method"], buckets=DURATION_BUCKETS, registry=registry)
    lines = Counter(f"{prefix}_predictions", "Predictions returned (lines trained, for train)",
                    ["method"], registry=registry)
    waited = Counter(f"{prefix}_calls_waited", "Calls that waited for an engine or another call",
                     ["method"], registry=registry)
    failures = Counter(f"{prefix}_engine_failures", "Engines that failed during a call",
                       ["method"], registry=registry)
    restarts = Counter(f"{prefix}_restarts", "Calls that started or waited for a new engine",
                       ["method"], registry=registry)
    for method in METHODS:  # a series of each from the start, at 0 (rates need one)
        for family in (duration, lines, waited, failures, restarts):
            family.labels(method)

    def hook(metrics: Dict[str, Any]) -> None:
        method = str(metrics.get("method", "predict"))
        if "total_time" in metrics:
            duration.labels(method).observe(metrics["total_time"])
        lines.labels(method).inc(metrics.get("num_lines", 0))
        if metrics.get("waited_for_other_call"):
            waited.labels(method).inc()
        if metrics.get("engine_failures"):
            failures.labels(method).inc(metrics["engine_failures"])
        if metrics.get("restarts"):
            restarts.labels(method).inc()

    return hook


class _PoolCollector(Collector):
    def __init__(self, pool: Any, prefix: str) -> None:
        self._pool = pool
        self._prefix = prefix

    def describe(self) -> Iterator[Any]:
        """The families :meth:`collect` yields, so that the registry refuses a
        second collector with the same names instead of exporting both."""
        return self._families({name: 0 for name in _POOL_STATS})

    def collect(self) -> Iterator[Any]:
        return self._families(self._pool.stats())

    def _families(self, stats: Dict[str, Any]) -> Iterator[Any]:
        prefix = self._prefix
        for name, help_text in (("engines", "Engines serving the current model"),
                                ("engines_busy", "Engines held by a call"),
                                ("generation", "Model generation (reloads so far)")):
            yield GaugeMetricFamily(f"{prefix}_pool_{name}", help_text, value=stats[name])
        for name, help_text in (("engine_failures", "Engines that failed"),
                                ("engines_replaced", "Failed engines replaced"),
                                ("reloads", "Model reloads"),
                                ("waited_for_engine", "Calls that found no engine free")):
            yield CounterMetricFamily(f"{prefix}_pool_{name}", help_text, value=stats[name])


_POOL_STATS = ("engines", "engines_busy", "generation", "engine_failures", "engines_replaced",
               "reloads", "waited_for_engine")


def register_pool(pool: Any, registry: Optional[CollectorRegistry] = None,
                  prefix: str = "subwabbit") -> Collector:
    """Export ``pool.stats()`` (a :class:`~subwabbit.pool.VowpalWabbitPool` or
    :class:`~subwabbit.asyncio_pool.AsyncVowpalWabbitPool`) at every scrape.

    One pool per registry and prefix: the series carry no label naming the
    pool, so registering a second pool with the same prefix in the same
    registry raises ``ValueError`` (give it another ``prefix``) rather than
    exporting two series of one name that a scrape could not tell apart.
    A closed pool is exported (with no engines) until its collector is
    unregistered: pass the collector returned here to
    ``registry.unregister()`` when the pool is closed, and the names are
    free for the pool that replaces it.

    :param registry: where to register (default: prometheus_client's global registry)
    :param prefix: the metric names' prefix
    :returns: the collector registered
    :raises ValueError: when ``registry`` already has these names
    """
    collector = _PoolCollector(pool, prefix)
    (REGISTRY if registry is None else registry).register(collector)
    return collector

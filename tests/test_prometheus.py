"""subwabbit.prometheus against real engines: what the hook and the pool
collector export."""

import asyncio
import os
import signal
import time

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

# pylint: disable=wrong-import-position
from subwabbit import (AsyncVowpalWabbitProcess, VowpalWabbitDummyFormatter,
                       VowpalWabbitEngineExitedError, VowpalWabbitNonBlockingProcess,
                       VowpalWabbitPool, VowpalWabbitProcess)
from subwabbit.prometheus import metrics_hook, register_pool


def _value(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def _kill(pid):
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)  # dead before the next call writes to it


@pytest.mark.parametrize("cls", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess])
def test_a_single_process_engine_failure_is_counted(cls):
    # Found by a review: only pools reported engine_failures, so a service of
    # single processes showed subwabbit_engine_failures_total at 0 however
    # often its engine died.
    registry = prometheus_client.CollectorRegistry()
    record = metrics_hook(registry)
    seen = []

    def hook(metrics):
        seen.append(dict(metrics))
        record(metrics)

    with cls(VowpalWabbitDummyFormatter(), ["--quiet"], metrics_hook=hook) as model:
        assert len(list(model.predict("|u a", ["|i b"] * 10, timeout=5.0))) == 10
        _kill(model.pid)
        with pytest.raises(VowpalWabbitEngineExitedError):
            list(model.predict("|u a", ["|i b"] * 10000, timeout=5.0))
    assert [m["engine_failures"] for m in seen] == [0, 1]
    assert _value(registry, "subwabbit_engine_failures_total", method="predict") == 1.0


def test_a_train_whose_engine_died_is_counted():
    registry = prometheus_client.CollectorRegistry()
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"], write_only=True,
                             metrics_hook=metrics_hook(registry)) as model:
        model.train("|u a", ["|i b"], labels=[1], weights=[None])
        _kill(model.pid)
        with pytest.raises(VowpalWabbitEngineExitedError):
            model.train("|u a", ["|i b"] * 10000, labels=[1] * 10000, weights=[None] * 10000)
    assert _value(registry, "subwabbit_engine_failures_total", method="train") == 1.0
    assert _value(registry, "subwabbit_predictions_total", method="train") == 1.0


def test_an_async_engine_failure_is_counted():
    registry = prometheus_client.CollectorRegistry()

    async def main():
        async with AsyncVowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"],
                                            metrics_hook=metrics_hook(registry)) as model:
            assert len(await model.predict("|u a", ["|i b"] * 3, timeout=5.0)) == 3
            _kill(model.pid)
            with pytest.raises(VowpalWabbitEngineExitedError):
                await model.predict("|u a", ["|i b"] * 10000, timeout=5.0)

    asyncio.run(main())
    assert _value(registry, "subwabbit_engine_failures_total", method="predict") == 1.0


def test_a_second_pool_with_the_same_names_is_refused_not_exported_twice():
    # Found by a review: two pools registered in one registry exported two
    # unlabelled series of each name, which Prometheus cannot tell apart.
    registry = prometheus_client.CollectorRegistry()
    with VowpalWabbitPool(VowpalWabbitDummyFormatter(), ["--quiet"], size=1) as first, \
            VowpalWabbitPool(VowpalWabbitDummyFormatter(), ["--quiet"], size=2) as second:
        register_pool(first, registry)
        with pytest.raises(ValueError):
            register_pool(second, registry)
        register_pool(second, registry, prefix="second")
        assert _value(registry, "subwabbit_pool_engines") == 1.0
        assert _value(registry, "second_pool_engines") == 2.0
        text = prometheus_client.generate_latest(registry).decode()
    assert text.count("\nsubwabbit_pool_engines ") == 1


def test_a_closed_pools_collector_can_leave_the_registry_for_its_replacement():
    # Found by a review: register_pool returned nothing, so a closed pool
    # stayed in the registry (exported with no engines, and kept alive) and
    # the pool that replaced it could not be registered under its names.
    registry = prometheus_client.CollectorRegistry()
    with VowpalWabbitPool(VowpalWabbitDummyFormatter(), ["--quiet"], size=1) as first:
        collector = register_pool(first, registry)
    assert _value(registry, "subwabbit_pool_engines") == 0.0  # closed, still exported
    registry.unregister(collector)
    assert _value(registry, "subwabbit_pool_engines") is None
    with VowpalWabbitPool(VowpalWabbitDummyFormatter(), ["--quiet"], size=2) as second:
        register_pool(second, registry)
        assert _value(registry, "subwabbit_pool_engines") == 2.0


def test_every_counter_has_a_series_per_method_from_the_start():
    """A failure counter that has not yet moved is exported at 0 for each
    method: before, only its HELP and TYPE lines were, until a first
    failure, so that a rate or an alert over it had no series to read."""
    registry = prometheus_client.CollectorRegistry()
    metrics_hook(registry, prefix="fresh")
    text = prometheus_client.generate_latest(registry).decode()
    for method in ("predict", "train"):
        for name in ("predictions", "calls_waited", "engine_failures", "restarts"):
            assert f'fresh_{name}_total{{method="{method}"}} 0.0' in text, (name, method)
        assert f'fresh_call_duration_seconds_count{{method="{method}"}} 0.0' in text

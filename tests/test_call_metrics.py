"""The metrics dict of a call and the metrics hook, against real engines, in
the cases a service meets: calls that raise, are cancelled, or fail."""

import asyncio

import pytest

from subwabbit import (AsyncVowpalWabbitPool, AsyncVowpalWabbitProcess,
                       VowpalWabbitDummyFormatter, VowpalWabbitPool)


class _FailsAt(VowpalWabbitDummyFormatter):
    """Formats item lines as given, and raises at the item ``"bad"``."""

    def format_item_features(self, common_features, item_features, debug_info=None):
        if item_features == "bad":
            raise RuntimeError("a formatter bug")
        return item_features


#: an item the formatter fails on, after enough items for engines to answer some
_FAILING_ITEMS = ["|i b"] * 3000 + ["bad"] + ["|i b"] * 10


def _call(cls, body, **args):
    """Run ``body(model)`` on a model of ``cls`` (awaited for the asyncio classes)."""
    if "Pool" in cls.__name__:
        args["size"] = 2
    if cls in (AsyncVowpalWabbitProcess, AsyncVowpalWabbitPool):
        async def main():
            async with cls(_FailsAt(), ["--quiet"], **args) as model:
                return await body(model)
        return asyncio.run(main())
    with cls(_FailsAt(), ["--quiet"], **args) as model:
        return body(model)


@pytest.mark.parametrize("cls", [VowpalWabbitPool, AsyncVowpalWabbitPool,
                                 AsyncVowpalWabbitProcess])
def test_a_call_that_raises_reports_no_prediction_returned(cls):
    # Found by a review: a call of a class that returns a list, raising once
    # the engines had answered part of its items (here a formatter bug at
    # item 3,000), reported those answers in num_lines (2,566 to 2,873 in a
    # run), and so in subwabbit_predictions_total, though the caller got
    # none: num_lines is the predictions returned to the caller.
    metrics = {}
    seen = []

    def body(model):
        return model.predict("|u a", _FAILING_ITEMS, timeout=30.0, metrics=metrics)

    with pytest.raises(RuntimeError, match="a formatter bug"):
        _call(cls, body, metrics_hook=seen.append)
    assert metrics["num_lines"] == 0
    assert [hooked["num_lines"] for hooked in seen] == [0]


@pytest.mark.parametrize("cls", [AsyncVowpalWabbitPool, AsyncVowpalWabbitProcess])
def test_a_cancelled_call_reports_no_prediction_returned(cls):
    metrics = {}
    seen = []

    async def body(model):
        await model.predict("|u a", ["|i b"] * 10, timeout=30.0)
        call = asyncio.ensure_future(model.predict("|u a", ["|i b"] * 300_000, timeout=30.0,
                                                   metrics=metrics))
        await asyncio.sleep(0.2)  # the engines answer part of the items meanwhile
        assert not call.done()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return len(await model.predict("|u a", ["|i b"] * 10, timeout=30.0))

    assert _call(cls, body, metrics_hook=seen.append) == 10
    assert metrics["num_lines"] == 0
    assert [hooked["num_lines"] for hooked in seen] == [10, 0, 10]

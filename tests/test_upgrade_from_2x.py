"""Code written the way subwabbit 2.x users wrote it keeps working.

Modelled on what 2.1.0's public-API tests, its pretraining script and its
notebooks rely on: keyword arguments, subclasses that set ``batch_size``,
duck-typed and mock formatters, NumPy timeouts, lazy weights, ``vw_process``,
and a ``-f`` model left on disk by an object that was never closed.
"""

import decimal
import itertools
import os
import signal
import subprocess
import sys
import warnings
from unittest import mock

import numpy as np
import pytest

from subwabbit import (VowpalWabbitBaseFormatter, VowpalWabbitError,
                       VowpalWabbitNonBlockingProcess, VowpalWabbitProcess)
from subwabbit.base import VowpalWabbitError as BaseVowpalWabbitError
from subwabbit.errors import VowpalWabbitTimeoutError

from conftest import expected_scalars


class UserItemFormatter(VowpalWabbitBaseFormatter):
    def format_common_features(self, user_features, debug_info=None):
        return "|u u{}".format(user_features["user_id"])

    def format_item_features(self, user_features, item_features, debug_info=None):
        return "|i i{}".format(item_features["item_id"])


class SmallBatchProcess(VowpalWabbitProcess):
    batch_size = 2


class SmallBatchNonBlockingProcess(VowpalWabbitNonBlockingProcess):
    batch_size = 2


USER1, USER2 = {"user_id": 1}, {"user_id": 2}
ITEMS = [{"item_id": 1}, {"item_id": 2}, {"item_id": 3}]


def _lines(user, labels=None):
    prefix = [f"{label} 1.0 " for label in labels] if labels else [""] * len(ITEMS)
    return [f"{p}|u u{user['user_id']} |i i{item['item_id']}" for p, item in zip(prefix, ITEMS)]


@pytest.mark.parametrize("model_class", [SmallBatchProcess, SmallBatchNonBlockingProcess])
def test_train_write_only_then_predict_with_keyword_arguments(model_class, tmp_path):
    first, second = str(tmp_path / "testmodel.vw"), str(tmp_path / "testmodel2.vw")
    vw_process = SmallBatchProcess(UserItemFormatter(), ["-q", "::", "--save_resume", "-f", first,
                                                         "--quiet"], write_only=True)
    vw_process.train(common_features=USER1, items_features=ITEMS, labels=[0, 1, 1],
                     weights=[1.0, 1.0, 1.0])
    vw_process.train(common_features=USER2, items_features=ITEMS, labels=[1, 1, 0],
                     weights=[1.0, 1.0, 1.0])
    vw_process.close()
    assert os.path.exists(first)

    vw_process = model_class(formatter=UserItemFormatter(),
                             vw_args=["--save_resume", "-i", first, "-f", second, "--quiet"])
    predictions = vw_process.predict(common_features=USER1, items_features=ITEMS)
    expected = expected_scalars(_lines(USER1), ["--save_resume", "-i", first, "-t"], tmp_path)
    assert list(predictions) == expected
    vw_process.close()
    assert os.path.exists(second)


def test_duck_typed_and_mock_formatters_are_accepted(tmp_path):
    class Duck:  # the formatter methods, no base class
        def format_common_features(self, user_features, debug_info=None):
            return "|u u1"

        def format_item_features(self, user_features, item_features, debug_info=None):
            return "|i i{}".format(item_features["item_id"])

    formatter = mock.Mock()
    formatter.format_common_features.return_value = "|u u1"
    formatter.format_item_features.side_effect = Duck().format_item_features
    for candidate in (Duck(), formatter):
        with VowpalWabbitProcess(candidate, ["--quiet"]) as model:
            model.train(USER1, ITEMS, labels=[1, -1, 1])
            assert len(list(model.predict(USER1, ITEMS))) == 3


def test_numpy_timeouts_and_lazy_weights():
    with VowpalWabbitNonBlockingProcess(UserItemFormatter(), ["--quiet"]) as model:
        model.train(USER1, ITEMS, labels=[1, -1, 1], weights=itertools.repeat(None))
        model.train(USER1, ITEMS, labels=(label for label in [1, -1, 1]),
                    weights=itertools.repeat(1.0))
        model.train(USER1, ITEMS, labels=np.array([1, -1, 1]))  # no weights: 2.x's default use
        assert len(list(model.predict(USER1, ITEMS, timeout=np.float32(0.5)))) == 3
        assert len(list(model.predict(USER1, ITEMS, timeout=np.float64(0.5)))) == 3
        with pytest.raises(ValueError, match="differ in length"):
            model.train(USER1, ITEMS, labels=[1, -1], weights=[None, None])
        with pytest.raises(ValueError, match="ran out"):
            model.train(USER1, ITEMS, labels=iter([1]), weights=None)


def test_write_timeout_ms_can_be_set_between_calls_as_in_2x():
    """2.x's write_timeout_ms was a plain attribute that each predict read;
    setting it raised AttributeError (a property without a setter)."""
    with VowpalWabbitNonBlockingProcess(UserItemFormatter(), ["--quiet"]) as model:
        with pytest.warns(DeprecationWarning, match="write_cutoff_s"):
            model.write_timeout_ms = 0.002
        assert model.write_cutoff_s == model.write_timeout_ms == 0.002
        assert model._pacing().write_cutoff_s == 0.002  # pylint: disable=protected-access
        assert len(list(model.predict(USER1, ITEMS, timeout=0.5))) == 3
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            with pytest.raises(ValueError, match="^write_timeout_ms must be"):
                model.write_timeout_ms = -1
        assert model.write_cutoff_s == 0.002


def test_a_none_label_is_a_value_error():
    with VowpalWabbitProcess(UserItemFormatter(), ["--quiet"]) as model:
        with pytest.raises(ValueError, match=r"labels\[1\] is None"):
            model.train(USER1, ITEMS, labels=[1, None, 1], weights=[None] * 3)


def test_vw_process_and_errors_as_in_2x():
    with VowpalWabbitProcess(UserItemFormatter(), ["--quiet"]) as model:
        assert model.vw_process.pid == model.pid
        assert model.vw_process.poll() is None
    assert isinstance(VowpalWabbitError(), BaseVowpalWabbitError)
    error = VowpalWabbitError("engine", "details")
    assert error.args == ("engine", "details") and "details" in str(error)
    assert str(VowpalWabbitError("plain")) == "plain"


def test_predict_on_a_write_only_process_raises_at_the_first_next():
    with VowpalWabbitProcess(UserItemFormatter(), ["--quiet"], write_only=True) as model:
        predictions = model.predict(USER1, ITEMS)
        with pytest.raises(VowpalWabbitError, match="write-only"):
            next(predictions)


def test_blocking_detailed_metrics_have_one_generating_entry_per_line():
    with VowpalWabbitProcess(UserItemFormatter(), ["--quiet"], batch_size=2) as model:
        detailed = {}
        assert len(list(model.predict(USER1, ITEMS * 5, detailed_metrics=detailed))) == 15
    assert len(detailed["generating_lines_time"]) == 15
    assert all(seconds >= 0 for _, seconds in detailed["generating_lines_time"])


def test_blocking_detailed_metrics_add_no_entry_when_the_items_end_with_a_batch():
    """16 items in batches of 2: the step that finds no 17th item formats
    nothing and adds no generating_lines_time entry (2.x had one per line)."""
    with VowpalWabbitProcess(UserItemFormatter(), ["--quiet"], batch_size=2) as model:
        detailed = {}
        items = (ITEMS * 6)[:16]
        assert len(list(model.predict(USER1, items, detailed_metrics=detailed))) == 16
    assert len(detailed["generating_lines_time"]) == 16


def test_a_dropped_object_leaves_its_final_model_on_disk(tmp_path):
    path = tmp_path / "dropped.vw"
    model = VowpalWabbitProcess(UserItemFormatter(), ["--quiet", "-f", str(path)], write_only=True)
    model.train(USER1, ITEMS, labels=[1, -1, 1], weights=[None] * 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del model
    assert path.exists() and path.stat().st_size > 0


@pytest.mark.parametrize("model_class", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess])
@pytest.mark.parametrize("final_model", [True, False])
def test_a_close_that_terminates_an_engine_writing_its_final_model_raises(model_class,
                                                                           final_model, tmp_path):
    """2.1.0's close(timeout) raised when vw had not exited in time; a close
    that had to terminate an engine with -f returned None, the model unwritten.
    A stopped engine never exits by itself: the close has to kill it."""
    path = tmp_path / "final.vw"
    args = ["--quiet", "-f", str(path)] if final_model else ["--quiet"]
    model = model_class(UserItemFormatter(), args)
    model.train(USER1, ITEMS, labels=[1, -1, 1])
    os.kill(model.pid, signal.SIGSTOP)
    if final_model:
        with pytest.raises(VowpalWabbitTimeoutError, match="-f model was not written"):
            model.close(timeout=1.0)
    else:
        model.close(timeout=1.0)
    assert not path.exists()
    model.close()  # closing twice is harmless, and raises nothing more


def test_a_script_that_never_closes_leaves_its_final_model_on_disk(tmp_path):
    """Like 2.x's own pretrain_model.py: a module-level write-only process
    with --final_regressor, never closed."""
    path = tmp_path / "pretrained.vw"
    script = tmp_path / "pretrain.py"
    script.write_text(
        "from subwabbit import VowpalWabbitProcess, VowpalWabbitDummyFormatter\n"
        "model = VowpalWabbitProcess(formatter=VowpalWabbitDummyFormatter(),\n"
        f"    vw_args=['--loss_function', 'logistic', '--final_regressor', {str(path)!r},\n"
        "             '--quiet', '-b', '24'], write_only=True)\n"
        "for request in range(50):\n"
        "    model.train(common_features='|u u%d' % request,\n"
        "                items_features=['|i i%d' % item for item in range(200)],\n"
        "                labels=[1.0 if item % 3 else -1.0 for item in range(200)],\n"
        "                weights=[1.0 for _ in range(200)])\n")
    done = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert path.exists() and path.stat().st_size > 0


def test_a_timeout_in_milliseconds_by_mistake_warns_once(monkeypatch):
    import subwabbit.deadlines as deadlines  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(deadlines, "_warned_about_timeout", False)
    with VowpalWabbitProcess(UserItemFormatter(), ["--quiet"]) as model:
        with pytest.warns(UserWarning, match="the timeout is in seconds"):
            list(model.predict(USER1, ITEMS, timeout=10))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            list(model.predict(USER1, ITEMS, timeout=10))  # once per process
            list(model.predict(USER1, ITEMS, timeout=0.5))


@pytest.mark.parametrize("model_class", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess])
def test_the_detailed_metrics_notebook_way(model_class):
    """2.1.0's Detailed-metrics notebook: every series into one DataFrame,
    indexed by (time, metric) and unstacked, which needs distinct times."""
    import pandas as pd  # pylint: disable=import-outside-toplevel
    frames = []
    with model_class(formatter=UserItemFormatter(), vw_args=["--quiet"]) as model:
        for user in range(5):
            detailed_metrics = {}
            list(model.predict(common_features={"user_id": user}, items_features=ITEMS * 300,
                               timeout=0.5, detailed_metrics=detailed_metrics))
            for name, values in detailed_metrics.items():
                frames.append(pd.DataFrame(values, columns=["time", "value"]).assign(metric=name))
    table = pd.concat(frames, axis=0).set_index(["time", "metric"]).unstack().sort_index()
    table.columns = table.columns.droplevel(0)
    assert {"generating_lines_time", "sending_lines_time", "receiving_lines_time"} <= \
        set(table.columns)
    assert table["generating_lines_time"].count() >= (4500 if model_class is VowpalWabbitProcess
                                                      else 5 * 900 // 50)


def test_the_explaining_notebook_way(tmp_path):
    """2.1.0's Explaining-prediction notebook: audit mode, then readable rows."""
    model_path = str(tmp_path / "m.vw")
    with VowpalWabbitProcess(UserItemFormatter(), ["-q", "ui", "-f", model_path, "--quiet"],
                             write_only=True) as trainer:
        for _ in range(20):
            trainer.train(USER1, ITEMS, labels=[1, -1, 1], weights=[1.0, 1.0, 1.0])
    formatter = UserItemFormatter()
    model = VowpalWabbitProcess(formatter, ["-i", model_path, "-t", "--quiet"], audit_mode=True)
    try:
        raw, explanation = model.explain_vw_line("|u u1 |i i2", link_function=False)
        rows = formatter.get_human_readable_explanation(explanation)
        html = formatter.get_human_readable_explanation_html(explanation, max_rows=3)
    finally:
        model.close()
    assert raw < 0 and rows[0]["potential"] == pytest.approx(
        max((row["potential"] for row in rows), key=abs))
    assert {row["original_feature_name"] for row in rows} >= {"u^u1", "i^i2", "u^u1*i^i2"}
    assert "<table" in html._repr_html_()


def test_explain_vw_line_takes_a_line_read_from_a_file_as_2x_did(tmp_path):
    """2.x stripped the newline of a line read from a file; the same line
    without it is explained the same, and a line break inside still raises."""
    import asyncio  # pylint: disable=import-outside-toplevel
    from subwabbit import AsyncVowpalWabbitProcess  # pylint: disable=import-outside-toplevel
    args = ["-q", "ui", "--quiet", "-t"]
    with VowpalWabbitProcess(UserItemFormatter(), args, audit_mode=True) as model:
        plain = model.explain_vw_line("|u u1 |i i2")
        assert model.explain_vw_line("|u u1 |i i2\n") == plain
        assert model.explain_vw_line("|u u1 |i i2\r\n") == plain
        for bad in ("|u u1\n|i i2", "|u u1 |i i2\n\n", "\n"):
            with pytest.raises(ValueError):
                model.explain_vw_line(bad)
        assert model.explain_vw_line("|u u1 |i i2") == plain

    async def explain():
        async with AsyncVowpalWabbitProcess(UserItemFormatter(), args, audit_mode=True) as model:
            return await model.explain_vw_line("|u u1 |i i2\n")
    assert asyncio.run(explain()) == plain


@pytest.mark.parametrize("model_class", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess])
def test_numpy_integers_as_sizes_and_decimal_labels_are_taken_as_in_2x(model_class):
    """2.x took ``batch_size=np.int64(2)`` (and the nonblocking class's
    ``max_pending_lines``), and labels and weights it wrote with ``str()``,
    ``Decimal`` (a database's NUMERIC column) among them; they were refused,
    "must be a positive int, got np.int64(2)" and "must be a number, got
    Decimal('1.5')". A Decimal label teaches what the float teaches."""
    sizes = ({"max_pending_lines": np.int32(30)}
             if model_class is VowpalWabbitNonBlockingProcess else {})
    models = [model_class(UserItemFormatter(), ["--quiet"], batch_size=np.int64(2), **sizes)
              for _ in range(2)]
    try:
        assert models[0].batch_size == 2 and type(models[0].batch_size) is int
        models[0].train(USER1, ITEMS, [decimal.Decimal("1.5"), decimal.Decimal("-1"), 2],
                        weights=[decimal.Decimal("0.5"), 1, 1])
        models[1].train(USER1, ITEMS, [1.5, -1.0, 2], weights=[0.5, 1, 1])
        first, second = (list(model.predict(USER1, ITEMS)) for model in models)
        assert first == second and first != [0.0, 0.0, 0.0]
        with pytest.raises(ValueError, match="must be finite"):
            models[0].train(USER1, ITEMS[:1], [decimal.Decimal("NaN")])
    finally:
        for model in models:
            model.close()


def test_weights_given_as_text_are_taken_as_in_2x():
    """2.x wrote weights with str(), so "0.5" (read from a CSV file, say)
    weighted as 0.5 did; it was refused ("weights[0] must be a number, got
    '0.5'") while string labels were taken. Text vw would not read as
    written is refused, naming the item."""
    models = [VowpalWabbitProcess(UserItemFormatter(), ["--quiet"]) for _ in range(2)]
    try:
        models[0].train(USER1, ITEMS, [1, -1, 1], weights=["0.5", "2", "1e-1"])
        models[1].train(USER1, ITEMS, [1, -1, 1], weights=[0.5, 2, 0.1])
        first, second = (list(model.predict(USER1, ITEMS)) for model in models)
        assert first == second and first != [0.0, 0.0, 0.0]
        for bad in ("abc", "-1", "1 |x", "", "1e-200"):
            with pytest.raises(ValueError, match=r"^weights\[1\]: the importance weight"):
                models[0].train(USER1, ITEMS[:2], [1, 1], weights=[1, bad])
        assert list(models[0].predict(USER1, ITEMS)) == first  # nothing was learnt
    finally:
        for model in models:
            model.close()


@pytest.mark.parametrize("flag", ["-a", "--audit"])
def test_an_audit_flag_in_vw_args_is_taken_with_audit_mode_as_in_2x(flag):
    """2.x added ``-a`` to an audit-mode process's arguments unless they had
    it already; ``vw_args=[..., '-a'], audit_mode=True`` raised "vw_args must
    not contain '-a': pass audit_mode=True instead". Without audit_mode the
    flag is still refused (vw's audit lines are not predictions)."""
    import asyncio  # pylint: disable=import-outside-toplevel
    from subwabbit import AsyncVowpalWabbitProcess  # pylint: disable=import-outside-toplevel
    args = ["-q", "ui", "--quiet", "-t"]
    with VowpalWabbitProcess(UserItemFormatter(), args, audit_mode=True) as model:
        plain = model.explain_vw_line("|u u1 |i i2")
    with VowpalWabbitProcess(UserItemFormatter(), args + [flag], audit_mode=True) as model:
        assert flag not in model.vw_args and model.argv.count("--audit") == 1
        assert model.explain_vw_line("|u u1 |i i2") == plain
        model.reload(args + [flag])
        assert model.explain_vw_line("|u u1 |i i2") == plain

    async def explain():
        async with AsyncVowpalWabbitProcess(UserItemFormatter(), [flag] + args,
                                            audit_mode=True) as model:
            return await model.explain_vw_line("|u u1 |i i2")
    assert asyncio.run(explain()) == plain
    for model_class in (VowpalWabbitProcess, VowpalWabbitNonBlockingProcess):
        with pytest.raises(ValueError, match=f"must not contain '{flag}'"):
            model_class(UserItemFormatter(), args + [flag])


def test_the_names_of_2x_modules_import_from_them():
    """2.x's blocking and nonblocking modules held VowpalWabbitError,
    VowpalWabbitBaseModel and VowpalWabbitBaseFormatter (imported from
    subwabbit.base), and 2.x code imported them from there; they raised
    ImportError."""
    import subwabbit  # pylint: disable=import-outside-toplevel
    import subwabbit.blocking  # pylint: disable=import-outside-toplevel
    import subwabbit.nonblocking  # pylint: disable=import-outside-toplevel
    for module in (subwabbit.blocking, subwabbit.nonblocking):
        for name in ("VowpalWabbitError", "VowpalWabbitBaseModel", "VowpalWabbitBaseFormatter"):
            assert getattr(module, name) is getattr(subwabbit, name), (module, name)


def test_the_html_explanation_has_the_data_of_2x_ipython_object():
    """2.x's get_human_readable_explanation_html returned an IPython HTML
    object, whose ``data`` held the HTML (to save it to a file, say); the
    str returned now had no ``data`` (AttributeError)."""
    explanation = "\tu^u1:112063:1:0.1@2\ti^i7:106259:2:0.3@2\tu^u1*i^i7:3317:1:-0.25@2"
    html = UserItemFormatter().get_human_readable_explanation_html(explanation, max_rows=2)
    assert type(html.data) is str and html.data == str(html) == html._repr_html_()
    assert html.data.count("<tr>") == 3 and "i7" in html.data

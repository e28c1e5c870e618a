"""Every kind of model against the real engine, on the three client classes.

Each kind is checked against the engine reading the same lines from a file:
the lines (labels included) are written here by hand, and the engine's
output is read here with a few lines of code of the test's own, so that the
library's formatting and parsing are compared with vw, not with themselves.
"""

import asyncio
import gc
import os
import re
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple

import pytest

from subwabbit import (AsyncVowpalWabbitProcess, VowpalWabbitDummyFormatter,
                       VowpalWabbitEngineExitedError, VowpalWabbitError,
                       VowpalWabbitNonBlockingProcess, VowpalWabbitPLTProcess,
                       VowpalWabbitProcess, VowpalWabbitStartupError)
from subwabbit.command import default_engine_command
from subwabbit import client as client_module
from subwabbit.engine import program

from conftest import ALL_KINDS, Client, DictFormatter, engine_from_file, in_child


# ---------------------------------------------------------------- the kinds

def _ints(raw: List[bytes]) -> List[Any]:
    return [int(line.split()[0]) for line in raw]


def _class_dicts(raw: List[bytes]) -> List[Any]:
    return [{int(label): float(value) for label, value in
             (token.split(b":") for token in line.split())} for line in raw]


def _label_lists(raw: List[bytes]) -> List[Any]:
    return [[int(label) for label in line.split(b" ")[0].split(b",") if label] for line in raw]


def _actions_from_1(raw: List[bytes]) -> List[Any]:
    # vw 9 prints --cb actions counted from 0, then an empty line
    assert not any(raw[1::2])
    return [int(line) + 1 for line in raw[0::2]]


def _in_action_order(line: bytes) -> List[float]:
    pairs = sorted((int(action), float(value))
                   for action, value in (pair.split(b":") for pair in line.split(b",")))
    assert [action for action, _ in pairs] == list(range(len(pairs)))
    return [value for _, value in pairs]


def _probability_lists(raw: List[bytes]) -> List[Any]:
    assert not any(raw[1::2])
    return [_in_action_order(line) for line in raw[0::2]]


class Kind(NamedTuple):
    """A kind of model: its arguments, a label per item, that label as a
    file line carries it, and the engine's output read into predictions
    (one per example)."""

    args: List[str]
    label: Callable[[int, int], Any]        # (request, item id) -> the label train() takes
    text: Callable[[Any], str]              # that label as VW text
    read: Callable[[List[bytes]], List[Any]]
    multi_line: bool = False
    file_args: List[str] = []               # what the library adds (--rank_all)
    load_args: List[str] = []               # what a model file does not keep
    prediction_type: str = ""               # for a model file


def _class_of(request: int, item: int) -> int:
    return (item + request // 7) % 3 + 1


def _bandit(request: int, item: int) -> Any:
    return (_class_of(request, item), float((item + request) % 2), 0.5)


KINDS: Dict[str, Kind] = {
    "oaa": Kind(["--oaa", "3"], _class_of, str, _ints, prediction_type="multiclass"),
    "ect": Kind(["--ect", "3"], _class_of, str, _ints),
    "log_multi": Kind(["--log_multi", "3"], _class_of, str, _ints),
    "recall_tree": Kind(["--recall_tree", "3"], _class_of, str, _ints),
    "csoaa": Kind(["--csoaa", "3"],
                  lambda request, item: {c: int(c != _class_of(request, item)) for c in (1, 2, 3)},
                  lambda label: " ".join(f"{c}:{cost}" for c, cost in label.items()), _ints),
    "oaa-probabilities": Kind(["--oaa", "3", "--probabilities", "--loss_function", "logistic"],
                              _class_of, str, _class_dicts,
                              load_args=["--probabilities", "--loss_function", "logistic"],
                              prediction_type="multiclass"),
    "multilabel_oaa": Kind(["--multilabel_oaa", "3"],
                           lambda request, item: sorted({item % 3, (item // 3 + request) % 3}),
                           lambda label: ",".join(map(str, label)), _label_lists,
                           prediction_type="multilabel"),
    "plt": Kind(["--plt", "6", "--top_k", "2", "--loss_function", "logistic"],
                lambda request, item: [item % 6], lambda label: str(label[0]), _label_lists,
                load_args=["--loss_function", "logistic"]),
    "cb": Kind(["--cb", "3"], _bandit, lambda label: "%d:%r:%r" % label, _actions_from_1,
               prediction_type="cb"),
    "cb_explore": Kind(["--cb_explore", "3", "--epsilon", "0.2"], _bandit,
                       lambda label: "%d:%r:%r" % label, _probability_lists,
                       prediction_type="cb_explore"),
    "cb_adf": Kind(["--cb_adf"], None, lambda label: "0:%r:%r" % label, _probability_lists,
                   multi_line=True, file_args=["--rank_all"], load_args=["--rank_all"],
                   prediction_type="cb_adf"),
    "cb_explore_adf": Kind(["--cb_explore_adf", "--epsilon", "0.2"], None,
                           lambda label: "0:%r:%r" % label, _probability_lists, multi_line=True,
                           prediction_type="cb_explore_adf"),
}
MULTI_LINE = [name for name, kind in KINDS.items() if kind.multi_line]

FORMATTER = DictFormatter()


def request(index: int, size: int = 6) -> Any:
    common = {"user": index % 5, "ctx": [f"k{index % 3}"]}
    return common, [{"id": (index * 5 + offset) % 23} for offset in range(size)]


def shown(index: int, size: int) -> int:
    return (index * 7) % size


def adf_labels(index: int, size: int) -> List[Any]:
    """The labels of a multi-line example: the shown item's (cost, probability)."""
    items = request(index, size)[1]
    cost = float(items[shown(index, size)]["id"] % 2)
    return [(cost, 1 / size) if position == shown(index, size) else None
            for position in range(size)]


def train_labels(name: str, index: int, size: int = 6) -> List[Any]:
    kind = KINDS[name]
    if kind.multi_line:
        return adf_labels(index, size)
    return [kind.label(index, item["id"]) for item in request(index, size)[1]]


def file_lines(name: str, index: int, size: int = 6, labelled: bool = True) -> List[str]:
    """The VW lines of a request, written here without the library."""
    kind = KINDS[name]
    common, items = request(index, size)
    common_part = FORMATTER.format_common_features(common)
    parts = [FORMATTER.format_item_features(common, item) for item in items]
    labels = train_labels(name, index, size) if labelled else [None] * size
    texts = ["" if label is None else kind.text(label) + " " for label in labels]
    if kind.multi_line:
        return [f"shared {common_part}"] + [text + part for text, part in zip(texts, parts)] + [""]
    return [f"{text}{common_part} {part}" for text, part in zip(texts, parts)]


TRAIN = range(40)
TEST = [(100, 7), (101, 1), (102, 12)]


def expected_after_training(name: str, tmp_path: Any) -> List[List[Any]]:
    """The predictions for the TEST requests of the engine that read the
    TRAIN requests, then the TEST requests, from a file."""
    kind = KINDS[name]
    lines = [line for index in TRAIN for line in file_lines(name, index)]
    test = [line for index, size in TEST for line in file_lines(name, index, size, False)]
    raw = engine_from_file(lines + test, kind.args + kind.file_args, tmp_path)
    predictions = kind.read(raw)
    if kind.multi_line:
        return predictions[-len(TEST):]
    flat = predictions[-sum(size for _, size in TEST):]
    result, start = [], 0
    for _, size in TEST:
        result.append(flat[start:start + size])
        start += size
    return result


def _train_all(client: Client, name: str) -> None:
    for index in TRAIN:
        common, items = request(index)
        client.train(common, items, train_labels(name, index))


@pytest.mark.parametrize("client_kind", ALL_KINDS)
@pytest.mark.parametrize("name", list(KINDS))
def test_train_then_predict_equals_the_engine_reading_a_file(name, client_kind, tmp_path):
    expected = expected_after_training(name, tmp_path)
    client = Client(client_kind, FORMATTER, KINDS[name].args + ["--quiet"])
    try:
        assert client.model.prediction_kind.multi_line == KINDS[name].multi_line
        _train_all(client, name)
        got = [client.predict(*request(index, size)) for index, size in TEST]
        assert got == expected
    finally:
        client.close()


@pytest.mark.parametrize("name", ["ect", "log_multi", "recall_tree"])
def test_indexing_0_which_vw_ignores_with_the_other_multiclass_reductions_keeps_classes_from_1(
        name, tmp_path):
    """vw reads --indexing with --oaa and --csoaa only (with a warning
    otherwise): an --ect 3 --indexing 0 model has classes 1 to 3, and
    skips an example labelled 0. subwabbit counted them from 0, refused
    label 3 and sent label 0."""
    kind = KINDS[name]
    lines = [line for index in TRAIN for line in file_lines(name, index)]
    test = [line for index, size in TEST for line in file_lines(name, index, size, False)]
    raw = engine_from_file(lines + test, kind.args + ["--indexing", "0"], tmp_path)
    flat = kind.read(raw)[-sum(size for _, size in TEST):]
    with VowpalWabbitProcess(FORMATTER, kind.args + ["--indexing", "0", "--quiet"]) as process:
        with pytest.raises(ValueError, match="vw's class labels start at 1"):
            process.train(*request(0, 1), [0])
        _train_all(process, name)
        got = [prediction for index, size in TEST
               for prediction in process.predict(*request(index, size))]
    assert got == flat


@pytest.mark.parametrize("name", list(KINDS))
def test_write_only_training_saves_the_model_the_file_trains(name, tmp_path):
    kind = KINDS[name]
    with VowpalWabbitProcess(FORMATTER, kind.args + ["--quiet"], write_only=True) as trainer:
        for index in TRAIN:
            trainer.train(*request(index), train_labels(name, index))
        trainer.save(str(tmp_path / "online.vw"))
    lines = [line for index in TRAIN for line in file_lines(name, index)]
    engine_from_file(lines, kind.args + kind.file_args + ["-f", str(tmp_path / "file.vw")],
                     tmp_path)
    test = [line for index, size in TEST for line in file_lines(name, index, size, False)]
    online = engine_from_file(test, ["-i", str(tmp_path / "online.vw"), "-t"] + kind.load_args,
                              tmp_path)
    from_file = engine_from_file(test, ["-i", str(tmp_path / "file.vw"), "-t"] + kind.load_args,
                                 tmp_path)
    assert online == from_file and online


def test_cb_actions_count_from_1_as_the_labels_do():
    """vw 9 prints a --cb action counted from 0; the library gives it from 1,
    as labels name it: trained that action 3 costs nothing, it predicts 3."""
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--cb", "3", "--quiet"]) as model:
        for _ in range(20):
            model.train("|u a", ["|i x"] * 3, [(3, 0.0, 0.3), (1, 1.0, 0.3), (2, 1.0, 0.3)])
        assert list(model.predict("|u a", ["|i x"])) == [3]


# ----------------------------------------------------------- model files

def _trained_file(name: str, tmp_path: Any) -> str:
    kind = KINDS[name]
    path = str(tmp_path / f"{name}.vw")
    lines = [line for index in TRAIN for line in file_lines(name, index)]
    engine_from_file(lines, kind.args + kind.file_args + ["-f", path], tmp_path)
    return path


@pytest.mark.parametrize("name", [name for name, kind in KINDS.items() if kind.prediction_type])
def test_a_model_file_is_served_with_prediction_type(name, tmp_path):
    kind = KINDS[name]
    model = _trained_file(name, tmp_path)
    test = [line for index, size in TEST for line in file_lines(name, index, size, False)]
    raw = engine_from_file(test, ["-i", model, "-t"] + kind.load_args, tmp_path)
    expected = kind.read(raw)
    with VowpalWabbitNonBlockingProcess(FORMATTER, ["-i", model, "-t", "--quiet"] + kind.load_args,
                                        prediction_type=kind.prediction_type) as process:
        got = [list(process.predict(*request(index, size))) for index, size in TEST]
    if not kind.multi_line:
        got = [prediction for predictions in got for prediction in predictions]
    assert got == expected


@pytest.mark.parametrize("name", list(KINDS))
def test_a_model_file_is_served_as_the_kind_its_saved_options_say(name, tmp_path):
    """No prediction_type: the reductions saved in the file decide the kind
    (a file of ``--cb 3`` saves ``--cb_adf`` too, and is still ``cb``)."""
    kind = KINDS[name]
    model = _trained_file(name, tmp_path)
    test = [line for index, size in TEST for line in file_lines(name, index, size, False)]
    expected = kind.read(engine_from_file(test, ["-i", model, "-t"] + kind.load_args, tmp_path))
    args = ["-i", model, "-t", "--quiet"] + kind.load_args
    with VowpalWabbitProcess(FORMATTER, args) as process:
        assert process.prediction_kind.multi_line == kind.multi_line
        assert "saved in the model file" in process.prediction_kind.origin
        got = [list(process.predict(*request(index, size))) for index, size in TEST]
    if not kind.multi_line:
        got = [prediction for predictions in got for prediction in predictions]
    assert got == expected


@pytest.mark.parametrize("name", ["cb", "cb_explore", "cb_adf", "cb_explore_adf"])
def test_a_prediction_type_that_contradicts_the_model_file_is_refused_before_start(name,
                                                                                  tmp_path):
    model = _trained_file(name, tmp_path)
    option = KINDS[name].args[0]
    with pytest.raises(ValueError, match=f"prediction_type='multiclass' contradicts {option}"
                                         r".* saved in the model file"):
        VowpalWabbitProcess(FORMATTER, ["-i", model, "--quiet"], prediction_type="multiclass")


@pytest.mark.parametrize("name", ["cb", "cb_explore", "cb_adf", "cb_explore_adf"])
def test_a_model_file_whose_options_cannot_be_read_fails_start_up_naming_prediction_type(
        name, tmp_path, monkeypatch):
    """A header subwabbit cannot read (another format, say) leaves the kind
    to the arguments; the start-up probe then finds the engine printing
    another kind's answers, at once, in the thread and asyncio classes."""
    model = _trained_file(name, tmp_path)
    monkeypatch.setattr(client_module, "saved_options_of", lambda vw_args: [])
    began = time.perf_counter()
    with pytest.raises(VowpalWabbitStartupError, match="pass prediction_type="):
        VowpalWabbitProcess(FORMATTER, ["-i", model, "--quiet"], startup_timeout_s=60)
    assert time.perf_counter() - began < 10  # not the start-up timeout

    async def main():
        async with AsyncVowpalWabbitProcess(FORMATTER, ["-i", model, "--quiet"]):
            pass

    with pytest.raises(VowpalWabbitStartupError, match="pass prediction_type="):
        asyncio.run(main())


def test_a_legacy_cb_model_file_is_served_in_the_format_it_saved(tmp_path):
    """``--cb_force_legacy`` is saved in the file and vw applies it again:
    one line per example, the action counted from 1."""
    path = str(tmp_path / "legacy.vw")
    engine_from_file(["1:1:0.5 |a x", "2:0:0.5 |a y"], ["--cb", "3", "--cb_force_legacy",
                                                        "-f", path], tmp_path)
    assert engine_from_file(["|a y"], ["-i", path, "-t"], tmp_path) == [b"2"]
    for extra in ([], ["--cb_force_legacy"]):
        with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["-i", path, "--quiet"] + extra,
                                 prediction_type="cb") as model:
            assert model.prediction_kind.answer_lines == 1
            assert list(model.predict("", ["|a y"])) == [2]


def test_a_legacy_cb_explore_tag_is_never_read_as_a_probability_when_the_file_hides_the_count(
        tmp_path, monkeypatch):
    """With ``--cb_force_legacy`` vw prints the probabilities, each ending
    with a space, then the tag: with the action count unknown (a header
    subwabbit cannot read), a tag '0.5' was read as a fourth probability."""
    path = str(tmp_path / "legacy.vw")
    engine_from_file(["1:1:0.5 |a x", "2:0:0.5 |a y"], ["--cb_explore", "3", "--cb_force_legacy",
                                                        "-f", path], tmp_path)
    items = ["'0.5 |a y", "|a y", "'x |a x", "'1 |a x"]
    args = ["-i", path, "-t", "--cb_force_legacy"]
    expected = [[float(value) for value in line.split(b" ")[:3]]
                for line in engine_from_file(items, args, tmp_path)]
    monkeypatch.setattr(client_module, "saved_options_of", lambda vw_args: [])
    for client_kind in ALL_KINDS:
        client = Client(client_kind, VowpalWabbitDummyFormatter(), args + ["--quiet"],
                        prediction_type="cb_explore")
        try:
            assert client.model.prediction_kind.count is None
            assert client.predict("", items) == expected
        finally:
            client.close()


@pytest.mark.parametrize("flag", ["--probabilities", "--scores"])
def test_class_names_holding_a_colon_get_their_probabilities_or_scores(flag, tmp_path):
    """vw prints ``a:b:0.56 c:0.44`` for the names ``a:b`` and ``c``: the
    value is after the last ':' (the first one's split failed start-up)."""
    args = ["--oaa", "2", "--named_labels", "a:b,c", flag]
    lines = ["a:b |a x", "c |a y"] * 3
    expected = [{name.decode(): float(value) for name, value in
                 (token.rsplit(b":", 1) for token in line.split())}
                for line in engine_from_file(lines + ["|a x", "|a y"], args, tmp_path)[-2:]]
    for client_kind in ALL_KINDS:
        client = Client(client_kind, VowpalWabbitDummyFormatter(), args + ["--quiet"])
        try:
            for _ in range(3):
                client.train("", ["|a x", "|a y"], ["a:b", "c"])
            assert client.predict("", ["|a x", "|a y"]) == expected
        finally:
            client.close()


@pytest.mark.parametrize("reduction", ["--oaa", "--csoaa"])
def test_named_labels_with_indexing_0_are_refused_before_vw_starts(reduction, tmp_path):
    """vw numbers --named_labels from 1 and, with --indexing 0, the classes
    from 0: it warns that the last name is not a class, and answers class 0
    with an empty line, which start-up or a later call failed on."""
    names = ["--named_labels", "walk,run,sprint", "--indexing", "0"]
    path = str(tmp_path / "named.vw")
    labels = (["walk", "run", "sprint"] if reduction == "--oaa"
              else ["walk:0 run:1 sprint:1", "run:0 walk:1 sprint:1", "sprint:0 walk:1 run:1"])
    engine_from_file([f"{label} |a {feature}" for label, feature in zip(labels, "xyz")],
                     [reduction, "3"] + names + ["-f", path], tmp_path)
    assert engine_from_file(["|a x"], [reduction, "3"] + names, tmp_path) == [b""]
    for args in ([reduction, "3"] + names, ["-i", path, "-t"]):
        for client_kind in ALL_KINDS:
            with pytest.raises(ValueError, match="cannot serve --named_labels with --indexing 0"):
                Client(client_kind, VowpalWabbitDummyFormatter(), args + ["--quiet"])


@pytest.mark.parametrize("prediction_type", [None, "multiclass"])
def test_a_named_label_model_file_refuses_a_misspelt_label_before_anything_reaches_vw(
        prediction_type, tmp_path):
    """The class names are saved in the file: a write-only process that
    loads it checks labels against them, where a misspelt one used to be
    learnt as another class with only a warning."""
    first, second = str(tmp_path / "first.vw"), str(tmp_path / "second.vw")
    formatter = VowpalWabbitDummyFormatter()
    with VowpalWabbitProcess(formatter, ["--oaa", "3", "--named_labels", "walk,run,sprint",
                                         "-f", first, "--quiet"], write_only=True) as model:
        model.train("", ["|a x", "|a y", "|a z"], ["walk", "run", "sprint"])
    with VowpalWabbitProcess(formatter, ["-i", first, "-f", second, "--quiet"],
                             write_only=True, prediction_type=prediction_type) as model:
        assert model.prediction_kind.classes.names == ("walk", "run", "sprint")
        with pytest.raises(ValueError, match="one of walk, run, sprint.*got 'spurt'"):
            model.train("", ["|a x", "|a y"], ["walk", "spurt"])
        model.train("", ["|a x", "|a y"], ["walk", "run"])
    with VowpalWabbitProcess(formatter, ["-i", second, "-t", "--quiet"],
                             prediction_type=prediction_type) as model:
        assert list(model.predict("", ["|a x", "|a y"])) == [
            line.decode() for line in engine_from_file(["|a x", "|a y"], ["-i", second, "-t"],
                                                       tmp_path)]


@pytest.mark.parametrize("load, prediction_type, refused", [
    (["--oaa", "3", "--probabilities"], "class_scores", "contradicts --probabilities"),
    (["--oaa", "3", "--probabilities", "--scores"], "class_scores",
     "contradicts --probabilities"),
    (["--oaa", "3"], "class_probabilities", "needs --probabilities in vw_args"),
    (["--oaa", "3"], "class_scores", "needs --scores in vw_args"),
    (["--oaa", "3", "--scores"], "class_probabilities", "needs --probabilities in vw_args"),
    (["--ect", "3", "--scores"], "class_scores", "with --oaa only; --ect prints the class"),
    (["-i", "{oaa}", "-t"], "class_probabilities", "needs --probabilities in vw_args"),
    (["-i", "{oaa}", "-t", "--probabilities"], "class_scores", "contradicts --probabilities"),
    (["-i", "{ect}", "-t", "--scores"], "class_scores", "with --oaa only; --ect prints"),
])
def test_a_prediction_type_that_contradicts_probabilities_or_scores_is_refused_before_start(
        load, prediction_type, refused, tmp_path):
    """vw prints probabilities with --oaa --probabilities (whatever --scores
    says), raw scores with --oaa --scores, and the class alone otherwise:
    class_scores served probabilities as scores, and the others failed
    only at start-up, after vw had started, saying to pass prediction_type."""
    models = {"oaa": _trained_file("oaa", tmp_path), "ect": _trained_file("ect", tmp_path)}
    args = [token.format(**models) for token in load] + ["--quiet"]
    for client_kind in ALL_KINDS:
        with pytest.raises(ValueError, match=f"'{prediction_type}' model .*{refused}"):
            Client(client_kind, FORMATTER, args, prediction_type=prediction_type)


@pytest.mark.parametrize("load, prediction_type, reads", [
    (["--ect", "3", "--scores"], None, _ints),                   # vw ignores --scores
    (["-i", "{ect}", "-t", "--scores"], "multiclass", _ints),
    (["-i", "{oaa}", "-t", "--scores"], "multiclass", _class_dicts),
    (["-i", "{oaa}", "-t", "--scores"], "class_scores", _class_dicts),
    (["-i", "{oaa}", "-t", "--probabilities", "--scores"], None, _class_dicts),
])
def test_probabilities_and_scores_are_served_as_vw_prints_them(load, prediction_type, reads,
                                                                tmp_path):
    models = {"oaa": _trained_file("oaa", tmp_path), "ect": _trained_file("ect", tmp_path)}
    args = [token.format(**models) for token in load]
    test = [line for index, size in TEST for line in file_lines("oaa", index, size, False)]
    expected = reads(engine_from_file(test, args, tmp_path))
    with VowpalWabbitProcess(FORMATTER, args + ["--quiet"],
                             prediction_type=prediction_type) as process:
        got = [prediction for index, size in TEST
               for prediction in process.predict(*request(index, size))]
    assert got == expected


@pytest.mark.parametrize("prediction_type, flag", [
    ("class_probabilities", "--probabilities"), ("class_scores", "--scores"),
    ("multiclass", "--probabilities"), (None, "--probabilities")])
def test_a_tag_after_class_pairs_is_never_read_as_a_class_when_the_file_hides_the_count(
        prediction_type, flag, tmp_path, monkeypatch):
    """A header subwabbit cannot read leaves the class count unknown: the
    tag vw prints after an answer's pairs ('3:9') was read as class 3's
    probability, 9.0 (and '4:9' as a class 4). Now the count is asked for
    before vw starts, and with --oaa K given again the tags are left out."""
    model = _trained_file("oaa", tmp_path)
    monkeypatch.setattr(client_module, "saved_options_of", lambda vw_args: [])
    args = ["-i", model, "-t", flag]
    for client_kind in ALL_KINDS:
        with pytest.raises(ValueError, match="needs its class count.*pass --oaa K"):
            Client(client_kind, FORMATTER, args + ["--quiet"], prediction_type=prediction_type)
    items = ["'3:9 |i i1 c1", "'4:9 |i i2 c2", "'1:0.5:7 |i i3 c3", "|i i4 c4", "'x |i i5 c5"]
    expected = [{int(label): float(value) for label, value in
                 (token.split(b":") for token in line.split()[:3])}
                for line in engine_from_file(items, args, tmp_path)]
    for client_kind in ALL_KINDS:
        client = Client(client_kind, VowpalWabbitDummyFormatter(), args + ["--oaa", "3", "--quiet"],
                        prediction_type=prediction_type)
        try:
            assert client.predict("", items) == expected
        finally:
            client.close()


# ------------------------------------------------- never misattributed

def _expected_requests(name: str, model: str, requests: List[Any], tmp_path: Any) -> List[Any]:
    kind = KINDS[name]
    result = []
    for index, size in requests:
        raw = engine_from_file(file_lines(name, index, size, False),
                               ["-i", model, "-t"] + kind.load_args, tmp_path)
        result.append(kind.read(raw)[0] if kind.multi_line else kind.read(raw))
    return result


def _check(name: str, got: List[Any], expected: List[Any]) -> None:
    """A multi-line call gives all its items or none; a single-line one a prefix."""
    if KINDS[name].multi_line:
        assert got in ([], expected)
    else:
        assert got == expected[:len(got)]


async def _cancelled(call: Any, after_s: float) -> None:
    """Cancel ``call`` (a coroutine) after ``after_s``, whatever it did by then."""
    try:
        await asyncio.wait_for(call, after_s)
    except asyncio.TimeoutError:
        pass


@pytest.mark.parametrize("client_kind", ALL_KINDS)
@pytest.mark.parametrize("name", ["oaa", "cb_explore_adf"])
def test_deadline_leftovers_and_abandoned_calls_never_reach_a_later_call(name, client_kind,
                                                                         tmp_path):
    model = _trained_file(name, tmp_path)
    requests = [(200 + index, 400 + 150 * index) for index in range(4)] + [(300, 9)]
    expected = _expected_requests(name, model, requests, tmp_path)
    # the blocking class leaves work in flight only with a bound on lateness
    bound = {"max_lateness_s": 0.0} if client_kind == "blocking" else {}
    client = Client(client_kind, FORMATTER, ["-i", model, "-t", "--quiet"],
                    prediction_type=KINDS[name].prediction_type, **bound)
    try:
        saw_leftovers = False
        # Deadlines of 0.5 to 2 ms: a multi-line example leaves its answer in
        # flight only when it was queued before the write cut-off and not
        # answered by the deadline, which the longest deadlines make likely
        # (with 1.5 ms at most, one full run of 2,849 tests saw none).
        for round_ in range(4):
            for position, (index, size) in enumerate(requests[:4]):
                got = client.predict(*request(index, size), timeout=0.0005 * (round_ + 1))
                _check(name, got, expected[position])
                saw_leftovers = saw_leftovers or client.model.pending_lines > 0
                other = (position + 1) % 4
                if client_kind != "asyncio":  # an abandoned iterator, of another request
                    iterator = client.model.predict(*request(*requests[other]))
                    assert next(iterator, None) == expected[other][0]
                    saw_leftovers = saw_leftovers or client.model.pending_lines > 0
                    del iterator
                    gc.collect()
                else:  # a cancelled call, of another request
                    client.loop.run_until_complete(_cancelled(
                        client.model.predict(*request(*requests[other])), after_s=0.0003))
                    saw_leftovers = saw_leftovers or client.model.pending_lines > 0
            assert client.predict(*request(300, 9)) == expected[-1]
        assert saw_leftovers  # the test did leave work in flight
        for position, (index, size) in enumerate(requests):
            assert client.predict(*request(index, size)) == expected[position]
        assert client.model.pending_lines == 0
    finally:
        client.close()


@pytest.mark.parametrize("cls", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess],
                         ids=["blocking", "nonblocking"])
@pytest.mark.parametrize("name", ["oaa", "cb_explore_adf"])
def test_concurrent_threads_each_get_their_own_predictions(name, cls, tmp_path):
    model = _trained_file(name, tmp_path)
    requests = [(400 + index, 200 + 150 * index) for index in range(6)]
    expected = _expected_requests(name, model, requests, tmp_path)
    failures = []
    bound = {"max_lateness_s": 0.0} if cls is VowpalWabbitProcess else {}
    with cls(FORMATTER, ["-i", model, "-t", "--quiet"],
             prediction_type=KINDS[name].prediction_type, **bound) as process:
        def worker(offset):
            try:
                for round_ in range(8):
                    position = (offset + round_) % len(requests)
                    index, size = requests[position]
                    timeout = 0.001 if round_ % 2 == 0 else None
                    got = list(process.predict(*request(index, size), timeout=timeout))
                    if timeout is None:
                        assert got == expected[position]
                    else:
                        _check(name, got, expected[position])
            except BaseException as exc:  # pylint: disable=broad-except
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(offset,)) for offset in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert not failures, failures


@pytest.mark.parametrize("name", ["oaa", "cb_explore_adf"])
def test_concurrent_tasks_and_cancelled_calls_each_get_their_own_predictions(name, tmp_path):
    model = _trained_file(name, tmp_path)
    requests = [(500 + index, 25 + 53 * index) for index in range(8)]
    expected = _expected_requests(name, model, requests, tmp_path)

    async def main():
        async with AsyncVowpalWabbitProcess(
                FORMATTER, ["-i", model, "-t", "--quiet"],
                prediction_type=KINDS[name].prediction_type) as process:
            tasks = [asyncio.ensure_future(process.predict(
                *request(*requests[position]), timeout=0.003 if position % 2 else None))
                for position in range(len(requests))]
            victim = asyncio.ensure_future(process.predict(*request(*requests[0])))
            await asyncio.sleep(0)
            victim.cancel()
            results = await asyncio.gather(*tasks)
            again = [await process.predict(*request(*requests[position]))
                     for position in range(len(requests))]
            return results, again

    results, again = asyncio.run(main())
    for position, got in enumerate(results):
        if position % 2:
            _check(name, got, expected[position])
        else:
            assert got == expected[position]
    assert again == expected


# ------------------------------------------------ fork, crash, save

@pytest.mark.parametrize("client_kind", ALL_KINDS)
def test_after_fork_a_multi_line_model_serves_the_child_and_the_parent(client_kind, tmp_path):
    model = _trained_file("cb_explore_adf", tmp_path)
    requests = [(600, 900), (601, 5)]
    expected = _expected_requests("cb_explore_adf", model, requests, tmp_path)
    client = Client(client_kind, FORMATTER, ["-i", model, "-t", "--quiet"],
                    prediction_type="cb_explore_adf")
    try:
        parent_engine = client.model.pid
        client.predict(*request(*requests[0]), timeout=0.0005)  # may leave work in flight

        def child():
            client.new_loop_after_fork()
            return [client.predict(*request(*requests[1])), client.model.pid]

        outcome = in_child(child)
        assert "error" not in outcome, outcome
        got, child_engine = outcome["ok"]
        assert got == expected[1] and child_engine != parent_engine
        assert client.model.pid == parent_engine
        assert client.predict(*request(*requests[0])) == expected[0]
    finally:
        client.close()


@pytest.mark.parametrize("client_kind", ALL_KINDS)
@pytest.mark.parametrize("name", ["oaa-probabilities", "cb_explore_adf"])
def test_restart_on_crash_recovers_and_stays_exact(name, client_kind, tmp_path):
    kind = KINDS[name]
    model = _trained_file(name, tmp_path)
    expected = _expected_requests(name, model, [(700, 40)], tmp_path)[0]
    client = Client(client_kind, FORMATTER, ["-i", model, "-t", "--quiet"] + kind.load_args,
                    prediction_type=kind.prediction_type, restart_on_crash=True)
    try:
        assert client.predict(*request(700, 40)) == expected
        os.kill(client.model.pid, signal.SIGKILL)
        time.sleep(0.05)
        with pytest.raises(VowpalWabbitEngineExitedError):
            client.predict(*request(700, 40), timeout=None)
        for _ in range(400):
            got = client.predict(*request(700, 40), timeout=0.01)
            _check(name, got, expected)
            if got:
                break
        assert client.predict(*request(700, 40)) == expected
        assert client.model.restart_count == 1
    finally:
        client.close()


@pytest.mark.parametrize("client_kind", ALL_KINDS)
def test_save_from_a_multi_line_process_keeps_serving(client_kind, tmp_path):
    client = Client(client_kind, FORMATTER, KINDS["cb_explore_adf"].args + ["--quiet"])
    try:
        _train_all(client, "cb_explore_adf")
        before = client.predict(*request(800, 6))
        if client_kind == "asyncio":
            client.loop.run_until_complete(client.model.save(str(tmp_path / "saved.vw")))
        else:
            client.model.save(str(tmp_path / "saved.vw"))
        assert client.predict(*request(800, 6)) == before
    finally:
        client.close()
    assert _expected_requests("cb_explore_adf", str(tmp_path / "saved.vw"), [(800, 6)],
                              tmp_path) == [before]


# ----------------------------------------------------- labels and lines

@pytest.mark.parametrize("client_kind", ALL_KINDS)
def test_bad_labels_raise_before_anything_is_sent(client_kind, tmp_path):
    client = Client(client_kind, FORMATTER, ["--oaa", "3", "--quiet"])
    try:
        common, items = request(1, 3)
        with pytest.raises(ValueError, match=r"labels\[2\] is 0; vw's class labels start at 1"):
            client.train(common, items, [1, 2, 0])
        with pytest.raises(ValueError, match=r"weights\[0\] is negative"):
            client.train(common, items, [1, 2, 3], [-1, None, None])
        assert client.model.pending_lines == 0
        assert client.predict(common, items) == [1, 1, 1]  # nothing was learnt
    finally:
        client.close()
    client = Client(client_kind, FORMATTER, ["--cb_explore_adf", "--quiet"])
    try:
        common, items = request(1, 3)
        with pytest.raises(ValueError, match=r"exactly one item .* labelled"):
            client.train(common, items, [(1.0, 0.5), (0.0, 0.5), None])
        with pytest.raises(ValueError, match=r"the probability of labels\[1\] .* \(0, 1\]"):
            client.train(common, items, [None, (0.0, 0.0), None])
        assert client.predict(common, items) == [pytest.approx(1 / 3, abs=1e-5)] * 3
    finally:
        client.close()


@pytest.mark.parametrize("client_kind", ALL_KINDS)
def test_a_cost_sensitive_text_label_with_a_class_twice_is_refused(client_kind):
    """VW's text for a --csoaa label gives each class once: '2:0 2:5 3:1'
    used to become {2: 5.0, 3: 1.0} and be sent as '2:5.0 3:1.0', the
    engine learning that class 2 costs 5, not what was written."""
    for args, label, twice in ((["--csoaa", "3"], "2:0 2:5 3:1", "'2'"),
                               (["--csoaa", "3", "--named_labels", "a,b,c"], "b:0 c:1 b:5",
                                "'b'")):
        client = Client(client_kind, VowpalWabbitDummyFormatter(), args + ["--quiet"])
        try:
            pid = client.pids()
            with pytest.raises(ValueError, match=rf"labels\[1\] gives the class {twice} twice"):
                client.train("|u a", ["|i x", "|i y"], [label.split(" ", 1)[1], label])
            assert client.model.pending_lines == 0
            # nothing was learnt: the untrained model's first class
            assert client.predict("|u a", ["|i x"]) == [1 if twice == "'2'" else "a"]
            assert client.pids() == pid
        finally:
            client.close()


class BlankItems(DictFormatter):
    """Formats item 13 as an empty part, which would end a multi-line example."""

    def format_item_features(self, common_features, item_features, debug_info=None):
        if item_features["id"] == 13:
            return ""
        return super().format_item_features(common_features, item_features, debug_info)


@pytest.mark.parametrize("client_kind", ALL_KINDS)
def test_an_item_line_that_would_end_the_example_is_refused(client_kind):
    client = Client(client_kind, BlankItems(), ["--cb_explore_adf", "--quiet"])
    try:
        items = [{"id": 12}, {"id": 13}, {"id": 14}]
        with pytest.raises(ValueError, match=r"formatted item #1 is empty; vw reads an empty line"):
            client.predict({"user": 1}, items)
        with pytest.raises(ValueError, match=r"formatted item #1 is empty"):
            client.train({"user": 1}, items, [None, None, (1.0, 0.5)])
        assert client.model.pending_lines == 0
        assert client.predict({"user": 1}, [{"id": 12}, {"id": 14}]) == [0.5, 0.5]
    finally:
        client.close()


def test_multi_line_metrics_count_the_items_of_the_example():
    metrics: Dict[str, Any] = {}
    detailed: Dict[str, Any] = {}
    with VowpalWabbitNonBlockingProcess(FORMATTER, ["--cb_explore_adf", "--quiet"]) as model:
        got = list(model.predict(*request(1, 120), metrics=metrics, detailed_metrics=detailed))
        assert len(got) == 120 and metrics["num_lines"] == 120
        assert len(detailed["generating_lines_time"]) >= 3  # formatted 50 items at a time
        empty = list(model.predict(*request(1, 3000), timeout=0.0, metrics=metrics))
    assert empty == [] and metrics["num_lines"] == 0


# ------------------------------------------------------------ PLT and engines

def test_plt_class_keeps_label_strings_and_plain_processes_give_lists(tmp_path):
    args = KINDS["plt"].args + ["--quiet"]
    with VowpalWabbitPLTProcess(FORMATTER, args) as old, VowpalWabbitProcess(FORMATTER,
                                                                              args) as new:
        for index in TRAIN:
            common, items = request(index)
            old.train(common, items, [str(label[0]) for label in train_labels("plt", index)])
            new.train(common, items, train_labels("plt", index))
        strings = list(old.predict(*request(100, 7)))
        lists = list(new.predict(*request(100, 7)))
    assert all(isinstance(value, str) for value in strings)
    assert lists == [[int(label) for label in value.split(",") if label] for value in strings]
    assert lists == expected_after_training("plt", tmp_path)[0]


@pytest.mark.parametrize("name", list(KINDS))
def test_the_wheel_engines_one_thread_loop_leaves_every_kind_to_vws_driver(name, tmp_path):
    """The loop serves plain scalar predictions only; for every other kind
    the wheel's engine runs vw's own driver, with or without a model file."""
    import pylibvw  # pylint: disable=import-outside-toplevel,import-error
    kind = KINDS[name]
    args = kind.args + kind.file_args + ["-p", "stdout", "--quiet"]
    # decided from the arguments, without loading a model only to find out
    assert program._loop_arguments(args) is None  # pylint: disable=protected-access
    model = _trained_file(name, tmp_path)
    assert program._start_loop(  # pylint: disable=protected-access
        pylibvw, ["-i", model, "-p", "stdout", "--quiet"] + kind.load_args) is None


@pytest.mark.parametrize("driver", ["vw", "loop"])
@pytest.mark.parametrize("name", ["csoaa", "cb", "cb_explore_adf"])
def test_both_engine_drivers_serve_the_kinds(name, driver, tmp_path, monkeypatch):
    monkeypatch.setenv(program.DRIVER_ENV_VAR, driver)
    expected = expected_after_training(name, tmp_path)
    with VowpalWabbitProcess(FORMATTER, KINDS[name].args + ["--quiet"],
                             vw_command=default_engine_command()) as model:
        for index in TRAIN:
            model.train(*request(index), train_labels(name, index))
        assert [list(model.predict(*request(index, size))) for index, size in TEST] == expected


def test_a_write_only_multi_line_engine_is_never_left_with_half_an_example(tmp_path):
    """The write-only start-up probe ends with an empty line: an example of
    its own, never glued to the first training example."""
    with VowpalWabbitProcess(FORMATTER, KINDS["cb_adf"].args + ["--quiet"],
                             write_only=True) as trainer:
        trainer.train(*request(0), train_labels("cb_adf", 0))
        trainer.save(str(tmp_path / "one.vw"))
    engine_from_file(file_lines("cb_adf", 0), ["--cb_adf", "--rank_all", "-f",
                                               str(tmp_path / "file.vw")], tmp_path)
    test = file_lines("cb_adf", 5, 4, False)
    assert (engine_from_file(test, ["-i", str(tmp_path / "one.vw"), "-t"], tmp_path)
            == engine_from_file(test, ["-i", str(tmp_path / "file.vw"), "-t"], tmp_path))


def test_predict_on_a_closed_or_write_only_multi_line_process_raises():
    with VowpalWabbitProcess(FORMATTER, ["--cb_explore_adf", "--quiet"],
                             write_only=True) as trainer:
        with pytest.raises(VowpalWabbitError, match="write-only"):
            list(trainer.predict(*request(1, 3)))


# ------------------------------------------------------------------ pools

@pytest.mark.parametrize("pool_kind", ["threads", "asyncio"])
@pytest.mark.parametrize("name", ["oaa", "oaa-probabilities", "cb_explore", "cb_explore_adf",
                                  "cb_adf"])
def test_pools_serve_the_kinds_exactly(name, pool_kind, tmp_path):
    """Pools give the typed predictions of the kind, equal to the engine's,
    from many callers at once; a multi-line example goes whole to one engine."""
    import asyncio
    import threading

    from subwabbit import AsyncVowpalWabbitPool, VowpalWabbitPool

    kind = KINDS[name]
    model = _trained_file(name, tmp_path)
    args = ["-i", model, "-t", "--quiet"] + kind.load_args
    options = {"prediction_type": kind.prediction_type} if kind.prediction_type else {}
    requests = [(100 + index, 1 + (index * 37) % 400) for index in range(12)]
    expected = _expected_requests(name, model, requests, tmp_path)

    def check(results):
        for (index, size), got, want, engines in zip(requests, *results):
            if kind.multi_line:
                assert got == want and engines == 1
            else:
                assert got == want

    if pool_kind == "threads":
        with VowpalWabbitPool(FORMATTER, args, size=2, **options) as pool:
            got, engines = [None] * len(requests), [0] * len(requests)

            def call(position):
                metrics = {}
                got[position] = pool.predict(*request(*requests[position]), metrics=metrics)
                engines[position] = metrics["engines"]

            threads = [threading.Thread(target=call, args=(position,))
                       for position in range(len(requests))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            check((got, expected, engines))
    else:
        async def main():
            async with AsyncVowpalWabbitPool(FORMATTER, args, size=2, **options) as pool:
                async def call(position):
                    metrics = {}
                    result = await pool.predict(*request(*requests[position]), metrics=metrics)
                    return result, metrics["engines"]
                pairs = await asyncio.gather(*(call(p) for p in range(len(requests))))
                return [pair[0] for pair in pairs], [pair[1] for pair in pairs]
        got, engines = asyncio.run(main())
        check((got, expected, engines))


def test_a_reload_cannot_change_the_kind_of_model(tmp_path):
    from subwabbit import VowpalWabbitPool
    with VowpalWabbitPool(FORMATTER, ["--oaa", "3", "--quiet"], size=1) as pool:
        with pytest.raises(ValueError, match="kind of model"):
            pool.reload(["--quiet"])
        assert pool.predict(*request(100, 3)) == [1, 1, 1]
    with VowpalWabbitNonBlockingProcess(FORMATTER, ["--quiet"]) as model:
        with pytest.raises(ValueError, match="kind of model"):
            model.reload(["--cb_explore_adf", "--quiet"])



@pytest.mark.parametrize("client_kind", ALL_KINDS + ["pool", "asyncio-pool"])
def test_a_reload_cannot_change_the_classes(client_kind, tmp_path):
    """A reload to a model of the same kind with other classes is refused
    before any engine starts. It used to start them and check them against
    the old classes: 5 classes to 3 failed start-up with a message blaming
    the old file, and 3 to 5 passed, after which a pool call that had
    waited for an engine across the switch returned the first 3 of the new
    model's 5 probabilities per item (found by a review, /tmp/review14)."""
    lines = [line for index in TRAIN for line in file_lines("oaa-probabilities", index)]
    files = {}
    for classes in (3, 5):
        files[classes] = str(tmp_path / f"oaa{classes}.vw")
        engine_from_file(lines, ["--oaa", str(classes), "--probabilities", "--loss_function",
                                 "logistic", "-f", files[classes]], tmp_path)
    load = lambda classes: (["-i", files[classes], "-t", "--quiet"]  # noqa: E731
                            + KINDS["oaa-probabilities"].load_args)
    named = lambda names: ["--oaa", "3", "--named_labels", names, "--quiet"]  # noqa: E731
    refused = "cannot change the kind of model or its classes"
    test = [line for index, size in TEST for line in file_lines("oaa-probabilities", index, size,
                                                                 False)]
    truth = _class_dicts(engine_from_file(test, ["-i", files[3], "-t"]
                                          + KINDS["oaa-probabilities"].load_args, tmp_path))
    pool_size = {"size": 1} if "pool" in client_kind else {}
    for first, then, match in ((load(3), load(5), "class label is an int from 1 to 5"),
                               (load(5), load(3), "class label is an int from 1 to 3"),
                               (named("walk,run,sprint"), named("a,b,c"), "one of a, b, c")):
        model = Client(client_kind, FORMATTER, first, **pool_size)
        try:
            pids = model.pids()
            with pytest.raises(ValueError, match=f"{refused}.*{match}"):
                model.reload(then)
            assert model.pids() == pids
            if first == load(3):
                got = [p for index, size in TEST for p in model.predict(*request(index, size))]
                assert got == truth
                model.reload(load(3))  # the same classes: served
                got = [p for index, size in TEST for p in model.predict(*request(index, size))]
                assert got == truth
        finally:
            model.close()


def test_multi_line_train_metrics_count_items_and_an_empty_call_sends_nothing():
    seen = []
    with VowpalWabbitProcess(FORMATTER, ["--cb_explore_adf", "--quiet"],
                             metrics_hook=seen.append) as model:
        model.train(*request(3, 5), adf_labels(3, 5))
        model.train({"user": 1}, [], [])  # no items: no example, no error
        assert [m["num_lines"] for m in seen if m["method"] == "train"] == [5, 0]
        assert len(list(model.predict(*request(4, 5)))) == 5


def _one_engine(client_kind: str) -> Dict[str, Any]:
    """The arguments that make a pool of one engine (none for a process)."""
    return {"size": 1} if "pool" in client_kind else {}


@pytest.mark.parametrize("client_kind", ALL_KINDS + ["pool"])
@pytest.mark.parametrize("name", ["cb_adf", "cb_explore_adf"])
def test_a_label_the_engine_would_exit_on_is_refused_before_anything_is_sent(name, client_kind,
                                                                            tmp_path):
    """vw's engine exits (it aborts) on a multi-line example with a line of
    more than one cost: a shared line with anything before its '|' but
    ``shared`` and a tag (a common part of ``'1 |u a'`` or ``'shared |u a'``,
    whose line becomes ``'shared shared |u a'``), an item line with two
    label words, or a label of more than three parts. Such a call used to
    reach the engine and end in VowpalWabbitEngineExitedError, losing what a
    learning engine had learnt; it is a ValueError now, and the engine serves on."""
    kind = KINDS[name]
    formatter = VowpalWabbitDummyFormatter()
    items = ["|i x", "|i y"]
    data = tmp_path / "exits.txt"
    data.write_text("shared 1 |u a\n|i x\n|i y\n\n")
    assert subprocess.run(default_engine_command() + ["-d", str(data), "--quiet"] + kind.args,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=120).returncode != 0  # the engine reads it and exits
    client = Client(client_kind, formatter, kind.args + ["--quiet"], **_one_engine(client_kind))
    predict, train = client.predict, client.train if client.trains else None
    try:
        before = client.pids()
        for common, parts, match in (
                ("1 |u a", items, r"the shared line has '1' before its first '\|'"),
                ("shared |u a", items, "the shared line has 'shared'"),
                ("x y|u a", items, "the shared line has 'x'"),
                ("|u a", ["|i x", "1 2 |i y"], r"formatted item #1 has the label '(0:1.0:0.5 )?1 2'"),
                ("|u a", ["1:2:3:4 |i x", "|i y"], "formatted item #0 has the label '1:2:3:4'")):
            with pytest.raises(ValueError, match=match):
                predict(common, parts)
            if train is not None:
                with pytest.raises(ValueError, match=match):
                    train(common, parts, [None, (1.0, 0.5)])
        if train is not None:
            with pytest.raises(ValueError, match=r"formatted item #0 has the label '0:1.0:0.5 2'"):
                train("|u a", ["2 |i x", "|i y"], [(1.0, 0.5), None])
        # what vw reads without a word: a tag, one label word on an item
        for common, parts in (("'req |u a", ["'t |i x", "|i y"]), ("req|u a", items),
                              ("|u a", ["1 |i x", "x|i y"])):
            raw = engine_from_file([f"shared {common}"] + parts + [""],
                                   kind.args + kind.file_args, tmp_path)
            assert raw[1] == b""
            assert predict(common, parts) == _in_action_order(raw[0].split(b" ")[0])  # (a tag)
        assert client.pids() == before  # never restarted
    finally:
        client.close()


@pytest.mark.parametrize("client_kind", ALL_KINDS + ["pool"])
@pytest.mark.parametrize("name", ["cb_adf", "cb_explore_adf"])
def test_item_labels_the_engine_stops_on_are_refused_before_anything_is_sent(name, client_kind,
                                                                           tmp_path):
    """vw's engine exits on a multi-line example in which two item lines have
    a cost ("only one line can have a cost"), whether the formatter wrote both
    or ``train`` labelled one and the formatter another, and stops reading at
    an item label of only colons (a malformed cost), having answered the
    example with fewer actions than it has items. Both used to reach the
    engine (VowpalWabbitEngineExitedError, VowpalWabbitProtocolError); they
    are ValueErrors now, and the engine serves on."""
    kind = KINDS[name]
    example = ["shared |u a", "|i x", "|i y", ""]
    for bad in (["shared |u a", "0:1:0.5 |i x", "0:2:0.5 |i y", ""],
                ["shared |u a", "|i x", ":: |i y", ""]):
        code, answers = _engine_answers(example + bad + example, kind.args + kind.file_args,
                                        tmp_path)
        assert code != 0 or answers.count(b"") < 3  # it exits, or misses an example
    client = Client(client_kind, VowpalWabbitDummyFormatter(), kind.args + ["--quiet"],
                    **_one_engine(client_kind))
    try:
        before = client.pids()
        for parts, match in ((["0:1:0.5 |i x", "0:2:0.5 |i y"], r"formatted items #0 and #1 both"),
                             (["|i x", ":: |i y"], r"formatted item #1 has the label '::'"),
                             (["|i x", ": |i y"], r"formatted item #1 has the label ':'")):
            with pytest.raises(ValueError, match=match):
                client.predict("|u a", parts)
        if client.trains:
            with pytest.raises(ValueError, match=r"formatted items #0 and #1 both"):
                client.train("|u a", ["|i x", "0:2:0.5 |i y"], [(1.0, 0.5), None])
            # an action without a cost is no cost, nor is '0:' (vw reads it as action 0)
            client.train("|u a", ["|i x", "1 |i y", "0: |i z"], [(1.0, 0.5), None, None])
        assert len(client.predict("|u a", ["|i x", "|i y"])) == 2
        assert client.pids() == before  # never restarted
    finally:
        client.close()


@pytest.mark.parametrize("client_kind", ALL_KINDS + ["pool"])
def test_an_item_cost_vw_misreads_is_refused_before_it_poisons_the_model(client_kind, tmp_path):
    """A cost the formatter writes before an item's '|' is checked as
    train() checks its labels: vw reads a cost of 1e-200 (or 1e39) as an
    infinity, and a --cb_adf model that learnt from it answers nan for ever;
    it learns nothing from '0:1' (no probability) or '0:1:0'. Such an item
    used to reach the engine (a learning predict() made every later answer
    nan); it is a ValueError now, and the engine serves on."""
    kind = KINDS["cb_adf"]
    example = ["shared |u a", "0:1:0.5 |i x", "|i y", ""]
    poisoned = ["shared |u a", "0:1e-200:0.5 |i x", "|i y", ""]
    raw = engine_from_file(example + poisoned + ["shared |u a", "|i x", "|i y", ""],
                           kind.args + kind.file_args, tmp_path)
    assert b"nan" in raw[-2]  # the engine's answers after it
    client = Client(client_kind, VowpalWabbitDummyFormatter(), kind.args + ["--quiet"],
                    **_one_engine(client_kind))
    try:
        before = client.pids()
        for word, problem in (("0:1e-200:0.5", "not action:cost:probability"),
                              ("0:1e39:0.5", "not action:cost:probability"),
                              ("0:1:0", r"a probability in \(0, 1\]"),
                              ("0:1", "a cost but no probability")):
            with pytest.raises(ValueError, match=rf"formatted item #1 has the label '{word}'.*"
                                                 rf"{problem}"):
                client.predict("|u a", ["|i x", f"{word} |i y"])
            if client.trains:
                with pytest.raises(ValueError, match=rf"formatted item #0 .*'{word}'"):
                    client.train("|u a", [f"{word} |i x", "|i y"], [None, (1.0, 0.5)])
        # a cost vw reads as written is learnt from, as the label train() writes
        got = client.predict("|u a", ["0:1:0.5 |i x", "|i y"])
        assert len(got) == 2 and all(value == value for value in got)  # (no nan)
        assert all(value == value for value in client.predict("|u a", ["|i x", "|i y"]))
        assert client.pids() == before
    finally:
        client.close()


#: For single-line kinds: common parts whose label words vw would exit on
#: or misread (checked here against the engine reading them from a file),
#: and common parts whose label vw reads as written.
HEADERS: Dict[str, Any] = {
    # name: (refused, accepted)
    "oaa": (["x |u a", "1:2 |u a", "1.5 |u a", "0 |u a", "4 |u a", "2 x |u a", "2 -1 |u a",
             "2 1 1 |u a", "t1 |u a"],
            ["2 |u a", "+3 0.5 't |u a", "'t |u a", "t|u a", "1 0 |u a"]),
    "oaa-probabilities": (["x |u a", "0 |u a"], ["3 |u a"]),
    "recall_tree": (["x |u a", "4 |u a"], ["2 |u a"]),
    "csoaa": (["x |u a", "+1:0 |u a", "1.5:0 |u a", "0:1 |u a", "4:1 |u a", "1:x |u a",
               "1: |u a", "1:0 1:1 |u a", "1:inf |u a"],
              ["1:0 2:1 3:1 |u a", "2 3 |u a", "3:-1.5 |u a"]),
    "multilabel_oaa": (["x |u a", "3 |u a", "2,0 |u a", "0:1 |u a", "0 1 |u a"],
                       ["0,2 |u a", "1 |u a"]),
    "plt": (["x |u a", "6 |u a", "0,,1 |u a"], ["5,0 |u a"]),
    "cb": (["1:2:3:4 |u a", "x |u a", "4:1:0.5 |u a", "1:1 |u a", "1:1:0 |u a",
            "1:1:0.5 2:0:0.5 |u a", "1:1e-200:0.5 |u a"],
           ["1:2:0.5 |u a", "2 |u a", "3:-1:1 1 |u a"]),
    "cb_explore": (["1:2:3:4 |u a", "x |u a"], ["2:1.5:0.25 |u a"]),
}


def _engine_answers(lines: List[str], args: List[str], tmp_path: Any) -> Any:
    """What the engine does with ``lines`` read from a file: its exit code and output."""
    data = tmp_path / f"headers-{len(os.listdir(tmp_path))}.txt"
    data.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    done = subprocess.run(default_engine_command() + ["-d", str(data), "-p", "stdout", "--quiet"]
                          + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    return done.returncode, done.stdout.splitlines()


@pytest.mark.parametrize("client_kind", ALL_KINDS + ["pool", "asyncio-pool"])
@pytest.mark.parametrize("name", ["oaa", "csoaa", "cb"])
def test_a_label_in_the_common_part_that_vw_misreads_is_refused_on_every_client(
        name, client_kind, tmp_path):
    """A label that the formatter puts before the first '|' of a single-line
    kind's line (here in the common part) used to go to vw unchecked: under
    --oaa and --cb ('x', '1:2', '1:2:3:4') the engine exited and the call
    raised VowpalWabbitEngineExitedError, and under --csoaa 'x' gave the
    class 1050319616. It is a ValueError before anything is sent now, in
    predict and train; a label vw reads as written still passes (a labelled
    predict line is one vw learns from, or computes a loss of under -t)."""
    kind = KINDS[name]
    refused, accepted = HEADERS[name]
    formatter = VowpalWabbitDummyFormatter()
    items = ["|i x", "|i y"]
    read = kind.read
    client = Client(client_kind, formatter, kind.args + ["--quiet"], **_one_engine(client_kind))
    predict, train = client.predict, client.train if client.trains else None
    try:
        before = client.pids()
        got = []
        for good, bad in zip(accepted * len(refused), refused):
            with pytest.raises(ValueError, match="the formatted common features has .* "
                                                 r"before its first '\|'"):
                predict(bad, items)
            if train is not None and bad == refused[0]:  # (others may be a weight after it)
                with pytest.raises(ValueError, match=r"training example #0 has "):
                    train(bad, items, [kind.label(0, 0)] * 2)
            got += predict(good, items)
        assert client.pids() == before  # never restarted
    finally:
        client.close()
    # The engine reading the accepted lines alone (nothing refused reached it)
    lines = [f"{good} {part}" for good in (accepted * len(refused))[:len(refused)]
             for part in items]
    code, raw = _engine_answers(lines, kind.args, tmp_path)
    assert code == 0 and got == read(raw)


#: Refused headers on which the engine exits (the rest it misreads without
#: a word: a class 0 turns --oaa to count from 0, a cost without a
#: probability makes a --cb label a test label, ...; measured on vw 9.11).
EXITS = {"oaa": ["x", "1:2", "1.5", "2 1 1", "t1"], "recall_tree": ["4"], "cb": ["1:2:3:4"],
         "cb_explore": ["1:2:3:4"]}


@pytest.mark.parametrize("name", list(HEADERS))
def test_every_single_line_kind_refuses_what_vw_misreads_and_serves_the_rest(name, tmp_path):
    """Each kind's refused headers raise ValueError in predict and train
    (some end the engine when it reads them from a file, and --csoaa
    answers 'x' with a class it does not have); the accepted ones are
    answered as the engine answers them from a file."""
    kind = KINDS[name]
    refused, accepted = HEADERS[name]
    answer_lines = 2 if name.startswith("cb") else 1
    for header in EXITS.get(name, []):
        # (the wheel's driver may exit 0 once it holds all its input: no answers then)
        code, raw = _engine_answers([f"{header} |u a |i x", "|u a |i x"], kind.args, tmp_path)
        assert code != 0 or len(raw) < 2 * answer_lines, header
    if name == "csoaa":
        code, raw = _engine_answers(["x |u a |i x"], kind.args, tmp_path)
        assert code == 0 and _ints(raw)[0] not in (1, 2, 3)
    got = []
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), kind.args + ["--quiet"]) as model:
        for header in refused:
            with pytest.raises(ValueError, match=re.escape(f"has {header.split(' |')[0]!r} "
                                                           "before its first '|'")):
                list(model.predict(header, ["|i x"]))
            if header == refused[0]:  # (others may be a weight after the label)
                with pytest.raises(ValueError, match="training example #0 has"):
                    model.train(header, ["|i x"], [kind.label(0, 0)])
        for header in accepted:
            got += list(model.predict(header, ["|i x", "|i y"]))
    code, raw = _engine_answers([f"{header} {part}" for header in accepted
                                 for part in ("|i x", "|i y")], kind.args, tmp_path)
    assert code == 0 and got == kind.read(raw)


@pytest.mark.parametrize("client_kind", ALL_KINDS)
def test_a_label_of_an_item_part_is_checked_line_by_line(client_kind, tmp_path):
    """Without a '|' in the common part, each line's header holds its item
    part's label: a line whose label --oaa cannot read is refused, naming
    it, before its batch is sent; the other calls serve on."""
    args = ["--oaa", "3", "--quiet"]
    client = Client(client_kind, VowpalWabbitDummyFormatter(), args)
    try:
        with pytest.raises(ValueError, match=r"formatted example #1 has 'x' before its first"):
            client.predict("", ["2 |i x", "x |i y", "3 |i z"])
        with pytest.raises(ValueError, match=r"training example #1 has '2 x'"):
            client.train("", ["|i x", "x |i y"], [1, 2])
        got = client.predict("", ["2 |i x", "3 |i y", "|i z"])
        got += client.predict("'tag", ["|i x", "|i y"])  # a tag: no label word
    finally:
        client.close()
    code, raw = _engine_answers([" 2 |i x", " 3 |i y", " |i z", "'tag |i x", "'tag |i y"],
                                args, tmp_path)
    assert code == 0 and got == _ints(raw)


def test_write_only_training_refuses_a_misread_label_and_the_engine_learns_on(tmp_path):
    """A write-only process has no answers to notice an engine that exited:
    a common part with a label word --cb exits on is refused before it is
    sent, and the model saved at close is the one the good calls make."""
    kind = KINDS["cb"]
    path = tmp_path / "cb.vw"
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                             kind.args + ["--quiet", "-f", str(path)], write_only=True) as model:
        with pytest.raises(ValueError, match="training example #0 has '1:1.0:0.5 1:2:3:4'"):
            model.train("1:2:3:4 |u a", ["|i x"], [(1, 1.0, 0.5)])
        model.train("|u a", ["|i x"], [(1, 1.0, 0.5)])
    assert path.stat().st_size > 0


def test_a_weight_or_cost_written_with_a_plus_is_sent_and_read_as_written(tmp_path):
    """repr writes a weight of 1e16 as '1e+16' and vw reads it (by strtof)
    in full, as '+3' too: a training line whose label words are checked
    (here each item part has its tag) was refused as a weight vw misreads,
    and so was a common part '2 +3 |u a'. Both are sent now, and answered
    as the engine answers the same lines read from a file."""
    args = ["--oaa", "3"]
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), args + ["--quiet"]) as model:
        model.train("", ["'t |i x"], [2], [1e16])
        got = list(model.predict("2 +3 |u a", ["|i x"]))
        got += list(model.predict("", ["'t |i x"]))
    code, raw = _engine_answers(["2 1e+16  't |i x", "2 +3 |u a |i x", " 't |i x"],
                                args, tmp_path)
    assert code == 0 and got == _ints(raw)[1:]
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--csoaa", "3", "--quiet"]) as model:
        model.train("", ["'t |i x"], [{1: 1e20, 2: 0.0, 3: 1.0}])


@pytest.mark.parametrize("args, labels, weights, line, says", [
    (["--oaa", "3"], [1], [1e-200], "1 1e-200", b"weighted example sum = inf"),
    (["--loss_function", "logistic"], [1], [1e-200], "1 1e-200", b"weighted example sum = inf"),
    (["--loss_function", "logistic"], [1e-250], None, "1e-250", b"weighted label sum = 1000000"),
    (["--csoaa", "3"], [{1: 1e-200, 2: 0.0}], None, "1:1e-200 2:0.0", b"average loss = inf"),
])
def test_a_tiny_weight_or_cost_vw_would_read_as_another_number_is_refused(
        args, labels, weights, line, says):
    """vw reads '1e-200' as an infinity (its parser's power of ten wraps
    around 8 bits: 'weighted example sum = inf'). The label words of a
    training line were checked for it only when a formatter's text is in
    the header; with the default joining a weight of 1e-200 was sent and
    the engine learnt with an infinite weight. A ValueError now, before
    anything is sent; the engine serves on."""
    done = subprocess.run(default_engine_command() + args, input=f"{line} |u a\n".encode(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert says in done.stderr
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), args + ["--quiet"]) as model:
        with pytest.raises(ValueError, match="misreads"):
            model.train("|u a", ["|i x"], labels, weights)
        assert len(list(model.predict("|u a", ["|i x"]))) == 1

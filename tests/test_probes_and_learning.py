"""The lines subwabbit sends of its own teach a learning model nothing.

A client checks a new engine with probe examples, and save() marks the point
in the output stream with one. They are unlabelled, but some reductions of a
learning engine (no ``-t``) are moved by every example, or every line, they
read: ``--bootstrap`` and ``--active`` draw random numbers for each example,
``--stage_poly`` schedules its support updates by the count of lines read,
``--rank`` learns differently after an unlabelled example
(``--lrq`` and ``--lrqfa`` learn by its parity: a save must leave it as it
was, which the save tests check too). A model trained through
subwabbit must still be the model vw makes of the same training lines from a
file. Every check compares with the engine reading a file.
"""

import asyncio
from typing import Any, List

import pytest

from subwabbit import (AsyncVowpalWabbitProcess, VowpalWabbitError, VowpalWabbitProcess,
                       VowpalWabbitStartupError)

from conftest import ALL_KINDS, Client, DictFormatter, engine_from_file

FORMATTER = DictFormatter()


def request(index: int, size: int = 6) -> Any:
    common = {"user": index % 5, "ctx": [f"k{index % 3}"]}
    return common, [{"id": (index * 5 + offset) % 23} for offset in range(size)]


def _scalar(index: int, item: int) -> int:
    return 1 if (item + index) % 3 == 0 else -1


def _class(index: int, item: int) -> int:
    return (item + index // 7) % 3 + 1


def labels(args: List[str], index: int, size: int = 6) -> List[int]:
    label = _class if "--oaa" in args else _scalar
    return [label(index, item["id"]) for item in request(index, size)[1]]


def file_lines(args: List[str], index: int, size: int = 6, labelled: bool = True) -> List[str]:
    """A request's VW lines, written here without the library."""
    common, items = request(index, size)
    common_part = FORMATTER.format_common_features(common)
    texts = [f"{label} " for label in labels(args, index, size)] if labelled else [""] * size
    return [f"{text}{common_part} {FORMATTER.format_item_features(common, item)}"
            for text, item in zip(texts, items)]


TRAIN = range(40)
TEST = [(100, 7), (101, 1), (102, 12)]

#: Learning models that every extra example (or line) the engine reads moves.
MOVED = {
    "bootstrap": ["--bootstrap", "4"],
    "oaa-bootstrap": ["--oaa", "3", "--bootstrap", "3"],
    "stage_poly": ["--stage_poly", "--batch_sz", "8", "--sched_exponent", "0.5"],
    "active": ["--active", "--simulation", "--mellowness", "0.1"],
    # (an unlabelled example moved --rank's learning: 1.615906 instead of
    # vw's 1.635312 for the second line after a probe)
    "rank": ["--rank", "2", "-q", "ui"],
}


def first_token(raw: List[bytes]) -> List[Any]:
    return [float(line.split()[0]) for line in raw]


def expected(args: List[str], tmp_path: Any, train=TRAIN) -> List[Any]:
    """The TEST predictions of the engine that read the training lines, then
    the TEST lines, from a file."""
    lines = [line for index in train for line in file_lines(args, index)]
    test = [line for index, size in TEST for line in file_lines(args, index, size, False)]
    raw = engine_from_file(lines + test, args, tmp_path)
    return first_token(raw[-len(test):])


def train_all(client: Any, args: List[str], train=TRAIN) -> None:
    for index in train:
        client.train(*request(index), labels(args, index))


def predictions(client: Any) -> List[Any]:
    got = [client.predict(*request(index, size)) for index, size in TEST]
    return [float(value) for values in got for value in values]


def assert_same_models(args: List[str], online: Any, from_file: Any, tmp_path: Any) -> None:
    """The two model files predict the same on the test requests."""
    test = [line for index, size in TEST for line in file_lines(args, index, size, False)]
    got = engine_from_file(test, ["-i", str(online), "-t"], tmp_path)
    assert got == engine_from_file(test, ["-i", str(from_file), "-t"], tmp_path) and got


@pytest.mark.parametrize("client_kind", ALL_KINDS)
@pytest.mark.parametrize("name", list(MOVED))
def test_the_start_up_check_teaches_a_learning_model_nothing(name, client_kind, tmp_path):
    args = MOVED[name]
    want = expected(args, tmp_path)
    client = Client(client_kind, FORMATTER, args + ["--quiet"])
    try:
        train_all(client, args)
        assert predictions(client) == want
    finally:
        client.close()


@pytest.mark.parametrize("name", ["bootstrap", "stage_poly", "rank"])
def test_a_write_only_trainer_saves_the_model_the_file_trains(name, tmp_path):
    args = MOVED[name]
    with VowpalWabbitProcess(FORMATTER, args + ["--quiet"], write_only=True) as trainer:
        train_all(trainer, args)
        trainer.save(str(tmp_path / "online.vw"))
    lines = [line for index in TRAIN for line in file_lines(args, index)]
    engine_from_file(lines, args + ["-f", str(tmp_path / "file.vw")], tmp_path)
    assert_same_models(args, tmp_path / "online.vw", tmp_path / "file.vw", tmp_path)


@pytest.mark.parametrize("name", ["bootstrap", "stage_poly", "rank"])
def test_the_final_model_is_the_one_the_file_trains(name, tmp_path):
    args = MOVED[name]
    with VowpalWabbitProcess(FORMATTER, args + ["--quiet", "-f", str(tmp_path / "online.vw")]) \
            as trainer:
        train_all(trainer, args)
    lines = [line for index in TRAIN for line in file_lines(args, index)]
    engine_from_file(lines, args + ["-f", str(tmp_path / "file.vw")], tmp_path)
    assert_same_models(args, tmp_path / "online.vw", tmp_path / "file.vw", tmp_path)


#: Models whose learning a save() in the middle of training must not move
#: (--stage_poly counts the save command itself, as vw reading it from a file does).
SAVED_MID_WAY = {
    "bootstrap": ["--bootstrap", "4"],
    "active": ["--active", "--simulation", "--mellowness", "0.1"],
    "lrq": ["--lrq", "ui4"],
    "lrqfa": ["--lrqfa", "ui4"],
    "gd": [],
}


@pytest.mark.parametrize("client_kind", ["blocking", "asyncio"])
@pytest.mark.parametrize("name", list(SAVED_MID_WAY))
def test_saving_in_the_middle_of_training_teaches_the_model_nothing(name, client_kind, tmp_path):
    args = SAVED_MID_WAY[name]
    want = expected(args, tmp_path)
    client = Client(client_kind, FORMATTER, args + ["--quiet"])
    try:
        train_all(client, args, TRAIN[:20])
        if client_kind == "asyncio":
            client.loop.run_until_complete(client.model.save(str(tmp_path / "half.vw")))
        else:
            client.model.save(str(tmp_path / "half.vw"))
        train_all(client, args, TRAIN[20:])
        assert predictions(client) == want
    finally:
        client.close()
    # and the saved model is the one the file's first half trains
    lines = [line for index in TRAIN[:20] for line in file_lines(args, index)]
    engine_from_file(lines, args + ["-f", str(tmp_path / "file.vw")], tmp_path)
    test = [line for index, size in TEST for line in file_lines(args, index, size, False)]
    if name != "active":  # vw 9 cannot load an --active model it saved
        online = engine_from_file(test, ["-i", str(tmp_path / "half.vw"), "-t"], tmp_path)
        assert online == engine_from_file(test, ["-i", str(tmp_path / "file.vw"), "-t"],
                                          tmp_path)


def test_a_save_after_an_abandoned_predict_reads_its_answers_first(tmp_path):
    """No probe follows the save command: the answers still owed to an
    earlier call are read (and dropped) while the save is awaited, so an
    engine blocked writing them reaches the save."""
    args = ["--bootstrap", "4", "--quiet"]
    with VowpalWabbitProcess(FORMATTER, args, batch_size=64) as model:
        common, _ = request(1)
        items = [{"id": index % 23} for index in range(30000)]
        iterator = model.predict(common, items)
        next(iterator)
        del iterator
        model.save(str(tmp_path / "m.vw"))
        assert (tmp_path / "m.vw").stat().st_size > 0
        assert len(list(model.predict(*request(3)))) == 6


def test_a_reload_to_such_a_model_starts_it_without_probes(tmp_path):
    args = MOVED["bootstrap"]
    want = expected(args, tmp_path)
    with VowpalWabbitProcess(FORMATTER, ["--quiet"]) as model:
        model.reload(args + ["--quiet"])
        train_all(model, args)
        got = [list(model.predict(*request(index, size))) for index, size in TEST]
    assert [float(value) for values in got for value in values] == want


@pytest.mark.parametrize("client_kind", ["blocking", "asyncio"])
def test_an_engine_that_fails_to_start_still_fails_at_start_up(client_kind):
    with pytest.raises(VowpalWabbitStartupError):
        if client_kind == "asyncio":
            async def start():
                model = AsyncVowpalWabbitProcess(FORMATTER, ["--bootstrap", "4", "--no_such",
                                                             "--quiet"])
                try:
                    await model.start()
                finally:
                    await model.close()
            asyncio.run(start())
        else:
            VowpalWabbitProcess(FORMATTER, ["--stage_poly", "--no_such", "--quiet"])


def test_which_arguments_keep_the_engine_from_probes():
    from subwabbit.core.kinds import probes_would_teach  # pylint: disable=import-outside-toplevel

    assert probes_would_teach(["--bootstrap", "4"], []) == "--bootstrap"
    assert probes_would_teach(["--stage_poly", "--quiet"], []) == "--stage_poly"
    assert probes_would_teach(["--active", "--simulation"], []) == "--active"
    assert probes_would_teach(["--lrq=ui4"], []) is None  # a probe's two lines keep the parity
    assert probes_would_teach(["--active_cover"], []) is None
    assert probes_would_teach(["-i", "m.vw"], ["--bootstrap", "4"]) == "--bootstrap"
    # an engine that does not learn is probed as any other
    assert probes_would_teach(["--bootstrap", "4", "-t"], []) is None
    assert probes_would_teach(["-i", "m.vw", "--testonly"], ["--stage_poly"]) is None
    assert probes_would_teach(["--oaa", "3", "--nn", "3", "--dropout"], []) is None
    assert probes_would_teach(["--cb_explore_adf", "--bag", "3"], []) is None
    assert probes_would_teach(["--passes", "3", "-c", "-k"], []) == "--passes"
    assert probes_would_teach(["--passes=2", "-c", "-k"], []) == "--passes"
    assert probes_would_teach(["--passes", "1"], []) is None
    assert probes_would_teach(["--passes", "3", "-t"], []) is None


class BomFormatter(DictFormatter):
    """Starts every example with a byte order mark, which vw drops where a line starts."""

    def get_formatted_example(self, common_features, item_features, label=None, weight=None,
                              debug_info=None):
        return "\ufeff" + super().get_formatted_example(common_features, item_features,
                                                        label=label, weight=weight,
                                                        debug_info=debug_info)


@pytest.mark.parametrize("client_kind", ALL_KINDS)
@pytest.mark.parametrize("name", ["stage_poly", "active"])
def test_a_first_line_that_starts_with_a_byte_order_mark_keeps_its_label(name, client_kind,
                                                                          tmp_path):
    """The start-up blank continues the first line sent: vw drops a byte
    order mark only where a line starts, so after the blank the mark stayed,
    the first label became '\\ufeff10', 'not a good float', and was read as 0."""
    args = MOVED[name]
    formatter = BomFormatter()
    common, items = request(1)
    train_labels = [10, 1, 1, -1, 1, 1]
    lines = [formatter.get_formatted_example(FORMATTER.format_common_features(common),
                                             FORMATTER.format_item_features(common, item),
                                             label=label)
             for item, label in zip(items, train_labels)]
    test = [line for index, size in TEST for line in file_lines(args, index, size, False)]
    want = first_token(engine_from_file(lines + test, args, tmp_path)[-len(test):])
    client = Client(client_kind, formatter, args + ["--quiet"])
    try:
        client.train(common, items, train_labels)
        assert predictions(client) == want
    finally:
        client.close()


@pytest.mark.parametrize("name", ["bootstrap", "stage_poly", "rank"])
def test_a_write_only_trainers_first_line_with_a_byte_order_mark_keeps_its_label(name, tmp_path):
    args = MOVED[name]
    formatter = BomFormatter()
    common, items = request(1)
    train_labels = [10, 1, 1, -1, 1, 1]
    with VowpalWabbitProcess(formatter, args + ["--quiet"], write_only=True) as trainer:
        trainer.train(common, items, train_labels)
        trainer.save(str(tmp_path / "online.vw"))
    lines = [formatter.get_formatted_example(FORMATTER.format_common_features(common),
                                             FORMATTER.format_item_features(common, item),
                                             label=label)
             for item, label in zip(items, train_labels)]
    engine_from_file(lines, args + ["-f", str(tmp_path / "file.vw")], tmp_path)
    assert_same_models(args, tmp_path / "online.vw", tmp_path / "file.vw", tmp_path)


#: the arguments of a model of several passes (with the cache it needs, made anew)
PASSES_ARGS = ["--passes", "3", "-k"]


def _client_of_passes(client_kind, tmp_path):
    """A client (``'write-only'``: a write-only blocking process) training a
    model of several passes into ``tmp_path/online.vw``: the arguments, that
    path and the client."""
    online = tmp_path / "online.vw"
    own = PASSES_ARGS + ["--cache_file", str(tmp_path / "online.cache"), "-f", str(online),
                         "--quiet"]
    if client_kind == "write-only":
        return PASSES_ARGS, online, Client("blocking", FORMATTER, own, write_only=True)
    return PASSES_ARGS, online, Client(client_kind, FORMATTER, own)


def _assert_the_files_model(args, online, tmp_path):
    """The model at ``online`` is the one vw trains with ``args`` on the
    training lines read from a file."""
    lines = [line for index in TRAIN for line in file_lines(args, index)]
    engine_from_file(lines, args + ["--cache_file", str(tmp_path / "file.cache"),
                                    "-f", str(tmp_path / "file.vw")], tmp_path)
    assert_same_models(args, online, tmp_path / "file.vw", tmp_path)


@pytest.mark.parametrize("client_kind", ["write-only"] + ALL_KINDS)
def test_a_model_of_several_passes_is_the_one_the_file_trains(client_kind, tmp_path):
    """With ``--passes`` above 1 vw caches every line it reads and learns
    from them again after its input ends, every 10th example held out: the
    start-up probe was cached as the first example, which shifted the
    held-out examples, and the model differed from vw's on the same lines."""
    args, online, client = _client_of_passes(client_kind, tmp_path)
    try:
        train_all(client, args)
    finally:
        client.close()
    _assert_the_files_model(args, online, tmp_path)


@pytest.mark.parametrize("client_kind", ["write-only", "blocking", "asyncio"])
def test_a_model_of_several_passes_refuses_save_and_keeps_its_training(client_kind, tmp_path):
    """vw caches a save command with the examples: with ``--passes`` above 1
    it saved again in every later pass (the temporary file it rewrote after
    the save had renamed it stayed beside the model) and counted the command
    among the examples it holds out from, so the model moved. save() is
    refused before anything is sent."""
    args, online, client = _client_of_passes(client_kind, tmp_path)
    saves = tmp_path / "saves"
    try:
        train_all(client, args, TRAIN[:20])
        with pytest.raises(VowpalWabbitError, match="--passes"):
            if client.loop is not None:
                client.loop.run_until_complete(client.model.save(str(saves / "half.vw")))
            else:
                client.model.save(str(saves / "half.vw"))
        train_all(client, args, TRAIN[20:])
    finally:
        client.close()
    assert not saves.exists() or not list(saves.iterdir())
    _assert_the_files_model(args, online, tmp_path)



@pytest.mark.parametrize("client_kind", ["write-only"] + ALL_KINDS + ["pool"])
@pytest.mark.parametrize("cache", [["-c"], ["--cache_file", "old.cache"]], ids=["-c", "cache_file"])
def test_a_cache_file_without_kill_cache_is_refused_before_an_engine_starts(
        cache, client_kind, tmp_path, monkeypatch):
    """vw reads the examples of an existing cache file instead of stdin: an
    engine given one that an earlier run left learned those old examples
    (and wrote them as its -f model) and none that train() sent; subwabbit
    saw it exit at start-up ("the vw engine exited during start-up", exit
    code 0), or wait for it to read stdin until ``startup_timeout_s``."""
    monkeypatch.chdir(tmp_path)
    args = ["--quiet"]
    old = [line for index in TRAIN[:10] for line in file_lines(args, index)]
    engine_from_file(old, ["--cache_file", "old.cache"], tmp_path)  # left by an earlier run
    kwargs = {"write_only": True} if client_kind == "write-only" else {}
    if client_kind == "pool":
        kwargs["size"] = 1
    with pytest.raises(ValueError, match="--kill_cache"):
        client = Client("blocking" if client_kind == "write-only" else client_kind, FORMATTER,
                        args + cache, **kwargs)
        client.close()
    # with --kill_cache the engine learns what it is sent
    online = tmp_path / "online.vw"
    client = Client("blocking", FORMATTER, args + cache + ["-k", "-f", str(online)],
                    write_only=True)
    try:
        train_all(client, args, TRAIN[10:])
    finally:
        client.close()
    lines = [line for index in TRAIN[10:] for line in file_lines(args, index)]
    engine_from_file(lines, args + ["-f", str(tmp_path / "file.vw")], tmp_path)
    assert_same_models(args, online, tmp_path / "file.vw", tmp_path)

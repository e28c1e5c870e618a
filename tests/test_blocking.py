"""VowpalWabbitProcess against the real engine."""

import gc
import math
import os
import signal
import threading
import time
import warnings

import pytest

from subwabbit import (VowpalWabbitDummyFormatter, VowpalWabbitError,
                       VowpalWabbitNonBlockingProcess, VowpalWabbitProcess, VowpalWabbitStartupError)

from subwabbit.core.exchanges import PredictExchange

from conftest import (children_of_this_process, engine_from_file, expected_scalars, format_lines,
                      items, open_fds, scoring_args)

COMMON = {"user": 3, "ctx": ["k1", "k2"]}


@pytest.fixture
def model(formatter, trained_model):
    with VowpalWabbitProcess(formatter, scoring_args(trained_model), batch_size=7) as process:
        yield process


@pytest.mark.parametrize("count", [0, 1, 6, 7, 8, 14, 15, 250])
def test_predictions_equal_engine_reading_a_file(formatter, trained_model, tmp_path, model, count):
    expected = expected_scalars(format_lines(formatter, COMMON, items(count)),
                                scoring_args(trained_model), tmp_path)
    assert list(model.predict(COMMON, items(count))) == expected
    assert len(expected) == count


@pytest.mark.parametrize("batch_size", [1, 2, 50, 1000])
def test_batch_size_does_not_change_predictions(formatter, trained_model, tmp_path, batch_size):
    expected = expected_scalars(format_lines(formatter, COMMON, items(120)),
                                scoring_args(trained_model), tmp_path)
    with VowpalWabbitProcess(formatter, scoring_args(trained_model),
                             batch_size=batch_size) as process:
        assert list(process.predict(COMMON, iter(items(120)))) == expected


def test_abandoned_iterator_does_not_shift_next_call(formatter, trained_model, tmp_path, model):
    expected = expected_scalars(format_lines(formatter, COMMON, items(40, start=5)),
                                scoring_args(trained_model), tmp_path)
    predictions = model.predict(COMMON, items(100))
    for _ in range(3):
        next(predictions)
    assert model.pending_lines > 0
    del predictions
    gc.collect()
    assert list(model.predict(COMMON, items(40, start=5))) == expected
    # an iterator abandoned with break, then one that raised in the caller
    for prediction in model.predict(COMMON, items(100)):
        break
    with pytest.raises(RuntimeError):
        for prediction in model.predict(COMMON, items(100)):
            raise RuntimeError("caller failed")
    assert list(model.predict(COMMON, items(40, start=5))) == expected
    assert model.pending_lines == 0


def test_superseded_iterator_raises_instead_of_stealing(model):
    first = model.predict(COMMON, items(100))
    next(first)
    second = list(model.predict(COMMON, items(30)))
    assert len(second) == 30
    with pytest.raises(VowpalWabbitError, match="superseded"):
        list(first)


def test_timeout_stops_formatting_new_items(formatter, trained_model):
    class SlowFormatter(type(formatter)):
        def format_item_features(self, common_features, item_features, debug_info=None):
            time.sleep(0.002)
            return super().format_item_features(common_features, item_features, debug_info)

    with VowpalWabbitProcess(SlowFormatter(), scoring_args(trained_model), batch_size=5) as process:
        started = time.perf_counter()
        predictions = list(process.predict(COMMON, items(1000), timeout=0.05))
        elapsed = time.perf_counter() - started
        assert 5 <= len(predictions) < 1000
        assert elapsed < 1.0
        assert list(process.predict(COMMON, items(3), timeout=0)) == []
        assert len(list(process.predict(COMMON, items(3)))) == 3


def test_a_deadline_gives_the_engines_predictions_for_a_prefix_of_the_items(formatter,
                                                                           trained_model, tmp_path):
    # However deep the pipe was when the deadline came, the call's predictions
    # are the engine's, in item order, and nothing is left in flight.
    many = items(20000)
    expected = expected_scalars(format_lines(formatter, COMMON, many),
                                scoring_args(trained_model), tmp_path)
    with VowpalWabbitProcess(formatter, scoring_args(trained_model), batch_size=7) as process:
        for timeout in (0.002, 0.005, 0.02):
            got = list(process.predict(COMMON, many, timeout=timeout))
            assert len(got) < len(many)
            assert got == expected[:len(got)]
            assert process.pending_lines == 0


def test_up_to_four_batches_in_flight_while_the_deadline_is_far(formatter, trained_model,
                                                                monkeypatch):
    # With the engine stopped, a call fills the pipe up to its limit and waits:
    # four batches without a deadline; with one, until its first answers,
    # one batch more than it keeps at the deadline (two).
    in_flight = []
    produce = PredictExchange._produce

    def spy(self, want):
        produce(self, want)
        in_flight.append(self.channel.in_flight_lines)

    monkeypatch.setattr(PredictExchange, "_produce", spy)
    with VowpalWabbitProcess(formatter, scoring_args(trained_model), batch_size=7) as process:
        pacing = process._pacing()  # pylint: disable=protected-access
        assert (pacing.batch_size, pacing.min_batch, pacing.max_in_flight_lines,
                pacing.lines_at_deadline) == (7, 7, 4 * 7, 7)
        list(process.predict(COMMON, items(3)))  # the engine is up and answering
        for timeout, limit in ((None, 28), (2.0, 14)):
            in_flight.clear()
            got, failed = [], []

            def call():
                try:
                    got.extend(process.predict(COMMON, items(300), timeout=timeout))
                except Exception as exc:  # pylint: disable=broad-except
                    failed.append(exc)

            os.kill(process.pid, signal.SIGSTOP)
            try:
                caller = threading.Thread(target=call)
                caller.start()
                waited = time.monotonic() + 5
                while not (in_flight and in_flight[-1] >= limit) and time.monotonic() < waited:
                    time.sleep(0.01)
                time.sleep(0.1)  # no more is sent while the engine answers nothing
                assert in_flight and max(in_flight) == in_flight[-1] == limit
            finally:
                os.kill(process.pid, signal.SIGCONT)
            caller.join(10)
            assert not caller.is_alive() and not failed
            assert len(got) == 300  # 300 items take far less than the rest of 2 s


def test_an_infinite_timeout_is_no_limit(formatter, trained_model, tmp_path):
    expected = expected_scalars(format_lines(formatter, COMMON, items(2000)),
                                scoring_args(trained_model), tmp_path)
    with VowpalWabbitProcess(formatter, scoring_args(trained_model), batch_size=7) as process:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a long budget is warned about once per process
            assert list(process.predict(COMMON, items(2000), timeout=math.inf)) == expected


def test_bad_lines_raise_before_sending_and_process_stays_usable(formatter, trained_model, tmp_path,
                                                                 model):
    expected = expected_scalars(format_lines(formatter, COMMON, items(10)),
                                scoring_args(trained_model), tmp_path)
    dummy = VowpalWabbitProcess(VowpalWabbitDummyFormatter(), scoring_args(trained_model))
    with dummy:
        for bad in ["|i a\n|i b", "|i a\r", "save_x|", "1 save_/tmp/m.vw|"]:
            with pytest.raises(ValueError):
                list(dummy.predict("", ["|i ok", bad]))
        with pytest.raises(ValueError, match="common"):
            list(dummy.predict("|u a\n", ["|i ok"]))
        assert len(list(dummy.predict("", ["|i ok", "|i ok2"]))) == 2
    assert list(model.predict(COMMON, items(10))) == expected


@pytest.mark.parametrize("cls", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess])
@pytest.mark.parametrize("vw_args, line", [
    (["--noconstant"], "1 'saved_item |i a"),     # one namespace left: vw saves, answers nothing
    (["--ignore", "i"], "'saved|i a"),            # no namespace left once i is ignored
])
def test_a_tag_vw_may_take_as_save_command_is_refused(cls, vw_args, line, tmp_path):
    args = ["--quiet"] + vw_args
    # The premise: vw really answers nothing to this example.
    assert engine_from_file([line, "|i b"], args, tmp_path) == [b"0"]
    with cls(VowpalWabbitDummyFormatter(), args) as process:
        with pytest.raises(ValueError, match="tag starting with 'save'"):
            list(process.predict("", ["|i ok", line]))
        assert list(process.predict("", ["|i b", "|i c"])) == [0.0, 0.0]


@pytest.mark.parametrize("cls", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess])
def test_predict_lines_checked_from_their_parts_are_refused_or_sent_as_they_should(cls, tmp_path):
    """With the default joining a common part that holds a '|' vouches for
    every line's header, and each batch is checked from its parts alone."""
    with cls(VowpalWabbitDummyFormatter(), ["--quiet"], batch_size=2) as process:
        with pytest.raises(ValueError, match="#3 contains a line break"):
            list(process.predict("|b y", ["|a x", "|a y", "|a z", "|a w\r1 |a x"]))
        with pytest.raises(ValueError, match="#1 has a tag starting with 'save'"):
            list(process.predict("", ["|a x", "save_x|a y"]))  # no '|' in the common part
        with pytest.raises(ValueError, match="#0 has a tag starting with 'save'"):
            list(process.predict("'saved |b y", ["|a x"]))
        # After the refusals the process still gives each line its own answer.
        lines = ["|b y save_x|a x", "|b y |a saved", "|b y |a x"]
        assert list(process.predict("|b y", ["save_x|a x", "|a saved", "|a x"])) == [
            float(answer) for answer in engine_from_file(lines, ["--quiet"], tmp_path)]


@pytest.mark.parametrize("cls", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess])
def test_a_save_command_in_the_common_part_is_refused_byte_order_mark_or_not(cls, tmp_path):
    # The premise: vw drops a byte order mark that starts a line, then takes
    # the line for its save command and answers nothing.
    assert engine_from_file(["\ufeffsave|", "|i b"], ["--quiet"], tmp_path) == [b"0"]
    with cls(VowpalWabbitDummyFormatter(), ["--quiet"]) as process:
        for common in ["\ufeffsave|", "save|", "\ufeff'save_x |u a"]:
            with pytest.raises(ValueError, match="#0 has a tag starting with 'save'"):
                list(process.predict(common, ["|a x", "|a y"]))
        assert list(process.predict("|u a", ["|a x", "|a y"])) == [0.0, 0.0]


@pytest.mark.parametrize("cls", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess])
def test_a_save_that_cannot_be_written_raises_before_the_engine_is_asked(cls, tmp_path):
    """vw's own driver aborts on a save it cannot write; the client finds out first."""
    with cls(VowpalWabbitDummyFormatter(), ["--quiet"]) as process:
        before = list(process.predict("", ["|a x"]))
        pid = process.pid
        for path in ["/proc/m.vw", "/proc/no-such-dir/m.vw"]:
            with pytest.raises(OSError):
                process.save(path)
        (tmp_path / "blocked").write_text("a file, not a directory")
        with pytest.raises(OSError):
            process.save(str(tmp_path / "blocked" / "m.vw"))
        assert process.pid == pid and list(process.predict("", ["|a x"])) == before
        process.save(str(tmp_path / "ok" / "m.vw"))
        assert (tmp_path / "ok" / "m.vw").stat().st_size > 0
        assert [path.name for path in (tmp_path / "ok").iterdir()] == ["m.vw"]


def test_empty_formatted_line_is_rejected(trained_model):
    class Joiner(VowpalWabbitDummyFormatter):
        def get_formatted_example(self, common_line_part, item_line_part, label=None,
                                  weight=None, debug_info=None):
            return item_line_part

    with VowpalWabbitProcess(Joiner(), scoring_args(trained_model)) as process:
        with pytest.raises(ValueError, match="empty"):
            list(process.predict("", ["|i a", ""]))
        assert len(list(process.predict("", ["|i a", " "]))) == 2


def test_write_only_train_and_save(formatter, tmp_path):
    lines = []
    requests = []
    for request in range(20):
        common = {"user": request % 5, "ctx": ["k"]}
        its = items(8, start=request)
        labels = [1 if (item["id"] + request) % 2 else -1 for item in its]
        requests.append((common, its, labels))
        lines += format_lines(formatter, common, its, labels)
    args = ["--loss_function", "logistic", "-q", "ui", "--quiet"]
    with VowpalWabbitProcess(formatter, args, write_only=True) as trainer:
        predictions = trainer.predict(COMMON, items(3))  # raises at the first next(), as in 2.x
        with pytest.raises(VowpalWabbitError, match="write-only"):
            next(predictions)
        for common, its, labels in requests:
            trainer.train(common, its, labels, [None] * len(its))
        trainer.save(str(tmp_path / "online" / "model.vw"))
    # The engine trained on the same lines from a file predicts the same.
    reference = tmp_path / "reference.vw"
    expected_scalars(lines, args + ["-f", str(reference)], tmp_path)
    probe = format_lines(formatter, COMMON, items(30))
    assert (expected_scalars(probe, ["-i", str(tmp_path / "online" / "model.vw"), "-t"], tmp_path)
            == expected_scalars(probe, ["-i", str(reference), "-t"], tmp_path))


@pytest.mark.parametrize("write_only", [True, False])
@pytest.mark.parametrize("reduction", ["--lrq", "--lrqfa"])
def test_a_save_between_trainings_leaves_what_lrq_learns_as_it_was(reduction, write_only,
                                                                   tmp_path):
    # lrq learns by the parity of the lines vw reads, and a save added one
    # (the save command; a save's probe is two): every later update changed,
    # and the model differed from the engine's trained on the same lines
    # (found by a review).
    args = ["--quiet", reduction, "ab2"]
    parts = [f"|b y{index % 5} z{index % 7}" for index in range(40)]
    labels = [1 if index % 3 else -1 for index in range(40)]
    final = tmp_path / "final.vw"
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), args + ["-f", str(final)],
                             write_only=write_only) as trainer:
        trainer.train("|a x", parts[:19], labels[:19], [None] * 19)
        trainer.save(str(tmp_path / "middle.vw"))
        trainer.train("|a x", parts[19:], labels[19:], [None] * 21)
    reference = tmp_path / "reference.vw"
    expected_scalars([f"{label} |a x {part}" for part, label in zip(parts, labels)],
                     args + ["-f", str(reference)], tmp_path)
    probe = [f"|a x {part}" for part in parts[:8]]
    assert (expected_scalars(probe, ["-i", str(final), "-t", "--quiet"], tmp_path)
            == expected_scalars(probe, ["-i", str(reference), "-t", "--quiet"], tmp_path))
    middle = expected_scalars(probe, ["-i", str(tmp_path / "middle.vw"), "-t", "--quiet"],
                              tmp_path)
    assert middle != expected_scalars(probe, ["-i", str(final), "-t", "--quiet"], tmp_path)


def test_lrq_saved_in_the_model_file_counts_too(tmp_path):
    # The reduction may come from the model file (-i) rather than the arguments.
    parts = [f"|b y{index % 5} z{index % 7}" for index in range(30)]
    labels = [1 if index % 3 else -1 for index in range(30)]
    lines = [f"{label} |a x {part}" for part, label in zip(parts, labels)]
    first = tmp_path / "first.vw"
    expected_scalars(lines[:10], ["--quiet", "--lrq", "ab2", "-f", str(first)], tmp_path)
    final = tmp_path / "final.vw"
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(),
                             ["--quiet", "-i", str(first), "-f", str(final)],
                             write_only=True) as trainer:
        trainer.train("|a x", parts[10:19], labels[10:19], [None] * 9)
        trainer.save(str(tmp_path / "middle.vw"))
        trainer.train("|a x", parts[19:], labels[19:], [None] * 11)
    reference = tmp_path / "reference.vw"
    expected_scalars(lines[10:], ["--quiet", "-i", str(first), "-f", str(reference)], tmp_path)
    probe = [f"|a x {part}" for part in parts[:8]]
    assert (expected_scalars(probe, ["-i", str(final), "-t", "--quiet"], tmp_path)
            == expected_scalars(probe, ["-i", str(reference), "-t", "--quiet"], tmp_path))


def test_train_then_predict_on_one_process_matches_engine(formatter, tmp_path):
    args = ["--loss_function", "logistic", "-q", "ui", "--quiet"]
    train_lines = format_lines(formatter, COMMON, items(30), [1, -1, -1] * 10)
    test_lines = format_lines(formatter, COMMON, items(30, start=3))
    expected = expected_scalars(train_lines + test_lines, args, tmp_path)[30:]
    with VowpalWabbitProcess(formatter, args, batch_size=4) as process:
        process.train(COMMON, items(30), [1, -1, -1] * 10, [None] * 30)
        assert list(process.predict(COMMON, items(30, start=3))) == expected


def test_train_checks_everything_before_sending(formatter, tmp_path):
    args = ["--quiet"]
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), args) as process:
        before = list(process.predict("", ["|a x"]))
        with pytest.raises(ValueError, match="differ in length"):
            process.train("", ["|a x", "|a y"], [1], [None, None])
        with pytest.raises(ValueError, match="finite"):
            process.train("", ["|a x"], [float("nan")], [None])
        with pytest.raises(ValueError, match="line break"):
            process.train("", ["|a x", "|a y\n1 |a x"], [1, 1], [None, None])
        with pytest.raises(ValueError, match="negative"):
            process.train("", ["|a x"], [1], [-1.0])
        # lines of the default joining checked from their parts (plain labels)
        with pytest.raises(ValueError, match="#1 contains a line break"):
            process.train("|b y", ["|a x", "|a y\r"], [1, 1])
        with pytest.raises(ValueError, match="#1 has a tag starting with 'save'"):
            process.train("", ["|a x", "save_x|a y"], [1, 1])  # no '|' in the common part
        with pytest.raises(ValueError, match="#0 has a tag starting with 'save'"):
            process.train("'saved |b y", ["|a x"], [1])
        assert list(process.predict("", ["|a x"])) == before
        process.train("|b y", ["save_x|a x"], [1])  # a feature, not a tag: learnt
        assert list(process.predict("", ["|a x"])) != before


def test_save_does_not_disturb_predictions(formatter, trained_model, tmp_path):
    # Saved without -t: vw drops the learning state when a -t process saves,
    # which changes its predictions (the engine's own `-t -f` does the same).
    args = ["-i", trained_model, "--quiet", "--link", "logistic"]
    expected = expected_scalars(format_lines(formatter, COMMON, items(20)), args, tmp_path)
    with VowpalWabbitProcess(formatter, args, batch_size=7) as model:
        first = model.predict(COMMON, items(20))
        next(first)
        model.save(str(tmp_path / "copy.vw"))
        assert list(model.predict(COMMON, items(20))) == expected
    assert expected_scalars(format_lines(formatter, COMMON, items(20)),
                            ["-i", str(tmp_path / "copy.vw"), "--link", "logistic"],
                            tmp_path) == expected
    assert [name for name in os.listdir(tmp_path) if name.startswith(".")] == []


def test_explain_vw_line_three_lines_per_example(formatter, trained_model, tmp_path):
    lines = format_lines(formatter, COMMON, items(5))
    raw = expected_scalars(lines, ["-i", trained_model, "-t"], tmp_path)
    with VowpalWabbitProcess(formatter, ["-i", trained_model, "-t", "--quiet", "--link", "logistic"],
                             audit_mode=True) as auditor:
        with pytest.raises(VowpalWabbitError, match="audit"):
            list(auditor.predict(COMMON, items(2)))
        for _ in range(2):
            for line, expected_raw in zip(lines, raw):
                score, explanation = auditor.explain_vw_line(line, link_function=True)
                assert score == expected_raw
                parsed = formatter.get_human_readable_explanation(explanation)
                names = {row["original_feature_name"] for row in parsed}
                assert any("*" in name for name in names)  # the quadratic interaction
                assert "Constant" in names
    with VowpalWabbitProcess(formatter, scoring_args(trained_model)) as plain:
        with pytest.raises(VowpalWabbitError, match="audit_mode"):
            plain.explain_vw_line(lines[0])


def test_metrics_hook_and_debug_info(formatter, trained_model):
    seen = []
    with VowpalWabbitProcess(formatter, scoring_args(trained_model), batch_size=4,
                             metrics_hook=seen.append) as process:
        metrics, detailed = {}, {}
        debug = {"request": 1}
        assert len(list(process.predict(COMMON, items(10), debug_info=debug, metrics=metrics,
                                        detailed_metrics=detailed))) == 10
        assert metrics["num_lines"] == 10
        assert 0 <= metrics["prepare_time"] <= metrics["total_time"]
        assert seen[-1] is metrics and metrics["method"] == "predict"
        for key in ("generating_lines_time", "sending_lines_time", "receiving_lines_time"):
            assert detailed[key] and all(len(entry) == 2 for entry in detailed[key])
        assert formatter.debug_infos and all(info is debug for info in formatter.debug_infos)
        for _ in process.predict(COMMON, items(10)):
            break
        assert seen[-1]["num_lines"] == 1
        process.train(COMMON, items(3), [1, 0, 1], [None] * 3)
        assert seen[-1]["method"] == "train" and seen[-1]["num_lines"] == 3


def test_hook_errors_do_not_break_calls(formatter, trained_model):
    def broken_hook(metrics):
        raise RuntimeError("monitoring is down")

    with VowpalWabbitProcess(formatter, scoring_args(trained_model),
                             metrics_hook=broken_hook) as process:
        assert len(list(process.predict(COMMON, items(5)))) == 5


def test_invalid_arguments_raise_with_engine_message(formatter):
    started = time.perf_counter()
    with pytest.raises(VowpalWabbitStartupError, match="unrecognised option") as info:
        VowpalWabbitProcess(formatter, ["--no_such_option"])
    assert time.perf_counter() - started < 10
    assert info.value.returncode == 1
    with pytest.raises(VowpalWabbitStartupError, match="can't open|No such file|not found"):
        VowpalWabbitProcess(formatter, ["-i", "/nonexistent/model.vw"])
    with pytest.raises(VowpalWabbitStartupError, match="unrecognised option"):
        VowpalWabbitProcess(formatter, ["--no_such_option"], write_only=True)
    with pytest.raises(VowpalWabbitStartupError, match="cannot run"):
        VowpalWabbitProcess(formatter, [], vw_command="/nonexistent/vw")
    with pytest.raises(ValueError, match="-p"):
        VowpalWabbitProcess(formatter, ["-p", "/tmp/predictions.txt"])


def test_close_is_idempotent_and_reaps(formatter, trained_model):
    process = VowpalWabbitProcess(formatter, scoring_args(trained_model))
    pid = process.pid
    assert pid in children_of_this_process()
    process.close()
    process.close()
    assert pid not in children_of_this_process()
    assert "closed" in repr(process) and "exited with code 0" in repr(process)
    with pytest.raises(VowpalWabbitError, match="closed"):
        list(process.predict(COMMON, items(1)))


def test_dropped_process_is_reaped_without_leaks(formatter, trained_model):
    fds_before = open_fds()
    pids = []
    with pytest.warns(ResourceWarning):
        for _ in range(3):
            process = VowpalWabbitProcess(formatter, scoring_args(trained_model))
            pids.append(process.pid)
            list(process.predict(COMMON, items(5)))
            del process
            gc.collect()
    deadline = time.monotonic() + 10
    while any(pid in children_of_this_process() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid in children_of_this_process() for pid in pids)
    gc.collect()
    assert open_fds() <= fds_before


def test_max_lateness_bounds_a_call_on_a_stalled_engine_and_the_next_call_is_exact(
        formatter, trained_model, tmp_path):
    expected = expected_scalars(format_lines(formatter, COMMON, items(40)),
                                scoring_args(trained_model), tmp_path)
    with VowpalWabbitProcess(formatter, scoring_args(trained_model), max_lateness_s=0.05,
                             io_timeout_s=5.0) as process:
        os.kill(process.pid, signal.SIGSTOP)
        try:
            began = time.perf_counter()
            got = list(process.predict(COMMON, items(500), timeout=0.02))
            elapsed = time.perf_counter() - began
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert got == [] and 0.02 + 0.05 <= elapsed < 0.02 + 0.05 + 0.1
        assert list(process.predict(COMMON, items(40))) == expected
    with pytest.raises(ValueError):
        VowpalWabbitProcess(formatter, ["--quiet"], max_lateness_s=-1)


@pytest.mark.parametrize("args", [["--quiet"], ["--oaa", "3", "--quiet"]])
@pytest.mark.parametrize("common", ["\t|u a", "x\t|u a"])
def test_a_tab_that_would_drop_the_label_is_refused_before_sending(args, common):
    # vw drops everything before a tab in the header: "2 \t|u a |i b" trained
    # nothing, without a word (found by a review).
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), args) as process:
        before = list(process.predict("|u a", ["|i b"]))
        with pytest.raises(ValueError, match="tab before its first '|'"):
            process.train(common, ["|i b"], [2])
        assert list(process.predict(common, ["|i b"])) == before  # predict loses only a tag
        assert list(process.predict("|u a", ["|i b"])) == before
        process.train("|u\ta", ["|i b"] * 5, [2] * 5)  # a tab after the '|' separates features
        assert list(process.predict("|u a", ["|i b"])) != before


def test_a_tab_that_would_drop_shared_is_refused_and_a_leading_tab_is_fine():
    # "shared \t|u a" became an item line: the engine answered one action too
    # many, and the client failed on the protocol error.
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--cb_explore_adf", "--quiet"]) \
            as process:
        process.train("|u a", ["|i b", "|i c"], [(1.0, 0.5), None])
        before = list(process.predict("|u a", ["|i b", "|i c"]))
        for common, items in [("x\t|u a", ["|i b", "|i c"]), ("\t|u a", ["|i b", "|i c"]),
                              ("|u a", ["|i b", "0:1:0.5\t|i c"])]:
            with pytest.raises(ValueError, match="tab before its first '|'"):
                process.predict(common, items).__next__()
        assert list(process.predict("|u a", ["\t|i b", "|i c"])) == before

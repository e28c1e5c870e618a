"""Kinds of models without processes: which kind the arguments choose, how
each kind reads the lines vw prints (measured on vw 9.x, see
subwabbit/core/kinds.py), which labels it takes, and the exploration helper.
The same kinds against the real engine are in test_model_kinds.py."""

import random
import subprocess

import numpy
import pytest

from subwabbit import VowpalWabbitDummyFormatter, VowpalWabbitProcess, sample_item
from subwabbit.command import default_engine_command
from subwabbit.core.kinds import KINDS, choose_kind
from subwabbit.errors import VowpalWabbitProtocolError

from conftest import engine_from_file


@pytest.mark.parametrize("args, name, answer_lines, multi_line", [
    ([], "scalar", 1, False),
    (["--loss_function", "logistic", "--binary"], "scalar", 1, False),
    (["--oaa", "3"], "multiclass", 1, False),
    (["--oaa=3"], "multiclass", 1, False),
    (["--ect", "3"], "multiclass", 1, False),
    (["--log_multi", "3"], "multiclass", 1, False),
    (["--recall_tree", "3"], "multiclass", 1, False),
    (["--csoaa", "3"], "cost_sensitive", 1, False),
    (["--oaa", "3", "--probabilities", "--loss_function", "logistic"], "class_probabilities", 1,
     False),
    (["--oaa", "3", "--scores"], "class_scores", 1, False),
    (["--multilabel_oaa", "3"], "multilabel", 1, False),
    (["--plt", "10", "--top_k", "2", "--loss_function", "logistic"], "multilabel", 1, False),
    (["--cb", "3"], "cb", 2, False),
    (["--cb", "3", "--cb_force_legacy"], "cb", 1, False),
    (["--cb_explore", "3", "--epsilon", "0.1"], "cb_explore", 2, False),
    (["--cb_explore", "3", "--cb_force_legacy"], "cb_explore", 1, False),
    (["--cb_adf"], "cb_adf", 2, True),
    (["--cb_explore_adf", "--epsilon", "0.1"], "cb_explore_adf", 2, True),
    (["--cb_explore_adf", "--cb_adf"], "cb_explore_adf", 2, True),
    (["--cb_explore", "3", "--cb", "3"], "cb_explore", 2, False),
])
def test_the_arguments_choose_the_kind(args, name, answer_lines, multi_line):
    kind = choose_kind(args)
    assert (kind.name, kind.answer_lines, kind.multi_line) == (name, answer_lines, multi_line)


def test_cb_adf_runs_with_rank_all_so_that_every_item_gets_its_score():
    assert choose_kind(["--cb_adf"]).engine_args(["--cb_adf"]) == ["--rank_all", "--cb_adf"]
    assert choose_kind(["--cb_adf", "--rank_all"]).engine_args(["--cb_adf", "--rank_all"]) == [
        "--cb_adf", "--rank_all"]
    assert choose_kind(["-i", "m"], "cb_adf").engine_args(["-i", "m"]) == ["--rank_all", "-i",
                                                                           "m"]


def test_prediction_type_names_the_kind_of_a_model_file():
    assert choose_kind(["-i", "model.vw", "-t"], "cb_explore_adf").multi_line
    # --probabilities is not saved in a model file: given again, it refines multiclass
    saved = ["--oaa", "3"]
    assert choose_kind(["-i", "m", "--probabilities"], "multiclass",
                       saved_options=saved).name == "class_probabilities"
    assert choose_kind(["-i", "m", "--probabilities"],
                       saved_options=saved).name == "class_probabilities"
    # with neither the file nor the arguments showing the class count, a tag
    # after the pairs ('4:9') could not be told from a class
    for prediction_type in ("multiclass", "class_probabilities", None):
        with pytest.raises(ValueError, match="needs its class count"):
            choose_kind(["-i", "m", "--probabilities"], prediction_type)
    assert choose_kind(["-i", "m", "--oaa", "3", "--probabilities"], "multiclass"
                       ).classes.count == 3
    assert choose_kind(["-i", "m", "--probabilities", "--named_labels", "a,b"], "multiclass"
                       ).classes.count == 2
    assert choose_kind(["--oaa", "3"], "multiclass").classes.count == 3
    with pytest.raises(ValueError, match=r"prediction_type='cb' contradicts --oaa 3 in vw_args"):
        choose_kind(["--oaa", "3"], "cb")
    with pytest.raises(ValueError, match=r"prediction_type must be one of .*'probabilities'"):
        choose_kind([], "probabilities")


# What vw 9.11 saves in model files of each reduction (read from real
# files by tests/test_model_file.py).
SAVED = {
    "cb": "--cb 3 --cb_adf --cb_type mtr --csoaa_ldf multiline --csoaa_rank",
    "cb_explore": "--cb_adf --cb_explore 3 --cb_explore_adf --cb_type mtr --csoaa_ldf "
                  "multiline --csoaa_rank --epsilon 0.2",
    "cb_adf": "--cb_adf --cb_type mtr --csoaa_ldf multiline --csoaa_rank --rank_all",
    "cb_explore_adf": "--cb_adf --cb_explore_adf --cb_type mtr --csoaa_ldf multiline "
                      "--csoaa_rank --epsilon 0.2",
    "multiclass": "--named_labels walk,run,sprint --oaa 3",
    "cost_sensitive": "--csoaa 3",
    "multilabel": "--plt 6",
    "scalar": "--link logistic --quadratic ab",
}


@pytest.mark.parametrize("name", list(SAVED))
def test_the_reduction_saved_in_a_model_file_decides_its_kind(name):
    kind = choose_kind(["-i", "m.vw", "-t"], saved_options=SAVED[name].split())
    assert kind.name == name
    if name != "scalar":
        assert kind.origin.endswith(", saved in the model file")


def test_the_arguments_count_before_a_model_files_saved_options():
    saved = SAVED["multiclass"].split()
    kind = choose_kind(["-i", "m"], saved_options=saved)
    assert kind.classes.names == ("walk", "run", "sprint") and kind.classes.first == 1
    assert choose_kind(["-i", "m", "--named_labels", "a,b,c"], saved_options=saved
                       ).classes.names == ("a", "b", "c")
    assert choose_kind(["-i", "m", "--probabilities"], saved_options=saved
                       ).name == "class_probabilities"
    assert choose_kind(["-i", "m"], saved_options=["--indexing", "0", "--oaa", "3"]
                       ).classes.first == 0
    assert choose_kind(["-i", "m"], saved_options=["--cb", "3", "--cb_force_legacy"]
                       ).answer_lines == 1
    assert choose_kind(["-i", "m", "--csoaa", "4"], saved_options=saved).name == "cost_sensitive"
    assert choose_kind(["-i", "m"], default="label_strings", saved_options=["--plt", "6"]
                       ).name == "label_strings"


def test_a_model_file_of_a_reduction_subwabbit_cannot_serve_is_refused():
    with pytest.raises(ValueError, match="the model file was trained with --ccb_explore_adf"):
        choose_kind(["-i", "m"], saved_options=["--cb_adf", "--cb_explore_adf",
                                                "--ccb_explore_adf", "--csoaa_ldf", "multiline"])
    with pytest.raises(ValueError, match="the model file was trained with --csoaa_ldf"):
        choose_kind(["-i", "m"], saved_options=["--csoaa_ldf", "multiline"])
    with pytest.raises(ValueError, match="--probabilities for a model file of --ect"):
        choose_kind(["-i", "m", "--probabilities"], saved_options=["--ect", "3"])
    with pytest.raises(ValueError, match=r"prediction_type='cb' contradicts --oaa 3 saved in "
                                         "the model file, which makes a 'multiclass' model"):
        choose_kind(["-i", "m"], "cb", saved_options=SAVED["multiclass"].split())


def test_the_plt_class_default_gives_label_strings_unless_told_otherwise():
    assert choose_kind(["--plt", "10"], default="label_strings").name == "label_strings"
    assert choose_kind(["-i", "m"], default="label_strings").name == "label_strings"
    assert choose_kind(["--oaa", "3"], default="label_strings").name == "multiclass"
    assert choose_kind(["--plt", "10"], "multilabel", default="label_strings").name == "multilabel"


@pytest.mark.parametrize("args, named", [
    (["--ccb_explore_adf"], "--ccb_explore_adf"),
    (["--slates"], "--slates"),
    (["--search", "4", "--search_task", "sequence"], "--search"),
    (["--search_task=sequence"], "--search_task"),
    (["--csoaa_ldf", "m"], "--csoaa_ldf"),
    (["--csoaa_ldf=mc"], "--csoaa_ldf"),
    (["--wap_ldf", "m"], "--wap_ldf"),
    (["--cbify", "3"], "--cbify"),
    (["--explore_eval"], "--explore_eval"),
    (["--top", "2"], "--top"),
    (["--lda", "2"], "--lda"),
    (["--cats", "4"], "--cats"),
    (["--memory_tree", "3"], "--memory_tree"),
    (["--emt"], "--emt"),
    (["--ot", "3"], "--ot"),
    (["--cs_active", "3"], "--cs_active"),
    (["--multilabel_oaa", "3", "--probabilities"], "--probabilities with --multilabel_oaa"),
    (["--csoaa", "3", "--probabilities"], "--probabilities with --csoaa"),
])
def test_unservable_reductions_are_refused_naming_the_argument(args, named):
    with pytest.raises(ValueError, match=f"vw_args contains {named}"):
        choose_kind(args)
    with pytest.raises(ValueError, match=f"vw_args contains {named}"):
        VowpalWabbitProcess(VowpalWabbitDummyFormatter(), args + ["--quiet"])


def test_a_model_file_of_an_unservable_reduction_is_refused(tmp_path):
    # Found by a review: a --memory_tree model (vw prints class numbers) was
    # served as a scalar model, and a scalar process reloaded to one.
    data = tmp_path / "train.txt"
    data.write_text("".join(f"{c} |a f{c}\n" for _ in range(20) for c in (1, 2, 3)))
    model = str(tmp_path / "mt.vw")
    subprocess.run(default_engine_command() + ["--memory_tree", "3", "--quiet", "-d", str(data),
                                               "-f", model], check=True, timeout=120)
    with pytest.raises(ValueError, match="--memory_tree"):
        VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["-i", model, "-t", "--quiet"])
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--quiet"]) as scalar:
        with pytest.raises(ValueError, match="--memory_tree"):
            scalar.reload(["-i", model, "-t", "--quiet"])
        assert scalar.predict("", ["|a f1"]) is not None  # the old model goes on serving


@pytest.mark.parametrize("args, lines, probe", [
    (["--ot", "3"], ["1:1:0.5 |a x", "2:0:0.5 |a y"], b"0.000625 0.024375 0.975000 "),
    (["--emt"], ["2 |a x", "3 |a y"], b"3"),
])
def test_offset_tree_and_eigen_memory_tree_are_refused_not_served_as_scalars(args, lines, probe,
                                                                            tmp_path):
    """Found by a review: neither was known, so both were served as scalar
    models. An --ot model answers a probability per action on one line
    (predict gave the first only, as a float); an --emt model answers a
    class (a float), and its labels went unchecked: vw read -1 as another
    class without a word, and 2.5 made the engine exit. Refused like
    --memory_tree, from the arguments and from a model file."""
    model = str(tmp_path / "model.vw")
    answers = engine_from_file(lines + ["|a y"], args + ["-f", model], tmp_path)
    assert answers[-1] == probe  # what vw answers, which no kind reads
    with pytest.raises(ValueError, match=f"vw_args contains {args[0]}"):
        VowpalWabbitProcess(VowpalWabbitDummyFormatter(), args + ["--quiet"])
    with pytest.raises(ValueError, match=f"trained with {args[0]}"):
        VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["-i", model, "-t", "--quiet"])


@pytest.mark.parametrize("args, label, weight", [
    (["--quiet"], 1e39, None), (["--quiet"], 10 ** 40, None), (["--quiet"], -10 ** 400, None),
    (["--quiet"], 1, 1e39),
    (["--cb", "2", "--quiet"], (1, 1e39, 0.5), None), (["--oaa", "2", "--quiet"], 1, 1e39),
])
def test_a_number_vw_reads_as_infinite_is_refused_before_sending(args, label, weight):
    # Found by a review: vw reads labels, costs and weights as 32-bit
    # floats, and a larger magnitude as an infinity (one such example made
    # a --cb_adf model answer nan for ever).
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), args, write_only=True) as model:
        with pytest.raises(ValueError, match="32-bit"):
            model.train("|u a", ["|a x"], [label], weights=[weight])
        if args == ["--quiet"]:
            model.train("|u a", ["|a x"], [3e38], weights=[3e38])  # the largest pass


def test_audit_mode_serves_scalar_models_only():
    with pytest.raises(ValueError, match=r"audit_mode .* 'cb_explore_adf' model"):
        VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["--cb_explore_adf"], audit_mode=True)


# ------------------------------------------------------------------ answers

@pytest.mark.parametrize("args, lines, expected", [
    ([], [b"0.703793", b"1 tag"], [0.703793, 1.0]),
    (["--oaa", "3"], [b"1", b"3 t1"], [1, 3]),
    (["--recall_tree", "3"], [b"0"], [0]),
    (["--oaa", "3", "--named_labels", "a,b,c"], [b"b", b"c tag"], ["b", "c"]),
    (["--csoaa", "3"], [b"2 t1"], [2]),
    (["--oaa", "3", "--probabilities"], [b"1:0.49419 2:0.222674 3:0.283136",
                                         b"1:0.333333 2:0.333333 3:0.333333 t1"],
     [{1: 0.49419, 2: 0.222674, 3: 0.283136}, {1: 0.333333, 2: 0.333333, 3: 0.333333}]),
    (["-i", "m", "--oaa", "2", "--probabilities"], [b"1:0.5 2:0.5 2:7"], [{1: 0.5, 2: 0.5}]),
    (["--oaa", "3", "--scores"], [b"1:0.506931 2:-0.506931 3:-0.506931"],
     [{1: 0.506931, 2: -0.506931, 3: -0.506931}]),
    (["--multilabel_oaa", "3"], [b"0,2 ", b" ", b"  t1", b"1  t2"], [[0, 2], [], [], [1]]),
    (["--plt", "10"], [b"4,0 "], [[4, 0]]),
    (["--cb", "3"], [b"0", b"", b"2 t1", b""], [1, 3]),
    (["--cb", "3", "--cb_force_legacy"], [b"1", b"3"], [1, 3]),
    (["--cb_explore", "3"], [b"1:0.491667,2:0.491667,0:0.016667 t2", b""],
     [[0.016667, 0.491667, 0.491667]]),
    (["--cb_explore", "3", "--cb_force_legacy"], [b"0.966667 0.016667 0.016667  t1"],
     [[0.966667, 0.016667, 0.016667]]),
])
def test_single_line_answers_become_typed_predictions(args, lines, expected):
    assert choose_kind(args).parse_answers(lines) == expected


def test_plt_label_strings_as_in_2x():
    assert choose_kind(["--plt", "10"], default="label_strings").parse_answers(
        [b"0,1 ", b" "]) == ["0,1", ""]


@pytest.mark.parametrize("args, lines, items, expected", [
    (["--cb_explore_adf"], [b"1:0.966667,2:0.016667,0:0.016667", b""], 3,
     [0.016667, 0.966667, 0.016667]),
    (["--cb_explore_adf"], [b"0:0.5,1:0.5 tag", b""], 2, [0.5, 0.5]),
    (["--cb_adf"], [b"1:0.386253,2:0.386253,0:0.57938", b""], 3, [0.57938, 0.386253, 0.386253]),
    (["--cb_adf"], [b"0:1", b""], 1, [1.0]),
])
def test_a_multi_line_answer_becomes_one_prediction_per_item_in_item_order(args, lines, items,
                                                                          expected):
    assert choose_kind(args).parse_example(lines, items) == expected


@pytest.mark.parametrize("args, lines", [
    ([], [b"1:0.5 2:0.5"]),
    (["--oaa", "3"], [b"x"]),
    (["--oaa", "3", "--probabilities"], [b"1:0.5 2:0.5"]),  # K=3
    (["--multilabel_oaa", "3"], [b"0,2"]),  # vw always ends the list with a space
    (["--cb", "3"], [b"1", b"2"]),  # the second line must be empty
    (["--cb_explore", "3"], [b"0:0.5,1:0.5", b""]),
    (["--plt", "10"], [b""]),
])
def test_answers_of_another_shape_are_protocol_errors(args, lines):
    with pytest.raises(VowpalWabbitProtocolError, match="the vw engine printed"):
        choose_kind(args).parse_answers(lines)


@pytest.mark.parametrize("line, items", [
    (b"0:0.5,1:0.5", 3),          # an item missing: the example was split
    (b"0:0.2,1:0.3,2:0.2,3:0.3", 3),  # one too many
    (b"0:0.5,0:0.5,1:0", 3),      # an action twice
    (b"", 1),
])
def test_a_multi_line_answer_must_cover_exactly_the_items_sent(line, items):
    with pytest.raises(VowpalWabbitProtocolError, match="action:value pairs"):
        choose_kind(["--cb_explore_adf"]).parse_example([line, b""], items)
    with pytest.raises(VowpalWabbitProtocolError, match="empty line"):
        choose_kind(["--cb_explore_adf"]).parse_example([b"0:1", b"x"], 1)


@pytest.mark.parametrize("args, probe_answers", [
    ([], [b"0", b"0"]),
    (["--oaa", "3"], [b"1", b"1"]),
    (["--cb", "3"], [b"0", b"", b"0", b""]),
    (["--cb_explore_adf"], [b"0:1", b"", b"0:1", b""]),
    (["--multilabel_oaa", "3"], [b" ", b" "]),
])
def test_probe_answers_of_the_kind_pass(args, probe_answers):
    choose_kind(args).check_probe_answers(probe_answers)


@pytest.mark.parametrize("args, probe_answers", [
    ([], [b"0", b""]),                    # a --cb model loaded as scalar
    ([], [b"0:1"]),                       # a --cb_explore_adf model loaded as scalar
    (["--cb", "3"], [b"1", b"1"]),        # a legacy --cb model
    (["--cb_explore_adf"], [b"0", b""]),  # a --cb_adf model without --rank_all
    (["--oaa", "3"], [b"1:0.3 2:0.3 3:0.4"]),
])
def test_probe_answers_of_another_kind_name_prediction_type(args, probe_answers):
    with pytest.raises(VowpalWabbitProtocolError, match="pass prediction_type="):
        choose_kind(args).check_probe_answers(probe_answers)


# ------------------------------------------------------------------- labels

@pytest.mark.parametrize("args, labels, texts", [
    (["--oaa", "3"], [1, 3, numpy.int64(2)], ["1", "3", "2"]),
    (["--oaa", "3", "--indexing", "0"], [0, 2], ["0", "2"]),
    (["--oaa", "3", "--named_labels", "a,b,c"], ["b"], ["b"]),
    (["--oaa", "3", "--probabilities"], [2], ["2"]),
    (["--csoaa", "3"], [{1: 0, 2: 1, 3: 1}, {2: 0.5}], ["1:0 2:1 3:1", "2:0.5"]),
    (["--csoaa", "3"], ["1:0 2:1 3:1", " 2:0.5 "], ["1:0.0 2:1.0 3:1.0", "2:0.5"]),
    (["--multilabel_oaa", "3"], [[0, 2], (1,), 2, "0,1"], ["0,2", "1", "2", "0,1"]),
    (["--cb", "3"], [(1, 0.5, 0.25), (3, -1, 1)], ["1:0.5:0.25", "3:-1:1"]),
    (["--cb_explore", "3"], [(2, 1.0, 0.5)], ["2:1.0:0.5"]),
    (["--cb_explore_adf"], [None, (0.0, 0.5), None], [None, "0:0.0:0.5", None]),
    (["--cb_adf"], [(-1, numpy.float32(0.5))], ["0:-1:0.5"]),
])
def test_labels_are_checked_and_written_as_vw_reads_them(args, labels, texts):
    assert choose_kind(args).check_labels(labels) == texts


@pytest.mark.parametrize("args, labels, error, message", [
    (["--oaa", "3"], [1, 0], ValueError, r"labels\[1\] is 0; vw's class labels start at 1"),
    (["--oaa", "3"], [4], ValueError, r"labels\[0\] is 4; it must be an int from 1 to 3 "
                                      r"\(--oaa 3\)"),
    (["--oaa", "3"], [2.0], TypeError, r"labels\[0\] must be a class label"),
    (["--oaa", "3"], [True], TypeError, r"labels\[0\] must be a class label"),
    (["--oaa", "3"], [None], ValueError, r"labels\[0\] is None"),
    (["--oaa", "3", "--named_labels", "a,b,c"], ["d"], ValueError, r"one of a, b, c"),
    (["--csoaa", "3"], [{1: 0, 4: 1}], ValueError, r"a class of labels\[0\] is 4"),
    (["--csoaa", "3"], [{0: 1}], ValueError, r"a class of labels\[0\] is 0"),
    (["--csoaa", "3"], [{}], TypeError, r"non-empty dict"),
    (["--csoaa", "3"], ["1 2"], ValueError, r"or VW's text such as '1:0 2:1', got '1 2'"),
    (["--csoaa", "3"], ["4:1"], ValueError, r"a class of labels\[0\] is 4"),
    (["--csoaa", "3"], [""], TypeError, r"non-empty dict"),
    (["--csoaa", "3"], [[1, 0]], TypeError, r"non-empty dict"),
    (["--csoaa", "3"], [{1: float("nan")}], ValueError, r"the cost of class 1 in labels\[0\]"),
    (["--multilabel_oaa", "3"], [[]], ValueError, r"labels\[0\] is empty"),
    (["--multilabel_oaa", "3"], [[0, 3]], ValueError, r"labels\[0\] holds 3; .* ints from 0 "
                                                      r"to 2"),
    (["--multilabel_oaa", "3"], ["0 1"], ValueError, r"such as '0,2'"),
    (["--cb", "3"], [(0, 1, 0.5)], ValueError, r"actions are ints from 1 to 3"),
    (["--cb", "3"], [(4, 1, 0.5)], ValueError, r"actions are ints from 1 to 3"),
    (["--cb", "3"], [(1, 1, 0)], ValueError, r"the probability of labels\[0\] must be a "
                                             r"probability in \(0, 1\]"),
    (["--cb", "3"], [(1, 1, 1.5)], ValueError, r"in \(0, 1\]"),
    (["--cb", "3"], [(1, 1)], TypeError, r"\(action, cost, probability\)"),
    (["--cb_explore_adf"], [None, None], ValueError, r"exactly one item .* Got 0 labelled"),
    (["--cb_explore_adf"], [(1, 0.5), (0, 0.5)], ValueError, r"Got 2 labelled items "
                                                             r"\(labels\[0, 1\]\)"),
    (["--cb_explore_adf"], [(1, 0.5, 0.1)], TypeError, r"None or \(cost, probability\)"),
    (["--cb_explore_adf"], [(1, -0.5)], ValueError, r"\(0, 1\]"),
    (["--cb_adf"], [(float("inf"), 0.5)], ValueError, r"the cost of labels\[0\] must be finite"),
])
def test_bad_labels_are_refused_naming_the_item_and_the_rule(args, labels, error, message):
    with pytest.raises(error, match=message):
        choose_kind(args).check_labels(labels)


@pytest.mark.parametrize("args", [["--csoaa", "3"], ["--multilabel_oaa", "3"], ["--cb", "3"],
                                  ["--cb_explore_adf"]])
def test_kinds_whose_labels_carry_no_weight_refuse_weights(args):
    kind = choose_kind(args)
    kind.check_weights([None, None])
    with pytest.raises(ValueError, match=r"weights\[1\] is 2.0, but .* carry no importance"):
        kind.check_weights([None, 2.0])


def test_multiclass_labels_take_weights():
    kind = choose_kind(["--oaa", "3"])
    kind.check_weights([0.5, None])
    with pytest.raises(ValueError, match="negative"):
        kind.check_weights([-1])


def test_every_kind_is_documented_by_name():
    assert set(KINDS) == {"scalar", "multiclass", "cost_sensitive", "class_probabilities",
                          "class_scores", "multilabel", "label_strings", "cb", "cb_explore",
                          "cb_adf", "cb_explore_adf"}
    # (vw prints class pairs only with --probabilities or --scores, kept in no model file)
    flags = {"class_probabilities": ["--oaa", "3", "--probabilities"],
             "class_scores": ["--oaa", "3", "--scores"]}
    for name in KINDS:
        assert choose_kind(["-i", "m"] + flags.get(name, []), name).name == name


# -------------------------------------------------------------- exploration

def test_sample_item_repeats_with_a_seeded_generator_and_gives_the_logged_probability():
    probabilities = [0.016667, 0.966667, 0.016667]
    first = [sample_item(probabilities, random.Random(7)) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    index, probability = first[0]
    assert probability == probabilities[index]


@pytest.mark.parametrize("make_rng", [lambda: random.Random(1), lambda: numpy.random.default_rng(1)],
                         ids=["random", "numpy"])
def test_sample_item_draws_in_proportion_and_never_a_zero(make_rng):
    rng = make_rng()
    probabilities = [0.1, 0.0, 0.6, 0.3]
    counts = [0, 0, 0, 0]
    for _ in range(20000):
        index, probability = sample_item(probabilities, rng)
        assert probability == probabilities[index]
        counts[index] += 1
    assert counts[1] == 0
    for count, probability in zip(counts, probabilities):
        assert abs(count / 20000 - probability) < 0.02


class FixedDraw:
    def __init__(self, value):
        self.value = value

    def random(self):
        return self.value


def test_sample_item_boundaries_and_rounded_sums():
    probabilities = [0.016667, 0.966667, 0.016667]  # sums to 1.000001
    assert sample_item(probabilities, FixedDraw(0.0)) == (0, 0.016667)
    assert sample_item(probabilities, FixedDraw(0.9999999)) == (2, 0.016667)
    assert sample_item([0.5, 0.5, 0.0], FixedDraw(0.9999999)) == (1, 0.5)


@pytest.mark.parametrize("probabilities, message", [
    ([], "no probabilities"),
    ([0.0, 0.0], "all 0"),
    ([0.5, -0.1], r"probabilities\[1\] must be a finite number >= 0"),
    ([float("nan")], r"probabilities\[0\]"),
    ([True], r"probabilities\[0\]"),
])
def test_sample_item_refuses_what_is_not_a_distribution(probabilities, message):
    with pytest.raises(ValueError, match=message):
        sample_item(probabilities, random.Random(0))


# ------------------------------------------------- label words in a line's header

@pytest.mark.parametrize("args, words", [
    (["--oaa", "3"], ["2"]), (["--oaa", "3"], ["+3", "0.5"]), (["--oaa", "3"], ["1", "0"]),
    (["--oaa", "3", "--indexing", "0"], ["0"]),
    (["--oaa", "3", "--named_labels", "a,b,c"], ["c", "2"]),
    (["--csoaa", "3"], ["1:0", "2:1.5", "3:-1e3"]), (["--csoaa", "3"], ["2", "3"]),
    (["--multilabel_oaa", "3"], ["0,2"]), (["--plt", "6"], ["5,0"]),
    (["--cb", "3"], ["1:2:0.5"]), (["--cb", "3"], ["3:-1:1", "1"]),
    (["--cb_explore", "3"], ["2:1.5:0.25"]),
])
def test_label_words_vw_reads_as_written_pass(args, words):
    assert choose_kind(args).label_words_problem(words) is None


@pytest.mark.parametrize("args, words, message", [
    (["--oaa", "3"], ["x"], "'x' is not a class label, an int from 1 to 3"),
    (["--oaa", "3"], ["1:2"], "not a class label"),          # vw exits
    (["--oaa", "3"], ["0"], "out of range"),                 # vw counts from 0 from then on
    (["--oaa", "3"], ["2", "x"], "importance weight 'x'"),   # read as 0
    (["--oaa", "3"], ["2", "-1"], "importance weight '-1'"),
    (["--oaa", "3"], ["2", "1e39"], "importance weight"),    # an infinity
    (["--oaa", "3"], ["2", "1", "1"], "3 words"),            # vw exits
    (["--oaa", "3", "--named_labels", "a,b,c"], ["d"], "'d' is not a class"),
    (["--csoaa", "3"], ["+1:0"], "not a class label"),       # hashed
    (["--csoaa", "3"], ["1:"], "the cost in '1:'"),
    (["--csoaa", "3"], ["1:0", "1:1"], "comes twice"),
    (["--multilabel_oaa", "3"], ["2,0"], "increasing order"),
    (["--multilabel_oaa", "3"], ["0", "1"], "2 words"),
    (["--plt", "6"], ["0,,1"], "'' is not a label"),
    (["--cb", "3"], ["1:2:3:4"], "more than three parts"),   # vw exits
    (["--cb", "3"], ["1:1"], "a cost but no probability"),
    (["--cb", "3"], ["1:1:1.5"], "a probability in (0, 1]"),
    (["--cb", "3"], ["1:1:0.5", "2:0:0.5"], "more than one action has a cost"),
    (["--cb", "3"], ["1:1e-200:0.5"], "numbers vw reads as written"),  # 8-bit exponent
])
def test_label_words_vw_misreads_are_named_with_the_kinds_rule(args, words, message):
    problem = choose_kind(args).label_words_problem(words)
    assert problem is not None and message in problem and " reads " in problem


@pytest.mark.parametrize("args, words", [
    (["--oaa", "3"], ["2", "1e+16"]),              # repr(1e16): a weight subwabbit writes
    (["--oaa", "3"], ["2", "+3"]),
    (["--csoaa", "3"], ["1:1e+20", "2:+1"]),
    (["--cb", "3"], ["1:-1e+16:+0.5"]),
])
def test_numbers_with_a_plus_sign_vw_reads_as_written_pass(args, words):
    """vw's fast parser hands a number with a '+' ('1e+16', as Python's
    repr writes 1e16, or '+3') to strtof, which reads it in full: it was
    refused as a number vw misreads, so a weight or cost of 1e16 that the
    library itself formatted was refused when the line's label was checked."""
    assert choose_kind(args).label_words_problem(words) is None


@pytest.mark.parametrize("value", [1e-200, 1e-250, -1.2345678901234567e-115,
                                   numpy.float64(1e-130)])
def test_a_number_whose_text_vw_misreads_is_refused(value):
    """vw's parser wraps a power of ten beyond 8 bits: the text of 1e-200
    ('1e-200') is read as an infinity and 1e-250 as 1e6. As a label, weight
    or cost such a number went to vw whenever the line's header was not
    checked word by word (the default joining)."""
    with pytest.raises(ValueError, match="misreads"):
        choose_kind([]).check_labels([value])
    with pytest.raises(ValueError, match="misreads"):
        choose_kind(["--oaa", "3"]).check_weights([value])


@pytest.mark.parametrize("value", [0.0, 1e-120, 1e-110, 2.5e-111, 1e-60, 3e38])
def test_small_numbers_vw_reads_as_written_pass(value):
    choose_kind([]).check_labels([value])
    choose_kind(["--oaa", "3"]).check_weights([abs(value)])


def test_a_scalar_model_and_multi_line_kinds_check_no_label_words():
    assert choose_kind([]).label_words_rule() is None
    assert choose_kind(["--cb_explore_adf"]).label_words_rule() is None
    assert choose_kind(["--plt", "3"], default="label_strings").label_words_rule() is not None


def test_multilabel_labels_are_written_in_increasing_order_once():
    """--multilabel_oaa reads a label list in increasing order only ('2,0'
    learns class 2 alone); a list in any order is written sorted."""
    kind = choose_kind(["--multilabel_oaa", "3"])
    assert kind.check_labels([[2, 0], "1,0,1"]) == ["0,2", "0,1"]

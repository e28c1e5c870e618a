"""Tests for subwabbit.explanation and the formatter methods of subwabbit.base."""

import html
import math

import pytest

from subwabbit import (AuditFeature, VowpalWabbitBaseFormatter, VowpalWabbitDummyFormatter,
                       VowpalWabbitProcess)
from subwabbit.explanation import (HtmlExplanation, explain_features, explanation_html,
                                   parse_audit_features)

from conftest import engine_from_file

#: an audit line as vw 9.x prints it while learning
AUDIT_LEARNING = "\ta^x:55432:1:0.11052@5.19353\tConstant:116060:1:0.11052@5.19353"
#: with a quadratic interaction (u x i) and differently sized contributions
AUDIT_INTERACTION = ("\tConstant:116060:1:0.05@4\tu^u1:112063:1:0.1@2"
                     "\ti^i7:106259:2:0.3@2\tu^u1*i^i7:3317:1:-0.25@2")
#: under -t the adaptive part is missing
AUDIT_TEST_ONLY = "\ta^y:42847:1:0.259789\tConstant:116060:1:-0.5"


def default_parse_element(element, feature_translator=None):
    return VowpalWabbitDummyFormatter().parse_element(element, feature_translator)


# ------------------------------------------------------------------ parse_audit_features


def test_parse_audit_features_learning_line():
    assert parse_audit_features(AUDIT_LEARNING) == [
        AuditFeature("a^x", 55432, 1.0, 0.11052),
        AuditFeature("Constant", 116060, 1.0, 0.11052),
    ]


def test_parse_audit_features_types():
    feature = parse_audit_features(AUDIT_LEARNING)[0]
    assert type(feature.hashindex) is int
    assert type(feature.value) is float
    assert type(feature.weight) is float


def test_parse_audit_features_interaction():
    features = parse_audit_features(AUDIT_INTERACTION)
    assert [f.name for f in features] == ["Constant", "u^u1", "i^i7", "u^u1*i^i7"]
    assert features[3] == AuditFeature("u^u1*i^i7", 3317, 1.0, -0.25)
    assert features[2].value == 2.0


def test_parse_audit_features_test_only_line_without_adaptive_part():
    assert parse_audit_features(AUDIT_TEST_ONLY) == [
        AuditFeature("a^y", 42847, 1.0, 0.259789),
        AuditFeature("Constant", 116060, 1.0, -0.5),
    ]


@pytest.mark.parametrize("text", [
    AUDIT_LEARNING.lstrip("\t"),         # without the leading tab
    AUDIT_LEARNING + "\n",               # with a newline
    AUDIT_LEARNING + "\r\n",
    AUDIT_LEARNING + "\t",               # trailing tab
    AUDIT_LEARNING.replace("\t", "\t\t"),
])
def test_parse_audit_features_tolerates_tabs_and_newlines(text):
    assert parse_audit_features(text) == parse_audit_features(AUDIT_LEARNING)


@pytest.mark.parametrize("text", ["", "\t", "\n", "\t\r\n"])
def test_parse_audit_features_empty(text):
    assert parse_audit_features(text) == []


def test_parse_audit_features_negative_and_exponent_values():
    assert parse_audit_features("n^f:7:-1.5e-3:2e+01@1") == [AuditFeature("n^f", 7, -0.0015, 20.0)]


@pytest.mark.parametrize("entry", ["a^x", "a^x:1:2", "garbage", "a^x 1 2 3"])
def test_parse_audit_features_rejects_wrong_shape(entry):
    with pytest.raises(ValueError, match="not an audit feature"):
        parse_audit_features("\tConstant:116060:1:0.1\t" + entry)


@pytest.mark.parametrize("entry", ["a^x:abc:1:0.5", "a^x:1:one:0.5", "a^x:1:1:w@2"])
def test_parse_audit_features_rejects_non_numbers(entry):
    with pytest.raises(ValueError):
        parse_audit_features(entry)


# ------------------------------------------------------------------ explain_features


def test_explain_features_sorted_by_absolute_contribution():
    rows = explain_features(AUDIT_INTERACTION, default_parse_element)
    assert [row["original_feature_name"] for row in rows] == ["i^i7", "u^u1*i^i7", "u^u1", "Constant"]
    potentials = [abs(row["potential"]) for row in rows]
    assert potentials == sorted(potentials, reverse=True)


def test_explain_features_row_contents():
    rows = explain_features(AUDIT_INTERACTION, default_parse_element)
    by_name = {row["original_feature_name"]: row for row in rows}
    interaction = by_name["u^u1*i^i7"]
    assert interaction["names"] == [("u", "u1"), ("i", "i7")]
    assert interaction["hashindex"] == 3317
    assert interaction["value"] == 1.0
    assert interaction["weight"] == -0.25
    assert interaction["potential"] == pytest.approx(-0.25)
    item = by_name["i^i7"]
    assert item["potential"] == pytest.approx(0.6)  # value 2 * weight 0.3
    assert by_name["Constant"]["names"] == [("", "Constant")]
    total = 0.05 + 0.1 + 0.6 + 0.25
    assert item["relative_potential"] == pytest.approx(0.6 / total)
    assert interaction["relative_potential"] == pytest.approx(0.25 / total)
    assert set(item) == {"names", "original_feature_name", "hashindex", "value", "weight",
                         "potential", "relative_potential"}


@pytest.mark.parametrize("text", [AUDIT_LEARNING, AUDIT_INTERACTION, AUDIT_TEST_ONLY])
def test_explain_features_relative_potential_sums_to_one(text):
    rows = explain_features(text, default_parse_element)
    assert math.fsum(row["relative_potential"] for row in rows) == pytest.approx(1.0)
    assert all(row["relative_potential"] >= 0 for row in rows)


def test_explain_features_negative_weights_count_by_absolute_value():
    rows = explain_features("\ta^x:1:1:-0.75\tb^y:2:1:0.25", default_parse_element)
    assert [row["original_feature_name"] for row in rows] == ["a^x", "b^y"]
    assert rows[0]["potential"] == -0.75
    assert rows[0]["relative_potential"] == pytest.approx(0.75)
    assert rows[1]["relative_potential"] == pytest.approx(0.25)


def test_explain_features_all_zero_potentials():
    rows = explain_features("\ta^x:1:1:0@0\tConstant:116060:1:0@0\tb^y:3:0:1.5", default_parse_element)
    assert len(rows) == 3
    assert [row["relative_potential"] for row in rows] == [0.0, 0.0, 0.0]
    assert [row["potential"] for row in rows] == [0.0, 0.0, 0.0]


def test_explain_features_empty():
    assert explain_features("", default_parse_element) == []


def test_explain_features_passes_translator_to_parse_element():
    calls = []

    def parse(element, translator):
        calls.append((element, translator))
        return ("NS", translator.get(element, element))

    translator = {"u^u1": "user one"}
    rows = explain_features(AUDIT_INTERACTION, parse, translator)
    assert ("u^u1", translator) in calls
    assert ("i^i7", translator) in calls
    assert len(calls) == 5  # Constant, u^u1, i^i7, and the two elements of the interaction
    by_name = {row["original_feature_name"]: row for row in rows}
    assert by_name["u^u1*i^i7"]["names"] == [("NS", "user one"), ("NS", "i^i7")]


# ------------------------------------------------------------------ explanation_html


def _rows(text=AUDIT_INTERACTION):
    return explain_features(text, default_parse_element)


def test_explanation_html_is_a_table_with_one_row_per_feature():
    page = explanation_html(_rows())
    assert isinstance(page, HtmlExplanation)
    assert isinstance(page, str)
    assert page.startswith("<table>") and page.endswith("</table>")
    assert page.count("<tr>") == 1 + 4  # header + features
    for header in ("Relative potential", "Potential", "Value", "Weight", "Feature"):
        assert f"<th>{header}</th>" in page


def test_explanation_html_rows_in_order_with_numbers_and_colours():
    page = explanation_html(_rows())
    body = page.split("<tbody>", 1)[1]
    rows = body.split("<tr>")[1:]
    assert "<i>i7</i>" in rows[0] and "<td>0.6000</td>" in rows[0]
    assert "background-color: green" in rows[0]
    assert "<td>2.0000</td>" in rows[0] and "<td>0.3000</td>" in rows[0]
    assert "u: <i>u1</i>" in rows[1] and "i: <i>i7</i>" in rows[1]
    assert "&times;" in rows[1]
    assert "background-color: red" in rows[1]
    assert "<td>-0.2500</td>" in rows[1]
    assert "width: 60.0%" in rows[0]
    assert "width: 25.0%" in rows[1]
    assert "<td><i>Constant</i></td>" in rows[3]


@pytest.mark.parametrize("max_rows, expected", [(None, 4), (0, 0), (1, 1), (2, 2), (4, 4), (10, 4)])
def test_explanation_html_max_rows(max_rows, expected):
    page = explanation_html(_rows(), max_rows)
    assert page.count("<tr>") == 1 + expected


def test_explanation_html_max_rows_keeps_the_most_important():
    page = explanation_html(_rows(), max_rows=1)
    assert "i7" in page
    assert "u1" not in page
    assert "Constant" not in page


def test_explanation_html_escapes_names():
    rows = [{"names": [("<b>ns</b>", "<script>alert('x')</script>"), ("", "a&b")],
             "original_feature_name": "irrelevant", "hashindex": 1, "value": 1.0,
             "weight": 0.5, "potential": 0.5, "relative_potential": 1.0}]
    page = explanation_html(rows)
    assert "<script>" not in page
    assert "<b>" not in page
    assert html.escape("<script>alert('x')</script>") in page
    assert "&lt;b&gt;ns&lt;/b&gt;" in page
    assert "a&amp;b" in page


def test_explanation_html_empty():
    page = explanation_html([])
    assert page.count("<tr>") == 1
    assert "<tbody></tbody>" in page


def test_html_explanation_repr_html():
    page = HtmlExplanation("<table></table>")
    assert page._repr_html_() == "<table></table>"
    assert type(page._repr_html_()) is str
    assert page == "<table></table>"


# ------------------------------------------------------------------ formatters


class RecordingFormatter(VowpalWabbitBaseFormatter):
    def format_common_features(self, common_features, debug_info=None):
        return f"|u {common_features}"

    def format_item_features(self, common_features, item_features, debug_info=None):
        return f"|i {item_features}"


class TranslatingFormatter(RecordingFormatter):
    def parse_element(self, element, feature_translator=None):
        namespace, feature = super().parse_element(element, feature_translator)
        return ({"u": "User", "i": "Item"}.get(namespace, namespace),
                feature_translator.get(feature, feature) if feature_translator else feature)


def test_base_formatter_is_abstract():
    with pytest.raises(TypeError):
        VowpalWabbitBaseFormatter()


@pytest.mark.parametrize("kwargs, expected", [
    ({}, "common item"),
    ({"label": 1}, "1 common item"),
    ({"label": 1, "weight": 2.0}, "1 2.0 common item"),
    ({"label": 0}, "0 common item"),
    ({"label": -1}, "-1 common item"),
    ({"label": 0.5}, "0.5 common item"),
    ({"label": 1.0}, "1.0 common item"),
    ({"label": 1e-07}, "1e-07 common item"),
    ({"label": "0,1"}, "0,1 common item"),
    ({"label": "0,1", "weight": 3}, "0,1 3 common item"),
    ({"label": -1, "weight": 0.25}, "-1 0.25 common item"),
    ({"label": 1, "weight": 0}, "1 0 common item"),
    ({"label": None, "weight": None}, "common item"),
    ({"label": 1, "debug_info": {"request": 7}}, "1 common item"),
])
def test_get_formatted_example(kwargs, expected):
    assert RecordingFormatter().get_formatted_example("common", "item", **kwargs) == expected


@pytest.mark.parametrize("weight", [2.0, 0, 1])
def test_get_formatted_example_weight_without_label(weight):
    with pytest.raises(ValueError, match="a weight needs a label"):
        RecordingFormatter().get_formatted_example("common", "item", weight=weight)


def test_get_formatted_example_with_real_parts():
    formatter = RecordingFormatter()
    line = formatter.get_formatted_example(formatter.format_common_features("u1"),
                                           formatter.format_item_features("u1", "i7"), label=-1)
    assert line == "-1 |u u1 |i i7"


@pytest.mark.parametrize("kind", ["label", "weight"])
def test_get_formatted_example_numpy_float64(kind):
    numpy = pytest.importorskip("numpy")
    if kind == "label":
        line = RecordingFormatter().get_formatted_example("c", "i", label=numpy.float64(1.0))
        assert line == "1.0 c i"
    else:
        line = RecordingFormatter().get_formatted_example("c", "i", label=1,
                                                          weight=numpy.float64(0.5))
        assert line == "1 0.5 c i"


@pytest.mark.parametrize("element, expected", [
    ("i^i123", ("i", "i123")),
    ("Constant", ("", "Constant")),
    ("x", ("", "x")),                       # default namespace, as vw 9 prints it
    ("^x", ("", "x")),
    ("user^age^30", ("user", "age^30")),    # only the first caret separates
    ("ns^", ("ns", "")),
])
def test_parse_element(element, expected):
    assert RecordingFormatter().parse_element(element) == expected
    assert RecordingFormatter().parse_element(element, feature_translator=object()) == expected


def test_get_human_readable_explanation_matches_explain_features():
    formatter = RecordingFormatter()
    rows = formatter.get_human_readable_explanation(AUDIT_INTERACTION)
    assert rows == explain_features(AUDIT_INTERACTION, default_parse_element)
    assert rows[0]["names"] == [("i", "i7")]
    assert rows[1]["names"] == [("u", "u1"), ("i", "i7")]


def test_get_human_readable_explanation_uses_overridden_parse_element_and_translator():
    formatter = TranslatingFormatter()
    rows = formatter.get_human_readable_explanation(AUDIT_INTERACTION, {"u1": "Alice", "i7": "Book"})
    by_name = {row["original_feature_name"]: row for row in rows}
    assert by_name["u^u1*i^i7"]["names"] == [("User", "Alice"), ("Item", "Book")]
    assert by_name["Constant"]["names"] == [("", "Constant")]


def test_get_human_readable_explanation_html():
    formatter = TranslatingFormatter()
    page = formatter.get_human_readable_explanation_html(AUDIT_INTERACTION, {"u1": "<Alice>"})
    assert isinstance(page, HtmlExplanation)
    assert page._repr_html_() == str(page)
    assert "User: <i>&lt;Alice&gt;</i>" in page
    assert "<Alice>" not in page
    assert page.count("<tr>") == 1 + 4
    assert page == explanation_html(formatter.get_human_readable_explanation(
        AUDIT_INTERACTION, {"u1": "<Alice>"}))


def test_get_human_readable_explanation_html_max_rows():
    page = RecordingFormatter().get_human_readable_explanation_html(AUDIT_INTERACTION, max_rows=2)
    assert page.count("<tr>") == 1 + 2
    assert "Constant" not in page


def test_get_human_readable_explanation_html_escapes_feature_names():
    page = RecordingFormatter().get_human_readable_explanation_html("\tu^<script>:1:1:0.5")
    assert "<script>" not in page
    assert "u: <i>&lt;script&gt;</i>" in page


def test_dummy_formatter_passes_parts_through():
    formatter = VowpalWabbitDummyFormatter()
    common = formatter.format_common_features("|u u1 k2", debug_info="d")
    item = formatter.format_item_features("|u u1 k2", "|i i7", debug_info="d")
    assert common == "|u u1 k2"
    assert item == "|i i7"
    assert formatter.get_formatted_example(common, item, label=1) == "1 |u u1 k2 |i i7"
    assert isinstance(formatter, VowpalWabbitBaseFormatter)
    assert formatter.parse_element("i^i7") == ("i", "i7")


@pytest.mark.parametrize("cls_name, reduction", [
    ("VowpalWabbitPLTProcess", ["--plt", "4", "--loss_function", "logistic"]),
    ("VowpalWabbitProcess", ["--lrq", "ab2"]),
    ("VowpalWabbitProcess", ["--nn", "2"]), ("VowpalWabbitProcess", ["--bootstrap", "2"]),
    ("VowpalWabbitProcess", ["--interact", "ab"]),
    # a second record (or a replayed example's) for a labelled line while learning
    ("VowpalWabbitProcess", ["--ftrl"]), ("VowpalWabbitProcess", ["--coin"]),
    ("VowpalWabbitProcess", ["--classweight", "1:2"]),
    ("VowpalWabbitProcess", ["--active", "--simulation"]),
    ("VowpalWabbitProcess", ["--active_cover"]),
    ("VowpalWabbitProcess", ["--replay_b", "10"]), ("VowpalWabbitProcess", ["--replay_c", "10"]),
    ("VowpalWabbitProcess", ["--baseline"]),
    # no audit record at all: found only by the start-up probe, after
    # startup_timeout_s (60 s), with a message that did not name the learner
    ("VowpalWabbitProcess", ["--OjaNewton"]), ("VowpalWabbitProcess", ["--svrg"]),
    ("VowpalWabbitProcess", ["--noop"]), ("VowpalWabbitProcess", ["--print"])])
def test_audit_mode_refuses_reductions_that_print_several_audit_records(cls_name, reduction):
    # With these vw prints one audit record per call of the learner under
    # them: more than three lines for some examples, which would shift every
    # later answer. Refused before any engine starts.
    import subwabbit  # pylint: disable=import-outside-toplevel
    cls = getattr(subwabbit, cls_name)
    with pytest.raises(ValueError, match=f"audit_mode cannot serve {reduction[0]}"):
        cls(VowpalWabbitDummyFormatter(), reduction + ["--quiet"], audit_mode=True)
    # without audit mode the same model starts
    cls(VowpalWabbitDummyFormatter(), reduction + ["--quiet"]).close()


@pytest.mark.parametrize("reduction", [["--ftrl"], ["--coin"], ["--classweight", "1:2"],
                                       ["--active", "--simulation"], ["--active_cover"],
                                       ["--replay_b", "10"], ["--replay_c", "10"],
                                       ["--baseline"]])
def test_reductions_that_print_more_only_while_learning_are_explained_with_t(reduction,
                                                                              tmp_path):
    # Refused while they learn (above), served with -t: each line explained
    # gets the engine's own raw score and features. (A fresh model: vw 9
    # cannot load an --active --simulation model it saved.)
    served = reduction + ["-t"]
    with pytest.raises(ValueError, match="while it learns.*explain with -t"):
        VowpalWabbitProcess(VowpalWabbitDummyFormatter(), reduction + ["--quiet"],
                            audit_mode=True)
    asked = ["1 |f a b", "|f c", "-1 |f d e", "1 |f a b"]
    # The engine reading them from a file in audit mode: three lines each,
    # the first of which starts with the raw score.
    audit = engine_from_file(asked, served + ["--audit"], tmp_path)
    assert len(audit) == 3 * len(asked)
    expected = [(float(audit[3 * index].split()[0]),
                 audit[3 * index + 1].decode().strip("\t\r ")) for index in range(len(asked))]
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), served + ["--quiet"],
                             audit_mode=True) as process:
        got = [process.explain_vw_line(line) for line in asked]
    assert got == expected and len({features for _, features in got}) == 3


@pytest.mark.parametrize("reduction", [["--ftrl"], ["--coin"], ["--classweight", "1:2"],
                                       ["--active", "--simulation"], ["--active_cover"],
                                       ["--replay_b", "10"], ["--replay_c", "10"],
                                       ["--baseline"]])
def test_reductions_refused_in_audit_mode_print_more_than_three_lines_per_labelled_line(
        reduction, tmp_path):
    # What the refusal is for: three labelled lines get more audit output
    # than audit mode reads (3 lines each), which made every explain_vw_line
    # of a labelled line on such an engine fail with a VowpalWabbitProtocolError.
    lines = ["1 |f a b", "-1 |f c", "1 |f d"]
    assert len(engine_from_file(lines, reduction + ["--audit"], tmp_path)) > 3 * len(lines)
    assert len(engine_from_file(lines, reduction + ["--audit", "-t"], tmp_path)) == 3 * len(lines)


def test_a_matrix_factorization_model_is_explained_and_its_potentials_add_up(tmp_path):
    # --rank (matrix factorisation) prints its own audit shape: a hash index
    # with the weight slot it reads in parentheses (``a^x:443456(443456):2:-1.09``)
    # and, per latent factor of each -q pair, both features and the product
    # of their factor weights on one entry. parse_audit_features raised
    # "invalid literal for int()" on the first entry of every such line.
    # (Bounds wide enough that vw does not clip the raw scores to the labels'.)
    args = ["--rank", "2", "-q", "ab", "--min_prediction", "-50", "--max_prediction", "50"]
    model = tmp_path / "rank.vw"
    engine_from_file(["1 |a x:2 y |b z", "-1 |a y |b w:0.5"] * 3, args + ["-f", str(model)],
                     tmp_path)
    served = ["-i", str(model), "-t"]
    lines = ["|a x:2 y:0.5 |b z:3", "|a x |b z w", "|a y", "|b w:2"]
    audit = engine_from_file(lines, served + ["--audit"], tmp_path)
    assert len(audit) == 3 * len(lines)
    for index in range(len(lines)):
        raw = float(audit[3 * index])
        explanation = audit[3 * index + 1].decode()
        features = parse_audit_features(explanation)
        assert "(" in explanation and len(features) == explanation.strip("\t").count("\t") + 1
        # the raw score is the sum of the contributions, latent pairs included
        assert sum(f.value * f.weight for f in features) == pytest.approx(raw, abs=1e-4)
    first = parse_audit_features(audit[1].decode())
    assert {(f.name, f.value) for f in first if "*" in f.name} == {("a^x*b^z", 6.0),
                                                                   ("a^y*b^z", 1.5)}
    assert ("a^x", 2.0) in {(f.name, f.value) for f in first}
    # the same explanation through a process in audit mode
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), served + ["--quiet"],
                             audit_mode=True) as process:
        got = [process.explain_vw_line(line) for line in lines]
    assert got == [(float(audit[3 * index]), audit[3 * index + 1].decode().strip("\t"))
                   for index in range(len(lines))]
    rows = VowpalWabbitDummyFormatter().get_human_readable_explanation(got[0][1])
    assert sum(row["potential"] for row in rows) == pytest.approx(got[0][0], abs=1e-4)
    assert [("a", "x"), ("b", "z")] in [row["names"] for row in rows]

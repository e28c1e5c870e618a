"""escape_name: untrusted text can never add a feature, namespace, label or example."""

import re

import pytest

from subwabbit import (VowpalWabbitBaseFormatter, VowpalWabbitDummyFormatter,
                       VowpalWabbitNonBlockingProcess, VowpalWabbitProcess, escape_name,
                       parse_audit_features)
from subwabbit.lines import check_line

from conftest import expected_scalars

HOSTILE = [
    "plain",
    "",
    " ",
    "two words",
    "tab\there",
    "line\nbreak",
    "carriage\rreturn",
    "crlf\r\n",
    "pipe|ns feature",
    "|",
    "key:3.5",
    ":",
    "%",
    "%41",
    "nul\x00byte",
    "\x00",
    "bell\x07 and del\x7f",
    "ünïcödé ✓ 用户",
    "nbsp\u00a0space",
    "line\u2028separator",
    "next\u0085line",
    "1 |u injected:1e9\n1 |u another example",
    "save_/tmp/evil|",
    "'tag",
    "-1 0.5 'tag |x y",
    "emoji 🙂|:",
]


def unescape(name: str) -> str:
    """The inverse of escape_name, written independently for the test."""
    if name == "%":
        return ""
    return re.sub(rb"%([0-9A-F]{2})", lambda m: bytes([int(m.group(1), 16)]),
                  name.encode("utf-8")).decode("utf-8")


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_name_is_one_safe_token(text):
    name = escape_name(text)
    assert name
    assert not set(name) & set(" \t\r\n|:\x00\x0b\x0c")
    assert name.isprintable()
    assert unescape(name) == text


def test_ordinary_names_are_left_readable():
    for text in ["user42", "item-7", "cat=sport", "ünïcödé", "a.b/c"]:
        assert escape_name(text) == text
    assert escape_name(123) == "123"


def test_escaping_is_injective():
    texts = HOSTILE + [escape_name(text) for text in HOSTILE] + ["%25", "%%", "%0A", "\n"]
    names = [escape_name(text) for text in texts]
    assert len(set(names)) == len(set(texts))


def _features_per_namespace(explanation):
    counts = {}
    for feature in parse_audit_features(explanation):
        namespace, _, _ = feature.name.partition("^")
        counts[namespace] = counts.get(namespace, 0) + 1
    return counts


@pytest.mark.parametrize("text", HOSTILE)
def test_engine_reads_an_escaped_value_as_exactly_one_feature(text):
    name = escape_name(text)
    line = f"|u{name} {name} |i {name}:2"
    check_line(line)
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["-t", "--noconstant"], audit_mode=True) as auditor:
        _, explanation = auditor.explain_vw_line(line)
        features = parse_audit_features(explanation)
        assert [feature.name for feature in features] == [f"u{name}^{name}", f"i^{name}"]
        assert [feature.value for feature in features] == [1.0, 2.0]
        # the next example is answered in step: nothing extra was left in the stream
        _, explanation = auditor.explain_vw_line("|z probe")
        assert [feature.name for feature in parse_audit_features(explanation)] == ["z^probe"]


def test_unescaped_values_do_inject_so_the_check_above_can_fail():
    with VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["-t", "--noconstant"], audit_mode=True) as auditor:
        _, explanation = auditor.explain_vw_line("|u two words |i key:3.5")
        assert _features_per_namespace(explanation) == {"u": 2, "i": 1}
        assert parse_audit_features(explanation)[-1].value == 3.5
        _, explanation = auditor.explain_vw_line("|u pipe|ns feature")
        assert _features_per_namespace(explanation) == {"u": 1, "ns": 1}
    with pytest.raises(ValueError, match="line break"):
        check_line("|u line\nbreak")


class UserFormatter(VowpalWabbitBaseFormatter):
    """A formatter that builds names from untrusted user and item text."""

    def format_common_features(self, common_features, debug_info=None):
        return f"|u user={escape_name(common_features)}"

    def format_item_features(self, common_features, item_features, debug_info=None):
        return f"|i title={escape_name(item_features)}"


@pytest.mark.parametrize("cls", [VowpalWabbitProcess, VowpalWabbitNonBlockingProcess],
                         ids=["blocking", "nonblocking"])
def test_hostile_requests_get_one_prediction_per_item(cls, tmp_path):
    formatter = UserFormatter()
    train_args = ["--loss_function", "logistic", "-q", "ui", "--quiet"]
    users = HOSTILE[:12]
    items = HOSTILE[10:]
    with VowpalWabbitProcess(formatter, train_args) as trainer:
        for index, user in enumerate(users):
            trainer.train(user, items, labels=[1 if (index + pos) % 3 else -1
                                               for pos in range(len(items))],
                          weights=[None] * len(items))
        trainer.save(str(tmp_path / "model.vw"))
    score_args = ["-i", str(tmp_path / "model.vw"), "-t", "--quiet"]
    with cls(formatter, score_args) as model:
        for user in users:
            got = list(model.predict(user, items))
            common = formatter.format_common_features(user)
            lines = [formatter.get_formatted_example(common, formatter.format_item_features(user, item))
                     for item in items]
            assert got == pytest.approx(expected_scalars(lines, score_args, tmp_path), abs=1e-6)

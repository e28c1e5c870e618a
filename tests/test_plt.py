"""VowpalWabbitPLTProcess against the real engine."""

import pytest

from subwabbit import VowpalWabbitDummyFormatter, VowpalWabbitPLTProcess

from conftest import engine_from_file

ARGS = ["--plt", "6", "--top_k", "2", "--loss_function", "logistic", "--quiet"]


def test_label_predictions_equal_engine(tmp_path):
    train = [("|f a b", "0,1"), ("|f c", "2"), ("|f a d", "0,3"), ("|f e", "5")] * 5
    probe = ["|f a", "|f c", "|f e", "|f zz"]
    expected = [line.decode().strip() for line in engine_from_file(
        [f"{label} {features}" for features, label in train] + [" " + p for p in probe],
        ARGS, tmp_path)[len(train):]]
    with VowpalWabbitPLTProcess(VowpalWabbitDummyFormatter(), ARGS, batch_size=3) as process:
        process.train("", [features for features, _ in train], [label for _, label in train],
                      [None] * len(train))
        predictions = list(process.predict("", probe))
    assert predictions == expected
    assert all(isinstance(prediction, str) for prediction in predictions)
    assert any("," in prediction for prediction in predictions)


def test_2x_import_paths_still_work():
    from subwabbit.base import VowpalWabbitError as base_error  # pylint: disable=import-outside-toplevel
    from subwabbit.blocking import VowpalWabbitPLTProcess as old_path  # pylint: disable=import-outside-toplevel
    import subwabbit  # pylint: disable=import-outside-toplevel
    assert old_path is subwabbit.VowpalWabbitPLTProcess
    assert base_error is subwabbit.VowpalWabbitError


def test_labels_vw_would_misread_are_refused_before_anything_is_sent(tmp_path):
    """vw reads the label 'a' of --plt as 0, '1.5' as 1, learns nothing right
    from a label out of range and nothing from a weighted line: each is
    refused, and the model is the engine's on the good lines alone."""
    # (a whole float was a label in 2.x: vw reads 2.0 as 2)
    good = [("|f a b", "0,1"), ("|f c", 2), ("|f a d", [0, 3]), ("|f e", "5"), ("|f c", 2.0)] * 3
    probe = ["|f a", "|f c", "|f e"]
    expected = [line.decode().strip() for line in engine_from_file(
        [f"{label if isinstance(label, (str, int, float)) else ','.join(map(str, label))} "
         f"{features}"
         for features, label in good] + [" " + p for p in probe],
        ARGS, tmp_path)[len(good):]]
    with VowpalWabbitPLTProcess(VowpalWabbitDummyFormatter(), ARGS) as process:
        for labels, error in ((["a"], ValueError), (["1.5"], ValueError), (["6"], ValueError),
                              ([6], ValueError), (["0,7"], ValueError), (["0 1"], ValueError),
                              ([None], ValueError), ([1.5], TypeError)):
            with pytest.raises(error, match=r"labels\[0\]"):
                process.train("", ["|f a"], labels)
        with pytest.raises(ValueError, match="weight"):
            process.train("", ["|f a"], ["1"], [2.0])
        process.train("", [features for features, _ in good], [label for _, label in good])
        assert list(process.predict("", probe)) == expected


def test_without_a_multilabel_reduction_labels_are_as_for_a_scalar_model():
    with VowpalWabbitPLTProcess(VowpalWabbitDummyFormatter(), ["--quiet"]) as process:
        process.train("", ["|f a", "|f b"], ["1", 0.5], [2.0, None])
        assert len(list(process.predict("", ["|f a"]))) == 1


@pytest.mark.parametrize("args", [ARGS, ["--multilabel_oaa", "6", "--quiet"]])
def test_a_tagged_example_gives_its_labels_not_its_tag(args, tmp_path):
    """vw prints an example's tag after the label list (``'0,1  t1'``, and
    ``'  t1'`` when no label applies): the prediction is the label string
    without it. The tag used to be kept, and an example without labels gave
    its tag (``'t1'``) as if it were the label string."""
    train = [("|f a b", "0,1"), ("|f c", "2"), ("|f d", "3")] * 5
    probe = ["'t1 |f a", "'t2 |f zz", "'t3 |f c"]
    raw = engine_from_file([f"{label} {features}" for features, label in train] + probe,
                           args, tmp_path)[len(train):]
    expected = [line.split(b" ")[0].decode() for line in raw]
    assert any(expected)
    if "--multilabel_oaa" in args:
        assert raw[1] == b"  t2" and expected[1] == ""  # no label applies
    assert all(line.endswith(tag) for line, tag in zip(raw, (b"t1", b"t2", b"t3")))
    with VowpalWabbitPLTProcess(VowpalWabbitDummyFormatter(), args) as process:
        process.train("", [features for features, _ in train], [label for _, label in train])
        assert list(process.predict("", probe)) == expected

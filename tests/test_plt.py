"""VowpalWabbitPLTProcess against the real engine."""

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

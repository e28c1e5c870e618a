"""Reading the options a vw model file saved (files of the wheel's engine; the
vw 9.11.9 executable's have the same header, see SAVED in test_kinds.py)."""

import gzip
import shutil

import pytest

from subwabbit import VowpalWabbitDummyFormatter, VowpalWabbitProcess, VowpalWabbitStartupError
from subwabbit.model_file import (HEADER_BYTES, model_file_path, saved_options,
                                  saved_options_of)

from conftest import engine_from_file


@pytest.mark.parametrize("args, saved", [
    (["--oaa", "3", "--named_labels", "walk,run,sprint"],
     ["--named_labels", "walk,run,sprint", "--oaa", "3"]),
    (["--cb_explore_adf", "--epsilon", "0.2"],
     ["--cb_adf", "--cb_explore_adf", "--cb_type", "mtr", "--csoaa_ldf", "multiline",
      "--csoaa_rank", "--epsilon", "0.200000002980232"]),
    (["-q", "ab", "--link", "logistic"], ["--link", "logistic", "--quadratic", "ab"]),
    (["--plt", "6", "--loss_function", "logistic"], ["--plt", "6"]),
])
def test_the_saved_options_are_read_from_a_model_file(args, saved, tmp_path):
    path = str(tmp_path / "model.vw")
    engine_from_file(["|a x"], args + ["-f", path], tmp_path)
    assert saved_options(path) == saved
    assert saved_options_of(["-t", "-i", path, "--quiet"]) == saved
    # a compressed copy gives the same
    with open(path, "rb") as source, gzip.open(str(tmp_path / "model.vw.gz"), "wb") as target:
        shutil.copyfileobj(source, target)
    assert saved_options(str(tmp_path / "model.vw.gz")) == saved


def test_a_long_option_text_is_read_whole(tmp_path):
    """4,000 class names make an option text longer than the part of the
    file searched for its start (HEADER_BYTES)."""
    names = [f"class_name_{index:08d}_é" for index in range(4000)]
    path = str(tmp_path / "model.vw")
    engine_from_file(["|a x"], ["--oaa", "4000", "--named_labels", ",".join(names), "-f", path],
                     tmp_path)
    saved = saved_options(path)
    assert saved == ["--named_labels", ",".join(names), "--oaa", "4000"]
    assert len(saved[1]) > HEADER_BYTES


def test_no_options_from_a_file_that_is_not_a_model_file_or_saved_none(tmp_path):
    plain = str(tmp_path / "plain.vw")
    engine_from_file(["|a x"], ["-f", plain], tmp_path)
    assert saved_options(plain) is None  # a model with no options saved
    other = tmp_path / "other.bin"
    other.write_bytes(b"\x07\x00\x00\x00not a model --oaa 3\x00" + bytes(range(256)))
    assert saved_options(str(other)) is None
    assert saved_options(str(tmp_path / "missing.vw")) is None
    assert saved_options(str(tmp_path)) is None  # a directory
    assert saved_options_of(["--oaa", "3"]) == []


@pytest.mark.parametrize("args, path", [
    (["-i", "m.vw", "-t"], "m.vw"),
    (["-im.vw"], "m.vw"),
    (["--initial_regressor", "m.vw"], "m.vw"),
    (["--initial_regressor=m.vw", "-i", "n.vw"], "m.vw"),
    (["-t", "-i"], None),
    (["--invert_hash", "x", "-t"], None),
])
def test_the_model_file_is_found_in_the_arguments(args, path):
    assert model_file_path(args) == path


def test_a_corrupt_gzipped_model_fails_to_start_with_a_startup_error(tmp_path):
    # Found by a review: a damaged deflate stream raised zlib.error out of the
    # model file's header read, past the constructors and reload().
    bad = tmp_path / "bad.vw"
    bad.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + b"\xff" * 64)
    assert saved_options(str(bad)) is None
    with pytest.raises(VowpalWabbitStartupError):
        VowpalWabbitProcess(VowpalWabbitDummyFormatter(), ["-i", str(bad), "-t", "--quiet"])

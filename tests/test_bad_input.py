"""Bad arguments raise a clear exception before anything reaches an
engine, the same on every client class."""

import collections
import os
import pathlib
import re
import resource
import signal
import types
import typing

import pytest

from subwabbit import VowpalWabbitDummyFormatter, VowpalWabbitStartupError

from conftest import (Client, DictFormatter, children_of_this_process, common, items, open_fds,
                      scoring_args, wait_until)

#: Every client class, as :class:`conftest.Client` names them.
EVERY_CLASS = ["blocking", "nonblocking", "asyncio", "pool", "asyncio-pool"]


def sized(kind):
    """The constructor arguments a class needs besides the formatter and ``vw_args``."""
    return {"size": 1} if "pool" in kind else {}


@pytest.mark.parametrize("kind", EVERY_CLASS)
@pytest.mark.parametrize("vw_args", [b"-t --quiet", bytearray(b"--quiet"),
                                     {"-t": True, "--quiet": True}, {"--quiet"},
                                     pathlib.Path("model.vw"), None, 18])
def test_vw_args_that_are_not_a_list_of_arguments_are_refused_before_an_engine_starts(
        kind, vw_args):
    """``bytes`` used to be read as a list of ints (the engine was started
    with ``45 116 32 ...`` and failed with a start-up error), a dict as its
    keys (the engine started without the values); ``None`` and a path
    raised "object is not iterable"."""
    before = set(children_of_this_process())
    with pytest.raises(TypeError, match="vw_args must be a list of engine arguments or one string"):
        Client(kind, DictFormatter(), vw_args, **sized(kind))
    assert set(children_of_this_process()) <= before


@pytest.mark.parametrize("kind", EVERY_CLASS)
def test_a_path_in_vw_args_is_the_engine_argument_it_names(kind, trained_model, truth):
    """2.x passed ``vw_args`` to the engine as they were, so
    ``["-i", Path("model.vw")]`` loaded the model; it raised
    ``TypeError: vw_args must hold strings or numbers``."""
    args = scoring_args(trained_model)
    args[args.index("-i") + 1] = pathlib.Path(trained_model)
    client = Client(kind, DictFormatter(), args, **sized(kind))
    try:
        assert client.predict(common(1), items(200)) == truth[trained_model][1][:200]
    finally:
        client.close()


@pytest.mark.parametrize("kind", EVERY_CLASS)
def test_metrics_that_are_not_a_dict_are_refused_before_the_call_and_the_next_call_is_exact(
        kind, trained_model, truth):
    """They raised what the first dict method tried on them said: ``pop
    expected at most 1 argument, got 2`` for a list, ``'str' object has no
    attribute 'pop'``, ``list indices must be integers or slices, not str``
    (``detailed_metrics``)."""
    client = Client(kind, DictFormatter(), scoring_args(trained_model), **sized(kind))
    expected = truth[trained_model][2][:300]
    try:
        for metrics in ([], "num_lines", 5, False, (), types.MappingProxyType({})):
            with pytest.raises(TypeError, match=r"^metrics must be a dict for the call to fill"):
                client.predict(common(2), items(300), metrics=metrics)
            if "pool" not in kind:
                with pytest.raises(TypeError, match=r"^detailed_metrics must be a dict"):
                    client.predict(common(2), items(300), detailed_metrics=metrics)
            assert client.predict(common(2), items(300)) == expected
        filled: "collections.OrderedDict[str, object]" = collections.OrderedDict()
        assert client.predict(common(2), items(300), metrics=filled) == expected
        assert filled["num_lines"] == 300
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["nonblocking", "asyncio"])
@pytest.mark.parametrize("value, error", [(-1, ValueError), (float("nan"), ValueError),
                                          ("0.002", TypeError), (True, TypeError)])
def test_a_bad_write_timeout_ms_is_named_in_its_error(kind, value, error):
    """The deprecated alias was checked under the name of the setting it
    stands for: ``write_timeout_ms=-1`` raised ``write_cutoff_s must be a
    non-negative number of seconds``, which the caller never passed."""
    before = set(children_of_this_process())
    with pytest.warns(DeprecationWarning), \
            pytest.raises(error, match=r"^write_timeout_ms must be a"):
        Client(kind, DictFormatter(), ["--quiet"], write_timeout_ms=value)
    assert set(children_of_this_process()) <= before


@pytest.mark.parametrize("kind", ["nonblocking", "asyncio"])
@pytest.mark.parametrize("size", [2 ** 31 + 1, 2 ** 32 + 8192, 2 ** 40])
def test_a_pipe_size_beyond_what_linux_takes_is_refused_before_an_engine_starts(kind, size):
    """``fcntl`` passes the size as a C int: 2**32 + 8192 gave an 8 KiB pipe
    and 2**40 a 4 KiB one, silently."""
    before = set(children_of_this_process())
    with pytest.raises(ValueError, match=r"^pipe_buffer_size_bytes must be a positive int up to"):
        Client(kind, DictFormatter(), ["--quiet"], pipe_buffer_size_bytes=size)
    assert set(children_of_this_process()) <= before


@pytest.mark.parametrize("kind", ["nonblocking", "asyncio"])
def test_a_pipe_size_the_system_refuses_is_a_value_error_naming_the_setting(kind):
    """It raised the bare ``PermissionError: [Errno 1] Operation not
    permitted`` of ``fcntl``, which names nothing."""
    with open("/proc/sys/fs/pipe-max-size", encoding="ascii") as limit:
        size = 4 * int(limit.read())
    before = set(children_of_this_process())
    try:
        client = Client(kind, DictFormatter(), ["--quiet"], pipe_buffer_size_bytes=size)
    except ValueError as exc:
        assert str(exc).startswith(f"pipe_buffer_size_bytes={size}: the system refused")
    else:
        client.close()
        pytest.skip("this process may make pipes larger than pipe-max-size")
    assert wait_until(lambda: set(children_of_this_process()) <= before)


def save(client, *args):
    if client.loop is not None:
        return client.loop.run_until_complete(client.model.save(*args))
    return client.model.save(*args)


@pytest.mark.parametrize("kind", ["blocking", "nonblocking", "asyncio"])
def test_save_takes_a_path_not_its_repr_and_refuses_none_empty_and_directories(
        kind, trained_model, truth, tmp_path, monkeypatch):
    """``save(path)`` used ``str(path)``: ``save(None)`` wrote a model named
    ``None`` in the working directory, ``save(b"/x/m.vw")`` one at
    ``./b'/x/m.vw'`` (creating the directories), and ``save("")`` and
    ``save(a_directory)`` had the engine write the model beside the
    directory before the rename failed."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    client = Client(kind, DictFormatter(), scoring_args(trained_model))
    expected = truth[trained_model][3][:200]
    try:
        with pytest.raises(TypeError):
            save(client, None)
        with pytest.raises(ValueError, match="empty"):
            save(client, "")
        with pytest.raises(IsADirectoryError) as refused:
            save(client, str(tmp_path))
        assert refused.value.filename == str(tmp_path)
        assert sorted(path.name for path in tmp_path.iterdir()) == ["work"]
        assert list(work.iterdir()) == []
        target = tmp_path / "saved" / "model.vw"
        save(client, bytes(target))
        assert target.exists() and list(work.iterdir()) == []
        assert client.predict(common(3), items(200)) == expected
    finally:
        client.close()



@pytest.mark.parametrize("kind", ["blocking", "nonblocking", "asyncio"])
@pytest.mark.parametrize("name, refusal", [
    ("m\0odel.vw", "a path holds no NUL byte"),
    ("di\0r/model.vw", "a path holds no NUL byte"),
    ("line\nbreak/model.vw", r"takes no whitespace \(spaces, tabs, line breaks\)"),
    ("carriage\rreturn/model.vw", r"takes no whitespace \(spaces, tabs, line breaks\)"),
    (b"bytes\xff/model.vw", "takes only paths that are UTF-8 text"),
])
def test_save_refuses_a_path_its_command_line_cannot_carry_before_writing_anything(
        kind, name, refusal, trained_model, truth, tmp_path):
    """A NUL byte raised the bare ``embedded null byte`` of ``os.makedirs``;
    a line break in a directory's name created that directory before the
    path was refused; a ``bytes`` path that is not UTF-8 raised
    ``UnicodeEncodeError`` once a file had been created and removed beside
    it. Each is refused, naming the path, before anything is written, and
    the engine serves on."""
    target = (bytes(tmp_path) + b"/" + name if isinstance(name, bytes)
              else str(tmp_path / name))
    client = Client(kind, DictFormatter(), scoring_args(trained_model))
    try:
        with pytest.raises(ValueError, match=refusal):
            save(client, target)
        assert list(tmp_path.iterdir()) == []
        assert client.predict(common(3), items(200)) == truth[trained_model][3][:200]
    finally:
        client.close()


def test_save_is_annotated_with_the_paths_it_takes():
    """``save`` takes ``str``, ``bytes`` and path-like paths (above), but its
    annotation said ``str``: the API reference showed ``save(path: str)``
    and mypy refused ``model.save(pathlib.Path(...))``."""
    from subwabbit import AsyncVowpalWabbitProcess, VowpalWabbitProcess  # pylint: disable=import-outside-toplevel
    for cls in (VowpalWabbitProcess, AsyncVowpalWabbitProcess):
        taken = typing.get_args(typing.get_type_hints(cls.save)["path"])
        assert str in taken and bytes in taken, (cls, taken)
        assert any(typing.get_origin(hint) is os.PathLike for hint in taken), (cls, taken)


@pytest.mark.parametrize("deadline, error", [("soon", TypeError), (True, TypeError),
                                             ([1.0], TypeError), (float("nan"), ValueError)])
def test_nonblocking_cleanup_refuses_a_deadline_that_is_not_a_time(deadline, error, trained_model,
                                                                    truth):
    """``cleanup(deadline)`` used the value as it was: with nothing in
    flight any value returned ``True``; with leftovers ``"soon"`` raised
    ``'>=' not supported between instances of 'float' and 'str'``, NaN
    ``Invalid value NaN (not a number)`` and ``True`` was taken as the
    time 1.0."""
    client = Client("nonblocking", DictFormatter(), scoring_args(trained_model))
    process = client.model
    expected = truth[trained_model][4][:300]
    try:
        with pytest.raises(error, match=r"^deadline must be a time.perf_counter\(\) value"):
            process.cleanup(deadline)
        os.kill(process.pid, signal.SIGSTOP)  # what the next call sends stays unanswered
        try:
            assert client.predict(common(4), items(300), timeout=0.05) == []
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert process.pending_lines > 0
        with pytest.raises(error, match=r"^deadline must be a time.perf_counter\(\) value"):
            process.cleanup(deadline)
        assert process.cleanup(None) and process.pending_lines == 0
        assert client.predict(common(4), items(300)) == expected
    finally:
        client.close()


@pytest.mark.parametrize("kind", EVERY_CLASS)
def test_one_string_for_the_items_or_the_labels_is_refused_before_anything_is_sent(kind, tmp_path):
    """A string is an iterable of characters: ``predict("", "|f a")`` with
    the dummy formatter gave four predictions, for the examples ``' |'``,
    ``' f'``, ``'  '`` and ``' a'``, and ``train("", "|f a", [1, 0, 1, 0])``
    taught the model those four lines; ``labels="10"`` were two labels."""
    client = Client(kind, VowpalWabbitDummyFormatter(), ["--quiet"], **sized(kind))
    try:
        for text in ("|f a", b"|f a"):
            with pytest.raises(TypeError, match=r"^items_features must hold one entry per item"):
                client.predict("", text)
        if client.trains:
            fresh = client.predict("", ["|f a", "|f b"])
            with pytest.raises(TypeError, match=r"^items_features must hold one entry per item"):
                client.train("", "|f a", [1, 0, 1, 0])
            with pytest.raises(TypeError, match=r"^labels must hold one entry per item"):
                client.train("", ["|f a", "|f b"], "10")
            with pytest.raises(TypeError, match=r"^weights must hold one entry per item"):
                client.train("", ["|f a", "|f b"], [1, 0], "11")
            assert client.predict("", ["|f a", "|f b"]) == fresh  # nothing was learnt
            client.train("", ["|f a", "|f b"], [1, 0])
            assert client.predict("", ["|f a", "|f b"]) != fresh
    finally:
        client.close()


@pytest.mark.parametrize("kind", EVERY_CLASS)
def test_items_labels_or_weights_that_are_not_iterable_are_named_in_their_error(kind):
    """``weights=1.0`` (one weight for every item) and ``labels=None``
    raised Python's bare "'float' object is not iterable", naming nothing;
    ``predict("", None)`` did the same."""
    client = Client(kind, VowpalWabbitDummyFormatter(), ["--quiet"], **sized(kind))
    try:
        for value in (None, 5, 1.5):
            with pytest.raises(TypeError, match=r"^items_features must hold one entry per item"):
                client.predict("", value)
        if client.trains:
            fresh = client.predict("", ["|f a", "|f b"])
            with pytest.raises(TypeError, match=r"^labels must hold one entry per item.*NoneType"):
                client.train("", ["|f a", "|f b"], None)
            with pytest.raises(TypeError, match=r"^weights must hold one entry per item.*float 1\.0"):
                client.train("", ["|f a", "|f b"], [1, 0], 1.0)
            assert client.predict("", ["|f a", "|f b"]) == fresh  # nothing was learnt
            client.train("", ["|f a", "|f b"], [1, 0], None)  # no weights: still allowed
            assert client.predict("", ["|f a", "|f b"]) != fresh
    finally:
        client.close()


FLAGS = {"blocking": ["write_only", "audit_mode", "restart_on_crash", "restart_after_fork"],
         "nonblocking": ["audit_mode", "restart_on_crash", "restart_after_fork"],
         "asyncio": ["audit_mode", "restart_on_crash", "restart_after_fork"],
         "pool": ["restart_after_fork", "share_weights", "low_priority_engines"],
         "asyncio-pool": ["restart_after_fork", "share_weights", "low_priority_engines"]}


@pytest.mark.parametrize("kind", EVERY_CLASS)
@pytest.mark.parametrize("value", ["no", "False", b"", [], 2])
def test_a_yes_or_no_setting_that_is_not_true_or_false_is_refused_before_an_engine_starts(
        kind, value):
    """They were read with ``bool()``: ``audit_mode="False"`` started an
    engine in audit mode and ``restart_on_crash="no"`` restarted it."""
    before = set(children_of_this_process())
    for name in FLAGS[kind]:
        with pytest.raises(TypeError, match=f"^{name} must be True or False, not "):
            Client(kind, DictFormatter(), ["--quiet"], **sized(kind), **{name: value})
    assert set(children_of_this_process()) <= before


@pytest.mark.parametrize("kind", EVERY_CLASS)
def test_yes_or_no_settings_take_numbers_and_numpy_booleans(kind):
    """What equals True or False (1, 0, NumPy's booleans) and None, which
    ``bool()`` read as False, are still taken, as the bools they stand for."""
    numpy = pytest.importorskip("numpy")
    name = FLAGS[kind][-2]
    for value, meant in ((1, True), (0, False), (numpy.True_, True), (numpy.bool_(False), False),
                         (None, False), (True, True)):
        client = Client(kind, DictFormatter(), ["--quiet"], **sized(kind), **{name: value})
        try:
            assert getattr(client.model, name) is meant
        finally:
            client.close()


@pytest.mark.parametrize("kind", EVERY_CLASS)
@pytest.mark.parametrize("vw_args", [["--quiet", "-b"], ["--quiet", "-f"],
                                     ["--cb_adf", "--readable_model"]])
def test_an_option_without_its_value_at_the_end_takes_none_of_the_added_arguments(
        kind, vw_args, tmp_path, monkeypatch):
    """``--log_level error`` (for ``--quiet``) and ``--rank_all`` (for
    ``--cb_adf``) were added after ``vw_args``, so a last option without its
    value took them: ``-b`` failed with ``Failed to convert --log_level``,
    ``-f`` made the engine read its examples from a file named ``error``
    (and answer the probe from it) and ``--readable_model`` dropped
    ``--rank_all`` (a start-up error asking for ``prediction_type=``). The
    engine now says the option lacks its value, as vw does, and makes no file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "error").write_text("1 |a x\n" * 5, encoding="ascii")
    before = set(children_of_this_process())
    with pytest.raises(VowpalWabbitStartupError, match=r"Expected value for"):
        Client(kind, VowpalWabbitDummyFormatter(), vw_args, **sized(kind))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["error"]
    assert wait_until(lambda: set(children_of_this_process()) <= before)


@pytest.mark.parametrize("kind", EVERY_CLASS)
@pytest.mark.parametrize("vw_command", [b"/usr/bin/vw", 5, [b"/usr/bin/vw"],
                                        ["/usr/bin/env", None, "vw"]])
def test_a_vw_command_that_is_not_a_path_or_a_list_of_words_is_refused_before_an_engine_starts(
        kind, vw_command):
    """``bytes`` was read as a list of ints (the engine command ``47 117
    115 ...``: "cannot run the vw engine '47'"), ``5`` raised "'int' object
    is not iterable", and a ``bytes`` or ``None`` word was passed on as its
    ``str()``: ``"b'/usr/bin/vw'"``, or ``None`` that ``env`` tried to run."""
    before = set(children_of_this_process())
    with pytest.raises(TypeError, match=r"^vw_command must "):
        Client(kind, DictFormatter(), ["--quiet"], vw_command=vw_command, **sized(kind))
    assert set(children_of_this_process()) <= before


@pytest.mark.parametrize("kind", EVERY_CLASS)
@pytest.mark.parametrize("vw_args", [["--help"], ["-h"], ["--version"], ["-t", "--dry_run"]])
def test_options_with_which_vw_serves_nothing_are_refused_before_an_engine_starts(kind, vw_args):
    """The engine started and printed its help or version where the probe's
    answer was expected: "the vw engine printed b'    -a, --audit ...'
    where no answer was expected ... pass prediction_type=". With
    ``--dry_run`` vw exited at once ("exited during start-up", code 0, no
    message), and the wheel's engine served as if it were not there."""
    before = set(children_of_this_process())
    with pytest.raises(ValueError, match=rf"^vw_args must not contain '{vw_args[-1]}': vw would"):
        Client(kind, DictFormatter(), vw_args, **sized(kind))
    assert set(children_of_this_process()) <= before


@pytest.mark.parametrize("kind", ["pool", "asyncio-pool"])
def test_a_pool_larger_than_any_machine_runs_is_refused_before_an_engine_starts(kind):
    """``size=10**6`` started engines on as many threads as it could, until
    the process ran out of open files or the machine of processes, and
    raised what failed first."""
    before = set(children_of_this_process())
    with pytest.raises(ValueError, match=r"^size=1025 is more engines than a pool may have "
                                         r"here: .*MAX_POOL_SIZE = 1024"):
        Client(kind, DictFormatter(), ["--quiet"], size=1025)
    assert set(children_of_this_process()) <= before


@pytest.mark.parametrize("kind", ["pool", "asyncio-pool"])
def test_a_pool_the_open_files_limit_cannot_hold_is_refused_before_an_engine_starts(kind):
    """A pool whose engines' pipes, twice over during a reload, do not fit
    in ``ulimit -n`` failed half way with ``Too many open files``; it is
    refused at construction, naming the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = open_fds() + 40
    size = max(2, lowered // 4)  # more pipes than the 40 spare files hold
    before = set(children_of_this_process())
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        with pytest.raises(ValueError, match=rf"^size={size} is more engines than a pool may "
                                             rf"have here: .*RLIMIT_NOFILE, ulimit -n: {lowered}"):
            Client(kind, DictFormatter(), ["--quiet"], size=size)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert wait_until(lambda: set(children_of_this_process()) <= before)


@pytest.mark.parametrize("kind", EVERY_CLASS)
@pytest.mark.parametrize("value", [0, 0.0, -0.0])
def test_a_start_up_timeout_of_no_time_is_refused_before_an_engine_starts(kind, value):
    """``startup_timeout_s=0`` started an engine and raised the start-up
    error of an engine that did not answer its probe ("is the model
    multi-line, or is it still loading?"), which misnames the cause."""
    before = set(children_of_this_process())
    with pytest.raises(ValueError, match=r"^startup_timeout_s must be positive"):
        Client(kind, DictFormatter(), ["--quiet"], startup_timeout_s=value, **sized(kind))
    assert wait_until(lambda: set(children_of_this_process()) <= before)


@pytest.mark.parametrize("kind", EVERY_CLASS)
@pytest.mark.parametrize("formatter", [VowpalWabbitDummyFormatter, DictFormatter])
def test_a_formatter_class_instead_of_an_instance_is_refused_before_an_engine_starts(
        kind, formatter):
    """The class has the formatter methods, so it was taken; the first call
    then passed the request's features as ``self`` and failed with
    ``missing 1 required positional argument``."""
    before = set(children_of_this_process())
    with pytest.raises(TypeError, match=rf"^formatter must be a formatter object, not the class "
                                        rf"{formatter.__name__}: pass {formatter.__name__}\(\)$"):
        Client(kind, formatter, ["--quiet"], **sized(kind))
    assert wait_until(lambda: set(children_of_this_process()) <= before)



@pytest.mark.parametrize("kind", EVERY_CLASS)
@pytest.mark.parametrize("vw_args", [["--quiet", "--examples", "3"], ["--examples=3"],
                                     "--quiet --examples 3"])
def test_an_example_limit_is_refused_before_an_engine_starts(kind, vw_args):
    """With ``--examples 3`` the engine exited after three examples: the
    call that sent the fourth raised ``the vw engine closed its output``,
    and so did the calls after it."""
    before = set(children_of_this_process())
    with pytest.raises(ValueError, match=r"^vw_args must not contain '--examples(=3)?': vw would "
                                         r"exit after that many examples"):
        Client(kind, DictFormatter(), vw_args, **sized(kind))
    assert set(children_of_this_process()) <= before



@pytest.mark.parametrize("kind", EVERY_CLASS)
@pytest.mark.parametrize("vw_args, option, path", [
    (["--quiet", "--audit_regressor", "/dev/stdout"], "--audit_regressor", "/dev/stdout"),
    (["--quiet", "--readable_model", "/dev/fd/1"], "--readable_model", "/dev/fd/1"),
    (["--quiet", "--invert_hash=/proc/self/fd/1"], "--invert_hash", "/proc/self/fd/1"),
    (["--quiet", "-f/dev/stdout"], "-f", "/dev/stdout"),
    ("--quiet -r /dev/./stdout", "-r", "/dev/./stdout"),
])
def test_a_file_option_writing_to_the_engines_stdout_is_refused_before_an_engine_starts(
        kind, vw_args, option, path):
    """Only ``-r stdout`` was refused: ``--audit_regressor /dev/stdout``
    wrote into the answers and the engine failed its start-up probe, and a
    model or readable model sent to ``/dev/fd/1`` made ``close()`` raise
    that the engine failed while shutting down."""
    before = set(children_of_this_process())
    with pytest.raises(ValueError, match=rf"^vw_args must not have {option} write to "
                                         rf"'{re.escape(path)}', the engine's stdout"):
        Client(kind, DictFormatter(), vw_args, **sized(kind))
    assert set(children_of_this_process()) <= before

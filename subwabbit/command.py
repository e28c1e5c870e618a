"""Choosing the engine command and checking the arguments given to it."""

import functools
import logging
import numbers
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Set as AbstractSet
from typing import List, Optional, Sequence, Tuple, Union

from .engine.program import option_name

#: Environment variable that names the engine command (parsed with :func:`shlex.split`).
ENGINE_ENV_VAR = "SUBWABBIT_VW"

#: Options the client sets itself (it owns the engine's input, output and logs), and
#: those with which the engine serves nothing.
_OWNED_OPTIONS = {
    "-p": "predictions are read from the engine's stdout by subwabbit",
    "--predictions": "predictions are read from the engine's stdout by subwabbit",
    "-d": "examples are sent on the engine's stdin by subwabbit",
    "--data": "examples are sent on the engine's stdin by subwabbit",
    "--daemon": "subwabbit talks to the engine over pipes, not sockets",
    "--port": "subwabbit talks to the engine over pipes, not sockets",
    "--log_output": "subwabbit sends the engine's logs to stderr and forwards them to logging",
    "--driver_output": "subwabbit keeps the engine's stdout for predictions",
    "-a": "pass audit_mode=True instead",
    "--audit": "pass audit_mode=True instead",
    # and options with which the engine prints something else and serves nothing
    "-h": "vw would print its help instead of serving",
    "--help": "vw would print its help instead of serving",
    "--version": "vw would print its version instead of serving",
    "--dry_run": "vw would check its arguments and exit instead of serving",
    # and those with which it ends while the client still serves
    "--examples": "vw would exit after that many examples, and every call after them would "
                  "find the engine gone",
}

#: The tokens of vw's audit switch, which audit mode adds itself.
_AUDIT_FLAGS = ("-a", "--audit")

VwArgs = Union[Sequence[Union[str, int, float, "os.PathLike[str]"]], str]


def normalize_vw_args(vw_args: VwArgs, audit_mode: bool = False) -> List[str]:
    """Check user-supplied engine arguments and return them as a list of strings.

    :param vw_args: a list of tokens (``['-q', 'ui', '--l2', 1e-6]``; a path
        such as a :class:`pathlib.Path`, and NumPy numbers, are taken as their
        text, as 2.x passed its list to the engine) or one string split like
        a shell would
    :param audit_mode: the engine runs in audit mode: an ``-a``/``--audit``
        token is then dropped (subwabbit adds it), as subwabbit 2.x took it
        from vw_args with ``audit_mode=True``, instead of refused
    :returns: the arguments as strings
    :raises ValueError: for an option subwabbit controls itself (``-p``, ``-d``,
        ``--audit``, ...), with which vw serves nothing (``--help``,
        ``--version``, ``--dry_run``) or stops serving (``--examples``), a
        file option that writes to the engine's stdout (``--readable_model
        /dev/stdout``, ``-r stdout``: :func:`names_stdout`), or a token with
        a NUL byte (reductions subwabbit
        cannot serve are refused by :func:`~subwabbit.core.kinds.choose_kind`)
    :raises TypeError: for ``vw_args`` that are neither one string nor a
        sequence of tokens (``bytes``, whose items are ints, a dict, a set,
        ``None``), or a token that is not a string, a path or a number
    """
    if isinstance(vw_args, str):
        tokens: List[str] = shlex.split(vw_args)
    else:
        if (isinstance(vw_args, (bytes, bytearray, memoryview, Mapping, AbstractSet))
                or not isinstance(vw_args, Iterable)):
            raise TypeError("vw_args must be a list of engine arguments or one string, got "
                            f"{type(vw_args).__name__} {vw_args!r}")
        tokens = [_token_text(token) for token in vw_args]
    if audit_mode:
        tokens = [token for token in tokens if token not in _AUDIT_FLAGS]
    for index, token in enumerate(tokens):
        if "\0" in token:
            raise ValueError(f"vw_args[{index}] contains a NUL byte: {token!r}")
        name = option_name(token)
        if name in _OWNED_OPTIONS:
            raise ValueError(f"vw_args must not contain {token!r}: {_OWNED_OPTIONS[name]}")
        if name is None:
            continue
        value = _option_value(tokens, index)
        if name in ("-r", "--raw_predictions") and value == "stdout":
            raise ValueError("vw_args must not send raw predictions to stdout: "
                             "subwabbit reads predictions from it")
        if names_stdout(value):
            raise ValueError(f"vw_args must not have {name} write to {value!r}, the engine's "
                             "stdout: subwabbit reads predictions from it, and anything else "
                             "written there is taken for them or ends the engine")
    return tokens


#: Paths through which a process writes to its own stdout.
_STDOUT_PATH = re.compile(r"/dev/stdout|/dev/fd/1|/proc/(?:self|thread-self|\d+)/fd/1")


def names_stdout(value: str) -> bool:
    """Whether the file ``value`` is the engine's stdout (``/dev/stdout``,
    ``/dev/fd/1``, ``/proc/self/fd/1``, also written with ``.``, ``..`` or
    doubled slashes). The plain word ``stdout`` is a file of that name for
    every option but ``-p`` and ``-r``."""
    return bool(value) and _STDOUT_PATH.fullmatch(
        "/" + os.path.normpath(value).lstrip("/") if value.startswith("/") else value) is not None


def _option_value(tokens: Sequence[str], index: int) -> str:
    """The value the option at ``tokens[index]`` may take: after its ``=``
    (``--name=value``), the rest of a short option (``-fFILE``; ``-f=FILE``
    is taken as ``FILE``), else the next token when that is no option
    (``""`` when there is none)."""
    token = tokens[index]
    if token.startswith("--"):
        if "=" in token:
            return token.split("=", 1)[1]
    elif len(token) > 2:
        return token[3:] if token[2] == "=" else token[2:]
    following = tokens[index + 1] if index + 1 < len(tokens) else ""
    return following if option_name(following) is None else ""


#: Options that give the engine a cache file, and those that make it a new one.
_CACHE_OPTIONS = ("-c", "--cache", "--cache_file")
_KILL_CACHE_OPTIONS = ("-k", "--kill_cache")


def refuse_stale_cache(tokens: Sequence[str]) -> None:
    """Refuse a cache file without ``--kill_cache``: when the file exists
    (from an earlier run; ``-c`` names it ``.cache`` in the working
    directory for an engine reading stdin), vw reads its examples instead
    of stdin. A write-only engine then learned the old examples again and
    nothing that ``train`` sent; a predicting one printed predictions
    nobody asked for.

    :param tokens: normalised engine arguments
    :raises ValueError: for a cache option without ``-k``/``--kill_cache``
    """
    names = [option_name(token) for token in tokens]
    cache = next((name for name in names if name in _CACHE_OPTIONS), None)
    if cache is not None and not any(name in _KILL_CACHE_OPTIONS for name in names):
        raise ValueError(f"vw_args give a cache file ({cache}) without --kill_cache: vw would "
                         "read the examples of an existing cache file instead of those "
                         "subwabbit sends; add --kill_cache (-k)")


def _token_text(token: object, name: str = "vw_args") -> str:
    """One ``vw_args`` (or ``vw_command``: ``name``) token as the engine gets it.

    :raises TypeError: for a token that is not a string, a path or a number
    """
    if isinstance(token, str):
        return token
    if isinstance(token, os.PathLike):
        path = os.fspath(token)
        if isinstance(path, str):
            return path
    elif isinstance(token, numbers.Real) and not isinstance(token, bool):
        return str(int(token)) if isinstance(token, numbers.Integral) else repr(float(token))
    raise TypeError(f"{name} must hold strings, paths or numbers, got {token!r}")


def default_engine_command() -> List[str]:
    """The command that runs the engine shipped with the ``vowpalwabbit`` wheel."""
    return [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine", "program.py")]


def resolve_engine_command(
        vw_command: Union[str, "os.PathLike[str]", Sequence[str], None] = None) -> List[str]:
    """Choose the engine command.

    In order: ``vw_command`` if given (a path, or an argv list), else the
    ``SUBWABBIT_VW`` environment variable (split like a shell would), else a
    ``vw`` executable on ``PATH`` if it is a vw 9.x or newer (an older one,
    such as Ubuntu's ``vowpal-wabbit`` package, is passed over with a
    WARNING), else the wheel's engine through
    :mod:`subwabbit.engine.program`.

    :param vw_command: an explicit command, or ``None``
    :returns: the argv prefix to which engine options are appended
    :raises ValueError: for an empty command
    :raises TypeError: for a command that is neither a path nor a sequence
        of words (``bytes``, whose items are ints, a number), or a word that
        is not a string, a path or a number (``bytes``, ``None``)
    """
    if vw_command is not None:
        if isinstance(vw_command, (str, os.PathLike)):
            command = [os.fspath(vw_command)]
        elif (isinstance(vw_command, (bytes, bytearray, memoryview, Mapping, AbstractSet))
              or not isinstance(vw_command, Iterable)):
            raise TypeError("vw_command must be a path or a list of command-line words, got "
                            f"{type(vw_command).__name__} {vw_command!r}")
        else:
            command = [_token_text(part, "vw_command") for part in vw_command]
        if not command or not command[0]:
            raise ValueError("vw_command must name an executable")
        return command
    from_env = os.environ.get(ENGINE_ENV_VAR, "").strip()
    if from_env:
        return shlex.split(from_env)
    on_path = shutil.which("vw")
    if on_path:
        version = engine_version(on_path, os.stat(on_path).st_mtime_ns)
        if version is not None and version[0] >= MIN_ENGINE_MAJOR:
            return [on_path]
        found = "no version" if version is None else ".".join(map(str, version))
        logging.getLogger("subwabbit").warning(
            "the vw on PATH (%s, %s) is not a vw %d.x engine, which subwabbit needs; using "
            "the engine of the vowpalwabbit wheel instead (choose one with vw_command or $%s)",
            on_path, found, MIN_ENGINE_MAJOR, ENGINE_ENV_VAR)
    return default_engine_command()


#: The oldest engine series subwabbit speaks to (the options it passes, such
#: as ``--log_output``, appeared in 9.0).
MIN_ENGINE_MAJOR = 9


@functools.lru_cache(maxsize=8)
def engine_version(path: str, mtime_ns: int = 0) -> Optional[Tuple[int, ...]]:
    """The version a ``vw`` executable reports (``vw --version``), once per
    path and modification time.

    :returns: the version numbers, or ``None`` when it reports none
    """
    del mtime_ns  # part of the cache key only
    try:
        done = subprocess.run([path, "--version"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(rb"(\d+)\.(\d+)(?:\.(\d+))?", done.stdout)
    if done.returncode != 0 or match is None:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


def build_argv(command: Sequence[str], vw_args: Sequence[str], *, predictions: bool,
               audit: bool) -> List[str]:
    """The full engine command line.

    :param command: from :func:`resolve_engine_command`
    :param vw_args: from :func:`normalize_vw_args`
    :param predictions: whether the engine writes predictions to stdout
    :param audit: whether to run in audit mode (``--audit``)
    :returns: the argv to execute
    """
    argv = list(command)
    if predictions:
        argv += ["-p", "stdout"]
    # Logs go to stderr, which subwabbit drains; stdout carries predictions only.
    argv += ["--log_output", "stderr", "--driver_output_off"]
    if audit:
        argv.append("--audit")
    argv += quiet_but_errors(vw_args)
    return argv


def quiet_but_errors(vw_args: Sequence[str]) -> List[str]:
    """Replace ``--quiet`` with ``--log_level error``.

    ``--quiet`` also silences the message of an error that ends the engine
    (a malformed label, say), which subwabbit puts into the exception it
    raises. Warnings and progress stay silent as with ``--quiet``. An explicit
    ``--log_level`` is left alone. The replacement comes first, so that an
    option left without its value at the end of ``vw_args`` (``-f``) is
    refused by the engine rather than given ``--log_level`` as its value.

    :param vw_args: normalised engine arguments
    :returns: the arguments to pass on
    """
    args = list(vw_args)
    if "--quiet" not in args or any(arg == "--log_level" or arg.startswith("--log_level=")
                                    for arg in args):
        return args
    return ["--log_level", "error"] + [arg for arg in args if arg != "--quiet"]

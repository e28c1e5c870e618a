"""Which engines a benchmark run measures.

The model classes run on the engine subwabbit chooses by itself (see
:func:`subwabbit.command.resolve_engine_command`): on a machine where
``pip install subwabbit`` is all that was done, the engine of the
``vowpalwabbit`` wheel. The engine alone is measured on that engine, on the
wheel's engine if that is another one, and on a ``vw`` executable when one is
given (``--vw-executable PATH``: any vw 9.x executable, such as one built
with cmake from the ``vowpalwabbit`` sdist), so that one run shows both
engines side by side.
"""

import os
import shutil
from typing import List, NamedTuple, Optional, Tuple

from subwabbit.command import (ENGINE_ENV_VAR, default_engine_command, engine_version,
                               resolve_engine_command)

#: The names of the engines in the tables.
WHEEL = "wheel"
EXECUTABLE = "vw"


class Engine(NamedTuple):
    """One engine command.

    :param name: its short name in the tables (``wheel``, ``vw``)
    :param description: what it is, for the report
    :param command: the argv prefix (with ``taskset`` in front when pinned)
    :param executable: the path of a ``vw`` executable, ``None`` for the wheel's engine
    """

    name: str
    description: str
    command: List[str]
    executable: Optional[str] = None


def _pinned(command: List[str], cpus: str) -> List[str]:
    return ["taskset", "-c", cpus] + command if cpus else command


def _describe_executable(path: str) -> str:
    version = engine_version(path, os.stat(path).st_mtime_ns)
    shown = ".".join(map(str, version)) if version else "unknown version"
    return f"vw {shown} executable ({path})"


def find_executable(path: str) -> str:
    """The absolute path of the ``vw`` executable ``path`` (a path or a name on ``PATH``).

    :raises ValueError: when it is not an executable file, or not a vw 9.x or newer
    """
    found = shutil.which(path)
    if found is None:
        raise ValueError(f"no executable file at {path!r}")
    version = engine_version(found, os.stat(found).st_mtime_ns)
    if version is None or version[0] < 9:
        raise ValueError(f"{found} is not a vw 9.x executable (it reports {version})")
    return os.path.abspath(found)


def choose_engines(vw_executable: str = "", cpus: str = "") -> Tuple[Engine, List[Engine], str]:
    """The engine the model classes run on, every engine measured alone, and a
    note on the ``vw`` executable for the report.

    :param vw_executable: a ``vw`` executable to measure beside the wheel's
        engine (``""``: none)
    :param cpus: run every engine under ``taskset -c CPUS``
    :returns: ``(default, engines, note)``; ``engines`` starts with ``default``
    """
    wheel_command = default_engine_command()
    chosen = resolve_engine_command(None)
    if chosen == wheel_command:
        default = Engine(WHEEL, "the vowpalwabbit wheel's engine (subwabbit/engine/program.py)",
                         _pinned(chosen, cpus))
    else:  # $SUBWABBIT_VW or a vw on PATH
        where = f"${ENGINE_ENV_VAR}" if os.environ.get(ENGINE_ENV_VAR, "").strip() else "PATH"
        path = shutil.which(chosen[0]) or chosen[0]
        description = (_describe_executable(path) if os.path.isfile(path) and len(chosen) == 1
                       else " ".join(chosen))
        default = Engine(EXECUTABLE, f"{description}, from {where}", _pinned(chosen, cpus),
                         path if len(chosen) == 1 else None)
    engines = [default]
    if default.name != WHEEL:
        engines.append(Engine(WHEEL, "the vowpalwabbit wheel's engine "
                                     "(subwabbit/engine/program.py)",
                              _pinned(wheel_command, cpus)))
    if vw_executable:
        path = find_executable(vw_executable)
        if default.executable != path:
            name = EXECUTABLE if default.name != EXECUTABLE else "vw (--vw-executable)"
            engines.append(Engine(name, _describe_executable(path), _pinned([path], cpus), path))
    executables = [engine for engine in engines if engine.executable]
    if executables:
        note = ("Engines measured alone: " + "; ".join(
            f"{engine.name}: {engine.description}" for engine in engines) + ".")
    else:
        note = ("No vw executable was given, so only the wheel's engine is measured: the rows "
                "of a vw executable are omitted (pass --vw-executable PATH to measure one "
                "beside the wheel's engine).")
    return default, engines, note

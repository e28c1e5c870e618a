"""Every Python example in the README and in docs/ runs as written, against
the real engine.

Each ``.. code-block:: python`` is one test. The blocks of one file run in
order, in one namespace and one temporary working directory, so a block can
use the names and files of the blocks above it (as a reader following the
page would). Selecting a single block (``-k``) runs the blocks above it first.
Examples that are not meant to run must be ``.. code-block:: text`` (or
another non-Python language) or a plain ``::`` literal block.
"""

import glob
import logging
import os
import re
import textwrap
from typing import Any, Dict, List, NamedTuple, Optional

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.rst")
DOC_FILES = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.rst")))

#: Languages of code blocks that are shown but not run.
NOT_RUN_LANGUAGES = {"text", "console", "bash", "shell", "sh", "rst", "html", "ini", "none"}

_DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\.\. (?:code-block|code|sourcecode)::[ \t]*(?P<lang>\S*)[ \t]*$")


class Block(NamedTuple):
    """One code block: its language, the line of its directive (1-based) and its body."""

    language: str
    line: int
    code: str


def code_blocks(path: str) -> List[Block]:
    """The ``code-block`` (and ``code``/``sourcecode``) directives of an reST file."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        match = _DIRECTIVE.match(lines[index])
        if not match:
            index += 1
            continue
        indent = len(match.group("indent").expandtabs())
        start = index
        index += 1
        # Options (":caption: ...") and blank lines before the body.
        while index < len(lines) and (not lines[index].strip() or (
                lines[index].strip().startswith(":")
                and len(lines[index]) - len(lines[index].lstrip()) > indent)):
            index += 1
        body_start = index
        while index < len(lines) and (not lines[index].strip()
                                      or len(lines[index]) - len(lines[index].lstrip()) > indent):
            index += 1
        body = textwrap.dedent("\n".join(lines[body_start:index])).strip("\n") + "\n"
        # Pad so that tracebacks point at the line in the .rst file.
        blocks.append(Block(match.group("lang").lower(), start + 1,
                            "\n" * body_start + body))
    return blocks


def python_blocks(path: str) -> List[Block]:
    return [block for block in code_blocks(path) if block.language in ("python", "python3", "py")]


class FileRun:
    """The state of one file's examples: namespace, working directory, progress."""

    def __init__(self, path: str, directory: str) -> None:
        self.path = path
        self.directory = directory
        self.namespace: Dict[str, Any] = {"__name__": "__docs__"}
        self.blocks = python_blocks(path)
        self.done = 0
        self.failed: Optional[int] = None


_RUNS: Dict[str, FileRun] = {}
_LOGGERS = ("", "subwabbit", "subwabbit.engine")


@pytest.fixture(scope="module", autouse=True)
def _close_example_processes():
    """Undo what examples leave behind: close their engines, restore logging."""
    saved = {name: (logging.getLogger(name).level, list(logging.getLogger(name).handlers))
             for name in _LOGGERS}
    yield
    from subwabbit.process_model import VowpalWabbitProcessModel  # pylint: disable=import-outside-toplevel
    for run in _RUNS.values():
        for value in run.namespace.values():
            if isinstance(value, VowpalWabbitProcessModel):
                try:
                    value.close()
                except Exception:  # pylint: disable=broad-except
                    pass
    for name, (level, handlers) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.handlers[:] = handlers


def _run_until(path: str, count: int, tmp_path_factory: Any, monkeypatch: Any) -> FileRun:
    """Run the first ``count`` Python blocks of ``path`` (those not run yet)."""
    run = _RUNS.get(path)
    if run is None:
        name = os.path.splitext(os.path.basename(path))[0]
        run = _RUNS[path] = FileRun(path, str(tmp_path_factory.mktemp(f"docs-{name}")))
    monkeypatch.chdir(run.directory)
    while run.done < count:
        if run.failed is not None:
            pytest.fail(f"the block at line {run.blocks[run.failed].line} of "
                        f"{os.path.relpath(path, ROOT)} failed; later blocks depend on it")
        block = run.blocks[run.done]
        try:
            exec(compile(block.code, path, "exec"), run.namespace)  # pylint: disable=exec-used
        except BaseException:
            run.failed = run.done
            raise
        run.done += 1
    return run


def _cases() -> List[Any]:
    cases = []
    for path in DOC_FILES:
        for index, block in enumerate(python_blocks(path)):
            relative = os.path.relpath(path, ROOT)
            cases.append(pytest.param(path, index, id=f"{relative}:{block.line}"))
    return cases


@pytest.mark.parametrize("path,index", _cases())
def test_example_runs(path: str, index: int, tmp_path_factory: Any, monkeypatch: Any) -> None:
    _run_until(path, index + 1, tmp_path_factory, monkeypatch)


def test_readme_quickstart_results(tmp_path_factory: Any, monkeypatch: Any) -> None:
    """The README's quickstart does what its comments say."""
    run = _run_until(README, len(python_blocks(README)), tmp_path_factory, monkeypatch)
    scores = run.namespace["scores"]
    assert len(scores) == 2 and all(0 < score < 1 for score in scores)
    assert scores[0] > scores[1]
    assert os.path.exists(os.path.join(run.directory, "model.vw"))
    assert "item1" in run.namespace["explanation"] and "sport" in run.namespace["explanation"]


@pytest.mark.parametrize("path", DOC_FILES, ids=[os.path.relpath(p, ROOT) for p in DOC_FILES])
def test_code_blocks_are_run_or_marked_as_not_run(path: str) -> None:
    """A code block either runs (Python) or says which other language it is."""
    for block in code_blocks(path):
        assert block.language in NOT_RUN_LANGUAGES | {"python", "python3", "py"}, (
            f"{os.path.relpath(path, ROOT)}:{block.line}: code block language "
            f"{block.language!r} is neither run nor in the not-run list")
        assert block.code.strip(), f"{os.path.relpath(path, ROOT)}:{block.line}: empty code block"


def test_docs_exist() -> None:
    assert len(DOC_FILES) > 1, "docs/*.rst not found"
    assert python_blocks(README), "the README has no Python example"

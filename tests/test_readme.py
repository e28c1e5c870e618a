"""The README's Python examples run as written, against the real engine."""

import os
import re
import textwrap

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.rst")


def python_blocks(text):
    """The bodies of ``.. code-block:: python`` directives."""
    blocks = []
    for match in re.finditer(r"^\.\. code-block:: python\n\n((?:(?:    .*)?\n)+)", text, re.M):
        blocks.append(textwrap.dedent(match.group(1)))
    return blocks


def test_quickstart_runs(tmp_path, monkeypatch, capsys):
    with open(README, encoding="utf-8") as handle:
        blocks = python_blocks(handle.read())
    assert blocks, "the README has no Python example"
    monkeypatch.chdir(tmp_path)
    scope = {}
    for block in blocks:
        exec(compile(block, README, "exec"), scope)  # pylint: disable=exec-used
    scores = scope["scores"]
    assert len(scores) == 2 and all(0 < score < 1 for score in scores)
    assert scores[0] > scores[1]
    assert (tmp_path / "model.vw").exists()
    printed = capsys.readouterr().out
    assert "item1" in printed or "sport" in printed

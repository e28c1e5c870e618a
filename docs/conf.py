"""Sphinx configuration of the subwabbit documentation.

Build from the repository root (``pip install -e '.[docs]'`` first)::

    sphinx-build -W -b html docs docs/_build/html
"""

import os
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
# Document the checkout these docs belong to, whatever else is installed.
sys.path.insert(0, ROOT)


def _read_version() -> str:
    scope: dict = {}
    with open(os.path.join(ROOT, "subwabbit", "version.py"), encoding="utf-8") as handle:
        exec(handle.read(), scope)  # pylint: disable=exec-used
    return scope["__version__"]


project = "subwabbit"
author = "the subwabbit authors"
copyright = "the subwabbit authors"  # pylint: disable=redefined-builtin
release = _read_version()
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]

root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
# Literal blocks written with ``::`` are not highlighted as Python: many of
# them are shell commands or output. Python examples use ``.. code-block:: python``
# and are run by tests/test_docs.py.
highlight_language = "none"

# Docstrings are reST with field lists (:param x:, :returns:, :raises X:).
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autoclass_content = "class"

# furo: made for API documentation (signatures, field lists, a table of
# contents per page), readable on small screens.
html_theme = "furo"
html_title = f"subwabbit {release}"
html_static_path = ["_static"]
html_css_files = ["subwabbit.css"]

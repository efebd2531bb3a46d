"""Sphinx configuration of arrayfeed's documentation (MyST Markdown pages, pydata theme).

python -m pip install -e ".[docs]" && python -m sphinx -W -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # this checkout's arrayfeed, not another installed one
sys.path.insert(0, str(DOCS / "_ext"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import arrayfeed  # noqa: E402

project = "arrayfeed"
author = "arrayfeed contributors"
copyright = "arrayfeed contributors"
release = arrayfeed.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "arrayfeed_docs",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "README.md"]

# Markdown: ```{directive} fences, :::{note} blocks, ${...}$ off, anchors for ## and ### headings
# so that pages link to sections as page.md#section-title.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4

# The API reference: Google-style docstrings, types in the signature as written.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
add_module_names = False
# A reference to a public name of arrayfeed that is not documented is an error. Other libraries'
# names (numpy, tf.data, typing) have no inventory here (the build runs offline), and private
# classes (arrayfeed._...) in signatures are shown as text.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!arrayfeed\b).*"), (r"py:.*", r"arrayfeed\._.*")]

html_theme = "pydata_sphinx_theme"
html_title = f"arrayfeed {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_static_path: list[str] = []

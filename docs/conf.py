"""Sphinx configuration of the docs site; `docs/build.py` writes the sources and runs Sphinx with it."""

project = "afm"
author = "afm developers"
# its module name has hyphens: MathJax served from the site, not a CDN
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx-mathjax-offline"]
exclude_patterns = []
html_theme = "furo"
html_title = "afm"

# notebooks are shown as they are: executed ones by `afm run`, never run again here
nb_execution_mode = "off"
nb_ipywidgets_js = {}  # no require.js or widget scripts from a CDN
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
myst_all_links_external = True  # links between chapters are kept as written, without cross-reference warnings
suppress_warnings = ["myst.header", "myst.xref_missing", "mystnb.unknown_mime_type", "misc.highlighting_failure"]

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False}
autodoc_typehints = "signature"
default_role = "code"  # the docstrings are nbdev's markdown: `x` is code, as in the chapters

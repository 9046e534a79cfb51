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


# nbdev's docstrings are markdown; autodoc reads reST. Their tables become reST tables and their fenced backticks stay
# text, so that the API reference renders as the chapters do.
import re  # noqa: E402

_RULE = re.compile(r"^\s*\|[\s:|-]+\|\s*$")  # a markdown table's |---|---| line


def _markdown_docstring(app, what, name, obj, options, lines):
    out, i = [], 0
    while i < len(lines):
        if lines[i].lstrip().startswith("|") and i + 1 < len(lines) and _RULE.match(lines[i + 1]):
            rows = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                if not _RULE.match(lines[i]):
                    rows.append([c.strip() or "\\ " for c in lines[i].strip().strip("|").split("|")])
                i += 1
            out += ["", ".. list-table::", "   :header-rows: 1", ""]
            for row in rows:
                out += [f"   * - {row[0]}"] + [f"     - {c}" for c in row[1:]]
            out.append("")
            continue
        line = lines[i].replace("```", r"\`\`\`")
        # markdown's `Hit`s: reST wants code to end before a letter only through an escaped space
        out.append(re.sub(r"(?<=\w)(`[^`\s][^`]*`)", r"\\ \1", re.sub(r"(`[^`\s][^`]*`)(?=\w)", r"\1\\ ", line)))
        i += 1
    lines[:] = out


def setup(app):
    app.connect("autodoc-process-docstring", _markdown_docstring)

"""Build the docs site (`make docs`): the chapters, a results page and the API reference, with Sphinx.

Quarto, which nbdev's own docs use, cannot be installed everywhere this project runs, so the site is built
from pip-installable tools: Sphinx with myst-nb (notebooks) and furo (theme). This script writes the Sphinx
sources to `<out>/src` and the site to `<out>/html`; it executes no notebook:

- a chapter is the executed notebook that `afm run` keeps in `reports/notebooks/` where one exists (with its
  outputs, tables and figures), else the source notebook from `nbs/`, whose page then says it has no outputs;
  cells flagged `#| hide` are dropped and nbdev's `#|` directives removed from the code shown;
- the results page is `reports/README.md` (the report card) with every figure under `reports/`, and a link to the
  trajectory browser where `afm browse` wrote one (`reports/browse/index.html`, copied into the site as it is);
- a chapter that saves figures (`fig.savefig(out / "x.png")`) shows them under the cell that made them, from
  `reports/<chapter>/`;
- the run histories (`reports/<chapter>/HISTORY.md`) are pages of the site, and the chapters' links to them lead there;
- each chapter ends with a link to the API reference of the module it exports, a page of its own under `api/` made
  from the docstrings (autodoc; nbdev's markdown docstrings are read as markdown by `conf.py`); `api.html` lists them
  by wing. (Pages of their own, in reST and out of the navigation tree: the same reference inside each notebook page,
  through MyST's reST bridge, took twice as long to build.)

The build must be clean: `tests/test_docs.py` fails on any Sphinx warning and on any link that leads nowhere.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
NO_OUTPUTS = ("*This page shows the chapter's source without outputs: no executed copy of it was found in "
              "`reports/notebooks/`. `make reproduce` (or `afm run --chapters {stem}`) runs it and keeps one there; "
              "`make docs` then shows its outputs.*")
NOT_RUN = ("*This chapter is a library chapter, not a step of the pipeline: `afm run` does not execute it, so the page "
           "shows its source. Its checks run with `nbdev-test nbs/{path}.ipynb` (`make test` runs them all); open "
           "it in JupyterLab (`make lab`) to see its outputs.*")
HISTORY = re.compile(r"\]\((?:\.\./)*reports/([\w-]+)/HISTORY\.md(#[^)\s]*)?\)")  # a link to a run history
SAVED = re.compile(r"""savefig\([^\n]*?["']([\w.{}\-]+\.png)["']""")  # the figure file a cell saves


def chapter_source(stem: str, path: str, reports: Path) -> tuple[Path, bool]:
    "The notebook a chapter's page is built from (`path`: where it is under `nbs/`), and if it is the executed one."
    executed = reports / "notebooks" / f"{stem}.ipynb"
    return (executed, True) if executed.exists() else (REPO / "nbs" / f"{path}.ipynb", False)


def directives(source: str) -> list[str]:
    "nbdev's `#|` cell directives of a code cell (`hide`, `export`, `default_exp sft`, ...)."
    return [line[2:].strip() for line in source.splitlines() if line.startswith("#|")]


def default_exp(nb) -> str | None:
    "The module a notebook exports to, from its `#| default_exp` cell."
    for cell in nb.cells:
        for d in directives(cell.source) if cell.cell_type == "code" else []:
            if d.startswith("default_exp"):
                return "afm." + d.split()[1]
    return None


BROWSE = Path("browse") / "index.html"  # where `afm browse` writes its page by default, under reports/
LINK = re.compile(r"\]\((?:\.\./)?(?:\w+/)?(index|\d\d[a-z]?_\w+)\.ipynb(#[^)\s]*)?\)")  # a wing's folder, or none


def html_links(text: str, stem: str) -> str:
    """Links between notebooks (`[x](09a_data.ipynb#rows)`) as links between the site's pages; links to a run
    history (`reports/rl/HISTORY.md`) as links to its page."""
    up = "../" if stem != "index" else ""
    def page(m):
        target = m[1] if m[1] == "index" else f"chapters/{m[1]}"
        return f"]({up}{target}.html{m[2] or ''})"
    text = HISTORY.sub(lambda m: f"]({up}histories/{m[1]}.html{m[2] or ''})", text)
    return LINK.sub(page, text)





def saved_figures(source: str, folder: Path) -> list[Path]:
    "The figures a code cell saves (`savefig(... \"x.png\")`; `{...}` in the name matches anything) found in `folder`."
    found = []
    for name in SAVED.findall(source):
        found += sorted(folder.glob(re.sub(r"\{[^}]*\}", "*", name)))
    return list(dict.fromkeys(found))


def _no_rule(output) -> None:
    "A markdown output (`show_doc`'s) without the rule it opens with: docutils allows a rule only between sections."
    md = (output.get("data") or {}).get("text/markdown")
    if isinstance(md, str): output["data"]["text/markdown"] = re.sub(r"\A\s*---+\s*\n", "", md)


def adapt(nb, executed: bool, stem: str, figures: Path | None = None, src: Path | None = None, pipeline: bool = True,
          path: str = "", module: str | None = None):
    """A notebook as myst-nb renders it: hidden cells dropped, directives stripped, each saved figure shown under the
    cell that saved it (from `figures`, copied into `src`), the API reference appended."""
    module, cells = module or default_exp(nb), []
    for cell in nb.cells:
        shown = []
        if cell.cell_type == "code":
            flags = directives(cell.source)
            # papermill's injected values follow
            if (any(f.split()[0] in ("hide", "default_exp") for f in flags if f)
                or (executed and "parameters" in cell.metadata.get("tags", []))):
                continue
            cell.source = "\n".join(l for l in cell.source.splitlines() if not l.startswith("#|")).strip("\n")
            if not cell.source and not cell.get("outputs"):
                continue
            for output in cell.get("outputs", []): _no_rule(output)
            has_image = any("image/png" in (o.get("data") or {}) for o in cell.get("outputs", []))
            if executed and figures is not None and src is not None and not has_image:
                shown = saved_figures(cell.source, figures)
        else:
            cell.source = html_links(cell.source, stem)
        cell.metadata = {}  # papermill's and nbdev's keys are not myst-nb's
        cells.append(cell)
        if shown:
            cells.append(nbformat.v4.new_markdown_cell("\n".join(figure_md(f, figures.parent, src, "../")
                                                                  for f in shown)))
    if not executed and stem != "index" and cells and cells[0].cell_type == "markdown":  # the home page is not run
        advice = NO_OUTPUTS if pipeline else NOT_RUN
        cells.insert(1, nbformat.v4.new_markdown_cell(advice.format(stem=stem, path=path)))
    if module:  # its reference is a page of its own (`write_api`)
        cells.append(nbformat.v4.new_markdown_cell(f"## API reference\n\n[`{module}`](../api/{stem}.html): what the "
                                                   "module this chapter exports offers, from its docstrings."))
    nb.cells = cells
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    return nb


def write_chapters(src: Path, reports: Path) -> list[str]:
    """Write every chapter (and the home page) into `src`, and the chapters' page: the wings in the order data flows,
    each with what it does and its chapters; returns the chapters' stems in order."""
    from afm.core.chapters import CHAPTERS, WINGS
    home = adapt(nbformat.read(REPO / "nbs" / "index.ipynb", as_version=4), False, "index")
    home.cells.append(nbformat.v4.new_markdown_cell("```{toctree}\n:hidden:\n:maxdepth: 1\n\nresults\nchapters\n"
                                                    "api\nhistories\n```"))
    nbformat.write(home, src / "index.ipynb")
    (src / "chapters").mkdir(exist_ok=True)
    for c in CHAPTERS:
        origin, executed = chapter_source(c.notebook, c.path, reports)
        nb = adapt(nbformat.read(origin, as_version=4), executed, c.notebook,
                   reports / c.key, src, c.pipeline, c.path, f"afm.{c.module}")
        nbformat.write(nb, src / "chapters" / f"{c.notebook}.ipynb")
    parts = ["# Chapters\n\nThe notebooks, in the order data flows through them, in the wings of the pipeline.\n"]
    for wing, does in [*WINGS.items(), ("", "The `afm` command.")]:
        toc = "\n".join(f"chapters/{c.notebook}" for c in CHAPTERS if c.wing == wing)
        parts.append(f"## `{wing or 'afm.cli'}`\n\n{does}\n\n```{{toctree}}\n:maxdepth: 1\n\n{toc}\n```\n")
    (src / "chapters.md").write_text("\n".join(parts))
    return [c.notebook for c in CHAPTERS]


def write_api(src: Path) -> int:
    """The API reference: a reST page under `api/` for each chapter's module (autodoc, outside the navigation tree: each
    chapter links to its own) and `api.md`, the modules by wing; returns how many."""
    from afm.core.chapters import CHAPTERS, WINGS
    (src / "api").mkdir(exist_ok=True)
    for c in CHAPTERS:
        title, chapter = f"afm.{c.module}", f"`{c.notebook} <../chapters/{c.notebook}.html>`_"
        (src / "api" / f"{c.notebook}.rst").write_text(f":orphan:\n\n{title}\n{'=' * len(title)}\n\nThe module chapter "
                                                      f"{chapter} exports.\n\n.. automodule:: {title}\n   :members:\n")
    parts = ["# API reference\n\nEach chapter's module, from its docstrings, in the wings of the pipeline.\n"]
    for wing, does in [*WINGS.items(), ("", "The `afm` command.")]:
        links = "\n".join(f"- [`afm.{c.module}`](api/{c.notebook}.html) ({c.notebook})"
                           for c in CHAPTERS if c.wing == wing)
        parts.append(f"## `{wing or 'afm.cli'}`\n\n{does}\n\n{links}\n")
    (src / "api.md").write_text("\n".join(parts))
    return len(CHAPTERS)


def figure_md(fig: Path, reports: Path, src: Path, up: str = "") -> str:
    """A figure of `reports/` copied into the site, as markdown under a caption naming its file (`up`: the way from the
    page to the site's root)."""
    rel = fig.relative_to(reports)
    dest = src / "figures" / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(fig, dest)
    return f"**`reports/{rel.as_posix()}`**\n\n![reports/{rel.as_posix()}]({up}figures/{rel.as_posix()})\n"


def write_histories(src: Path, reports: Path) -> int:
    """Each run history (`reports/<chapter>/HISTORY.md`: what was tried, measured and decided) as a page of the site,
    and the page listing them; returns how many."""
    found = sorted(reports.glob("*/HISTORY.md"))
    (src / "histories").mkdir(exist_ok=True)
    for h in found:
        text = re.sub(r"\]\((?:\.\./)([\w-]+)/HISTORY\.md", r"](\1.md", h.read_text())  # one history to another
        (src / "histories" / f"{h.parent.name}.md").write_text(text)
    toc = "\n".join(f"histories/{h.parent.name}" for h in found)
    (src / "histories.md").write_text("# Run histories\n\nWhat each stage tried, measured and decided, run by run "
                                      "(`reports/<chapter>/HISTORY.md`).\n\n"
                                      f"```{{toctree}}\n:maxdepth: 1\n\n{toc}\n```\n")
    return len(found)


def write_results(src: Path, reports: Path) -> int:
    """The results page: the report card with each chapter's figures (`reports/<chapter>/*.png`) in its section,
    then the figures of the other profiles; returns the number of figures."""
    card = (reports / "README.md").read_text() if (reports / "README.md").exists() else \
        "# Results\n\n*No report card yet: `make reproduce` writes `reports/README.md`.*\n"
    card = re.sub(r"\A# (.*)", r"# Results\n\n**\1**", card.lstrip())  # the card's title becomes the page's lead
    figures = sorted(p for p in reports.rglob("*.png") if "notebooks" not in p.parts)
    shown, sections = set(), re.split(r"(?m)^(?=## )", card)
    for i, section in enumerate(sections):
        key = re.match(r"## (\S+) —", section)
        own = [f for f in figures if key and f.parent == reports / key[1]]
        if own:
            sections[i] = section.rstrip() + "\n\n" + "\n".join(figure_md(f, reports, src) for f in own) + "\n"
            shown.update(own)
    rest = [f for f in figures if f not in shown]
    if rest:
        sections.append("## Other figures\n\nThe other profiles' and studies' figures.\n\n"
                        + "\n".join(figure_md(f, reports, src) for f in rest))
    # `afm browse` wrote a page: the site carries it as it is (one self-contained file)
    if (reports / BROWSE).is_file():
        sections.append("## Browse trajectories\n\n<p><a href=\"browse/index.html\">Browse trajectories</a>: the "
                        "teacher's runs, the distilled rows and the models' rollouts side by side (written by "
                        "<code>afm browse</code>).</p>\n")
    (src / "results.md").write_text("".join(sections))
    return len(figures)


def copy_browse(reports: Path, html: Path) -> bool:
    """Copy the page `afm browse` wrote (`reports/browse/index.html`) into the site, beside the results page it is
    linked from."""
    if not (reports / BROWSE).is_file():
        return False
    (html / "browse").mkdir(parents=True, exist_ok=True)
    shutil.copy2(reports / BROWSE, html / "browse" / "index.html")
    return True


def build(out: Path, reports: Path = REPO / "reports", quiet: bool = True) -> Path:
    "Write the Sphinx sources to `out/src` and build the site into `out/html`; returns the home page."
    src, html = out / "src", out / "html"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    t0 = time.time()
    stems = write_chapters(src, reports)
    n_fig = write_results(src, reports)
    n_hist = write_histories(src, reports)
    write_api(src)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(REPO / "docs"), str(src), str(html),
           "-d", str(out / "doctrees")] + (["-q"] if quiet else [])
    subprocess.run(cmd, check=True, cwd=REPO)
    copy_browse(reports, html)
    print(f"docs: {len(stems)} chapters, {n_fig} figures, {n_hist} histories -> {html}/index.html "
          f"({time.time() - t0:.0f} s)")
    return html / "index.html"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "_docs",
                    help="folder for the sources (src/) and the site (html/)")
    ap.add_argument("--reports", type=Path, default=REPO / "reports", help="the reports folder to show")
    ap.add_argument("-v", "--verbose", action="store_true", help="show Sphinx's progress and warnings")
    args = ap.parse_args()
    build(args.out, args.reports, quiet=not args.verbose)

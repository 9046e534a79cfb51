"""Every figure stated in prose comes from a record: the README, the report cards and the chapters' prose are read for
figures (decimals, percentages, times, ratios; not counts, versions, sections, years or names) that no committed
`metrics.json` or `figures.json`, no profile and no number of the paper holds (`afm.core.prose.unsourced`)."""
import json

import pytest
from afm.core.prose import notebook_prose, repo_sources, sources, unsourced
from conftest import REPO

# every notebook of nbs/, a new one without anyone adding it: a study's findings are rendered from its figures in a code
# cell, a past run's measurement no record holds is in reports/<key>/HISTORY.md
CHECKED = sorted(p.relative_to(REPO / "nbs").with_suffix("").as_posix() for p in (REPO / "nbs").rglob("*.ipynb")
                 if ".ipynb_checkpoints" not in p.parts)
RECORDS = [REPO / "reports" / "metrics.json", *sorted((REPO / "reports").glob("*/metrics.json"))]


@pytest.fixture(scope="module")
def known():
    return repo_sources(REPO)


def test_the_readme_states_no_figure_the_records_lack(known):
    assert unsourced((REPO / "README.md").read_text(), known) == []


@pytest.mark.parametrize("notebook", CHECKED)
def test_a_chapter_states_no_figure_the_records_lack(notebook, known):
    assert unsourced(notebook_prose(REPO / "nbs" / f"{notebook}.ipynb"), known) == []


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.relative_to(REPO)))
def test_a_report_card_states_only_its_records_figures(path):
    """The card as `write_reports` writes it from each committed record, and the committed card beside it: nothing
    else is cited."""
    from afm.report.card import report_card
    from afm.report.tables import paper_results
    record = json.loads(path.read_text())
    own = sources(record, paper_results())
    assert unsourced(report_card(record), own) == []
    assert unsourced((path.parent / "README.md").read_text(), own) == []


def test_a_hand_typed_figure_is_caught(known):
    """The check checks: a time, a score and a share typed into the README are caught; a count, a version and a
    section are not figures."""
    typed = ("\nOn this machine `make reproduce` took 52 minutes and SFT scored 0.6173 on 300 questions, 63.1% of them "
             "with transformers 5.17 (section 4).\n")
    assert unsourced((REPO / "README.md").read_text() + typed, known) == ["52 minutes", "0.6173", "63.1%"]


def test_what_the_commands_say_states_no_figure_the_records_lack(known):
    "What `afm run --list` says of each profile and every command's `--help`: no hand-typed figure either."
    import contextlib
    import io
    from afm.cli import COMMANDS, main, providers
    from afm.core.settings import load_profiles
    texts = {f"[{name}] description": p.get("description", "")
             for name, p in load_profiles(REPO / "settings.ini").items()}
    for cmd in COMMANDS:
        for target in [None] + [t for t in providers(cmd) if t]:
            argv, out = [cmd] + ([target] if target else []), io.StringIO()
            with contextlib.redirect_stdout(out):
                try: main([*argv, "--help"])
                except SystemExit: pass
            texts[f"afm {' '.join(argv)} --help"] = out.getvalue()
    assert len(texts) > 20 and all(texts.values())
    typed = {where: found for where, text in texts.items() if (found := unsourced(text, known))}
    assert typed == {}, typed


def test_every_name_the_prose_gives_is_there():
    """A name the README or a chapter's prose gives as `afm.<module>.<name>` can be imported and looked up: a module
    moved or a function renamed leaves no sentence pointing at nothing (entry point groups are names of their own)."""
    import importlib
    import re
    groups = {"afm.tools", "afm.benchmarks"}  # entry point groups (pyproject.toml)
    texts = {"README.md": (REPO / "README.md").read_text()}
    for p in (REPO / "nbs").rglob("*.ipynb"):
        texts[p.name] = "\n".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"]
                                  if c["cell_type"] == "markdown")
    missing = []
    for where, text in texts.items():
        for ref in sorted(set(re.findall(r"(?<![\w.])afm(?:\.\w+)+", text)) - groups):
            parts, obj, n = ref.split("."), None, 0
            for n in range(len(parts), 0, -1):
                try: obj = importlib.import_module(".".join(parts[:n]))
                except ImportError: continue
                break
            try:
                for name in parts[n:]: obj = getattr(obj, name)
            except AttributeError: missing.append(f"{where}: {ref}")
    assert not missing, missing

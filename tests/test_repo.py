"""The repository's own contract: nbdev sync, pins, profiles and the README's two commands."""
import json
import sys
import shutil
import tomllib
from pathlib import Path

import nbdev_sync
import pytest
from afm.core.chapters import chapter
from afm.core.settings import load_profiles
from conftest import REPO



def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "repo"
    dst.mkdir()
    shutil.copy(REPO / "pyproject.toml", dst)
    shutil.copytree(REPO / "nbs", dst / "nbs")
    shutil.copytree(REPO / "afm", dst / "afm", ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_sync_check_passes_on_the_repo():
    assert nbdev_sync.problems() == []


def test_sync_check_catches_a_hand_edited_module(tmp_path):
    repo = _copy(tmp_path)
    coa = repo / "afm" / "format" / "coa.py"
    coa.write_text(coa.read_text() + "\nHAND_EDIT = 1\n")
    assert nbdev_sync.problems(repo) == ["afm/format/coa.py: differs from a fresh nbdev-export (run nbdev-export and "
                                         "commit)"]


def test_sync_check_catches_a_stale_manifest(tmp_path):
    repo = _copy(tmp_path)
    manifest = repo / "afm" / "chapters.json"
    manifest.write_text(manifest.read_text().replace('"rl_seeds"', '"rl_sedes"'))
    assert nbdev_sync.problems(repo) == ["afm/chapters.json: differs from a fresh nbdev-export (run nbdev-export and "
                                         "commit)"]


def test_sync_check_catches_a_stale_module(tmp_path):
    repo = _copy(tmp_path)
    (repo / "afm" / "tools" / "leftover.py").write_text("x = 1\n")
    assert any(p.startswith("afm/tools/leftover.py") for p in nbdev_sync.problems(repo))


def test_sync_check_catches_notebook_outputs_and_metadata(tmp_path):
    repo = _copy(tmp_path)
    path = repo / "nbs" / "format" / "00_coa.ipynb"
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
    cell["execution_count"] = 7
    cell["metadata"]["collapsed"] = True
    path.write_text(json.dumps(nb, indent=1))
    assert nbdev_sync.problems(repo) == ["nbs/format/00_coa.ipynb: not clean (run nbdev-clean and commit)"]


def test_pins_and_extras():
    proj = tomllib.loads((REPO / "pyproject.toml").read_text())
    deps = proj["project"]["dependencies"]
    for pin in ("torch==2.13.0", "transformers>=5.17,<5.18", "trl==1.16.0"):
        assert pin in deps, pin
    for name in ("peft", "accelerate", "datasets", "papermill", "nbdev", "jupyterlab", "ipykernel", "matplotlib",
                 "tqdm", "ipywidgets"):
        assert any(d.startswith(name) for d in deps), name
    extras = proj["project"]["optional-dependencies"]
    assert extras["gpu"] == ["trl[vllm]==1.16.0"]
    assert any(d.startswith("pytest") for d in extras["dev"]) and any(d.startswith("hypothesis") for d in extras["dev"])
    assert proj["project"]["scripts"]["afm"] == "afm.cli:main"
    assert proj["tool"]["nbdev"]["lib_path"] == "afm"


def test_installed_versions_match_the_pins():
    from importlib.metadata import version
    assert version("torch").startswith("2.13.0") and "+cu" not in version("torch")
    assert version("transformers").startswith("5.17.") and version("trl") == "1.16.0"


def test_profiles():
    profiles = load_profiles(REPO / "settings.ini")
    assert {"tiny", "smol"} <= set(profiles) and any(p.startswith("paper-") for p in profiles)
    for name, params in profiles.items():
        assert params.get("description"), f"profile {name} needs a description"


def test_readme_names_the_two_commands():
    readme = (REPO / "README.md").read_text()
    assert "make reproduce" in readme and "make test" in readme
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_make_lab_starts_as_root_too():
    import os, subprocess
    r = subprocess.run(["make", "-n", "lab"], cwd=REPO, capture_output=True, text=True, timeout=60)
    lab = [l for l in r.stdout.splitlines() if "jupyter lab" in l]
    assert lab and (("--allow-root" in lab[-1]) == (os.geteuid() == 0)), r.stdout[-500:]


def test_every_pipeline_chapter_takes_its_parameters():
    """papermill injects a profile's values after the cell tagged `parameters`: without the tag a chapter runs on its
    CI defaults."""
    from afm.core.chapters import CHAPTERS
    for ch in CHAPTERS:
        path = REPO / "nbs" / f"{ch.path}.ipynb"
        if not ch.pipeline or not path.is_file(): continue
        cells = [c for c in json.loads(path.read_text())["cells"]
                 if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(cells) == 1, f"{path.name}: {len(cells)} cells tagged parameters, want 1"
        source = "".join(cells[0]["source"])
        assert "profile = " in source and "reports_dir = None" in source, (f"{path.name}: its parameters cell must "
                                                                           "declare profile and reports_dir")


def test_the_parameters_read_are_the_ones_papermill_injects_by():
    """`declared_parameters` reads a chapter's parameters cell without papermill (so `afm sft --help` does not import
    it), from the notebook or from the manifest the export wrote; papermill's own reading, which `afm run` injects by,
    must agree with both on every notebook."""
    import papermill
    from afm.core.chapters import CHAPTERS, declared_parameters, manifest
    for path in sorted((REPO / "nbs").rglob("*.ipynb")):
        theirs = {k: d["default"] for k, d in papermill.inspect_notebook(str(path)).items()}
        assert declared_parameters(path) == theirs, path.name
    for c in CHAPTERS:
        theirs = {k: d["default"] for k, d in papermill.inspect_notebook(str(REPO / "nbs" / f"{c.path}.ipynb")).items()}
        assert manifest()[c.notebook] == declared_parameters(c.notebook) == theirs, c.notebook
    assert declared_parameters("10c_study")["rl_test_samples"] == "2"  # source text, the notebook's default


def test_an_installed_afm_checks_keys_as_a_clone_does(tmp_path):
    """The package alone (no `nbs/`, no `settings.ini` anywhere above it), as `pip install` leaves it: a profile key no
    chapter declares is refused, naming the key it probably meant, as in a clone."""
    import shutil
    import subprocess
    site = tmp_path / "site"
    shutil.copytree(REPO / "afm", site / "afm", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in type(f).__name__]\n"
            "import afm; assert afm.__file__.startswith(sys.argv[1]), afm.__file__\n"
            "from afm.rl.trainer import rl_args\n"
            "assert rl_args({'rl_seeds': 3, 'rl_learning_rate': 1e-5}).learning_rate == 1e-5\n"
            "try: rl_args({'rl_sedes': 3})\n"
            "except ValueError as e: print(e)\n"
            "else: raise SystemExit('an unknown key was let through')\n")
    r = subprocess.run([sys.executable, "-c", code, str(site)], cwd=tmp_path, capture_output=True, text=True,
                       env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}, timeout=120)
    assert r.returncode == 0 and "'rl_sedes' (did you mean 'rl_seeds'?)" in r.stdout, r.stdout + r.stderr[-2000:]


@pytest.mark.parametrize("notebook, prefix, same_everywhere", [("09c_recipe", "sft_", ("sft_demo_steps",)),
                                                                ("10c_study", "rl_",
                                                                 ("rl_demo_steps", "rl_sft_from")),
                                                                ("11_results", "results_",
                                                                 ("results_efficiency_per_suite", "results_suites"))])
def test_every_profile_sets_the_chapter_schedule(notebook, prefix, same_everywhere):
    """The SFT and RL chapters' parameters default to CI sizes (2 steps, one val question): a profile that left one
    out would run on it."""
    import ast
    cells = json.loads((REPO / "nbs" / f"{chapter(notebook).path}.ipynb").read_text())["cells"]
    source = "".join(next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))["source"])
    # the demonstration run is the same everywhere; a run starts from its own profile's SFT
    schedule = [t.id for node in ast.parse(source).body if isinstance(node, ast.Assign) for t in node.targets
                if t.id.startswith(prefix) and t.id not in same_everywhere]
    assert len(schedule) >= 2
    for name, params in load_profiles(REPO / "settings.ini").items():
        missing = [k for k in schedule if k not in params]
        assert not missing, f"profile {name} leaves {missing} at the chapter's CI defaults"


def test_tiny_study_is_tiny_with_the_studies():
    profiles = load_profiles(REPO / "settings.ini")
    # make reproduce runs no ablation
    assert profiles["tiny-study"]["sft_ablation"] and not profiles["tiny"]["sft_ablation"]
    assert profiles["tiny-study"]["rl_seeds"] >= 3 > profiles["tiny"]["rl_seeds"]  # the seeds study
    assert profiles["tiny-study"]["sft_seeds"] >= 3 > profiles["tiny"]["sft_seeds"]  # the SFT recipe's spread
    study = ("description", "sft_ablation", "sft_seeds", "rl_seeds", "rl_study_steps", "rl_max_steps",
             "rl_val_per_suite", "rl_choose", "rl_test_per_suite", "rl_save_steps", "rl_groups_per_step",
             "rl_test_samples",
             "sft_val_per_suite", "sft_choose", "sft_floor_per_suite", "results_tts_per_suite", "expected_minutes",
             # the pre-registered RL study's design
             "rl_sft_from", "rl_pool_samples", "rl_decoding_choices", "rl_updates_per_generation", "rl_updates_choices",
             "rl_choice_generations")
    assert {k: v for k, v in profiles["tiny-study"].items() if k not in study} == \
        {k: v for k, v in profiles["tiny"].items() if k not in study}  # the study extends tiny


def test_license_and_citation():
    """The license pyproject declares is the one in the box; the citation file parses and cites the paper and the
    package version."""
    import yaml
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    text = (REPO / "LICENSE").read_text()
    assert (meta["license"] == "Apache-2.0" and "Apache License" in text and "Version 2.0, January 2004" in text
            and "[yyyy]" not in text)
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["version"] == meta["version"] and cff["license"] == meta["license"]
    paper = cff["preferred-citation"]
    assert "Chain-of-Agents" in paper["title"] and paper["url"].endswith("2508.13167") and len(paper["authors"]) == 30
    assert meta["urls"]["Paper"] == paper["url"]


PAPER = json.loads((REPO / "tests" / "paper_numbers.json").read_text())


def _paper_configs(name: str, profile: dict) -> dict:
    "Each configuration of a profile as the code reads it (defaults included): what a key that is left out means."
    from afm.rollout.evaluate import eval_config
    from afm.rl.trainer import rl_args
    from afm.rollout.loop import rollout_config
    from afm.sft.trainer import sft_args
    where = f"settings.ini [{name}]"
    return {"profile": profile, "sft": vars(sft_args(profile, where)), "rl": vars(rl_args(profile, where)),
            "rollout": vars(rollout_config(profile, where=where)),
            "rl_rollout": vars(rollout_config(profile, "rl", where)), "eval": vars(eval_config(profile, where=where))}


@pytest.mark.parametrize("name", [n for n in load_profiles(REPO / "settings.ini") if n.startswith("paper-")])
def test_paper_profiles_hold_the_papers_numbers(name):
    """Every paper-* setting with a counterpart in the paper (tests/paper_numbers.json: its sections 4-6) has the
    paper's value."""
    configs = _paper_configs(name, load_profiles(REPO / "settings.ini")[name])
    wrong = []
    for s in PAPER["settings"]:
        if name not in s.get("profiles", [name]): continue
        have = configs[s["config"]].get(s["field"])
        ok = s["paper"][0] <= have <= s["paper"][1] if isinstance(s["paper"], list) else have == s["paper"]
        if not ok: wrong.append(f"{s['config']}.{s['field']} = {have!r}, the paper (section {s['section']}): "
                                f"{s['paper']!r}, {s['says']}")
    assert not wrong, "\n".join(wrong)
    rl, rollout = configs["rl"], configs["rollout"]
    # section 5: the overlong penalty starts at 7/8 of the length
    assert rl["overlong_buffer"] * 8 == rollout["max_new_tokens"]


def test_each_setting_has_one_owner():
    """Decoding and budgets are set once, as `rollout_*` keys, with `eval_*` and `rl_*` keys for RolloutConfig's fields
    over them (`afm.rollout.loop.rollout_config`): no other key of a profile repeats one (`sft_test_max_new_tokens` is
    CI's
    cap and None in every profile), and RL samples the whole distribution in every profile, as RLArgs' defaults did."""
    from dataclasses import fields
    from afm.rollout.evaluate import eval_config
    from afm.rollout.loop import RolloutConfig, rollout_config
    names = [f.name for f in fields(RolloutConfig)]
    for name, profile in load_profiles(REPO / "settings.ini").items():
        stray = [k for k, v in profile.items() if v is not None and k.endswith(tuple(f"_{n}" for n in names))
                 and not k.startswith(("rollout_", "eval_", "rl_"))]
        assert not stray, f"profile {name}: {stray} repeat a rollout setting; set it as rollout_*, eval_* or rl_*"
        rl, sampled = rollout_config(profile, "rl"), eval_config(profile, sampled=True)
        assert (rl.temperature, rl.top_p) == (1.0, 1.0), name  # DAPO samples the full distribution
        assert (sampled.temperature, sampled.top_p) == (1.0, 0.9), name  # SFT's and RL's sampled tests, alike


def test_every_paper_number_names_a_real_field():
    """A typo in the table would check nothing: each entry's field exists in its configuration, and each section is
    4, 5 or 6."""
    configs = _paper_configs("paper-web-7b", load_profiles(REPO / "settings.ini")["paper-web-7b"])
    assert all(s["field"] in configs[s["config"]] and s["section"] in ("4", "5", "6") for s in PAPER["settings"])


def _block(markers: tuple[str, str]) -> str:
    readme, (start, end) = (REPO / "README.md").read_text(), markers
    assert readme.count(start) == 1 and readme.count(end) == 1, f"README.md needs one block between {start} and {end}"
    return readme.split(start)[1].split(end)[0]


def test_readme_results_table_is_generated_from_metrics():
    """The README's results block is `results_table` of the committed reports/metrics.json: a hand edit or a stale
    table fails."""
    from afm.report.card import RESULTS_MARKERS, results_table
    assert _block(RESULTS_MARKERS) == "\n" + results_table(
        json.loads((REPO / "reports" / "metrics.json").read_text())), \
        "README.md's results table differs from reports/metrics.json: regenerate it with afm.report.card.update_readme"


def test_readme_measured_notes_are_generated_from_the_records():
    "The README's notes on what each profile measured are `measured_notes` of the committed records: a hand edit fails."
    from afm.report.card import NOTES_MARKERS, measured_notes, profile_records
    assert _block(NOTES_MARKERS) == "\n" + measured_notes(profile_records(REPO)), \
        ("README.md's measured notes differ from reports/: regenerate them with "
         "afm.report.card.update_block(README, NOTES_MARKERS, ...)")


# nbdev's index of the package and the package's docstrings (nbdev's own at the top; each wing's, written at export)
NBDEV_OWN = ("_modidx.py", "__init__.py")
MODULES = sorted(p for p in (REPO / "afm").rglob("*.py") if p.name not in NBDEV_OWN and "__pycache__" not in p.parts)


def test_every_module_is_about_one_thing_in_at_most_600_lines():
    sizes = {p.relative_to(REPO).as_posix(): len(p.read_text().splitlines()) for p in MODULES}
    assert len(sizes) > 40 and not {k: v for k, v in sizes.items() if v
                                    > 600}, sorted(sizes.items(), key=lambda kv: -kv[1])[:5]


def test_the_house_reads_as_the_pipeline():
    """At most 10 wings, at most 10 modules in a wing, every module of `afm/` a chapter's, in its wing's folder of
    `nbs/`, and each wing's `__init__` saying what the stage does and listing its modules."""
    from afm.core.chapters import CHAPTERS, WINGS
    assert len(WINGS) <= 10 and all(sum(c.wing == w for c in CHAPTERS) <= 10 for w in WINGS)
    assert {p.relative_to(REPO / "afm").with_suffix("").as_posix().replace("/", ".") for p in MODULES} == \
        {c.module for c in CHAPTERS}
    import afm
    assert all(f"`afm.{wing}`" in afm.__doc__ for wing in WINGS)  # the package's docstring names every wing
    for wing, does in WINGS.items():
        doc = __import__(f"afm.{wing}", fromlist=["_"]).__doc__
        assert " ".join(doc.split()).startswith(" ".join(does.split())), wing
        assert all(f"`afm.{c.module}`" in doc for c in CHAPTERS if c.wing == wing), wing


def test_long_lines_in_afm_are_only_the_ones_nbdev_writes():
    """ruff checks lines in nbs/, where they are written; in afm/ only what nbdev writes itself may pass 120 characters:
    the module docstring it makes of a notebook's summary and exported markdown, and its `__all__` header."""
    import subprocess
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "E501", "--line-length", "120",
                        "--output-format", "json", *map(str, MODULES)], capture_output=True, text=True, cwd=REPO)
    long = []
    for hit in json.loads(r.stdout):  # ruff reports JSON (an empty list when nothing is long); no output fails here
        lines = Path(hit["filename"]).read_text().splitlines()
        row, top = hit["location"]["row"], next(i for i, line in enumerate(lines, 1)
                                                if line.startswith("# AUTOGENERATED"))
        if row > top and not lines[row - 1].startswith("__all__ = ["):
            long.append(f"{Path(hit['filename']).name}:{row}")
    assert r.returncode in (0, 1) and not long, (long[:10], r.stderr[-500:])


def _imports(module: str):
    "`(line, module imported, names)` of each import of an `afm` module in `module` (dotted), relative ones resolved."
    import ast
    from afm.core.chapters import chapter
    path = REPO / "afm" / (module.replace(".", "/") + ".py")
    package = module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = (package[:len(package) - node.level + 1] if node.level else []) + (node.module or "").split(".")
            name = ".".join(p for p in base if p).removeprefix("afm.")
            if not node.level and not (node.module or "").startswith("afm"): continue
            if name == "afm": name = ""
            for a in node.names:  # `from afm.tools import harness` imports a module
                full = f"{name}.{a.name}".lstrip(".")
                try: yield node.lineno, chapter(full).module, []
                except KeyError: yield node.lineno, name, [a.name]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("afm."): yield node.lineno, a.name.removeprefix("afm."), []


def test_a_chapter_imports_only_the_chapters_above_it():
    """Data flows down the chapter table: no module imports a later one, not even inside a function (a protocol goes
    up instead); a wing imports only itself and the wings above it."""
    from afm.core.chapters import CHAPTERS, WINGS
    order, wings = {c.module: i for i, c in enumerate(CHAPTERS)}, list(WINGS)
    later = []
    for c in CHAPTERS:
        for line, m, _ in _imports(c.module):
            if m not in order: continue
            w = next(x for x in CHAPTERS if x.module == m).wing
            if order[m] > order[c.module] or (c.wing and w and wings.index(w) > wings.index(c.wing)):
                later.append(f"afm.{c.module}:{line} imports afm.{m}")
    assert not later, later


def test_no_private_name_is_imported_across_modules():
    "A name starting with `_` is its module's own: another module that needs it needs it made public first."
    from afm.core.chapters import CHAPTERS
    private = [f"afm.{c.module}:{line} imports {n} from afm.{m}" for c in CHAPTERS
               for line, m, names in _imports(c.module) for n in names if n.startswith("_") and m != c.module]
    assert not private, private


def test_no_committed_record_names_the_folder_a_clone_lived_in():
    """What a run commits (reports, the README) holds paths relative to the clone: a stamp, a figure or an executed
    notebook that named `/home/me/afm/reports/` would differ from clone to clone (temporary folders a chapter's own
    checks make and print are not a clone's)."""
    import re
    import subprocess
    clone_path = re.compile(r"(?<![\w.:/~-])(?!/tmp/tmp)/(?:[\w.-]+/)+(?:reports|data|nbs|afm)/")
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "reports", "README.md", "docs"], capture_output=True,
                           text=True, check=True).stdout.split()
    hits = [(f, m.group(0)) for f in files if (REPO / f).suffix in (".json", ".jsonl", ".md", ".ipynb", ".html")
            for m in clone_path.finditer((REPO / f).read_text(encoding="utf-8", errors="replace"))]
    assert hits == [], hits[:10]


def test_every_committed_chapter_keeps_the_figures_it_resumes_from():
    """A chapter's committed `run.json` comes with its `figures.json`: a fresh clone resumes a finished chapter from
    the two together, and one without its figures would run again (with every chapter after it)."""
    import subprocess
    files = set(subprocess.run(["git", "-C", str(REPO), "ls-files", "reports"], capture_output=True, text=True,
                               check=True).stdout.split())
    missing = sorted(f for f in files if f.endswith("/run.json") and f.replace("run.json", "figures.json") not in files)
    assert missing == [], f"committed without their figures.json: {missing}"


def test_parameter_cells_restate_no_profile_value():
    """A chapter's parameters cell holds its CI defaults; what a profile sets lives in `settings.ini` alone, so a
    comment that restated it (`tiny: 25`) went stale when the profile changed: none may."""
    import re
    from afm.core.chapters import CHAPTERS
    restated = re.compile(r"\b(?:tiny|smol|tiny-study|paper-[\w-]+)(?: profile)?: *\d|\bprofiles?: *\d")
    found = []
    for c in CHAPTERS:
        cells = json.loads((REPO / "nbs" / f"{c.path}.ipynb").read_text())["cells"]
        for cell in cells:
            if "parameters" in cell.get("metadata", {}).get("tags", []):
                found += [f"{c.notebook}: {line.strip()}" for line in "".join(cell["source"]).splitlines()
                          if "#" in line and restated.search(line.split("#", 1)[1])]
    assert not found, found


def test_no_import_in_a_function_repeats_one_at_the_top():
    """A module its file already imports at the top is imported there once: a second import inside a function adds
    nothing but a place to drift (a function-level import stays only for a module the file does not import at all)."""
    import ast
    repeated = []
    for path in MODULES:
        tree, package = ast.parse(path.read_text()), path.relative_to(REPO).with_suffix("").parts[:-1]
        def source(node):
            return ".".join([*package[:len(package) - node.level + 1], *(node.module or "").split(".")]).strip(".") \
                if node.level else node.module
        top = {source(n) for n in tree.body if isinstance(n, ast.ImportFrom)} | \
            {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        for f in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for n in ast.walk(f):
                mods = [source(n)] if isinstance(n, ast.ImportFrom) else \
                    [a.name for a in n.names] if isinstance(n, ast.Import) else []
                repeated += [f"{path.relative_to(REPO)}:{n.lineno} ({f.name}) imports {m} again"
                             for m in mods if m in top]
    assert not repeated, repeated


@pytest.mark.parametrize("page, link", [("README.md", "nbs/{path}.ipynb"), ("nbs/index.ipynb", "{path}.ipynb")])
def test_the_chapter_tables_are_the_chapter_table(page, link):
    """The README's and the docs home's chapter tables list `CHAPTERS` in order, each chapter linked where its notebook
    is and under its wing's heading, which says what `WINGS` says the stage does."""
    import re
    from afm.core.chapters import CHAPTERS, WINGS
    text = (REPO / page).read_text()
    if page.endswith(".ipynb"): text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
    rows = re.findall(r"^\| \[`([^`]+)`\]\(([^)]+)\) \| `afm\.([\w.]+)` \|", text, re.M)
    assert rows == [(c.notebook, link.format(path=c.path), c.module) for c in CHAPTERS]
    for wing, does in WINGS.items(): assert f"**`afm.{wing}`** — {does}" in text, wing


def test_two_runs_are_compared_figure_by_figure(tmp_path):
    """`tests/compare_reports.py`: the same figure identical, a timing apart, a figure moved to another chapter with its
    value, a changed one and a lost one caught (exit 1)."""
    import compare_reports
    def run(name, metrics, chapters):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))
        for key, figs in chapters.items():
            (tmp_path / name / key).mkdir()
            (tmp_path / name / key / "figures.json").write_text(json.dumps(figs))
        return tmp_path / name
    before = run("before", {"coa": {"examples": 3, "parse_per_s": 10}, "seconds": {"coa": 2.0}},
                 {"coa": {"examples": 3, "rows": [{"a": 1}, {"a": 2}]}, "sft": {"bench_rows": 48, "lost": 1}})
    after = run("after", {"coa": {"examples": 3, "parse_per_s": 12}, "seconds": {"coa": 2.5}},
                {"coa": {"examples": 3, "rows": [{"a": 1}, {"a": 3}]}, "rl_bench": {"bench_rows": 48}})
    c = compare_reports.compare(before, after)
    assert "metrics:coa.examples" in c["identical"] and "coa:rows[0].a" in c["identical"]
    assert set(c["timings"]) == {"metrics:coa.parse_per_s", "metrics:seconds.coa"}
    assert c["different"] == [("coa:rows[1].a", 2, 3)] and c["moved"] == [("sft:bench_rows", "rl_bench:bench_rows")]
    assert c["only_before"] == ["sft:lost"] and c["only_after"] == []
    assert compare_reports.main([str(before), str(after)]) == 1 and compare_reports.main([str(before)] * 2) == 0
    for side, rows in (("b", [{"task_id": "a", "reward": 1, "seconds": 2.0, "trajectory": '{"steps": [1]}'},
                              {"task_id": "b", "reward": 0}]),
                       ("a", [{"task_id": "b", "reward": 0},
                              {"task_id": "a", "reward": 1, "seconds": 3.5, "trajectory": '{"steps": [1]}'}])):
        (tmp_path / side / "sft").mkdir(parents=True)
        (tmp_path / side / "sft" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (tmp_path / side / "sft" / "val.jsonl").write_text(json.dumps({"task_id": "c", "reward": int(side == "a")}))
    got = compare_reports.compare_records(tmp_path / "b", tmp_path / "a")
    assert got == {"identical": ["sft/test.jsonl"], "different": ["sft/val.jsonl"], "missing": []}
    assert compare_reports.main([str(before)] * 2 + ["--data", str(tmp_path / "b"), str(tmp_path / "b")]) == 0

"""A fresh machine is what the tests see: `make test` runs in caches of its own that it empties first, and the fitted
test model is a function of this code alone, so two empty caches fit the same weights."""
import os
import subprocess
import sys

from conftest import REPO


def test_two_empty_caches_fit_the_same_weights(tmp_path, monkeypatch, tool_caller_folder):
    """The session's test model (fitted into `make test`'s own cache, emptied when it began) and a fit into a cache of
    this test's own, empty but for what another machine's fit could leave under the same identity: a model that calls
    no tool. That one is fitted again, and the fit gives the session's folder name (the identity) and its weights."""
    from afm.models.catalog import load, provenance, save_model, tiny_chat_model
    from afm.models.fit import calls_tools, one_search_examples, tool_caller_start, tool_calling_tiny
    from afm.sft.training import weight_digest
    monkeypatch.setenv("AFM_CACHE", str(tmp_path / "cache"))
    folder = tool_caller_start()[-1]
    save_model(*tiny_chat_model(3), folder, {"fitted": "not at all"})  # an untrained model, cached as this fit
    model, tok = tool_calling_tiny()
    assert model.name_or_path == str(folder) and folder.is_relative_to(tmp_path / "cache")  # fitted anew, in its own
    assert folder.name == tool_caller_folder.name  # under the same identity
    assert weight_digest(model) == weight_digest(load(str(tool_caller_folder))[0]), "one identity, other weights"
    assert calls_tools(model, tok, [t for t, _ in one_search_examples()[:8]]) >= 0.75
    assert provenance(folder)["fitted"]["calls_tools"] >= 0.75


def test_make_test_reads_no_cache_it_did_not_build():
    r = subprocess.run(["make", "-n", "test", "TEST_CACHE=/tmp/afm-fresh-check"], cwd=REPO, capture_output=True,
                       text=True, timeout=60, env={**os.environ, "MAKEFLAGS": ""})
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert r.returncode == 0, r.stderr
    wipe = next(i for i, line in enumerate(lines) if line.startswith("rm -rf /tmp/afm-fresh-check"))
    runs = [i for i, line in enumerate(lines) if any(f" {t} " in f" {line} " or f"/{t} " in line
                                                      for t in ("nbdev-test", "pytest", "tests/nbdev_sync.py"))]
    assert len(runs) == 3 and wipe < min(runs), lines
    for i in runs:  # each run of afm's code: the emptied cache, and the user's cache folder moved there too
        assert "AFM_CACHE=/tmp/afm-fresh-check/afm" in lines[i] and "XDG_CACHE_HOME=/tmp/afm-fresh-check" in lines[i]


def test_a_fresh_install_compiles_its_dependencies_quietly(tmp_path):
    """A fresh install may lack bytecode: a dependency's sources compile on their first import, and their
    SyntaxWarnings (reasoning-gym's cellpylib) would be printed into afm's output (a one-line CLI error became nine).
    Here they compile afresh (an empty bytecode cache) as the gsm suite is generated, and nothing reaches stderr."""
    code = ("import sys; from afm.tasks.suites import math_tasks; sys.pycache_prefix = sys.argv[1]; "
            "assert 'reasoning_gym' not in sys.modules; print(len(math_tasks('val', 2)))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # its bytecode written: compiled
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                       timeout=120, env={**env, "PYTHONWARNINGS": "default"})
    assert r.returncode == 0 and r.stdout.strip() == "2", r.stderr
    assert any(tmp_path.rglob("*.pyc")), "nothing was compiled afresh"
    assert r.stderr == "", r.stderr

"""A fresh machine is what the tests see: `make test` runs in caches of its own that it empties first, and the fitted
test model is a function of this code alone, so two empty caches fit the same weights."""
import os
import subprocess
import sys

from conftest import ENV, REPO

FIT = ("from afm.models.fit import tool_calling_tiny; from afm.sft.training import weight_digest; "
       "model, _ = tool_calling_tiny(); print(model.name_or_path); print(weight_digest(model))")


def test_two_empty_caches_fit_the_same_weights(tmp_path):
    caches = [tmp_path / "a", tmp_path / "b"]
    procs = [subprocess.Popen([sys.executable, "-c", FIT], env={**ENV, "AFM_CACHE": str(c)}, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in caches]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    (folder_a, digest_a), (folder_b, digest_b) = (o.split()[-2:] for o, _ in outs)
    assert folder_a.startswith(str(caches[0])) and folder_b.startswith(str(caches[1]))  # each fitted into its own
    assert os.path.basename(folder_a) == os.path.basename(folder_b)  # under the same identity
    assert digest_a == digest_b, "two fits of the same identity gave other weights"


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

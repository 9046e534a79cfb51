"""The nbdev contract: `afm/` is exactly what `nbdev-export` makes of `nbs/` (every module, each wing's `__init__` and
the
chapters' manifest `afm/chapters.json`), and every notebook is clean.

Works on a copy of the repository, so it never touches the working tree. Run as a script (exit 1 and the differing files
on failure) or call `problems(repo)` from a test.
"""
from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _bin(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    return str(exe) if exe.exists() else name


def _diff(a: Path, b: Path, pattern: str) -> list[str]:
    "Relative paths of files matching `pattern` that differ between trees `a` and `b` or exist in only one."
    fa = {p.relative_to(a) for p in a.rglob(pattern) if "__pycache__" not in p.parts}
    fb = {p.relative_to(b) for p in b.rglob(pattern) if "__pycache__" not in p.parts}
    return sorted(str(p) for p in fa ^ fb) + sorted(str(p) for p in fa & fb
                                                    if not filecmp.cmp(a / p, b / p, shallow=False))


def problems(repo: Path = REPO) -> list[str]:
    "What a fresh `nbdev-export` or `nbdev-clean` would change in `repo`, one line per file."
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "repo"
        work.mkdir()
        shutil.copy(repo / "pyproject.toml", work)
        shutil.copytree(repo / "nbs", work / "nbs", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        shutil.copytree(repo / "afm", work / "afm", ignore=shutil.ignore_patterns("__pycache__"))
        for f in [*(work / "afm").rglob("*.py"), work / "afm" / "chapters.json"]:  # export from scratch
            f.unlink(missing_ok=True)
        for cmd in ("nbdev-export", "nbdev-clean"):
            r = subprocess.run([_bin(cmd)], cwd=work, capture_output=True, text=True)
            if r.returncode: return [f"{cmd} failed: {r.stderr.strip()[-2000:]}"]
        out = [f"afm/{p}: differs from a fresh nbdev-export (run nbdev-export and commit)"
               for pattern in ("*.py", "chapters.json") for p in _diff(repo / "afm", work / "afm", pattern)]
        out += [f"nbs/{p}: not clean (run nbdev-clean and commit)"
                for p in _diff(repo / "nbs", work / "nbs", "*.ipynb")]
        return out


if __name__ == "__main__":
    found = problems()
    print("\n".join(found) if found else "nbdev sync: afm/ matches nbs/ and every notebook is clean")
    sys.exit(1 if found else 0)

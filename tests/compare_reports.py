"""Two runs' figures compared by name: what a change that should not alter behaviour (a move, a split) is checked with.

    python tests/compare_reports.py BEFORE_REPORTS AFTER_REPORTS [--timings] [--data BEFORE_DATA AFTER_DATA]

Reads each folder's `metrics.json` and every chapter's `figures.json`, flattened to dotted names
(`sft:test.sft.world_qa`). A figure in both runs is identical, a timing (its name says it measures time, speed, memory
or the machine: these differ run to run), or different; a figure in one run only is reported as moved when the other run
holds it, with the same value, under another chapter. Exit 1 when a figure that is not a timing differs or is missing on
one side. `--data`: every JSONL records file under the first `data/` folder is compared with the second's, record by
record, its timings removed and JSON held in strings read (a file written by parallel workers compared as a set).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TIMING = re.compile("|".join((  # times and speeds, their ratios and shares, memory, the machine and when things ran
    r"second", r"_s$", r"_s_", r"per_s", r"time", r"wall", r"minute", r"tok_s", r"tokens_per", r"throughput", r"speed",
    r"faster", r"ratio", r"duration", r"_ms", r"latency", r"elapsed", r"qps", r"sustained", r"overhead", r"mfu",
    r"vs_(library|hf|trl|engine|packed)", r"share_(rollout|training|reward|tool_wait)", r"wait_share",
    r"[:.]profile(_\w+)?\.", r"_gb$", r"_gib", r"peak", r"rss", r"memory", r"^metrics:load\.", r"machine", r"versions",
    r"date", r"expected", r"started", r"installed", r"finished$", r"commit", r"host")), re.I)


def flatten(x, prefix: str = "") -> dict:
    "Dotted names to values; lists of dicts or lists are indexed (`rows[3].score`), other lists are values."
    if isinstance(x, dict):
        return {k: v for key, val in x.items()
                for k, v in flatten(val, f"{prefix}.{key}" if prefix else str(key)).items()}
    if isinstance(x, list) and x and all(isinstance(v, (dict, list)) for v in x):
        return {k: v for i, val in enumerate(x) for k, v in flatten(val, f"{prefix}[{i}]").items()}
    return {prefix: x}


def figures(reports: Path) -> dict:
    "Every figure of a reports folder by name: `metrics:<dotted>` and `<chapter>:<dotted>`."
    reports = Path(reports)
    out = {f"metrics:{k}": v for k, v in flatten(json.loads((reports / "metrics.json").read_text())).items()}
    for f in sorted(reports.glob("*/figures.json")):
        out |= {f"{f.parent.name}:{k}": v for k, v in flatten(json.loads(f.read_text())).items()}
    return out


def _last(name: str) -> str:  # the name inside its chapter (metrics.json nests each chapter under its key)
    where, rest = name.split(":", 1)
    return rest.split(".", 1)[-1] if where == "metrics" else rest


def compare(before: Path, after: Path) -> dict[str, list]:
    "`identical`, `timings`, `different`, `moved` (pairs), `only_before`, `only_after`: names of figures."
    b, a = figures(before), figures(after)
    both = sorted(b.keys() & a.keys())
    gone, new = sorted(b.keys() - a.keys()), sorted(a.keys() - b.keys())
    moved = [(k, j) for k in gone for j in new if _last(k) == _last(j) and b[k] == a[j]]
    was, now = {k for k, _ in moved}, {j for _, j in moved}
    return {"identical": [k for k in both if b[k] == a[k]],
            "timings": [k for k in both if b[k] != a[k] and TIMING.search(k)],
            "different": [(k, b[k], a[k]) for k in both if b[k] != a[k] and not TIMING.search(k)],
            "moved": moved, "only_before": [k for k in gone if k not in was and not TIMING.search(k)],
            "only_after": [k for k in new if k not in now and not TIMING.search(k)]}


def _records(path: Path) -> list:
    def clean(x):
        if isinstance(x, str) and x[:1] in "{[":
            try: x = json.loads(x)
            except ValueError: return x
        if isinstance(x, dict): return {k: clean(v) for k, v in x.items() if not TIMING.search(k)}
        return [clean(v) for v in x] if isinstance(x, list) else x
    return [clean(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def compare_records(before: Path, after: Path) -> dict[str, list]:
    "`identical` and `different` (relative paths) of the JSONL files under `before`; `missing`: not under `after`."
    out = {"identical": [], "different": [], "missing": []}
    for f in sorted(p.relative_to(before) for p in Path(before).rglob("*.jsonl")):
        if not (Path(after) / f).is_file():
            out["missing"].append(str(f))
            continue
        b, a = _records(Path(before) / f), _records(Path(after) / f)
        as_set = lambda rows: sorted(json.dumps(r, sort_keys=True) for r in rows)
        out["identical" if a == b or as_set(a) == as_set(b) else "different"].append(str(f))
    return out


def main(argv: list[str]) -> int:
    data = argv[argv.index("--data") + 1:argv.index("--data") + 3] if "--data" in argv else []
    paths = [a for a in argv if not a.startswith("--") and a not in data]
    if len(paths) != 2 or len(data) not in (0, 2): raise SystemExit(__doc__)
    c = compare(*map(Path, paths))
    print(", ".join(f"{k} {len(v)}" for k, v in c.items()))
    for k, was, now in c["different"]: print(f"different  {k}: {was!r:.80} -> {now!r:.80}")
    for side in ("only_before", "only_after"):
        for k in c[side]: print(f"{side}  {k}")
    if "--timings" in argv:
        for k in c["timings"]: print(f"timing  {k}")
    r = compare_records(*map(Path, data)) if data else {}
    if data: print(f"records: identical {len(r['identical'])}, different {r['different']}, missing {r['missing']}")
    return int(bool(c["different"] or c["only_before"] or c["only_after"] or r.get("different") or r.get("missing")))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`afm distill` as a user runs it: a real process, killed mid-run and resumed, and its output checked end to end."""
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter

import datasets
import pytest

from afm.format.coa import Trajectory, counts, grammar_problems
from afm.tasks.suites import GENERATED_SUITES
from afm.teacher.distill import read_runs
from afm.tasks.grading import grade
from afm.tasks.task import load_benchmark
from afm.tools.toolbox import TOOLS
from conftest import AFM, ENV, REPO



def _settings(tmp_path, per_suite):
    path = tmp_path / "settings.ini"
    path.write_text(f"[quick]\ndescription = test\ndistill_tasks_per_suite = {per_suite}\ndistill_workers = 2\n")
    return path


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """A distillation killed mid-run, a half-written line appended, and the resumed run: (out, finished lines,
    resumed result)."""
    tmp_path = tmp_path_factory.mktemp("distill")
    settings, out = _settings(tmp_path, 12), tmp_path / "out"
    cmd = [AFM, "distill", "--profile", "quick", "--settings", str(settings), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    runs = out / "runs.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not runs.exists() or len(runs.read_text().splitlines()) < 10):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    written = runs.read_bytes()
    finished = written[: written.rfind(b"\n") + 1].splitlines()  # the runs written whole before the kill
    assert 10 <= len(finished) < 12 * len(GENERATED_SUITES), len(finished)
    with runs.open("a") as f: f.write('{"task_id": "half a line')  # a crash in the middle of a write
    return out, finished, subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)


def test_distill_survives_a_crash_and_resumes(crashed):
    out, finished, r = crashed
    runs = out / "runs.jsonl"
    assert r.returncode == 0, r.stderr[-3000:]
    after = runs.read_bytes().splitlines()
    # reused: the finished runs are still there byte for byte (their timings would differ had they been redone) ...
    assert after[: len(finished)] == finished
    # ... and the resumed process ran only the rest: nothing lost, nothing twice
    ids = [r.task_id for r in read_runs(runs)]
    assert len(after) == len(ids) == len(set(ids)) == 12 * len(GENERATED_SUITES)
    assert {json.loads(line)["task_id"] for line in finished}.isdisjoint(json.loads(line)["task_id"]
                                                                         for line in after[len(finished):])
    stats = json.loads((out / "stats.json").read_text())
    assert stats["tasks"] == 12 * len(GENERATED_SUITES) and stats["dataset_rows"] > 0


def test_every_kept_trajectory_is_clean_correct_and_real(crashed):
    """The set the resumed run built (from runs of both processes)."""
    out, _, r = crashed
    assert r.returncode == 0, r.stderr[-3000:]
    ds = datasets.load_from_disk(str(out / "dataset"))
    tasks = {t.id: t for s in GENERATED_SUITES for t in load_benchmark(s, split="sft", sizes={"sft": 12})}
    kinds = Counter()
    for row in ds:
        t = Trajectory.from_json(row["trajectory"])
        assert grammar_problems(t) == [] and counts(t)["interactions"] >= 5, (t.task_id, grammar_problems(t))
        assert grade(tasks[t.task_id], t.answer) == 1.0
        for s in t.steps:
            if TOOLS.tags.is_tool(s.role): assert s.observation and "already" not in s.observation[:40]
        assert row["teacher_tokens"] > 0 and row["teacher_tool_calls"] == t.accounting.tool_calls
        kinds[row["kind"]] += 1
    assert set(kinds) == {"qa", "math", "code"}
    card = (out / "README.md").read_text()
    assert "| stage | in | kept | dropped | reasons |" in card and (out / "histograms.png").stat().st_size > 1000
    assert len((out / "sft.jsonl").read_text().splitlines()) == len(ds)


def test_openai_brain_without_an_endpoint_is_a_clear_error(tmp_path):
    env = {k: v for k, v in ENV.items() if not k.startswith("AFM_TEACHER")}
    r = subprocess.run([AFM, "distill", "--profile", "quick", "--settings", str(_settings(tmp_path, 2)), "--out",
                        str(tmp_path / "o"), "--brain", "openai"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1 and "AFM_TEACHER_BASE_URL" in r.stderr


def test_a_dead_endpoint_stops_the_run_cleanly(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**ENV, "AFM_TEACHER_BASE_URL": f"http://127.0.0.1:{port}", "AFM_TEACHER_MODEL": "teacher"}
    out = tmp_path / "o"
    t0 = time.monotonic()
    r = subprocess.run([AFM, "distill", "--profile", "quick", "--settings", str(_settings(tmp_path, 2)), "--out",
                        str(out), "--brain", "openai"], capture_output=True, text=True, env=env, timeout=300)
    assert (r.returncode == 1 and f"127.0.0.1:{port}" in r.stderr
            and "the teacher (llm:openai:teacher) does not answer" in r.stderr), r.stderr[-2000:]
    # one line (after progress bars)
    assert (r.stderr.strip().splitlines()[-1].startswith("afm distill: ValueError: the teacher")
            and time.monotonic() - t0 < 120)
    assert not (out / "runs.jsonl").exists()  # asked once up front: no task was started


def test_a_run_with_reports_outside_the_repo_leaves_the_set_where_sft_reads_it(tmp_path):
    """The pipeline's hand-off: `afm run --reports` anywhere, and the distilled set lands in `data_dir("distill",
    profile)` (the one rule the SFT chapter and `afm sft` read by), not beside the reports folder."""
    from afm.core.files import data_dir, read_rows
    profile = f"handoff-test-{os.getpid()}"
    settings, reports = tmp_path / "settings.ini", tmp_path / "elsewhere" / "reports"
    settings.write_text(f"[{profile}]\ndescription = test\nseed = 0\ndistill_tasks_per_suite = 2\ndistill_workers = 2\n"
                        "system_style = brief\ntools_web_k = 2\n")
    target = data_dir("distill", profile, REPO)
    try:
        r = subprocess.run([AFM, "run", "--profile", profile, "--settings", str(settings), "--chapters", "05_distill",
                            "--reports", str(reports)], cwd=REPO, capture_output=True, text=True, env=ENV, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        rows = list(read_rows(target / "sft.jsonl"))
        assert rows and (target / "dataset").is_dir() and (target / "README.md").is_file()
        assert json.loads((reports / "metrics.json").read_text())["distill"]["dataset_rows"] == len(rows)
        assert not (reports.parent / "data").exists()  # nothing beside the reports folder
    finally:
        shutil.rmtree(target, ignore_errors=True)

"""The `afm` console script, run as a user runs it: a process of its own."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AFM = str(Path(sys.executable).with_name("afm"))


def afm(*args, cwd=REPO, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([AFM, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_help_lists_every_subcommand():
    r = afm("--help")
    assert r.returncode == 0
    for cmd in ("run", "distill", "sft", "rl", "eval", "serve", "bench"):
        assert f"  {cmd} " in r.stdout, cmd


def test_missing_chapter_says_so_and_fails():
    for cmd in ("rl", "eval"):
        r = afm(cmd)
        assert r.returncode == 2 and "does not exist yet" in r.stderr, (cmd, r.stderr)


def test_unknown_profile_is_a_clear_error():
    r = afm("run", "--profile", "nope")
    assert r.returncode == 1 and "unknown profile 'nope'" in r.stderr and "tiny" in r.stderr


def test_run_writes_metrics_and_resumes(tmp_path):
    """A real headless run of a light chapter with a profile of its own, then a resumed run that executes nothing."""
    settings = tmp_path / "settings.ini"
    settings.write_text("[quick]\ndescription = test\nseed = 3\n")
    reports = tmp_path / "reports"
    r = afm("run", "--profile", "quick", "--settings", str(settings), "--reports", str(reports), "--chapters", "02b_crawl")
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((reports / "metrics.json").read_text())
    assert m["profile"] == "quick" and m["parameters"]["seed"] == 3 and m["versions"]["trl"] == "1.16.0"
    assert m["machine"]["cpus"] >= 1 and m["date"] and m["crawl"]["demo_pages_read"] == 1
    assert (reports / "README.md").read_text().startswith("# Report card — profile `quick`")
    executed = reports / "notebooks" / "02b_crawl.ipynb"
    before = executed.stat().st_mtime_ns
    r = afm("run", "--profile", "quick", "--settings", str(settings), "--reports", str(reports), "--chapters", "crawl")
    assert r.returncode == 0 and executed.stat().st_mtime_ns == before


def test_run_outside_a_repository_is_a_clear_error(tmp_path):
    r = afm("run", cwd=tmp_path)
    assert r.returncode == 1 and "no afm repository" in r.stderr


def test_bench_search_and_sandbox_print_side_by_side_figures(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AFM_CACHE": str(tmp_path / "cache")}
    run = lambda *a: subprocess.run([AFM, "bench", *a, "--json"], capture_output=True, text=True, timeout=600, env=env)
    r, q = run("search", "--queries", "20"), run("sandbox", "--runs", "3")
    assert r.returncode == 0 and q.returncode == 0, (r.stderr[-2000:], q.stderr[-2000:])
    res = json.loads(r.stdout.strip().splitlines()[-1]) | json.loads(q.stdout.strip().splitlines()[-1])
    assert res["documents"] == 10033 and res["queries"] == 20 and res["runs"] == 3
    for k in ("afm_qps_single", "afm_qps_batched", "rank_bm25_qps", "sandbox_warm_ms", "sandbox_cold_ms", "plain_python_warm_ms",
              "sandbox_warm_exec_per_s_2_workers", "sandbox_cold_exec_per_s_2_workers"):
        assert res[k] > 0, k
    assert abs(res["speedup_single"] - res["afm_qps_single"] / res["rank_bm25_qps"]) <= 0.01 * res["speedup_single"] + 0.1
    assert (tmp_path / "cache" / "index").is_dir()  # the default index was built once and cached


def test_distill_validates_its_numbers_and_settings_at_the_edge(tmp_path, capsys):
    """One case as a process of its own; the rest through the same entry point in this process (the same code, faster)."""
    from afm.distill import cli_distill
    r = afm("distill", "--tasks_per_suite", "0", "--out", str(tmp_path / "out"), timeout=120)
    assert r.returncode != 0 and "tasks_per_suite" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-500:]

    def run(*argv):
        try: code = cli_distill([*argv, "--out", str(tmp_path / "out")])
        except SystemExit as e: code = e.code
        return code, capsys.readouterr().err
    for args, words in [(["--tasks_per_suite", "-1"], "tasks_per_suite"), (["--workers", "-3"], "workers"),
                        (["--world_scale", "0"], "world_scale")]:
        code, err = run(*args)
        assert code != 0 and words in err and len(err.strip().splitlines()) == 1, (args, err[-500:])
    for text, words in [("[tiny]\ndistill_workers = two\n", "distill_workers = 'two' should be a whole number"),
                        ("[tiny]\ndistill_tasks_per_suite = 2OO\n", "distill_tasks_per_suite = '2OO' should be a whole number"),
                        ("[tiny]\nworld_scale = 1.O\n", "world_scale = '1.O' should be a number"),
                        ("[tiny]\ndistill_workers 2\n", "bad.ini"), ("[tiny]\nseed = 1\nseed = 2\n", "bad.ini")]:
        (tmp_path / "bad.ini").write_text(text)
        code, err = run("--settings", str(tmp_path / "bad.ini"))
        assert code != 0 and words in err and len(err.strip().splitlines()) == 1, (text, err[-500:])
    assert not (tmp_path / "out" / "sft.jsonl").exists()

"""The `afm` console script, run as a user runs it: a process of its own."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import AFM, REPO



def afm(*args, cwd=REPO, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([AFM, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_help_lists_every_subcommand():
    r = afm("--help")
    assert r.returncode == 0
    for cmd in ("run", "distill", "sft", "rl", "eval", "serve", "bench"):
        assert f"  {cmd} " in r.stdout, cmd


_HELP_ALL = """
import contextlib, io, json, re, sys, time
from afm.cli import COMMANDS, main, providers
out = {}
for cmd in COMMANDS:
    for target in [None] + [t for t in providers(cmd) if t]:
        argv = [cmd] + ([target] if target else []) + ["--help"]
        buf, t0 = io.StringIO(), time.perf_counter()
        with contextlib.redirect_stdout(buf):
            try: rc = main(argv)
            except SystemExit as e: rc = e.code
        out[" ".join(argv[:-1])] = {"rc": rc, "help": buf.getvalue(), "s": time.perf_counter() - t0}
heavy = sorted(m for m in ("torch", "transformers", "trl", "papermill", "peft", "datasets") if m in sys.modules)
print(json.dumps({"commands": out, "heavy": heavy}))
"""


def test_every_commands_help_answers_without_loading_a_framework():
    """`afm COMMAND --help` answers at once: no command imports torch, transformers, TRL or papermill to show its
    options (each once took 2 to 9 s to import)."""
    r = subprocess.run([sys.executable, "-c", _HELP_ALL], capture_output=True, text=True, timeout=300, cwd=REPO,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    print({k: round(v["s"], 2) for k, v in got["commands"].items()})  # seconds, this machine, not asserted
    assert got["heavy"] == [], got["heavy"]
    assert {"serve", "serve search", "serve model", "bench rl", "sft", "rl", "eval", "run"} <= set(got["commands"])
    for name, h in got["commands"].items():
        assert h["rc"] == 0 and "usage: afm" in h["help"], (name, h)
        text = " ".join(h["help"].split())
        assert not re.search(r"\(default[^()]*\) \(default", text), (name, "a doubled default")
        for flag in re.findall(r"--no-([a-z0-9-]+)", text):  # a switch's off form says what it turns off
            assert f"--{flag} [" not in text or f"turn --{flag} off" in text, (name, flag)


def test_every_option_takes_both_spellings():
    "`--no-resume` and `--no_resume` are one option; no command parser is a bare argparse one."
    for flag in ("--no-resume", "--no_resume"):
        r = afm("run", flag, "--list")
        assert r.returncode == 0 and "tiny" in r.stdout, (flag, r.stderr)
    bare = [p.name for p in (REPO / "afm").glob("*.py")
            if "argparse.ArgumentParser(" in p.read_text() and p.name not in ("args.py", "cli.py")]
    assert bare == [], f"{bare}: parse with afm.core.args.ArgParser, which takes both spellings"


def test_every_command_has_a_written_chapter():
    from afm.cli import COMMANDS, providers
    for cmd in COMMANDS:
        assert providers(cmd) and all(ch.exists() for ch in providers(cmd).values()), cmd


def test_unknown_profile_is_a_clear_error():
    r = afm("run", "--profile", "nope")
    assert r.returncode == 1 and "unknown profile 'nope'" in r.stderr and "tiny" in r.stderr


def test_run_writes_metrics_and_resumes(tmp_path):
    """A real headless run of a light chapter with a profile of its own, then a resumed run that executes nothing."""
    settings = tmp_path / "settings.ini"
    settings.write_text("[quick]\ndescription = test\nseed = 3\n")
    reports = tmp_path / "reports"
    r = afm("run", "--profile", "quick", "--settings", str(settings), "--reports", str(reports), "--chapters",
            "02b_crawl")
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((reports / "metrics.json").read_text())
    assert m["profile"] == "quick" and m["parameters"]["seed"] == 3 and m["versions"]["trl"] == "1.16.0"
    assert m["machine"]["cpus"] >= 1 and m["date"] and m["crawl"]["demo_pages_read"] == 1
    assert (reports / "README.md").read_text().startswith("# Report card — profile `quick`")
    executed = reports / "notebooks" / "02b_crawl.ipynb"
    before = executed.stat().st_mtime_ns
    r = afm("run", "--profile", "quick", "--settings", str(settings), "--reports", str(reports), "--chapters", "crawl")
    assert r.returncode == 0 and executed.stat().st_mtime_ns == before


def test_run_refuses_a_chapter_whose_input_is_missing(tmp_path):
    """RL without an SFT model for the profile: one line naming the chapter, the folder and the command, before
    anything runs."""
    settings = tmp_path / "settings.ini"
    settings.write_text("[nodata]\ndescription = test\n")
    r = afm("run", "--profile", "nodata", "--settings", str(settings), "--reports", str(tmp_path / "reports"),
            "--chapters", "10c_study")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert ("chapter 10c_study reads" in r.stderr and "data/sft/nodata" in r.stderr
            and "--chapters 09c_recipe" in r.stderr)
    assert not (tmp_path / "reports").exists()


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
    for k in ("afm_qps_single", "afm_qps_batched", "rank_bm25_qps", "sandbox_warm_ms", "sandbox_cold_ms",
              "plain_python_warm_ms", "sandbox_warm_exec_per_s_2_workers", "sandbox_cold_exec_per_s_2_workers"):
        assert res[k] > 0, k
    assert (abs(res["speedup_single"] - res["afm_qps_single"] / res["rank_bm25_qps"])
            <= 0.01 * res["speedup_single"] + 0.1)
    assert (tmp_path / "cache" / "index").is_dir()  # the default index was built once and cached


def test_bench_rl_prints_its_figures_and_refuses_an_unknown_commit_first():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = lambda *a: subprocess.run([AFM, "bench", "rl", *a], capture_output=True, text=True, timeout=600, env=env)
    bad = run("--against", "no-such-commit")
    assert bad.returncode == 2 and "no-such-commit" in bad.stderr and "Loading" not in bad.stderr, bad.stderr[-500:]
    r = run("--steps", "1", "--groups", "1", "--generations", "2", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["episodes_per_step"] == 2 and res["steps"] == 1
    for k in ("seconds_per_step", "rl_sampled_tokens_per_s", "engine_tokens_per_s", "vs_trl_generation"):
        assert res[k] > 0, k
    assert 0 < res["share_rollout"] < 1 and 0 < res["share_training"] < 1


def test_distill_validates_its_numbers_and_settings_at_the_edge(tmp_path, capsys):
    """One case as a process of its own; the rest through the same entry point in this process (the same code,
    faster)."""
    from afm.teacher.distill import cli_distill
    r = afm("distill", "--tasks_per_suite", "0", "--out", str(tmp_path / "out"), timeout=120)
    assert (r.returncode != 0 and "tasks_per_suite" in r.stderr
            and len(r.stderr.strip().splitlines()) == 1), r.stderr[-500:]

    def run(*argv):
        try: code = cli_distill([*argv, "--out", str(tmp_path / "out")])
        except SystemExit as e: code = e.code
        return code, capsys.readouterr().err
    for args, words in [(["--tasks_per_suite", "-1"], "tasks_per_suite"), (["--workers", "-3"], "workers"),
                        (["--world_scale", "0"], "world_scale")]:
        code, err = run(*args)
        assert code != 0 and words in err and len(err.strip().splitlines()) == 1, (args, err[-500:])
    for text, words in [("[tiny]\ndistill_workers = two\n", "distill_workers = 'two' should be a whole number"),
                        ("[tiny]\ndistill_tasks_per_suite = 2OO\n", "distill_tasks_per_suite = '2OO' "
                                                                    "should be a whole number"),
                        ("[tiny]\nworld_scale = 1.O\n", "world_scale = '1.O' should be a number"),
                        ("[tiny]\ndistill_workers 2\n", "bad.ini"), ("[tiny]\nseed = 1\nseed = 2\n", "bad.ini")]:
        (tmp_path / "bad.ini").write_text(text)
        code, err = run("--settings", str(tmp_path / "bad.ini"))
        assert code != 0 and words in err and len(err.strip().splitlines()) == 1, (text, err[-500:])
    assert not (tmp_path / "out" / "sft.jsonl").exists()


def test_run_refuses_a_profile_key_that_nothing_reads_before_running_anything(tmp_path):
    settings, reports = tmp_path / "settings.ini", tmp_path / "reports"
    settings.write_text("[quick]\ndescription = test\nsft_learnig_rate = 0.001\n")
    r = afm("run", "--profile", "quick", "--settings", str(settings), "--reports", str(reports), "--chapters",
            "02b_crawl")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert ("unknown key 'sft_learnig_rate' (did you mean 'sft_learning_rate'?)" in r.stderr
            and str(settings) in r.stderr)
    assert not reports.exists()  # nothing ran


def test_every_profile_of_the_repository_is_read_whole():
    from afm.core.settings import load_profiles
    from afm.report.pipeline import check_profile
    for name, params in load_profiles(REPO / "settings.ini").items():
        check_profile(params, REPO / "nbs", f"settings.ini [{name}]")


@pytest.fixture(scope="module")
def broken_models(tmp_path_factory):
    "A tiny model folder broken each way a folder breaks, and rows for the commands that need data."
    from afm.format.coa import examples, render
    from afm.models.catalog import save_model, tiny_chat_model
    from afm.tools.prompts import system_prompt
    tmp = tmp_path_factory.mktemp("models")
    good = save_model(*tiny_chat_model(texts_limit=50), tmp / "good")
    def config(d, **change):
        (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()), **change}))
    breaks = {
        "truncated": lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-100]),
        "hidden-size": lambda d: config(d, hidden_size=128),
        "config-list": lambda d: (d / "config.json").write_text("[]"),
        "no-tokenizer": lambda d: (d / "tokenizer.json").unlink(),
        "no-weights": lambda d: (d / "model.safetensors").unlink()}
    for name, spoil in breaks.items():
        shutil.copytree(good, tmp / name)
        spoil(tmp / name)
    with (tmp / "rows.jsonl").open("w") as f:
        for _ in range(2):
            for traj in examples().values():
                f.write(json.dumps({"kind": "qa", "messages": [{"role": "system", "content": system_prompt("qa")},
                        {"role": "user", "content": traj.question},
                                                               {"role": "assistant", "content": render(traj)}]}) + "\n")
    (tmp / "settings.ini").write_text("[quick]\ndescription = test\n")
    return tmp, list(breaks)


def _one_line(r, folder, words):
    "The command failed with one line (after any progress bar) naming the folder and the problem, and no traceback."
    lines = [l for l in r.stderr.splitlines() if l.strip() and "it/s]" not in l]
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert str(folder) in lines[0] and words in lines[0], lines[0]


def test_every_command_that_loads_a_model_names_the_broken_folder_in_one_line(broken_models, tmp_path):
    tmp, breaks = broken_models
    words = {"truncated": "the weights cannot be read", "hidden-size": "config.json does not match the weights",
             "config-list": "config.json should hold a JSON object", "no-tokenizer": "no tokenizer",
             "no-weights": "no weights"}
    for name in breaks:  # every way a folder breaks, through one command
        _one_line(afm("serve", "model", "--model", str(tmp / name), "--port", "0", timeout=120), tmp / name,
                  words[name])
    data, quick = ["--data", str(tmp / "rows.jsonl")], ["--profile", "quick", "--settings", str(tmp / "settings.ini")]
    # every command, one way each
    for name, cmd in (("hidden-size", ["sft", *quick, *data, "--out", str(tmp_path / "sft")]),
                      ("truncated", ["bench", "rollout", "--tasks", "1"]),
                      ("config-list", ["bench", "sft", *data, "--rows", "2"])):
        _one_line(afm(*cmd, "--model", str(tmp / name), timeout=300), tmp / name, words[name])


def test_a_hub_that_never_answers_fails_load_within_its_timeout(tmp_path):
    """AFM_DOWNLOAD=1 against a hub that accepts the connection and never answers: one line naming the model and the
    limit."""
    import socket, time
    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        hub.listen(64)  # the kernel accepts connections for it; nobody ever answers
        env = {**os.environ, "OMP_NUM_THREADS": "1", "AFM_DOWNLOAD": "1", "HF_ENDPOINT": f"http://127.0.0.1:{hub.getsockname()[1]}",
               "HF_HUB_ETAG_TIMEOUT": "2", "HF_HOME": str(tmp_path / "hf")}
        t0 = time.monotonic()
        load_qwen = "from afm.models.catalog import load; load('Qwen/Qwen2.5-7B-Instruct')"
        r = subprocess.run([sys.executable, "-c", load_qwen],
                           capture_output=True, text=True, env=env, timeout=120)
        took = time.monotonic() - t0
    assert (r.returncode != 0
            and "TimeoutError: model Qwen/Qwen2.5-7B-Instruct: no answer from the hub" in r.stderr), r.stderr[-2000:]
    # 2 s for the model's page, 3 s for huggingface_hub's own first request
    assert "within 2 s" in r.stderr and took < 15, took


def test_download_fetches_a_model_from_a_hub_and_it_then_loads_offline(broken_models, tmp_path):
    """`AFM_DOWNLOAD=1` against a small hub of our own (the endpoints huggingface_hub asks: the model's page, each
    file's HEAD and GET): every file lands in the Hugging Face cache, and the model loads from there later without
    the hub."""
    import hashlib, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    folder, sha = broken_models[0] / "good", "0123456789abcdef" * 2 + "01234567"

    class Hub(BaseHTTPRequestHandler):
        def log_message(self, *args): pass
        def _file(self):
            prefix = f"/org/tiny/resolve/{sha}/"
            return folder / self.path[len(prefix):] if self.path.startswith(prefix) else None
        def _answer(self, body: bytes | None):
            self.send_response(200 if body is not None else 404)
            headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha256(body).hexdigest()}"',
                       "Content-Length": str(len(body))} if body is not None else {}
            for k, v in headers.items(): self.send_header(k, v)
            self.end_headers()
            return body
        def do_HEAD(self): self._answer(f.read_bytes() if (f := self._file()) and f.is_file() else None)
        def do_GET(self):
            if self.path.startswith("/api/models/org/tiny"):
                body = json.dumps({"id": "org/tiny", "sha": sha,
                                   "siblings": [{"rfilename": p.name} for p in folder.iterdir()]}).encode()
            else: body = f.read_bytes() if (f := self._file()) and f.is_file() else None
            if (body := self._answer(body)) is not None: self.wfile.write(body)

    code = "from afm.models.catalog import load; m, t = load('org/tiny'); print(m.config.hidden_size, len(t))"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf")}
    with ThreadingHTTPServer(("127.0.0.1", 0), Hub) as hub:
        threading.Thread(target=hub.serve_forever, daemon=True).start()
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**env, "AFM_DOWNLOAD": "1", "HF_ENDPOINT": f"http://127.0.0.1:{hub.server_port}"})
        hub.shutdown()
    assert r.returncode == 0 and r.stdout.split() == ["64", "1000"], r.stderr[-2000:]
    snapshot = tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / sha
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(p.name for p in folder.iterdir())
    # no hub now
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0 and again.stdout.split() == ["64", "1000"], again.stderr[-2000:]

"""`afm eval` as a user runs it: killed mid-run and rerun, it ends with the records an uninterrupted run makes; bad
input is one line."""
import importlib.util
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import AFM, ENV, REPO



QUESTIONS, SAMPLES = 10, 4  # 40 pairs: the first writer is paused while a second one tries the file, then killed


def eval_args(folder, out, *extra):
    return ["eval", "--model", str(folder), "--suite", "world-atomic", "--split", "val", "--per-suite", str(QUESTIONS),
            "--k", "2", "--samples", str(SAMPLES), "--max-new-tokens", "40", "--batch", "1", "--system",
            "Search, then answer.", "--out", str(out), *extra]


def afm(*args, timeout=600, env=ENV):
    return subprocess.run([AFM, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def pairs(path):
    return [(r["task_id"], r["sample"]) for r in map(json.loads, Path(path).read_text().splitlines())]


def test_killed_run_resumes_to_the_uninterrupted_records(tool_caller_folder, tmp_path):
    killed, whole = tmp_path / "killed.jsonl", tmp_path / "whole.jsonl"
    proc = subprocess.Popen([AFM, *eval_args(tool_caller_folder, killed)], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    lock = killed.with_name("killed.jsonl.lock")  # the first writer's, naming it, once it holds the file
    while time.time() < deadline and proc.poll() is None and not (lock.is_file() and lock.read_text()):
        time.sleep(0.01)
    proc.send_signal(signal.SIGSTOP)  # the first writer holds the file, paused: a second one finds it busy
    second = afm(*eval_args(tool_caller_folder, killed))
    proc.send_signal(signal.SIGCONT)
    said = second.stderr[-1000:]
    assert second.returncode == 1 and f"is being written by process {proc.pid} on " in second.stderr, said
    assert second.stderr.strip().splitlines()[-1].startswith("afm eval: RecordsBusy: ") and proc.poll() is None
    while time.time() < deadline and proc.poll() is None:
        if killed.is_file() and len(killed.read_bytes().splitlines()) >= 4: break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed: give it more work"
    written = len(killed.read_text().splitlines())
    assert 4 <= written < QUESTIONS * SAMPLES, written
    with open(killed, "a") as f: f.write('{"task_id": "world-atomic/')  # a write the kill cut short
    r = afm(*eval_args(tool_caller_folder, killed))  # the killed writer's lock went with it
    assert r.returncode == 0, r.stderr[-2000:]
    assert (f"| world-atomic | {QUESTIONS} | {QUESTIONS * SAMPLES} |" in r.stdout
            and f"{QUESTIONS * SAMPLES} records in" in r.stdout)
    r = afm(*eval_args(tool_caller_folder, whole))
    assert r.returncode == 0, r.stderr[-2000:]
    got, want = pairs(killed), pairs(whole)
    assert len(got) == len(set(got)) == QUESTIONS * SAMPLES and set(got) == set(want)  # nothing lost, nothing repeated
    # not seconds, which differ run to run
    same = ("answer", "reward", "end", "format_failure", "tool_calls", "sampled_tokens")
    strip = lambda p: {(r["task_id"], r["sample"]): ([r[k] for k in same], r["trajectory"]["steps"])
                       for r in map(json.loads, Path(p).read_text().splitlines())}
    a, b = strip(killed), strip(whole)
    # a sample's seeds come from its task and number: the same episodes
    assert sum(a[p] == b[p] for p in a) >= 0.9 * len(a)
    # a rerun reads everything back; a damaged line in the middle is an error naming file:line; another key is refused
    r = afm(*eval_args(tool_caller_folder, whole))
    assert r.returncode == 0 and len(pairs(whole)) == QUESTIONS * SAMPLES
    lines = whole.read_text().splitlines(keepends=True)
    whole.write_text("".join(lines[:2] + ["{oops\n"] + lines[3:]))
    r = afm(*eval_args(tool_caller_folder, whole))
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith("afm eval: ValueError: ") \
        and f"{whole}:3: a damaged record" in r.stderr, r.stderr[-1000:]
    r = afm(*eval_args(tool_caller_folder, killed)[:-2], "--max-new-tokens", "41", "--out", str(killed))
    says = "made otherwise (rollout.max_new_tokens: 40 there, 41 here)"  # the identity's one difference, named
    assert r.returncode == 1 and says in r.stderr, r.stderr[-1000:]


def read(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def untimed(recs):
    "Records by (task, sample) without their wall times: all that two runs of the same episodes share."
    def one(r):
        t = r["trajectory"] and {**r["trajectory"], "accounting": {**r["trajectory"]["accounting"], "seconds": None}}
        return {**{k: v for k, v in r.items() if k != "seconds"}, "trajectory": t}
    return {(r["task_id"], r["sample"]): one(r) for r in recs}


@pytest.fixture(scope="module")
def served_tiny():
    """The tool-calling tiny model over real HTTP on localhost, one request at a time (so an episode is the same however
    the requests interleave): its URL, tokenizer and context."""
    from afm.models.engine import TransformersEngine
    from afm.models.backends import EngineBackend
    from afm.models.fit import tool_calling_tiny
    from afm.tools.llm import serve_in_thread
    from afm.models.batching import BatchingEngine
    from afm.models.server import serve_chat
    model, tok = tool_calling_tiny()
    engine = TransformersEngine(model, tok, max_batch=1)
    server, url = serve_in_thread(serve_chat(EngineBackend(BatchingEngine(engine))))
    yield url, tok, engine.context
    server.should_exit = True


def stub(backend: str, answer):
    "A real HTTP server on localhost before `backend`: completion request n gets `answer(n)`, or `backend`'s answer."
    import httpx
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from afm.tools.llm import serve_in_thread
    app, seen = FastAPI(), []

    @app.get("/v1/models")
    def models(): return httpx.get(f"{backend}/v1/models").json()

    @app.post("/v1/completions")
    def completions(body: dict):
        seen.append(body)
        if (mine := answer(len(seen))) is not None: return mine
        theirs = httpx.post(f"{backend}/v1/completions", json=body, timeout=120)
        return JSONResponse(theirs.json(), theirs.status_code)
    return serve_in_thread(app)


def failure(kind):
    from fastapi.responses import HTMLResponse, JSONResponse
    if kind == "500": return JSONResponse({"error": {"message": "stub: the GPU node is down"}}, 500)
    if kind == "html": return HTMLResponse("<html><body>502 Bad Gateway</body></html>")  # a proxy's page, status 200
    return JSONResponse({"choices": [{"text": 7, "finish_reason": "stop"}]})  # a text that is no string


@pytest.mark.parametrize("kind, says", [("500", "HTTP 500: stub: the GPU node is down"), ("html", "not a completion"),
                                        ("text", "text is not a string")])
def test_a_failing_endpoint_leaves_its_pairs_to_the_rerun(served_tiny, tmp_path, kind, says):
    """`records` through an endpoint that fails after three requests (HTTP 500, a page of HTML, a text that is no
    string): the episodes it failed are not written, `MissingRecords` says how many and why once the others are
    saved, and the rerun against the mended endpoint ends with exactly the records of an uninterrupted run."""
    from afm.rollout.evaluate import MissingRecords, eval_identity, read_records, records, suite_tasks
    from afm.models.fit import TINY_SYSTEM
    from afm.rollout.loop import rollout_config
    from afm.models.remote import OpenAIEngine
    from afm.tasks.world import tool_sizes, world_toolbox
    url, tok, context = served_tiny
    tasks, box = suite_tasks(3, "val", ["world-atomic"]), world_toolbox(tool_sizes("tiny"))
    cfg = rollout_config("tiny", temperature=1.0, top_p=1.0, seed=0, system=TINY_SYSTEM, max_new_tokens=60,
                         max_tokens_per_turn=40)
    key = eval_identity({"model": "tiny", "weights": None}, tasks, cfg, 2)
    broken = [True]
    server, stub_url = stub(url, lambda n: failure(kind) if broken[0] and n > 3 else None)
    engine = lambda: OpenAIEngine(stub_url, "tiny", tok, context=context, backoff_s=0.01)
    try:
        with pytest.raises(MissingRecords) as e: records(tmp_path / "r.jsonl", engine, tasks, box, cfg, 2, key, batch=2)
        saved = read_records(tmp_path / "r.jsonl")
        assert 0 < len(saved) < 6 and e.value.missing == 6 - len(saved)
        assert all(r["end"] != "engine_error" for r in saved)
        assert f"of 6 pairs are missing: the engine failed on them ({stub_url}: " in str(e.value)
        assert says in str(e.value)
        broken[0] = False
        resumed = records(tmp_path / "r.jsonl", engine, tasks, box, cfg, 2, key, batch=2)
        whole = records(tmp_path / "whole.jsonl", engine, tasks, box, cfg, 2, key, batch=2)
    finally:
        server.should_exit = True
    assert untimed(read_records(tmp_path / "r.jsonl")) == untimed(resumed) == untimed(whole) and len(whole) == 6


def serve_model(folder, port: int = 0):
    "`afm serve model` of `folder` on `port`, one request at a time: the process and the URL it prints."
    proc = subprocess.Popen([AFM, "serve", "model", "--model", str(folder), "--port", str(port), "--max-batch", "1"],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("serving "), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, line.split(" at ")[1].strip()


def test_a_server_killed_mid_run_leaves_its_pairs_to_the_rerun(tool_caller_folder, tmp_path):
    """`afm eval --endpoint` while its `afm serve model` is killed: exit 1 naming how many pairs are missing, none
    of them written; the server restarted on its port at once, the same command ends with the uninterrupted records."""
    server, url = serve_model(tool_caller_folder)
    args = lambda out: ["eval", "--model", str(tool_caller_folder), "--endpoint", url, "--suite", "world-atomic",
                        "--split", "val", "--per-suite", "5", "--samples", "2", "--max-new-tokens", "40",
                        "--batch", "2", "--system", "Search, then answer.", "--out", str(out)]
    cut, whole = tmp_path / "cut.jsonl", tmp_path / "whole.jsonl"
    run = subprocess.Popen([AFM, *args(cut)], cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and run.poll() is None and not (cut.is_file() and len(read(cut)) >= 2):
            time.sleep(0.01)
    finally:
        server.kill()
        server.wait()
    _, err = run.communicate(timeout=300)
    assert run.returncode == 1, ("the run ended before its server was killed: give it more work", err[-1000:])
    last, saved = err.strip().splitlines()[-1], read(cut)
    assert last.startswith("afm eval: MissingRecords: ") and f"{10 - len(saved)} of 10 pairs are missing" in last, last
    assert 2 <= len(saved) < 10 and all(r["end"] != "engine_error" for r in saved)
    server, again = serve_model(tool_caller_folder, int(url.rsplit(":", 1)[1].split("/")[0]))  # its port, at once
    try:
        assert again == url
        r = afm(*args(cut))
        assert r.returncode == 0 and "10 records in" in r.stdout, r.stderr[-2000:]
        r = afm(*args(whole), env={k: v for k, v in ENV.items() if k != "TQDM_DISABLE"})
        assert r.returncode == 0 and "10/10" in r.stderr, r.stderr[-2000:]  # its progress bar
    finally:
        server.kill()
        server.wait()
    assert untimed(read(cut)) == untimed(read(whole))


@pytest.mark.parametrize("extra, says", [
    (["--suite", "nope"], "unknown benchmark 'nope'"),
    (["--k", "4", "--samples", "2"], "pass@4 needs at least 4 samples per question; --samples is 2"),
    (["--split", "sft"], "--split must be val or test, got 'sft'"),
    (["--endpoint", "http://127.0.0.1:9"], "the endpoint http://127.0.0.1:9 does not answer"),
])
def test_bad_input_is_one_line(tool_caller_folder, tmp_path, extra, says):
    r = afm("eval", "--model", str(tool_caller_folder), "--suite", "world-atomic", "--per-suite", "2", "--out",
            str(tmp_path / "r.jsonl"), *extra)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and last.startswith("afm eval: ") and says in last, r.stderr[-1000:]
    assert not (tmp_path / "r.jsonl").exists()


def test_unknown_model_is_one_line(tmp_path):
    r = afm("eval", "--model", str(tmp_path / "no-model"), "--suite", "world-atomic", "--per-suite", "2", "--out",
            str(tmp_path / "r.jsonl"))
    assert (r.returncode == 1 and "model folder" in r.stderr
            and "does not exist" in r.stderr.strip().splitlines()[-1]), r.stderr[-1000:]


def test_eval_over_a_served_model(tool_caller_folder, tmp_path):
    """`afm serve model` in one process, `afm eval --endpoint` (the URL as the server prints it) in another: the same
    records as in process."""
    server = subprocess.Popen([AFM, "serve", "model", "--model", str(tool_caller_folder), "--port", "0"], cwd=REPO,
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("serving "), line
        url = line.split(" at ")[1].strip()
        args = ["--model", str(tool_caller_folder), "--suite", "world-atomic", "--split", "val", "--per-suite", "3",
                "--max-new-tokens", "40", "--system", "Search, then answer."]
        r = afm("eval", *args, "--endpoint", url, "--out", str(tmp_path / "served.jsonl"))
        assert r.returncode == 0, r.stderr[-2000:]
    finally:
        server.kill()
        server.wait()
    assert "| world-atomic | 3 | 3 |" in r.stdout
    r = afm("eval", *args, "--out", str(tmp_path / "local.jsonl"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert pairs(tmp_path / "served.jsonl") == pairs(tmp_path / "local.jsonl")
    key = json.loads((tmp_path / "served.identity.json").read_text())
    assert key["model"] == f"{tool_caller_folder}@{url}" and key["weights"] is None


VLLM = importlib.util.find_spec("vllm") is not None
NO_JUDGE = {k: v for k, v in ENV.items() if k not in ("AFM_JUDGE_BASE_URL", "SERPER_API_KEY")}


@pytest.mark.parametrize("extra, says", [
    (["--suite", "fanoutqa"], "is a web task, graded by the LLM judge, and no judge is configured: "
                              "set AFM_JUDGE_BASE_URL"),
    (["--engine", "sglang"], "engine 'sglang' is not one of hf, vllm"),
    (["--dtype", "fp8"], "dtype 'fp8' is not one of auto, float32, bfloat16, float16"),
    (["--device", "cuda:9"], "device 'cuda:9'"),
    (["--prompt-layout", "released"], "invalid choice: 'released'"),
    (["--online"], "online: web_search asks Serper, and SERPER_API_KEY is not set"),
    (["--corpus", "/nonexistent/docs.jsonl"], "corpus /nonexistent/docs.jsonl: no such file"),
    pytest.param(["--engine", "vllm"], 'engine vllm: vLLM is not installed here; install the gpu extra on a machine '
                 'with an NVIDIA GPU: pip install -e ".[gpu]"',
                 marks=pytest.mark.skipif(VLLM, reason="vLLM is installed here")),
])
def test_engine_judge_and_layout_options_are_checked_first(tool_caller_folder, tmp_path, extra, says):
    """Each refused in one line before the model loads or anything is generated (a web suite: before its first
    episode, no judge)."""
    t0 = time.monotonic()
    r = subprocess.run([AFM, "eval", "--model", str(tool_caller_folder), "--suite", "world-atomic", "--per-suite", "2",
                        "--out", str(tmp_path / "r.jsonl"), *extra], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env=NO_JUDGE)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode in (1, 2) and says in last, r.stderr[-1000:]
    assert not (tmp_path / "r.jsonl").exists() and time.monotonic() - t0 < 120


@pytest.mark.skipif(VLLM, reason="vLLM is installed here: the profile's engine would be built")
def test_the_profile_engine_key_is_honoured(tmp_path):
    """paper-web-7b names engine = vllm: without vLLM, `afm eval --profile paper-web-7b` says so in one line, before
    its 15 GB model is looked for."""
    r = afm("eval", "--profile", "paper-web-7b", "--suite", "world-atomic", "--out", str(tmp_path / "r.jsonl"))
    assert r.returncode == 1 and r.stderr.strip().splitlines() == ['afm eval: ValueError: engine vllm: vLLM is not '
                                                                  'installed here; install the gpu extra on a machine '
                                                                  'with an NVIDIA GPU: '
                                                                  'pip install -e ".[gpu]"'], r.stderr
    r = afm("eval", "--profile", "paper-web-7b", "--engine", "hf", "--device", "cpu", "--suite", "world-atomic",
            "--out", str(tmp_path / "r.jsonl"), timeout=120)
    if "not on this machine" not in r.stderr: pytest.skip("Qwen2.5-7B-Instruct is cached here")
    assert (r.returncode == 1
            and "model Qwen/Qwen2.5-7B-Instruct is not on this machine" in r.stderr.strip().splitlines()[-1])


def test_dtype_and_released_layout_reach_the_records(tool_caller_folder, tmp_path):
    """`--dtype bfloat16 --device cpu --prompt-layout user`: the records' key says how they were made, so fp32
    records are not mixed in."""
    out = tmp_path / "user.jsonl"
    r = afm("eval", "--model", str(tool_caller_folder), "--suite", "world-atomic", "--split", "val", "--per-suite", "2",
            "--max-new-tokens", "16", "--device", "cpu", "--dtype", "bfloat16", "--prompt-layout", "user",
            "--system", "Search, then answer.", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    key = json.loads(out.with_suffix(".identity.json").read_text())
    assert (key["engine"] == {"engine": "hf", "device": "cpu", "dtype": "bfloat16"}
            and key["rollout"]["prompt_layout"] == "user")
    assert key["rollout"]["temperature"] == 0.0  # one sample on tiny: greedy (eval_config)
    r = afm("eval", "--model", str(tool_caller_folder), "--suite", "world-atomic", "--split", "val", "--per-suite", "2",
            "--max-new-tokens", "16", "--device", "cpu", "--prompt-layout", "user", "--system", "Search, then answer.",
            "--out", str(out))
    says = 'made otherwise (engine.dtype: "bfloat16" there, "float32" here)'  # the identity's one difference, named
    assert r.returncode == 1 and says in r.stderr, r.stderr[-1000:]


def test_a_corpus_of_your_own_is_the_tools(tool_caller_folder, tmp_path):
    """`--corpus`: the tools of `afm distill` over your documents (and the world's pages, for a generated suite),
    named in the records' key."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"url": "https://example.org/lumo", "title": "Lumo",
                                "text": "Lumo was founded in 1999 in Destolmir."}) + "\n")
    out = tmp_path / "corpus.jsonl"
    r = afm("eval", "--model", str(tool_caller_folder), "--suite", "world-atomic", "--split", "val", "--per-suite", "2",
            "--max-new-tokens", "40", "--system", "Search, then answer.", "--corpus", str(docs), "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    key = json.loads(out.with_suffix(".identity.json").read_text())
    assert key["toolbox"]["corpus"] == str(docs) and not key["toolbox"]["online"] and len(pairs(out)) == 2

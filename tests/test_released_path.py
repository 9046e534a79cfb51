"""The documented path for a released checkpoint, on CPU: a real `afm serve model` stands in for `vllm serve
<checkpoint>` and a second one for the judge's endpoint; `afm eval --endpoint ... --judge-url ... --profile
paper-eval-afm-web-32b` runs against them. What the servers receive is recorded by a pass-through proxy in front of
each, so the test sees the requests as a server sees them: the profile's decoding and token ids, and the paper's
judge prompt."""
import dataclasses
import json
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from conftest import AFM, ENV, REPO

PROFILE = "paper-eval-afm-web-32b"


@pytest.fixture(scope="module")
def judge_folder(tool_caller_folder, tmp_path_factory):
    "The same weights with room for the judge's prompt and its two retries (RoPE positions: only the context grows)."
    import shutil
    folder = shutil.copytree(tool_caller_folder, tmp_path_factory.mktemp("judge") / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    return folder


def serve(folder):
    "`afm serve model` on a free port: the process and its URL as it prints it (with /v1)."
    proc = subprocess.Popen([AFM, "serve", "model", "--model", str(folder), "--port", "0"], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    assert line.startswith("serving "), line
    return proc, line.split(" at ")[1].strip()


def recording_proxy(target: str):
    """A pass-through HTTP proxy to `target` (a server's root) that keeps each request's path and JSON
    body: `(server, url, seen)`."""
    seen = []

    class Forward(BaseHTTPRequestHandler):
        def _forward(self, method):
            body = self.rfile.read(int(self.headers.get("content-length") or 0)) or None
            if body: seen.append((self.path, json.loads(body)))
            r = httpx.request(method, target + self.path, content=body, headers={"content-type": "application/json"},
                              timeout=300)
            self.send_response(r.status_code)
            self.send_header("content-type", r.headers.get("content-type", "application/json"))
            self.send_header("content-length", str(len(r.content)))
            self.end_headers()
            self.wfile.write(r.content)
        def do_GET(self): self._forward("GET")
        def do_POST(self): self._forward("POST")
        def log_message(self, *args): pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}", seen


def web_copy(**kwargs):
    """world-atomic's questions as web tasks (graded by the judge), which the tiny model was fitted to search and
    answer; their ids, and so their episodes' seeds, are world-atomic's. A released benchmark belongs to no generated
    world, so neither do they: the profile's tools (its own world, and Wikipedia) serve them."""
    from afm.tasks.task import load_benchmark
    return [dataclasses.replace(t, kind="web", source="released-web", meta={
        k: v for k, v in t.meta.items() if k != "world"}) for t in load_benchmark("world-atomic", **kwargs)]


def test_released_profile_decoding_token_ids_and_the_judge_prompt(tool_caller_folder, judge_folder, tmp_path,
                                                                  monkeypatch, capsys):
    from afm.core.settings import load_profile
    from afm.rollout.evaluate import eval_config
    from afm.rollout.eval_command import cli_eval
    from afm.tasks.grading import JUDGE_PROMPT, JUDGE_RETRY, JUDGE_SYSTEM, answer_text, judge_gold
    from afm.models.catalog import load_tokenizer
    from afm.tasks.task import register_benchmark
    cfg = eval_config(load_profile(PROFILE))
    # the paper's web inference
    assert (cfg.temperature, cfg.top_p, cfg.max_turns, cfg.prompt_layout) == (1.0, 0.9, 36, "user")
    register_benchmark("released-web", web_copy)
    for k in ("AFM_JUDGE_BASE_URL", "AFM_JUDGE_MODEL", "AFM_JUDGE_API_KEY", "AFM_JUDGE_CACHE"):
        monkeypatch.delenv(k, raising=False)
    t0 = time.monotonic()
    (policy, policy_url), (judge, judge_url) = serve(tool_caller_folder), serve(judge_folder)
    proxies = []
    try:
        proxies = [recording_proxy(u.removesuffix("/v1")) for u in (policy_url, judge_url)]
        (_, p_url, p_seen), (_, j_url, j_seen) = proxies
        out = tmp_path / "released.jsonl"
        code = cli_eval(["--profile", PROFILE, "--model", str(tool_caller_folder), "--endpoint", f"{p_url}/v1",
                         "--judge-url", f"{j_url}/v1", "--judge-model", "tiny-judge", "--suite", "released-web",
                         "--split", "val", "--per-suite", "4", "--samples", "2", "--max-new-tokens", "64",
                         "--system", "Search, then answer.", "--out", str(out)])
        said = capsys.readouterr()
        assert code == 0, said.err[-2000:]
    finally:
        for server, _, _ in proxies: server.shutdown()
        for proc in (policy, judge):
            proc.kill()
            proc.wait()
    # the policy's server got token ids in and asked for token ids back, at the profile's decoding, under the name it
    # serves
    completions = [b for path, b in p_seen if path == "/v1/completions"]
    assert completions and all(b["temperature"] == 1.0 and b["top_p"] == 0.9
                               and b["return_token_ids"] is True for b in completions)
    assert all(isinstance(b["prompt"], list) and all(isinstance(i, int) for i in b["prompt"]) for b in completions)
    assert all(1 <= b["max_tokens"] <= 4096 and "</answer>" in b["stop"] for b in completions)
    assert len({b["model"] for b in completions}) == 1 and not [p for p, _ in p_seen if p == "/v1/chat/completions"]
    tok = load_tokenizer(str(tool_caller_folder))
    first = tok.decode(completions[0]["prompt"])
    # the user-turn layout
    assert "Search, then answer.\n\n" in first and "system" not in first.split("Search, then answer.")[0].lower()
    # the records: every pair, graded; the key says how they were made
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    key = json.loads(out.with_suffix(".identity.json").read_text())
    assert len(recs) == 8 and all(isinstance(r["reward"], float) and 0.0 <= r["reward"] <= 1.0 for r in recs)
    assert key["rollout"]["temperature"] == 1.0 and key["rollout"]["top_p"] == 0.9 and key["rollout"]["max_turns"] == 36
    assert (key["rollout"]["prompt_layout"] == "user" and key["judge"] == "tiny-judge"
            and key["model"] == f"{tool_caller_folder}@{p_url}/v1")
    assert len(completions) <= 36 * len(recs)
    # the judge: asked in the paper's prompt, filled with the question, the gold answer and the prediction; the tiny
    # model's replies hold no verdict, so after two more asks each answer scores 0, strictly, and the record says why
    judged = [r for r in recs if r["kind"] == "web" and r["answer"] is not None]
    assert judged, "no web episode answered: nothing reached the judge"
    asks = [b for path, b in j_seen if path == "/v1/chat/completions"]
    assert len(asks) == 3 * len(judged) and all(b["model"] == "tiny-judge" and b["temperature"] == 0.0 for b in asks)
    tasks = {t.id: t for t in web_copy(split="val")}
    firsts = [b["messages"] for b in asks if len(b["messages"]) == 2]
    for r in judged:
        t = tasks[r["task_id"]]
        want = JUDGE_PROMPT.format(question=t.question, gold=judge_gold(t), prediction=answer_text(r["answer"]))
        assert [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": want}] in firsts
        assert r["reward"] == 0.0 and "gave no verdict in 3 replies" in r["judge_error"]
    assert all(b["messages"][-1] == {"role": "user", "content": JUDGE_RETRY} for b in asks if len(b["messages"]) > 2)
    assert f"{len(judged)} answers got no verdict from the judge and score 0" in said.out
    assert time.monotonic() - t0 < 120


@pytest.mark.parametrize("suite, flags, says", [
    ("world-atomic", ["--endpoint", "http://127.0.0.1:9/v1"], "the endpoint http://127.0.0.1:9/v1 does not answer"),
    ("fanoutqa", ["--endpoint", "http://127.0.0.1:9/v1", "--judge-url", "http://127.0.0.1:9/v1"],
     "the judge endpoint http://127.0.0.1:9/v1 does not answer"),
    ("fanoutqa",
     ["--endpoint", "http://127.0.0.1:9/v1", "--judge-model", "judge"], "--judge-model names the model of --judge-url"),
    ("world-atomic", ["--served-model", "x"], "--served-model names the model an --endpoint serves"),
])
def test_a_down_endpoint_or_judge_is_one_line(tool_caller_folder, tmp_path, suite, flags, says):
    """With the released profile, a server or judge that does not answer is one line naming it, before anything is
    generated."""
    env = {k: v for k, v in ENV.items() if not k.startswith("AFM_JUDGE_")}
    t0 = time.monotonic()
    r = subprocess.run([AFM, "eval", "--profile", PROFILE, "--model", str(tool_caller_folder), "--suite", suite,
                        "--per-suite", "2", "--out", str(tmp_path / "r.jsonl"), *flags], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert (r.returncode == 1 and len(lines) == 1 and lines[0].startswith("afm eval: ")
            and says in lines[0]), r.stderr[-1000:]
    assert "Traceback" not in r.stderr and not (tmp_path / "r.jsonl").exists() and time.monotonic() - t0 < 60


def search_r1_tiny(folder: Path, steps: int = 300):
    """The small `tiny` fitted for a few seconds on episodes in the Search-R1 protocol (its prompt alone in the user
    turn, a `<search>` call, the `<information>` block the environment writes, then `<answer>`), saved in `folder`: a
    model that speaks the protocol, as the released checkpoints do, for the environment's side to be tested against."""
    from afm.models.fit import fit_ids, one_search_examples
    from afm.models.catalog import chat_prompt_ids, save_model, tiny_chat_model
    from afm.rollout.loop import DIALECTS
    from afm.tasks.world import tool_sizes, world_toolbox
    d, box = DIALECTS["search-r1"], world_toolbox(tool_sizes("tiny"))
    model, tok = tiny_chat_model(0)
    rows = []
    for task, traj in one_search_examples(40):
        query = next(s.text for s in traj.steps if s.role == "web_search")
        info = d.observation_text(box.session(task.question).call("wiki_search", query).observation, d.tags)
        head = tok(f"<think> I need to search. </think>\n<search> {query} </search>",
                   add_special_tokens=False)["input_ids"]
        forced = tok(info, add_special_tokens=False)["input_ids"]
        tail = tok(f"<think> It says so. </think>\n<answer> {traj.answer} </answer>",
                   add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        prompt = chat_prompt_ids(tok, d.messages(task))
        rows.append((prompt + head + forced + tail, [-100] * len(prompt) + head + [-100] * len(forced) + tail))
    fit_ids(model, tok, rows, steps=steps, lr=5e-3, batch=2)
    save_model(model, tok, folder)
    return folder


def test_a_search_r1_checkpoint_is_asked_and_answered_in_its_own_protocol(tmp_path, monkeypatch):
    """`afm eval --profile paper-eval-searchr1-7b --endpoint`: the served model gets the checkpoints' prompt alone in
    the user turn, stops at `</search>`, and each search comes back to it as the retriever's passages in an
    `<information>` block."""
    from afm.rollout.eval_command import cli_eval
    from afm.models.catalog import chat_prompt_ids, decode, load_tokenizer
    from afm.rollout.loop import SEARCH_R1_PROMPT
    from afm.tasks.task import load_benchmark
    from afm.tasks.world import profile_world
    folder = search_r1_tiny(tmp_path / "model")
    # the profile over the world the tiny model was fitted in (the paper profiles' generated world is twice as large)
    settings = tmp_path / "settings.ini"
    settings.write_text((REPO / "settings.ini").read_text() + "\n[searchr1-tiny-world]\nextends = "
                        "paper-eval-searchr1-7b\nworld_scale = 1.0\n")
    monkeypatch.setenv("AFM_SETTINGS", str(settings))
    policy, url = serve(folder)
    proxy = None
    try:
        proxy = recording_proxy(url.removesuffix("/v1"))
        _, p_url, seen = proxy
        out = tmp_path / "searchr1.jsonl"
        code = cli_eval(["--profile", "searchr1-tiny-world", "--model", str(folder), "--endpoint", f"{p_url}/v1",
                         "--suite", "world-atomic", "--split", "val", "--per-suite", "6", "--max-new-tokens", "160",
                         "--out", str(out)])
        assert code == 0
    finally:
        if proxy: proxy[0].shutdown()
        policy.kill()
        policy.wait()
    tok = load_tokenizer(str(folder))
    completions = [b for path, b in seen if path == "/v1/completions"]
    assert completions and all({"</search>", "</answer>"} <= set(b["stop"]) for b in completions)
    scale, seed = profile_world("searchr1-tiny-world")  # the profile's world: its tasks and its tools
    tasks = load_benchmark("world-atomic", split="val", sizes={"val": 6}, scale=scale, seed=seed)
    asked = [chat_prompt_ids(tok, [{"role": "user", "content": SEARCH_R1_PROMPT.format(question=t.question)}])
             for t in tasks]
    firsts = [b["prompt"] for b in completions if b["prompt"] in asked]
    # each episode began with the checkpoints' prompt alone in the user turn, as token ids
    assert len(firsts) == len(tasks)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    key = json.loads(out.with_suffix(".identity.json").read_text())
    assert len(recs) == 6 and key["rollout"]["dialect"] == "search-r1" and all(isinstance(r["reward"], float)
                                                                               for r in recs)
    searched = [r for r in recs if r["tool_calls"]]
    assert searched, "no episode searched: the fitted model did not speak the protocol"
    # every search gets the retriever's passages as Search-R1 formats them, or its word for none (a query the fitted
    # model garbled finds nothing); some find passages
    seen = [s["observation"] for r in searched for s in r["trajectory"]["steps"] if s["role"] == "search"]
    assert all(o.startswith("Doc 1(Title: ") or o == "No documents found." for o in seen), seen
    assert any(o.startswith("Doc 1(Title: ") for o in seen), seen
    later = [decode(tok, b["prompt"]) for b in completions if b["prompt"] not in asked]  # the turns after a search
    # (the tiny tokenizer puts a space before a run of text; a released checkpoint's tokenizer does not)
    block = r"</search> ?\n\n<information>(Doc 1\(Title: |No documents found\.</information>)"
    assert later and all(re.search(block, p) and p.endswith("</information>\n\n") for p in later), later
    assert any("<information>Doc 1(Title: " in p for p in later)

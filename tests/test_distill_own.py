"""`afm distill` on your own tasks, documents and teacher, as a user runs it: tasks and documents written as JSONL, the
documents served by `afm serve search`, a tiny model of this repo served by `afm serve model` as the LLM teacher, the
offline teacher on the same tasks, and bad input refused in one line before any work starts."""
import json
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from afm.teacher.distill import cli_distill, read_runs
from afm.tools.search import Document, write_jsonl_documents
from afm.tasks.task import Task, write_jsonl
from conftest import AFM, ENV

FACTS = [("Harbourline Press", "a publishing house in Varrow", "founded", "1871"),
         ("Quellmark Observatory", "an observatory on Mount Tessel", "founded", "1902"),
         ("Orrin Vale", "a painter of river landscapes", "birth_year", "1838"),
         ("Lantern Brewing Works", "a brewery in Calder", "founded", "1794")]
HABITS = '{"p_shortcut": 0.0, "p_vague_query": 0.0, "p_repeat_query": 0.0, "p_misread": 0.0}'


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    "A folder with docs.jsonl (four documents of ours), tasks.jsonl (a question about each) and a profile of our own."
    d = tmp_path_factory.mktemp("own")
    docs = [Document(f"https://docs.example.org/{n.lower().replace(' ', '-')}", n,
                     f"{n} is {about}. {'It was founded' if what == 'founded' else 'Vale was born'} in {year}. Its "
                     "records are kept in the city archive.")
            for n, about, what, year in FACTS]
    write_jsonl_documents(docs, d / "docs.jsonl")
    write_jsonl([Task(f"mine/{i}", f"In what year was {n} {'founded' if what == 'founded' else 'born'}?", [year], "qa",
                      "mine", split="sft", gold_path=[{"op": "search", "query": n, "url": doc.url},
                                                      {"op": "read", "url": doc.url, "title": n, "what": what,
                                                       "value": year}, {"op": "answer", "value": year}])
                 for i, ((n, _, what, year), doc) in enumerate(zip(FACTS, docs))], d / "tasks.jsonl")
    (d / "settings.ini").write_text(f"[own]\ndescription = test\ndistill_workers = 2\ndistill_teacher = {HABITS}\n"
                                    "distill_filter = {\"min_interactions\": 3}\n")
    return d


class Server:
    "A server command as a process of its own; every line it prints is kept, and `url` is read off its ready line."

    def __init__(self, cmd: list[str], ready: str, timeout_s: float = 180):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if found := next((m for line in list(self.lines) if (m := re.search(ready, line))), None):
                self.url = found[1]
                return
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"{' '.join(cmd[:3])} did not start: {''.join(self.lines)[-2000:]}")

    def _read(self):
        for line in self.proc.stdout: self.lines.append(line)

    def count(self, text: str) -> int: return sum(text in line for line in list(self.lines))

    def stop(self):
        self.proc.terminate()
        try: self.proc.wait(10)
        except subprocess.TimeoutExpired: self.proc.kill()


@pytest.fixture(scope="module")
def search(own):
    "`afm serve search` over our documents alone, logging every request."
    s = Server([AFM, "serve", "search", "--corpus", str(own / "docs.jsonl"), "--no-wiki", "--port", "0",
                "--log-level", "info"],
               r"serving 4 documents on (http://\S+)/retrieve")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    "A tiny model built here (untrained: it writes noise) served by `afm serve model`."
    from afm.models.catalog import TinyConfig, build_tiny, tiny_texts
    folder = build_tiny(TinyConfig(vocab_size=600, hidden_size=32, layers=1, heads=2, kv_heads=1, context=2048),
                        tiny_texts(limit=100), tmp_path_factory.mktemp("teacher") / "tiny")
    s = Server([AFM, "serve", "model", "--model", str(folder), "--port", "0"], r" at (http://\S+)/v1")
    yield s
    s.stop()


def distill(own, out, *args, timeout=600):
    return subprocess.run([AFM, "distill", "--profile", "own", "--settings", str(own / "settings.ini"), "--tasks",
                           str(own / "tasks.jsonl"), "--out", str(out), *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout)


def consistent(out: Path) -> dict:
    "The run's stats, checked against its runs, filter table and dataset."
    stats, runs = json.loads((out / "stats.json").read_text()), read_runs(out / "runs.jsonl")
    table = json.loads((out / "filter.json").read_text())
    rows = (out / "sft.jsonl").read_text().splitlines()
    assert (stats["tasks"] == len(runs) == len(FACTS)
            and stats["answered"] + stats["skipped"] + stats["failed"] == stats["tasks"])
    assert (stats["answered"] == sum(r.status == "answered" for r in runs) == stats["kept_after_teacher_runs"]
            == table[1]["in"])
    assert stats["dataset_rows"] == len(rows) == table[-1]["kept"] and all(t["kept"] <= t["in"] for t in table)
    assert {r.task_id for r in runs} == {f"mine/{i}" for i in range(len(FACTS))}
    return stats


def test_an_llm_teacher_over_http_distils_our_tasks_searching_our_served_corpus(own, search, teacher, tmp_path):
    """The tiny model answers every agent call over HTTP with the settings given as flags; the search tools ask the
    retrieval server (checked once up front). A random model may keep no row: what must hold is that it was asked, with
    those settings, that the server was, and that runs and stats agree."""
    before = search.count("POST /retrieve")
    out = tmp_path / "llm"
    r = distill(own, out, "--brain", "openai", "--base_url", teacher.url, "--model", "tiny", "--max_tokens", "8",
                "--temperature", "1.0", "--timeout_s", "120", "--concurrency", "2", "--retriever_url", search.url,
                "--web_retriever", "--no_wiki")
    assert r.returncode == 0, r.stderr[-3000:]
    stats = consistent(out)
    assert stats["brain"] == "llm:openai:tiny" and stats["teacher_mean_tokens_per_task"] > 0
    runs = read_runs(out / "runs.jsonl")
    calls = [a for run in runs for a in run.activations]
    # counted by the server's tokenizer
    assert (calls and all(a.prompt_tokens > 50 and a.completion_tokens <= 8 for a in calls)
            and sum(a.completion_tokens for a in calls) > 0)
    identity = json.loads((out / "runs.teacher.json").read_text())
    assert (identity["config"] == {"max_tokens": 8, "temperature": 1.0}
            and identity["toolbox"]["retriever_url"] == search.url)
    searched = {(run.task_id, a.output) for run in runs for a in run.activations
                if a.tag in ("web_search", "wiki_search") and a.tool_status == "ok"}
    # the check up front, then every search the teacher made
    assert search.count("POST /retrieve") - before >= 1 + len(searched)


def test_the_offline_teacher_distils_our_tasks_from_the_served_corpus_alone(own, search, tmp_path):
    """No local index at all: web_search goes to the server, and crawl_page reads the pages its results showed."""
    before = search.count("POST /retrieve")
    out = tmp_path / "served"
    r = distill(own, out, "--retriever_url", search.url, "--web_retriever", "--no_wiki")
    assert r.returncode == 0, r.stderr[-3000:]
    stats = consistent(out)
    assert stats["brain"] == "offline-teacher" and stats["answered"] == len(FACTS) and stats["dataset_rows"] >= 1
    runs = read_runs(out / "runs.jsonl")
    reads = [a for run in runs for a in run.activations if a.tag == "crawl_page"]
    assert len(reads) == len(FACTS) and all(a.tool_status == "ok" and "Summary:" in a.observation for a in reads)
    searches = sum(a.tag == "web_search" for run in runs for a in run.activations)
    assert search.count("POST /retrieve") - before >= 1 + searches >= 1 + len(FACTS)
    row = json.loads((out / "sft.jsonl").read_text().splitlines()[0])
    assert "<web_search>" in row["messages"][2]["content"] and "<answer>" in row["messages"][2]["content"]


def test_the_offline_teacher_distils_our_tasks_from_our_corpus_indexed_locally(own, tmp_path):
    out = tmp_path / "local"
    r = distill(own, out, "--corpus", str(own / "docs.jsonl"), "--no_wiki")
    assert r.returncode == 0, r.stderr[-3000:]
    stats = consistent(out)
    assert stats["answered"] == len(FACTS) and stats["dataset_rows"] >= 1
    assert json.loads((out / "runs.teacher.json").read_text())["toolbox"]["corpus"] == str(own / "docs.jsonl")


def test_an_llm_summarises_the_pages_read(own, tmp_path, capsys):
    """`--summarizer_url`: crawl_page's summaries come from an OpenAI-compatible endpoint (here one that restates the
    page), asked once up front and then once per page read."""
    from fastapi import FastAPI, Request
    from afm.tools.llm import serve_in_thread
    asked, app = [], FastAPI()

    @app.post("/v1/chat/completions")
    async def summarise(request: Request):
        body = await request.json()
        asked.append(body["model"])
        page = body["messages"][-1]["content"].split("Page content:\n", 1)[-1].split("\n\nSummarise", 1)[0]
        return {"choices": [{"message": {"role": "assistant", "content": f"In short: {page}"},
                             "finish_reason": "stop"}]}

    server, url = serve_in_thread(app)
    out = tmp_path / "summarised"
    try: code = cli_distill(["--profile", "own", "--settings", str(own / "settings.ini"), "--tasks",
                             str(own / "tasks.jsonl"), "--out", str(out), "--corpus", str(own / "docs.jsonl"),
                             "--no_wiki", "--summarizer_url", url, "--summarizer_model", "summariser"])
    finally: server.should_exit = True
    assert code == 0, capsys.readouterr().err
    reads = [a for run in read_runs(out / "runs.jsonl") for a in run.activations if a.tag == "crawl_page"]
    assert len(reads) == len(FACTS) and all("Summary: In short: " in a.observation for a in reads)
    assert asked == ["summariser"] * (1 + len(FACTS)) and consistent(out)["dataset_rows"] >= 1


def test_a_registered_benchmark_takes_only_the_options_it_has(own, tmp_path, monkeypatch, capsys):
    """`--tasks afm-mhqa-sft` (a released-data loader with no world to scale): the world's options do not reach it, its
    rows become tasks; the offline teacher skips them (no gold path) and says so."""
    monkeypatch.setenv("AFM_DATA", str(tmp_path / "data"))
    (tmp_path / "data" / "afm-mhqa-sft").mkdir(parents=True)
    (tmp_path / "data" / "afm-mhqa-sft" / "train.jsonl").write_text(json.dumps(
        {"instruction": "Who wrote it?", "output": "<think>look</think><answer>Ada</answer>"}) + "\n")
    out = tmp_path / "bench"
    code = cli_distill(["--profile", "own", "--settings", str(own / "settings.ini"), "--tasks", "afm-mhqa-sft", "--out",
                        str(out), "--corpus", str(own / "docs.jsonl"), "--no_wiki"])
    assert code == 0, capsys.readouterr().err
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["tasks"], stats["skipped"], stats["dataset_rows"]) == (1, 1, 0)


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def garbage():
    "An endpoint that answers every chat request with JSON that is not a chat completion."
    from fastapi import FastAPI
    from afm.tools.llm import serve_in_thread
    app = FastAPI()
    app.post("/v1/chat/completions")(lambda: {"status": "ok", "note": "not a completion"})
    server, url = serve_in_thread(app)
    yield url
    server.should_exit = True


def test_bad_input_is_one_line_before_any_work(own, tmp_path, garbage, capsys, monkeypatch):
    """A tasks file of the wrong shape, a teacher that is down or answers garbage, a missing corpus, a retrieval server
    that is down, web tasks with no judge to grade them: one line naming it, within seconds, and no run recorded."""
    dead = _dead_url()
    for var in ("AFM_JUDGE_BASE_URL", "SERPER_API_KEY"): monkeypatch.delenv(var, raising=False)
    write_jsonl([Task("web/1", "Which page says so?", ["this one"], "web", "mine")], tmp_path / "web.jsonl")
    cases = [(["--tasks", str(own / "docs.jsonl")], "docs.jsonl:1: unknown field(s) ['text', 'title', 'url']"),
             (["--tasks", str(own / "missing.jsonl")], "missing.jsonl: no such tasks file"),
             (["--brain", "openai", "--base_url", dead, "--retries", "0"], "the teacher (llm:openai:default) does not "
                                                                           "answer: openai:default: no completion "
                                                                           "after 1 attempts; last error per "
                                                                           f"endpoint: {dead}: ConnectError"),
             (["--brain", "openai", "--base_url", garbage, "--retries", "0"], f"{garbage}/v1/chat/completions: "
                                                                              "not a chat completion"),
             (["--corpus", str(own / "nowhere.jsonl")], f"corpus {own / 'nowhere.jsonl'}: no such file"),
             (["--retriever_url", dead, "--no_wiki"], f"retrieval server {dead}: ConnectError"),
             (["--retriever_url", "localhost:8000"], "retriever_url 'localhost:8000' is not an http(s) URL"),
             (["--online"], "online: web_search asks Serper, and SERPER_API_KEY is not set"),
             (["--summarizer_url", dead], f"the page summariser at {dead} does not answer"),
             (["--tasks", str(tmp_path / "web.jsonl")], "task 'web/1' is a web task: the quality filter grades its "
                                                        "answers with the LLM judge")]
    for args, says in cases:
        out = tmp_path / "bad"
        argv = ["--profile", "own", "--settings", str(own / "settings.ini"), "--tasks", str(own / "tasks.jsonl"),
                "--out", str(out), *args]
        t0 = time.monotonic()
        try: code = cli_distill(argv)
        except SystemExit as e: code = e.code
        err = capsys.readouterr().err
        assert code == 1 and says in err and len(err.strip().splitlines()) == 1, (args, err[-1500:])
        assert time.monotonic() - t0 < 10 and not (out / "runs.jsonl").exists(), args
    r = distill(own, tmp_path / "bad", "--brain", "openai", "--base_url", dead, timeout=120)  # the same, as a process
    assert (r.returncode == 1 and "does not answer" in r.stderr and dead in r.stderr
            and len(r.stderr.strip().splitlines()) == 1), r.stderr

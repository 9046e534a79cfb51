"""The tasks part's slow and out-of-process checks: the full grader validation on real data, the hub loaders offline,
the LLM judge over real HTTP, and `grade` on hostile predictions."""
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from afm.tasks import grading, hub, task
from afm.tools.llm import BackendError, Endpoint, LLMClient

HERE = Path(__file__).resolve().parent
PACKAGED = ("humaneval", "math500", "aime24", "aime25", "cnmo", "fanoutqa")


# ----------------------------------------------------------------------------------------------------------------
# graders


TRICKY = ["", " ", "|||", "<answer></answer>", "<answer>", "\\boxed{", "\\boxed{}", "\x00", "\ud800 \\boxed{1}",
          "x" * 100_001, "(" * 5000, "2^" * 300 + "2",
          "```python\n```", "import sys; sys.exit(0)", "import os; os._exit(0)", "def f(:", "None", "while True: pass",
          "print(3)", "{\"judgement\": \"correct\"}", "\\frac{1}{0}", "0/0", "nan", "1e999999"]


def _hostile_suite() -> list:
    "One task of each kind (code tasks with a 1 s limit)."
    return [task.Task("t/qa", "Capital of France?", ["Paris"], "qa", "t"),
            task.Task("t/web", "Capital of France?", ["Paris", "Paname"], "web", "t", meta={"all_of": True}),
            task.Task("t/math", "1/2?", ["\\frac{1}{2}"], "math", "t"),
            task.Task("t/check", "inc", [], "code", "t", meta={"timeout_s": 1},
                       tests={"style": "check", "code": "def check(f):\n    assert f(1) == 2", "entry_point": "inc"}),
            task.Task("t/stdio", "echo", [], "code", "t", meta={"timeout_s": 1},
                       tests={"style": "stdio", "cases": [{"input": "3", "output": "3"}]})]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.sampled_from(TRICKY), st.text(max_size=200)))
def test_grade_is_total_and_bounded(prediction):
    verifier = grading.math_verifier()
    with mock.patch.dict(os.environ), mock.patch.object(verifier, "timeout_s", 2.0):
        os.environ.pop("AFM_JUDGE_BASE_URL", None)
        for task in _hostile_suite():
            if task.kind == "web":  # no judge: refused, whatever the prediction, never graded by exact match
                with pytest.raises(grading.NoJudgeError, match="AFM_JUDGE_BASE_URL"): grading.grade(task, prediction)
                continue
            score = grading.grade(task, prediction)
            assert 0.0 <= score <= 1.0, (task.id, prediction[:50], score)


def test_grade_is_total_from_many_threads():
    suite = [t for t in _hostile_suite() if t.kind != "web"]  # a web task needs the judge: tested below
    jobs = [(t, p) for t in suite for p in TRICKY[:12]]
    with mock.patch.object(grading.math_verifier(), "timeout_s", 2.0), ThreadPoolExecutor(4) as pool:
        scores = list(pool.map(lambda j: grading.grade(*j), jobs))
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert grading.grade(suite[1], "\\boxed{0.5}") == 1.0 and grading.grade(suite[3], "print(input())") == 1.0


# ------------------------------------------------------------------------------------------------------- hub loaders


def _folder(name: str) -> str:
    return "livecodebench" if name.startswith("livecodebench") else name


def test_hub_loaders_fail_at_once_offline(tmp_path):
    """In a fresh process with HF_HUB_OFFLINE=1 (read by huggingface_hub at import) and no data, every hub loader
    fails fast."""
    # the hub's loaders, listed in the fresh process (a test of this one may have registered a benchmark of its own)
    script = f"""
import json, time
from afm.tasks import benchmarks, grading, suites, task
out = []
for name in sorted(set(task.benchmarks()) - set({PACKAGED!r}) - set(suites.GENERATED_SUITES)):
    t0 = time.perf_counter()
    try: task.load_benchmark(name); out.append([name, "loaded", "", 0])
    except Exception as e: out.append([name, type(e).__name__, str(e), time.perf_counter() - t0])
print(json.dumps(out))
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "AFM_DATA": str(tmp_path), "AFM_DOWNLOAD": "1"}
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, cwd=HERE)
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout.splitlines()[-1])
    print(f"\n{len(results)} hub loaders failed offline in {time.perf_counter() - start:.1f} s (process included)")
    assert len(results) == 22, [n for n, *_ in results]  # every hub loader, each checked below
    for name, kind, message, seconds in results:
        source = hub.PAPER_SOURCES[_folder(name)]
        assert kind == "FileNotFoundError", (name, kind, message)
        assert seconds < 2, (name, seconds)
        assert str(tmp_path / _folder(name)) in message and "path=" in message, message
        assert ("HF_HUB_OFFLINE=1" if source.hub_id else "not on the hub") in message, message
        assert (source.hub_id or source.url) in message, message
        for f in source.files: assert f in message, message


def test_no_dataset_is_downloaded_without_AFM_DOWNLOAD(tmp_path, monkeypatch):
    "The one download policy: without AFM_DOWNLOAD=1 a hub loader refuses in one line, before asking the hub anything."
    for flag in ("AFM_DOWNLOAD", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"): monkeypatch.delenv(flag, raising=False)
    # were it asked, the hub would not answer within the second allowed
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("AFM_DATA", str(tmp_path))
    for name in ("hotpotqa", "gaia", "afm-mhqa-rl", "livecodebench-v5"):
        start = time.perf_counter()
        with pytest.raises(FileNotFoundError) as e: task.load_benchmark(name)
        message = str(e.value)
        assert (message.startswith(f"{name}: no local data in {tmp_path / _folder(name)}/")
                and "\n" not in message), message
        assert "AFM_DOWNLOAD=1" in message and "$AFM_DATA" in message and "path=" in message, message
        assert (hub.PAPER_SOURCES[_folder(name)].hub_id in message
                and time.perf_counter() - start < 1), message


def test_datasets_offline_flag_counts_too(tmp_path, monkeypatch):
    monkeypatch.setenv("AFM_DOWNLOAD", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("AFM_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="HF_DATASETS_OFFLINE=1.*RUC-NLPIR/FlashRAG_datasets"):
        task.load_benchmark("hotpotqa")


def test_an_unreachable_hub_counts_as_offline(tmp_path, monkeypatch):
    "No offline flag, but the hub endpoint (a closed port on the loopback) refuses: the loader still fails at once."
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"): monkeypatch.delenv(flag, raising=False)
    monkeypatch.setenv("AFM_DOWNLOAD", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("AFM_DATA", str(tmp_path))
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=r"no connection to 127\.0\.0\.1 within 3 s.*cais/hle"):
        task.load_benchmark("hle")
    assert time.perf_counter() - start < 5


def test_local_data_wins_over_the_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("AFM_DATA", str(tmp_path))
    (tmp_path / "bamboogle").mkdir()
    (tmp_path / "bamboogle" / "test.jsonl").write_text(json.dumps({"id": "b1", "question": "Q?",
                                                                   "golden_answers": ["A"], "metadata": {}}) + "\n")
    (only,) = task.load_benchmark("bamboogle")
    assert only.id == "bamboogle/b1" and only.answers == ["A"]
    (tmp_path / "bamboogle" / "test.jsonl").write_text(json.dumps({"id": "b1", "question": "Q?"}) + "\n")
    with pytest.raises(ValueError, match=r"bamboogle/test\.jsonl:1: field 'golden_answers'"):
        task.load_benchmark("bamboogle")


# ----------------------------------------------------------------------------------------------------------- LLM judge


class JudgeServer:
    """An OpenAI-compatible chat-completions server on 127.0.0.1 whose model is normalised exact match; markers in a
    question script faults."""

    def __init__(self):
        self.log: list[dict] = []          # every request: path, headers, body
        self.by_question: Counter = Counter()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args): pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, content = server.reply(self.path, dict(self.headers), body)
                payload = json.dumps(content if status != 200 else {
                    "id": f"chatcmpl-{len(server.log)}", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model"), "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str: return f"http://127.0.0.1:{self.httpd.server_port}"

    def count(self, marker: str = "") -> int:
        with self._lock: return sum(n for q, n in self.by_question.items() if marker in q)

    def reply(self, path: str, headers: dict, body: dict) -> tuple[int, object]:
        "(status, assistant text or error body) for one request."
        if path != "/v1/chat/completions": return 404, {"error": {"message": f"no route {path}"}}
        prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
        fields = dict(line.split(": ", 1) for line in prompt.splitlines()
                      if line.startswith(("Question: ", "Gold answer: ", "Predicted answer: ")))
        question = fields["Question"]
        with self._lock:
            self.log.append({"path": path, "headers": headers, "body": body})
            self.by_question[question] += 1
            n = self.by_question[question]
        if "[http500-always]" in question or ("[http500-once]" in question and n == 1):
            return 500, {"error": {"message": "overloaded"}}
        if "[garbled-always]" in question or ("[garbled-once]" in question and n == 1):
            return 200, "Hmm, let me think about that."
        same = grading.normalize_answer(fields["Gold answer"]) == grading.normalize_answer(fields["Predicted answer"])
        verdict = json.dumps({"rationale": "same answer" if same else "different answer",
                              "judgement": "correct" if same else "incorrect"})
        return 200, f"```json\n{verdict}\n```" if "[fenced]" in question else verdict

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server():
    s = JudgeServer()
    yield s
    s.close()


def _endpoint(server) -> LLMClient:
    return LLMClient(Endpoint(server.base_url, "judge-em", api_key="sk-test", timeout_s=5), retries=2, backoff_s=0.05)


def _web(question: str, answer: str = "Paris") -> "tasks.Task":
    return task.Task(f"web/{abs(hash(question))}", question, [answer], "web", "test")


def test_judge_speaks_the_openai_protocol(server):
    judge = grading.LLMJudge(_endpoint(server))
    assert grading.grade(_web("Capital of France? [protocol]"), "<answer>the Paris</answer>", judge=judge) == 1.0
    assert grading.grade(_web("Capital of France? [protocol]"), "Lyon", judge=judge) == 0.0
    assert grading.grade(_web("Capital of France? [fenced]"), "Paris.", judge=judge) == 1.0
    req = server.log[-1]
    assert req["path"] == "/v1/chat/completions" and req["headers"]["Authorization"] == "Bearer sk-test"
    assert req["body"]["model"] == "judge-em" and req["body"]["temperature"] == 0.0 and req["body"]["max_tokens"] == 512
    assert ([m["role"] for m in req["body"]["messages"]] == ["system", "user"]
            and "Predicted answer: Paris." in req["body"]["messages"][1]["content"])


def test_grade_uses_the_configured_judge(server, monkeypatch):
    monkeypatch.setenv("AFM_JUDGE_BASE_URL", server.base_url + "/v1")
    monkeypatch.setenv("AFM_JUDGE_MODEL", "judge-em")
    monkeypatch.setattr(grading, "_JUDGES", {})
    before = server.count("[configured]")
    assert grading.grade(_web("Capital of France? [configured]"), "PARIS!") == 1.0
    assert server.count("[configured]") == before + 1
    monkeypatch.delenv("AFM_JUDGE_BASE_URL")
    with pytest.raises(grading.NoJudgeError, match="AFM_JUDGE_BASE_URL"):     # no judge: refused, never exact match
        grading.grade(_web("Capital of France? [configured]"), "Paris")
    assert server.count("[configured]") == before + 1


def test_an_unparsable_reply_is_asked_again(server):
    judge = grading.LLMJudge(_endpoint(server))
    assert judge.grade(_web("Capital of France? [garbled-once]"), "paris") == 1.0
    assert server.count("[garbled-once]") == 2 and judge.requests == 2
    retry = server.log[-1]["body"]["messages"]
    assert ([m["role"] for m in retry] == ["system", "user", "assistant", "user"]
            and retry[2]["content"].startswith("Hmm"))
    assert retry[3]["content"] == grading.JUDGE_RETRY


def test_http_500_is_retried_by_the_endpoint(server):
    judge = grading.LLMJudge(_endpoint(server))
    assert judge.grade(_web("Capital of France? [http500-once]"), "Paris") == 1.0
    assert server.count("[http500-once]") == 2 and judge.requests == 1


def test_judgements_are_cached_in_memory_and_sqlite(server, tmp_path):
    db = tmp_path / "judge.sqlite"
    judge = grading.LLMJudge(_endpoint(server), cache_path=db)
    task = _web("Capital of France? [cache]")
    assert judge.grade(task, "Paris") == 1.0 and server.count("[cache]") == 1
    assert judge.grade(task, "Paris") == 1.0 and server.count("[cache]") == 1          # memory: no request
    judge.close()
    again = grading.LLMJudge(_endpoint(server), cache_path=db)
    # sqlite: no request
    assert again.grade(task, "Paris") == 1.0 and server.count("[cache]") == 1 and again.requests == 0
    assert again.grade(task, "Lyon") == 0.0 and server.count("[cache]") == 2            # another prediction: asked
    other_model = grading.LLMJudge(LLMClient(Endpoint(server.base_url, "another-judge", timeout_s=5)), cache_path=db)
    assert other_model.grade(task, "Paris") == 1.0 and server.count("[cache]") == 3     # keys include the judge model
    again.close()
    other_model.close()


def test_no_verdict_raises_judge_error(server):
    judge = grading.LLMJudge(_endpoint(server), attempts=3)
    with pytest.raises(grading.JudgeError, match="no verdict in 3 replies"):
        judge.grade(_web("Capital of France? [garbled-always]"), "Paris")
    assert server.count("[garbled-always]") == 3


def test_an_endpoint_that_stays_down_raises_tool_error(server):
    judge = grading.LLMJudge(_endpoint(server))
    with pytest.raises(BackendError, match="HTTP 500"):
        judge.grade(_web("Capital of France? [http500-always]"), "Paris")
    assert server.count("[http500-always]") == 3                                      # LLMClient: 1 + 2 retries


def test_judge_is_thread_safe(server):
    judge = grading.LLMJudge(_endpoint(server))
    preds = [f"Paris {i}" for i in range(8)] + ["Paris"] * 8
    with ThreadPoolExecutor(4) as pool:
        scores = list(pool.map(lambda p: judge.grade(_web("Capital of France? [threads]"), p), preds))
    assert scores == [0.0] * 8 + [1.0] * 8 and 9 <= server.count("[threads]") <= 16 and len(judge._memory) == 9

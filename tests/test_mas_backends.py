"""The LLM backends over real HTTP on 127.0.0.1: the tiny transformers model served by `serve_chat` and called through
`LLMClient`, and scripted servers that are slow, fail, send garbage, reject or are not there at all."""
import asyncio
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from afm.tools.llm import BackendError, Endpoint, LLMClient, serve_in_thread
from afm.models.engine import TransformersEngine
from afm.models.backends import EngineBackend
from afm.models.server import serve_chat
from afm.teacher.mas import ROLE_PROMPTS
from afm.models.catalog import tiny_chat_model

CHAT = [{"role": "system", "content": "You are the planner."}, {"role": "user", "content": "Who founded the company?"}]
FAST = dict(retries=2, backoff_s=0.01)  # retry policy for tests: three attempts, no real waiting


@pytest.fixture(scope="module")
def tiny():
    """The tiny model in process, and the same model served over HTTP."""
    model, tok = tiny_chat_model()
    local = EngineBackend(TransformersEngine(model, tok))
    server, url = serve_in_thread(serve_chat(local))
    yield local, url
    server.should_exit = True


class Scripted:
    """An OpenAI-compatible server that answers its n-th request with `actions[n]` (the last action repeats) and records
    how many requests it saw and the most it held in flight at once."""

    def __init__(self, *actions: str, delay_s: float = 0.0):
        self.actions, self.delay_s = actions, delay_s
        self.calls = self.in_flight = self.max_in_flight = 0
        app = FastAPI()
        app.post("/v1/chat/completions")(self.handle)
        self.server, self.url = serve_in_thread(app)

    async def handle(self, request: Request):
        action = self.actions[min(self.calls, len(self.actions) - 1)]
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s + (2.0 if action == "slow" else 0.0))
            return self.respond(action, await request.json())
        finally: self.in_flight -= 1

    @staticmethod
    def respond(action: str, body: dict):
        completion = {"choices": [{"index": 0,
                                   "message": {"role": "assistant", "content": f"echo {len(body['messages'])}"},
                                   "finish_reason": "stop"}]}
        usage = {"usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}}
        if action in ("ok", "slow"): return {**completion, **usage}
        if action == "nousage": return completion
        if action == "garbage": return PlainTextResponse("<html>502 bad gateway</html>")
        if action == "nochoices": return {"object": "chat.completion", "usage": usage["usage"]}
        status = int(action)  # an HTTP status with an OpenAI-style error body
        return JSONResponse({"error": {"message": f"scripted {status}"}}, status_code=status)

    def stop(self): self.server.should_exit = True


@pytest.fixture
def scripted():
    servers = []
    def start(*actions, delay_s=0.0):
        servers.append(Scripted(*actions, delay_s=delay_s))
        return servers[-1]
    yield start
    for s in servers: s.stop()


def test_real_completion_counts_tokens_exactly(tiny):
    local, url = tiny
    backend = LLMClient([Endpoint(url, "tiny")])
    c = backend.complete(CHAT, max_tokens=16, temperature=0)
    direct = local.complete(CHAT, max_tokens=16, temperature=0)
    counted = local.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert c.prompt_tokens == len(counted) and c.completion_tokens == direct.completion_tokens
    assert (c.text, c.finish_reason) == (direct.text, direct.finish_reason)
    assert c.completion_tokens == 16 if c.finish_reason == "length" else c.completion_tokens < 16
    assert c.backend == f"openai:tiny@{url}" and c.seconds > 0
    sampled = backend.complete(CHAT, max_tokens=8, temperature=1.0)
    assert sampled.prompt_tokens == len(counted) and 1 <= sampled.completion_tokens <= 8
    assert httpx.get(f"{url}/health").json() == {"status": "ok", "backend": "transformers:afm-tiny"}
    backend.close()


def test_stop_strings(tiny):
    local, url = tiny
    backend = LLMClient([Endpoint(url, "tiny")])
    full = backend.complete(CHAT, max_tokens=24, temperature=0)
    text = full.text
    pairs = (text[i:i + 2] for i in range(len(text) // 2, len(text) - 1))
    stop = next(p for p in pairs if p.isascii() and p.isprintable())  # a stop string from the second half of the text
    cut = backend.complete(CHAT, max_tokens=24, temperature=0, stop=[stop])
    assert cut.text == text[:text.find(stop)] and stop not in cut.text and cut.finish_reason == "stop"
    assert cut.completion_tokens < full.completion_tokens
    assert backend.complete(CHAT, max_tokens=24, temperature=0, stop=["\u2603"]).text == text  # never occurs: no change
    with pytest.raises(ValueError, match="stop must be a list"): backend.complete(CHAT, stop="ab")
    backend.close()


def test_bounded_concurrency(scripted):
    server = scripted("ok", delay_s=0.2)
    backend = LLMClient([Endpoint(server.url, "m")], max_concurrency=3)
    with ThreadPoolExecutor(16) as ex: out = list(ex.map(lambda _: backend.complete(CHAT), range(16)))
    assert [c.text for c in out] == ["echo 2"] * 16 and server.calls == 16
    assert server.max_in_flight == 3  # the bound holds, and is reached
    assert backend.stats()[0]["in_flight"] == 0


def test_endpoints_share_the_load(scripted):
    a, b = scripted("ok", delay_s=0.05), scripted("ok", delay_s=0.05)
    backend = LLMClient([Endpoint(a.url, "m"), Endpoint(b.url, "m")], max_concurrency=4)
    for _ in range(4): backend.complete(CHAT)  # one at a time: the endpoints take turns
    assert (a.calls, b.calls) == (2, 2)
    with ThreadPoolExecutor(8) as ex: list(ex.map(lambda _: backend.complete(CHAT), range(12)))
    assert a.calls >= 5 and b.calls >= 5 and a.calls + b.calls == 16
    assert [s["requests"] for s in backend.stats()] == [a.calls, b.calls]


def test_timeout_is_retried(scripted):
    server = scripted("slow", "ok")
    backend = LLMClient([Endpoint(server.url, "m", timeout_s=0.3)], **FAST)
    t0 = time.perf_counter()
    c = backend.complete(CHAT)
    assert c.text == "echo 2" and server.calls == 2 and time.perf_counter() - t0 < 1.5


@pytest.mark.parametrize("status", ["500", "503", "429"])
def test_server_errors_are_retried(scripted, status):
    server = scripted(status, status, "ok")
    c = LLMClient([Endpoint(server.url, "m")], **FAST).complete(CHAT)
    assert (c.text, c.prompt_tokens, c.completion_tokens, server.calls) == ("echo 2", 11, 2, 3)


@pytest.mark.parametrize("action, says", [("garbage", "not a chat completion (JSONDecodeError"),
                                          ("nochoices", "not a chat completion (KeyError: 'choices'")])
def test_garbage_is_retried_then_fails_clearly(scripted, action, says):
    server = scripted(action)
    with pytest.raises(BackendError) as e: LLMClient([Endpoint(server.url, "m")], **FAST).complete(CHAT)
    assert server.calls == 3 and "no completion after 3 attempts" in str(e.value)
    assert f"{server.url}: ValueError: {server.url}/v1/chat/completions: {says}" in str(e.value)
    fixed = scripted(action, "ok")  # and a single bad answer is just retried
    assert LLMClient([Endpoint(fixed.url, "m")], **FAST).complete(CHAT).text == "echo 2"


def test_endpoint_down_fails_clearly_in_bounded_time():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    t0 = time.perf_counter()
    with pytest.raises(BackendError) as e:
        LLMClient([Endpoint(url, "m", timeout_s=2)], retries=2, backoff_s=0.1).complete(CHAT)
    assert time.perf_counter() - t0 < 2.0
    assert (str(e.value).startswith("openai:m: no completion after 3 attempts")
            and f"{url}: ConnectError" in str(e.value))


def test_client_errors_are_not_retried(scripted, tiny):
    for status in ("400", "401", "404"):
        server = scripted(status, "ok")
        with pytest.raises(BackendError) as e: LLMClient([Endpoint(server.url, "m")], **FAST).complete(CHAT)
        assert server.calls == 1
        assert str(e.value) == f"{server.url} rejected the request (not retried): HTTP {status}: scripted {status}"
    _, url = tiny  # a real rejection: the request does not fit the tiny model's context
    with pytest.raises(BackendError,
                       match=r"HTTP 400: a prompt of \d+ tokens plus max_tokens=4000 exceeds the context"):
        LLMClient([Endpoint(url, "tiny")], **FAST).complete(CHAT, max_tokens=4000)


def test_failover_to_a_live_endpoint(scripted):
    live = scripted("ok")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    backend = LLMClient([Endpoint(dead, "m"), Endpoint(live.url, "m")], retries=1, backoff_s=1.0)
    t0 = time.perf_counter()
    assert [backend.complete(CHAT).text for _ in range(5)] == ["echo 2"] * 5
    assert time.perf_counter() - t0 < 1.0  # moving to another endpoint does not wait
    assert live.calls == 5 and backend.stats()[0]["requests"] == 1  # the dead one failed once, then was avoided


def test_missing_usage_is_estimated_and_says_so(scripted):
    server = scripted("nousage")
    c = LLMClient([Endpoint(server.url, "m")]).complete(CHAT)
    # "echo 2": 6 bytes
    assert c.backend.endswith("(usage estimated)") and c.prompt_tokens > 8 and c.completion_tokens == 2


def test_from_env(monkeypatch, scripted):
    monkeypatch.delenv("AFM_TEACHER_BASE_URL", raising=False)
    assert LLMClient.from_env("AFM_TEACHER") is None
    a, b = scripted("ok"), scripted("ok")
    monkeypatch.setenv("AFM_TEACHER_BASE_URL", f"{a.url}/v1, {b.url}")
    monkeypatch.setenv("AFM_TEACHER_MODEL", "qwen")
    backend = LLMClient.from_env("AFM_TEACHER")
    assert backend.name == "openai:qwen" and [backend.complete(CHAT).text for _ in range(2)] == ["echo 2"] * 2
    assert (a.calls, b.calls) == (1, 1)
    monkeypatch.setenv("AFM_TEACHER_BASE_URL", "localhost:8000")
    with pytest.raises(ValueError, match="AFM_TEACHER_BASE_URL: 'localhost:8000' is not an http"):
        LLMClient.from_env("AFM_TEACHER")


def test_server_validates_requests(tiny):
    _, url = tiny
    post = lambda body: httpx.post(f"{url}/v1/chat/completions", json=body)
    for body, field in [({"messages": CHAT, "stream": [1]}, "stream"), ({"messages": CHAT, "n": 100}, "n"),
                        ({"messages": CHAT, "temperature": -1}, "temperature"), ({"model": "x"}, "messages")]:
        r = post(body)
        assert r.status_code == 400 and r.json()["error"]["message"].startswith(field), (body, r.text)
    r = httpx.post(f"{url}/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    r = post({"messages": CHAT, "max_completion_tokens": 3, "stop": "zz", "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3


# --- the teacher's LLM path, driven to a correct answer ---------------------------------


def _protocol_reply(system: str, memory: str) -> str:
    """What a competent LLM following the agents' protocol answers, from the prompt alone: the role comes from the
    system prompt, the facts from the observations in the shared memory (it never sees the gold answer)."""
    entity = re.fullmatch(r"In what year was (.+?) (?:born|founded)\?",
                          re.search(r"^Question: (.*)$", memory, re.M)[1])[1]
    crawled = re.findall(r"<crawl_page>.*?</crawl_page>\n<observation>(.*?)</observation>", memory, re.S)
    suggested = re.findall(r"<suggested_answer>(.*?)</suggested_answer>", memory)
    if system.startswith("You coordinate"):
        if "<plan>" not in memory: return "NEXT: planner\nPlan the lookup first."
        if not crawled: return "NEXT: search\nFind the page and read it."
        if "<reflection>" not in memory: return "NEXT: reflection\nReview the evidence."
        if "<double_check>" not in memory: return "NEXT: verifier\nSuggest and check an answer."
        return "NEXT: answer\nThe answer was checked."
    if system.startswith("You are the planner."):
        return f"1. Search for {entity}.\n2. Read its page for the year.\n3. Verify the year and answer."
    if system.startswith("You are the search agent."):
        if "<web_search>" not in memory: return f"web_search: {entity}"
        return "crawl_page: " + re.search(r"\[" + re.escape(entity) + r"\]\((https://[^)\s]+)\)", memory)[1]
    if system.startswith("You are the reflection agent."):
        return ("information_conflict: good - one page, no contradiction\ntool_effectiveness: good - the page was "
                "found and read\ntrajectory_monitoring: good - ready to answer")
    if system.startswith("You are the verifier."):
        year = re.search(r"\b(1[0-9]{3}|20[0-9]{2})\b", crawled[-1])[1]
        return (f"double_check: The page of {entity} states {year}. Score: 4" if suggested
                else f"suggested_answer: {year}")
    if system.startswith("Write only the final answer"): return suggested[-1]
    raise AssertionError(f"a prompt the protocol does not know: {system[:80]!r}")


class ProtocolLLM:
    """An OpenAI-compatible server whose replies follow the agents' protocol (`_protocol_reply`); it records the
    roles asked."""

    def __init__(self):
        self.roles = []
        app = FastAPI()
        app.post("/v1/chat/completions")(self.handle)
        self.server, self.url = serve_in_thread(app)

    async def handle(self, request: Request):
        body = await request.json()
        system, memory = body["messages"][0]["content"], body["messages"][1]["content"]
        self.roles.append(next(role for role, prompt in ROLE_PROMPTS.items() if system.startswith(prompt[:30])))
        text = _protocol_reply(system, memory)
        usage = {"prompt_tokens": len(system + memory) // 4, "completion_tokens": len(text) // 4 + 1}
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {**usage, "total_tokens": sum(usage.values())}}


def test_llm_teacher_reaches_a_correct_answer_over_http():
    from afm.format.coa import grammar_problems
    from afm.teacher.distill import FilterConfig, filter_trajectories, linearize
    from afm.tasks.grading import grade
    from afm.teacher.mas import LLMBrain, MultiAgentSystem
    from afm.tools.search import SearchConfig, default_index
    from afm.tasks.task import load_benchmark
    from afm.tools.toolbox import Toolbox
    from afm.tasks.world import world_documents
    tasks = [t for t in load_benchmark("world-atomic", split="sft", sizes={"sft": 40})
             if re.fullmatch(r"In what year was .+ (born|founded)\?", t.question)][:3]
    assert len(tasks) == 3
    llm = ProtocolLLM()
    try:
        box = Toolbox([SearchConfig(index=default_index(extra=world_documents()))])
        mas = MultiAgentSystem(LLMBrain(LLMClient(Endpoint(llm.url, "protocol"), **FAST), max_tokens=64), box)
        for task in tasks:
            run = mas.run(task)
            assert run.status == "answered", (run.status, run.reason)
            assert grade(task, run.answer) == 1.0, (task.answers, run.answer)
            traj = linearize(run, task)
            assert grammar_problems(traj) == [] and [
                s.role for s in traj.steps if s.role in ("web_search", "crawl_page")] == ["web_search", "crawl_page"]
            assert traj.accounting.prompt_tokens > 0 and traj.accounting.tool_calls == 2
            kept, _ = filter_trajectories([(traj, task)], FilterConfig(keep_without_reflection=0.0))
            assert len(kept) == 1, "a correct, reflected, grammatical trajectory passes the distillation filter"
    finally:
        llm.server.should_exit = True
    assert set(llm.roles) == {"orchestrator", "planner", "search", "reflection", "verifier", "answer"}


def test_the_llm_teachers_settings_reach_its_endpoint(scripted, monkeypatch):
    """`LLMTeacherConfig` (what `afm distill --brain openai` and a profile's `distill_llm` set): the concurrency bounds
    the requests in flight, the timeout bounds one request, and the URL, model and key come from the config or
    `AFM_TEACHER_*`."""
    from afm.teacher.mas import AgentCall, LLMBrain, LLMTeacherConfig, Memory, check_backend
    server = scripted("ok", delay_s=0.2)
    brain = LLMBrain.from_config(LLMTeacherConfig(base_url=server.url, model="m", max_tokens=32, temperature=0.2,
                                                  concurrency=2))
    call = AgentCall("planner", CHAT, Memory("q"), None)
    with ThreadPoolExecutor(8) as ex: out = list(ex.map(lambda _: brain.act(call).text, range(8)))
    assert out == ["echo 2"] * 8 and server.max_in_flight == 2 and (brain.max_tokens, brain.temperature) == (32, 0.2)
    slow = scripted("slow")
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"the teacher does not answer: .*timed out after 0\.3 s"):
        check_backend(LLMBrain.from_config(LLMTeacherConfig(base_url=slow.url, timeout_s=0.3, retries=0)).backend)
    assert time.perf_counter() - t0 < 1.5
    monkeypatch.setenv("AFM_TEACHER_BASE_URL", server.url)
    monkeypatch.setenv("AFM_TEACHER_MODEL", "from-env")
    assert LLMBrain.from_config(LLMTeacherConfig()).name == "llm:openai:from-env"
    monkeypatch.delenv("AFM_TEACHER_BASE_URL")
    with pytest.raises(ValueError, match="needs an endpoint: set --base_url .* or AFM_TEACHER_BASE_URL"):
        LLMTeacherConfig().client()

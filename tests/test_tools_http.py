"""The tools that speak HTTP, against real servers on localhost: the retrieval server (as `afm serve search`, a process
of its own), page fetching, Serper's protocol and an OpenAI-compatible summariser."""
import json
import os
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from afm.tools.crawl import CrawlConfig, extractive_summary, fetch_page, llm_summary
from afm.tools.llm import Endpoint, LLMClient
from afm.tools.search import Document, RetrievalClient, SearchConfig, SearchIndex, SerperSearch, wiki_documents
from afm.tools.toolbox import ToolError, ToolTimeout, Toolbox
from conftest import AFM



@pytest.fixture(scope="module")
def small_index(tmp_path_factory):
    docs = wiki_documents()[:500] + [Document("https://world.example/wiki/Varo_Keltan", "Varo Keltan",
                                              "Varo Keltan is a fictional engineer. Keltan was "
                                              "born in Osmira in 1931.", "world")]
    path = tmp_path_factory.mktemp("idx") / "index"
    SearchIndex.build(docs).save(path)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Site(BaseHTTPRequestHandler):
    """A small web site: an HTML page, a PDF, a slow page, a huge page, a 404, a Serper-like API and a chat endpoint."""
    chat_failures = 0  # answer the next N chat requests with HTTP 500
    seen_keys: list = []

    def log_message(self, *a): pass

    def _send(self, code, body: bytes, ctype="text/html; charset=utf-8"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try: self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError): pass

    def do_GET(self):
        if self.path == "/page.html":
            self._send(200, b"<html><head><title>Osmira</title><script>x()</script></head><body><nav>Home | About</nav>"
                            b"<p>Osmira is a harbour town.</p><p>The Keltan bridge in Osmira opened in "
                            b"1962.</p></body></html>")
        elif self.path == "/doc.pdf": self._send(200, b"%PDF-1.4 ...", "application/pdf")
        elif self.path == "/slow":
            time.sleep(3)
            self._send(200, b"<p>late</p>")
        elif self.path == "/huge": self._send(200, b"<p>" + b"word " * 1_000_000 + b"</p>")
        else: self._send(404, b"not found")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/search":
            _Site.seen_keys.append(self.headers.get("X-API-KEY"))
            if body["q"] == "explode": return self._send(500, b"upstream error", "text/plain")
            organic = [{"title": f"Result {i} for {body['q']}", "link": f"https://r{i}.example/",
                        "snippet": f"snippet {i}", **({"date": "2024-01-02"} if i == 1 else {})}
                       for i in range(1, body.get("num", 10) + 1)]
            return self._send(200, json.dumps({"organic": organic}).encode(), "application/json")
        if self.path == "/v1/chat/completions":
            if _Site.chat_failures > 0:
                _Site.chat_failures -= 1
                return self._send(500, b"overloaded", "text/plain")
            prompt = body["messages"][-1]["content"]
            if "SLOW" in prompt: time.sleep(2)
            goal = prompt.split("\n", 1)[0].removeprefix("Goal: ")
            page = prompt.split("Page content:\n", 1)[1].split("\n\nSummarise", 1)[0]
            answer = {"choices": [{"message": {"role": "assistant", "content": extractive_summary(page, goal, 200)}}]}
            return self._send(200, json.dumps(answer).encode(), "application/json")
        self._send(404, b"no such endpoint")


@pytest.fixture(scope="module")
def site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_retrieval_server_as_a_process(small_index):
    port = _free_port()
    proc = subprocess.Popen([AFM, "serve", "search", "--index", str(small_index), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(150):
            try:
                if httpx.get(f"{url}/health", timeout=1).json()["documents"] == 501: break
            except httpx.HTTPError: time.sleep(0.1)
        client = RetrievalClient(url)
        remote = client.search_batch(["Varo Keltan birthplace", "Mona Lisa"], k=3)
        local = SearchIndex.load(small_index).search_batch(["Varo Keltan birthplace", "Mona Lisa"], k=3)
        assert [[h.doc.url for h in r] for r in remote] == [[h.doc.url for h in r] for r in local]
        assert remote[0][0].doc.title == "Varo Keltan" and "Osmira" in remote[0][0].doc.text
        r = httpx.post(f"{url}/retrieve", json={"queries": ["x"], "topk": 0})
        assert r.status_code == 422 and "topk" in r.text
        box = Toolbox([SearchConfig(index=SearchIndex.load(small_index), retriever=client)])
        obs = box.session().call("wiki_search", "Varo Keltan").observation
        assert obs.startswith("Doc 1(Title: Varo Keltan)")
    finally:
        proc.terminate()
        proc.wait(10)


def test_retrieval_client_against_a_dead_server():
    with pytest.raises(ToolError, match="retrieval server"):
        RetrievalClient(f"http://127.0.0.1:{_free_port()}").search("x")


def test_fetch_page_html_and_failures(site):
    title, text = fetch_page(f"{site}/page.html")
    assert title == "Osmira" and "opened in 1962" in text and "x()" not in text and "Home" not in text
    with pytest.raises(ToolError, match=r"not an HTML page \(application/pdf\)"): fetch_page(f"{site}/doc.pdf")
    with pytest.raises(ToolError, match="HTTP 404"): fetch_page(f"{site}/missing")
    t0 = time.perf_counter()
    with pytest.raises(ToolTimeout, match="timed out after 0.5 s"): fetch_page(f"{site}/slow", timeout_s=0.5)
    assert time.perf_counter() - t0 < 2.5
    _, text = fetch_page(f"{site}/huge", max_bytes=10_000)
    assert len(text) <= 10_000


def test_crawl_page_online_mixes_pages_and_errors(site, small_index):
    box = Toolbox([SearchConfig(index=SearchIndex.load(small_index)), CrawlConfig(fetch_timeout_s=0.5)], online=True)
    s = box.session("When did the Keltan bridge open?")
    r = s.call("crawl_page", f"{site}/page.html | [pdf]({site}/doc.pdf) | {site}/slow")
    assert r.status == "ok"
    lines = r.observation.splitlines()
    assert lines[0].startswith(f"Page 1 [{site}/page.html] Summary:") and "1962" in lines[0]
    assert lines[1] == f"Page 2 [{site}/doc.pdf] Error: not an HTML page (application/pdf)"
    assert lines[2].startswith(f"Page 3 [{site}/slow] Error: timed out")
    r = s.call("crawl_page", f"{site}/slow")
    assert r.status == "timeout" and r.observation.startswith("[FAILED] Page 1")
    offline = Toolbox([SearchConfig(index=SearchIndex.load(small_index))]).session().call(
        "crawl_page", f"{site}/page.html")
    # the model's URL
    assert offline.status == "bad_input" and "not in the local document store (offline)" in offline.observation


def test_serper_protocol(site):
    _Site.seen_keys.clear()
    serper = SerperSearch(api_key="k-123", endpoint=f"{site}/search")
    hits = serper.search("varo keltan", k=3)
    assert ([h.doc.title for h in hits] == [f"Result {i} for varo keltan" for i in (1, 2, 3)]
            and _Site.seen_keys == ["k-123"])
    box = Toolbox([SearchConfig(serper=serper, index=SearchIndex.build([Document("u", "t", "x")]))], online=True)
    obs = box.session().call("web_search", "varo keltan").observation
    assert "1. [Result 1 for varo keltan](https://r1.example/)\nDate: 2024-01-02\nSnippet: snippet 1" in obs
    r = box.session().call("web_search", "explode")
    assert r.status == "tool_error" and "500" in r.observation
    os.environ.pop("SERPER_API_KEY", None)
    with pytest.raises(ValueError, match="SERPER_API_KEY"): SerperSearch()


def test_llm_summary_with_retries_and_timeouts(site, small_index):
    ep = LLMClient(Endpoint(site, "tiny", timeout_s=1.0), retries=2, backoff_s=0.05)
    page = "Osmira is a harbour town. The Keltan bridge in Osmira opened in 1962. It is 300 m long."
    assert "1962" in llm_summary(ep, page, "When did the Keltan bridge open?")
    _Site.chat_failures = 2  # two 500s, then an answer: retried
    assert "1962" in llm_summary(ep, page, "When did the Keltan bridge open?")
    _Site.chat_failures = 5  # more 500s than retries: a clear error after the retries
    with pytest.raises(ToolError, match="no completion after 3 attempts.*HTTP 500"): llm_summary(ep, page, "bridge")
    _Site.chat_failures = 0
    with pytest.raises(ToolError, match="timed out"):
        llm_summary(LLMClient(Endpoint(site, "tiny", timeout_s=0.5), retries=0), "SLOW", "x")
    box = Toolbox([SearchConfig(index=SearchIndex.load(small_index)), CrawlConfig(summarizer=ep)], online=True)
    obs = box.session("When did the Keltan bridge open?").call("crawl_page", f"{site}/page.html").observation
    assert obs.startswith(f"Page 1 [{site}/page.html] Summary:") and "1962" in obs


def test_summariser_client_from_env(monkeypatch):
    monkeypatch.delenv("AFM_LLM_BASE_URL", raising=False)
    assert LLMClient.from_env("AFM_LLM") is None
    monkeypatch.setenv("AFM_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("AFM_LLM_MODEL", "m")
    assert LLMClient.from_env("AFM_LLM")._slots[0].endpoint == Endpoint("http://127.0.0.1:9/v1", "m", "")


def test_serve_search_says_what_is_wrong_in_one_line(tmp_path, small_index):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"url": "u", "title": "t", "text": "x"}\n{"url": "u2", "title": 3, "text": "x"}\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for args, code, words in [(["--port", "99999"], 2, "--port must be from 0 to 65535"),
                                  (["--corpus", "/nonexistent.jsonl"], 1, "/nonexistent.jsonl"),
                                  (["--index", "/nonexistent"], 1, "/nonexistent"),
                                  (["--corpus", str(bad)], 1, "bad.jsonl:2"),
                                  (["--index", str(small_index), "--port", str(port)],
                                   1, f"cannot listen on 127.0.0.1:{port}")]:
            r = subprocess.run([AFM, "serve", "search", *args], capture_output=True, text=True, timeout=120)
            assert (r.returncode == code and words in r.stderr
                    and len(r.stderr.strip().splitlines()) == 1), (args, r.stderr[-800:])
            assert "serving" not in r.stdout


def test_serve_search_on_port_0_announces_the_real_port(small_index):
    proc = subprocess.Popen([AFM, "serve", "search", "--index", str(small_index), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        assert port > 0
        for _ in range(100):
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()["documents"] == 501
                break
            except httpx.HTTPError: time.sleep(0.1)
        else: raise AssertionError("the announced port does not answer")
    finally:
        proc.terminate()
        proc.wait(10)

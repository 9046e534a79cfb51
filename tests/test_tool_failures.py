"""What a model writes can only fail its own step: any input becomes an observation, made-up URLs never trip the circuit
breaker, the breaker recovers when the tool does, and the record cache never keeps a failure as an answer."""
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from afm.tools.crawl import CrawlConfig
from afm.tools.search import Document, SearchConfig, SearchIndex
from afm.tools.toolbox import STATUSES, ReplayMiss, ToolBroken, ToolCache, ToolHealth, Toolbox

PAGE = Document("https://world.example/wiki/Osmira",
                "Osmira", "Osmira is a harbour town. Its bridge opened in 1962.", "world")


@pytest.fixture(scope="module")
def index():
    return SearchIndex.build([PAGE,
                              Document("https://world.example/wiki/Keltan", "Keltan", "Keltan is a river.", "world")])


class _Flaky(BaseHTTPRequestHandler):
    """A real web server whose pages fail with 500 while `down` is set, and answer otherwise."""
    down = True

    def log_message(self, *args): pass

    def do_GET(self):
        status, body = (500, b"overloaded") if _Flaky.down else (200, b"<html><title>T</title><p>The bridge "
                                                                      b"opened in 1962.</p></html>")
        self.send_response(status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def flaky():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Flaky.down = True
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("tool", ["web_search", "wiki_search", "crawl_page", "code"])
@pytest.mark.parametrize("text", [None, b"bytes", 42, ["a"], "", "   ", "http://[oops", "\x00\udcff", "x" * 200_000, "ftp://host/file"])
def test_any_input_becomes_an_observation(index, tool, text):
    r = Toolbox([SearchConfig(index=index)]).session("q").call(tool, text)
    assert r.status in STATUSES and isinstance(r.observation, str) and r.observation
    if not isinstance(text, str): assert r.status == "bad_input" and "must be text" in r.observation


def test_made_up_urls_are_the_models_fault_and_never_trip_the_breaker(index):
    box = Toolbox([SearchConfig(index=index)], health=ToolHealth(window=10, max_failure_rate=0.5, min_calls=5))
    for i in range(30):
        for url in (f"https://world.example/wiki/Nowhere_{i}", f"ftp://world.example/{i}", f"http://[oops{i}"):
            r = box.session("q").call("crawl_page", url)
            assert r.status == "bad_input", (url, r)
    assert box.session("q").call("crawl_page", PAGE.url).status == "ok"
    assert box.health.table()["crawl_page"]["tool_error"] == 0


def test_the_breaker_trips_on_a_failing_tool_and_recovers_when_it_does(index, flaky):
    health = ToolHealth(window=10, max_failure_rate=0.5, min_calls=5, cooldown_s=0.5)
    box = Toolbox([SearchConfig(index=index), CrawlConfig(fetch_timeout_s=2)], online=True, health=health)
    for i in range(5): assert box.session("q").call("crawl_page", f"{flaky}/page{i}").status == "tool_error"
    with pytest.raises(ToolBroken, match="tried again"): box.session("q").call("crawl_page", f"{flaky}/page5")
    with pytest.raises(ToolBroken): box.session("q").call("crawl_page", f"{flaky}/page6")  # still cooling down
    time.sleep(0.6)
    # the trial call fails: open again
    assert box.session("q").call("crawl_page", f"{flaky}/page7").status == "tool_error"
    with pytest.raises(ToolBroken): box.session("q").call("crawl_page", f"{flaky}/page8")
    _Flaky.down = False
    time.sleep(0.6)
    assert box.session("q").call("crawl_page", f"{flaky}/page9").status == "ok"  # the trial call succeeds: closed
    assert all(box.session("q").call("crawl_page", f"{flaky}/p{i}").status == "ok" for i in range(10))
    _Flaky.down = True
    for i in range(6): box.session("q").call("crawl_page", f"{flaky}/again{i}")  # 6 of the last 10 calls failed
    with pytest.raises(ToolBroken): box.session("q").call("crawl_page", f"{flaky}/again6")
    _Flaky.down = False
    health.reset("crawl_page")  # fixed: no need to wait for the cool-down
    assert box.session("q").call("crawl_page", f"{flaky}/after-reset").status == "ok"


@pytest.mark.parametrize("kwargs", [{"window": 0}, {"window": -3}, {"min_calls": 0}, {"window": 5, "min_calls": 6},
                                    {"max_failure_rate": 0}, {"cooldown_s": -1}, {"window": 2.5}])
def test_health_settings_are_validated(kwargs):
    with pytest.raises(ValueError): ToolHealth(**kwargs)


def test_the_cache_keeps_answers_not_failures(index, flaky, tmp_path):
    path = tmp_path / "calls.sqlite"
    box = Toolbox([SearchConfig(index=index), CrawlConfig(fetch_timeout_s=2)], online=True,
                  cache=ToolCache(path, "record"))
    assert box.session("q").call("crawl_page", f"{flaky}/page").status == "tool_error"
    assert box.session("q").call("crawl_page", "ftp://world.example/nowhere").status == "bad_input"
    assert box.session("q").call("web_search", "harbour bridge").status == "ok"
    assert len(box.cache) == 2  # the answer and the model's bad input; not the tool error
    _Flaky.down = False
    again = box.session("q").call("crawl_page", f"{flaky}/page")
    assert again.status == "ok" and not again.cached  # the rerun tried the tool again
    replay = Toolbox([SearchConfig(index=index)], cache=ToolCache(path, "replay"))
    assert replay.session("q").call("web_search", "harbour bridge").cached
    # an old recording that holds a failure: replayed as a miss, not as an answer
    box.cache._db.execute("INSERT OR REPLACE INTO calls VALUES (?, ?, ?, ?, ?, ?)",
                          (ToolCache.key("web_search", "old failure"), "web_search", "old failure",
                           "timeout", "[FAILED] timed out", 0.0))
    with pytest.raises(ReplayMiss): replay.session("q").call("web_search", "old failure")


@pytest.mark.parametrize("limit", ["abc", None, "1e999", -5, 1e12, [1], {"s": 1}])
def test_a_bad_task_time_limit_does_not_make_grade_raise(limit):
    from afm.tasks.grading import grade
    from afm.tasks.task import Task
    task = Task("demo/t", "Print 3.", ["print(3)"], "code", "demo",
                tests={"style": "stdio", "cases": [{"input": "", "output": "3\n"}]}, meta={"timeout_s": limit})
    assert grade(task, "print(3)") == 1.0 and grade(task, "print(4)") == 0.0


@pytest.mark.parametrize("timeout_s", [2.2e6, float("inf"), 0, -1])
def test_sandbox_time_limits_are_bounded(timeout_s):
    from afm.tools.execution import run_python
    with pytest.raises(ValueError, match="timeout_s"): run_python("print(1)", timeout_s=timeout_s)


def test_a_damaged_cache_is_named_when_opened(tmp_path):
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ValueError, match="garbage.sqlite: not a usable tool cache"): ToolCache(garbage)
    good = tmp_path / "calls.sqlite"
    c = ToolCache(good)
    for i in range(300): c.put("web_search", f"query {i}" * 20, "ok", "observation " * 50)
    c._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    data = bytearray(good.read_bytes())
    data[len(data) // 2: len(data) // 2 + 4096] = b"\x5a" * 4096  # damage in the middle of the file
    good.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="calls.sqlite: not a usable tool cache"): ToolCache(good)


def test_a_busy_cache_is_a_miss_not_a_failed_call(index, tmp_path):
    import subprocess, sys
    path = tmp_path / "calls.sqlite"
    ToolCache(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sqlite3, time\ndb = sqlite3.connect({str(path)!r}, "
                               "isolation_level=None)\n" "db.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); "
                                                         "time.sleep(6)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        box = Toolbox([SearchConfig(index=index)], cache=ToolCache(path, busy_timeout_s=0.2))
        r = box.session("q").call("web_search", "harbour bridge")
        assert r.status == "ok" and "Osmira" in r.observation and box.cache.busy >= 1
    finally:
        holder.kill()
        holder.wait()


def test_a_latin1_coding_cookie_does_not_garble_the_program():
    from afm.tools.execution import run_python
    for cookie in ("# coding: latin-1", "# -*- coding: iso-8859-1 -*-", "#!/usr/bin/env python\n# vim: set "
                                                                        "fileencoding=cp1252 :"):
        r = run_python(f"{cookie}\nprint('café ünïcode')")
        assert r.status == "ok" and r.stdout == "café ünïcode\n", (cookie, r)


def test_deep_nesting_in_a_row_is_a_value_error_naming_it(tmp_path):
    from afm.tasks.task import Task, read_jsonl
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "deep.jsonl").write_text('{"id": "x", "meta": ' + deep + "}\n")
    with pytest.raises(ValueError, match="deep.jsonl:1"): read_jsonl(tmp_path / "deep.jsonl")
    nested: list = []
    for _ in range(100_000): nested = [nested]
    with pytest.raises(ValueError, match="meta"):
        Task("demo/1", "q?", ["a"], "qa", "demo", meta={"x": nested})


def _one_tool_box(fn, **kwargs):
    from afm.format.coa import TAGS, TagRegistry
    from afm.tools.toolbox import Tool, ToolRegistry
    return Toolbox(registry=ToolRegistry(TagRegistry(TAGS),
                                         tools=[Tool("rude", fn, "a tool that misbehaves", **kwargs)]))


@pytest.mark.parametrize("result", [None, 42, 1.5, ["a"], b"raw bytes", {"k": "v"}, ("t",)])
def test_a_result_that_is_not_text_is_the_tools_error(result):
    box = _one_tool_box(lambda text, ctx: result)
    r = box.session("q").call("rude", "x")
    assert (r.status == "tool_error"
            and r.observation == f"[FAILED] rude returned {type(result).__name__} instead of text")
    assert box.health.table()["rude"]["tool_error"] == 1


class _Escape(BaseException):
    "Not an Exception."


@pytest.mark.parametrize("exc", [SystemExit(3), _Escape("out of here"), GeneratorExit(), RecursionError("deep")])
def test_anything_a_tool_raises_is_an_observation(exc):
    def fn(text, ctx): raise exc
    box = _one_tool_box(fn)
    for timeout_s in (None, 5.0):  # in the caller's thread and in a thread of its own
        r = box.session("q").call("rude", "x", timeout_s=timeout_s)
        assert r.status == "tool_error" and r.observation.startswith(f"[FAILED] rude crashed: {type(exc).__name__}")


def test_ctrl_c_still_stops_the_caller():
    def fn(text, ctx): raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt): _one_tool_box(fn).session("q").call("rude", "x")


@pytest.mark.parametrize("hang", ["sleeps", "forever"])
def test_a_hung_tool_costs_its_caller_the_timeout_and_counts_once(hang):
    fn = ((lambda text, ctx: time.sleep(60) or "late") if hang == "sleeps"
          else (lambda text, ctx: threading.Event().wait()))
    box = _one_tool_box(fn)
    t0 = time.perf_counter()
    r = box.session("q").call("rude", "x", timeout_s=0.5)
    assert time.perf_counter() - t0 < 2.0
    assert r.status == "timeout" and r.observation == "[FAILED] rude did not answer within 0.5 s"
    assert box.health.table()["rude"] == {"ok": 0, "tool_error": 0, "timeout": 1, "bad_input": 0}


def test_a_hung_program_is_the_inputs_timeout_not_the_tools():
    box = _one_tool_box(lambda text, ctx: time.sleep(60) or "late", input_timeouts=True)
    assert box.session("q").call("rude", "x", timeout_s=0.3).status == "timeout"
    assert box.health.failure_rate("rude") == 0.0  # the breaker does not count the model's slow program


@pytest.mark.parametrize("timeout_s", [0, -1, float("nan"), float("inf"), 1e9, "5", True])
def test_a_bad_timeout_is_refused_naming_it(timeout_s):
    with pytest.raises(ValueError, match="timeout_s"):
        _one_tool_box(lambda t, c: "ok").session("q").call("rude", "x", timeout_s=timeout_s)

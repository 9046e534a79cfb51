"""The retrieval server under hostile bodies: every bad body is a 4xx with a readable JSON answer, the work one request
can cause is bounded, and /health stays responsive while the server is busy."""
import threading
import time

import httpx
import pytest

from afm.tools.llm import serve_in_thread
from afm.tools.search import MAX_QUERIES, MAX_RESULTS, default_index, retrieval_app


@pytest.fixture(scope="module")
def url():
    server, base = serve_in_thread(retrieval_app(default_index()))
    yield base
    server.should_exit = True


@pytest.mark.parametrize("body", [
    '{"queries": ["x"], "topk": NaN}', '{"queries": ["x"], "topk": Infinity}', '{"queries": ["x"], "topk": -Infinity}',
    '{"queries": ["x"], "topk": 1.5}', '{"queries": ["x"], "topk": "3"}', '{"queries": ["x"], "topk": true}',
    '{"queries": ["x"], "topk": 0}', '{"queries": [], "topk": 3}', '{"queries": [NaN], "topk": 3}', '{"queries": "x"}',
    'not json', '[]', '{"queries": ["' + "q" * 3000 + '"]}'])
def test_every_bad_body_is_a_readable_4xx(url, body):
    r = httpx.post(f"{url}/retrieve", content=body, headers={"Content-Type": "application/json"}, timeout=10)
    assert 400 <= r.status_code < 500, (body[:60], r.status_code, r.text[:200])
    assert r.json()["detail"]


def test_the_work_of_one_request_is_bounded(url):
    r = httpx.post(f"{url}/retrieve", json={"queries": ["x"] * (MAX_QUERIES + 1), "topk": 1}, timeout=10)
    assert r.status_code == 422
    r = httpx.post(f"{url}/retrieve", json={"queries": ["mona lisa"] * MAX_QUERIES, "topk": 100}, timeout=10)
    assert r.status_code == 422 and "split the request" in r.text
    n = MAX_RESULTS // 100
    r = httpx.post(f"{url}/retrieve", json={"queries": ["mona lisa painter"] * n, "topk": 100}, timeout=60)
    assert r.status_code == 200 and len(r.json()["result"]) == n


def test_health_stays_responsive_while_the_server_is_busy(url):
    stop, n = threading.Event(), MAX_RESULTS // 100
    def hammer():
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                c.post(f"{url}/retrieve", json={"queries": ["the history of art"] * n, "topk": 100})
    workers = [threading.Thread(target=hammer) for _ in range(4)]
    for w in workers: w.start()
    try:
        time.sleep(0.5)
        waits = []
        for _ in range(10):
            t0 = time.perf_counter()
            assert httpx.get(f"{url}/health", timeout=10).json()["status"] == "ok"
            waits.append(time.perf_counter() - t0)
            time.sleep(0.1)
    finally:
        stop.set()
        for w in workers: w.join()
    assert max(waits) < 5.0, waits  # a stalled server took 8 s

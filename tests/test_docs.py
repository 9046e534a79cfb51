"""The docs site (`make docs`): built, served on localhost and read in headless Chromium.

The pages are loaded through the Chrome DevTools protocol (websocket-client), which records every request a
page makes: the site must render its chapters, results and API reference without fetching anything from
outside localhost (no CDN fonts, MathJax or require.js). Chromium's own background traffic (updates, safe
browsing) is the browser's, not the page's, and is not counted. Skipped, with the reason, only where Debian's
`chromium` is absent: `make install` installs it with apt-get when run as root.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed here "
                                "(`make install` installs it with apt-get, which needs root)")
websocket = pytest.importorskip("websocket", reason="websocket-client comes with the `docs` extra (`make install`)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, what: str, timeout: float = 20.0):
    "Poll `check` until it returns something truthy; fail naming `what` after `timeout` seconds."
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := check():
            return value
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout} s")


class Page:
    "One Chromium tab driven over the DevTools protocol, recording the URL of every request it makes."

    def __init__(self, ws_url: str):
        self.ws, self.next_id, self.requests, self.events = websocket.create_connection(ws_url, timeout=30), 0, [], []
        self.call("Network.enable")
        self.call("Page.enable")

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                assert "error" not in msg, (method, msg["error"])
                return msg.get("result", {})
            self.on_event(msg)

    def on_event(self, msg: dict):
        if msg.get("method") == "Network.requestWillBeSent":
            self.requests.append(msg["params"]["request"]["url"])
        self.events.append(msg.get("method"))

    def load(self, url: str, settle_s: float = 1.0):
        "Navigate to `url` and return once the load event fired and the network stayed quiet for `settle_s`."
        self.events.clear()
        self.call("Page.navigate", url=url)
        while "Page.loadEventFired" not in self.events:
            self.on_event(json.loads(self.ws.recv()))
        self.ws.settimeout(settle_s)
        try:
            while True:
                self.on_event(json.loads(self.ws.recv()))
        except websocket.WebSocketTimeoutException:
            pass
        finally:
            self.ws.settimeout(30)

    def js(self, expression: str):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in res, res
        return res["result"].get("value")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    "The site, built once for this module exactly as `make docs` builds it, and what the build said (warnings too)."
    out = tmp_path_factory.mktemp("docs")
    r = subprocess.run([sys.executable, "docs/build.py", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "html", r.stdout + r.stderr


@pytest.fixture(scope="module")
def site(built) -> Path:
    return built[0]


@contextlib.contextmanager
def serve_and_open(directory: Path, profile: Path):
    """(base URL, a Chromium tab): `directory` served by `python -m http.server` on a free localhost port, and
    headless Chromium."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    chrome = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                               "--disable-background-networking", "--disable-component-update", "--disable-sync",
                               "--disable-dev-shm-usage", "--no-proxy-server", f"--user-data-dir={profile}",
                               "--remote-debugging-port=0", "about:blank"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"

        def serving():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                return False

        wait_for(serving, "http.server")
        active = profile / "DevToolsActivePort"
        wait_for(lambda: active.exists() and len(active.read_text().split()) == 2, "Chromium's DevTools port")
        devtools_port = active.read_text().split()[0]
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # localhost, whatever the proxy settings
        targets = json.load(direct.open(f"http://127.0.0.1:{devtools_port}/json/list", timeout=10))
        tab = next(t for t in targets if t["type"] == "page")
        page = Page(tab["webSocketDebuggerUrl"])
        yield base, page
        page.ws.close()
    finally:
        for proc in (chrome, server):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def browser(site, tmp_path_factory):
    "(the site's base URL, a Chromium tab): the site served on localhost and read in headless Chromium."
    with serve_and_open(site, tmp_path_factory.mktemp("chromium")) as opened:
        yield opened


def load(browser, path: str):
    base, page = browser
    page.requests.clear()
    page.load(f"{base}/{path}")
    external = [u for u in page.requests if not u.startswith((base + "/", "data:", "blob:", "about:"))]
    assert not external, f"{path} made requests outside localhost: {external}"
    assert page.requests and page.requests[0] == f"{base}/{path}", page.requests[:3]
    return page


def test_home_page(browser):
    page = load(browser, "index.html")
    assert page.js("document.querySelector('h1').textContent").startswith("afm")
    nav = page.js("[...document.querySelectorAll('.sidebar-tree a')].map(a => a.textContent)")
    assert "Results" in nav and "Chapters" in nav and "API reference" in nav, nav


def test_chapter_page(browser):
    "A chapter: its title, its code, and a link to the API reference of its module, from the docstrings."
    page = load(browser, "chapters/09a_data.html")
    assert page.js("document.querySelector('h1').textContent").startswith("SFT data")
    assert page.js("document.querySelectorAll('div.cell div.highlight').length") > 10
    assert page.js("[...document.querySelectorAll('a')].some(a => a.href.endsWith('/api/09a_data.html'))")
    executed = (REPO / "reports" / "notebooks" / "09a_data.ipynb").exists()
    said = page.js("document.body.innerText")
    assert executed or "not a step of the pipeline" in said, "a chapter without outputs must say so"
    assert page.js("[...document.querySelectorAll('a')].some(a => a.href.endsWith('/chapters/08_loop.html'))")
    page = load(browser, "api/09a_data.html")
    api = page.js("[...document.querySelectorAll('dl.py dt.sig')].map(dt => dt.id)")
    assert "afm.sft.data.sft_rows" in api, api[:10]
    assert page.js("[...document.querySelectorAll('a')].some(a => a.href.endsWith('/chapters/09a_data.html'))")


def test_results_page(browser):
    "The report card's tables and every figure of reports/, loaded (not broken images)."
    page = load(browser, "results.html")
    assert page.js("document.querySelector('h1').textContent").startswith("Results")
    assert page.js("document.querySelectorAll('table').length") > 5
    images = page.js("[...document.querySelectorAll('img')].map(i => [i.getAttribute('src'), i.naturalWidth])")
    figures = sorted(p for p in (REPO / "reports").rglob("*.png") if "notebooks" not in p.parts)
    assert len(images) >= len(figures) > 0, (len(images), len(figures))
    assert all(width > 0 for _, width in images), [src for src, width in images if not width]


def test_the_build_is_clean(built):
    "No Sphinx warning and no error: a docstring, a notebook output or a link Sphinx cannot read is a failure here."
    said = [line for line in built[1].splitlines() if "WARNING" in line or "ERROR" in line]
    assert said == [], said[:10]


def test_no_link_leads_nowhere(site):
    "Every link and image of every page leads to a file of the site (links to the web aside)."
    import re
    from urllib.parse import unquote, urlsplit
    pages, broken = sorted(site.rglob("*.html")), []
    for page in pages:
        for ref in re.findall(r'(?:href|src)="([^"]+)"', page.read_text(errors="replace")):
            if re.match(r"^(https?:|mailto:|#|data:|javascript:)", ref) or not urlsplit(ref).path: continue
            if not (page.parent / unquote(urlsplit(ref).path)).exists(): broken.append((page.relative_to(site), ref))
    print(f"{len(pages)} pages, {len(broken)} broken links")
    assert len(pages) > 50 and broken == [], broken[:10]


def test_chapter_pages_carry_their_figures(browser):
    "A chapter that saves its figures shows them under the cell that made them, loaded."
    for stem, name in (("11_results", "efficiency.png"), ("10c_study", "rl_vs_sft.png")):
        if not (REPO / "reports" / "notebooks" / f"{stem}.ipynb").exists(): continue  # no executed chapter here
        page = load(browser, f"chapters/{stem}.html")
        images = page.js("[...document.querySelectorAll('img')].map(i => [i.getAttribute('src'), i.naturalWidth])")
        assert any(src.endswith(name) and width > 0 for src, width in images), (stem, images)


def test_the_api_reference_reads_markdown_docstrings(browser):
    "afm.models.engine's module docstring holds a markdown table: the reference shows a table, not its `|---|` text."
    page = load(browser, "api/07_engine.html")
    text = page.js("document.querySelector('article').innerText")
    assert "|---" not in text and page.js("document.querySelectorAll('article table').length") > 0


def test_histories_are_pages_and_the_advice_works(browser):
    "The run histories are pages of the site; a library chapter's page gives advice that works."
    page = load(browser, "histories.html")
    listed = page.js("[...document.querySelectorAll('.toctree-wrapper a')].map(a => a.getAttribute('href'))")
    assert "histories/rl.html" in listed, listed
    page = load(browser, "chapters/13_cli.html")
    said = page.js("document.body.innerText")
    assert "nbdev-test nbs/13_cli.ipynb" in said and "--chapters 13_cli" not in said

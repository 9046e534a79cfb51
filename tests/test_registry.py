"""The registries fill themselves from entry points: every thread sees the complete set, even while another is
loading it."""
import subprocess
import sys

RACE = """
import threading
from afm.tools.toolbox import TOOLS
from afm.tasks.task import benchmarks
out, go = [], threading.Barrier(8)
def look():
    go.wait()
    out.append((sorted(TOOLS.names()), {"humaneval", "world-depth", "gaia"} <= set(benchmarks())))
threads = [threading.Thread(target=look) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
assert all(o == (["code", "crawl_page", "web_search", "wiki_search"], True) for o in out), out
print("ok")
"""


def test_discovery_is_complete_for_every_thread():
    r = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_a_tool_registered_before_discovery_is_kept():
    code = ("from afm.tools.toolbox import TOOLS, Tool\n"
            "TOOLS.add(Tool('code', lambda text, ctx: 'mine', 'my code tool'))\n"
            "assert TOOLS['code'].description == 'my code tool' and 'web_search' in TOOLS\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]

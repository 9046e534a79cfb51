"""Adversarial and ordinary tests of the code sandbox (afm.tools.sandbox, afm.tools.execution.run_python) and of its
warm pool
(afm.tools.pool.run_warm), under bwrap and in the rlimits fallback.

Tests taking the ``mode`` fixture run four times: under bwrap and in the rlimits fallback,
each through the warm pool (run() fills it first and checks that the run used it) and cold
(pool disabled).  After every run the tests check that no process of any sandbox uid is left
but those of the idle sandboxes this process's pool holds, so they assume that nothing else
(e.g. bench_sandbox.py) uses the sandbox on this machine meanwhile.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter
from pathlib import Path

import pytest

import afm.tools.pool as pool
import afm.tools.code_tool as pool_tool
import afm.tools.sandbox as sandbox
import afm.tools.execution as sandbox_run
from afm.tools.pool import run_warm
from afm.tools.code_tool import code_blocks
from afm.tools.execution import ExecResult, run_python

MARGIN_S = 3.0  # a run must end within its timeout plus this
HOST_FILE = Path(__file__).resolve().parents[1] / "README.md"  # the repository, which the sandbox must not see
BWRAP_USABLE = sandbox_run.sandbox_info()["isolation"] == "bwrap"
needs_bwrap = pytest.mark.skipif(not BWRAP_USABLE, reason="bubblewrap is not usable here")
pytestmark = pytest.mark.filterwarnings("ignore:SANDBOX DEGRADED")


# --- helpers -----------------------------------------------------------------------------


def pool_held() -> tuple[set[int], set[str]]:
    """uids and workdirs of the sandboxes this process's warm pool holds now."""
    boxes = pool.pool_status()["sandboxes"]
    return {box["uid"] for box in boxes}, {box["workdir"] for box in boxes}


def sandbox_processes() -> list[tuple[int, int, str]]:
    """(pid, uid, name) of every live process of a sandbox uid, except the idle ones of the warm pool and those of a uid
    another process leases now (another test worker's or an RL run's sandboxes): a leftover of this process's runs keeps
    a uid whose lease this process has given back."""
    held = pool_held()[0]
    others = leased_by_others()
    found = all_sandbox_processes()
    held |= pool_held()[0]  # a sandbox the pool launched during the scan
    return [process for process in found if process[1] not in held and process[1] not in others]


def leased_by_others() -> set[int]:
    """The sandbox uids whose lease (a flock on the uid's lock file) another process holds now, read from
    /proc/locks."""
    lock_dir = Path(sandbox._lock_dir())
    slots = {}
    for path in lock_dir.iterdir():
        try:
            slots[path.stat().st_ino] = int(path.name)
        except (OSError, ValueError):
            continue
    others = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[4] == str(os.getpid()):
            continue  # a waiter ("->"), another kind of lock, or this process's own lease
        slot = slots.get(int(fields[5].rsplit(":", 1)[-1]))
        if slot is not None:
            others.add(sandbox.UID_BASE + slot)
    return others


def all_sandbox_processes() -> list[tuple[int, int, str]]:
    """(pid, uid, name) of every live process owned by a sandbox uid, read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            lines = Path(f"/proc/{entry}/status").read_text().splitlines() if entry.isdigit() else []
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
        if not fields or fields["State"].startswith(("Z", "X")):
            continue
        uid = int(fields["Uid"].split()[0])
        if sandbox.UID_BASE <= uid < sandbox.UID_BASE + sandbox.UID_SLOTS:
            found.append((int(entry), uid, fields["Name"]))
    return found


def run(code: str, **kwargs) -> ExecResult:
    """run_warm after filling the pool for it, asserting that it used the pool if on, ended in time, left nothing."""
    warm = pool.warm_up(kwargs.get("timeout_s", 5.0), kwargs.get("memory_mb", 1024)) > 0
    start = time.monotonic()
    result = run_warm(code, **kwargs)
    elapsed = time.monotonic() - start
    assert elapsed < kwargs.get("timeout_s", 5.0) + MARGIN_S, result
    assert result.wall_s <= elapsed
    assert result.warm == warm, result
    assert sandbox_processes() == [], result
    return result


def run_json(code: str, **kwargs) -> dict:
    """Run code that prints one JSON document; return it."""
    result = run(code, **kwargs)
    assert result.status == "ok", result
    return json.loads(result.stdout)


@pytest.fixture(params=itertools.product(["bwrap", "rlimits"], ["warm", "cold"]), ids="-".join)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test taking this runs under bwrap and in the rlimits fallback, via the warm pool and cold."""
    isolation, start = request.param
    if isolation == "bwrap" and not BWRAP_USABLE:
        pytest.skip("bubblewrap is not usable here")
    monkeypatch.setenv("AFM_SANDBOX", isolation)
    monkeypatch.setenv("AFM_SANDBOX_POOL", str(pool.POOL_SIZE) if start == "warm" else "0")
    pool.warm_up()
    return isolation


@pytest.fixture(params=["bwrap", "rlimits"])
def isolation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test taking this runs under bwrap and in the rlimits fallback, with the default pool."""
    if request.param == "bwrap" and not BWRAP_USABLE:
        pytest.skip("bubblewrap is not usable here")
    monkeypatch.setenv("AFM_SANDBOX", request.param)
    monkeypatch.delenv("AFM_SANDBOX_POOL", raising=False)
    return request.param


@pytest.fixture
def bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Force bubblewrap."""
    if not BWRAP_USABLE:
        pytest.skip("bubblewrap is not usable here")
    monkeypatch.setenv("AFM_SANDBOX", "bwrap")


@pytest.fixture
def rlimits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Force the rlimits fallback."""
    monkeypatch.setenv("AFM_SANDBOX", "rlimits")


# --- attacks -----------------------------------------------------------------------------

FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


def test_fork_bomb_is_contained(mode: str) -> None:
    counts: list[int] = []
    done = threading.Event()

    def sample() -> None:
        """Record the largest process count of one uid, until shortly before the timeout."""
        stop = time.monotonic() + 1.5  # a scan during the clean-up could count processes twice
        while not done.is_set() and time.monotonic() < stop:
            per_uid = Counter(uid for _, uid, _ in sandbox_processes())
            counts.append(max(per_uid.values(), default=0))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = run(FORK_BOMB, timeout_s=2)
    finally:
        done.set()
        sampler.join()
    assert result.status == "timeout"
    assert result.exit_code is None
    assert 1 < max(counts) <= sandbox.MAX_PROCS


@pytest.mark.parametrize(
    ("code", "stdout"),
    [
        ("while True:\n    pass", ""),
        (
            "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU):\n"
            "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass",
            "",
        ),
        ("import time\nprint('started')\ntime.sleep(100)", "started\n"),  # output before the timeout is kept
    ],
    ids=["busy", "ignoring-signals", "sleeping"],
)
def test_endless_code_times_out(mode: str, code: str, stdout: str) -> None:
    result = run(code, timeout_s=1)
    assert (result.status, result.stdout, result.exit_code) == ("timeout", stdout, None)
    assert result.reason == "Timed out after 1 s"
    assert 1 <= result.wall_s < 1 + MARGIN_S


def test_cpu_time_limit(mode: str) -> None:
    code = "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (1, 2))\nwhile True:\n    pass"
    result = run(code, timeout_s=4)
    assert (result.status, result.exit_code) == ("timeout", 152)
    assert result.reason.startswith("CPU time limit exceeded")


@pytest.mark.parametrize(
    "code",
    ["x = bytearray(8 * 1024**3)", "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))"],
    ids=["one-block", "growing"],
)
def test_memory_bomb_is_contained(mode: str, code: str) -> None:
    result = run(code, memory_mb=256)
    assert result.status == "memory", result
    assert result.reason == "Out of memory (limit 256 MB)"
    assert "MemoryError" in result.stderr


@pytest.mark.parametrize(
    "code",
    [
        "import sys\nwhile True:\n    sys.stdout.write('x' * 1_000_000)",
        "import os\nwhile True:\n    os.write(2, b'e' * 65536)",
        "import os, sys\nif os.fork() == 0:\n    while True:\n        sys.stdout.write('c' * 100_000)\nos.wait()",
    ],
    ids=["stdout", "stderr", "child"],
)
def test_output_flood_is_killed(mode: str, code: str) -> None:
    result = run(code, timeout_s=10, max_output_chars=5000)
    assert result.status == "killed"
    assert result.reason == "Killed: output limit exceeded"
    assert result.truncated
    assert len(result.stdout) <= 5000 and len(result.stderr) <= 5000
    assert result.wall_s < 5


WRITE_ATTEMPTS = """
import json, os
outcome = {{}}
for directory in {paths!r}:
    try:
        with open(os.path.join(directory, {name!r}), "w") as f:
            f.write("escaped")
        outcome[directory] = "written"
    except OSError as exc:
        outcome[directory] = type(exc).__name__
with open({name!r}, "w") as f:
    f.write("inside")
outcome["cwd"] = open({name!r}).read()
print(json.dumps(outcome))
"""


def write_attempts(directories: list[str]) -> dict:
    """Try to create a file in each directory from inside the sandbox; check the host too."""
    name = f"afm-escape-{uuid.uuid4().hex}"
    outcome = run_json(WRITE_ATTEMPTS.format(paths=directories, name=name))
    for directory in directories:
        assert not os.path.exists(os.path.join(directory, name)), directory
    assert outcome.pop("cwd") == "inside"
    return outcome


@needs_bwrap
def test_cannot_write_outside_workdir(bwrap: None) -> None:
    directories = ["/", "/var/tmp", "/usr", "/usr/lib", "/etc", "/root", "/work", str(HOST_FILE.parent),
                   "/home", "/dev"]
    outcome = write_attempts(directories)
    assert all(value != "written" for value in outcome.values()), outcome


@needs_bwrap
def test_tmp_is_the_workdir(bwrap: None) -> None:
    name = f"afm-escape-{uuid.uuid4().hex}"
    code = f"import os\nopen('/tmp/{name}', 'w').write('x')\nprint(sorted(os.listdir('.')), os.path.realpath('/tmp'))"
    result = run(code)
    assert result.stdout == f"{sorted(['main.py', name])} /sandbox\n"
    assert not os.path.exists(f"/tmp/{name}")


def test_rlimits_cannot_write_system_directories(rlimits: None) -> None:
    outcome = write_attempts(["/usr", "/usr/lib", "/etc", "/root", str(HOST_FILE.parent), "/"])
    assert all(value == "PermissionError" for value in outcome.values()), outcome


READ_ATTEMPTS = """
import json, os
outcome = {{}}
for path in {paths!r}:
    try:
        outcome[path] = os.listdir(path) if os.path.isdir(path) else open(path).read()
    except OSError as exc:
        outcome[path] = type(exc).__name__
print(json.dumps(outcome))
"""


@needs_bwrap
def test_cannot_read_host_files(bwrap: None, tmp_path: Path) -> None:
    canary = tmp_path / "canary.txt"
    canary.write_text("CANARY-" + uuid.uuid4().hex)
    canary.chmod(0o644)
    paths = [str(HOST_FILE), "/work", "/root", "/home", "/etc/shadow", "/etc/passwd", "/var", str(canary)]
    outcome = run_json(READ_ATTEMPTS.format(paths=paths))
    assert HOST_FILE.exists()
    assert outcome == {path: "FileNotFoundError" for path in paths}


def test_rlimits_cannot_read_private_files(rlimits: None, tmp_path: Path) -> None:
    canary = tmp_path / "canary.txt"
    canary.write_text("CANARY-" + uuid.uuid4().hex)
    canary.chmod(0o600)
    outcome = run_json(READ_ATTEMPTS.format(paths=["/etc/shadow", "/root", str(canary)]))
    assert set(outcome.values()) == {"PermissionError"}, outcome


ENV_SNOOP = """
import glob, os
print(dict(os.environ))
for path in glob.glob("/proc/*/environ") + glob.glob("/proc/*/cmdline"):
    try:
        print(path, open(path, "rb").read())
    except OSError as exc:
        print(path, type(exc).__name__)
"""


def test_parent_environment_is_invisible(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "afm-secret-" + uuid.uuid4().hex
    monkeypatch.setenv("AFM_TEST_SECRET", secret)
    result = run(ENV_SNOOP)
    assert result.status == "ok", result
    assert "/proc/self/environ" in result.stdout
    assert secret not in result.stdout + result.stderr
    assert "AFM_TEST_SECRET" not in result.stdout


NETWORK = """
import json, socket
outcome = {{}}
for name, family, kind, address in [
    ("tcp-host-listener", socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", {port})),
    ("tcp-outside", socket.AF_INET, socket.SOCK_STREAM, ("1.1.1.1", 443)),
    ("udp-dns", socket.AF_INET, socket.SOCK_DGRAM, ("8.8.8.8", 53)),
]:
    try:
        with socket.socket(family, kind) as s:
            s.settimeout(2)
            s.connect(address)
            s.send(b"x")
        outcome[name] = "connected"
    except OSError as exc:
        outcome[name] = type(exc).__name__
try:
    socket.getaddrinfo("example.com", 80)
    outcome["dns"] = "resolved"
except OSError as exc:
    outcome["dns"] = type(exc).__name__
outcome["interfaces"] = [name for _, name in socket.if_nameindex()]
print(json.dumps(outcome))
"""


@needs_bwrap
def test_no_network(bwrap: None) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        outcome = run_json(NETWORK.format(port=listener.getsockname()[1]))
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert outcome.pop("interfaces") == ["lo"]
    assert "connected" not in outcome.values() and "resolved" not in outcome.values(), outcome


KILL_PARENT = """
import os, signal
for target in (os.getppid(), {pid}, {witness}, 1):
    for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(target, sig)
        except OSError:
            pass
for attack in (
    lambda: os.killpg(os.getpgid({pid}), signal.SIGKILL),
    lambda: os.killpg(os.getpgid({witness}), signal.SIGKILL),
    lambda: os.kill(-1, signal.SIGKILL),  # everything this process may signal
):
    try:
        attack()
    except OSError:
        pass
print("still here")
"""


def test_cannot_kill_parent_or_host_processes(mode: str) -> None:
    with subprocess.Popen(["sleep", "30"]) as witness:
        try:
            result = run(KILL_PARENT.format(pid=os.getpid(), witness=witness.pid))
            assert witness.poll() is None
        finally:
            witness.kill()
    assert (result.status, result.stdout) == ("ok", "still here\n"), result


DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        if {close}:
            for fd in (0, 1, 2):
                os.close(fd)
        time.sleep(60)
        os._exit(0)
    os._exit(0)
print("parent done")
"""


HOPPER = """
import os
if os.fork() == 0:
    while True:  # fork and let the parent exit: the process keeps moving to a new pid
        try:
            if os.fork():
                os._exit(0)
        except OSError:
            pass
print("parent done")
"""


@pytest.mark.parametrize(
    "code",
    [DAEMON.format(close=True), DAEMON.format(close=False), HOPPER],
    ids=["daemon-closed-stdio", "daemon-holding-stdout", "pid-hopper"],
)
def test_no_orphans_left(mode: str, code: str) -> None:
    result = run(code, timeout_s=10)
    assert result.status == "ok", result
    assert result.stdout == "parent done\n"
    assert result.wall_s < 2


def test_file_size_is_limited(mode: str) -> None:
    code = "with open('big', 'wb') as f:\n    for _ in range(100):\n        f.write(bytes(1 << 20))"
    result = run(code)
    assert result.status == "disk" and result.reason.startswith("Disk full"), result
    assert "File too large" in result.stderr


@needs_bwrap
def test_workdir_size_is_bounded(bwrap: None) -> None:
    # files under the per-file limit, more of them than the working directory holds
    code = f"for i in range({sandbox.WORKDIR_MB // 32 + 2}):\n    open(f'part{{i}}', 'wb').write(bytes(32 << 20))"
    result = run(code, timeout_s=20)
    assert result.status == "disk" and f"at most {sandbox.WORKDIR_MB} MB" in result.reason, result
    assert "No space left on device" in result.stderr


@pytest.mark.parametrize("kind", ["files", "directories"])
def test_file_count_is_bounded(mode: str, kind: str) -> None:
    make = "open(f'f{i}', 'w').close()" if kind == "files" else "os.mkdir(f'd{i}')"
    code = f"import os\ni = 0\nwhile True:\n    {make}\n    i += 1"
    result = run(code, timeout_s=30)
    assert result.status == "disk" and str(sandbox.MAX_FILES) in result.reason, result
    assert result.wall_s < 20


# --- ordinary behaviour ------------------------------------------------------------------


def test_stdout_and_success(mode: str) -> None:
    result = run("print('hello')\nprint('wörld ✓')")
    assert (result.status, result.stdout, result.stderr, result.exit_code) == ("ok", "hello\nwörld ✓\n", "", 0)
    assert result.isolation == mode and not result.truncated and result.reason == ""


def test_stdin_is_fed(mode: str) -> None:
    code = "n = int(input())\nprint(sum(map(int, input().split()[:n])))"
    assert run(code, stdin="3\n1 2 3 4\n").stdout == "6\n"


def test_missing_stdin_is_an_error(mode: str) -> None:
    result = run("input()")
    assert result.status == "error" and "EOFError" in result.stderr


def test_exit_codes(mode: str) -> None:
    result = run("import sys\nprint('partial')\nsys.exit(3)")
    assert (result.status, result.exit_code, result.stdout) == ("error", 3, "partial\n")
    assert result.reason == "Code exited with status 3"


def test_exception(mode: str) -> None:
    result = run("raise ValueError('boom')")
    assert (result.status, result.exit_code) == ("error", 1)
    assert "ValueError: boom" in result.stderr and "main.py" in result.stderr


def test_death_by_signal(mode: str) -> None:
    result = run("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert (result.status, result.exit_code) == ("error", 139)
    assert "SIGSEGV" in result.reason


def test_environment_inside(mode: str) -> None:
    info = run_json(
        "import json, os, sys\n"
        "open('scratch.txt', 'w').write('x')\n"
        "print(json.dumps({'uid': os.getuid(), 'isolated': sys.flags.isolated, 'exe': sys.executable,"
        " 'cwd_files': sorted(os.listdir('.')), 'env': sorted(os.environ)}))"
    )
    assert info["uid"] != 0 and info["isolated"] == 1 and info["exe"] == "/usr/bin/python3"
    assert info["cwd_files"] == ["main.py", "scratch.txt"]
    assert set(info["env"]) <= {"PATH", "LANG", "HOME", "TMPDIR", "USER", "PWD", "LC_CTYPE"}


def workdirs() -> set[str]:
    """The sandbox workdirs in the temporary directory, but those of this process's pool."""
    held = pool_held()[1]
    found = {str(path) for path in Path(tempfile.gettempdir()).glob("afm-sbx-*")}
    return found - held - pool_held()[1]


def test_workdir_is_removed(mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a temporary directory of its own: other processes on the machine (a pytest worker, a background run) make and
    # remove their sandboxes' workdirs in the shared one meanwhile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = workdirs()
    run("open('left.txt', 'w').write('x')")
    assert workdirs() == before


def test_truncation_keeps_head_and_tail(mode: str) -> None:
    result = run("print('HEAD' + 'a' * 50_000 + 'TAIL')", max_output_chars=1000)
    assert result.status == "ok" and result.truncated
    assert len(result.stdout) <= 1000
    assert result.stdout.startswith("HEAD") and result.stdout.endswith("TAIL\n")
    assert "characters truncated" in result.stdout


def test_concurrent_runs_get_their_own_uid(mode: str) -> None:
    code = "import os, time\ntime.sleep(0.5)\nprint(os.getuid())"
    results: list[ExecResult] = []
    threads = [threading.Thread(target=lambda: results.append(run_warm(code))) for _ in range(2)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.monotonic() - start < 1.5
    assert [r.status for r in results] == ["ok", "ok"]
    assert results[0].stdout != results[1].stdout
    assert sandbox_processes() == []


# --- warm pool ---------------------------------------------------------------------------

STATE = """
import inspect, json, os, resource, sys
limits = ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_CORE")
print(json.dumps({
    "argv": sys.argv, "orig_argv": sys.orig_argv, "file": __file__, "globals": list(globals()),
    "modules": sorted(sys.modules), "stack": len(inspect.stack()), "cwd": sorted(os.listdir(".")),
    "cmdline": open("/proc/self/cmdline", "rb").read().decode(), "env": dict(os.environ),
    "limits": [resource.getrlimit(getattr(resource, name)) for name in limits],
    "init_limits": open("/proc/1/limits").read(), "stdin": [os.fstat(0).st_mode, sys.stdin.seekable()],
}))
"""

PARITY = {
    "stdin": ("import sys\nprint(sys.stdin.read()[::-1], end='')", "olleh\nwörld"),
    "big-code-and-stdin": (
        "x = 1\n" * 20_000 + "import sys\nprint(len(sys.stdin.read()), len(open(__file__).read()))",
        "y" * 300_000,
    ),
    "traceback": ("def f():\n    return 1 / 0\n\nf()", ""),
    "syntax-error": ("x = (\n", ""),
    "exit-code": ("import sys\nprint('partial')\nsys.exit(3)", ""),
    "exit-message": ("import sys\nsys.exit('bye')", ""),
    "keyboard-interrupt": ("raise KeyboardInterrupt", ""),
    "signal": ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", ""),
    "bom": ("\ufeffprint('bom')", ""),
    "interpreter-state": (STATE, ""),
}


def comparable(result: ExecResult) -> tuple:
    """What must be the same for a warm and a cold run (the rlimits workdir has a random name)."""
    anonymous = functools.partial(re.sub, r"afm-sbx-[^/]+", "afm-sbx-*")
    return result.status, anonymous(result.stdout), anonymous(result.stderr), result.exit_code, result.reason


@pytest.mark.parametrize(("code", "stdin"), PARITY.values(), ids=PARITY.keys())
def test_warm_run_matches_cold(isolation: str, monkeypatch: pytest.MonkeyPatch, code: str, stdin: str) -> None:
    warm = run(code, stdin=stdin)
    monkeypatch.setenv("AFM_SANDBOX_POOL", "0")
    cold = run(code, stdin=stdin)
    assert (warm.warm, cold.warm) == (True, False)
    assert comparable(warm) == comparable(cold)


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_idle_pool_sandbox_uses_no_cpu(isolation: str) -> None:
    assert pool.warm_up(timeout_s=1) == pool.POOL_SIZE  # RLIMIT_CPU of 2 s, fixed at launch
    held = pool_held()[0]
    waiting = [(pid, name) for pid, uid, name in all_sandbox_processes() if uid in held]
    assert {name for _, name in waiting} <= {"bwrap", "python3"}
    before = {pid: cpu_ticks(pid) for pid, _ in waiting}
    time.sleep(0.5)
    assert {pid: cpu_ticks(pid) for pid, _ in waiting} == before  # blocked on the FIFO: its CPU limit never runs out
    assert {Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] for pid, _ in waiting} == {"S"}
    assert run("print('still fine')", timeout_s=1).stdout == "still fine\n"


def test_consecutive_runs_get_fresh_sandboxes(mode: str) -> None:
    code = "import os\nprint(sorted(os.listdir('.')))\nopen('left-behind', 'w').write('x')"
    for _ in range(3):
        assert run(code).stdout == "['main.py']\n"


def test_live_sandboxes_never_share_a_uid(mode: str) -> None:
    results: list[ExecResult] = []
    thread = threading.Thread(target=lambda: results.append(run_warm("import time\ntime.sleep(0.4)")))
    thread.start()
    time.sleep(0.2)
    held = [box["uid"] for box in pool.pool_status()["sandboxes"]]
    running = {uid for _, uid, _ in sandbox_processes()}
    thread.join()
    assert results[0].status == "ok"
    assert len(running) == 1 and not running & set(held)
    assert len(set(held)) == len(held)


def test_concurrent_runs(mode: str) -> None:
    # each run reports when it ran, from inside the sandbox: runs that overlapped there held their uids at the same time
    code = ("import os, sys, time\nt0 = time.time()\ntime.sleep(0.02)\nprint(os.getuid(), "
            "sys.stdin.read(), t0, time.time())")
    calls: list[tuple[float, float, str, ExecResult]] = []

    def worker(n: int) -> None:
        """Five runs, one after the other."""
        for i in range(5):
            start = time.monotonic()
            result = run_warm(code, stdin=f"{n}.{i}")
            calls.append((start, time.monotonic(), f"{n}.{i}", result))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 40
    for _, _, stdin, result in calls:
        assert (result.status, result.stdout.split()[1]) == ("ok", stdin), result
    ran = [(int(uid), float(t0), float(t1)) for uid, _, t0, t1 in (result.stdout.split() for *_, result in calls)]
    overlapping = [(a, b) for a, b in itertools.combinations(ran, 2) if a[1] < b[2] and b[1] < a[2]]
    assert overlapping and all(a[0] != b[0] for a, b in overlapping)  # runs that overlapped had their own uids
    assert any(result.warm for *_, result in calls) == (os.environ["AFM_SANDBOX_POOL"] != "0")
    assert sandbox_processes() == []


def test_pool_disabled_by_env(isolation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert pool.warm_up() == pool.POOL_SIZE
    monkeypatch.setenv("AFM_SANDBOX_POOL", "0")
    assert run("print(1)").stdout == "1\n"  # run() checks that it ran cold
    assert pool.pool_status() == {"size": 0, "sandboxes": []}
    monkeypatch.setenv("AFM_SANDBOX_POOL", "many")
    with pytest.raises(ValueError, match="AFM_SANDBOX_POOL"):
        run_warm("print(1)")


@needs_bwrap
def test_sandbox_of_another_kind_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AFM_SANDBOX_POOL", raising=False)
    monkeypatch.setenv("AFM_SANDBOX", "bwrap")
    assert pool.warm_up() == pool.POOL_SIZE
    monkeypatch.setenv("AFM_SANDBOX", "rlimits")
    switched = run_warm("import os\nprint(os.path.exists('/sandbox'))")
    assert (switched.isolation, switched.warm, switched.stdout) == ("rlimits", False, "False\n")
    code = "import resource\nprint(resource.getrlimit(resource.RLIMIT_CPU), resource.getrlimit(resource.RLIMIT_AS))"
    assert pool.warm_up(timeout_s=2, memory_mb=300) == pool.POOL_SIZE
    other_limits = run_warm(code)
    assert (other_limits.warm, other_limits.stdout) == (False, "(6, 7) (1073741824, 1073741824)\n")
    result = run(code, timeout_s=2, memory_mb=300)
    assert result.stdout == f"(3, 4) ({300 << 20}, {300 << 20})\n"


def test_killed_pool_sandbox_is_replaced(isolation: str) -> None:
    assert pool.warm_up() == pool.POOL_SIZE
    held = pool_held()[0]
    for pid, uid, name in all_sandbox_processes():
        if uid in held and name == "python3":
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    result = run_warm("print('cold')")
    assert (result.status, result.stdout, result.warm) == ("ok", "cold\n", False)
    assert run("print('warm')").stdout == "warm\n"  # run() checks that the refilled pool ran it


def test_source_declaring_another_encoding_runs_as_written(isolation: str) -> None:
    assert pool.warm_up() == pool.POOL_SIZE
    result = run_warm("# -*- coding: latin-1 -*-\nprint(len('é'))")  # the text is UTF-8: the cookie must not garble it
    assert (result.status, result.stdout) == ("ok", "1\n")
    assert sandbox_processes() == []


def test_run_python_is_cold_whatever_was_imported(isolation: str) -> None:
    """The pool is the caller's choice. Importing afm.tools.pool (this module does) or afm.tasks.grading (which used
    to import the
    pool only for its side effect) once made every run_python of the process use the pool; now run_python starts its
    own sandbox while the pool is full, and only a caller that passes the pool (run_warm) gets one of its sandboxes."""
    import afm.tasks.grading  # noqa: F401  (imported for what it might do to run_python)
    assert pool.warm_up() == pool.POOL_SIZE
    held = pool_held()[0]
    plain = run_python("import os\nprint(os.getuid())")
    assert (plain.status, plain.warm) == ("ok", False)
    assert pool_held()[0] == held  # no sandbox of the pool was taken
    given = run_python("print('given')", pool=pool.use_pool())
    assert (given.stdout, given.warm) == ("given\n", True)
    assert run("print('warm')").stdout == "warm\n"  # run() checks that run_warm was served by the pool
    assert sandbox_processes() == []


def test_code_tool_runs_in_the_warm_pool(isolation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `code` tool's default runner is run_warm: a toolbox that does not choose (the teacher's, a rollout's) gets
    the pool."""
    from afm.tools.toolbox import Toolbox
    served: list[bool] = []

    def watched(*args, **kwargs) -> ExecResult:
        result = pool.run_warm(*args, **kwargs)
        served.append(result.warm)
        return result

    monkeypatch.setattr(pool_tool, "run_warm", watched)
    assert pool.warm_up() == pool.POOL_SIZE
    call = Toolbox().session("q").call("code", "```python\nprint(6 * 7)\n```")
    assert call.status == "ok" and "42" in call.observation and served == [True]
    cold = Toolbox([pool_tool.CodeConfig(runner=run_python)]).session("q").call("code", "```python\nprint(1)\n```")
    assert cold.status == "ok" and served == [True]  # a toolbox that chose run_python runs cold, past the pool
    assert sandbox_processes() == []


FORKING = """
import atexit, json, os, sys, time


def leftovers() -> None:
    # registered first, so it runs after the pool's atexit handler: which sandbox files are still open
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the descriptor listdir used
            pass
    print(json.dumps({"pid": os.getpid(), "open": [name for name in names if "afm-" in name]}), flush=True)


atexit.register(leftovers)
import afm.tools.pool as pool

assert pool.warm_up() == 2
child = os.fork()
if child == 0:  # gets a new pool of its own, and holds what it inherited for a second
    result = pool.run_warm("print('child')")
    print(json.dumps({"child": [result.stdout, result.warm]}), flush=True)
    time.sleep(1)
    sys.exit(0)
start = time.monotonic()
result = pool.run_warm("print('parent')")
print(json.dumps({"parent": [result.stdout, result.warm, result.status, time.monotonic() - start]}), flush=True)
os.waitpid(child, 0)
"""


def test_fork_and_exit(isolation: str) -> None:
    script = FORKING
    # its workdirs apart from other processes' on this machine (a short path: sockets live there)
    tmp = Path(tempfile.mkdtemp(prefix="fork-"))
    tmp.chmod(0o1777)  # like /tmp: the sandbox's own user passes through it
    env = {**os.environ, "AFM_SANDBOX_POOL": "2", "TMPDIR": str(tmp)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    parent = next(line["parent"] for line in lines if "parent" in line)
    assert parent[:3] == ["parent\n", True, "ok"] and parent[3] < 1  # the child kept none of its FIFOs open
    assert next(line["child"] for line in lines if "child" in line) == ["child\n", False]
    assert [line["open"] for line in lines if "open" in line] == [[], []]  # child and parent, after atexit
    assert sandbox_processes() == []
    assert list(tmp.glob("afm-sbx-*")) == []  # parent and child removed every workdir they made
    shutil.rmtree(tmp)  # and the locks folder every sandbox user shares


# --- observation -------------------------------------------------------------------------


def make(status: str = "ok", stdout: str = "", stderr: str = "", reason: str = "") -> ExecResult:
    """An ExecResult with defaults for the fields observation() ignores."""
    return ExecResult(status, stdout, stderr, 0 if status == "ok" else None, 0.1, False, "bwrap", reason)


def test_observation_success() -> None:
    expected = "[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n42\n[STDOUT:END]"
    assert make(stdout="42\n").observation() == expected


def test_observation_success_with_stderr() -> None:
    text = make(stdout="1\n", stderr="warning\n").observation()
    assert text == (
        "[EXECUTED] Code exited with status 0.\n[STDOUT:BEGIN]\n1\n[STDOUT:END]\n[STDERR:BEGIN]\nwarning\n[STDERR:END]"
    )


def test_observation_failure() -> None:
    text = make("error", "", "Traceback\nZeroDivisionError\n", "Code exited with status 1").observation()
    assert text == (
        "[FAILED] Code exited with status 1.\n[STDOUT:BEGIN]\n\n[STDOUT:END]\n"
        "[STDERR:BEGIN]\nTraceback\nZeroDivisionError\n[STDERR:END]"
    )


def test_observation_of_real_failures(mode: str) -> None:
    assert run("while True: pass", timeout_s=0.5).observation().startswith("[FAILED] Timed out after 0.5 s.\n")
    assert (
        run("x = bytearray(2**33)", memory_mb=128).observation().startswith("[FAILED] Out of memory (limit 128 MB).\n")
    )
    flood = run("while True: print('y' * 10_000)").observation()
    assert flood.startswith("[FAILED] Killed: output limit exceeded.\n")


def test_observation_is_clipped_keeping_structure() -> None:
    text = make("error", "o" * 30_000 + "END", "e" * 500 + "LAST", "Code exited with status 1").observation()
    assert 1400 <= len(text) <= sandbox_run.OBSERVATION_CHARS + 10
    for marker in ("[STDOUT:BEGIN]", "[STDOUT:END]", "[STDERR:BEGIN]", "[STDERR:END]"):
        assert marker in text
    assert "END\n[STDOUT:END]" in text and "e" * 500 + "LAST" in text
    cut = int(re.search(r"\[\.\.\. (\d+) characters truncated \.\.\.\]", text).group(1))
    body = text.split("[STDOUT:BEGIN]\n")[1].split("\n[STDOUT:END]")[0]
    assert cut + body.count("o") + len("END") == 30_003


def test_observation_counts_what_the_stream_already_cut(mode: str) -> None:
    result = run("print('z' * 100_000)")
    assert "[... 98" in result.observation()  # 100,001 characters, about 1,400 shown


# --- code_blocks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("```python\nprint(1)\n```", ("print(1)\n", "")),
        ("```py\nx = input()\nprint(x)\n```\n```sh\n5\n```", ("x = input()\nprint(x)\n", "5\n")),
        ("```\nprint(2)\n```", ("print(2)\n", "")),
        ("print(3)", ("print(3)\n", "")),
        ("```python\nprint(4)", ("print(4)\n", "")),
        ("```python\nprint(input())\n```sh\nhi", ("print(input())\n", "hi\n")),
        ("<code>\n```python\nprint(5)\n```\n</code>", ("print(5)\n", "")),
        ("  ```python\n  def f():\n      return 6\n  print(f())\n  ```", ("def f():\n    return 6\nprint(f())\n", "")),
        ("print(input())\n```sh\n7\n8\n```", ("print(input())\n", "7\n8\n")),
        ("```python\nprint(9)\n```\n```sh\n```", ("print(9)\n", "")),
        ("print(10)\n```", ("print(10)\n", "")),
        ("", ("", "")),
    ],
    ids=[
        "python",
        "py+sh",
        "unlabelled",
        "bare",
        "unclosed",
        "unclosed-before-sh",
        "code-tags",
        "indented",
        "bare+sh",
        "empty-sh",
        "stray-fence",
        "empty",
    ],
)
def test_code_blocks(text: str, expected: tuple[str, str]) -> None:
    assert code_blocks(text) == expected


def test_code_blocks_feed_run_python(mode: str) -> None:
    code, stdin = code_blocks("```python\na, b = map(int, input().split())\nprint(a * b)\n```\n```sh\n6 7\n```")
    assert run(code, stdin=stdin).stdout == "42\n"


def test_code_blocks_rejects_non_text() -> None:
    with pytest.raises(TypeError, match="text"):
        code_blocks(None)  # type: ignore[arg-type]


# --- arguments and configuration ---------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"code": 123}, TypeError, "code"),
        ({"code": b"print(1)"}, TypeError, "code"),
        ({"stdin": None}, TypeError, "stdin"),
        ({"timeout_s": -1}, ValueError, "timeout_s"),
        ({"timeout_s": 0}, ValueError, "timeout_s"),
        ({"timeout_s": float("nan")}, ValueError, "timeout_s"),
        ({"timeout_s": "5"}, TypeError, "timeout_s"),
        ({"memory_mb": 0}, ValueError, "memory_mb"),
        ({"memory_mb": 512.5}, TypeError, "memory_mb"),
        ({"max_output_chars": 0}, ValueError, "max_output_chars"),
        ({"max_output_chars": True}, TypeError, "max_output_chars"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, error: type, name: str) -> None:
    arguments = {"code": "print(1)", **kwargs}
    with pytest.raises(error, match=name):
        run_python(**arguments)


def test_bad_isolation_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AFM_SANDBOX", "docker")
    with pytest.raises(ValueError, match="AFM_SANDBOX"):
        run_python("print(1)")


def test_exec_result_rejects_unknown_status() -> None:
    with pytest.raises(ValueError, match="status"):
        make("crashed")


@needs_bwrap
def test_sandbox_info(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AFM_SANDBOX", raising=False)
    info = sandbox_run.sandbox_info()
    assert info["isolation"] == "bwrap" and "namespaces" in info["reason"]
    monkeypatch.setenv("AFM_SANDBOX", "rlimits")
    assert sandbox_run.sandbox_info()["isolation"] == "rlimits"


def test_fallback_warns_once(rlimits: None, caplog: pytest.LogCaptureFixture) -> None:
    sandbox_run._warn_fallback.cache_clear()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, logger="sandbox"):
        warnings.simplefilter("always")
        for _ in range(2):
            assert run("print(1)").isolation == "rlimits"
    assert [str(w.message).startswith("SANDBOX DEGRADED") for w in caught] == [True]
    assert [r.getMessage().startswith("SANDBOX DEGRADED") for r in caplog.records] == [True]


def test_missing_bwrap_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda name, **kw: None if name == "bwrap" else real_which(name, **kw))
    monkeypatch.delenv("AFM_SANDBOX", raising=False)
    sandbox._bwrap_check.cache_clear()
    try:
        info = sandbox_run.sandbox_info()
        assert (info["isolation"], info["reason"]) == ("rlimits", "bubblewrap (bwrap) is not installed")
        with pytest.warns(RuntimeWarning, match="not installed"):
            assert run("print(1)").isolation == "rlimits"
        monkeypatch.setenv("AFM_SANDBOX", "bwrap")
        with pytest.raises(RuntimeError, match="not installed"):
            run_python("print(1)")
    finally:
        sandbox._bwrap_check.cache_clear()


@pytest.mark.skipif(not os.environ.get("CI"), reason="CI installs bubblewrap through the Makefile")
def test_ci_runs_the_real_sandbox() -> None:
    """In CI the adversarial tests above must have run under bubblewrap, not been skipped."""
    assert BWRAP_USABLE, sandbox_run.sandbox_info()

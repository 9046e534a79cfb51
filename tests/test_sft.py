"""`afm sft` as a user runs it: a run killed mid-way and resumed, and a run on two processes."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

AFM = str(Path(sys.executable).with_name("afm"))
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    "A small tiny model folder, rows of the worked examples in the distilled layout, and a profile of its own."
    from afm.coa import examples, render
    from afm.prompts import system_prompt
    from afm.models import save_model, tiny_chat_model
    tmp = tmp_path_factory.mktemp("sft")
    save_model(*tiny_chat_model(), tmp / "model")
    kinds = {"web": "qa", "code": "code", "math": "math"}
    with (tmp / "rows.jsonl").open("w") as f:
        for _ in range(4):
            for name, traj in examples().items():
                f.write(json.dumps({"kind": kinds[name], "messages": [
                    {"role": "system", "content": system_prompt(kinds[name])}, {"role": "user", "content": traj.question},
                    {"role": "assistant", "content": render(traj)}]}) + "\n")
    (tmp / "settings.ini").write_text("[quick]\ndescription = test\nsft_learning_rate = 0.003\nsft_batch_size = 1\nsft_val_fraction = 0.0\n")
    return tmp


def _cmd(setup, out, *extra):
    return [AFM, "sft", "--profile", "quick", "--settings", str(setup / "settings.ini"), "--model", str(setup / "model"),
            "--data", str(setup / "rows.jsonl"), "--out", str(out), *extra]


def _losses(out):
    return {h["step"]: h["loss"] for h in json.loads((out / "log.json").read_text()) if "loss" in h}


def test_a_killed_run_resumes_and_finishes_like_an_uninterrupted_one(setup):
    from afm.sft import ELAPSED, SFTArgs, train_sft
    steps = ["--max_steps", "12", "--save_steps", "4"]
    ref = train_sft(setup / "rows.jsonl", setup / "whole", SFTArgs(model=str(setup / "model"), max_steps=12, save_steps=4,
                    learning_rate=0.003, batch_size=1, val_fraction=0.0), progress=False)  # the same settings, uninterrupted
    out = setup / "killed"
    proc = subprocess.Popen(_cmd(setup, out, *steps), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    mark = out / "checkpoints" / "checkpoint-4" / ELAPSED  # written after the rest of the checkpoint
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not mark.is_file() and proc.poll() is None: time.sleep(0.05)
    proc.send_signal(signal.SIGKILL); proc.wait()
    assert mark.is_file() and not (out / "sft.json").exists()  # killed after a checkpoint, before the end
    again = subprocess.run(_cmd(setup, out, *steps), capture_output=True, text=True, env=ENV, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    done = json.loads((out / "sft.json").read_text())
    assert done["resumed_from"].startswith("checkpoint-") and done["steps"] == ref["steps"] == 12
    before = json.loads((out / "checkpoints" / done["resumed_from"] / ELAPSED).read_text())["seconds"]
    assert 0 < done["resumed_seconds"] == round(before, 1) < done["train_seconds"]  # the killed process's seconds are counted
    a, b = _losses(out), _losses(setup / "whole")
    assert max(a) == 12 and all(abs(a[s] - b[s]) < 1e-4 * max(1.0, abs(b[s])) for s in a), (a, b)  # the same run, resumed
    assert abs(done["final_train_loss"] - ref["final_train_loss"]) < 1e-4 * max(1.0, ref["final_train_loss"])


def test_two_processes_end_with_the_same_weights(setup):
    from afm.models import load
    from afm.sft import _digest
    out = setup / "ddp"
    cmd = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", *_cmd(setup, out, "--max_steps", "4", "--save_steps", "4")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    done = json.loads((out / "sft.json").read_text())
    ranks = [(out / f"rank{i}.sha256").read_text() for i in range(2)]
    assert done["world_size"] == 2 and done["steps"] == 4 and ranks[0] == ranks[1]
    assert ranks[0] != _digest(load(str(setup / "model"))[0]) == _digest(load(str(setup / "model"))[0])  # trained, deterministic digest


@pytest.mark.parametrize("args, says", [
    (["--data", "/nonexistent/rows"], "/nonexistent/rows: no such SFT data"),
    (["--batch_size", "0"], "batch_size must be a whole number in [1, inf)"),
])
def test_bad_input_is_one_clear_line(setup, args, says):
    r = subprocess.run([*_cmd(setup, setup / "bad"), *args], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_profile_key_of_the_wrong_type_is_named(setup, tmp_path):
    (tmp_path / "s.ini").write_text("[quick]\nsft_learning_rate = fast\n")
    r = subprocess.run([AFM, "sft", "--profile", "quick", "--settings", str(tmp_path / "s.ini"), "--data", str(setup / "rows.jsonl")],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 1 and "sft_learning_rate = 'fast' should be a number" in r.stderr, r.stderr


def test_bench_sft_refuses_bad_input_in_one_line(setup):
    "The benchmark itself runs in the chapter (`bench_sft`); here, its command's checks before anything loads."
    for argv, says in ((["--rows", "1"], "--rows must be at least 2"), (["--data", "/nonexistent/rows", "--model", str(setup / "model")],
                                                                         "/nonexistent/rows: no such SFT data")):
        bad = subprocess.run([AFM, "bench", "sft", *argv], capture_output=True, text=True, env=ENV, timeout=120)
        last = bad.stderr.strip().splitlines()[-1]  # argparse prints its usage above the error; the error itself is one line
        assert bad.returncode in (1, 2) and says in last and "Traceback" not in bad.stderr, bad.stderr

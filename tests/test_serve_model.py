"""`afm serve model` as a user runs it: a real process on a free port, real HTTP, and clear one-line errors."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

AFM = str(Path(sys.executable).with_name("afm"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    "What `afm sft` saves: a tiny model fine-tuned with LoRA for two steps on the worked CoA examples, the adapters merged."
    from afm.coa import examples, render
    from afm.prompts import system_prompt
    from afm.models import build_tiny, TinyConfig, tiny_texts
    from afm.sft import SFTArgs, train_sft
    tmp = tmp_path_factory.mktemp("m")
    base = build_tiny(TinyConfig(vocab_size=600, hidden_size=32, layers=1, heads=2, kv_heads=1, context=2048), tiny_texts(limit=100), tmp / "tiny")
    kinds = {"web": "qa", "code": "code", "math": "math"}
    rows = [{"kind": kinds[n], "messages": [{"role": "system", "content": system_prompt(kinds[n])}, {"role": "user", "content": t.question},
                                             {"role": "assistant", "content": render(t)}]} for n, t in examples().items()]
    args = SFTArgs(model=str(base), max_steps=2, batch_size=1, max_length=2048, val_fraction=0.0, lora=True, lora_r=4, lora_alpha=8)
    train_sft(rows, tmp / "sft", args, progress=False)
    return tmp / "sft" / "model"


def test_serves_a_model_folder_over_http(tiny_folder):
    proc = subprocess.Popen([AFM, "serve", "model", "--model", str(tiny_folder), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving ") and "/v1" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split(" at ")[1].strip().removesuffix("/v1")
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["object"] == "model"
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
        body = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).json()
        assert body["usage"]["completion_tokens"] >= 1 and body["choices"][0]["finish_reason"] in ("stop", "length")
        comp = httpx.post(f"{url}/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 4, "return_token_ids": True}, timeout=60).json()
        assert len(comp["choices"][0]["token_ids"]) == comp["usage"]["completion_tokens"]
        bad = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "temperature": "hot"})
        assert bad.status_code == 400 and "temperature" in bad.json()["error"]["message"]
        events = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 4, "stream": True}, timeout=60).text
        assert events.rstrip().endswith("data: [DONE]") and json.loads(events.split("\n")[0][6:])["object"] == "text_completion"
        assert httpx.get(f"{url}/health").json()["status"] == "ok"  # still up after the bad request
    finally:
        proc.terminate(); proc.wait(10)


@pytest.mark.parametrize("args, says", [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--model", "/nonexistent/folder"], "model folder /nonexistent/folder does not exist"),
    (["--model", "tiny", "--port", "99999"], "--port must be 0-65535"),
])
def test_bad_input_is_one_clear_line(args, says):
    t0 = time.monotonic()
    r = subprocess.run([AFM, "serve", "model", *args], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert time.monotonic() - t0 < 60


def test_a_corrupt_folder_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{broken")
    r = subprocess.run([AFM, "serve", "model", "--model", str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and str(tmp_path) in r.stderr and "not a loadable model folder" in r.stderr, r.stderr

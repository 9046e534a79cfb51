"""`afm serve model` as a user runs it: a real process on a free port, real HTTP, and clear one-line errors; and the
server as the official `openai` client sees it."""
import importlib.util
import json
import os
import subprocess
import time

import httpx
import pytest
from huggingface_hub import try_to_load_from_cache
from conftest import AFM, ENV



@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """What `afm sft` saves: a tiny model fine-tuned with LoRA for two steps on the worked CoA examples, the adapters
    merged."""
    from afm.format.coa import examples, render
    from afm.tools.prompts import system_prompt
    from afm.models.catalog import build_tiny, TinyConfig, tiny_texts
    from afm.sft.trainer import SFTArgs, train_sft
    tmp = tmp_path_factory.mktemp("m")
    base = build_tiny(TinyConfig(vocab_size=600, hidden_size=32, layers=1, heads=2, kv_heads=1, context=2048),
                      tiny_texts(limit=100), tmp / "tiny")
    kinds = {"web": "qa", "code": "code", "math": "math"}
    rows = [{"kind": kinds[n], "messages": [{"role": "system", "content": system_prompt(kinds[n])},
                                            {"role": "user", "content": t.question},
                                            {"role": "assistant", "content": render(t)}]}
            for n, t in examples().items()]
    args = SFTArgs(model=str(base), max_steps=2, batch_size=1, max_length=2048, val_fraction=0.0, lora=True, lora_r=4,
                   lora_alpha=8)
    train_sft(rows, tmp / "sft", args, progress=False)
    return tmp / "sft" / "model"


def test_serves_a_model_folder_over_http(tiny_folder):
    proc = subprocess.Popen([AFM, "serve", "model", "--model", str(tiny_folder), "--port", "0", "--max-body-mb", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving ") and "/v1" in line, (line,
                                                               proc.stderr.read() if proc.poll() is not None else "")
        url = line.split(" at ")[1].strip().removesuffix("/v1")
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["object"] == "model"
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
        body = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).json()
        assert body["usage"]["completion_tokens"] >= 1 and body["choices"][0]["finish_reason"] in ("stop", "length")
        comp = httpx.post(f"{url}/v1/completions",
                          json={"prompt": [5, 6, 7], "max_tokens": 4, "return_token_ids": True}, timeout=60).json()
        assert len(comp["choices"][0]["token_ids"]) == comp["usage"]["completion_tokens"]
        bad = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "temperature": "hot"})
        assert bad.status_code == 400 and "temperature" in bad.json()["error"]["message"]
        events = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 4, "stream": True},
                            timeout=60).text
        assert (events.rstrip().endswith("data: [DONE]")
                and json.loads(events.split("\n")[0][6:])["object"] == "text_completion")
        big = httpx.post(f"{url}/v1/completions", json={"prompt": "x" * 1_200_000}, timeout=60)
        assert big.status_code == 413 and "1,048,576 bytes" in big.json()["error"]["message"]
        assert httpx.get(f"{url}/health").json()["status"] == "ok"  # still up after the bad requests
    finally:
        proc.terminate()
        proc.wait(10)


def test_restarted_on_its_port_it_binds_at_once(tiny_folder):
    "Stopped with a client's connection open (it closes first, so it lingers in TIME_WAIT), it restarts on its port."
    port, url = 0, None
    for _ in range(2):
        proc = subprocess.Popen([AFM, "serve", "model", "--model", str(tiny_folder), "--port", str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        client = httpx.Client()
        try:
            line = proc.stdout.readline()
            assert line.startswith("serving "), (line, proc.stderr.read() if proc.poll() is not None else "")
            url = line.split(" at ")[1].strip().removesuffix("/v1")
            port = int(url.rsplit(":", 1)[1])
            assert client.get(f"{url}/health").json()["status"] == "ok"
        finally:
            proc.terminate()
            proc.wait(10)
            client.close()


def test_serves_bfloat16_on_the_chosen_device_to_the_openai_client(tiny_folder):
    """`--dtype bfloat16 --device cpu` as a GPU user writes `--device cuda`: the line says what runs, the official
    client gets answers."""
    openai = pytest.importorskip("openai")  # the `dev` extra
    proc = subprocess.Popen([AFM, "serve", "model", "--model", str(tiny_folder), "--dtype", "bfloat16", "--device",
                             "cpu", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"serving {tiny_folder} with hf on cpu "
                               "in bfloat16 at http://"), (line, proc.stderr.read() if proc.poll() is not None else "")
        client = openai.OpenAI(base_url=line.split(" at ")[1].strip(), api_key="none", max_retries=0, timeout=60)
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Where is Paris?"}],
                                              max_tokens=8, temperature=0)
        assert isinstance(chat.choices[0].message.content, str) and chat.usage.completion_tokens >= 1
        comp = client.completions.create(model="m", prompt=[5, 6, 7], max_tokens=4, temperature=0,
                                         extra_body={"return_token_ids": True})
        assert len(comp.choices[0].token_ids) == comp.usage.completion_tokens >= 1
    finally:
        proc.terminate()
        proc.wait(10)


VLLM = importlib.util.find_spec("vllm") is not None
QWEN_HERE = (os.environ.get("AFM_DOWNLOAD") == "1"
             or isinstance(try_to_load_from_cache("Qwen/Qwen2.5-7B-Instruct", "config.json"), str))


@pytest.mark.parametrize("args, says", [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--model", "/nonexistent/folder"], "model folder /nonexistent/folder does not exist"),
    (["--model", "tiny", "--port", "99999"], "--port must be 0-65535"),
    (["--model", "tiny", "--max-body-mb", "0"], "--max-body-mb must be above 0"),
    (["--model", "tiny", "--max-body-mb", "inf"], "--max-body-mb must be above 0 and finite, got inf"),
    (["--model", "tiny", "--engine", "tgi"], "engine 'tgi' is not one of hf, vllm"),
    (["--model", "tiny", "--dtype", "fp8"], "dtype 'fp8' is not one of auto, float32, bfloat16, float16"),
    (["--model", "tiny", "--device", "cuda:9"], "device 'cuda:9'"),
    (["--model", "tiny", "--device", "tpu"], "device 'tpu'"),
    (["--profile", "paper-web-9b"], "unknown profile 'paper-web-9b'"),
    pytest.param(["--model", "tiny", "--engine", "vllm"], 'engine vllm: vLLM is not installed here; install the gpu '
                 'extra on a machine with an NVIDIA GPU: pip install -e ".[gpu]"',
                 marks=pytest.mark.skipif(VLLM, reason="vLLM is installed here")),
    # the profile's `engine` key, honoured
    pytest.param(["--profile", "paper-web-7b"], "engine vllm: vLLM is not installed",
                 marks=pytest.mark.skipif(VLLM, reason="vLLM is installed here")),
    pytest.param(["--profile", "paper-web-7b", "--engine", "hf", "--device", "cpu"], "model Qwen/Qwen2.5-7B-Instruct "
                                                                                     "is not on this machine",
                 # the profile's model
                 marks=pytest.mark.skipif(QWEN_HERE, reason="Qwen2.5-7B-Instruct is here, or may be downloaded")),
])
def test_bad_input_is_one_clear_line(args, says):
    t0 = time.monotonic()
    r = subprocess.run([AFM, "serve", "model", *args], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert time.monotonic() - t0 < 60


def test_a_corrupt_folder_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{broken")
    r = subprocess.run([AFM, "serve", "model", "--model", str(tmp_path)], capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 2 and str(tmp_path) in r.stderr and "config.json" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# --- the official `openai` client against the server, in process (the tiny chat model; every call over real HTTP)

@pytest.fixture(scope="module")
def client():
    openai = pytest.importorskip("openai")  # the `dev` extra
    from afm.models.engine import TransformersEngine
    from afm.models.backends import EngineBackend
    from afm.tools.llm import serve_in_thread
    from afm.models.catalog import tiny_chat_model
    from afm.models.batching import BatchingEngine
    from afm.models.server import serve_chat
    model, tok = tiny_chat_model()
    server, url = serve_in_thread(serve_chat(EngineBackend(BatchingEngine(TransformersEngine(model, tok)))))
    yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    server.should_exit = True


CHAT = [{"role": "developer", "content": "You are the planner."},
        {"role": "user", "content": [{"type": "text", "text": "Who founded the company?"}]}]


def test_openai_chat(client):
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8, temperature=0, user="me",
                                       presence_penalty=0)
    again = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8, temperature=0)
    assert (r.object == "chat.completion" and isinstance(r.choices[0].message.content, str)
            and r.usage.completion_tokens >= 1)
    assert (r.choices[0].message.content == again.choices[0].message.content
            and r.choices[0].finish_reason in ("stop", "length"))


def test_openai_completions_with_token_ids(client):
    r = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=4, temperature=0,
                                  extra_body={"return_token_ids": True})
    assert (r.object == "text_completion" and len(r.choices[0].token_ids) == r.usage.completion_tokens
            and r.usage.prompt_tokens == 3)


def test_openai_streaming_with_usage(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8, seed=3, stream=True,
                                                 stream_options={"include_usage": True}))
    whole = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8, seed=3)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_openai_n_and_seed(client):
    a = client.completions.create(model="tiny", prompt="Where is Paris?", max_tokens=6, n=3, seed=-7)
    b = client.completions.create(model="tiny", prompt="Where is Paris?", max_tokens=6, n=3, seed=-7)
    assert [c.text for c in a.choices] == [c.text for c in b.choices] and [c.index for c in a.choices] == [0, 1, 2]
    assert len({c.text for c in a.choices}) > 1


def test_openai_bad_request_is_raised_with_the_message(client):
    import openai
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=5000)
    assert "exceeds the context of 2048 tokens" in e.value.message and e.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", frequency_penalty=1.0)
    assert "penalty" in e.value.message and e.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", extra_body={"max_tokens": "10"})
    assert e.value.param == "max_tokens"

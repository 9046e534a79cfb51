"""`afm rl` and `train_rl` as a user runs them: a run killed mid-way and resumed, a run on two processes against one,
bfloat16 training corrected for fp32 sampling, the guard stopping a run whose search service goes down, and bad
settings refused in one line before anything trains."""
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import AFM, ENV

ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
PROFILE = """[quick]
description = test: the small tool-calling model, 16 world-atomic rl questions, 2 groups of 4 episodes a step
system_style = brief
rollout_max_new_tokens = 160
rollout_max_tokens_per_turn = 80
rollout_max_turns = 8
rollout_max_tool_calls = 4
tools_web_k = 2
tools_snippet_chars = 100
rl_suites = ["world-atomic"]
rl_tasks_per_suite = 16
rl_num_generations = 4
rl_groups_per_step = 2
rl_max_draws = 1
rl_format_weight = 0.1
rl_learning_rate = 0.001
rl_report_to = none
rl_save_steps = 2
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tool_caller_folder):
    """The small tool-calling model in a folder and a profile of its own (format reward on, so every step moves the
    weights)."""
    import shutil
    tmp = tmp_path_factory.mktemp("rl")
    shutil.copytree(tool_caller_folder, tmp / "model")
    (tmp / "settings.ini").write_text(PROFILE)
    return tmp


def _cmd(setup, out, *extra):
    from afm.models.fit import TINY_SYSTEM
    return [AFM, "rl", "--profile", "quick", "--settings", str(setup / "settings.ini"), "--model", str(setup / "model"),
            "--system", TINY_SYSTEM, "--out", str(out), *extra]


def _weights(folder):
    from safetensors.torch import load_file
    return load_file(str(Path(folder) / "model.safetensors"))


def test_a_killed_run_resumes_and_finishes_like_an_uninterrupted_one(setup, capsys):
    from afm.rl.trainer import RLArgs, cli_rl
    from afm.rl.health import guard_margins, margin_line, read_health
    steps = ["--max_steps", "4"]
    assert cli_rl(_cmd(setup, setup / "whole", *steps)[2:]) == 0  # the same settings, uninterrupted, in this process
    out = setup / "killed"
    proc = subprocess.Popen(_cmd(setup, out, *steps), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    mark = out / "checkpoints" / "checkpoint-2" / "afm_health.json"  # written after the rest of the checkpoint
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not mark.is_file() and proc.poll() is None: time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert mark.is_file() and not (out / "rl.json").exists()  # killed after a checkpoint, before the end
    assert cli_rl(_cmd(setup, out, *steps)[2:]) == 0  # resumed, here
    done = json.loads((out / "rl.json").read_text())
    assert done["resumed_from"] == "checkpoint-2" and done["steps"] == 4
    a, b = read_health(out), read_health(setup / "whole")
    first = guard_margins(b[:1], RLArgs())  # the first step's episodes: sampled by the test model as it was fitted
    print(margin_line(first), "at the first step;", margin_line(guard_margins(b, RLArgs())), "over the run")
    assert first["episodes/format_failure_rate"]["margin"] >= 0.25  # the test model starts well clear of the guard
    assert [r["step"] for r in a] == [1, 2, 3, 4] == [r["step"] for r in b]  # every step logged once
    # the resumed steps sampled the same episodes
    for k in ("reward", "episodes/sampled_tokens", "episodes/tool_calls"):
        assert [r[k] for r in a] == pytest.approx([r[k] for r in b], abs=1e-4), k
    wa, wb = _weights(out / "model"), _weights(setup / "whole" / "model")
    start = _weights(setup / "model")
    assert any((wb[n] - start[n]).abs().max() > 1e-6 for n in wb)  # RL moved the weights
    assert all((wa[n] - wb[n]).abs().max() < 1e-4 for n in wa)  # and the resumed run moved them the same way
    # another run in the same folder is refused, never resumed from these checkpoints
    capsys.readouterr()
    # max_steps alone may differ
    assert cli_rl(_cmd(setup, out, "--max_steps", "6", "--learning_rate", "0.002")[2:]) == 1
    said = capsys.readouterr().err
    assert f"{out} holds another run (args.learning_rate: 0.001 there, 0.002 here); use another folder" in said, said
    assert json.loads((out / "rl.json").read_text())["steps"] == 4


def test_a_run_cut_short_or_extended_from_its_checkpoints(setup):
    """max_steps may change between resumes (the learning rate is constant after warm-up): a shorter run ends on its
    checkpoint without taking another step, a longer one goes on from the newest checkpoint."""
    import shutil
    from afm.rl.trainer import cli_rl
    from afm.rl.health import read_health
    whole = setup / "whole"  # 4 steps, checkpoints at 2 and 4
    if not (whole / "rl.json").is_file(): assert cli_rl(_cmd(setup, whole, "--max_steps", "4")[2:]) == 0
    cut, longer = setup / "cut", setup / "longer"
    shutil.copytree(whole, cut), shutil.copytree(whole, longer)
    assert cli_rl(_cmd(setup, cut, "--max_steps", "2")[2:]) == 0
    done = json.loads((cut / "rl.json").read_text())
    assert (done["steps"] == 2 and done["resumed_from"] == "checkpoint-2"
            and [r["step"] for r in read_health(cut)] == [1, 2])
    final, at2, at4 = _weights(cut / "model"), _weights(cut / "checkpoints" / "checkpoint-2"), _weights(whole / "model")
    assert all((final[n] - at2[n]).abs().max() == 0 for n in final)  # the checkpoint's weights, no step taken
    assert any((final[n] - at4[n]).abs().max() > 0 for n in final)
    assert cli_rl(_cmd(setup, longer, "--max_steps", "5")[2:]) == 0
    done = json.loads((longer / "rl.json").read_text())
    assert (done["steps"] == 5 and done["resumed_from"] == "checkpoint-4"
            and [r["step"] for r in read_health(longer)] == [1, 2, 3, 4, 5])


def test_two_processes_end_with_the_weights_of_one(setup):
    """The same run (settings, tasks, seeds) on one process and on two, one group each: every rank ends with the same
    weights, and they are the one process's, up to float rounding. A group samples the same episodes whichever process
    rolls it out, and the packed passes' gradients, averaged over the processes, are the one process's. Dynamic
    sampling is off: its refills are drawn by each process for itself. A small learning rate: Adam divides each
    gradient by its own size, so a weight whose gradient is near 0 moves by up to the learning rate on float rounding
    (at 1e-3 that was 1.3e-5 apart)."""
    from afm.rl.trainer import cli_rl
    steps = ["--max_steps", "2", "--dynamic_sampling", "false", "--learning_rate", "0.0001"]
    one, two = setup / "one", setup / "ddp"
    assert cli_rl(_cmd(setup, one, *steps)[2:]) == 0
    cmd = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", *_cmd(setup, two, *steps)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    done = json.loads((two / "rl.json").read_text())
    ranks = [(two / f"rank{i}.sha256").read_text() for i in range(2)]
    assert done["world_size"] == 2 and done["steps"] == 2 and ranks[0] == ranks[1]
    a, b, start = _weights(two / "model"), _weights(one / "model"), _weights(setup / "model")
    moved = max(float((b[n] - start[n]).abs().max()) for n in b)
    apart = max(float((a[n] - b[n]).abs().max()) for n in a)
    assert moved > 1e-4 and apart < 1e-5, (moved, apart)  # trained, and the same training


def test_bf16_training_against_fp32_sampling_is_corrected(setup):
    """`smol` trains under bfloat16 autocast and samples in fp32 (its log-prob gap reached 0.40 on a token): the
    trainer's log-probs are not the sampler's. In-process the loss on each token is reweighted by TRL's truncated ratio
    of the two (as TRL does on its vLLM path): in fp32 the ratio is 1 to rounding, in bf16 it moves off 1, and the gap
    stays under the guard's thresholds."""
    from afm.rl.trainer import RLArgs, cli_rl
    from afm.rl.health import read_health
    lo, hi = "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/max"
    runs = {}
    for name, extra in (("fp32", []), ("bf16", ["--bf16", "true"])):
        assert cli_rl(_cmd(setup, setup / f"precision-{name}", "--max_steps", "1", *extra)[2:]) == 0
        runs[name] = read_health(setup / f"precision-{name}")[0]
    fp32, bf16, limits = runs["fp32"], runs["bf16"], RLArgs()
    assert fp32["logprob_gap/max"] < 1e-4 and 1 - 1e-4 < fp32[lo] <= fp32[hi] < 1 + 1e-4, fp32
    assert bf16["logprob_gap/max"] > 1e-3 and (bf16[lo] < 1 - 1e-3 or bf16[hi] > 1 + 1e-3), bf16  # corrected
    assert (bf16["logprob_gap/max"] < limits.guard_logprob_gap_max
            and bf16["logprob_gap/mean"] < limits.guard_logprob_gap), bf16
    assert not (setup / "precision-bf16" / "guard.json").exists()


@pytest.mark.parametrize("args, says", [
    (["--updates_per_generation", "3"], "rl_updates_per_generation = 3 must divide the 8 episodes"),
    (["--updates_per_generation", "2", "--micro_batch", "3"], "rl_micro_batch = 3 must divide the 4 episodes"),
    (["--updates_per_generation", "4", "--save_steps", "2"], "rl_save_steps = 2 must be a multiple"),
    (["--micro_batch", "3"], "rl_micro_batch = 3 must divide the 8 episodes")])
def test_a_batch_that_cannot_split_is_refused_before_the_model_loads(setup, tmp_path, capsys, args, says):
    from afm.rl.trainer import cli_rl
    argv = _cmd(setup, tmp_path / "bad", "--max_steps", "4", *args)[2:]
    argv[argv.index("--model") + 1] = str(tmp_path / "no model")  # a model that cannot load: the batch is refused first
    assert cli_rl(argv) == 1
    lines = [l for l in capsys.readouterr().err.splitlines() if l.strip() and "it/s" not in l]
    assert len(lines) == 1 and lines[0].startswith("afm rl: ValueError:") and says in lines[0], lines
    assert not (tmp_path / "bad").exists()


def test_the_guard_stops_a_run_whose_search_service_goes_down(setup, tmp_path):
    """Web search through a Serper-protocol service on localhost (BM25 over the world's pages); the service is shut down
    after the first step: the next step's tool calls fail, and the guard saves a checkpoint and stops the run."""
    from fastapi import FastAPI
    from afm.models.fit import TINY_SYSTEM
    from afm.tools.llm import serve_in_thread
    from afm.models.catalog import load
    from afm.rl.trainer import RLArgs, rl_tasks, train_rl
    from afm.rl.health import GuardStop, read_health
    from afm.rollout.loop import RolloutConfig
    from afm.tools.search import SearchConfig, SerperSearch, default_index
    from afm.tools.toolbox import Toolbox
    from afm.tasks.world import world_documents
    index = default_index(extra=world_documents())
    app = FastAPI()

    @app.post("/search")
    def search(body: dict):
        return {"organic": [{"title": h.doc.title, "link": h.doc.url, "snippet": h.doc.text[:100]}
                            for h in index.search(body["q"], body.get("num", 2))]}

    server, url = serve_in_thread(app)
    box = Toolbox([SearchConfig(index=index, web_k=2, snippet_chars=100,
                                serper=SerperSearch(api_key="k", endpoint=f"{url}/search", timeout_s=2))], online=True)
    out = tmp_path / "guarded"
    def stop_after_first_step():
        while not (out / "health.csv").is_file() or len((out / "health.csv").read_text().splitlines()) < 2:
            time.sleep(0.05)
        server.should_exit = True
    threading.Thread(target=stop_after_first_step, daemon=True).start()
    # this model, reading web results it was not fitted on, fails the format often: watch the tools alone
    args = RLArgs(max_steps=6, num_generations=4, groups_per_step=2, max_draws=0, report_to="none", save_steps=100,
                  format_weight=0.1, guard_format_failures=1.0)
    cfg = RolloutConfig(max_new_tokens=160, max_tokens_per_turn=80, max_tool_calls=4, system=TINY_SYSTEM,
                        system_style="brief")
    with pytest.raises(GuardStop, match="tool_failure_rate"):
        train_rl(rl_tasks(["world-atomic"], 16), out, args, cfg, box, *load(str(setup / "model")), progress=False)
    health, guard = read_health(out), json.loads((out / "guard.json").read_text())
    assert health[0]["episodes/tool_failure_rate"] == 0.0 and health[-1]["episodes/tool_failure_rate"] > 0.5
    assert guard["step"] == health[-1]["step"] < 6 and (out / "checkpoints" / f"checkpoint-{guard['step']}"
                                                        / "afm_health.json").is_file()
    assert not (out / "rl.json").exists()  # a stopped run is not a finished one


@pytest.mark.parametrize("args, says", [
    (["--num_generations", "1"], "num_generations"),
    (["--groups_per_step", "3", "--micro_batch", "5"], "rl_micro_batch"),
    (["--suites", "no-such-suite"], "no-such-suite"), (["--report_to", "nowhere"], "report_to"),
    (["--format_weight", "0.5"], "format_weight"), (["--vllm", "true"], "rl_vllm"),
    (["--tasks_per_suite", "0"], "rl_tasks_per_suite (--tasks_per_suite) = 0"), (["--suites", ","], "is empty")])
def test_bad_settings_are_one_clear_line(setup, tmp_path, capsys, args, says):
    from afm.rl.trainer import cli_rl
    argv = _cmd(setup, tmp_path / "bad", "--max_steps", "1", *args)[2:]  # what follows `afm rl`, run in this process
    assert cli_rl(argv) == 1
    lines = [l for l in capsys.readouterr().err.splitlines() if l.strip() and "it/s" not in l]  # progress bars aside
    assert len(lines) == 1 and lines[0].startswith("afm rl:") and says in lines[0], lines
    assert not (tmp_path / "bad" / "checkpoints").exists()


@pytest.mark.parametrize("line, says", [
    ("rl_suites = world-atomic", 'is a string, not a list of suites: write rl_suites = ["world-atomic"]'),
    ("rl_suites = []", "rl_suites (--suites) is empty"), ("rl_tasks_per_suite = 0", "(--tasks_per_suite) = 0")])
def test_a_profile_without_rl_tasks_is_refused_before_anything_loads(setup, tmp_path, capsys, line, says):
    """`rl_suites = world-atomic` once trained on the suites 'w', 'o', ... and `rl_suites = []` started training and
    failed on a missing health.csv; `rl_tasks_per_suite = 0` took the default. Each is one line now, before the model
    (here a folder that does not exist) is looked at."""
    from afm.rl.trainer import cli_rl
    key = line.split(" = ")[0]
    profile = "\n".join(l for l in PROFILE.splitlines() if not l.startswith(f"{key} =")) + f"\n{line}\n"
    (tmp_path / "settings.ini").write_text(profile)
    argv = ["--profile", "quick", "--settings", str(tmp_path / "settings.ini"), "--model", str(tmp_path / "no model"),
            "--out", str(tmp_path / "run")]
    assert cli_rl(argv) == 1
    lines = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("afm rl: ValueError:") and says in lines[0], lines
    assert not (tmp_path / "run").exists()

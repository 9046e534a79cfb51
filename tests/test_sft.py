"""`afm sft` and `train_sft` as a user runs them: a run killed mid-way and resumed, a run on two processes, a run that
is what its inputs say (settings and data), bad settings and bad data refused in one line before anything trains, the
recipe's stages."""
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import AFM, ENV, REPO

ACCELERATE = str(Path(sys.executable).with_name("accelerate"))


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_chat_folder):
    "A small tiny model folder, rows of the worked examples in the distilled layout, and a profile of its own."
    import shutil
    from afm.format.coa import examples, render
    from afm.tools.prompts import system_prompt
    tmp = tmp_path_factory.mktemp("sft")
    shutil.copytree(tiny_chat_folder, tmp / "model")
    kinds = {"web": "qa", "code": "code", "math": "math"}
    with (tmp / "rows.jsonl").open("w") as f:
        for _ in range(4):
            for name, traj in examples().items():
                f.write(json.dumps({"kind": kinds[name], "messages": [
                    {"role": "system", "content": system_prompt(kinds[name])},
                    {"role": "user", "content": traj.question},
                    {"role": "assistant", "content": render(traj)}]}) + "\n")
    (tmp / "settings.ini").write_text("[quick]\ndescription = test\nsft_learning_rate = 0.003\nsft_batch_size = "
                                      "1\nsft_val_fraction = 0.0\n")
    return tmp


def _cmd(setup, out, *extra):
    return [AFM, "sft", "--profile", "quick", "--settings", str(setup / "settings.ini"), "--model",
            str(setup / "model"), "--data", str(setup / "rows.jsonl"), "--out", str(out), *extra]


def _losses(out):
    return {h["step"]: h["loss"] for h in json.loads((out / "log.json").read_text()) if "loss" in h}


# Muon's state is ours to save and load: a resume must restore it
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_killed_run_resumes_and_finishes_like_an_uninterrupted_one(setup, optimizer):
    from afm.sft.trainer import ELAPSED, SFTArgs, train_sft
    steps = ["--max_steps", "12", "--save_steps", "4", "--optimizer", optimizer]
    # the same settings, uninterrupted
    ref = train_sft(setup / "rows.jsonl", setup / f"whole-{optimizer}",
                    SFTArgs(model=str(setup / "model"), max_steps=12, save_steps=4, learning_rate=0.003, batch_size=1,
                            val_fraction=0.0, optimizer=optimizer), progress=False)
    out = setup / f"killed-{optimizer}"  # the recipe's SFT stage trains in out/sft
    proc = subprocess.Popen(_cmd(setup, out, *steps), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    mark = out / "sft" / "checkpoints" / "checkpoint-4" / ELAPSED  # written after the rest of the checkpoint
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not mark.is_file() and proc.poll() is None: time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert mark.is_file() and not (out / "sft" / "sft.json").exists()  # killed after a checkpoint, before the end
    again = subprocess.run(_cmd(setup, out, *steps), capture_output=True, text=True, env=ENV, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    done = json.loads((out / "sft" / "sft.json").read_text())
    assert done["resumed_from"].startswith("checkpoint-") and done["steps"] == ref["steps"] == 12
    before = json.loads((out / "sft" / "checkpoints" / done["resumed_from"] / ELAPSED).read_text())["seconds"]
    # the killed process's seconds are counted
    assert 0 < done["resumed_seconds"] == round(before, 1) < done["train_seconds"]
    a, b = _losses(out / "sft"), _losses(setup / f"whole-{optimizer}")
    # the same run, resumed
    assert max(a) == 12 and all(abs(a[s] - b[s]) < 1e-4 * max(1.0, abs(b[s])) for s in a), (a, b)
    assert abs(done["final_train_loss"] - ref["final_train_loss"]) < 1e-4 * max(1.0, ref["final_train_loss"])


@pytest.fixture(scope="module")
def ddp_run(setup):
    """`afm sft` data-parallel on two CPU processes over gloo, 4 steps: every rank holds the whole model; the stage's
    folder."""
    out = setup / "ddp"
    cmd = [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", *_cmd(setup, out, "--max_steps", "4", "--save_steps", "4")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "sft"


def test_two_processes_end_with_the_same_weights(setup, ddp_run):
    from afm.models.catalog import load
    from afm.sft.training import weight_digest
    done = json.loads((ddp_run / "sft.json").read_text())
    ranks = [(ddp_run / f"rank{i}.sha256").read_text() for i in range(2)]
    assert done["world_size"] == 2 and done["steps"] == 4 and ranks[0] == ranks[1]
    # trained, deterministic digest
    assert ranks[0] != weight_digest(load(str(setup / "model"))[0]) == weight_digest(load(str(setup / "model"))[0])


def test_fsdp2_on_two_cpu_processes(setup, ddp_run):
    """The shipped configs/accelerate/fsdp2.yaml on two CPU processes over gloo, the DDP run's settings and data. Where
    accelerate runs FSDP there (each decoder layer sharded, loaded on rank 0 and broadcast, the full weights gathered
    when saved), the saved model is the one DDP trains: sharding changes where the weights live, not what is trained."""
    import accelerate
    import torch
    from afm.models.catalog import load
    out = setup / "fsdp2"
    cmd = [ACCELERATE, "launch", "--config_file", str(REPO / "configs" / "accelerate" / "fsdp2.yaml"),
           "--num_processes", "2", "--mixed_precision", "no",
           *_cmd(setup, out, "--max_steps", "4", "--save_steps", "4")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    done = json.loads((out / "sft" / "sft.json").read_text())
    a, b = load(str(out / "sft" / "model"))[0].state_dict(), load(str(ddp_run / "model"))[0].state_dict()
    assert done["world_size"] == 2 and done["steps"] == 4 and a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5  # the config runs, and trains what DDP trains
    fsdp, ddp = _losses(out / "sft"), _losses(ddp_run)
    assert fsdp.keys() == ddp.keys() and all(abs(fsdp[s] - ddp[s]) < 1e-4 * max(1.0, abs(ddp[s]))
                                             for s in ddp), (fsdp, ddp)
    if done["distributed"] != "FSDP":
        pytest.skip(f"accelerate {accelerate.__version__} ran the FSDP2 config as {done['distributed']}: it turns FSDP "
                    "on only for accelerator "
                    "devices (AcceleratorState switches MULTI_GPU, MULTI_NPU, MULTI_XPU, ... to FSDP, never "
                    "MULTI_CPU), and the Trainer "
                    f"reaches FSDP only through accelerate; torch {torch.__version__} itself shards on CPU over "
                    "gloo (fully_shard), "
                    "so the run above trained data-parallel and matched DDP, but no weight was sharded")
    assert not list((out / "sft").glob("rank*.sha256"))  # sharded: no rank held the whole model to digest


@pytest.mark.parametrize("args, says", [
    (["--data", "/nonexistent/rows"], "/nonexistent/rows: no such SFT data"),
    (["--batch_size", "0"], "batch_size must be a whole number in [1, inf)"),
    # checked when the arguments are made: a model that does not exist is never reached
    (["--lr_scheduler", "cosine_typo", "--model", "/nonexistent/model"], "SFTArgs.lr_scheduler = 'cosine_typo' is not "
                                                                         "one transformers knows"),
    (["--attention", "flash", "--model", "/nonexistent/model"], "SFTArgs.attention = 'flash' is not "
                                                                "one transformers knows"),
    (["--max_length", "1000000000", "--model", "/nonexistent/model"], "SFTArgs.max_length must be a whole "
                                                                      "number in [1, 1048576]"),
    # read from the config, not loaded
    (["--max_length", "4096"], "SFTArgs.max_length = 4096 is longer than the context of"),
])
def test_bad_input_is_one_clear_line(setup, args, says):
    out = setup / "bad"
    r = subprocess.run([*_cmd(setup, out), *args], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (out / "sft" / "args.json").exists()  # nothing left behind that would block the corrected run


def _args(setup, **kw):
    from afm.sft.trainer import SFTArgs
    return SFTArgs(**{"model": str(setup / "model"), "max_steps": 2, "save_steps": 2, "batch_size": 1,
                      "val_fraction": 0.0, "learning_rate": 0.003, **kw})


def test_other_data_in_the_same_folder_is_refused_not_reported_finished(setup, tmp_path):
    rows = setup / "rows.jsonl"
    other = tmp_path / "other.jsonl"  # the same rows but one: another data file
    other.write_text("".join(rows.read_text().splitlines(keepends=True)[1:]))
    out = tmp_path / "run"
    first = subprocess.run(_cmd(setup, out, "--max_steps", "2", "--save_steps", "2"), capture_output=True, text=True,
                           env=ENV, timeout=300)
    assert first.returncode == 0 and "already finished" not in first.stdout, first.stderr[-2000:]
    again = subprocess.run(_cmd(setup, out, "--max_steps", "2", "--save_steps", "2"), capture_output=True, text=True,
                           env=ENV, timeout=300)
    assert again.returncode == 0 and "(already finished)" in again.stdout  # the same inputs: the same run
    r = subprocess.run([*_cmd(setup, out, "--max_steps", "2", "--save_steps", "2"), "--data", str(other)],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{out / 'sft'} holds another run (data.rows: 12 there, 11 here; data.sha256: " in r.stderr, r.stderr


def test_a_resume_checks_the_data_too(setup, tmp_path):
    import shutil
    from afm.sft.trainer import train_sft
    from afm.sft.data import sft_rows
    rows = [r for _, r in sft_rows(setup / "rows.jsonl")]
    out = tmp_path / "run"
    train_sft(rows, out, _args(setup), progress=False)
    shutil.rmtree(out / "model")
    (out / "sft.json").unlink()  # what a run killed after its last checkpoint leaves
    with pytest.raises(ValueError, match=r"holds another run \(data\.rows: 12 there, 11 here; data\.sha256: "):
        train_sft(rows[1:], out, _args(setup), progress=False)
    assert train_sft(rows, out, _args(setup), progress=False)["resumed_from"] == "checkpoint-2"  # the same data resumes


def test_a_run_that_failed_on_its_data_does_not_block_the_corrected_one(setup, tmp_path):
    from afm.sft.trainer import train_sft
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="no trainable rows"):
        # every row longer than 40 tokens
        train_sft(setup / "rows.jsonl", out, _args(setup, max_length=40), progress=False)
    assert not (out / "args.json").exists()
    done = train_sft(setup / "rows.jsonl", out, _args(setup), progress=False)
    assert done["steps"] == 2 and json.loads((out / "args.json").read_text())["args"]["max_length"] == 2048


def _bad_files(folder: Path, good: dict) -> list[tuple[Path, str]]:
    "Data files each broken in one way, with what the error must say."
    import datasets
    line = json.dumps(good) + "\n"
    cases = {"kind.jsonl": line + json.dumps({**good, "kind": "poem"}) + "\n",
             "shape.jsonl": line * 2 + '{"messages": {"role": "user"}}\n',
             "turn.jsonl": line + json.dumps({"messages": [{"role": "user", "content": ["a", "list"]}]}) + "\n",
             "notjson.json": "[{]", "bytes.jsonl": None, "x.parquet": "PAR1 not a parquet file PAR1"}
    for name, text in cases.items():
        if text is None: (folder / name).write_bytes(line.encode() + b"\xff\xfe{}\n")
        else: (folder / name).write_text(text)
    says = {"kind.jsonl": "kind.jsonl:2: `kind` must be one of",
            "shape.jsonl": "shape.jsonl:3: `messages` must be a list",
            "turn.jsonl": "turn.jsonl:2: `messages[0]` must have a role",
            "notjson.json": "notjson.json: unreadable from its start", "bytes.jsonl": "bytes.jsonl:2: not UTF-8",
            "x.parquet": "x.parquet: unreadable from its start"}
    out = [(folder / k, v) for k, v in says.items()]
    datasets.Dataset.from_list([good] * 4).save_to_disk(str(folder / "broken"))
    for f in (folder / "broken").glob("*.arrow"): f.write_bytes(b"not arrow")
    datasets.DatasetDict({"validation": datasets.Dataset.from_list([good] * 4)}).save_to_disk(str(folder / "nosplit"))
    return out + [(folder / "broken", "broken: not a readable datasets folder"),
                  (folder / "nosplit", "nosplit: no `train` split")]


def test_bad_data_names_the_file_and_the_row(setup, tmp_path):
    from afm.sft.trainer import train_sft
    good = json.loads((setup / "rows.jsonl").read_text().splitlines()[0])
    for path, says in _bad_files(tmp_path, good):
        with pytest.raises(ValueError) as e: train_sft(path, tmp_path / "out", _args(setup), progress=False)
        assert says in str(e.value) and "\n" not in str(e.value), (path, str(e.value))
    assert not (tmp_path / "out").exists()


def test_a_huge_row_is_skipped_by_its_characters_before_tokenising(setup, tmp_path):
    from afm.sft.trainer import train_sft
    good = json.loads((setup / "rows.jsonl").read_text().splitlines()[0])
    huge = {**good, "messages": [*good["messages"][:2], {"role": "assistant", "content": "<think>" + "ab " * 3_500_000
                                                         + "</think><answer>1</answer>"}]}
    # a 10 MB row on line 13
    (tmp_path / "rows.jsonl").write_text((setup / "rows.jsonl").read_text() + json.dumps(huge) + "\n")
    t0 = time.perf_counter()
    done = train_sft(tmp_path / "rows.jsonl", tmp_path / "out", _args(setup, max_steps=1, save_steps=1), progress=False)
    reason = [k for k in done["skipped"] if k.startswith("longer than") and k.endswith(" characters")]
    assert done["rows"] == 12 and len(reason) == 1 and done["skipped"][reason[0]] == 1, done["skipped"]
    assert time.perf_counter() - t0 < 60


def test_the_recipe_runs_stages_each_checking_its_own_identity(setup, tmp_path):
    from afm.sft.trainer import train_sft
    from afm.sft.recipe import sft_recipe
    args, out = _args(setup, copy_steps=2), tmp_path / "recipe"
    runs = sft_recipe(setup / "rows.jsonl", out, args, progress=False)
    assert list(runs) == ["copy", "sft"] and runs["copy"]["steps"] == runs["sft"]["steps"] == 2
    assert (runs["copy"]["args"]["model"] == str(setup / "model")
            and runs["sft"]["args"]["model"] == str(out / "copy" / "model"))
    assert runs["copy"]["trained_tokens"] < runs["sft"]["trained_tokens"]  # prefixes, then whole rows
    assert all(r["already_finished"] for r in sft_recipe(setup / "rows.jsonl", out, args, progress=False).values())
    says = f"{out / 'copy'} holds another run (args.max_steps: 2 there, 3 here); use another folder"
    with pytest.raises(ValueError, match=re.escape(says)):
        sft_recipe(setup / "rows.jsonl", out, _args(setup, copy_steps=3), progress=False)
    with pytest.raises(ValueError, match="train_sft trains one stage"):
        train_sft(setup / "rows.jsonl", tmp_path / "one", args, progress=False)


def test_a_profile_key_of_the_wrong_type_is_named(setup, tmp_path):
    (tmp_path / "s.ini").write_text("[quick]\nsft_learning_rate = fast\n")
    r = subprocess.run([AFM, "sft", "--profile", "quick", "--settings", str(tmp_path / "s.ini"), "--data",
                        str(setup / "rows.jsonl")],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 1 and "sft_learning_rate = 'fast' should be a number" in r.stderr, r.stderr


def test_bench_sft_refuses_bad_input_in_one_line(setup):
    "The benchmark itself runs in the chapter (`bench_sft`); here, its command's checks before anything loads."
    for argv, says in ((["--rows", "1"], "--rows must be at least 2"),
                       (["--data", "/nonexistent/rows", "--model", str(setup / "model")],
                         "/nonexistent/rows: no such SFT data")):
        bad = subprocess.run([AFM, "bench", "sft", *argv], capture_output=True, text=True, env=ENV, timeout=120)
        # argparse prints its usage above the error; the error itself is one line
        last = bad.stderr.strip().splitlines()[-1]
        assert bad.returncode in (1, 2) and says in last and "Traceback" not in bad.stderr, bad.stderr


def test_a_released_alpaca_file_is_read_reported_and_carded(setup, tmp_path):
    """The released AFM files as LLaMA-Factory registers them (alpaca: instruction, input, output; no kind) train as
    they are: `afm sft` prints the share of rows that pass afm.format.coa.grammar_problems before training, skips the
    rest,
    and the model's card names the file."""
    from afm.sft.data import conversation
    rows = [json.loads(line) for line in (setup / "rows.jsonl").read_text().splitlines()]
    alpaca = []
    for i, r in enumerate(rows):
        system, user, assistant = conversation(r, f"row {i}")
        alpaca.append({"instruction": user, "input": "", "output": assistant, "system": system})
    # a trajectory cut before its answer
    alpaca.append({**alpaca[0], "output": alpaca[0]["output"].split("<answer>")[0]})
    path = tmp_path / "AgentSFTDataset.json"
    path.write_text(json.dumps(alpaca))
    r = subprocess.run([*_cmd(setup, tmp_path / "out", "--max_steps", "1", "--save_steps", "1"), "--data", str(path)],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (f"{path}: 13 rows (alpaca 13); 12 pass afm.format.coa.grammar_problems (92.3%); commonest "
            "problems: no <answer> (1)" in r.stdout), r.stdout
    done = json.loads((tmp_path / "out" / "sft" / "sft.json").read_text())
    assert done["skipped"] == {"no answer": 1} and done["rows"] == 12
    card = (tmp_path / "out" / "sft" / "model" / "README.md").read_text()
    assert (f"| source | {path} |" in card and f"| sha256 | {done['data']['sha256']} |" in card
            and "| rows | 13 |" in card)


def test_the_paper_scale_options_do_what_they_say(setup, tmp_path):
    """gradient_checkpointing recomputes without changing the losses; report_to writes TensorBoard's log;
    save_total_limit keeps the newest checkpoints; checkpoints of save_only_model hold no optimiser state, and a run
    cut short on them is refused, not resumed."""
    import shutil
    from afm.sft.trainer import train_sft
    plain = train_sft(setup / "rows.jsonl", tmp_path / "plain", _args(setup, max_steps=4, save_steps=1), progress=False)
    out = tmp_path / "paper"
    done = train_sft(setup / "rows.jsonl", out, _args(setup, max_steps=4, save_steps=1, gradient_checkpointing=True,
                                                      report_to="tensorboard", save_total_limit=2), progress=False)
    a, b = _losses(out), _losses(tmp_path / "plain")
    assert done["steps"] == plain["steps"] == 4 and all(abs(a[s] - b[s]) < 1e-5 * max(1.0, b[s]) for s in b), (a, b)
    assert sorted(p.name for p in (out / "checkpoints").glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]
    assert list((out / "checkpoints" / "runs").rglob("events.out.tfevents.*"))
    light = tmp_path / "light"
    train_sft(setup / "rows.jsonl", light, _args(setup, save_only_model=True), progress=False)
    assert ((light / "checkpoints" / "checkpoint-2" / "model.safetensors").is_file()
            and not (light / "checkpoints" / "checkpoint-2" / "optimizer.pt").exists())
    shutil.rmtree(light / "model")
    (light / "sft.json").unlink()  # what a run killed after its last checkpoint leaves
    with pytest.raises(ValueError, match="its checkpoints hold weights only .* cannot resume; delete"):
        train_sft(setup / "rows.jsonl", light, _args(setup, save_only_model=True), progress=False)

"""`tests/gpu_check.sh`, the check run on GPU machines, kept working here: the same script on the CPU (DEVICE=cpu) at a
few episodes and steps, with a small tool-calling model; every step must finish and the summary compare the runs."""
import json
import os
import subprocess
import sys
from pathlib import Path
from conftest import REPO



def test_the_gpu_check_runs_end_to_end_on_the_cpu(tmp_path, tool_caller_folder):
    import shutil
    from afm.format.coa import examples, render
    from afm.tools.prompts import system_prompt
    shutil.copytree(tool_caller_folder, tmp_path / "model")
    with (tmp_path / "rows.jsonl").open("w") as f:
        for _ in range(8):
            traj = examples()["web"]
            f.write(json.dumps({"kind": "qa", "messages": [{"role": "system", "content": system_prompt("qa")},
                                                           {"role": "user", "content": traj.question},
                                                           {"role": "assistant", "content": render(traj)}]}) + "\n")
    from afm.models.fit import TINY_SYSTEM
    # the small tool-calling model's own prompt: the one it calls tools under (a trained model's is the profile's)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "DEVICE": "cpu", "PER_SUITE": "1",
           "SYSTEM": TINY_SYSTEM,
           "SFT_STEPS": "2", "RL_STEPS": "1", "RL_GROUPS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(REPO / "tests" / "gpu_check.sh"), str(tmp_path / "model"),
                        str(tmp_path / "rows.jsonl"), str(out)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    failed = {k: (out / f"{k}.log").read_text()[-800:] for k, v in summary["steps"].items() if v["exit"]}
    assert not failed, failed
    assert list(summary["steps"]) == ["eval_gpu_fp32", "eval_gpu_bf16", "eval_cpu", "sft", "eval_sft", "rl"]
    fp32_vs_cpu = summary["agreement"]["eval_gpu_fp32 vs eval_cpu"]
    # one device, one dtype: the same episodes
    assert fp32_vs_cpu["questions"] == 4 and fp32_vs_cpu["same_grade"] == 1.0
    assert summary["sft"]["steps"] == 2 and summary["rl"]["steps"] == 1
    from afm.rl.trainer import RLArgs
    from afm.rl.health import guard_margins, margin_line, read_health
    margins = guard_margins(read_health(out / "rl")[:1], RLArgs())  # the first step: episodes the test model sampled
    print(margin_line(margins))
    assert margins["episodes/format_failure_rate"]["margin"] >= 0.25  # the test model keeps well clear of the guard

"""The rollout loop under hostile conditions, with the tool-calling tiny model and real tools: a tool that hangs,
returns anything or raises anything fails only its own episode and never holds the batch; a request the engine cannot
serve ends only its episode; any seed in range serves every episode; the module imports only what the data flow allows;
and a cached brief fit that no longer calls tools is fitted again."""
import dataclasses
import json
import subprocess
import sys
import threading
import time

import pytest

from afm.models.engine import TransformersEngine
from afm.models.fit import TINY_SYSTEM, tool_caller_start, tool_calling_tiny
from afm.rollout.loop import RolloutConfig, rollout
from afm.tasks.task import load_benchmark
from afm.tools.toolbox import TOOLS, Tool, Toolbox
from afm.tasks.world import tool_sizes, world_toolbox


@pytest.fixture(scope="module")
def setup():
    model, tok = tool_calling_tiny()
    cfg = RolloutConfig(temperature=0, max_new_tokens=200, max_tokens_per_turn=120, system=TINY_SYSTEM,
                        tool_timeout_s=1.0)
    return (model, tok, TransformersEngine(model, tok, max_batch=16), cfg,
            load_benchmark("world-atomic", split="test", sizes={"test": 4}))


def _box(fn, normalize=str.strip):
    return Toolbox([], registry=TOOLS.extended(Tool("web_search", fn, "a web search", normalize=normalize, dedup=True,
                                                    agent="search")))


def _observations(eps):
    return [s.observation for e in eps for s in e.trajectory.steps if s.observation is not None]


def test_the_rollout_imports_only_earlier_chapters():
    code = "import sys, afm.rollout.loop; print(json.dumps(sorted(m for m in sys.modules if m.startswith('afm'))))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True,
                         check=True).stdout
    heavy = {"afm.teacher.distill", "afm.teacher.mas", "afm.models.fit", "afm.sft.trainer"}
    assert not heavy & set(json.loads(out)), out


@pytest.mark.parametrize("hang", ["sleeps a minute", "never returns"])
def test_a_hung_tool_holds_only_its_own_episode(setup, hang):
    model, tok, engine, cfg, tasks = setup
    first, lock = [], threading.Lock()
    def search(text, ctx):
        with lock:
            hung = not first
            first.append(1)
        if hung: time.sleep(60) if hang == "sleeps a minute" else threading.Event().wait()
        return "Sabri Sotai (born 1877) is an engineer."
    t0 = time.perf_counter()
    eps = rollout(engine, tasks, _box(search), cfg)
    assert time.perf_counter() - t0 < cfg.tool_timeout_s + 4
    obs = _observations(eps)
    assert sum("did not answer within 1 s" in o for o in obs) == 1 and sum("born 1877" in o for o in obs) >= 1, obs


class _Escape(BaseException):
    "Not an Exception."


def _raises(exc):
    def fn(text, ctx): raise exc
    return fn


@pytest.mark.parametrize("fn, says", [
    (lambda text, ctx: None, "returned NoneType instead of text"),
    (lambda text, ctx: 42, "returned int instead of text"), (lambda text, ctx: ["a"], "returned list instead of text"),
    (lambda text, ctx: b"raw", "returned bytes instead of text"), (_raises(SystemExit(3)), "crashed: SystemExit: 3"),
    (_raises(_Escape("out")), "crashed: _Escape: out"), (_raises(MemoryError()), "crashed: MemoryError")])
def test_what_a_tool_returns_or_raises_is_its_episodes_observation(setup, fn, says):
    model, tok, engine, cfg, tasks = setup
    eps = rollout(engine, tasks, _box(fn), cfg)
    obs = _observations(eps)
    assert obs and all(o.startswith("[FAILED]") and says in o for o in obs), obs
    assert all(e.end in ("answer", "end_of_turn", "bad_call", "unclosed", "max_new_tokens", "max_tool_calls")
               for e in eps)


def test_a_session_that_raises_fails_only_its_call(setup):
    model, tok, engine, cfg, tasks = setup
    def normalize(text):  # the session's own machinery raising, before the tool runs
        raise SystemExit("the normaliser quit")
    eps = rollout(engine, tasks, _box(lambda text, ctx: "fine", normalize=normalize), cfg)
    obs = _observations(eps)
    assert obs and all(o.startswith("[FAILED] the web_search call failed: SystemExit: the normaliser quit")
                       for o in obs), obs


def test_a_request_the_engine_cannot_serve_ends_only_its_episode(setup):
    model, tok, _, cfg, tasks = setup
    from afm.models.catalog import load
    # its own tokenizer: one word more than the model knows
    mine = load(str(tool_caller_start()[-1]))[1]
    mine.add_tokens(["qqzxv"])
    assert mine.convert_tokens_to_ids("qqzxv") >= model.config.vocab_size
    odd = dataclasses.replace(tasks[0], id="demo/odd", question=tasks[0].question + " qqzxv")
    eps = rollout(TransformersEngine(model, mine, max_batch=16), [odd, *tasks], world_toolbox(tool_sizes("tiny")), cfg)
    assert (eps[0].end == "engine_error" and "outside the vocabulary" in eps[0].format_error
            and eps[0].completion_ids == [])
    assert all(e.end != "engine_error" for e in eps[1:]) and sum(e.tool_calls for e in eps[1:]) >= 2


@pytest.mark.parametrize("seed", [0, 2**62, 2**64 - 1])
def test_any_seed_in_range_serves_every_episode(setup, seed):
    model, tok, engine, cfg, tasks = setup
    eps = rollout(engine, tasks, world_toolbox(tool_sizes("tiny")),
                  dataclasses.replace(cfg, temperature=1.0, seed=seed))
    assert all(e.end != "engine_error" and e.sampled_tokens > 0 for e in eps), [(e.end, e.format_error) for e in eps]


@pytest.mark.parametrize("bad", [2**64, -1, 1.0, True])
def test_a_seed_out_of_range_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="RolloutConfig.seed"): RolloutConfig(seed=bad)


def test_a_released_checkpoint_is_prompted_in_its_own_layout(setup):
    """`prompt_layout=user`: no system turn; the instructions open the user turn, or a released RL row's own prompt
    is used as it is."""
    from afm.tasks.hub import afm_rl_task
    from afm.models.catalog import chat_prompt_ids
    model, tok, engine, cfg, tasks = setup
    roles = lambda ids: [part.split("\n", 1)[0].strip()
                         for part in tok.decode(ids, skip_special_tokens=False).split("<|im_start|>")[1:]]
    user = dataclasses.replace(cfg, prompt_layout="user")
    ours, theirs = (rollout(engine, tasks[:2], world_toolbox(tool_sizes("tiny")), cfg),
                    rollout(engine, tasks[:2], world_toolbox(tool_sizes("tiny")), user))
    assert all(roles(e.prompt_ids) == ["system", "user", "assistant"] for e in ours)
    assert all(roles(e.prompt_ids) == ["user", "assistant"] for e in theirs)
    assert theirs[0].prompt_ids == chat_prompt_ids(tok, [{"role": "user",
                                                          "content": f"{TINY_SYSTEM}\n\n{tasks[0].question}"}])
    prompt = [{"role": "user", "content": "Answer with the tools. <web_search>query</web_search>...\nQuestion: In what "
                                          "year was Lumo founded?"}]
    row = {"data_source": "afm-web", "prompt": prompt, "extra_info": {"index": 7},
           "reward_model": {"ground_truth": json.dumps({"target": "1999",
                                                        "question": "In what year was Lumo founded?"})}}
    task = afm_rl_task(row, "rl.parquet:1", "web")
    released = rollout(engine, [task], Toolbox(), dataclasses.replace(user, system=None, max_new_tokens=8))[0]
    assert released.prompt_ids == chat_prompt_ids(tok, prompt) and roles(released.prompt_ids) == ["user", "assistant"]

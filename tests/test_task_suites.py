"""The generated suites at the size the tiny profile uses: deterministic, disjoint splits, every question answerable;
and a world task rolled out with the tools of another world is refused, not silently scored 0."""
import json

import pytest

from afm.tasks.grading import grade
from afm.tools.search import SearchIndex, wiki_documents
from afm.tasks.task import SPLITS, gold_answer, load_benchmark
from afm.tasks.world import default_world, world_documents, world_name, world_toolbox
from afm.tasks.suites import GENERATED_SUITES, WORLD_SUITES, make_suites, verify_gold_path

SIZES = {"sft": 200, "rl": 500, "val": 50, "test": 100}


@pytest.fixture(scope="module")
def suites():
    return {name: load_benchmark(name, sizes=SIZES) for name in GENERATED_SUITES}


def _asked_about(t):
    if "anchors" in t.meta: return set(t.meta["anchors"])
    if "template" in t.meta: return {json.dumps([t.meta["template"], t.meta["params"]], sort_keys=True)}
    return {t.question}


def test_sizes_and_determinism(suites):
    for name, tasks in suites.items():
        assert [sum(t.split == s for t in tasks) for s in SPLITS] == [SIZES[s] for s in SPLITS], name
    again = make_suites(default_world(), SIZES, seed=0, suites=("world-depth", "code-gen"))
    assert [t.to_dict() for t in again["world-depth"]] == [t.to_dict() for t in suites["world-depth"]]
    assert [t.to_dict() for t in again["code-gen"]] == [t.to_dict() for t in suites["code-gen"]]
    other = make_suites(default_world(seed=1), {"test": 5}, seed=1, suites=("world-depth",))["world-depth"]
    assert {t.question for t in other}.isdisjoint(t.question for t in suites["world-depth"])


def test_splits_are_disjoint_by_what_they_ask_about(suites):
    for name, tasks in suites.items():
        seen = {s: set().union(*[_asked_about(t) for t in tasks if t.split == s]) for s in SPLITS}
        for i, a in enumerate(SPLITS):
            for b in SPLITS[i + 1:]:
                assert not seen[a] & seen[b], (name, a, b)
        assert len({t.id for t in tasks}) == len(tasks) == len({t.question for t in tasks})


def test_depth_covers_two_to_five_hops(suites):
    assert {t.hops for t in suites["world-depth"]} == {2, 3, 4, 5}
    assert {t.hops for t in suites["world-atomic"]} == {1}


def test_every_world_question_is_answerable_by_its_gold_path(suites):
    index = SearchIndex.build(wiki_documents() + world_documents())
    ranks = []
    for name in WORLD_SUITES:
        for t in suites[name]:
            problems, r = verify_gold_path(t, index)
            assert problems == [], (t.id, t.question, problems)
            ranks += r
    found = sum(r is not None for r in ranks) / len(ranks)
    print(f"\n{len(ranks)} gold searches: {found:.1%} find their page in the top 10")
    assert found > 0.9


def test_gold_answers_grade_one(suites):
    for name in ("world-width", "world-compute", "gsm-symbolic"):
        for t in suites[name][:50]:
            pred = gold_answer(t) if t.kind != "math" else f"\\boxed{{{gold_answer(t)}}}"
            assert grade(t, pred) == 1.0, (t.id, pred)


def test_world_tasks_name_their_world_and_others_none(suites):
    for name, tasks in suites.items():
        assert all(t.meta.get("world") == (world_name() if name in WORLD_SUITES else None) for t in tasks), name
    far = load_benchmark("world-atomic", split="test", seed=7, sizes={"test": 3})
    assert {t.meta["world"] for t in far} == {"scale=1.0, seed=7"} and world_toolbox().world == "scale=1.0, seed=0"


def test_a_rollout_refuses_tasks_of_another_world_and_runs_those_of_its_own():
    """As a new user would: the tasks of `afm.rl.trainer.rl_tasks(seed=7)` (four world suites, twelve each) and the
    default
    toolbox, which searches world 0. None of the 48 has its pages in that toolbox's index, so before the check every
    episode scored 0 without a word; now evaluation and rollout refuse in one line naming both worlds."""
    from afm.models.engine import TransformersEngine
    from afm.rollout.evaluate import evaluate, suite_tasks
    from afm.models.catalog import tiny_chat_model
    from afm.rollout.loop import RolloutConfig, rollout
    from afm.tools.search import SearchConfig
    tasks = suite_tasks(12, "rl", WORLD_SUITES, seed=7)  # what rl_tasks(WORLD_SUITES, 12, seed=7) returns
    box = world_toolbox()
    index = box.config(SearchConfig).index
    unreadable = [t for t in tasks if any(index.get(s["url"]) is None for s in t.gold_path if s["op"] == "read")]
    assert len(tasks) == len(unreadable) == 48  # every task needs a page the default toolbox cannot find
    engine, cfg = TransformersEngine(*tiny_chat_model()), RolloutConfig(temperature=0, max_new_tokens=12)
    for run in (lambda: rollout(engine, tasks, box, cfg), lambda: evaluate(engine, tasks, box, cfg)):
        with pytest.raises(ValueError) as refused: run()
        said = str(refused.value)
        print(said)
        assert ("48 of 48 tasks" in said and "(scale=1.0, seed=7)" in said and "(scale=1.0, seed=0)" in said
                and "\n" not in said)
    own = world_toolbox(seed=7)  # the tools of the tasks' world: they run
    episodes = rollout(engine, tasks[:2], own, cfg)
    assert [e.task_id for e in episodes] == [t.id for t in tasks[:2]]
    records = evaluate(engine, tasks[:2], own, cfg)
    assert [r["task_id"] for r in records] == [t.id for t in tasks[:2]] and all(0.0 <= r["reward"] <= 1.0
                                                                                for r in records)
    math = suite_tasks(2, "test", ["gsm-symbolic"], seed=7)  # tasks of no world pass with any tools
    assert len(rollout(engine, math, box, cfg)) == 2

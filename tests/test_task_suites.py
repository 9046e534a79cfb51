"""The generated suites at the size the tiny profile uses: deterministic, disjoint splits, every question answerable."""
import json

import pytest

from afm.grading import grade
from afm.search import SearchIndex, wiki_documents
from afm.tasks import SPLITS, load_benchmark
from afm.world import GENERATED_SUITES, WORLD_SUITES, default_world, gold_answer, make_suites, verify_gold_path, world_documents

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

"""The trajectory browser (`afm browse`): a page built from real teacher runs, distilled rows and graded records, served
on localhost and read in headless Chromium over the DevTools protocol (the helpers of tests/test_docs.py).

Asserts what a reader sees: each task with every source that holds it, steps in their roles' colours, observations
marked as masked, format problems, model output shown as text (never markup), filters by suite, outcome and source that
change what is shown, and no request leaving localhost; a lone surrogate in a record shown escaped, and a record afm
would not write refused in one line naming its file and line. The browser tests skip, with the reason, only where
Debian's `chromium` (or websocket-client) is absent.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import AFM, ENV, REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed here "
                                    "(`make install` installs it with apt-get, which needs root)")
EVIL = "</script><script>alert(1)</script><img src=http://example.com/x.png> & <!--"
LONE = "half a pair: \ud83d, then text"  # a lone surrogate: JSON carries it (as an escape), UTF-8 has no bytes for it


def _episode(traj, cut=None):
    "An episode that wrote `traj`: whole, or its rendered text cut at `cut` characters (a format failure)."
    from afm.format.coa import parse, render
    from afm.rollout.loop import Episode
    t = traj if cut is None else parse(render(traj)[:cut], task_id=traj.task_id, question=traj.question)
    return Episode(traj.task_id, [], trajectory=t, end="answer" if cut is None else "unclosed",
                   format_error=(t.problems or [None])[0], tool_calls=sum(s.observation is not None for s in t.steps))


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict:
    """Real sources: the offline teacher on one task per suite (`afm.teacher.distill`), and a model's records made by
    `afm.rollout.evaluate.grade_episode` (every other kept trajectory whole, the rest cut short), one of them with
    hostile text
    and a lone surrogate."""
    from afm.format.coa import Trajectory
    from afm.teacher.distill import DistillConfig, distill
    from afm.rollout.evaluate import grade_episode
    d = tmp_path_factory.mktemp("browse")
    cfg = DistillConfig(tasks_per_suite=1, workers=1)
    distill(d / "distill", cfg, progress=False)
    tasks = {t.id: t for t in cfg.load_tasks()}
    kept = [Trajectory.from_json(json.loads(l)["trajectory"])
            for l in (d / "distill" / "sft.jsonl").read_text().splitlines()]
    recs = [grade_episode(tasks[t.task_id], _episode(t, None if i % 2 == 0 else 300)) for i, t in enumerate(kept)]
    evil = recs[0]["trajectory"]
    recs[0]["trajectory"] = {**evil, "steps": [{"role": "think", "text": EVIL, "observation": None},
                                               {"role": "think", "text": LONE, "observation": None}, *evil["steps"]]}
    (d / "model.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return {"dir": d, "tasks": tasks, "kept": kept, "records": recs}


@pytest.fixture(scope="module")
def site(sources) -> Path:
    "The page, written by `afm browse` as a user runs it."
    d = sources["dir"]
    r = subprocess.run([AFM, "browse", "--out", str(d / "site" / "index.html"),
                        "--records", f"model={d / 'model.jsonl'}", "--distill", str(d / "distill")],
                       capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    return d / "site"


@pytest.fixture(scope="module")
def tab(site, tmp_path_factory):
    "(base URL, a Chromium tab): the page's folder served on localhost, read in headless Chromium."
    pytest.importorskip("websocket", reason="websocket-client comes with the `docs` extra (`make install`)")
    if CHROMIUM is None: pytest.skip("Debian's chromium is not installed here")
    from test_docs import serve_and_open
    with serve_and_open(site, tmp_path_factory.mktemp("chromium")) as browser:
        yield browser


@pytest.fixture(scope="module")
def page(tab):
    "The page loaded from localhost; no request may leave it."
    from test_docs import load
    return load(tab, "index.html")


def shown_tasks(page) -> list[str]:
    return page.js("[...document.querySelectorAll('section.task')].filter(s => !s.hidden).map(s => "
                   "s.querySelector('.id').textContent)")


def click(page, name: str, value: str):
    assert page.js(f"(() => {{ const c = document.querySelector('input[name={name}][value=\"{value}\"]'); c.click(); "
                   f"return c.checked; }})()") is not None


@needs_chromium
def test_every_task_with_every_source(page, sources):
    cards = page.js("[...document.querySelectorAll('section.task')].map(s => [s.querySelector('.id').textContent, "
                    "s.querySelector('h2').textContent, [...s.querySelectorAll('.view')].map(v => v.dataset.source)])")
    kept = {t.task_id for t in sources["kept"]}
    assert len(cards) == len(sources["tasks"])
    for ident, question, views in cards:
        task_id = ident.split(" · ")[1]
        assert question == sources["tasks"][task_id].question
        assert views == (["teacher", "distilled", "model"] if task_id in kept else ["teacher"]), (task_id, views)
    facts = page.js("document.querySelector('.view[data-source=model] .facts').textContent")
    assert "reward" in facts and "tokens (sampled)" in facts and "tool calls" in facts, facts


@needs_chromium
def test_steps_in_their_roles_colours_and_observations_masked(page):
    from afm.report.browse import role_colours
    colours = page.js("Object.fromEntries([...document.querySelectorAll('.step')].map(s => [s.dataset.role, "
                      "getComputedStyle(s).borderLeftColor]))")
    want = {r: "rgb({}, {}, {})".format(*(int(c[i:i + 2], 16) for i in (1, 3, 5))) for r, c in role_colours().items()}
    assert {"think", "plan", "answer"} <= set(colours) and all(colours[r] == want[r] for r in colours), (colours, want)
    assert len({colours[r] for r in ("think", "plan", "answer")}) == 3
    masked = page.js("[...document.querySelectorAll('.view[data-source=distilled] .obs, .view[data-source=model] "
                     ".obs')].map(o => o.innerText)")
    assert masked and all("masked (not trained on)" in m for m in masked), masked[:2]
    teacher = page.js("[...document.querySelectorAll('.view[data-source=teacher] .obs')].map(o => o.innerText)")
    assert teacher and all("tool output" in t for t in teacher)
    assert page.js("document.querySelectorAll('.view[data-outcome=\"format failure\"] .problems').length") > 0


@needs_chromium
def test_model_output_stays_text(page):
    assert (page.js("document.querySelectorAll('img').length") == 0
            and page.js("document.querySelectorAll('script').length") == 2)
    assert EVIL in page.js("document.body.innerText")


@needs_chromium
def test_filters_change_what_is_shown(page, sources):
    all_tasks = shown_tasks(page)
    suites = {t.source for t in sources["tasks"].values()}
    keep = sorted(suites)[0]
    for s in suites - {keep}: click(page, "suite", s)
    assert shown_tasks(page) and all(i.startswith(keep + " · ") for i in shown_tasks(page)), shown_tasks(page)
    for s in suites - {keep}: click(page, "suite", s)
    assert shown_tasks(page) == all_tasks
    outcomes = page.js("[...document.querySelectorAll('input[name=outcome]')].map(c => c.value)")
    for o in outcomes:
        if o != "format failure": click(page, "outcome", o)
    failed = {r["task_id"] for r in sources["records"] if r["format_failure"]}
    assert failed and {i.split(" · ")[1] for i in shown_tasks(page)} == failed
    for o in outcomes:
        if o != "format failure": click(page, "outcome", o)
    click(page, "source", "teacher")
    assert page.js("[...document.querySelectorAll('.view[data-source=teacher]')].every(v => v.hidden)")
    assert len(shown_tasks(page)) == len(sources["kept"])  # the tasks only the teacher holds hide with it
    page.js("(() => { const q = document.getElementById('q'); q.value = %s; q.dispatchEvent(new Event('input')); })()"
            % json.dumps(sources["kept"][0].task_id))
    assert shown_tasks(page) == [f"{sources['tasks'][sources['kept'][0].task_id].source} · "
                                 f"{sources['kept'][0].task_id}"]
    assert "1 of" in page.js("document.getElementById('count').textContent")


def test_docs_site_links_the_page(tmp_path, site):
    "`make docs` copies a page `afm browse` wrote under reports/ into the site and links it from the results page."
    spec = importlib.util.spec_from_file_location("docs_build", REPO / "docs" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    reports, src, html = tmp_path / "reports", tmp_path / "src", tmp_path / "html"
    src.mkdir()
    (reports / "browse").mkdir(parents=True)
    build.write_results(src, reports)
    assert "browse/index.html" not in (src / "results.md").read_text() and not build.copy_browse(reports, html)
    shutil.copy(site / "index.html", reports / "browse" / "index.html")
    build.write_results(src, reports)
    assert '<a href="browse/index.html">' in (src / "results.md").read_text()
    assert (build.copy_browse(reports, html)
            and (html / "browse" / "index.html").read_bytes() == (site / "index.html").read_bytes())


def test_a_lone_surrogate_is_written_escaped(sources, site):
    """A record holding a lone surrogate (it used to fail the page's write with a bare UnicodeEncodeError): the page is
    written, UTF-8 through and through, the surrogate is the escape `\\ud83d` in its data, and the data reads back
    unchanged."""
    assert "\\ud83d" in (sources["dir"] / "model.jsonl").read_text()  # the records file holds it as JSON writes it
    html = (site / "index.html").read_bytes().decode("utf-8")
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S)[1])
    steps = [s[1] for t in data["tasks"] for v in t["views"] if v["source"] == "model" for s in v["steps"]]
    assert LONE in steps and "\\ud83d" in html


@needs_chromium
def test_a_lone_surrogate_shows_as_its_escape(page):
    texts = page.js("[...document.querySelectorAll('.view[data-source=model] .step pre')].map(p => p.textContent)")
    assert "half a pair: \\ud83d, then text" in texts, [t for t in texts if t.startswith("half")]
    assert "\ufffd" not in page.js("document.body.innerText")  # not a replacement character


@pytest.mark.parametrize("sample", ["1", 1.5, -1, True, None])
def test_a_record_afm_would_not_write_is_refused_in_one_line(sources, tmp_path, sample):
    """A `sample` that is no whole number from 0 (a string beside numbers crashed the sort of a task's views): refused,
    as `afm.rollout.evaluate.read_records` refuses such a record as damaged, in one line naming the file and line,
    before any
    page is written."""
    from afm.report.browse import collect
    from afm.rollout.evaluate import read_records
    rec = sources["records"][0]
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(rec) + "\n" + json.dumps({**rec, "sample": sample}) + "\n")
    says = f"{path}:2: a damaged record: sample must be a whole number from 0, got {sample!r}"
    with pytest.raises(ValueError) as e: collect({"mixed": path})
    assert str(e.value) == says
    with pytest.raises(ValueError, match="a damaged record"): read_records(path)  # afm's own reader agrees
    if sample == "1":  # a string beside an int: the case that was a TypeError traceback; the real command
        out = tmp_path / "site" / "index.html"
        r = subprocess.run([AFM, "browse", "--out", str(out), "--records", f"mixed={path}"],
                           capture_output=True, text=True, timeout=300, env=ENV)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stderr and not out.exists()


@needs_chromium
def test_gold_answers_and_why_each_grade_is_what_it_is(page, sources):
    "Each task shows its gold answers; the models' and the teacher's views are graded and say why."
    golds = page.js("[...document.querySelectorAll('section.task')].map(s => [s.querySelector('.id').textContent"
                    ".split(' · ')[1], s.querySelector('.gold') ? s.querySelector('.gold').textContent : null])")
    for task_id, gold in golds:
        task = sources["tasks"][task_id]
        assert gold == (None if task.kind == "code" else "gold: " + " · ".join(task.answers)), (task_id, gold)
    for source in ("model", "teacher"):
        whys = page.js(f"[...document.querySelectorAll('.view[data-source={source}]')].map(v => "
                       "v.querySelector('.why') ? v.querySelector('.why').textContent : null)")
        assert whys and all(w and w.startswith("why: ") for w in whys), (source, whys)
    outcomes = page.js("[...document.querySelectorAll('.view[data-source=teacher]')].map(v => v.dataset.outcome)")
    assert set(outcomes) <= {"solved", "partial", "failed", "teacher skipped", "teacher failed"}, outcomes


@needs_chromium
def test_search_reads_answers_tool_inputs_and_observations(page, sources):
    "A word only an observation holds finds its task: the search reads every word on the page, not just questions."
    task = sources["kept"][0]
    seen = [s.observation for s in task.steps if s.observation]
    words = [w for o in seen for w in re.findall(r"[A-Za-z]{6,}", o)
             if w.lower() not in task.question.lower() and w.lower() not in task.task_id.lower()]
    assert words, seen
    page.js("(() => { const q = document.getElementById('q'); q.value = %s; q.dispatchEvent(new Event('input')); })()"
            % json.dumps(words[0]))
    shown = [i.split(" · ")[1] for i in shown_tasks(page)]
    assert task.task_id in shown, (words[0], shown)
    page.js("(() => { const q = document.getElementById('q'); q.value = ''; q.dispatchEvent(new Event('input')); })()")


@needs_chromium
def test_the_outcome_filter_hides_the_views_it_excludes(page):
    outcomes = page.js("[...document.querySelectorAll('input[name=outcome]')].map(c => c.value)")
    for o in outcomes:
        if o != "format failure": click(page, "outcome", o)
    shown = page.js("[...document.querySelectorAll('section.task:not([hidden]) .view:not([hidden])')]"
                    ".map(v => v.dataset.outcome)")
    assert shown and set(shown) == {"format failure"}, shown
    for o in outcomes:
        if o != "format failure": click(page, "outcome", o)


@needs_chromium
def test_a_task_folds_and_the_header_stays(page):
    assert page.js("getComputedStyle(document.querySelector('header')).position") == "sticky"
    folds = page.js("(() => { const d = document.querySelector('section.task details'), was = d.open; "
                    "d.querySelector('summary').click(); const folded = d.open; "
                    "d.querySelector('summary').click(); return [was, folded, d.open]; })()")
    assert folds == [True, False, True], folds


@needs_chromium
def test_many_tasks_come_a_page_at_a_time(tab, site, sources):
    "A page of 45 tasks shows 20, then 20, then 5; a filter starts again at its first page."
    from afm.report.browse import write_page
    from test_docs import load
    rec = sources["records"][0]
    many = site.parent / "many.jsonl"
    many.write_text("".join(json.dumps({**rec, "task_id": f"{rec['suite']}/test/t{i:02d}"}) + "\n" for i in range(45)))
    write_page(site / "many.html", {"model": many})
    page = load(tab, "many.html")
    pages = []
    for _ in range(3):
        pages.append((len(shown_tasks(page)), page.js("document.getElementById('page').textContent")))
        page.js("document.getElementById('next').click()")
    assert pages == [(20, "page 1 of 3"), (20, "page 2 of 3"), (5, "page 3 of 3")], pages
    assert page.js("document.getElementById('next').disabled") and "45 of 45" in page.js(
        "document.getElementById('count').textContent")
    page.js("(() => { const q = document.getElementById('q'); q.value = 't0'; "
            "q.dispatchEvent(new Event('input')); })()")
    assert len(shown_tasks(page)) == 10 and page.js("document.getElementById('page').textContent") == "page 1 of 1"
    load(tab, "index.html")  # the module's other tests read the first page

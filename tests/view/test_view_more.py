"""``runner view``'s pages beyond the basics: the answers page's option texts, comparing three runs (or models)
against the first, the "why not a cache hit" endpoint and the run page's what-if pricing."""

from __future__ import annotations

import html
import json

import markupsafe
import pytest
import pytest_asyncio

from runner.engine.run import execute
from runner.errors import RunnerError
from runner.report import compare, explain, whatif
from tests.view.conftest import fetch, job, rows

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_answers_page_lists_the_option_texts_in_their_shown_order(view_runs, served):
    store, run = view_runs["store"], view_runs["a"]
    rows = [json.loads(line) for line in (view_runs["tmp"] / "a.jsonl").read_text().splitlines()]
    page = await fetch(f"{served}/runs/{run}/answers?limit=500")
    for task in store.tasks(run):
        result = json.loads(task["result_json"])
        choices = rows[int(result["id"]) - 1]["choices"]  # ids: line numbers from 1
        shown = "".join(f"<li>{'ABCD'[i]}. {html.escape(choices[p])}" + (" <b>(gold)</b>" if p == result["gold"]
                                                                          else "") + "</li>"
                        for i, p in enumerate(result["permutation"]))
        assert f'<ol class="options">{shown}</ol>' in page


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def third(view_runs) -> str:
    """Run C: run A's first 6 rows again (cache hits, so alpha is right on each, as in run A)."""
    tmp = view_runs["tmp"]
    dataset = rows(tmp / "c.jsonl", "which is right?", count=6)
    outcome = await execute(job(tmp, "viewc", dataset, view_runs["server"].url), view_runs["store"])
    assert outcome.status == "completed"
    return outcome.run_id


def _scores(store, run: str) -> dict[tuple[str, str], float]:
    return {(t["model"], t["row_id"]): t["score"] for t in store.tasks(run)}


async def test_three_runs_are_each_compared_with_the_first(view_runs, served, third):
    store, a, b, c = view_runs["store"], view_runs["a"], view_runs["b"], third
    page = await fetch(f"{served}/compare?run={b}&run={a}&run={c}")
    for other in (a, c):  # each pair's table as `runner compare B OTHER` prints it
        data = compare.build(store, b, other)
        assert '<h2 class="pair-title"' in page and html.escape(compare.title(data)) in page
        for row in compare.table_rows(data):
            assert "".join(f"<td>{html.escape(cell)}</td>" for cell in row) in page
    scores = {run: _scores(store, run) for run in (a, b, c)}
    differ = sorted((m, r) for (m, r), s in scores[b].items()
                    if scores[a].get((m, r), s) != s or scores[c].get((m, r), s) != s)
    assert differ and {m for m, _ in differ} == {"sim:alpha"}
    for model, row in differ:
        for run in (a, b, c) if (model, row) in scores[c] else (a, b):
            link = f'/runs/{run}/answers?stage=mc&model={model.replace(":", "%3A")}&row={row}"'
            assert link in page, (run, row)
    assert page.count(f'<a href="/runs/{b}/answers') == len(differ)
    assert page.count(f'<a href="/runs/{c}/answers') == len([d for d in differ if d in scores[c]])  # C: rows 1-6
    assert page.count('<table class="compare">') == 2


async def test_three_models_of_a_run_and_bad_combinations_are_answered_in_one_sentence(view_runs, served, third):
    store, a, b, c = view_runs["store"], view_runs["a"], view_runs["b"], third
    page = await fetch(f"{served}/compare?run={a}&model=sim:alpha&model=sim:beta&model=sim:beta")
    data = compare.build(store, a, None, models=("sim:alpha", "sim:beta"))
    for row in compare.table_rows(data):
        assert page.count("".join(f"<td>{html.escape(cell)}</td>" for cell in row)) == 2
    per_run = await fetch(f"{served}/compare?run={a}&run={b}&run={c}&model=sim:alpha&model=sim:beta&model=sim:alpha")
    for other, models in ((b, ("sim:alpha", "sim:beta")), (c, ("sim:alpha", "sim:alpha"))):
        for row in compare.table_rows(compare.build(store, a, other, models=models)):
            assert "".join(f"<td>{html.escape(cell)}</td>" for cell in row) in per_run
    bad = await fetch(f"{served}/compare?run={a}&run={b}&run={c}&model=sim:alpha&model=sim:beta", status=400)
    assert "?model= is given once (the same model in every run) or once per ?run= (3), not 2 times" in bad
    alone = await fetch(f"{served}/compare?run={a}", status=400)
    assert "one ?run= compares two or more models" in alone


async def test_the_explain_endpoint_answers_as_runner_explain_for_one_answer(view_runs, served, third):
    store, a, c = view_runs["store"], view_runs["a"], third
    task = next(t for t in store.tasks(a) if t["model"] == "sim:alpha" and t["row_id"] == "2")
    key = json.loads(task["result_json"])["cache_key"]
    got = await fetch(f"{served}/api/runs/{a}/explain?item=2&stage=mc&key={key}")
    whole = explain.build(store, "2", run_id=a, stage="mc")
    mine = [r for r in whole["requests"] if r["key"] == key]
    assert len(mine) == 1 and mine[0]["in_run"] == "sent" and len(whole["requests"]) == 2
    assert got["requests"] == json.loads(json.dumps(mine))
    assert got["text"] == explain.render({**whole, "requests": mine}, "text")
    assert "sent by this run: a miss" in got["text"]
    hit = await fetch(f"{served}/api/runs/{c}/explain?item=2&stage=mc")  # run C had both from the memo
    assert [r["in_run"] for r in hit["requests"]] == ["cache hit", "cache hit"] and "a cache hit" in hit["text"]
    bad = await fetch(f"{served}/api/runs/{a}/explain?item=99&stage=mc", status=400)
    assert bad["error"].startswith("item '99' is not in stage 'mc'")
    assert (await fetch(f"{served}/api/runs/{a}/explain", status=400))["error"].startswith("?item= names")
    page = await fetch(f"{served}/runs/{a}/answers?limit=500")
    assert page.count('class="explain-button"') == len(store.tasks(a))  # every answer of run A was sent
    assert 'class="explain-button"' not in await fetch(f"{served}/runs/{c}/answers?limit=500")


async def test_the_run_page_re_prices_the_run_as_runner_costs_does(view_runs, served):
    store, a = view_runs["store"], view_runs["a"]
    plain = await fetch(f"{served}/runs/{a}")
    assert 'class="whatif-table"' not in plain
    page = await fetch(f"{served}/runs/{a}?as=sim:beta&as=sim:alpha&batch=1")
    text = whatif.render(whatif.build(store, a, as_models=["sim:beta", "sim:alpha"], batch=True), "text")
    assert f'<pre class="whatif-table">{markupsafe.escape(text)}</pre>' in page
    assert "sim:beta" in text and "batch" in text.lower()
    typed = await fetch(f"{served}/runs/{a}?as=sim:beta+sim:alpha&batch=1")  # the form's field: names by spaces
    assert f'<pre class="whatif-table">{markupsafe.escape(text)}</pre>' in typed
    bad = await fetch(f"{served}/runs/{a}?as=nobody:none", status=400)
    with pytest.raises(RunnerError) as error:  # the sentence `runner costs RUN --as nobody:none` prints
        whatif.build(store, a, as_models=["nobody:none"])
    assert str(error.value) in html.unescape(bad) and "nobody:none" in str(error.value)

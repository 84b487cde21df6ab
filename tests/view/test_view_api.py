"""``runner view``'s JSON endpoints and pages over HTTP (no browser): the runs with their progress and spend as the
store counts them, paging and filters, a run's answers searched, filtered and paged, and bad parameters answered
with one sentence."""

from __future__ import annotations

import html
import re

import markupsafe
import pytest

from runner.report import compare
from runner.report import html as html_report
from tests.view.conftest import EVIL, NEEDLE, ROWS, fetch

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_runs_endpoint_counts_what_the_store_holds_and_pages(view_runs, served):
    store = view_runs["store"]
    data = await fetch(f"{served}/api/runs")
    assert data["total"] == 2 and {r["id"] for r in data["runs"]} == {view_runs["a"], view_runs["b"]}
    for run in data["runs"]:
        tasks = store.tasks(run["id"])
        assert (run["done"], run["failed"], run["total"]) == (len(tasks), 0, ROWS * 2)
        assert run["status"] == "completed" and run["models"] == ["sim:alpha", "sim:beta"] and run["budget"] == 5
        assert run["rate"] is None and run["eta"] is None  # a pace only while running
        scores = [t["score"] for t in tasks if t["score"] is not None]
        assert run["score"] == pytest.approx(sum(scores) / len(scores))
        assert run["spend"] == pytest.approx(store.charged(run["id"])) and run["spend"] > 0
    newest_first = [r["id"] for r in data["runs"]]
    assert newest_first == [view_runs["b"], view_runs["a"]]
    page = await fetch(f"{served}/api/runs?limit=1&offset=1")
    assert page["total"] == 2 and [r["id"] for r in page["runs"]] == [view_runs["a"]]
    oldest_first = await fetch(f"{served}/api/runs?sort=started&order=asc")
    assert [r["id"] for r in oldest_first["runs"]] == [view_runs["a"], view_runs["b"]]
    by_job = await fetch(f"{served}/api/runs?q=viewb")
    assert [r["id"] for r in by_job["runs"]] == [view_runs["b"]]
    assert (await fetch(f"{served}/api/runs?q=100%25"))["total"] == 0  # LIKE's wildcards are taken literally
    assert (await fetch(f"{served}/api/runs?status=failed"))["total"] == 0
    error = await fetch(f"{served}/api/runs?sort=colour", status=400)
    assert error == {"error": "?sort= is one of started, job, status, spend, id, not 'colour'"}
    # past the databases' 64-bit OFFSET: one sentence, not a 500 (issue 41)
    for offset in ("9223372036854775808", "-1"):
        error = await fetch(f"{served}/api/runs?offset={offset}", status=400)
        assert error == {"error": f"?offset= takes a number from 0 to 1,000,000,000,000,000, not {int(offset)}"}
    assert (await fetch(f"{served}/api/runs?offset=1000000000000000"))["runs"] == []


async def test_answers_are_searched_filtered_and_paged_without_loading_them_all(view_runs, served):
    store, run = view_runs["store"], view_runs["a"]
    base = f"{served}/api/runs/{run}/answers"
    everything = await fetch(f"{base}?limit=500")
    assert everything["total"] == ROWS * 2 == len(everything["answers"])
    seen = []
    for offset in range(0, ROWS * 2, 5):
        page = await fetch(f"{base}?limit=5&offset={offset}")
        assert page["total"] == ROWS * 2 and len(page["answers"]) == min(5, ROWS * 2 - offset)
        seen += [(a["model"], a["row"]) for a in page["answers"]]
    assert len(set(seen)) == ROWS * 2 == len(seen)
    found = await fetch(f"{base}?q={NEEDLE.split()[1]}")
    (answer,) = found["answers"]
    assert answer["result"]["response"] == f"I like {NEEDLE}" and answer["model"] == "sim:alpha"
    assert answer["request"]["messages"][0] == {"role": "system", "content": "Answer with one letter."}
    assert answer["key"] == store.tasks(run, model="sim:alpha", row_id=answer["row"])[0]["key"]
    assert answer["cache_hit"] is False and answer["cost"] > 0
    beta = await fetch(f"{base}?model=sim:beta&limit=3")
    assert beta["total"] == ROWS and {a["model"] for a in beta["answers"]} == {"sim:beta"}
    assert (await fetch(f"{base}?outcome=failed"))["total"] == 0
    assert (await fetch(f"{base}?outcome=done&stage=mc"))["total"] == ROWS * 2
    error = await fetch(f"{base}?outcome=maybe", status=400)
    assert error["error"] == "?outcome= is one of done, failed, not 'maybe'"
    assert "no run 'nosuchrun'" in (await fetch(f"{served}/api/runs/nosuchrun/answers", status=400))["error"]


async def test_the_pages_escape_the_runs_texts(view_runs, served):
    run = view_runs["a"]
    answers = await fetch(f"{served}/runs/{run}/answers?q=window.__x")
    assert EVIL not in answers and str(markupsafe.escape(EVIL)) in answers
    report = await fetch(f"{served}/runs/{run}")
    assert EVIL not in report and "Per stage and model" in report
    assert html_report.summary_table(html_report.build(view_runs["store"], run, max_samples=0)) in report
    missing = await fetch(f"{served}/runs/nosuchrun", status=400)
    assert "no run &#39;nosuchrun&#39;" in missing


async def test_the_compare_page_holds_the_text_reports_cells_and_the_items_that_differ(view_runs, served):
    store, a, b = view_runs["store"], view_runs["a"], view_runs["b"]
    data = compare.build(store, a, b)
    text = compare.render(data, "text")
    page = await fetch(f"{served}/compare?a={a}&b={b}")
    for row in compare.table_rows(data):
        assert f"{row[-4]} {row[-3]}" in " ".join(text.split())  # B - A and its interval, as `runner compare` prints
        assert "".join(f"<td>{html.escape(cell)}</td>" for cell in row) in page
    scores = {run: {(t["model"], t["row_id"]): t["score"] for t in store.tasks(run)} for run in (a, b)}
    differ = sorted((model, row) for (model, row), score in scores[a].items() if scores[b][model, row] != score)
    assert differ and {m for m, _ in differ} == {"sim:alpha"}  # beta answers A in both runs
    for model, row in differ:
        assert (f'/runs/{a}/answers?stage=mc&model={model.replace(":", "%3A")}&row={row}"') in page
    assert page.count(f'<a href="/runs/{b}/answers') == len(differ)


async def test_the_costs_page_has_the_sums_of_runner_costs(view_runs, served):
    from runner.report import costs

    page = await fetch(f"{served}/costs")
    for by in costs.BY:
        totals = costs.build(view_runs["store"], by=by)["totals"]
        assert f'data-by="{by}"' in page and f"${totals['charged']:.4f}" in page
    assert "since must be a date" in await fetch(f"{served}/costs?since=yesterday", status=400)


async def test_runner_view_serves_the_store_on_127_0_0_1_and_says_when_the_port_is_taken(view_runs, tmp_path):
    import asyncio
    import socket
    import subprocess
    import sys

    command = [sys.executable, "-m", "runner.cli", "view", "--db", str(view_runs["db"]), "--no-browser"]
    process = subprocess.Popen([*command, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = await asyncio.to_thread(process.stdout.readline)
        url = re.fullmatch(r"runner view: (http://127\.0\.0\.1:(\d+)/)\?token=(\S+) \(read-only; Ctrl-C stops it\)\n",
                           line)
        assert url, line
        data = await fetch(url.group(1) + "api/runs?token=" + url.group(3))
        assert {r["id"] for r in data["runs"]} == {view_runs["a"], view_runs["b"]}
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            done = await asyncio.to_thread(subprocess.run, [*command, "--port", str(port)], capture_output=True,
                                           text=True, timeout=60)
        assert done.returncode == 1 and done.stderr == (f"Error: port {port} on 127.0.0.1 is in use: choose another "
                                                        "with --port N\n")
    finally:
        process.terminate()
        process.wait(timeout=10)


async def test_the_same_reads_over_postgresql(view_runs, pg_url, tmp_path):
    from aiohttp import web

    from runner.engine.run import execute
    from runner.store import open_store
    from runner.view.app import make_app
    from tests.view.conftest import fetch, job, rows

    store = open_store(pg_url)
    outcome = await execute(job(tmp_path, "viewpg", rows(tmp_path / "a.jsonl", "which is right?"),
                                view_runs["server"].url), store)
    run = outcome.run_id
    runner = web.AppRunner(make_app(store), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        for sort in ("started", "spend", "job"):
            data = await fetch(f"{base}/api/runs?sort={sort}&q=viewp")
            (shown,) = data["runs"]
            assert (shown["id"], shown["done"], shown["total"]) == (run, ROWS * 2, ROWS * 2)
            assert shown["spend"] == pytest.approx(store.charged(run)) and shown["spend"] > 0
        found = await fetch(f"{base}/api/runs/{run}/answers?q={NEEDLE.split()[1]}")
        assert [a["result"]["response"] for a in found["answers"]] == [f"I like {NEEDLE}"]
        page = await fetch(f"{base}/api/runs/{run}/answers?limit=5&offset=20&model=sim:alpha")
        assert page["total"] == ROWS and len(page["answers"]) == 0
        assert len((await fetch(f"{base}/api/runs/{run}/answers?limit=5&offset=10"))["answers"]) == 5
        assert "sim:beta" in await fetch(f"{base}/compare?a={run}")
        assert "viewpg" in await fetch(f"{base}/costs")
        assert str(markupsafe.escape(EVIL)) in await fetch(f"{base}/runs/{run}/answers?q=__x")
        assert "Per stage and model" in await fetch(f"{base}/runs/{run}")
    finally:
        await runner.cleanup()


async def test_savings_by_the_batch_api_and_the_prompt_cache_are_summed_per_group(tmp_path):
    from runner.store import open_store
    from runner.store.view_reads import ViewReads

    store = open_store(tmp_path / "s.sqlite")
    run = store.create_run("savejob", "j.yaml", "{}", "fp", 3)
    tasks = [("1", "m:a", 0.25, 0.0, "2026-01-01"), ("2", "m:a", 0.5, 0.125, "2026-01-02"),
             ("3", "m:b", None, 0.0625, "2026-01-02"), ("4", "m:b", None, None, "2026-01-02")]
    for item, model, batch, cache, day in tasks:
        store.execute("INSERT INTO tasks (run_id, stage, item, model, status, batch_saved, cache_saved, updated)"
                      " VALUES (?, 'mc', ?, ?, 'done', ?, ?, ?)", (run, item, model, batch, cache, day))
    queries = ViewReads(store)
    assert queries.savings("model") == {"m:a": (0.75, 0.125), "m:b": (0.0, 0.0625)}
    assert queries.savings("job") == {"savejob": (0.75, 0.1875)}
    assert queries.savings("day", since="2026-01-02") == {"2026-01-02": (0.5, 0.1875)}

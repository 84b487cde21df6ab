"""``runner view`` in headless Chromium (Debian's, as tests/report/test_html_report.py drives it): a run started
while the runs page is open appears and its progress moves without a reload; a comparison of two runs shows the
paired difference ``runner compare`` prints; the "why not a cache hit" panel fills with ``runner explain``'s
text; a search finds an answer by its text; an answer written as markup is shown as text and runs no script; a
page under another name that resolves to 127.0.0.1 (DNS rebinding) and a request without the token are refused,
and another site's script cannot read the API. The pages ask nothing of any host but the viewer's."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from playwright.async_api import BrowserContext, async_playwright

from runner.engine.run import execute
from runner.report import compare, explain
from runner.store import open_store
from runner.view.app import make_app
from runner.view.guard import Guard
from tests.helpers import fresh
from tests.view.conftest import EVIL, NEEDLE, job, rows, script

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHROMIUM = Path("/usr/bin/chromium")
#: a name the browser resolves to 127.0.0.1, as a rebinding attacker's own name would
REBOUND = "evil.example"
#: rows of the run started during the test (two models, two at a time, 0.1 s each: about 3 s)
LIVE_ROWS = 30


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def browser(tmp_path_factory) -> AsyncIterator[tuple[BrowserContext, list[str]]]:
    """A Chromium context, and the list of the URLs it asked of any host but 127.0.0.1 (aborted)."""
    elsewhere: list[str] = []

    async def local_only(route: Any) -> None:
        if re.match(rf"^(https?|wss?)://(127\.0\.0\.1|{re.escape(REBOUND)})[:/]", route.request.url) \
                or route.request.url.startswith("data:"):
            await route.continue_()
        else:
            elsewhere.append(route.request.url)
            await route.abort()

    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")), executable_path=str(CHROMIUM), headless=True,
            viewport={"width": 1000, "height": 800}, device_scale_factor=1,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        await context.route("**/*", local_only)
        try:
            yield context, elsewhere
        finally:
            await context.close()
    assert elsewhere == []



async def until(read, done, seconds: float, what: str) -> None:
    """Read the page from here until ``done(await read())``, for at most ``seconds``. Not Playwright's
    ``wait_for_function``: it evaluates its expression as a string, which the viewer's Content-Security-Policy
    (no 'unsafe-eval') refuses whenever the first look finds the condition false."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not done(value := await read()):
        assert asyncio.get_running_loop().time() < deadline, f"waited {seconds} s for {what}; last seen {value!r}"
        await asyncio.sleep(0.05)

async def test_a_run_started_while_the_page_is_open_shows_up_and_its_progress_moves(view_runs, served, browser):
    context, _ = browser
    store, tmp = view_runs["store"], view_runs["tmp"]
    page = await context.new_page()
    await page.goto(served + "/")
    assert await page.locator("#runs tbody tr").count() == 2
    await page.evaluate("window.__same_page = true")
    server = fresh(view_runs["server"], script=str(script(tmp / "script.yaml")), latency=0.1)
    slow = job(tmp, "live", rows(tmp / "live.jsonl", "a slow one", LIVE_ROWS), server.url, concurrency=2)
    known = {r["id"] for r in store.list_runs()}
    task = asyncio.create_task(execute(slow, store))
    try:
        for _ in range(100):
            new = [r["id"] for r in store.list_runs() if r["id"] not in known]
            if new:
                break
            await asyncio.sleep(0.05)
        (run,) = new
        progress = page.locator(f'#runs tr[data-run="{run}"] td.progress')
        await progress.wait_for(timeout=5000)
        assert await page.locator(f'#runs tr[data-run="{run}"] td.status').inner_text() == "running"
        first = await progress.inner_text()
        done, total = map(int, first.split("/"))
        assert total == 2 * LIVE_ROWS and done < total
        await until(lambda: progress.inner_text(), lambda text: text != first, 10, "the run's progress to move")
        later = int((await progress.inner_text()).split("/")[0])
        assert done < later <= total
        pace = await page.locator(f'#runs tr[data-run="{run}"] td.pace').inner_text()
        if later < total:  # tasks per second and the seconds left, while it runs
            assert re.fullmatch(r"\d+\.\d/s · \d+ s", pace), pace
        outcome = await task
        assert outcome.status == "completed"
        status = page.locator(f'#runs tr[data-run="{run}"] td.status')
        await until(lambda: status.inner_text(), lambda text: text == "completed", 5, "the run shown completed")
        assert await progress.inner_text() == f"{total}/{total}"
        assert await page.locator(f'#runs tr[data-run="{run}"] td.pace').inner_text() == ""
        assert await page.evaluate("window.__same_page") is True  # never reloaded
    finally:
        if not task.done():
            task.cancel()
        fresh(view_runs["server"], script=str(script(tmp / "script.yaml")))


async def test_a_comparison_shows_the_paired_difference_runner_compare_prints(view_runs, served, browser):
    context, _ = browser
    a, b = view_runs["a"], view_runs["b"]
    data = compare.build(view_runs["store"], a, b)
    text = " ".join(compare.render(data, "text").split())
    page = await context.new_page()
    await page.goto(f"{served}/compare")
    await page.fill("input[name=a]", a)
    await page.fill("input[name=b]", b)
    await page.click("button[type=submit]")
    table = page.locator("table.compare tbody tr")
    assert await table.count() == len(data["rows"]) == 2
    headers = await page.locator("table.compare thead th").all_inner_texts()
    assert headers == compare.headers(data)
    for i, row in enumerate(data["rows"]):
        shown = await table.nth(i).locator("td").all_inner_texts()
        assert shown == compare.table_rows(data)[i]
        assert " ".join(shown) in text  # the text report's line, cell for cell
        difference, interval = shown[headers.index("B - A (points)")], shown[headers.index("95% CI")]
        assert difference == f"{100 * row['difference']:+.1f}"
        assert interval == ("-" if row["low"] is None else f"[{100 * row['low']:+.1f}, {100 * row['high']:+.1f}]")
    assert any(row["low"] is not None for row in data["rows"])
    link = page.locator("table.disagree a").first
    await link.click()
    assert await page.locator(".answer").count() == 1


async def test_the_why_not_a_cache_hit_panel_fills_with_runner_explains_text(view_runs, served, browser):
    context, _ = browser
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"{served}/runs/{view_runs['a']}/answers?row=2&model=sim%3Aalpha")
    answer = page.locator(".answer")
    assert await answer.count() == 1
    panel = answer.locator("pre.explain-text")
    assert not await panel.is_visible()
    await answer.locator("button.explain-button").click()
    await until(lambda: panel.text_content(), lambda text: len(text or "") > 5, 10, "the explain panel filled")
    key = await answer.locator(".explain").get_attribute("data-key")
    data = explain.build(view_runs["store"], "2", run_id=view_runs["a"], stage="mc")
    expected = explain.render({**data, "requests": [r for r in data["requests"] if r["key"] == key]}, "text")
    assert await panel.inner_text() == expected and "sent by this run: a miss" in expected
    assert errors == []


async def test_a_search_finds_an_answer_by_its_text(view_runs, served, browser):
    context, _ = browser
    page = await context.new_page()
    await page.goto(f"{served}/runs/{view_runs['a']}/answers")
    assert await page.locator(".answer").count() == 24
    await page.fill("input[name=q]", NEEDLE)
    await page.click("button[type=submit]")
    answers = page.locator(".answer")
    assert await answers.count() == 1
    assert await answers.locator("pre.response").inner_text() == f"I like {NEEDLE}"
    prompt = answers.locator("details.prompt")
    assert "Answer with one letter." not in await prompt.inner_text()  # folded until asked for
    await prompt.locator("summary").click()
    assert "Answer with one letter." in await prompt.inner_text()  # the prompt as sent, from the memo
    assert await page.locator(".pages .count").first.inner_text() == "1–1 of 1"


async def test_an_answer_written_as_markup_is_shown_as_text_and_runs_no_script(view_runs, served, browser):
    context, _ = browser
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    for path in (f"/runs/{view_runs['a']}/answers?q=window.__x", f"/runs/{view_runs['a']}"):
        await page.goto(served + path)
        shown = page.get_by_text(EVIL, exact=False).first
        await shown.scroll_into_view_if_needed()
        if "answers" in path:
            assert await page.locator("pre.response").inner_text() == EVIL
            assert await shown.is_visible()
        assert await page.evaluate("[typeof window.__x, typeof window.__y]") == ["undefined", "undefined"]
        assert await page.locator("img").count() == 0
    assert errors == []


async def test_no_page_is_wider_than_a_1000_px_window(view_runs, served, browser):
    context, _ = browser
    page = await context.new_page()  # the context's viewport is 1,000 px wide
    a, b = view_runs["a"], view_runs["b"]
    for path in ("/", f"/runs/{a}", f"/runs/{a}/answers", f"/compare?a={a}&b={b}", "/costs"):
        await page.goto(served + path)
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 1000, (path, width)


async def test_a_rebound_name_and_a_request_without_the_token_are_refused_and_the_token_opens_the_page(
        view_runs, browser):
    context, _ = browser
    token = "the-token-of-this-test"
    viewer = web.AppRunner(make_app(open_store(view_runs["db"]), Guard(token)), access_log=None)
    attacker = web.Application()  # another site on this machine, whose script tries to read the viewer's API

    async def attack_page(request: web.Request) -> web.Response:
        return web.Response(text="<p>attacker</p>", content_type="text/html")

    attacker.router.add_get("/", attack_page)
    elsewhere = web.AppRunner(attacker, access_log=None)
    for runner in (viewer, elsewhere):
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
    port, other = viewer.addresses[0][1], elsewhere.addresses[0][1]
    page = await context.new_page()
    try:
        # the attacker's name resolves to 127.0.0.1: Chromium sends Host: evil.example:PORT, and is refused
        response = await page.goto(f"http://{REBOUND}:{port}/?token={token}")
        assert response.status == 403 and "only at its own address" in await page.inner_text("body")
        response = await page.goto(f"http://127.0.0.1:{port}/costs")
        assert response.status == 403 and "asks for its token" in await page.inner_text("body")

        response = await page.goto(f"http://127.0.0.1:{port}/?token={token}")
        assert response.status == 200 and page.url == f"http://127.0.0.1:{port}/"  # the token left the URL
        runs = len(view_runs["store"].list_runs())  # the module's earlier tests may have added one
        assert await page.locator("#runs tbody tr").count() == runs
        rows_seen = await page.evaluate("fetch('/api/runs').then(r => r.json()).then(d => d.runs.length)")
        assert rows_seen == runs  # the page's own requests carry the cookie
        assert (await page.goto(f"http://127.0.0.1:{port}/costs")).status == 200

        # with the viewer's cookie in the browser, another site's script still cannot read an answer (no CORS)
        await page.goto(f"http://127.0.0.1:{other}/")
        outcome = await page.evaluate(f"""fetch('http://127.0.0.1:{port}/api/runs', {{credentials: 'include'}})
            .then(r => r.text()).then(t => 'read: ' + t, e => 'refused: ' + e.name)""")
        assert outcome == "refused: TypeError", outcome
    finally:
        await page.close()
        for runner in (viewer, elsewhere):
            await runner.cleanup()

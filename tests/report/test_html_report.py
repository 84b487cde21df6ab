"""``runner report RUN --format html -o FILE``: one self-contained page built from the text report's data, checked
on its content and then in headless Chromium (plots drawn, the answer filter counts what the store counts); and the
report's SE and 95% interval over items and its breakdowns by recorded fields, in every format."""

from __future__ import annotations

import csv
import html
import io
import json
import math
import re
import statistics
from pathlib import Path

import pytest
import pytest_asyncio

from runner.engine.run import execute
from runner.report import cells as report_cells
from runner.report import funnel, item_scores, layouts
from runner.report import html as html_report
from runner.report import summary as reports
from runner.report.plots import accuracy_plot
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import fresh, run_cli, write_job, write_rows

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHROMIUM = Path("/usr/bin/chromium")
MODELS = ["sim:alpha", "sim:beta", "sim:gamma"]
ROWS = 12
EVIL = '<script>alert("pwned")</script>'
#: a recorded field's values (one is markup, shown as text)
SUBJECTS = ["law", "math", "<i>art</i>"]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def built(shared_srv, tmp_path_factory):
    """A run of 12 rows × 3 models × seeds 0, 1, 2 with shuffled options against the simulated server; scripted
    answers make some invalid, row 0's question carries a <script> tag, and the run gets pipeline funnel rows."""
    tmp = tmp_path_factory.mktemp("html")
    dataset = write_rows(tmp / "rows.jsonl", ROWS)
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    rows[0]["question"] = f"Question number 0 {EVIL}: which is right?"
    for i, row in enumerate(rows):  # recorded fields: the scores are broken down by them
        row["subject"], row["number"] = SUBJECTS[i % len(SUBJECTS)], i
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    script = tmp / "script.yaml"
    script.write_text("responses:\n"
                      "  - {contains: ['Question number 3:'], response: 'no idea'}\n"
                      "  - {contains: ['Question number 5:'], model: beta, response: 'Maybe so'}\n")
    server = fresh(shared_srv, script=str(script))
    extra = "\n".join([
        f"providers: {{sim: {{base_url: {json.dumps(server.url)}, concurrency: 8, timeout: 5}}}}",
        "prices: {sim:alpha: {input: 1.5, output: 4.0}, sim:beta: {input: 0.5, output: 1.0}}",
        "report: {layout: knowno, styles: {with_gold: mc}}",
    ])
    job = load_job(write_job(tmp / "job.yaml", dataset, models=MODELS, extra=extra, seeds="[0, 1, 2]",
                             name="htmljob", stage_extra="    record: [subject, number]"))
    db = tmp / "cache.sqlite"
    store = open_store(db)
    outcome = await execute(job, store)
    assert outcome.status == "completed"
    # The funnel rows a pipeline run records (runner/engine/pipeline.py), so the page's funnel is drawn too.
    store.record_run_stage(outcome.run_id, "gen", 0, "h0", {"stage": "gen", "kind": "llm", "rows_in": 12,
                                                           "rows_out": 9, "sent": 12, "cost": 0.01, "reused": False,
                                                           "rejected": {"too short": 3}})
    store.record_run_stage(outcome.run_id, "keep", 1, "h1", {"stage": "keep", "kind": "filter", "rows_in": 9,
                                                            "rows_out": 5, "cost": 0.0, "reused": False,
                                                            "dropped": {"rated below 5": 4}, "write": "good.jsonl"})
    out = tmp / "report.html"
    html_report.write(store, outcome.run_id, out)
    return {"store": store, "run": outcome.run_id, "db": db, "path": out, "page": out.read_text(encoding="utf-8"),
            "tmp": tmp}


def _outcomes(store, run_id: str) -> dict[str, int]:
    counts = {"correct": 0, "wrong": 0, "invalid": 0}
    for t in store.tasks(run_id):
        assert t["status"] == "done"
        counts["invalid" if not t["valid"] else "correct" if t["score"] == 1 else "wrong"] += 1
    return counts


async def test_the_page_holds_the_text_reports_figures(built):
    store, run, page = built["store"], built["run"], built["page"]
    data = reports.build(store, run)
    text = reports.render(data, "text")
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    # self-contained: nothing is fetched
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page) and "@import" not in page
    assert len(data["rows"]) == len(MODELS)
    for row in data["rows"]:
        accuracy = report_cells.accuracy_text(row)
        assert row["accuracy_std"] is not None and len(row["accuracy_by_seed"]) == 3
        assert accuracy in text and html.escape(accuracy) in page
        for cell in (f"${row['cost']:.4f}", f"${row['saved']:.4f}", f"{row['input_tokens']} "
                     f"({row['cached_input_tokens']})", str(row["invalid"])):
            assert cell in text and f"<td>{html.escape(cell)}</td>" in page
    priced = next(row for row in data["rows"] if row["model"] == "sim:alpha")  # rows come in the order answered
    assert priced["cost"] > 0 and data["totals"]["cost"] > 0
    total = next(line for line in text.splitlines() if line.startswith("Total: "))
    assert html.escape(total) in page
    # the paper's table: Know-No's layout, cell for cell
    assert "<h2>The paper's table</h2>" in page
    for row in data["layout"]["rows"]:
        cell = layouts.cell(row["with_gold"])
        assert "±" in cell and cell in text and f"<td>{html.escape(cell)}</td>" in page
    # the funnel, as the text report prints it
    assert "Pipeline funnel" in page and "rated below 5 4" in page and "too short 3" in page
    assert html.escape(funnel.summary(data["pipeline"])) in page
    # plots: accuracy with a whisker per model and a dot per seed, cost and requests, one heatmap per model
    assert page.count('data-plot="accuracy"') == 1 and page.count('class="errorbar"') == len(MODELS)
    assert page.count("<circle") == 3 * len(MODELS)
    assert 'data-plot="cost"' in page and 'data-plot="requests"' in page and 'data-plot="funnel"' in page
    assert page.count('data-plot="position"') == len(MODELS)


async def test_one_sample_per_task_with_its_prompt_escaped(built):
    store, run, page = built["store"], built["run"], built["page"]
    tasks = store.tasks(run)
    assert len(tasks) == ROWS * len(MODELS) * 3
    assert page.count('<details class="sample"') == len(tasks)
    counts = _outcomes(store, run)
    assert counts["invalid"] == 3 * 3 + 3 and counts["wrong"] and counts["correct"]
    for kind, n in counts.items():
        assert page.count(f'data-outcome="{kind}"') == n
    for model in MODELS:
        assert page.count(f'data-model="{model}"') == ROWS * 3
    # the prompt's <script> is shown as text, never run; the page has only its own script
    assert EVIL not in page and html.escape(EVIL) in page
    assert page.count("<script>") == 1
    assert "no idea" in page and "Maybe so" in page and '<ol class="options"><li>A. ' in page
    assert "Answer with one letter." in page  # the system prompt, from the memo
    assert 'id="left-out"' not in page


async def test_large_runs_embed_the_first_answers_and_say_how_many_were_left_out(built):
    data = html_report.build(built["store"], built["run"], max_samples=10)
    page = html_report.render(data)
    assert page.count('<details class="sample"') == 10
    assert f"10 of {ROWS * len(MODELS) * 3} answers are embedded; {ROWS * len(MODELS) * 3 - 10} were left out" in page


async def test_the_cli_writes_the_page_and_html_needs_an_output(built, monkeypatch, capsys, tmp_path):
    out = tmp_path / "r.html"
    code, stdout, _ = run_cli(monkeypatch, capsys, "report", built["run"], "--db", str(built["db"]), "--format",
                              "html", "-o", str(out))
    assert code == 0 and f"wrote {out}" in stdout
    assert out.read_text(encoding="utf-8").count('<details class="sample"') == ROWS * len(MODELS) * 3
    code, stdout, err = run_cli(monkeypatch, capsys, "report", built["run"], "--db", str(built["db"]), "--format",
                                "html")
    assert code == 1 and err.startswith("Error: ") and "-o" in err and len(err.strip().splitlines()) == 1


_COUNT_INK = """async ({png, boxes}) => {
  const img = new Image();
  img.src = 'data:image/png;base64,' + png;
  await img.decode();
  const canvas = document.createElement('canvas');
  canvas.width = img.width; canvas.height = img.height;
  const ctx = canvas.getContext('2d');
  ctx.drawImage(img, 0, 0);
  return boxes.map(b => {
    const d = ctx.getImageData(Math.floor(b.x), Math.floor(b.y), Math.ceil(b.width), Math.ceil(b.height)).data;
    let ink = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i] < 235 || d[i + 1] < 235 || d[i + 2] < 235) ink++;
    return ink / (d.length / 4);
  });
}"""


@pytest.mark.skipif(not CHROMIUM.exists(), reason="headless Chromium is not installed at /usr/bin/chromium "
                                                   "(apt-get install chromium; .ci/run does)")
async def test_in_chromium_the_plots_render_and_the_filter_counts_what_the_store_counts(built, tmp_path):
    import base64

    from playwright.async_api import async_playwright

    store, run = built["store"], built["run"]
    wrong = _outcomes(store, run)["wrong"]
    async with async_playwright() as pw:
        browser = await pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True, offline=True,
            viewport={"width": 1300, "height": 900}, device_scale_factor=1,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            page = await browser.new_page()
            await page.goto(built["path"].resolve().as_uri())
            plots = page.locator("svg.plot")
            assert await plots.count() == 3 + len(MODELS) + 1  # accuracy, cost, requests, heatmaps, funnel
            boxes = [await plots.nth(i).bounding_box() for i in range(await plots.count())]
            assert all(b and b["width"] > 50 and b["height"] > 50 for b in boxes), boxes
            shot = tmp_path / "report.png"
            png = await page.screenshot(path=str(shot), full_page=True)
            ink = await page.evaluate(_COUNT_INK, {"png": base64.b64encode(png).decode(), "boxes": boxes})
            assert all(share > 0.02 for share in ink), ink  # every plot has drawn something
            assert await page.locator('svg[data-plot="accuracy"] rect.bar').count() == len(MODELS)
            assert await page.locator('svg[data-plot="position"] rect.cell').count() == 16 * len(MODELS)
            samples = page.locator("#samples .sample")
            assert await samples.count() == ROWS * len(MODELS) * 3
            assert await page.locator("#shown").inner_text() == str(ROWS * len(MODELS) * 3)

            await page.select_option("#f-outcome", "wrong")
            assert await page.locator("#samples .sample:visible").count() == wrong
            assert await page.locator("#shown").inner_text() == str(wrong)
            await page.select_option("#f-model", "sim:beta")
            beta = sum(1 for t in store.tasks(run, model="sim:beta") if t["valid"] and t["score"] == 0)
            assert await page.locator("#samples .sample:visible").count() == beta
            await page.select_option("#f-outcome", "invalid")
            assert await page.locator("#samples .sample:visible").count() == 3 + 3
            # an escaped prompt is shown as text: the <script> in it never ran
            assert await page.evaluate("document.querySelectorAll('script').length") == 1
            await page.select_option("#f-model", "")
            await page.select_option("#f-outcome", "")
            first = page.locator("#samples .sample", has_text="pwned").first
            await first.locator("summary").click()
            assert EVIL in await first.inner_text()
        finally:
            await browser.close()
    # keep a copy for a person to look at
    built["tmp"].joinpath("report.png").write_bytes(shot.read_bytes())


async def test_a_refusal_is_its_own_outcome_and_thinking_is_shown_escaped():
    refused = {"stage": "mc", "model": "m", "id": "1", "status": "failed", "error_class": "refused",
               "error": "the model refused", "score": None}
    assert html_report.outcome(refused) == "refused"
    assert html_report.outcome({**refused, "error_class": "server_error"}) == "failed"
    assert 'data-outcome="refused"' in html_report.sample_html(refused)
    answered = {"stage": "mc", "model": "m", "id": "2", "status": "done", "response": '{"answer": "B"}',
                "thinking": f"maybe {EVIL} C", "reasoning_tokens": 9, "parsed": {"answer": "B"}, "answer": 0,
                "answer_letter": "B", "valid": True, "score": 1.0, "gold": 0}
    sample = html_report.sample_html(answered)
    assert f"<dt>thinking</dt><dd><pre>maybe {html.escape(EVIL)} C</pre></dd>" in sample and EVIL not in sample
    assert "<dt>reasoning tokens</dt><dd><pre>9</pre></dd>" in sample
    assert "<dt>answer field</dt><dd><pre>0</pre></dd>" in sample and " → B</summary>" in sample


def _item_means(store, run_id: str) -> dict[str, dict[str, float]]:
    """Per model, each row's mean score over its seeds, from the store's task rows (by hand, not by the report)."""
    scores: dict[str, dict[str, list[float]]] = {}
    for task in store.tasks(run_id):
        if task["score"] is not None:
            row_id = json.loads(task["result_json"])["id"]
            scores.setdefault(task["model"], {}).setdefault(row_id, []).append(task["score"])
    return {model: {row: statistics.fmean(v) for row, v in rows.items()} for model, rows in scores.items()}


def _by_hand(means: list[float]) -> tuple[float, float, float, float]:
    mean = statistics.fmean(means)
    se = statistics.stdev(means) / math.sqrt(len(means))
    return mean, se, max(0.0, mean - 1.959964 * se), min(1.0, mean + 1.959964 * se)


async def test_the_se_and_95_interval_over_items_are_in_every_format(built):
    store, run, page = built["store"], built["run"], built["page"]
    data = reports.build(store, run)
    means = _item_means(store, run)
    text, md = reports.render(data, "text"), reports.render(data, "md")
    table = list(csv.DictReader(io.StringIO(reports.render(data, "csv"))))
    as_json = json.loads(reports.render(data, "json"))
    assert as_json["ci_method"]["interval"] == "normal" and report_cells.CI_NOTE in text and report_cells.CI_NOTE in md
    assert html.escape(report_cells.CI_NOTE) in page
    for row in data["rows"]:
        figures = row["items"]
        mean, se, low, high = _by_hand(list(means[row["model"]].values()))
        assert figures["n"] == ROWS and figures["ci_method"] == "normal"
        assert (figures["mean"], figures["se"]) == (pytest.approx(mean), pytest.approx(se))
        assert (figures["low"], figures["high"]) == (pytest.approx(low, abs=1e-5), pytest.approx(high, abs=1e-5))
        assert figures["mean"] == pytest.approx(row["accuracy"])  # every row answered under every seed
        cells = [str(ROWS), f"{100 * se:.1f}", f"[{100 * low:.1f}%, {100 * high:.1f}%]"]
        assert cells == report_cells.item_cells(row)
        assert " ".join([*cells, report_cells.accuracy_text(row)]) in " ".join(text.split())
        assert "".join(f"<td>{html.escape(c)}</td>" for c in cells) in page
        assert f"| {cells[0]} | {cells[1]} | {cells[2]} | {report_cells.accuracy_text(row)} |" in md
        (cell,) = [r for r in table if r["model"] == row["model"] and not r["by_field"] and not r.get("layout")]
        assert (int(cell["items"]), cell["ci_method"]) == (ROWS, "normal")
        assert float(cell["item_se"]) == pytest.approx(se)
        (in_json,) = [r for r in as_json["rows"] if r["model"] == row["model"]]
        assert in_json["items"]["se"] == pytest.approx(se)
    summary = reports.summary_lines(data)
    for row in data["rows"]:  # the lines printed at the end of submit
        assert any(line.startswith(f"accuracy: mc {row['model']}:") and f"95% CI {report_cells.ci_text(row['items'])} "
                   f"over {ROWS} items" in line for line in summary), summary


async def test_scores_are_broken_down_by_each_recorded_field_in_every_format(built):
    store, run, page = built["store"], built["run"], built["page"]
    data = reports.build(store, run)
    means = _item_means(store, run)
    # the row ids are the rows' line numbers (from 1)
    subject_of = {str(i + 1): SUBJECTS[i % len(SUBJECTS)] for i in range(ROWS)}
    assert set(means["sim:alpha"]) == set(subject_of)
    text, md = reports.render(data, "text"), reports.render(data, "md")
    table = list(csv.DictReader(io.StringIO(reports.render(data, "csv"))))
    for row in data["rows"]:
        assert set(row["by_field"]) == {"subject", "number"} and row["fields_left_out"] == {}
        assert list(row["by_field"]["number"]) == [str(i) for i in range(ROWS)]  # in numeric order
        for subject in SUBJECTS:
            values = [m for item, m in means[row["model"]].items() if subject_of[item] == subject]
            figures = row["by_field"]["subject"][subject]
            assert figures["n"] == len(values) == ROWS // len(SUBJECTS)
            assert figures["mean"] == pytest.approx(statistics.fmean(values))
            if figures["ci_method"] == "normal":
                assert figures["se"] == pytest.approx(_by_hand(values)[1])
            else:  # every item of the subject alike: Wilson's interval for 0/1 items, else none
                assert figures["se"] == 0.0
                assert figures["ci_method"] == ("wilson" if set(values) <= {0.0, 1.0} else None)
            cells = [row["model"], subject, str(figures["n"]), report_cells.pct(figures["mean"]),
                     report_cells.se_text(figures), report_cells.ci_text(figures)]
            assert "".join(f"<td>{html.escape(c)}</td>" for c in cells) in page
            assert "| " + " | ".join(cells) + " |" in md
            assert " ".join(cells) in " ".join(text.split())
            (line,) = [r for r in table if (r["model"], r["by_field"], r["by_value"]) == (row["model"], "subject",
                                                                                          subject)]
            assert int(line["items"]) == figures["n"] and line["ci_method"] == (figures["ci_method"] or "")
    assert "mc by subject (accuracy over items, SE in points, 95% CI)" in text
    assert "<h2>Scores by recorded field</h2>" in page and "<i>art</i>" not in page
    assert len([r for r in table if r["by_field"] == "number"]) == ROWS * len(MODELS)


async def test_fields_with_many_values_are_left_out_unless_asked_for_with_by(built, monkeypatch, capsys):
    store, run = built["store"], built["run"]
    monkeypatch.setattr(item_scores, "MAX_BREAKDOWN_VALUES", 5)
    data = reports.build(store, run)
    assert all(set(r["by_field"]) == {"subject"} and r["fields_left_out"] == {"number": ROWS} for r in data["rows"])
    note = f"mc: not broken down by number ({ROWS} values, more than 5); `runner report {run} --by number` shows it"
    assert note in reports.render(data, "text") and note in reports.render(data, "md")
    assert html.escape(note) in html_report.render(html_report.build(store, run, max_samples=1))
    by = reports.build(store, run, by="number")
    assert all(set(r["by_field"]) == {"number"} and not r["fields_left_out"] for r in by["rows"])
    code, out, _ = run_cli(monkeypatch, capsys, "report", run, "--db", str(built["db"]), "--by", "number")
    assert code == 0 and "mc by number" in out and "mc by subject" not in out and "not broken down" not in out
    code, out, err = run_cli(monkeypatch, capsys, "report", run, "--db", str(built["db"]), "--by", "topic")
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"Error: --by topic: no stage of run {run} records a field 'topic' (recorded: number, "
                          "subject)")


def _accuracy_row(stage: str, chance: float | None) -> dict:
    return {"stage": stage, "model": "m", "scored": 4, "accuracy_mean": 0.5, "accuracy_std": 0.1,
            "accuracy_by_seed": {"0": 0.4, "1": 0.6}, "chance": chance}


async def test_chance_line_sits_at_one_over_the_options_shown_and_is_absent_for_free_text():
    """A 4-option stage's line at 25%, a 2-option stage's at 50% (x = 270 + share × 420), none for free text;
    unscored and failed answers do not count toward the mean."""
    four = [{"model": "m", "score": 1.0, "options_shown": ["a", "b", "c", "d"]},
            {"model": "m", "score": None, "options_shown": ["a", "b"]}]
    two = [{"model": "m", "score": 0.0, "permutation": [1, 0]}]
    mixed = [{"model": "m", "score": 1.0, "permutation": [0, 1]}, {"model": "m", "score": 0.0,
                                                                   "options_shown": ["a", "b", "c", "d"]}]
    free = [{"model": "m", "score": 1.0, "response": "Paris"}]
    levels = {name: html_report.chance_levels(rs) for name, rs in
              (("four", four), ("two", two), ("mixed", mixed), ("free", free))}
    assert levels == {"four": {"m": 0.25}, "two": {"m": 0.5}, "mixed": {"m": 0.375}, "free": {}}
    svg = accuracy_plot([_accuracy_row(n, levels[n].get("m")) for n in ("four", "two", "free")])
    lines = re.findall(r'<line class="chance" x1="([\d.]+)" y1="([\d.]+)"', svg)
    assert [(float(x), float(y)) for x, y in lines] == [(270 + 0.25 * 420, 30.0), (270 + 0.5 * 420, 60.0)]
    assert "<title>chance 25.0%" in svg and "<title>chance 50.0%" in svg and svg.count('class="chance"') == 4


async def test_the_report_draws_each_rows_chance_line_from_its_four_shown_options(built):
    data = html_report.build(built["store"], built["run"], max_samples=1)
    assert {r["model"]: r["chance"] for r in data["rows"]} == {m: 0.25 for m in MODELS}
    assert len(re.findall(r'<line class="chance" x1="375.0"', built["page"])) == len(
        [r for r in data["rows"] if r["scored"] or r.get("judged_by")])


async def test_the_answers_show_each_options_text_in_its_shown_order_not_its_index(built):
    """Without ``options_shown`` in the result line the texts are read back from the prompt as sent; each listed in
    the permuted order with the gold one marked, escaped; a prompt without an options block keeps the indices."""
    rows = [json.loads(line) for line in (built["tmp"] / "rows.jsonl").read_text().splitlines()]
    data = html_report.build(built["store"], built["run"], max_samples=40)
    checked = 0
    for result in data["samples"]:
        if result.get("_request") is None or not result.get("permutation"):
            continue
        choices = rows[int(result["id"]) - 1]["choices"]  # ids: line numbers from 1
        options = html_report.shown_options(result)
        assert [o["text"] for o in options] == [choices[p] for p in result["permutation"]]
        assert [o["gold"] for o in options] == [p == result["gold"] for p in result["permutation"]]
        page = html_report.sample_html(result)
        assert "".join(f"<li>{o['letter']}. {html.escape(o['text'])}" + (" <b>(gold)</b>" if o["gold"] else "")
                       + "</li>" for o in options) in page
        assert "= option" not in page
        checked += 1
    assert checked >= 30
    evil = {"permutation": [1, 0], "gold": 0, "options_shown": [EVIL, "plain"]}
    assert f"<li>A. {html.escape(EVIL)}</li><li>B. plain <b>(gold)</b></li>" in html_report.sample_html(evil)
    blind = html_report.sample_html({"permutation": [1, 0], "gold": 1, "_request": {"messages": [
        {"role": "user", "content": "no options here"}]}})
    assert "<li>A. option 1 (its text is in the prompt above) <b>(gold)</b></li>" in blind

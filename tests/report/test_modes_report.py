"""The mix of modes a run used and what it saved against all at standard (runner/report/modes.py): in ``runner
report`` (text and JSON), the HTML report and ``runner view``'s run page, from a run against the simulated server
with one stage through a Batch API and one at flex, each at half the standard price."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web

from runner.engine.run import execute
from runner.report import html, summary
from runner.spec.job import load_job
from runner.store import open_store
from runner.view.app import make_app
from simserver import SimConfig, start_server
from tests.view.conftest import fetch

MODEL = "sim:gpt-mix"
#: USD per million tokens: batch and flex at half the standard price
PRICES = {"input": 2000.0, "output": 8000.0, "batch_input": 1000.0, "batch_output": 4000.0,
          "flex": {"input": 1000.0, "output": 4000.0}}


def write_job(folder: Path, root: str) -> Path:
    dataset = folder / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"question": f"Mixed question {i}?"}) + "\n" for i in range(6)),
                       encoding="utf-8")
    stage = {"dataset": {"path": str(dataset)}, "prompt": {"user": "{{ question }}"}}
    body = {
        "name": "modes", "output_dir": str(folder / "results"), "models": [MODEL],
        "providers": {"sim": {"base_url": root + "/v1", "timeout": 10}}, "params": {"temperature": 0, "max_tokens": 8},
        "batch": {"poll_interval": 0.05}, "prices": {MODEL: PRICES},
        "stages": [{"name": "batched", "mode": "batch", **stage},
                   {"name": "flexed", "tier": "flex", **stage, "prompt": {"user": "Again: {{ question }}"}},
                   {"name": "plain", **stage, "prompt": {"user": "Plain: {{ question }}"}}],
    }
    path = folder / "modes.yaml"
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


@pytest.mark.asyncio
async def test_the_report_and_the_viewer_show_the_mix_and_the_saving_against_all_standard(tmp_path: Path) -> None:
    async with await start_server(SimConfig(seed=1)) as server:
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(write_job(tmp_path, server.root_url)), store)
    assert outcome.status == "completed"
    data = summary.build(store, outcome.run_id)
    rows = {row["stage"]: row for row in data["modes"]}
    assert rows["batched"]["requests"] == {"batch": 6, "flex": 0, "standard": 0, "priority": 0}
    assert rows["flexed"]["requests"] == {"batch": 0, "flex": 6, "standard": 0, "priority": 0}
    assert rows["plain"]["requests"]["standard"] == 6 and rows["plain"]["saved"] == 0
    paid = {stage: sum(t["cost"] for t in store.tasks(outcome.run_id) if t["stage"] == stage) for stage in rows}
    for stage in ("batched", "flexed"):  # half price: all at standard is twice what was paid
        assert rows[stage]["cost"] == pytest.approx(paid[stage]) and paid[stage] > 0
        assert rows[stage]["standard_cost"] == pytest.approx(2 * paid[stage])
        assert rows[stage]["saved_share"] == pytest.approx(0.5)

    text = summary.render(data, "text")
    assert "Modes used (Batch API, flex, standard, priority) against all at standard:" in text
    assert (f"  batched {MODEL}: batch 6; cost ${paid['batched']:.4f} against ${2 * paid['batched']:.4f} all at "
            f"standard: saved ${paid['batched']:.4f} (50.0%)") in text
    assert f"  flexed {MODEL}: flex 6; cost" in text and "  total: cost $" in text
    assert json.loads(summary.render(data, "json"))["modes"][0]["stage"] == "batched"

    page = html.render(html.build(store, outcome.run_id))
    assert '<section id="modes">' in page and "<th>all standard</th>" in page and "<td>50.0%</td>" in page
    runner = web.AppRunner(make_app(open_store(tmp_path / "s.sqlite")), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        viewed = await fetch(f"http://127.0.0.1:{runner.addresses[0][1]}/runs/{outcome.run_id}")
    finally:
        await runner.cleanup()
    assert '<section id="modes">' in viewed and f"<td>${2 * paid['flexed']:.4f}</td>" in viewed


def test_a_run_all_at_standard_shows_no_mix(tmp_path: Path) -> None:
    from runner.report import modes

    assert modes.text_lines([]) == [] and modes.html_section([]) == ""

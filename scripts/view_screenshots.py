#!/usr/bin/env python
"""Screenshots of ``runner view``'s pages at 1,000 and 1,600 px wide, into docs/screenshots/.

    python scripts/view_screenshots.py            # needs Debian's chromium at /usr/bin/chromium and playwright
    python scripts/view_screenshots.py --out DIR

Runs two small jobs against the simulated server (in this process) into a fresh store, serves the viewer over it
on 127.0.0.1, and saves each page (runs, a run, its answers, compare, costs) as ``<page>-<width>.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aiohttp import web  # noqa: E402
from playwright.async_api import async_playwright  # noqa: E402

from runner.engine.run import execute  # noqa: E402
from runner.spec.job import load_job  # noqa: E402
from runner.store import open_store  # noqa: E402
from runner.view.app import make_app  # noqa: E402
from simserver import start_server  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
WIDTHS = (1000, 1600)
MODELS = ["sim:alpha", "sim:beta", "sim:gamma"]


def write_job(tmp: Path, name: str, phrase: str, url: str) -> Path:
    data = tmp / f"{name}.jsonl"
    subjects = ["law", "math", "art"]
    data.write_text("".join(json.dumps({"question": f"Question {i}: {phrase}", "subject": subjects[i % 3],
                                        "choices": [f"first {i}", f"second {i}", f"third {i}", f"fourth {i}"],
                                        "gold": i % 4}) + "\n" for i in range(30)), encoding="utf-8")
    path = tmp / f"{name}.yaml"
    path.write_text("\n".join([
        f"name: {name}", f"models: {json.dumps(MODELS)}", "params: {temperature: 0, max_tokens: 5}",
        f"output_dir: {json.dumps(str(tmp / 'results'))}",
        f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: 8, timeout: 5}}}}",
        "prices: {sim:alpha: {input: 1.5, output: 4.0}, sim:beta: {input: 0.5, output: 1.0},"
        " sim:gamma: {input: 3.0, output: 12.0}}",
        "budget: {usd: 2}",
        "stages:", "  - name: mc", f"    dataset: {{path: {json.dumps(str(data))}}}", "    prompt:",
        "      system: Answer with one letter.", "      user: \"{{ question }}\\n{{ options_block }}\\nAnswer:\"",
        "    choices: {seeds: [0, 1, 2], gold: gold}", "    parse: letter", "    record: [subject]"]) + "\n",
        encoding="utf-8")
    return path


async def shoot(out: Path) -> list[Path]:
    saved = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        store = open_store(tmp / "cache.sqlite")
        async with await start_server() as server:
            runs = [(await execute(load_job(write_job(tmp, name, phrase, server.url)), store)).run_id
                    for name, phrase in (("mmlu-small", "which is right?"), ("mmlu-reworded", "which one holds?"))]
        runner = web.AppRunner(make_app(store), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        pages = {"runs": "/", "run": f"/runs/{runs[0]}", "answers": f"/runs/{runs[0]}/answers?limit=10",
                 "compare": f"/compare?a={runs[0]}&b={runs[1]}", "costs": "/costs"}
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                               args=["--no-sandbox", "--disable-gpu"])
            for width in WIDTHS:
                page = await browser.new_page(viewport={"width": width, "height": 900})
                for name, path in pages.items():
                    await page.goto(base + path)
                    target = out / f"{name}-{width}.png"
                    await page.screenshot(path=str(target), full_page=name != "run")
                    saved.append(target)
                await page.close()
            await browser.close()
        await runner.cleanup()
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in asyncio.run(shoot(args.out)):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

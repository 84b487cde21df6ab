"""Two finished runs against the simulated server (alpha right on every row in run A, wrong on rows 1-5 in run B;
beta always answers A; one of alpha's answers in run A is markup meant to run script), and the viewer served over
their store on 127.0.0.1 at a free port."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio
from aiohttp import web

from runner.engine.run import execute
from runner.spec.job import load_job
from runner.store import open_store
from runner.view.app import make_app
from tests.helpers import fresh, write_job

ROWS = 12
LETTERS = "ABCD"
#: an answer that would run script if the page took it as markup
EVIL = '</script><script>window.__x=1</script> <img src=x onerror="window.__y=1">'
#: an answer the search finds by its text
NEEDLE = "periwinkle marmalade"
#: the rows (line numbers from 1) alpha gets wrong in run B
WRONG_IN_B = {1, 2, 3, 4, 5}


def rows(path: Path, phrase: str, count: int = ROWS) -> Path:
    """Multiple-choice rows; ``phrase`` tells the runs' prompts (so their cache keys and scripted answers) apart."""
    with open(path, "w", encoding="utf-8") as out:
        for i in range(count):
            out.write(json.dumps({"question": f"Question {i + 1}: {phrase}", "choices": [f"first {i}", f"second {i}",
                                  f"third {i}", f"fourth {i}"], "gold": i % 4}) + "\n")
    return path


def script(path: Path) -> Path:
    responses: list[dict[str, Any]] = [
        {"contains": ["Question 7: which is right?"], "model": "alpha", "response": EVIL},
        {"contains": ["Question 8: which is right?"], "model": "alpha", "response": f"I like {NEEDLE}"},
    ]
    for i in range(ROWS):
        for phrase, wrong in (("which is right?", set()), ("which one is right?", WRONG_IN_B)):
            letter = LETTERS[(i + 1) % 4] if i + 1 in wrong else LETTERS[i % 4]
            responses.append({"contains": [f"Question {i + 1}: {phrase}"], "model": "alpha", "response": letter})
    responses.append({"model": "beta", "response": "A"})
    path.write_text(json.dumps({"responses": responses}), encoding="utf-8")  # JSON is YAML
    return path


def job(tmp: Path, name: str, dataset: Path, url: str, concurrency: int = 8) -> Any:
    extra = (f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: {concurrency}, timeout: 5}}}}\n"
             "prices: {sim:alpha: {input: 1.5, output: 4.0}, sim:beta: {input: 0.5, output: 1.0}}\n"
             "budget: {usd: 5}")
    return load_job(write_job(tmp / f"{name}.yaml", dataset, models=["sim:alpha", "sim:beta"], extra=extra,
                              name=name))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def view_runs(shared_srv, tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("view")
    server = fresh(shared_srv, script=str(script(tmp / "script.yaml")))
    db = tmp / "cache.sqlite"
    store = open_store(db)
    out: dict[str, Any] = {"store": store, "db": db, "tmp": tmp, "server": server}
    for key, phrase in (("a", "which is right?"), ("b", "which one is right?")):
        outcome = await execute(job(tmp, f"view{key}", rows(tmp / f"{key}.jsonl", phrase), server.url), store)
        assert outcome.status == "completed"
        out[key] = outcome.run_id
    return out


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served(view_runs) -> AsyncIterator[str]:
    """The viewer over the runs' store, listening on 127.0.0.1 at a free port: its base URL."""
    runner = web.AppRunner(make_app(open_store(view_runs["db"])), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def fetch(url: str, status: int = 200) -> dict | str:
    """GET ``url``, expecting ``status``: the JSON it answers, else its text."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == status, await response.text()
        if response.content_type == "application/json":
            return await response.json()
        return await response.text()

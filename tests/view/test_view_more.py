"""``runner view``'s pages beyond the basics: the answers page's option texts, comparing three runs (or models)
against the first, the "why not a cache hit" endpoint and the run page's what-if pricing."""

from __future__ import annotations

import html
import json

import aiohttp
import pytest

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def _get(url: str, status: int = 200) -> dict | str:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == status, await response.text()
        if response.content_type == "application/json":
            return await response.json()
        return await response.text()


async def test_the_answers_page_lists_the_option_texts_in_their_shown_order(view_runs, served):
    store, run = view_runs["store"], view_runs["a"]
    rows = [json.loads(line) for line in (view_runs["tmp"] / "a.jsonl").read_text().splitlines()]
    page = await _get(f"{served}/runs/{run}/answers?limit=500")
    for task in store.tasks(run):
        result = json.loads(task["result_json"])
        choices = rows[int(result["id"]) - 1]["choices"]  # ids: line numbers from 1
        shown = "".join(f"<li>{'ABCD'[i]}. {html.escape(choices[p])}" + (" <b>(gold)</b>" if p == result["gold"]
                                                                          else "") + "</li>"
                        for i, p in enumerate(result["permutation"]))
        assert f'<ol class="options">{shown}</ol>' in page

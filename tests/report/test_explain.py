"""``runner explain RUN --item ID`` and ``runner explain JOB.yaml --item ID``: for each request of an item, whether
the memo answers it, else the nearest stored request of its stage and model and what differs (a parameter, the
messages, the model, the sample index), or "never asked". The stored requests come from real runs (the engine
against the simulated server), on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from runner.engine.run import execute
from runner.report import explain
from runner.spec.job import load_job
from runner.store import open_store
from simserver import start_server
from tests.helpers import one_error, run_cli

SYSTEM = "Answer in one word."
#: a dataset field carrying terminal control sequences: prompts are data, printed without them
HOSTILE = "\x1b]0;owned\x07\x1b[2Jwhich colour?"


def write_job(folder: Path, name: str, url: str, *, models: list[str] | None = None, temperature: float = 0,
              system: str = SYSTEM, samples: int = 1, stage: str = "ask", answer: str = "Answer:") -> Path:
    dataset = folder / "rows.jsonl"
    if not dataset.exists():
        rows = [{"id": f"r{i}", "question": f"Question {i}: what is the sky's colour at noon?"} for i in range(1, 4)]
        rows.append({"id": "r4", "question": HOSTILE})
        dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    job = {"name": name, "output_dir": str(folder / "results"), "models": models or ["sim:alpha"],
           "providers": {"sim": {"base_url": url}},
           "params": {"temperature": temperature, "max_tokens": 5},
           "stages": [{"name": stage, "dataset": {"path": str(dataset), "id": "id"}, "samples": samples,
                       "prompt": {"system": system, "user": "Context line one.\n{{ question }}\n" + answer}}]}
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


@pytest.fixture(params=["sqlite", "postgres"])
async def stored(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """``first``: a run of the base job; ``warmer``: the base job at temperature 0.7, run after it; ``again``: the
    base job run once more (every request a cache hit)."""
    where = tmp_path / "s.sqlite" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    store = open_store(where)
    async with await start_server() as server:
        url = server.url
        first = await execute(load_job(write_job(tmp_path, "base", url)), store)
        warmer = await execute(load_job(write_job(tmp_path, "warmer", url, temperature=0.7)), store)
        again = await execute(load_job(write_job(tmp_path, "base", url)), store)
    assert {first.status, warmer.status, again.status} == {"completed"}
    return {"store": store, "folder": tmp_path, "url": url, "first": first.run_id, "warmer": warmer.run_id,
            "again": again.run_id}


def _only(data: dict) -> dict:
    [entry] = data["requests"]
    return entry


def _change(entry: dict, name: str) -> dict:
    [found] = [c for c in entry["changes"] if c["field"] == name]
    return found


def test_a_changed_parameter(stored: dict) -> None:
    job = load_job(write_job(stored["folder"], "hotter", stored["url"], temperature=1.0))
    entry = _only(explain.build(stored["store"], "r2", job=job))
    assert not entry["answered"] and entry["verdict"] == "nearest"
    # the nearest is the one at 0.7 (only the temperature differs either way: ties go to the smaller key order
    # among equals, so check the field, not which run)
    change = _change(entry, "params.temperature")
    assert change["new"] == 1.0 and change["old"] in (0.0, 0.7)
    assert [c["field"] for c in entry["changes"]] == ["params.temperature"]


def test_a_changed_message(stored: dict) -> None:
    job = load_job(write_job(stored["folder"], "terse", stored["url"], system="Answer in one short word."))
    entry = _only(explain.build(stored["store"], "r1", job=job))
    assert entry["verdict"] == "nearest" and entry["nearest_run"] == stored["first"]  # same parameters first
    [change] = entry["changes"]
    assert change["field"] == "messages"
    assert "-Answer in one word." in change["diff"] and "+Answer in one short word." in change["diff"]
    assert not any(line.startswith(("-", "+")) and "Question 1" in line for line in change["diff"])


def test_another_model_is_never_asked_and_shows_the_nearest_of_the_model_asked(stored: dict) -> None:
    job = load_job(write_job(stored["folder"], "beta", stored["url"], models=["sim:beta"]))
    entry = _only(explain.build(stored["store"], "r3", job=job))
    assert entry["verdict"] == "never asked" and entry["other_model"] == "sim:alpha"
    assert _change(entry, "model id") == {"field": "model id", "old": "alpha", "new": "beta"}
    text = explain.render(explain.build(stored["store"], "r3", job=job), "text")
    assert "never asked: no stored request of stage ask and model sim:beta" in text
    assert 'model id: "alpha" -> "beta"' in text


def test_another_sample_index(stored: dict) -> None:
    job = load_job(write_job(stored["folder"], "twice", stored["url"], samples=2))
    first, second = explain.build(stored["store"], "r2", job=job)["requests"]
    assert first["variant"] == {"sample": 0} and first["answered"] and first["sent_by"] == stored["first"]
    assert second["variant"] == {"sample": 1} and not second["answered"]
    assert _change(second, "sample") == {"field": "sample", "old": 0, "new": 1}


def test_never_asked(stored: dict) -> None:
    job = load_job(write_job(stored["folder"], "other", stored["url"], stage="rephrase", system="Rephrase it."))
    entry = _only(explain.build(stored["store"], "r1", job=job))
    assert not entry["answered"]
    assert entry["verdict"] == "never asked" and entry["other_model"] is None and entry["changes"] == []
    # a stage of another name asking what was asked before: the memo answers it (the key holds no stage name)
    renamed = load_job(write_job(stored["folder"], "renamed", stored["url"], stage="rephrase"))
    entry = _only(explain.build(stored["store"], "r1", job=renamed))
    assert entry["answered"] and entry["sent_by"] == stored["first"] and entry["verdict"] is None


def test_a_run_explains_its_misses_against_what_was_stored_before_it(stored: dict) -> None:
    store = stored["store"]
    warm = _only(explain.build(store, "r2", run_id=stored["warmer"]))
    assert warm["in_run"] == "sent" and warm["answered"] and warm["sent_by"] == stored["warmer"]
    assert warm["nearest_run"] == stored["first"]
    assert _change(warm, "params.temperature") == {"field": "params.temperature", "old": 0.0, "new": 0.7}
    first = _only(explain.build(store, "r2", run_id=stored["first"]))
    assert first["in_run"] == "sent" and first["verdict"] == "never asked"  # nothing was stored before it
    again = _only(explain.build(store, "r2", run_id=stored["again"]))
    assert again["in_run"] == "cache hit" and again["sent_by"] == stored["first"] and again["verdict"] is None
    text = explain.render(explain.build(store, "r2", run_id=stored["again"]), "text")
    assert f"a cache hit in this run (first sent by run {stored['first']})" in text


def test_the_command_prints_prompts_as_text_and_refuses_in_one_sentence(stored: dict, monkeypatch, capsys) -> None:
    db, folder = stored["store"].path, stored["folder"]
    path = write_job(folder, "terse", stored["url"], answer="Reply:")
    code, out, err = run_cli(monkeypatch, capsys, "explain", str(path), "--item", "r4", "--db", db)
    assert code == 0, err
    assert out.startswith("Item r4 of job terse (before a run): 1 request(s)")
    assert "      -Answer:\n      +Reply:\n" in out
    assert "which colour?" in out and not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", out)
    assert "owned" not in out
    code, out, err = run_cli(monkeypatch, capsys, "explain", stored["warmer"], "--item", "r1", "--db", db,
                             "--format", "json")
    assert code == 0 and json.loads(out)["run"] == stored["warmer"]
    broken = folder / "broken.yaml"
    broken.write_text("name: [unclosed\n", encoding="utf-8")
    for args, expected in [
        (("20000101-000000-none", "--item", "r1"), "Error: no run '20000101-000000-none'"),
        ((str(broken), "--item", "r1"), "Error: "),
        ((str(path), "--item", "r9"), "Error: item 'r9' is not in any stage of job 'terse'"),
        ((str(path), "--item", "r1", "--stage", "nope"), "Error: no stage 'nope' of model requests in job 'terse'"),
        ((str(path), "--item", "r1", "--format", "xml"), "Error: --format must be one of text, json"),
    ]:
        code, out, err = run_cli(monkeypatch, capsys, "explain", *args, "--db", db)
        assert code != 0 and one_error(err).startswith(expected), err

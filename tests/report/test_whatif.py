"""``runner costs RUN --as MODEL --batch --cached``: a finished run re-priced. The run is real (the engine against
the simulated server, a priced sim model, on SQLite and on PostgreSQL); every expected price is computed here with
genai-prices' own calculator (``genai_prices.calc_price``) from the tokens the store recorded, and the OpenAI
model's tokens with tiktoken by OpenAI's published chat rule, never from the code under test."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from genai_prices import Usage, calc_price

from runner.engine.run import execute
from runner.providers.tokens import encoding
from runner.report import whatif
from runner.spec.job import load_job
from runner.store import open_store
from simserver import start_server
from tests.helpers import one_error, run_cli

SYSTEM = "Answer 1 or 2."
#: five solved WinoDict-like examples shared by every prompt (over 1,024 tokens for OpenAI's tokenizer)
SHOTS = "".join(
    f"Example {k}: 'Glorbing' means stacking stones along a river bank to mark a crossing for travellers. "
    f"Sentence: The shepherds glorbed the stones while the merchants rested under the bridge at noon. "
    f"Who glorbed? Option 1: the shepherds. Option 2: the merchants. Answer: 1\n" * 6 for k in range(1, 6))
ROWS = 6
PRICE = {"input": 100.0, "output": 400.0}


@pytest.fixture(params=["sqlite", "postgres"])
async def finished(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A finished run of sim:cheap over ROWS five-shot prompts, with its store."""
    where = tmp_path / "s.sqlite" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    store = open_store(where)
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"w{i}", "question": f"{i}. Who stacked stones, and why? "}) + "\n"
                               for i in range(1, ROWS + 1)), encoding="utf-8")
    async with await start_server() as server:
        job = {"name": "wino-like", "output_dir": str(tmp_path / "results"), "models": ["sim:cheap"],
               "providers": {"sim": {"base_url": server.url}}, "params": {"temperature": 0, "max_tokens": 8},
               "prices": {"sim:cheap": PRICE},
               "stages": [{"name": "five-shot", "dataset": {"path": str(dataset), "id": "id"},
                           "prompt": {"system": SYSTEM, "user": SHOTS + "{{ question }}"}}]}
        path = tmp_path / "job.yaml"
        path.write_text(json.dumps(job), encoding="utf-8")
        outcome = await execute(load_job(path), store)
    assert outcome.status == "completed"
    tasks = store.tasks(outcome.run_id)
    bodies = {r["key"]: json.loads(r["request_json"]) for r in store.responses()}
    requests = [(t["input_tokens"], t["output_tokens"], bodies[t["key"]]["messages"]) for t in tasks]
    assert len(requests) == ROWS and all(m[1]["content"].startswith(SHOTS) for _, _, m in requests)
    return {"store": store, "run": outcome.run_id, "requests": requests, "paid": sum(t["cost"] for t in tasks)}


def openai_tokens(messages: list[dict[str, str]]) -> int:
    """OpenAI's chat rule (the cookbook's num_tokens_from_messages): 3 per message, its role and text, 3 priming."""
    enc = encoding("o200k_base")  # gpt-4o-mini's encoding (tiktoken's model table)
    return 3 + sum(3 + len(enc.encode(m["role"])) + len(enc.encode(m["content"])) for m in messages)


def price(model: str, provider: str, usages: list[dict[str, int]], batch: bool = False) -> Decimal:
    context = {"price_context": {"processing": "batch"}} if batch else {}
    return sum((calc_price(Usage(**u), model, provider_id=provider, **context).total_price for u in usages),
               Decimal(0))


def _row(data: dict, target: str) -> dict:
    [row] = [r for r in data["rows"] if r["target"] == target]
    return row


def _same(got: float, expected: Decimal) -> None:
    assert round(got, 2) == round(float(expected), 2)  # to the cent
    assert got == pytest.approx(float(expected), rel=1e-9, abs=1e-12)  # and at full precision


def test_two_other_models_and_the_run_itself(finished: dict) -> None:
    reqs = finished["requests"]
    data = whatif.build(finished["store"], finished["run"], as_models=["openai:gpt-4o-mini",
                                                                       "anthropic:claude-haiku-4-5"])
    mini, haiku = _row(data, "openai:gpt-4o-mini"), _row(data, "anthropic:claude-haiku-4-5")
    # OpenAI: the input re-counted with its tokenizer, exactly
    counted = [openai_tokens(m) for _, _, m in reqs]
    assert mini["input_count"] == "exact" and mini["input_tokens"] == sum(counted)
    usages = [{"input_tokens": n, "output_tokens": out} for n, (_, out, _) in zip(counted, reqs, strict=True)]
    _same(mini["cost"], price("gpt-4o-mini", "openai", usages))
    # Anthropic: no tokenizer here, so the paid count, said to be an estimate
    assert haiku["input_count"] == "estimate" and haiku["input_tokens"] == sum(n for n, _, _ in reqs)
    _same(haiku["cost"], price("claude-haiku-4-5", "anthropic",
                               [{"input_tokens": n, "output_tokens": out} for n, out, _ in reqs]))
    for row in (mini, haiku):
        assert row["paid"] == pytest.approx(finished["paid"]) and row["requests"] == row["sent"] == ROWS
        assert row["output_tokens"] == sum(out for _, out, _ in reqs)
    # without --as: the run's own model at its job's price, as paid
    own = whatif.build(finished["store"], finished["run"])["rows"][0]
    assert (own["target"], own["input_count"]) == ("sim:cheap", "as paid")
    by_hand = sum(n * PRICE["input"] + out * PRICE["output"] for n, out, _ in reqs) / 1e6
    assert own["cost"] == pytest.approx(by_hand) and own["cost"] == pytest.approx(finished["paid"])


def test_batch_prices(finished: dict) -> None:
    reqs = finished["requests"]
    data = whatif.build(finished["store"], finished["run"], as_models=["openai:gpt-4o-mini",
                                                                       "anthropic:claude-haiku-4-5"], batch=True)
    counted = [openai_tokens(m) for _, _, m in reqs]
    usages = [{"input_tokens": n, "output_tokens": out} for n, (_, out, _) in zip(counted, reqs, strict=True)]
    _same(_row(data, "openai:gpt-4o-mini")["cost"], price("gpt-4o-mini", "openai", usages, batch=True))
    _same(_row(data, "anthropic:claude-haiku-4-5")["cost"], price(
        "claude-haiku-4-5", "anthropic", [{"input_tokens": n, "output_tokens": out} for n, out, _ in reqs],
        batch=True))
    # a model without a Batch API price is priced at its standard one, and said so
    own = whatif.build(finished["store"], finished["run"], batch=True)
    assert own["rows"][0]["cost"] == pytest.approx(finished["paid"])
    assert "sim:cheap: no Batch API price; priced at the standard price" in own["notes"]


def test_provider_caching(finished: dict) -> None:
    """Every prompt shares the system message and the examples: the first request writes them (OpenAI charges no
    write), each other reads them at the cached price, in OpenAI's steps (1,024 tokens, then 128 at a time)."""
    reqs = finished["requests"]
    enc = encoding("o200k_base")
    shared = 3 + (3 + len(enc.encode("system")) + len(enc.encode(SYSTEM))) + \
        (3 + len(enc.encode("user")) + len(enc.encode(SHOTS.rstrip("\n"))))
    assert shared > 1024
    read = 1024 + (shared - 1024) // 128 * 128
    counted = [openai_tokens(m) for _, _, m in reqs]
    row = _row(whatif.build(finished["store"], finished["run"], as_models=["openai:gpt-4o-mini"], cached=True),
               "openai:gpt-4o-mini")
    assert (row["cached_read"], row["cache_written"]) == ((ROWS - 1) * read, read)
    usages = [{"input_tokens": n, "output_tokens": out, "cache_read_tokens": 0 if i == 0 else read}
              for i, (n, (_, out, _)) in enumerate(zip(counted, reqs, strict=True))]
    _same(row["cost"], price("gpt-4o-mini", "openai", usages))
    uncached = whatif.build(finished["store"], finished["run"], as_models=["openai:gpt-4o-mini"])["rows"][0]["cost"]
    assert row["cost"] < uncached
    # Haiku 4.5 caches from 4,096 tokens only: these prompts are not cached there
    haiku = whatif.build(finished["store"], finished["run"], as_models=["anthropic:claude-haiku-4-5"], cached=True)
    assert (haiku["rows"][0]["cached_read"], haiku["rows"][0]["cache_written"]) == (0, 0)


def test_every_format_and_the_sums_across_runs_unchanged(finished: dict, monkeypatch, capsys) -> None:
    db, run = finished["store"].path, finished["run"]
    code, out, err = run_cli(monkeypatch, capsys, "costs", run, "--db", db, "--as", "openai:gpt-4o-mini",
                             "--as", "anthropic:claude-haiku-4-5", "--cached")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"Run {run} (job wino-like) re-priced with provider prompt caching"
    assert any(line.startswith("five-shot  sim:cheap") and "openai:gpt-4o-mini" in line for line in lines)
    assert "Total on anthropic:claude-haiku-4-5:" in out and "(exact)" in out and "(estimate)" in out
    code, out, _ = run_cli(monkeypatch, capsys, "costs", run, "--db", db, "--as", "openai:gpt-4o-mini", "--batch",
                           "--format", "json")
    data = json.loads(out)
    assert data["batch"] and data["rows"][0]["target"] == "openai:gpt-4o-mini"
    code, out, _ = run_cli(monkeypatch, capsys, "costs", run, "--db", db, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["stage"] for r in rows] == ["five-shot", "total"] and rows[0]["input_count"] == "as paid"
    code, out, _ = run_cli(monkeypatch, capsys, "costs", run, "--db", db, "--as", "openai:gpt-4o-mini",
                           "--format", "md")
    assert "| stage | model | requests | sent | paid | as |" in out and "| five-shot | sim:cheap | 6 | 6 |" in out
    # the sums across runs, as before
    code, out, _ = run_cli(monkeypatch, capsys, "costs", "--db", db)
    assert code == 0 and out.startswith("Costs by model") and "sim:cheap" in out


def test_user_errors_are_one_sentence(finished: dict, monkeypatch, capsys) -> None:
    db, run = finished["store"].path, finished["run"]
    for args, expected in [
        ((run, "--as", "openai:gpt-not-a-model"), "Error: --as openai:gpt-not-a-model: no price for it"),
        ((run, "--as", "nowhere:model"), "Error: --as nowhere:model: not a model of a known provider"),
        ((run, "--as", "gpt-4o"), "Error: --as gpt-4o: not a model of a known provider; write it as PROVIDER:MODEL"),
        (("--batch",), "Error: --as, --batch and --cached re-price one finished run: give its id"),
        ((run, "--since", "2025-01-01"), "Error: --since applies to the sums across runs, not to one run"),
        ((run, "--by", "day"), "Error: --by applies to the sums across runs, not to one run"),
        (("20000101-000000-none", "--batch"), "Error: no run '20000101-000000-none'"),
    ]:
        code, out, err = run_cli(monkeypatch, capsys, "costs", *args, "--db", db)
        assert code == 1 and one_error(err, only=True).startswith(expected), err

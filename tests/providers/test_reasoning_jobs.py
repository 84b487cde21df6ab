"""Issue 19's acceptance, end to end: a reasoning job and a structured-output job on each provider, through the
official SDKs, against the simulated server (which checks every request the way the real APIs do and answers reasoning
requests with thinking, schema requests with JSON, and refuses on request).

- Reasoning: thinking tokens come back in each API's usage, are reported and priced as output; the answer is parsed
  from the answer only (the simulated thinking names another option first); a USD budget is never overshot with
  thinking counted.
- Structured outputs: the schema goes out in each API's form, the answers are validated and scored through
  ``answer_field``; an answer that is not JSON is invalid with the decoder's reason; refusals are counted as
  ``refused``, charged, never scored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from runner.engine.run import execute
from runner.errors import JobFileError
from runner.evaluate.parse import parse_letter
from runner.plan.choices import LETTERS
from runner.providers.capabilities import shape
from runner.report import summary
from runner.spec.job import job_from_dict
from runner.store import open_store
from simserver import SimConfig, start_server
from tests.helpers import write_rows

#: USD per million tokens, the same for every model here, so costs can be recomputed from the tokens
PRICE = {"input": 1.0, "output": 4.0}

REASONING = {
    "openai:o3": {"effort": "low"},
    "anthropic:claude-sonnet-4-5": {"budget_tokens": 2048},
    "gemini:gemini-2.5-pro": {"budget_tokens": 1024},
}
STRUCTURED = ["openai:gpt-4o", "anthropic:claude-sonnet-4-5", "gemini:gemini-2.0-flash"]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["A", "B", "C", "D"]}},
          "required": ["answer"], "additionalProperties": False}


pytestmark = pytest.mark.usefixtures("provider_keys")


def _base(srv: Any, model: str) -> str:
    return srv.url if model.startswith("openai:") else srv.root_url


def _job(tmp_path: Path, srv: Any, model: str, rows: int, *, params: dict[str, Any], name: str,
         stage: dict[str, Any] | None = None, budget: float | None = None, concurrency: int = 4) -> Any:
    dataset = write_rows(tmp_path / f"{name}.jsonl", rows)
    provider = model.split(":")[0]
    data: dict[str, Any] = {
        "name": name,
        "models": [model],
        "params": params,
        "providers": {provider: {"base_url": _base(srv, model), "timeout": 10, "concurrency": concurrency}},
        "prices": {model: PRICE},
        "retry": {"max_attempts": 2, "backoff_initial": 0.01, "backoff_max": 0.05},
        "output_dir": str(tmp_path / "results"),
        "stages": [{"name": "mc", "dataset": {"path": str(dataset)},
                    "prompt": {"system": "Answer with one letter.",
                               "user": "{{ question }}\n{{ options_block }}\nAnswer:"},
                    "choices": {"seeds": [0], "gold": "gold"}, "parse": "letter", **(stage or {})}],
    }
    if budget is not None:
        data["budget"] = {"usd": budget}
    return job_from_dict(data, base_dir=tmp_path)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _shown(tmp_path: Path, name: str, line: dict[str, Any]) -> list[str]:
    """The options as the line's prompt showed them (its dataset row's choices in the line's order)."""
    rows = (tmp_path / f"{name}.jsonl").read_text().splitlines()
    choices = json.loads(rows[int(line["id"]) - 1])["choices"]
    return [choices[i] for i in line["permutation"]]


def _cost(store: Any, run_id: str) -> float:
    return sum(row["amount"] for row in store.ledger(run_id) if row["kind"] == "charge")


@pytest.mark.parametrize("model", list(REASONING))
async def test_a_reasoning_job_reports_and_prices_thinking_and_parses_the_answer_only(model, tmp_path):
    async with await start_server(SimConfig()) as srv:
        job = _job(tmp_path, srv, model, 12, params={"max_tokens": 8, "reasoning": REASONING[model]}, name="think")
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        stats = srv.stats()
    assert outcome.status == "completed", outcome
    assert not any(status.startswith("4") for status in stats["by_status"]), stats["by_status"]
    data = summary.build(store, outcome.run_id)
    row = data["rows"][0]
    # thinking tokens came back, are among the output tokens, and were priced as output
    assert 0 < row["reasoning_tokens"] < row["output_tokens"]
    expected = (row["input_tokens"] * PRICE["input"] + row["output_tokens"] * PRICE["output"]) / 1e6
    assert row["cost"] == pytest.approx(expected)
    assert _cost(store, outcome.run_id) == pytest.approx(expected)
    assert "reasoning" in "\n".join(summary.summary_lines(data))
    lines = _lines(outcome.results["mc"])
    # max_tokens stayed the answer's room: no answer came back empty, every one was read
    assert all(line["status"] == "done" and line["response"] for line in lines)
    assert all(line["reasoning_tokens"] > 0 for line in lines)
    misread = 0
    for line in lines:
        options = _shown(tmp_path, "think", line)
        answer = parse_letter(line["response"], options, LETTERS)
        assert line.get("answer_letter") == (LETTERS[answer.value] if answer.valid else None)
        if line.get("thinking"):
            wrong = parse_letter(line["thinking"], options, LETTERS)
            misread += wrong.value != answer.value
    if not model.startswith("openai:"):  # Chat Completions returns no thinking text
        assert all(line.get("thinking") for line in lines)
        # the thinking names other letters: a parser handed it instead of the answer would have scored others
        assert misread > 0


@pytest.mark.parametrize("model", list(REASONING))
async def test_a_budget_holds_with_thinking_counted(model, tmp_path):
    """Each request reserves its worst case (the cap with the thinking allowance, at the output price) and settles
    at what came back, thinking included: many requests whose thinking together costs more than the budget stop at
    it, never past it."""
    params = {"max_tokens": 8, "reasoning": REASONING[model]}
    provider, name = model.split(":", 1)
    cap = shape(provider, name, params).params["max_tokens"]
    worst = (1000 * PRICE["input"] + cap * PRICE["output"]) / 1e6  # 1,000: more than any prompt here counts
    budget = round(2.5 * worst, 6)
    async with await start_server(SimConfig()) as srv:
        job = _job(tmp_path, srv, model, 300, params=params, name="budgeted", budget=budget, concurrency=8)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
    spent = _cost(store, outcome.run_id)
    assert outcome.status == "budget_exhausted"
    assert budget / 2 < spent <= budget
    row = summary.build(store, outcome.run_id)["rows"][0]
    assert row["reasoning_tokens"] > 0
    # what was spent is every answer's tokens, thinking included, at the job's prices
    assert spent == pytest.approx((row["input_tokens"] * PRICE["input"] + row["output_tokens"] * PRICE["output"]) / 1e6)
    done = [line for line in _lines(outcome.results["mc"]) if line["status"] == "done"]
    assert 0 < len(done) < 300


def _structured_stage() -> dict[str, Any]:
    return {"schema": SCHEMA, "parse": "json", "answer_field": "answer", "score_as": "letter"}


@pytest.mark.parametrize("model", STRUCTURED)
async def test_a_structured_output_job_is_validated_and_scored(model, tmp_path):
    async with await start_server(SimConfig()) as srv:
        plain = await execute(_job(tmp_path, srv, model, 12, params={"temperature": 0, "max_tokens": 20},
                                   name="plain"), open_store(tmp_path / "plain.sqlite"))
        job = _job(tmp_path, srv, model, 12, params={"temperature": 0, "max_tokens": 20}, name="structured",
                   stage=_structured_stage())
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        stats = srv.stats()
    assert outcome.status == "completed"
    assert not any(status.startswith("4") for status in stats["by_status"]), stats["by_status"]
    lines = _lines(outcome.results["mc"])
    assert all(line["valid"] and set(line["parsed"]) == {"answer"} for line in lines), lines[0]
    assert all(line["answer_letter"] == line["parsed"]["answer"] for line in lines)
    assert all(line["score"] in (0.0, 1.0) for line in lines)
    # the schema went out in the provider's form: the request as sent is what the memo keeps
    sent = [json.loads(row["request_json"]) for row in store.responses()]
    assert all(request["params"]["response_format"]["type"] == "json_schema" for request in sent), sent[0]
    # a structured answer is the plain answer's letter: the same items right and wrong
    plain_scores = {line["id"]: line["score"] for line in _lines(plain.results["mc"])}
    assert {line["id"]: line["score"] for line in lines} == plain_scores


@pytest.mark.parametrize("model", STRUCTURED)
async def test_an_answer_that_is_not_json_is_invalid_with_its_reason(model, tmp_path):
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"responses": [{"contains": ["Question number 1:"], "response": "B, I think"}]}))
    async with await start_server(SimConfig(script=str(script))) as srv:
        job = _job(tmp_path, srv, model, 4, params={"temperature": 0, "max_tokens": 20}, name="bad",
                   stage=_structured_stage())
        outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    lines = {line["id"]: line for line in _lines(outcome.results["mc"])}
    bad = [line for line in lines.values() if line["response"] == "B, I think"]
    assert len(bad) == 1, lines
    assert bad[0]["valid"] is False and bad[0]["score"] == 0.0
    assert bad[0]["invalid_reason"].startswith("invalid_json: Expecting value at line 1, column 1")
    assert all(line["valid"] for line in lines.values() if line is not bad[0])


@pytest.mark.parametrize("model", STRUCTURED + list(REASONING))
async def test_refusals_are_counted_charged_and_never_scored(model, tmp_path):
    params = {"max_tokens": 8, "reasoning": REASONING[model]} if model in REASONING else \
        {"temperature": 0, "max_tokens": 20}
    async with await start_server(SimConfig(fault_refusal=0.3)) as srv:
        job = _job(tmp_path, srv, model, 30, params=params, name="refusals")
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
    lines = _lines(outcome.results["mc"])
    refused = [line for line in lines if line.get("error_class") == "refused"]
    assert 0 < len(refused) < 30
    assert all(line["score"] is None and line["status"] == "failed" for line in refused)
    data = summary.build(store, outcome.run_id)
    row = data["rows"][0]
    assert row["refused"] == len(refused) and row["scored"] == 30 - len(refused)
    assert "refused" in summary.render(data, "text")
    # a refusal the provider billed is charged once, as the answers are
    assert _cost(store, outcome.run_id) == pytest.approx(row["cost"])


async def test_the_report_says_what_was_left_out_and_which_versions_were_sent(tmp_path):
    """A temperature-0 job on o3 is refused by validation; with drop_unsupported the temperature is left out, and
    the report (and the lines printed at the end of a run) say so. The versions the requests went out with are
    recorded with the run and shown."""
    params = {"temperature": 0, "max_tokens": 8}
    async with await start_server(SimConfig()) as srv:
        with pytest.raises(JobFileError, match="openai:o3 takes no temperature"):
            _job(tmp_path, srv, "openai:o3", 3, params=params, name="refused")
        job = _job(tmp_path, srv, "openai:o3", 3, params=params, name="dropped", stage={"drop_unsupported": True})
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        claude = _job(tmp_path, srv, "anthropic:claude-3-5-haiku-20241022", 3, params=params, name="claude")
        other = await execute(claude, store)
    assert outcome.status == other.status == "completed"
    data = summary.build(store, outcome.run_id)
    text = summary.render(data, "text")
    assert "left out (drop_unsupported): mc openai:o3: temperature (takes no temperature)" in text
    assert "left out (drop_unsupported): mc openai:o3: temperature" in "\n".join(summary.summary_lines(data))
    assert "sent with: SDKs openai " in text and "capability table of " in text
    claude_text = summary.render(summary.build(store, other.run_id), "md")
    assert "anthropic-version 2023-06-01" in claude_text and "left out" not in claude_text

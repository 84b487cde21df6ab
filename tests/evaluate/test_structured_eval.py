"""Structured answers, thinking and refusals on the evaluation side: ``parse: json`` (fenced blocks, invalid JSON and
schema violations with their reasons, ``answer_field`` scored through the shown order), the model's thinking kept in
the result line apart from the answer the parsers read (and through the memo), and refusals counted apart, charged
when billed and never scored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.engine.run import execute
from runner.errors import Refused
from runner.evaluate.structured import field_text, parse_json
from runner.providers.base import Completion
from runner.report import html
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import write_rows

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["A", "B", "C", "D"]}},
          "required": ["answer"], "additionalProperties": False}


def _job(tmp_path: Path, stage: str, *, rows: Path | None = None, extra: str = "", seeds: str = "[0]",
         choices: bool = True) -> Any:
    """A one-stage job on the fake provider; ``stage``: the stage's lines after its prompt (parse and the rest)."""
    dataset = rows or write_rows(tmp_path / "rows.jsonl", 8)
    text = "\n".join(line for line in [
        "name: structured",
        'models: ["fake:m1"]',
        "params: {temperature: 0, max_tokens: 50}",
        f"output_dir: {json.dumps(str(tmp_path / 'results'))}",
        "retry: {max_attempts: 3, backoff_initial: 0.01, backoff_max: 0.05, max_elapsed: 30}",
        extra,
        "stages:",
        "  - name: mc",
        f"    dataset: {{path: {json.dumps(str(dataset))}}}",
        "    prompt:",
        "      system: Answer in JSON.",
        "      user: \"{{ question }}\\n{{ options_block }}\\nAnswer:\"" if choices else
        "      user: \"{{ question }}\\nAnswer:\"",
        f"    choices: {{seeds: {seeds}, gold: gold}}" if choices else "    gold: gold",
        stage,
    ] if line) + "\n"
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    return load_job(path)


def _lines(outcome: Any, stage: str = "mc") -> list[dict[str, Any]]:
    return [json.loads(line) for line in outcome.results[stage].read_text().splitlines()]


def _without_run(line: dict[str, Any]) -> dict[str, Any]:
    """A result line without what differs between runs of the same answers: the cache hit and the run id."""
    out = {k: v for k, v in line.items() if k != "cache_hit"}
    out["provenance"] = {k: v for k, v in line["provenance"].items() if k != "run_id"}
    return out


def _answer(text: str, **fields: Any) -> Any:
    """A behaviour answering every request with ``text`` (20 input and 5 output tokens unless ``fields`` say)."""
    fields = {"input_tokens": 20, "output_tokens": 5, **fields}
    return lambda *a: Completion(text=text, finish_reason="stop", **fields)


# -- parse: json, alone -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ['{"answer": "B"}', '  \n{"answer": "B"}\n ', '```json\n{"answer": "B"}\n```',
                                  '```\n{"answer": "B"}\n```\n', '```JSON {"answer": "B"} ```'])
def test_json_is_read_bare_or_in_one_fenced_block(text: str) -> None:
    assert parse_json(text).value == {"answer": "B"} and parse_json(text).valid


@pytest.mark.parametrize(("text", "reason"), [
    ('{"answer": "B",}', "invalid_json: Expecting property name enclosed in double quotes at line 1, column 16"),
    ('{"answer":\n "B"', "invalid_json: Expecting ',' delimiter at line 2, column 5"),
    ('The answer is {"answer": "B"}', "invalid_json: Expecting value at line 1, column 1"),
    ('```json\n{"answer": "B"}\n```\nHope this helps!', "invalid_json: Expecting value at line 1, column 1"),
    ('{"answer": NaN}', "invalid_json: NaN is not JSON"),
    ("   ", "empty"),
])
def test_invalid_json_says_why_and_where(text: str, reason: str) -> None:
    parsed = parse_json(text)
    assert not parsed.valid and parsed.value is None
    assert parsed.reason == reason


def test_a_schema_violation_is_invalid_with_the_first_errors_message_and_path() -> None:
    assert parse_json('{"answer": "B"}', SCHEMA).valid
    assert parse_json('{"answer": "E"}', SCHEMA).reason == \
        "schema_violation: 'E' is not one of ['A', 'B', 'C', 'D'] at $.answer"
    assert parse_json('{"letter": "B"}', SCHEMA).reason == "schema_violation: 'answer' is a required property at $"
    nested = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}}}}
    assert parse_json('{"items": [1, "two"]}', nested).reason == \
        "schema_violation: 'two' is not of type 'integer' at $.items[1]"


def test_the_schemas_draft_is_the_one_it_names_else_2020_12() -> None:
    # "dependencies" is a keyword of draft 7, gone from 2020-12 (which ignores it as an unknown keyword)
    schema: dict[str, Any] = {"type": "object", "dependencies": {"a": ["b"]}}
    assert parse_json('{"a": 1}', schema).valid
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", **schema}
    assert parse_json('{"a": 1}', draft7).reason == "schema_violation: 'b' is a dependency of 'a' at $"


def test_field_text_hands_a_field_to_a_parser_as_text() -> None:
    assert field_text({"answer": "B"}, "answer").value == "B"
    assert field_text({"answer": ["A", "C"]}, "answer").value == "A, C"
    assert field_text({"answer": True}, "answer").value == "true"
    assert field_text({"answer": 7}, "answer").value == "7"
    assert field_text({"answer": None}, "answer").value == ""
    assert field_text({"letter": "B"}, "answer").reason == "missing_field: no field 'answer' in the answer object"
    assert field_text(["B"], "answer").reason == "missing_field: the answer is an array, not an object with field " \
                                                 "'answer'"


# -- parse: json in a run ------------------------------------------------------------------------------------------

async def test_answer_field_is_scored_as_a_letter_mapped_back_through_the_shown_order(tmp_path, fake_provider):
    job = _job(tmp_path, "    schema: " + json.dumps(SCHEMA) + "\n    parse: json\n    answer_field: answer\n"
               "    score_as: letter", seeds="[0, 1, 2]")
    # a thinking text and prose never reach the parser: only the JSON answer does
    fake_provider.behaviour = _answer('```json\n{"answer": "B"}\n```', thinking="A? No: the answer is C.")
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    rows = _lines(outcome)
    assert len(rows) == 24 and len({tuple(r["permutation"]) for r in rows}) > 1
    for r in rows:
        assert r["valid"] is True and r["parsed"] == {"answer": "B"}
        assert r["answer_letter"] == "B" and r["answer"] == r["permutation"][1]
        assert r["score"] == (1.0 if r["permutation"][1] == r["gold"] else 0.0)
    assert {r["score"] for r in rows} == {0.0, 1.0}


async def test_a_missing_field_invalid_json_and_a_schema_violation_are_invalid_with_reasons(tmp_path, fake_provider):
    job = _job(tmp_path, "    schema: " + json.dumps(SCHEMA) + "\n    parse: json\n    answer_field: answer\n"
               "    score_as: letter")
    answers = ['{"answer": "B"}', '{"answer": "E"}', "B", '{"answer": "C"'] * 2

    def reply(model, messages, params, n):
        return Completion(text=answers[n - 1], input_tokens=20, output_tokens=5)

    fake_provider.behaviour = reply
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    rows = {r["response"]: r for r in _lines(outcome)}
    assert rows['{"answer": "B"}']["valid"] is True
    assert rows['{"answer": "E"}']["invalid_reason"] == \
        "schema_violation: 'E' is not one of ['A', 'B', 'C', 'D'] at $.answer"
    assert rows["B"]["invalid_reason"] == "invalid_json: Expecting value at line 1, column 1"
    assert rows['{"answer": "C"']["invalid_reason"] == "invalid_json: Expecting ',' delimiter at line 1, column 15"
    for text in ('{"answer": "E"}', "B", '{"answer": "C"'):
        assert rows[text]["valid"] is False and rows[text]["score"] == 0.0 and rows[text]["answer"] is None
    (row,) = report.build(store, outcome.run_id)["rows"]
    assert row["invalid"] == 6 and row["scored"] == 8


async def test_a_missing_answer_field_is_invalid(tmp_path, fake_provider):
    job = _job(tmp_path, "    parse: json\n    answer_field: answer\n    score_as: letter")
    fake_provider.behaviour = _answer('{"letter": "B"}')
    rows = _lines(await execute(job, open_store(tmp_path / "s.sqlite")))
    assert {(r["valid"], r["invalid_reason"], r["score"]) for r in rows} == \
        {(False, "missing_field: no field 'answer' in the answer object", 0.0)}
    assert all(r["parsed"] == {"letter": "B"} for r in rows)


async def test_answer_field_as_yes_no_and_without_a_field_equality_with_the_gold(tmp_path, fake_provider):
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"question": f"Is {i} even?", "gold": i % 2 == 0}) + "\n"
                               for i in range(4)), encoding="utf-8")
    job = _job(tmp_path, "    parse: json\n    answer_field: verdict\n    score_as: yes_no", rows=dataset,
               choices=False)
    fake_provider.behaviour = _answer('{"verdict": true, "why": "it is"}')
    rows = _lines(await execute(job, open_store(tmp_path / "s.sqlite")))
    assert [(r["answer"], r["score"]) for r in sorted(rows, key=lambda r: r["id"])] == \
        [(True, 1.0), (True, 0.0), (True, 1.0), (True, 0.0)]
    # no answer_field: the whole object against the gold, scored only where the row has one
    dataset.write_text(json.dumps({"question": "q1", "gold": {"verdict": True}}) + "\n"
                       + json.dumps({"question": "q2", "gold": {"verdict": False}}) + "\n"
                       + json.dumps({"question": "q3"}) + "\n", encoding="utf-8")
    fake_provider.behaviour = _answer('{"verdict": true}')
    job = _job(tmp_path, "    parse: json", rows=dataset, choices=False)
    rows = sorted(_lines(await execute(job, open_store(tmp_path / "s2.sqlite"))), key=lambda r: r["id"])
    assert [(r["parsed"], r["score"]) for r in rows] == [({"verdict": True}, 1.0), ({"verdict": True}, 0.0),
                                                          ({"verdict": True}, None)]


# -- thinking ----------------------------------------------------------------------------------------------------

async def test_thinking_is_kept_in_the_result_line_and_never_parsed(tmp_path, fake_provider):
    rows = write_rows(tmp_path / "rows.jsonl", 6)
    job = _job(tmp_path, "    parse: letter", rows=rows)
    thinking = "Option C looks right. Answer: C"

    def reply(model, messages, params, n):  # the first row's answer comes without thinking
        if "number 0:" in messages[-1]["content"]:
            return Completion(text="A", input_tokens=20, output_tokens=5)
        return Completion(text="A", input_tokens=20, output_tokens=30, thinking=thinking, reasoning_tokens=12)

    fake_provider.behaviour = reply
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(job, store)
    fresh = _lines(first)
    assert all(r["response"] == "A" and r["answer_letter"] == "A" for r in fresh)
    plain = [r for r in fresh if r["id"] == "1"]
    assert len(plain) == 1 and "thinking" not in plain[0] and "reasoning_tokens" not in plain[0]
    thought = [r for r in fresh if r["id"] != "1"]
    assert len(thought) == 5 and all(r["thinking"] == thinking and r["reasoning_tokens"] == 12 for r in thought)
    memo = store.responses()
    assert sorted((m["reasoning_tokens"], m["thinking"] or "") for m in memo) == [(0, "")] + [(12, thinking)] * 5
    (row,) = report.build(store, first.run_id)["rows"]
    assert (row["reasoning_tokens"], row["output_tokens"]) == (60, 155)

    # the same job again: every answer from the memo, with the thinking it came with
    for reuse in (False, True):  # through the memo, and through replay of the finished stage
        again = await execute(job, store, reuse=reuse)
        cached = _lines(again)
        assert len(fake_provider.history) == 6
        assert all(r["cache_hit"] for r in cached)
        # the lines are the first run's but for the cache hit and the run the line was made in (a replayed stage
        # copies the first run's lines, provenance included)
        assert [_without_run(r) for r in cached] == [_without_run(r) for r in fresh]
        # reasoning tokens are counted where they were spent: a cache hit sends nothing
        assert report.build(store, again.run_id)["rows"][0]["reasoning_tokens"] == 0


async def test_a_shared_identical_request_shares_its_thinking(tmp_path, fake_provider):
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"question": "same?", "gold": True}) + "\n" for _ in range(3)),
                       encoding="utf-8")
    job = _job(tmp_path, "    parse: yes_no", rows=dataset, choices=False)
    fake_provider.behaviour = _answer("yes", thinking="no... yes", reasoning_tokens=3)
    fake_provider.latency = 0.05
    rows = _lines(await execute(job, open_store(tmp_path / "s.sqlite")))
    assert len(fake_provider.history) == 1
    assert [(r["thinking"], r["reasoning_tokens"], r["parsed"]) for r in rows] == [("no... yes", 3, True)] * 3


# -- refusals ----------------------------------------------------------------------------------------------------

PRICED = "prices: {fake:m1: {input: 1.0, output: 2.0}}\nbudget: {usd: 10}"
#: what one refusal costs: 100 input tokens at $1/M and 20 output tokens at $2/M
REFUSAL_COST = 100 * 1e-6 + 20 * 2e-6


def _refusing(refuse: set[str]) -> Any:
    def reply(model, messages, params, n):
        if any(f"number {i}:" in messages[-1]["content"] for i in refuse):
            billed = Completion(text="", finish_reason="refusal", input_tokens=100, output_tokens=20,
                                reasoning_tokens=8)
            return Refused("fake:m1: the model refused: 'I cannot help with that'", billed=billed)
        return Completion(text="B", finish_reason="stop", input_tokens=100, output_tokens=10)
    return reply


async def test_a_refusal_is_counted_charged_and_never_scored(tmp_path, fake_provider):
    job = _job(tmp_path, "    parse: letter", extra=PRICED)
    fake_provider.behaviour = _refusing({"1", "4", "6"})
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed"
    assert len(fake_provider.history) == 8  # a refusal is not retried
    failed = store.tasks(outcome.run_id, status="failed")
    assert {t["error_class"] for t in failed} == {"refused"} and len(failed) == 3
    assert all(t["score"] is None and t["cost"] == pytest.approx(REFUSAL_COST) for t in failed)
    assert all((t["input_tokens"], t["output_tokens"]) == (100, 20) for t in failed)
    # charged in the ledger, the reservation settled (nothing left reserved), and in the budget's sums
    charges = {row["key"]: row["amount"] for row in store.ledger(outcome.run_id, kind="charge")}
    assert all(charges[t["key"]] == pytest.approx(REFUSAL_COST) for t in failed)
    assert store.ledger(outcome.run_id, kind="reserved") == []
    answered = 5 * (100 * 1e-6 + 10 * 2e-6)
    assert store.charged(outcome.run_id) == pytest.approx(answered + 3 * REFUSAL_COST)
    assert store.spent(outcome.run_id) == [("mc", "fake:m1", pytest.approx(answered + 3 * REFUSAL_COST),
                                            5 * 110 + 3 * 120)]
    assert outcome.stats.totals().spend == pytest.approx(answered + 3 * REFUSAL_COST)
    budget = outcome.stats.budgets.run  # the reservations settled to what was billed, none given back unpaid
    assert (budget.spent_usd, budget.reserved_usd, budget.inflight) == (pytest.approx(answered + 3 * REFUSAL_COST),
                                                                        0.0, 0)
    assert budget.spent_tokens == 5 * 110 + 3 * 120
    assert (outcome.stats.totals().refused, outcome.stats.totals().errors) == (3, 3)
    rows = [r for r in _lines(outcome) if r["status"] == "failed"]
    assert all(r["error_class"] == "refused" and r["score"] is None and "valid" not in r for r in rows)

    data = report.build(store, outcome.run_id)
    (row,) = data["rows"]
    assert (row["refused"], row["failed"], row["scored"], row["invalid"]) == (3, 3, 5, 0)
    assert row["errors"] == {"refused": 3}
    assert row["cost"] == pytest.approx(answered + 3 * REFUSAL_COST)
    right = [t for t in store.tasks(outcome.run_id, status="done") if t["score"] == 1.0]
    assert row["accuracy"] == pytest.approx(len(right) / 5)  # over the answered items only
    assert data["totals"]["refused"] == 3
    text = report.render(data, "text")
    assert "refused" in text.splitlines()[1] and "3 failed (3 refused)" in text
    assert "refused items are not scored" in text
    summary = report.summary_lines(data)
    assert "(n=5, invalid 0, refused 3 (not scored))" in summary[0]
    assert "refused" in report.render(data, "csv").splitlines()[0].split(",")
    assert "| refused |" in report.render(data, "md")
    page = html.render(html.build(store, outcome.run_id))
    assert page.count('data-outcome="refused"') == 3 and "<th>refused</th>" in page


async def test_a_shared_refusal_is_charged_once(tmp_path, fake_provider):
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"question": "Question number 1: same", "gold": True}) + "\n"
                               for _ in range(3)), encoding="utf-8")
    job = _job(tmp_path, "    parse: yes_no", rows=dataset, choices=False, extra=PRICED)
    fake_provider.behaviour = _refusing({"1"})
    fake_provider.latency = 0.05
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert len(fake_provider.history) == 1
    tasks = store.tasks(outcome.run_id)
    assert [t["error_class"] for t in tasks] == ["refused"] * 3
    assert sorted(t["cost"] for t in tasks) == [0.0, 0.0, pytest.approx(REFUSAL_COST)]
    assert [row["amount"] for row in store.ledger(outcome.run_id)] == [pytest.approx(REFUSAL_COST)]
    assert report.build(store, outcome.run_id)["rows"][0]["refused"] == 3


async def test_reasoning_tokens_are_reported_next_to_output_tokens(tmp_path, fake_provider):
    job = _job(tmp_path, "    parse: letter", extra=PRICED)
    fake_provider.behaviour = _answer("C", thinking="hmm", reasoning_tokens=40, input_tokens=100, output_tokens=50)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    data = report.build(store, outcome.run_id)
    (row,) = data["rows"]
    assert (row["output_tokens"], row["reasoning_tokens"]) == (400, 320)
    # priced as output: the reasoning tokens are inside output_tokens, charged once
    assert row["cost"] == pytest.approx(8 * (100 * 1e-6 + 50 * 2e-6))
    text = report.render(data, "text")
    assert "tokens out (reasoning)" in text and "400 (320)" in text
    assert "tokens out include reasoning tokens (shown apart), priced as output" in text
    assert "(320 reasoning, priced as output)" in report.summary_lines(data)[-1]
    assert data["totals"]["reasoning_tokens"] == 320
    assert "reasoning_tokens" in report.render(data, "csv").splitlines()[0].split(",")
    page = html.render(html.build(store, outcome.run_id))
    assert "<th>tokens out (reasoning)</th>" in page and "<dt>thinking</dt>" in page


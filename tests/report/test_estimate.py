"""``runner estimate`` and the estimate ``runner submit`` shows first: the arithmetic pinned by hand on a small job
(cached requests excluded from the cost and counted as cache hits), unknown prices, every format, the refusal of a
submit whose worst case exceeds its budget, and the NewTerm 2023 GPT-4o job priced from counted tokens."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.plan.choices import permutation
from runner.plan.stage import StagePlan
from runner.providers.pricing import Pricing
from runner.providers.tokens import count_input_tokens
from runner.report import estimate as estimates
from runner.report import estimate_render
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimServer, start_server
from tests.helpers import ROOT, run_cli

MODEL = "sim:priced"
PRICE_IN, PRICE_OUT = 1000.0, 4000.0  # USD per million tokens: dear enough to read in cents
MAX_TOKENS = 5
SYSTEM = "Answer with one letter."
ROWS = [
    {"question": "Which colour is the sky on a clear day?", "choices": ["green", "blue", "red", "black"], "gold": 1},
    {"question": "How many legs has a spider?", "choices": ["six", "four", "eight", "ten"], "gold": 2},
    {"question": "What do bees make?", "choices": ["honey", "milk", "silk", "wax paper"], "gold": 0},
]


def _write_job(folder: Path, url: str, *, limit: int | None = None, models: list[str] | None = None,
               prices: dict | None = None, budget: float | None = None) -> Path:
    dataset = folder / "rows.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    job: dict = {
        "name": "est", "output_dir": str(folder / "results"), "models": models or [MODEL],
        "providers": {"sim": {"base_url": url, "timeout": 10}},
        "params": {"temperature": 0, "max_tokens": MAX_TOKENS},
        "prices": {MODEL: {"input": PRICE_IN, "output": PRICE_OUT}} if prices is None else prices,
        "stages": [{
            "name": "mc", "dataset": {"path": str(dataset), **({"limit": limit} if limit else {})},
            "prompt": {"system": SYSTEM, "user": "{{ question }}\n{{ options_block }}\nAnswer:"},
            "choices": {"seeds": [0, 1]}, "parse": "letter",
        }],
    }
    if budget is not None:
        job["budget"] = {"usd": budget}
    path = folder / ("subset.yaml" if limit else "job.yaml")
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def _messages(row_index: int, seed: int) -> list[dict[str, str]]:
    """The request of row ``row_index`` (0-based; its id is its line number) under ``seed``, written out by hand."""
    row = ROWS[row_index]
    perm = permutation(4, str(row_index + 1), seed, True)
    block = "\n".join(f"{'ABCD'[i]}. {row['choices'][j]}" for i, j in enumerate(perm))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{row['question']}\n{block}\nAnswer:"}]



@pytest.fixture
async def server():
    async with await start_server() as srv:
        yield srv


async def test_arithmetic_by_hand_with_cached_requests_excluded(tmp_path: Path, server: SimServer) -> None:
    """3 rows × 2 seeds of a priced sim model; row 1 was run before, so its 2 requests are in the cache: they count
    as cache hits, cost nothing, and their output tokens are the history the expected cost is taken from."""
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(_write_job(tmp_path, server.url, limit=1)), store)
    assert outcome.status == "completed"
    assert len(store.responses()) == 2

    job = load_job(_write_job(tmp_path, server.url))
    est = estimates.estimate(job, store)
    [group] = est.groups

    to_send = [_messages(r, s) for r in (1, 2) for s in (0, 1)]
    assert len({json.dumps(m) for m in to_send}) == 4, "the four requests to send must differ"
    tokens = [count_input_tokens("sim", "priced", m) for m in to_send]
    worst = sum(t * PRICE_IN + MAX_TOKENS * PRICE_OUT for t in tokens) / 1e6
    outputs = [r["output_tokens"] for r in store.responses() if r["output_tokens"] is not None]
    mean_out = sum(outputs) / len(outputs)
    expected = sum(t * PRICE_IN + mean_out * PRICE_OUT for t in tokens) / 1e6

    assert (group.requests, group.cached, group.repeats, group.to_send) == (6, 2, 0, 4)
    assert group.input_tokens == sum(tokens) and group.input_exact
    assert group.output_tokens_max == 4 * MAX_TOKENS
    assert group.history == 2 and group.output_tokens_expected == pytest.approx(4 * mean_out)
    assert group.cost_high == pytest.approx(worst, rel=1e-12)
    assert group.cost_low == pytest.approx(expected, rel=1e-12)
    assert group.batch_price is None and group.batch_low is None  # job prices state no batch price
    assert est.high == pytest.approx(worst, rel=1e-12)
    assert est.totals["cost_low"] == pytest.approx(expected, rel=1e-12)

    text = estimate_render.render(est, "text")
    assert f"${expected:,.4f} – ${worst:,.4f}" in text
    assert re.search(r"estimated in \d+\.\d\d s", text)
    assert f"{sum(tokens):,} (exact)" in text

    # Nothing cached yet: no history, so the low end is the input alone.
    fresh = estimates.estimate(job, open_store(tmp_path / "empty.sqlite"))
    [g] = fresh.groups
    assert (g.cached, g.to_send, g.history) == (0, 6, 0)
    all_tokens = [count_input_tokens("sim", "priced", _messages(r, s)) for r in range(3) for s in (0, 1)]
    assert g.cost_low == pytest.approx(sum(all_tokens) * PRICE_IN / 1e6, rel=1e-12)
    assert g.cost_high == pytest.approx(sum(t * PRICE_IN + MAX_TOKENS * PRICE_OUT for t in all_tokens) / 1e6)
    assert "no history" in estimate_render.render(fresh, "text")


def test_repeated_requests_are_sent_once(tmp_path: Path) -> None:
    """Without shuffling, the two seeds ask the same thing: the second copy is a repeat, not paid twice."""
    path = _write_job(tmp_path, "http://127.0.0.1:9/v1")
    job = load_job(path)
    job.stages[0].choices.shuffle = False  # type: ignore[union-attr]
    [g] = estimates.estimate(job, open_store(tmp_path / "s.sqlite")).groups
    assert (g.requests, g.repeats, g.to_send) == (6, 3, 3)
    tokens = [count_input_tokens("sim", "priced", _plain(r)) for r in range(3)]
    assert g.input_tokens == sum(tokens)


def _plain(row_index: int) -> list[dict[str, str]]:
    row = ROWS[row_index]
    block = "\n".join(f"{'ABCD'[i]}. {c}" for i, c in enumerate(row["choices"]))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{row['question']}\n{block}\nAnswer:"}]


def test_unknown_price_is_shown_not_raised(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    path = _write_job(tmp_path, "http://127.0.0.1:9/v1", models=[MODEL, "openai:gpt-nonexistent-9"])
    code, out, err = run_cli(monkeypatch, capsys, "estimate", str(path), "--db", str(tmp_path / "s.sqlite"))
    assert code == 0, err
    assert "unknown price" in out
    assert "add prices: {openai:gpt-nonexistent-9: {input: USD, output: USD}}" in out
    assert "cost unknown (a model has no price)" in out
    data = json.loads(run_cli(monkeypatch, capsys, "estimate", str(path), "--format", "json")[1])
    unknown = [g for g in data["groups"] if g["model"] == "openai:gpt-nonexistent-9"]
    assert unknown[0]["cost_high"] is None and unknown[0]["add_price"] == "openai:gpt-nonexistent-9"
    assert data["totals"]["unknown_prices"] == ["openai:gpt-nonexistent-9"]


def test_every_format(tmp_path: Path, monkeypatch, capsys) -> None:
    path = _write_job(tmp_path, "http://127.0.0.1:9/v1")
    code, out, _ = run_cli(monkeypatch, capsys, "estimate", str(path), "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["totals"]["requests"] == 6 and data["elapsed_s"] >= 0
    code, out, _ = run_cli(monkeypatch, capsys, "estimate", str(path), "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert out.startswith("stage,model,requests,cached,repeats,to_send,input_tokens,")
    assert [r["stage"] for r in rows] == ["mc", "total"] and rows[1]["requests"] == "6"
    code, out, _ = run_cli(monkeypatch, capsys, "estimate", str(path), "--format", "md")
    assert "| stage | model | requests | in cache |" in out and "|---|" in out and "| mc | sim:priced | 6 |" in out
    code, out, err = run_cli(monkeypatch, capsys, "estimate", str(path), "--format", "xml")
    assert code == 1 and err.startswith("Error: --format must be one of") and "Traceback" not in err


def test_submit_refuses_a_worst_case_over_the_budget(tmp_path: Path, monkeypatch, capsys) -> None:
    db = tmp_path / "s.sqlite"
    path = _write_job(tmp_path, "http://127.0.0.1:9/v1")
    high = estimates.estimate(load_job(path), open_store(db)).high
    assert high is not None and high > 0.01
    code, out, err = run_cli(monkeypatch, capsys, "submit", str(path), "--db", str(db), "--budget", "0.01")
    assert code == 2
    assert out.startswith("estimate: 6 requests, 0 in the cache, 6 to send; cost $")
    [line] = err.strip().splitlines()
    assert line.startswith("Error: the estimate's worst case ") and f"${high:,.4f}" in line
    assert "$0.0100" in line and "--allow-partial" in line and "--budget" in line
    assert open_store(db).list_runs() == []  # refused before a run was created


async def test_submit_runs_with_allow_partial_or_a_large_enough_budget(tmp_path: Path, server: SimServer,
                                                                      monkeypatch, capsys) -> None:
    db = tmp_path / "s.sqlite"
    path = _write_job(tmp_path, server.url)
    high = estimates.estimate(load_job(path), open_store(db)).high
    assert high is not None
    budget = f"{high / 2:.6f}"
    code, out, err = await asyncio.to_thread(
        run_cli, monkeypatch, capsys, "submit", str(path), "--db", str(db), "--budget", budget, "--allow-partial")
    assert code in (0, 3), err  # the engine stops it when the budget is spent (or the answers were cheap)
    assert out.startswith("estimate: 6 requests") and "--allow-partial" in err
    spent = sum(row["amount"] for row in open_store(db).ledger(kind="charge"))
    assert 0 < spent <= float(budget)

    code, out, err = await asyncio.to_thread(
        run_cli, monkeypatch, capsys, "submit", str(path), "--db", str(db), "--budget", f"{high:.6f}")
    assert code == 0, err
    first = out.splitlines()[0]
    assert re.match(r"estimate: 6 requests, \d in the cache, \d to send; cost \$", first)
    assert re.search(r"^run \S+: completed$", out, re.M)


def test_newterm_2023_gpt4o_job_priced_from_counted_tokens(monkeypatch, capsys, tmp_path: Path) -> None:
    """The acceptance check: the estimate of jobs/newterm-2023-eval-gpt4o.yaml equals the bounds computed here from
    tiktoken counts and genai-prices' gpt-4o rates, and needs no API key."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)  # the job finds data/ and prompts/ from its own folder
    job_file = ROOT / "jobs" / "newterm-2023-eval-gpt4o.yaml"
    job = load_job(job_file)
    model = "openai:gpt-4o-2024-08-06"
    assert job.models == [model] and job.params.max_tokens == 8
    rates = Pricing(job).rates(model)
    assert rates is not None and rates.source.startswith("genai-prices") and not rates.tiers

    rows = sum(1 for line in (ROOT / "data/newterm/benchmark_2023/COMA_clean.jsonl").open() if line.strip())
    tokens: dict[str, int] = {}  # by cache key: identical requests (two seeds shuffling alike) are sent once
    requests = 0
    for req in StagePlan(job, job.stages[0]):
        requests += 1
        tokens[req.key] = count_input_tokens("openai", "gpt-4o-2024-08-06", req.messages)
    assert requests == rows * 3 == 684
    low = sum(t * rates.input for t in tokens.values()) / 1e6
    high = sum(t * rates.input + 8 * rates.output for t in tokens.values()) / 1e6
    assert 0.1 < low < high < 1.0  # a few hundred short prompts to gpt-4o: cents, not dollars

    code, out, err = run_cli(monkeypatch, capsys, "estimate", str(job_file), "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    [group] = data["groups"]
    assert group["to_send"] == len(tokens) and group["repeats"] == requests - len(tokens)
    assert group["input_tokens"] == sum(tokens.values()) and group["input_exact"] is True
    assert group["cost_low"] == pytest.approx(low, rel=1e-12)
    assert group["cost_high"] == pytest.approx(high, rel=1e-12)
    batch = Pricing(job).batch_rates(model)
    assert batch is not None
    assert group["batch_high"] == pytest.approx(
        sum(t * batch.input + 8 * batch.output for t in tokens.values()) / 1e6, rel=1e-12)

    code, out, err = run_cli(monkeypatch, capsys, "estimate", str(job_file))
    assert code == 0, err
    printed = [float(x.replace(",", "")) for x in re.search(
        r"^estimate: .*; cost \$([\d,.]+) – \$([\d,.]+)", out, re.M).groups()]
    assert low - 5e-5 <= printed[0] <= printed[1] <= high + 5e-5
    assert printed == [round(low, 4), round(high, 4)]


def test_counts_without_a_tokenizer_show_the_expected_figure_and_the_bound_reserved(
    monkeypatch, capsys, tmp_path: Path
) -> None:
    """Claude and Gemini have no tokenizer here: the input is shown as expected (the heuristic) and as the upper
    bound a budget reserves (UTF-8 bytes plus framing), labelled; the low end uses the first, the worst case the
    second. 4,000 repeats of "=" are 111 tokens expected and 4,084 at most."""
    from runner.providers.tokens import bound_call_tokens

    rows = [{"question": "=" * 4000}, {"question": "新しい言葉" * 50}]
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    models = ["anthropic:claude-sonnet-4-5", "gemini:gemini-2.0-flash", "openai:gpt-4o-2024-08-06"]
    price = {"input": 100.0, "output": 100.0}
    job = {"name": "bound", "output_dir": str(tmp_path / "results"), "models": models,
           "params": {"max_tokens": 10}, "prices": {m: price for m in models},
           "stages": [{"name": "ask", "dataset": {"path": str(dataset)}, "prompt": {"user": "{{ question }}"}}]}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    code, out, err = run_cli(monkeypatch, capsys, "estimate", str(path), "--format", "json")
    assert code == 0, err
    groups = {g["model"]: g for g in json.loads(out)["groups"]}
    messages = [[{"role": "user", "content": row["question"]}] for row in rows]
    for model in models:
        provider, name = model.split(":", 1)
        g = groups[model]
        expected = [count_input_tokens(provider, name, m) for m in messages]
        bound = [bound_call_tokens(provider, name, m) for m in messages]
        assert g["input_tokens"] == sum(expected) and g["input_tokens_bound"] == sum(bound)
        assert g["cost_low"] == pytest.approx(sum(expected) * 100 / 1e6)
        assert g["cost_high"] == pytest.approx((sum(bound) + 2 * 10) * 100 / 1e6)
        if provider == "openai":
            assert g["input_exact"] and bound == expected
        else:
            assert not g["input_exact"] and bound[0] == 4084 and expected[0] == 111
    code, out, err = run_cli(monkeypatch, capsys, "estimate", str(path))
    assert code == 0, err
    line = next(x for x in out.splitlines() if "claude-sonnet-4-5" in x)
    assert f"{groups['anthropic:claude-sonnet-4-5']['input_tokens']:,} expected, ≤ " \
           f"{groups['anthropic:claude-sonnet-4-5']['input_tokens_bound']:,} (bound)" in line
    assert "(exact)" in next(x for x in out.splitlines() if "gpt-4o" in x)
    assert "upper bound a budget reserves" in out
    code, out, err = run_cli(monkeypatch, capsys, "estimate", str(path), "--format", "csv")
    assert code == 0, err
    assert out.startswith("stage,model,requests,cached,repeats,to_send,input_tokens,input_exact,input_tokens_bound,")

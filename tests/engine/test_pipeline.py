"""Pipelines: data steps, job-file checks, content-addressed reuse of stage outputs, content retries bounded by
max_rounds, the funnel, ${vars}."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.errors import JobFileError, RunnerError
from runner.plan.similarity import get_similarity
from runner.plan.steps import run_step
from runner.providers.base import Completion
from runner.recipes import Context
from runner.report import summary as report
from runner.spec.job import load_job
from runner.spec.stage import Stage
from runner.store import Store, open_store

CTX = Context(similarity=get_similarity("lexical"), seed=0)


def step(**fields) -> Stage:
    return Stage.model_validate({"name": "s", "from": ["a"], **fields})


def rows(*items: dict) -> list[dict]:
    return [{"_id": str(n), **item} for n, item in enumerate(items, start=1)]


# -- data steps ------------------------------------------------------------------------------------------------

def test_join_merges_by_key_inner_drops_and_left_keeps_unmatched():
    terms = rows({"term": "a"}, {"term": "b"})
    syn = [{"_id": "x", "term": "a", "syn": ["one"]}]
    inner = run_step(Stage.model_validate({"name": "j", "from": ["t", "s"], "join": {"by": "term"}}),
                     {"t": terms, "s": syn}, CTX)
    assert inner.rows == [{"_id": "1", "term": "a", "syn": ["one"]}]
    assert inner.dropped == {"no matching row in s": 1}
    left = run_step(Stage.model_validate({"name": "j", "from": ["t", "s"], "join": {"by": ["term"], "how": "left"}}),
                    {"t": terms, "s": syn}, CTX)
    assert [r.get("syn") for r in left.rows] == [["one"], None] and not left.dropped


def test_concat_prefixes_ids_with_their_stage():
    out = run_step(Stage.model_validate({"name": "c", "from": ["x", "y"], "concat": True}),
                   {"x": rows({"v": 1}), "y": rows({"v": 2})}, CTX)
    assert [(r["_id"], r["v"]) for r in out.rows] == [("x:1", 1), ("y:1", 2)]


def test_explode_objects_merge_and_scalars_go_under_as_keeping_the_list():
    objects = run_step(step(explode={"field": "p"}), {"a": rows({"t": "w", "p": [{"q": 1}, {"q": 2}]})}, CTX)
    assert objects.rows == [{"_id": "1.1", "t": "w", "q": 1}, {"_id": "1.2", "t": "w", "q": 2}]
    scalars = run_step(step(explode={"field": "rel", "as": "r"}), {"a": rows({"rel": ["x", "y"]}, {"rel": []})}, CTX)
    assert [(r["_id"], r["r"], r["rel"]) for r in scalars.rows] == [("1.1", "x", ["x", "y"]), ("1.2", "y", ["x", "y"])]
    assert scalars.dropped == {"no rel": 1}


def test_group_collects_and_takes_back_the_exploded_rows_parent_id():
    exploded = [{"_id": "7.1", "q": "Q", "d": "x", "o": 1}, {"_id": "7.2", "q": "Q", "d": "y", "o": 2},
                {"_id": "8.1", "q": "R", "d": "z", "o": 3}]
    out = run_step(step(group={"by": "q", "collect": {"ds": "d"}}), {"a": exploded}, CTX)
    assert out.rows == [{"_id": "7", "q": "Q", "o": 1, "ds": ["x", "y"]}, {"_id": "8", "q": "R", "o": 3, "ds": ["z"]}]


def test_dedupe_sample_top_k_shuffle():
    data = rows({"t": "a", "s": 1}, {"t": "a", "s": 3}, {"t": "a", "s": 1}, {"t": "b", "s": 2})
    assert run_step(step(dedupe={"by": ["t", "s"]}), {"a": data}, CTX).dropped == {"duplicate": 1}
    top = run_step(step(top_k={"by": "t", "k": 1, "score": "s"}), {"a": data}, CTX)
    assert [(r["t"], r["s"]) for r in top.rows] == [("a", 3), ("b", 2)]
    assert run_step(step(top_k={"k": 1, "score": "s", "order": "asc"}), {"a": data}, CTX).rows[0]["_id"] == "1"
    first = run_step(step(sample={"by": "t", "n": 1}), {"a": data}, CTX)
    again = run_step(step(sample={"by": "t", "n": 1}), {"a": data}, CTX)
    assert first.rows == again.rows and sorted(r["t"] for r in first.rows) == ["a", "b"]
    assert first.dropped == {"not sampled": 2}
    seeds = {tuple(r["_id"] for r in run_step(step(shuffle={"seed": s}), {"a": data}, CTX).rows) for s in range(8)}
    assert len(seeds) > 1 and all(sorted(order) == ["1", "2", "3", "4"] for order in seeds)


def test_filter_and_set_evaluate_expressions_over_the_row():
    data = rows({"rating": 9, "gold": True}, {"rating": 5, "gold": True}, {"rating": 2, "gold": False})
    kept = run_step(step(filter={"keep": "rating >= 8 if gold else rating <= 3", "rule": "disagrees"}),
                    {"a": data}, CTX)
    assert [r["_id"] for r in kept.rows] == ["1", "3"] and kept.dropped == {"disagrees": 1}
    out = run_step(step(set={"options": "[answer] + others", "gold": "0"}),
                   {"a": rows({"answer": "x", "others": ["y", "z"]})}, CTX)
    assert out.rows[0]["options"] == ["x", "y", "z"] and out.rows[0]["gold"] == 0
    with pytest.raises(RunnerError, match="stage s: .*fails on row 1"):
        run_step(step(filter={"keep": "missing > 1"}), {"a": rows({"x": 1})}, CTX)


def test_similarity_step_scores_two_fields():
    out = run_step(step(similarity={"a": "guess", "b": "meaning", "as": "sim"}),
                   {"a": rows({"guess": "a happy dog", "meaning": "a happy dog"}, {"guess": "zzz", "meaning": "qq"})},
                   CTX)
    assert out.rows[0]["sim"] == pytest.approx(1.0) and out.rows[1]["sim"] == pytest.approx(0.0)


# -- job files -------------------------------------------------------------------------------------------------

HEAD = "name: p\nmodels: [sim:m]\nparams: {max_tokens: 20}\n"


def error_of(tmp_path: Path, text: str, overrides: dict | None = None) -> str:
    path = tmp_path / "job.yaml"
    (tmp_path / "d.jsonl").write_text('{"t": "x"}\n')
    path.write_text(HEAD + text)
    with pytest.raises(JobFileError) as caught:
        load_job(path, overrides)
    return str(caught.value)


@pytest.mark.parametrize("text, expected", [
    ("stages:\n  - name: a\n    from: b\n    prompt: {user: hi}\n  - name: b\n    dataset: {path: d.jsonl}\n"
     "    prompt: {user: hi}\n", ":6: stages[0].from: stage 'b' comes later"),
    ("stages:\n  - name: a\n    from: nope\n    prompt: {user: hi}\n", "no stage named 'nope' before this one"),
    ("stages:\n  - name: a\n    dataset: {path: d.jsonl}\n    prompt: {user: hi}\n  - name: b\n    from: a\n"
     "    filter: {keep: x}\n    shuffle: {}\n", "a stage does one thing: it has shuffle and filter"),
    ("stages:\n  - name: a\n    dataset: {path: d.jsonl}\n", "a stage needs prompt:"),
    ("stages:\n  - name: a\n    dataset: {path: d.jsonl}\n    prompt: {user: hi}\n  - name: b\n    from: a\n"
     "    recipe: newterm.related_term\n", ":10: stages[1].recipe: no recipe named 'newterm.related_term'; did you "
     "mean 'newterm.related_terms'?"),
    ("stages:\n  - name: a\n    dataset: {path: d.jsonl}\n    prompt: {user: hi}\n    parse: newterm.coma_paragraph\n",
     ":8: stages[0].parse: no parser named 'newterm.coma_paragraph'; did you mean 'newterm.coma_paragraphs'?"),
    ("stages:\n  - name: a\n    dataset: {path: d.jsonl}\n    prompt: {user: hi}\n  - name: b\n    from: a\n"
     "    filter: {keep: 'rating >='}\n", ":10: stages[1].filter.keep: 'rating >=' is not a valid expression"),
    ("stages:\n  - name: a\n    dataset: {path: d.jsonl}\n    prompt: {user: hi}\n  - name: b\n    from: a\n"
     "    join: {by: t}\n", "join: needs two or more stages in from:"),
    ("stages:\n  - name: a\n    dataset: {path: '${data}'}\n    prompt: {user: hi}\n",
     ":6: stages[0].dataset.path: ${data} is not defined: add it to vars: or pass --var data=VALUE"),
])
def test_pipeline_mistakes_name_file_line_and_key(tmp_path, text, expected):
    assert expected in error_of(tmp_path, text)


def test_vars_fill_strings_and_var_overrides_them(tmp_path):
    (tmp_path / "other.jsonl").write_text('{"t": "y"}\n')
    text = "vars: {data: d.jsonl}\nstages:\n  - name: a\n    dataset: {path: '${data}'}\n    prompt: {user: hi}\n"
    path = tmp_path / "job.yaml"
    error_of(tmp_path, "stages: []\n")  # writes d.jsonl
    path.write_text(HEAD + text)
    assert load_job(path).stages[0].dataset.path.endswith("d.jsonl")
    assert load_job(path, {"data": str(tmp_path / "other.jsonl")}).stages[0].dataset.path.endswith("other.jsonl")
    with pytest.raises(JobFileError, match="--var nope: the job has no variable 'nope'"):
        load_job(path, {"nope": "x"})


# -- running pipelines -----------------------------------------------------------------------------------------

def pipeline_job(tmp_path: Path, *, gen_user: str = "Words for {{ t }}", judge_user: str = "Judge {{ word }}",
                 max_rounds: int = 2) -> Path:
    data = tmp_path / "terms.jsonl"
    data.write_text("".join(json.dumps({"t": t}) + "\n" for t in ("alpha", "beta", "gamma")))
    path = tmp_path / "job.yaml"
    path.write_text(f"""
name: pipe
models: [fake:m]
params: {{max_tokens: 20}}
output_dir: {json.dumps(str(tmp_path / "results"))}
retry: {{max_attempts: 1}}
stages:
  - name: gen
    dataset: {{path: {json.dumps(str(data))}, id: t}}
    prompt: {{user: "{gen_user}"}}
    parse: lines
    as: words
    min_items: 2
    max_rounds: {max_rounds}
  - name: each
    from: gen
    explode: {{field: words, as: word}}
  - name: judge
    from: each
    prompt: {{user: "{judge_user}"}}
    parse: scale
    gold: null
    as: rating
  - name: good
    from: judge
    filter: {{keep: "rating >= 5", rule: "rated below 5"}}
    write: {json.dumps(str(tmp_path / "out" / "good.jsonl"))}
""")
    return path


def answers(model, messages, params, n):
    """gen: two words, except gamma (one word the first time, two the second); judge: a rating by word."""
    text = messages[-1]["content"]
    if text.startswith("Words for"):
        term = text.split()[-1]
        if term == "gamma":
            asked = sum(1 for _, m, _, _ in FakeHistory.calls() if m[-1]["content"] == text)
            return Completion(text="g1" if asked == 1 else "g1\ng2", finish_reason="stop", input_tokens=5,
                              output_tokens=2, raw={})
        return Completion(text=f"{term}1\n{term}2", finish_reason="stop", input_tokens=5, output_tokens=2, raw={})
    word = text.split()[-1]
    return Completion(text="9" if word.endswith("1") else "2", finish_reason="stop", input_tokens=5,
                      output_tokens=1, raw={})


class FakeHistory:
    provider: type | None = None

    @classmethod
    def calls(cls):
        return cls.provider.history


@pytest.fixture
def fake(fake_provider):
    FakeHistory.provider = fake_provider
    fake_provider.behaviour = answers
    return fake_provider


def funnel(store: Store, run_id: str) -> dict[str, dict]:
    return {s["stage"]: s for s in store.run_stages(run_id)}


async def test_a_pipeline_runs_its_stages_in_order_and_retries_short_answers(tmp_path, fake):
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(pipeline_job(tmp_path)), store)
    assert outcome.status == "completed", outcome.message
    stages = funnel(store, outcome.run_id)
    # gamma's first answer had one word (min_items 2): asked again once, with a new sample index
    assert stages["gen"]["rounds"] == 2 and stages["gen"]["requests"] == 4 and stages["gen"]["sent"] == 4
    assert [s["rows_out"] for s in stages.values()] == [3, 6, 6, 3]
    assert stages["good"]["dropped"] == {"rated below 5": 3}
    written = [json.loads(line) for line in (tmp_path / "out" / "good.jsonl").read_text().splitlines()]
    assert [r["word"] for r in written] == ["alpha1", "beta1", "g1"]
    assert all(not key.startswith("_") for r in written for key in r)
    assert written[0]["rating"] == 9 and written[0]["words"] == ["alpha1", "alpha2"]
    rows_file = tmp_path / "results" / "pipe" / outcome.run_id / "rows" / "each.jsonl"
    assert json.loads(rows_file.read_text().splitlines()[0])["_id"] == "alpha.1"
    text = report.render(report.build(store, outcome.run_id), "text")
    assert "Pipeline funnel" in text and "rated below 5 3" in text and "good.jsonl 3 items" in text


async def test_content_retries_stop_at_max_rounds(tmp_path, fake):
    fake.behaviour = lambda model, messages, params, n: Completion(
        text="only", finish_reason="stop", input_tokens=5, output_tokens=1, raw={})
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(pipeline_job(tmp_path, max_rounds=3)), store)
    gen = funnel(store, outcome.run_id)["gen"]
    # the fake answers the same every time: 3 terms × 3 rounds, never more
    assert len(fake.history) == 9 and gen["rounds"] == 3
    assert gen["dropped"] == {"fewer than 2 valid items after 3 rounds": 3} and gen["rows_out"] == 0


async def test_an_unchanged_pipeline_is_reused_whole_and_a_changed_stage_reruns_alone(tmp_path, fake):
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(load_job(pipeline_job(tmp_path)), store)
    sent = len(fake.history)
    again = await execute(load_job(pipeline_job(tmp_path)), store)
    assert again.status == "completed" and len(fake.history) == sent
    assert all(s["reused"] and s["built_in"] == first.run_id for s in funnel(store, again.run_id).values())
    assert "4 of 4 stages reused" in "\n".join(report.summary_lines(report.build(store, again.run_id)))
    # a reused LLM stage's answers are this run's cache hits: in the report and in its results file
    built = report.build(store, again.run_id)
    assert built["totals"]["requests"] == built["totals"]["cache_hits"] == sent and built["totals"]["sent"] == 0
    for stage, path in again.results.items():
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        before = [json.loads(x) for x in first.results[stage].read_text().splitlines()]
        assert lines and [{**x, "cache_hit": True} for x in before] == lines
    # a new judge prompt: gen and each are reused, judge runs again (6 new requests), good follows its rows
    changed = await execute(load_job(pipeline_job(tmp_path, judge_user="Rate {{ word }}")), store)
    stages = funnel(store, changed.run_id)
    assert stages["gen"]["reused"] and stages["each"]["reused"]
    assert not stages["judge"]["reused"] and stages["judge"]["sent"] == 6
    assert len(fake.history) == sent + 6
    # the fake rates words the same whatever the prompt: judge's rows are unchanged, so the filter after it,
    # addressed by its input's content, is reused
    assert stages["good"]["reused"]


async def test_a_stage_with_failed_requests_is_not_kept_and_the_next_run_sends_only_those(tmp_path, fake):
    from runner.errors import ProviderError

    def flaky(model, messages, params, n):
        if messages[-1]["content"] == "Judge beta2":
            return ProviderError("bad request", error_class="bad_request")
        return answers(model, messages, params, n)

    fake.behaviour = flaky
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(load_job(pipeline_job(tmp_path)), store)
    judge = funnel(store, first.run_id)["judge"]
    assert judge["dropped"] == {"request failed": 1} and judge["rows_out"] == 5
    sent = len(fake.history)
    fake.behaviour = answers
    second = await execute(load_job(pipeline_job(tmp_path)), store)
    stages = funnel(store, second.run_id)
    assert stages["gen"]["reused"] and not stages["judge"]["reused"]
    assert stages["judge"]["sent"] == 1 and len(fake.history) == sent + 1  # the rest came from the cache
    assert stages["judge"]["rows_out"] == 6 and not stages["good"]["reused"]


async def test_a_pipeline_stopped_by_its_budget_resumes_where_it_stopped(tmp_path, fake):
    from runner.engine.checks import load_run_job
    from runner.spec.overrides import set_budget

    path = pipeline_job(tmp_path)
    priced = "models: [fake:m]\nprices: {fake:m: {input: 1000, output: 1000}}"
    path.write_text(path.read_text().replace("models: [fake:m]", priced))
    job = load_job(path)
    # a request's worst case is 20 output tokens + the byte bound of its input (the fake provider has no
    # tokenizer) at $1000/M: about $0.1, so one request fits at a time and the budget ends part way
    set_budget(job, 0.15)
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(job, store)
    assert first.status == "budget_exhausted"
    done_before = len(fake.history)
    assert 0 < done_before < 10
    _, stored = load_run_job(store, first.run_id)
    set_budget(stored, 100.0)
    resumed = await execute(stored, store, run_id=first.run_id)
    assert resumed.status == "completed", resumed.message
    stages = funnel(store, first.run_id)
    assert [s["rows_out"] for s in stages.values()] == [3, 6, 6, 3]
    # every request was sent once: what the first attempt sent came back from the store
    sent = [m[-1]["content"] for _, m, _, _ in fake.history]
    assert len(sent) == 10 and len(set(sent)) == 9  # gamma's generation is asked twice (its second round)


async def test_a_failing_recipe_parser_keeps_the_paid_answer_and_says_so(tmp_path, fake):
    from runner import recipes

    def broken(text, row, args):
        raise KeyError("split")

    recipes.PARSERS["test.broken"] = broken
    try:
        path = pipeline_job(tmp_path, max_rounds=1)
        path.write_text(path.read_text().replace("parse: lines", "parse: test.broken"))
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(path), store)
    finally:
        del recipes.PARSERS["test.broken"]
    assert outcome.status == "completed"
    gen = funnel(store, outcome.run_id)["gen"]
    assert gen["sent"] == 3 and gen["dropped"] == {"fewer than 2 valid items": 3}
    assert any("parser test.broken failed: KeyError" in note for note in outcome.stats.notes)
    lines = [json.loads(x) for x in outcome.results["gen"].read_text().splitlines()]
    assert all(r["response"] and r["valid"] is False and "KeyError" in r["invalid_reason"] for r in lines)
    assert len(store.memo_keys()) == 3  # the answers are in the cache: a fixed parser costs nothing


async def test_a_repeated_id_is_refused_and_sample_offset_gives_a_stage_its_own_answers(tmp_path, fake):
    path = pipeline_job(tmp_path)
    data = tmp_path / "terms.jsonl"
    data.write_text(data.read_text() + json.dumps({"t": "beta"}) + "\n")
    with pytest.raises(RunnerError, match=r"terms.jsonl:4: id 'beta' \(field 't'\) was already used on line 2"):
        await execute(load_job(path), open_store(tmp_path / "s.sqlite"))
    pipeline_job(tmp_path)  # the term list again without the repeat
    twice = path.read_text().replace("  - name: each", """  - name: gen2
    from: gen
    prompt: {user: "Words for {{ t }}"}
    parse: lines
    as: words2
    min_items: 2
    max_rounds: 2
    sample_offset: 100
  - name: each""")
    path.write_text(twice)
    store = open_store(tmp_path / "s2.sqlite")
    outcome = await execute(load_job(path), store)
    stages = funnel(store, outcome.run_id)
    assert stages["gen"]["sent"] == 4 and stages["gen2"]["sent"] == 3  # not gen's answers from the cache

"""Every result line says what produced it (runner/evaluate/results.py ``line_provenance``): the run, the job's
fingerprint, the prompt template (name, file, SHA-256), the model id of the cache key, the parameters sent and the
runner's version. Done, failed and cache-hit lines alike, in the results file and in the store's task rows, for
evaluation and pipeline stages; and no API key from the environment is ever among them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from runner.engine import dispatch
from runner.engine.run import execute
from runner.errors import BadRequest
from runner.plan.prompts import load_prompt
from runner.plan.request import canonical_params
from runner.providers.base import Completion
from runner.spec.job import load_job
from runner.store import Store, open_store
from runner.version import version
from tests.helpers import fresh, write_rows

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: what `runner --version` prints: in a git checkout, the commit that runs (runner/version.py)
VERSION = version()
SECRET = "sk-provenance-0123456789-do-not-leak"
PROMPT = """source: a test template
system: Answer with one letter.
user: |-
  {{ question }}
  {{ options_block }}
  Answer:
"""


def _mc_job(tmp_path: Path, models: list[str], *, extra: str = "", rows: int = 6,
            params: str = "{temperature: 0, max_tokens: 5, top_p: 1, seed: 7}") -> Path:
    """A multiple-choice job whose prompt is the template file prompts/mc.yaml beside it."""
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    (tmp_path / "prompts").mkdir(exist_ok=True)
    (tmp_path / "prompts" / "mc.yaml").write_text(PROMPT, encoding="utf-8")
    path = tmp_path / "job.yaml"
    path.write_text("\n".join([
        "name: provenance",
        f"models: {json.dumps(models)}",
        f"params: {params}",
        f"output_dir: {json.dumps(str(tmp_path / 'results'))}",
        "retry: {max_attempts: 1}",
        extra,
        "stages:",
        "  - name: mc",
        f"    dataset: {{path: {json.dumps(str(dataset))}}}",
        "    prompt: mc",
        "    choices: {seeds: [0, 1], gold: gold}",
        "    parse: letter",
    ]) + "\n", encoding="utf-8")
    return path


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _stored(store: Store, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(task["result_json"]) for task in store.tasks(run_id)]


def _expected(store: Store, run_id: str, job_path: Path, model: str, *, reported_model: str | None = None,
              sent_with: str | None = None) -> dict[str, Any]:
    """The provenance a line of ``model`` in _mc_job's stage must carry, from its sources: the run's stored
    fingerprint, the template file's bytes, the stage's shaped parameters and the runner's version; and what
    produced its answer (the fake provider names no model and uses no SDK)."""
    job = load_job(job_path)
    template = job_path.parent / "prompts" / "mc.yaml"
    return {
        "run_id": run_id,
        "job_hash": store.get_run(run_id)["fingerprint"],
        "prompt": {"name": "mc", "path": str(template.resolve()),
                   "sha256": hashlib.sha256(template.read_bytes()).hexdigest()},
        "model_id": model.partition(":")[2],
        "params": canonical_params(job.model_params(job.stages[0], model)),
        "runner_version": VERSION,
        "reported_model": reported_model,
        "sent_with": sent_with,
    }


async def test_done_failed_and_cache_hit_lines_carry_their_provenance(tmp_path, fake_provider):
    # a question the provider refuses: its lines are failed ones
    fake_provider.behaviour = lambda model, messages, params, n: (
        BadRequest("no") if "Question number 2:" in messages[-1]["content"] else None)
    path = _mc_job(tmp_path, ["fake:m1", "fake:m2"])
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(load_job(path), store)
    lines = _lines(first.results["mc"])
    assert len(lines) == 6 * 2 * 2 and {x["status"] for x in lines} == {"done", "failed"}
    for line in lines:
        assert line["provenance"] == _expected(store, first.run_id, path, line["model"])
    assert {x["provenance"]["job_hash"] for x in lines} == {load_job(path).fingerprint()}
    # the parameters in the lines are those the provider was sent
    assert {json.dumps(p, sort_keys=True) for _, _, p, _ in fake_provider.history} == \
        {json.dumps(x["provenance"]["params"], sort_keys=True) for x in lines}
    assert sorted(_stored(store, first.run_id), key=lambda x: x["cache_key"] + x["model"]) == \
        sorted(lines, key=lambda x: x["cache_key"] + x["model"])

    # request by request again (not replayed whole): answers from the cache, the failed ones sent again
    sent = len(fake_provider.history)
    second = await execute(load_job(path), store, reuse=False)
    again = _lines(second.results["mc"])
    assert len(fake_provider.history) - sent == 1 * 2 * 2
    assert sum(x["cache_hit"] for x in again) == 5 * 2 * 2
    for line in again:
        assert line["provenance"] == _expected(store, second.run_id, path, line["model"])
    assert second.run_id != first.run_id


async def test_the_provenance_is_built_once_per_stage_and_model(tmp_path, fake_provider, monkeypatch):
    built: list[tuple[str, str]] = []
    original = dispatch.line_provenance

    def counted(**kwargs: Any) -> dict[str, Any]:
        built.append((kwargs["model_id"], kwargs["prompt"].name))
        return original(**kwargs)

    monkeypatch.setattr(dispatch, "line_provenance", counted)
    outcome = await execute(load_job(_mc_job(tmp_path, ["fake:m1", "fake:m2"], rows=30)), open_store(tmp_path / "s"))
    assert len(_lines(outcome.results["mc"])) == 30 * 2 * 2
    assert sorted(built) == [("m1", "mc"), ("m2", "mc")]


async def test_an_inline_prompt_is_named_inline_and_hashed_by_its_text(tmp_path, fake_provider):
    dataset = write_rows(tmp_path / "rows.jsonl", 3)

    def job(user: str) -> Path:
        path = tmp_path / "inline.yaml"
        path.write_text("\n".join([
            "name: inline", "models: [fake:m1]", "params: {max_tokens: 3}",
            f"output_dir: {json.dumps(str(tmp_path / 'results'))}",
            "stages:", "  - name: mc", f"    dataset: {{path: {json.dumps(str(dataset))}}}",
            f"    prompt: {{system: Answer., user: {json.dumps(user)}}}",
            "    choices: {seeds: [0]}", "    parse: letter"]) + "\n")
        return path

    store = open_store(tmp_path / "s.sqlite")
    digests = []
    for user in ("{{ question }}\n{{ options_block }}", "Q: {{ question }}\n{{ options_block }}"):
        loaded = load_job(job(user))
        outcome = await execute(loaded, store)
        prompts = {json.dumps(x["provenance"]["prompt"]) for x in _lines(outcome.results["mc"])}
        assert len(prompts) == 1
        prompt = json.loads(prompts.pop())
        text = load_prompt(loaded, loaded.stages[0].prompt).text
        assert user in text
        assert prompt == {"name": "inline", "path": None, "sha256": hashlib.sha256(text.encode()).hexdigest()}
        digests.append(prompt["sha256"])
    assert digests[0] != digests[1]


async def test_a_pipelines_llm_stages_carry_their_own_prompts_provenance(tmp_path, fake_provider):
    def answers(model: str, messages: list[dict[str, str]], params: dict[str, Any], n: int) -> Completion:
        text = messages[-1]["content"]
        return Completion(text="red\nblue" if text.startswith("Words") else "7", input_tokens=3, output_tokens=2)

    fake_provider.behaviour = answers
    data = tmp_path / "terms.jsonl"
    data.write_text("".join(json.dumps({"t": t}) + "\n" for t in ("alpha", "beta")))
    path = tmp_path / "pipe.yaml"
    path.write_text(f"""
name: pipe
models: [fake:m]
params: {{max_tokens: 20}}
output_dir: {json.dumps(str(tmp_path / "results"))}
stages:
  - name: gen
    dataset: {{path: {json.dumps(str(data))}, id: t}}
    prompt: {{user: "Words for {{{{ t }}}}"}}
    parse: lines
    as: words
  - name: each
    from: gen
    explode: {{field: words, as: word}}
  - name: judge
    from: each
    prompt: {{user: "Judge {{{{ word }}}}"}}
    params: {{max_tokens: 4, temperature: 0.5}}
    parse: scale
    as: rating
""")
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed"
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for line in _stored(store, outcome.run_id):
        by_stage.setdefault(line["stage"], []).append(line)
    assert sorted(by_stage) == ["gen", "judge"] and len(by_stage["judge"]) == 4
    job = load_job(path)
    for name, lines in by_stage.items():
        stage = next(s for s in job.stages if s.name == name)
        text = load_prompt(job, stage.prompt).text
        for line in lines:
            assert line["provenance"] == {
                "run_id": outcome.run_id, "job_hash": job.fingerprint(),
                "prompt": {"name": "inline", "path": None, "sha256": hashlib.sha256(text.encode()).hexdigest()},
                "model_id": "m", "params": canonical_params(job.model_params(stage, "fake:m")),
                "runner_version": VERSION, "reported_model": None, "sent_with": None}
    assert by_stage["judge"][0]["provenance"]["params"] == {"max_tokens": 4, "temperature": 0.5}


async def test_no_api_key_from_the_environment_reaches_the_results_or_the_store(tmp_path, srv, monkeypatch):
    server = fresh(srv)
    for variable in ("RUNNER_SIM_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.setenv(variable, f"{SECRET}-{variable}")
    extra = f"providers: {{sim: {{base_url: {json.dumps(server.url)}, concurrency: 4, timeout: 5}}}}"
    path = _mc_job(tmp_path, ["sim:alpha"], extra=extra)
    db = tmp_path / "s.sqlite"
    store = open_store(db)
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed"
    lines = _lines(outcome.results["mc"])
    assert len(lines) == 12 and server.stats()["received"] == len({x["cache_key"] for x in lines})  # keys were sent
    for line in lines:
        assert line["provenance"] == _expected(store, outcome.run_id, path, "sim:alpha", reported_model="alpha",
                                               sent_with="lean wire")
    results_text = outcome.results["mc"].read_text(encoding="utf-8")
    stored = "\n".join(task["result_json"] for task in store.tasks(outcome.run_id))
    store.close()
    files = [file.read_bytes().decode("utf-8", "replace") for file in tmp_path.glob("s.sqlite*")]
    assert stored and files
    for text in (results_text, stored, *files):
        assert SECRET not in text


async def test_a_line_names_the_model_that_answered_and_what_sent_the_request(tmp_path, srv, monkeypatch):
    """Each line's provenance carries the model the provider's answer names (OpenAI's and Anthropic's ``model``,
    Gemini's ``modelVersion``) and what sent the request: the SDK and its version, or the lean wire; a cache hit's
    line carries those of the memo's answer, and so does the store's memo row."""
    server = fresh(srv)
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(variable, raising=False)  # over the lean wire unless a proxy applies
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.setenv(variable, "test-key")
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    sent = {"sim:alpha": ("alpha", "lean wire"), "openai:gpt-4o": ("gpt-4o", "lean wire"),
            "anthropic:claude-3-5-haiku-20241022": ("claude-3-5-haiku-20241022", "lean wire"),
            "gemini:gemini-2.0-flash": ("gemini-2.0-flash", "lean wire")}
    urls = {"sim": server.url, "openai": server.url, "anthropic": server.root_url, "gemini": server.root_url}
    extra = "providers: {" + ", ".join(f"{p}: {{base_url: {json.dumps(u)}, timeout: 5}}" for p, u in urls.items()) \
        + "}"
    path = _mc_job(tmp_path, list(sent), extra=extra, rows=3, params="{temperature: 0, max_tokens: 5}")
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed", outcome.message
    lines = _lines(outcome.results["mc"])
    assert len(lines) == 3 * 2 * len(sent) and not any(x["cache_hit"] for x in lines if x["model"] != "sim:alpha")
    for line in lines:
        reported, client = sent[line["model"]]
        assert (line["provenance"]["reported_model"], line["provenance"]["sent_with"]) == (reported, client), line
    assert {(row["reported_model"], row["sent_with"]) for row in store.responses()} == set(sent.values())
    again = await execute(load_job(path), store, reuse=False)  # every request a cache hit: the memo's origin
    for line in _lines(again.results["mc"]):
        assert line["cache_hit"] and (line["provenance"]["reported_model"], line["provenance"]["sent_with"]) == \
            sent[line["model"]]

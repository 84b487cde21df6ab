"""``tier:`` and ``fallback:`` in the job file (runner/spec/tiers.py): what each model is sold at is taken, and
everything else is one sentence at its line from ``runner validate``, before anything is sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.errors import JobFileError
from runner.plan.stage import StagePlan
from runner.spec.job import load_job
from tests.helpers import only_error, run_cli

ROWS = [{"question": "q1", "choices": ["a", "b"], "gold": 0}, {"question": "q2", "choices": ["a", "b"], "gold": 1}]


def job_file(tmp_path: Path, head: str = "", stage: str = "", *, models: str = "[openai:gpt-5-mini]",
             mode: str = "") -> Path:
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    lines = ["name: tiers", f"models: {models}", "params: {max_tokens: 8}", head, mode, "stages:", "  - name: mc",
             f"    dataset: {{path: {json.dumps(str(dataset))}}}",
             '    prompt: {user: "{{ question }} {{ options_block }}"}', "    choices: {gold: gold}",
             "    parse: letter", stage]
    path = tmp_path / "job.yaml"
    path.write_text("\n".join(line for line in lines if line) + "\n", encoding="utf-8")
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(JobFileError) as info:
        load_job(path)
    return [line for line in str(info.value).splitlines() if line.startswith(str(path))]


def test_the_tiers_each_model_is_sold_at_are_taken(tmp_path: Path) -> None:
    job = load_job(job_file(
        tmp_path, "fallback: standard",
        '    tier: {"openai:gpt-5-mini": flex, "gemini:gemini-2.5-flash": priority, "groq:llama-3.1-8b-instant": '
        'flex, "sim:gpt-sim": priority}',
        models="[openai:gpt-5-mini, gemini:gemini-2.5-flash, groq:llama-3.1-8b-instant, sim:gpt-sim, "
               "anthropic:claude-haiku-4-5]"))
    stage = job.stages[0]
    assert [job.stage_tier(stage, m) for m in job.stage_models(stage)] == ["flex", "priority", "flex", "priority",
                                                                           None]
    assert job.stage_fallback(stage) == "standard"


def test_a_stage_tier_wins_over_the_jobs_for_the_models_it_names(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, "tier: priority", '    tier: {"openai:gpt-5-mini": flex}',
                            models="[openai:gpt-5-mini, openai:gpt-4o]"))
    stage = job.stages[0]
    assert (job.stage_tier(stage, "openai:gpt-5-mini"), job.stage_tier(stage, "openai:gpt-4o")) == ("flex",
                                                                                                     "priority")


def test_a_tier_is_not_in_the_cache_key(tmp_path: Path) -> None:
    plain = StagePlan(load_job(job_file(tmp_path)), load_job(job_file(tmp_path)).stages[0])
    keys = [task.key for task in plain]
    job = load_job(job_file(tmp_path, stage="    tier: flex"))
    assert [task.key for task in StagePlan(job, job.stages[0])] == keys


def test_a_tier_the_model_is_not_sold_at_is_one_sentence_at_its_line(tmp_path: Path) -> None:
    path = job_file(tmp_path, stage="    tier: flex", models="[openai:gpt-4o, anthropic:claude-haiku-4-5]")
    found = problems(path)
    assert found == [
        f"{path}:10: stages[0].tier: openai:gpt-4o is not sold at the flex tier (per the OpenAI pricing page): "
        "choose priority, or remove tier: (or set it to standard) for this model",
        f"{path}:10: stages[0].tier: anthropic:claude-haiku-4-5 is not sold at the flex tier: remove tier: (or set "
        "it to standard) for this model"]


def test_an_azure_api_version_before_the_tiers_is_refused(tmp_path: Path) -> None:
    head = ('providers: {azure-openai: {endpoint: "https://r.openai.azure.com", api_version: "2024-10-21", '
            "deployments: {evals: gpt-5.6-sol}}}")
    found = problems(job_file(tmp_path, head, "    tier: flex", models="[azure-openai:evals]"))
    # (the reasoning model is refused at that version too, at the stage)
    assert [line.split(": ", 1)[1] for line in found if ".tier: " in line] == [
        "stages[0].tier: azure-openai:evals takes service tiers from Azure OpenAI API version 2025-12-01 on, not "
        "2024-10-21: set providers: azure-openai: api_version: (or OPENAI_API_VERSION) to 2025-12-01 or later"]
    later = job_file(tmp_path, head.replace("2024-10-21", "2025-12-01"), "    tier: flex",
                     models="[azure-openai:evals]")
    assert load_job(later).stages[0].tier == "flex"


def test_fallback_without_a_flex_request_is_refused(tmp_path: Path) -> None:
    path = job_file(tmp_path, stage="    fallback: standard")
    assert problems(path) == [
        f"{path}:10: stages[0].fallback: fallback: standard is where a flex request the provider sheds is sent; it "
        "needs tier: flex for a model of stage 'mc', which sends none at flex"]
    at_priority = job_file(tmp_path, "fallback: standard", "    tier: priority")
    (found,) = problems(at_priority)
    assert found.startswith(f"{at_priority}:4: fallback: fallback: standard") and "no stage sends" in found


@pytest.mark.parametrize(("mode", "stage", "said"), [
    ("mode: batch", "    tier: flex", "tier: flex is a tier of online requests, and stage 'mc' has mode: batch"),
    ("", '    tier: {"openai:gpt-9": flex}', "tier: names 'openai:gpt-9', which stage 'mc' does not run"),
    ("", "    tier: fast", "'fast' is not a tier: write standard, flex or priority, or one per model"),
    ("", "    fallback: default", "Input should be 'standard'"),
])
def test_each_other_misuse_is_one_sentence(tmp_path: Path, mode: str, stage: str, said: str) -> None:
    found = problems(job_file(tmp_path, stage=stage, mode=mode))
    assert len(found) == 1 and said in found[0], found


def test_validate_says_it_in_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = job_file(tmp_path, stage="    tier: priority", models="[gemini:gemini-2.0-flash]")
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2
    assert only_error(err) == (f"Error: {path}:10: stages[0].tier: gemini:gemini-2.0-flash is not sold at the "
                               "priority tier (per the Gemini inference tiers): remove tier: (or set it to standard) "
                               "for this model")

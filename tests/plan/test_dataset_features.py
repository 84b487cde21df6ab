"""Dataset features the papers' jobs need: rows exploded from a list field (MC-Test's questions), a job-wide
item limit, options shared by every row from a file (Bank-77's intents), gold answers given as option text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.errors import RunnerError
from runner.plan.stage import StagePlan
from runner.spec.job import load_job

STORIES = [
    {"id": "s1", "story": "Tom plays.", "question_list": [
        {"question": "Who plays?", "options": ["Tom", "Ann", "Bob", "Eve"], "gold_option": "Tom"},
        {"question": "What?", "options": ["sing", "play", "run", "cook"], "gold_option": "play"},
    ]},
    {"id": "s2", "story": "Ann sings.", "question_list": [
        {"question": "Who sings?", "options": ["Tom", "Ann", "Bob", "Eve"], "gold_option": "Ann"},
    ]},
]


def job_file(tmp_path: Path, stage: str, top: str = "") -> Path:
    (tmp_path / "stories.jsonl").write_text("".join(json.dumps(s) + "\n" for s in STORIES), encoding="utf-8")
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\nmodels: [sim:m]\n{top}stages:\n{stage}", encoding="utf-8")
    return path


MCTEST_STAGE = """\
  - name: mc
    dataset: {path: stories.jsonl, id: id, explode: question_list}
    prompt: {user: "{{ story }} {{ question }}\\n{{ options_block }}"}
    choices: {field: options, gold: gold_option, seeds: [0]}
    parse: letter
"""


def test_explode_makes_one_item_per_list_element_with_the_parent_fields(tmp_path):
    plan = StagePlan(job := load_job(job_file(tmp_path, MCTEST_STAGE)), job.stages[0])
    requests = list(plan)
    assert [r.row_id for r in requests] == ["s1.1", "s1.2", "s2.1"]
    assert plan.total() == 3
    first = requests[0]
    assert "Tom plays. Who plays?" in first.messages[0]["content"]
    # the gold was given as text: it becomes the option's original index
    assert [r.gold for r in requests] == [0, 1, 1]
    assert first.options is not None and first.perm is not None
    assert first.options[first.perm.index(first.gold)] == "Tom"


def test_a_job_limit_caps_every_stage_and_counts_exploded_items(tmp_path):
    job = load_job(job_file(tmp_path, MCTEST_STAGE, top="limit: 2\n"))
    plan = StagePlan(job, job.stages[0])
    assert [r.row_id for r in plan] == ["s1.1", "s1.2"] and plan.total() == 2
    job.stages[0].dataset.limit = 1  # the smaller of the job's and the stage's limits wins
    assert [r.row_id for r in StagePlan(job, job.stages[0])] == ["s1.1"]


def test_options_from_a_file_are_shared_by_every_row(tmp_path):
    (tmp_path / "labels.json").write_text(json.dumps(["card_lost", "top_up", "refund"]), encoding="utf-8")
    (tmp_path / "utterances.jsonl").write_text(
        json.dumps({"text": "I lost my card", "label_text": "card_lost"}) + "\n"
        + json.dumps({"text": "Money back?", "label_text": "refund"}) + "\n", encoding="utf-8")
    stage = """\
  - name: intents
    dataset: {path: utterances.jsonl}
    prompt: {user: "{{ text }}\\n{{ options_block }}"}
    choices: {options_file: labels.json, gold: label_text, seeds: [0, 1]}
    parse: letter
"""
    job = load_job(job_file(tmp_path, stage))
    requests = list(StagePlan(job, job.stages[0]))
    assert len(requests) == 4
    assert {tuple(sorted(r.options or [])) for r in requests} == {("card_lost", "refund", "top_up")}
    assert [r.gold for r in requests] == [0, 0, 2, 2]


def test_a_gold_text_that_is_no_option_is_one_sentence(tmp_path):
    bad = [dict(STORIES[0], question_list=[dict(STORIES[0]["question_list"][0], gold_option="Zed")])]
    path = job_file(tmp_path, MCTEST_STAGE)
    (tmp_path / "stories.jsonl").write_text(json.dumps(bad[0]) + "\n", encoding="utf-8")
    job = load_job(path)
    with pytest.raises(RunnerError, match=r"stories.jsonl:1: the gold answer 'Zed' is not one of the options"):
        list(StagePlan(job, job.stages[0]))


def test_a_missing_options_file_names_the_key(tmp_path):
    from runner.errors import JobFileError

    stage = MCTEST_STAGE.replace("choices: {field: options,", "choices: {options_file: nope.json,")
    with pytest.raises(JobFileError, match=r"stages\[0\]\.choices\.options_file: options file 'nope.json' does not"):
        load_job(job_file(tmp_path, stage))

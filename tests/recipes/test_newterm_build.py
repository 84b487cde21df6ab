"""Acceptance tests of the NewTerm construction job (jobs/newterm-build.yaml) on the simulated server.

The five terms of tests/data/newterm_build/terms.jsonl go through the whole job. What each stage's "model" answers
is decided by tests/data/newterm_build/script.yaml (strict: an unscripted request is an error), which also holds
one case for each filter rule, so the funnel the store records shows every rule removing something. The built
COMA / COST / CSJ files must follow the released benchmark's schema and be readable by the evaluation job, and
editing one task's prompt must re-run only that task's stages. Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from runner.engine.run import Outcome, execute
from runner.plan.similarity import LexicalSimilarity
from runner.providers.base import ProviderSettings
from runner.spec.job import Job, load_job
from runner.store import Store, open_store
from simserver import SimServer, start_server
from simserver.config import SimConfig

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "newterm_build"
SCRIPT = DATA / "script.yaml"
TERMS = DATA / "terms.jsonl"
RELEASED = REPO / "data" / "newterm" / "benchmark_2023"
MODEL = "sim:gpt-sim"

#: the terms the script lets through; edimental has too few related terms and stops there
BUILT_TERMS = ["boilover", "inchstone", "shift shock", "vibecession"]

#: (stage, funnel rule): each must remove at least one scripted case, in the stage's ``dropped`` (rows) or
#: ``rejected`` (pieces of an answer) counts
RULES = [
    # newterm.related_lines, all in boilover's partial-synonym answer
    ("partial", "more than 5 words"),
    ("partial", "contains ':'"),
    ("partial", "contains '.'"),
    ("partial", "says none or n/a"),
    ("partial", "is the term itself"),
    ("partial", "repeated"),
    # the engine's content retries: asked again, still unusable
    ("antonyms", "fewer than 1 valid items after 2 rounds"),
    ("coma_gen", "fewer than 2 valid items after 3 rounds"),
    ("csj_filter", "answer unreadable after 2 rounds"),
    # newterm.related_terms
    ("related", "fewer than 5 distinct related terms"),
    # newterm.coma_paragraphs
    ("coma_gen", "no connector"),
    ("coma_gen", "wrong connector"),
    ("coma_gen", "empty sentence"),
    ("coma_gen", "term missing from sentence 1"),
    # the job's COMA distractor filter
    ("coma_distinct", "distractor contains its related term"),
    # newterm.filter_choices
    ("coma_kept", "filter did not choose the correct answer"),
    ("coma_kept", "fewer than 4 options left"),
    ("cost_kept", "fewer than 4 options left"),
    ("cost_kept", "the term was judged plausible"),
    # newterm.term_sentences
    ("cost_gen", "does not contain the term"),
    ("cost_gen", "fewer than 4 words"),
    ("cost_related_gen", "does not contain the term"),
    # newterm.cost_items. Not "sentence lacks its answer": the job cannot reach it, since every sentence passed
    # newterm.term_sentences, which already drops one without its answer term ("does not contain the term")
    ("cost_items", "answer appears more than once"),
    # newterm.wrong_sentences
    ("csj_wrong_gen", "no wrong meaning"),
    ("csj_wrong_gen", "does not contain the term"),
    ("csj_wrong_gen", "no 'Wrong Sentence:' lines"),
    # the job's CSJ rating filter
    ("csj_kept", "rating disagrees with the label (true < 8, false > 3)"),
]

#: the released files' fields, in order
SCHEMA = {
    "COMA": ["term", "meaning", "type", "question", "split", "choices", "gold"],
    "COST": ["term", "meaning", "type", "question", "choices", "gold"],
    "CSJ": ["term", "meaning", "type", "question", "gold"],
}

pytestmark = pytest.mark.asyncio(loop_scope="module")


# -- helpers -------------------------------------------------------------------------------------------------


def build_job(job_file: Path, server: SimServer, out: Path) -> Job:
    """The construction job on the test terms, its one model the simulated server, everything written under
    ``out``. The lexical similarity is chosen explicitly, so the result does not depend on installed extras."""
    job = load_job(job_file, {"model": MODEL, "terms": str(TERMS), "out": str(out / "benchmark")})
    job.providers = {"sim": ProviderSettings(base_url=server.url)}
    job.output_dir = str(out / "results")
    job.embeddings = "lexical"
    return job


def funnel(store: Store, run_id: str) -> dict[str, dict[str, Any]]:
    """Each stage's funnel of a run, by stage name."""
    return {stage["stage"]: stage for stage in store.run_stages(run_id)}


def removed(stage: dict[str, Any], rule: str) -> int:
    """How many rows (dropped) and answer pieces (rejected) a stage removed under ``rule``."""
    return (stage.get("dropped") or {}).get(rule, 0) + (stage.get("rejected") or {}).get(rule, 0)


def stage_rows(job: Job, run_id: str, stage: str) -> list[dict[str, Any]]:
    """A stage's output rows as the run wrote them (``<output_dir>/<job>/<run>/rows/<stage>.jsonl``)."""
    path = Path(job.output_dir) / job.name / run_id / "rows" / f"{stage}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def load_items(path: Path, task: str) -> list[dict[str, Any]]:
    """A COMA, COST or CSJ file's rows, each checked against the released schema (our files and the
    released ``*_clean.jsonl`` alike)."""
    items = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for n, item in enumerate(items, start=1):
        where = f"{path.name}:{n}"
        assert sorted(item) == sorted(SCHEMA[task]), f"{where}: fields {sorted(item)}"
        for field in ("term", "meaning", "type", "question"):
            assert isinstance(item[field], str) and item[field].strip(), f"{where}: {field} {item[field]!r}"
        if task == "CSJ":
            assert isinstance(item["gold"], bool), f"{where}: gold {item['gold']!r}"
            continue
        choices, gold = item["choices"], item["gold"]
        assert isinstance(choices, list) and len(choices) == 4, f"{where}: choices {choices!r}"
        assert all(isinstance(choice, str) and choice.strip() for choice in choices), f"{where}: {choices!r}"
        assert type(gold) is int and 0 <= gold < 4, f"{where}: gold {gold!r}"
        if task == "COMA":
            assert item["split"] in ("cause", "effect"), f"{where}: split {item['split']!r}"
        else:
            assert "_" in item["question"], f"{where}: no blank in {item['question']!r}"
            assert item["term"].lower() in (choice.lower() for choice in choices), f"{where}: term not a choice"
    return items


@dataclass
class Built:
    """One run of the construction job, shared by the tests that only read what it made."""

    job: Job
    store: Store
    outcome: Outcome
    stats: dict[str, Any]
    out: Path

    @property
    def funnel(self) -> dict[str, dict[str, Any]]:
        return funnel(self.store, self.outcome.run_id)

    def rows(self, stage: str) -> list[dict[str, Any]]:
        return stage_rows(self.job, self.outcome.run_id, stage)

    def items(self, task: str) -> list[dict[str, Any]]:
        return load_items(self.out / "benchmark" / f"{task}.jsonl", task)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def built(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Built]:
    out = tmp_path_factory.mktemp("newterm-build")
    async with await start_server(SimConfig(script=str(SCRIPT))) as server:
        job = build_job(REPO / "jobs" / "newterm-build.yaml", server, out)
        store = open_store(out / "cache.sqlite")
        outcome = await execute(job, store)
        yield Built(job, store, outcome, server.stats(), out)
    store.close()


# -- 1. the job builds items for every task ---------------------------------------------------------------------


async def test_the_job_builds_items_for_all_three_tasks(built: Built) -> None:
    assert built.outcome.status == "completed", built.outcome.message
    # strict script: a request no entry answers would be a 400, and a row lost to it "request failed"
    assert built.stats["unmatched"] == 0
    failed = {name: stage["dropped"]["request failed"] for name, stage in built.funnel.items()
              if (stage.get("dropped") or {}).get("request failed")}
    assert failed == {}
    made = {task: sorted(item["term"] for item in built.items(task)) for task in SCHEMA}
    assert made == {"COMA": BUILT_TERMS, "COST": BUILT_TERMS, "CSJ": BUILT_TERMS}


# -- 2. every filter rule removes a scripted case -----------------------------------------------------------------


async def test_every_filter_rule_removes_a_scripted_case(built: Built) -> None:
    stages = built.funnel
    missing = [f"{stage}: {rule}" for stage, rule in RULES if removed(stages.get(stage, {}), rule) < 1]
    assert missing == []


async def test_a_content_retry_recovers_an_unusable_first_answer(built: Built) -> None:
    """vibecession's first answer is unusable in four stages; the second round's is kept. (coma_gen goes on to a
    third round for the terms whose cause paragraphs never come.)"""
    rounds = {name: stage.get("rounds") for name, stage in built.funnel.items()}
    assert (rounds["guesses"], rounds["csj_wrong_gen"], rounds["csj_filter"]) == (2, 2, 2)
    guesses = {row["term"]: row["guesses"] for row in built.rows("guesses")}
    assert guesses["vibecession"] == ["vibe slump"]
    wrong = [row["question"] for row in built.rows("csj_false_rows") if row["term"] == "vibecession"]
    assert wrong == ["The vibecession made everyone feel rich and carefree about the economy.",
                     "The vibecession was planted in spring and harvested in autumn."]
    ratings = {row["question"]: row["rating"] for row in built.rows("csj_filter")}
    assert ratings["The vibecession deepened as talk of the vibecession spread online."] == 9
    assert rounds["coma_gen"] == 3
    questions = [row["question"] for row in built.rows("coma_questions")
                 if (row["term"], row["split"]) == ("vibecession", "effect")]
    assert questions == ["The vibecession kept shoppers at home all winter.",
                         "The vibecession kept diners out of restaurants."]


async def test_related_terms_are_deduplicated_to_five(built: Built) -> None:
    """boilover has six candidates: the one most similar to an earlier one ("sudden upset") goes."""
    related = {row["term"]: row["related"] for row in built.rows("related")}
    assert related["boilover"] == ["upset", "surprise", "giant killing", "sure thing", "boil over"]
    assert "edimental" not in related


async def test_the_filter_cuts_more_than_four_options_to_the_least_similar_four(built: Built) -> None:
    """A question whose filter chose only the correct answer keeps 4 options of its 6 (or 5): the correct one
    and the wrong ones least similar to it."""
    for task, before, after in (("cost", "cost_items", "cost_kept"), ("coma", "coma_choices", "coma_kept")):
        offered = {(row["term"], row["question"]): row["options"] for row in built.rows(before)}
        cut = [(offered[row["term"], row["question"]], row) for row in built.rows(after)
               if row["dropped_as_plausible"] == 0]
        assert cut, task
        for options, row in cut:
            assert len(options) > 4 and len(row["choices"]) == 4, (task, row["term"])
            assert set(row["choices"]) < set(options)
            gold = row["choices"][row["gold"]]
            closeness = dict(zip(options, LexicalSimilarity().matrix([gold], options)[0], strict=True))
            cut_out = [option for option in options if option not in row["choices"]]
            kept = [choice for choice in row["choices"] if choice not in (gold, row["term"])]  # COST keeps the term
            assert min(closeness[option] for option in cut_out) >= max(closeness[choice] for choice in kept)
        assert any(len(options) == 6 for options, _ in cut), task


# -- 2b. sampling, counts and wording as the released code has them ------------------------------------------------
# Facts from the released construction code, hexuandeng/NewTerm at commit 1acc3f0bc38ba9524b8a4cb38df83386bb5a75d9
# (newterm/3_COMA_generation.py, 3_COST_generation.py, 3_CSJ_generation.py; config.json "instance_per_word": 1):
#   every generation call: MultiChat(config, ..., temperature=0.8, presence_penalty=0.8); every filter call:
#       MultiChat(config, ..., temperature=0)
#   MAXIMUM = config["instance_per_word"] * 2; prompts ask for MAXIMUM + 1; retry_func asks again while fewer than
#       MAXIMUM valid lines ("if len(clean) >= MAXIMUM: return False, None"); COMA keeps
#       filter_sim(list(set(clean)), MAXIMUM, model) paragraphs; the COST filter makes a question of every line:
#       question = [re.sub(r"^\d+(\.\d*)*", "", i).strip() for i in line['response'].split('\n')]
#   COST's second half: phrases = filter_sim(line["phrases"].copy(), MAXIMUM, model), one sentence each, naming
#       the others: phs = filter_sim(line["phrases"].copy(), 5, model, skip_sent=[newterm]); phs.remove(newterm);
#       'not applicable if "{phs[0]}", "{phs[1]}", "{phs[2]}", or "{phs[3]}" is used instead.'
#   the COST filter: 'Replace the _ in the above sentence with the correct option:' (the question's blank is "_")
#   the COMA, COST and CSJ sentence prompts name five related terms: '... or "{line["phrases"][4]}" is used instead.'
CODE_GENERATION = {"temperature": 0.8, "presence_penalty": 0.8}
CODE_MAXIMUM = 1 * 2
GENERATION_STAGES = ["coma_gen", "coma_distractors", "cost_gen", "cost_related_gen", "csj_gen", "csj_wrong_gen"]
FILTER_STAGES = ["coma_filter", "cost_filter", "csj_filter"]


def sent(built: Built, stage: str) -> list[dict[str, Any]]:
    """The canonical requests a stage of the run sent (messages and parameters as keyed and sent)."""
    keys = {task["key"] for task in built.store.tasks(built.outcome.run_id, stage=stage)}
    requests = [json.loads(r["request_json"]) for r in built.store.responses() if r["key"] in keys]
    assert len(requests) == len(keys) > 0, stage
    return requests


def text_of(request: dict[str, Any]) -> str:
    return "\n".join(message["content"] for message in request["messages"])


async def test_generation_samples_as_the_released_code(built: Built) -> None:
    for stage in GENERATION_STAGES:
        for request in sent(built, stage):
            assert {k: request["params"].get(k) for k in CODE_GENERATION} == CODE_GENERATION, stage
    for stage in FILTER_STAGES:
        for request in sent(built, stage):
            assert request["params"]["temperature"] == 0 and "presence_penalty" not in request["params"], stage
    # a model without a presence penalty is sent none, as the code deletes it for Claude, and the job says so
    job = load_job(REPO / "jobs" / "newterm-build.yaml", {"model": "anthropic:claude-3-5-haiku-20241022"})
    for stage in (s for s in job.stages if s.name in GENERATION_STAGES):
        assert job.model_params(stage, "anthropic:claude-3-5-haiku-20241022")["temperature"] == 0.8
        assert "presence_penalty" not in job.model_params(stage, "anthropic:claude-3-5-haiku-20241022")
        assert job.sent_with["dropped"][stage.name] == {
            "anthropic:claude-3-5-haiku-20241022": ["presence_penalty (takes no presence_penalty)"]}


async def test_counts_follow_the_released_code(built: Built) -> None:
    stages = {stage.name: stage for stage in built.job.stages}
    # 3 asked (MAXIMUM + 1), asked again below MAXIMUM, COMA keeping MAXIMUM, COST and CSJ every valid one
    assert {row["n"] for row in built.rows("prepared")} == {CODE_MAXIMUM + 1}
    assert [(stages[name].min_items, stages[name].max_items) for name in ("coma_gen", "cost_gen", "csj_gen")] == \
        [(CODE_MAXIMUM, CODE_MAXIMUM), (CODE_MAXIMUM, None), (CODE_MAXIMUM, None)]
    paragraphs = [len(row["paragraphs"]) for row in built.rows("coma_gen")]
    assert paragraphs and set(paragraphs) == {CODE_MAXIMUM}  # boilover's effect answer had 2 valid of 6 lines
    boilover = [row["sentence"] for row in built.rows("cost_term_rows") if row["term"] == "boilover"]
    assert boilover == ["The derby ended in a boilover when the outsider beat the champion.",
                        "Punters lost a fortune on the night of the boilover at Flemington."]
    # COST's second half: the 2 most distinct related terms, one sentence each
    answers = {row["term"]: row["cost_answers"] for row in built.rows("cost_answers")}
    assert all(len(terms) == CODE_MAXIMUM for terms in answers.values()) and len(answers) == len(BUILT_TERMS)
    asks = sorted((row["term"], row["answer_term"]) for row in built.rows("cost_related_asks"))
    assert asks == sorted((term, answer) for term, terms in answers.items() for answer in terms)


async def test_the_cost_related_prompt_names_the_other_related_terms_not_the_new_term(built: Built) -> None:
    for row in built.rows("cost_related_others"):
        assert row["others"] == [term for term in row["related"] if term != row["answer_term"]]
        assert len(row["others"]) == 4 and row["term"] not in row["others"]
    for request in sent(built, "cost_related_gen"):
        user = request["messages"][-1]["content"]
        named = user.split("not applicable if ", 1)[1]
        term = next(row["term"] for row in built.rows("cost_related_others") if f"“{row['answer_term']}”" in user)
        assert f"“{term}”" not in named, user
        assert named.count("“") == 4


async def test_the_sentence_prompts_name_all_five_related_terms(built: Built) -> None:
    related = {row["term"]: row["related"] for row in built.rows("related")}
    for stage in ("coma_gen", "cost_gen", "csj_gen"):
        for request in sent(built, stage):
            text = text_of(request)
            term = next(t for t in related if f"“{t}”" in text)
            named = text.split("not applicable if ", 1)[1]
            assert all(f"“{r}”" in named for r in related[term]) and named.count("“") == 5, (stage, text)


async def test_the_cost_filter_names_the_blank_the_question_has(built: Built) -> None:
    for request in sent(built, "cost_filter"):
        user = request["messages"][-1]["content"]
        assert "Replace the _ in the above sentence" in user and "__" not in user
        question = user.split("exercise:\n", 1)[1].split(" Replace the _", 1)[0]
        assert question.count("_") == 1, question


# -- 3. the released schema ---------------------------------------------------------------------------------------


async def test_output_follows_the_released_schema(built: Built) -> None:
    released = {task: len(load_items(RELEASED / f"{task}_clean.jsonl", task)) for task in SCHEMA}
    assert released == {"COMA": 228, "COST": 236, "CSJ": 251}
    ours = {task: len(built.items(task)) for task in SCHEMA}
    assert all(ours.values()), ours


# -- 4. editing one task's prompt re-runs only that task ---------------------------------------------------------


async def test_editing_the_cost_prompt_reruns_only_cost_stages(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(REPO / "prompts", tmp_path / "prompts")
    (tmp_path / "jobs").mkdir()
    job_file = shutil.copy(REPO / "jobs" / "newterm-build.yaml", tmp_path / "jobs")
    monkeypatch.chdir(tmp_path)  # prompts/ of the working directory come first
    store = open_store(tmp_path / "cache.sqlite")
    async with await start_server(SimConfig(script=str(SCRIPT))) as server:
        first = await execute(build_job(Path(job_file), server, tmp_path / "out"), store)
        assert first.status == "completed", first.message
        prompt = tmp_path / "prompts" / "newterm" / "construct" / "cost-sentences.yaml"
        text = prompt.read_text(encoding="utf-8")
        assert "I have created a new term" in text
        prompt.write_text(text.replace("I have created a new term", "I have coined a new term"), encoding="utf-8")
        # the same process runs the job again: runner.plan.prompts must see the edited file (its cache is keyed by
        # the file's modification time)
        server.reset()
        second = await execute(build_job(Path(job_file), server, tmp_path / "out"), store)
        received = server.stats()
    assert second.status == "completed", second.message

    stages = funnel(store, second.run_id)
    assert stages["cost_gen"]["reused"] is False and stages["cost_gen"]["sent"] > 0
    # the new prompt's sentence reached the COST file
    cost = {item["term"]: item["question"] for item in load_items(tmp_path / "out" / "benchmark" / "COST.jsonl",
                                                                   "COST")}
    assert cost["boilover"] == "The _ at Flemington left every tipster red-faced."
    rerun = sorted(name for name, stage in stages.items() if not name.startswith("cost") and not stage["reused"])
    assert rerun == []
    assert sum(stage.get("sent", 0) for name, stage in stages.items() if not name.startswith("cost")) == 0
    # the server saw exactly the requests the store counts as sent, all of them COST stages'
    fresh = [task["stage"] for task in store.tasks(second.run_id, cache_hit=0)]
    assert fresh and all(stage.startswith("cost") for stage in fresh), sorted(set(fresh))
    assert received["received"] == sum(received["completed_by_digest"].values()) == len(fresh)
    assert received["received"] == sum(stage.get("sent", 0) for stage in stages.values())


# -- 5. the evaluation job reads what was built ------------------------------------------------------------------


async def test_the_eval_job_evaluates_the_built_benchmark(built: Built, tmp_path: Path) -> None:
    job = load_job(REPO / "jobs" / "newterm-eval-2023.yaml", {"benchmark": str(built.out / "benchmark"), "suffix": ""})
    async with await start_server() as server:  # no script: the simulator's own answers
        job.models = [MODEL]
        job.providers = {"sim": ProviderSettings(base_url=server.url)}
        job.output_dir = str(tmp_path / "results")
        store = open_store(tmp_path / "eval.sqlite")
        outcome = await execute(job, store)
    assert outcome.status == "completed", outcome.message
    # 3 templates x 2 settings per item, and 3 option shuffles for the multiple-choice tasks
    per_item = {"coma": 18, "cost": 18, "csj": 6}
    requests = {stage: sum(1 for _ in store.iter_results(outcome.run_id, stage)) for stage in per_item}
    items = {stage: len(built.items(stage.upper())) for stage in per_item}
    assert requests == {stage: items[stage] * per_item[stage] for stage in per_item}
    assert all(requests.values()), requests

"""Provider prompt caching planned by the runner (``prompt_cache: auto``), through the whole runner and the official
SDKs against the simulated server, which caches as each API documents (simserver/prompt_cache.py): one request of a
prefix group goes first and the rest read what it wrote; Anthropic's breakpoints are where the shared prefix ends
and its cache reads and writes are priced at genai-prices' rates; the memo's keys do not change with the marks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from runner.engine.prompt_cache import WARM_FOR, PromptCachePlan
from runner.engine.run import execute
from runner.plan.stage import StagePlan
from runner.providers.anthropic_messages import cache_blocks
from runner.providers.base import CacheMarks
from runner.providers.pricing import Pricing
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimConfig, SimServer, start_server
from tests.helpers import write_rows

#: an instruction of 5,000 characters: 1,250 tokens by the simulated server's rule (one per four characters)
SHARED = ("Read the question and the options, then answer with the letter of the right option only. " * 60)[:5000]
ROWS = 30


@pytest.fixture
async def server():
    async with await start_server(SimConfig(latency=0.05)) as srv:
        yield srv


def write_job(folder: Path, url: str, *, model: str, prompt_cache: str, providers: dict[str, Any],
              rows: int = ROWS, prices: dict[str, Any] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dataset = write_rows(folder / "rows.jsonl", rows)
    providers = {name: {**settings, "concurrency": 8} for name, settings in providers.items()}
    job = {
        "name": "cachejob", "output_dir": str(folder / "results"), "models": [model], "providers": providers,
        "params": {"temperature": 0, "max_tokens": 5}, "prompt_cache": prompt_cache,
        "retry": {"max_attempts": 3, "backoff_initial": 0.01, "backoff_max": 0.05, "max_elapsed": 30},
        "stages": [{"name": "mc", "dataset": {"path": str(dataset)},
                    "prompt": {"system": SHARED, "user": "{{ question }}\n{{ options_block }}\nAnswer:"},
                    "choices": {"seeds": [0], "gold": "gold"}, "parse": "letter"}],
    }
    if prices:
        job["prices"] = prices
    path = folder / "job.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


async def run(path: Path) -> tuple[Any, Any]:
    store = open_store(path.parent / "s.sqlite")
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed", outcome.message
    return outcome, store


def write_story_job(folder: Path, url: str, prompt_cache: str, *, stories: int = 3, questions: int = 10) -> Path:
    """Questions about long stories (5,000 characters each), a story's questions one after another in the data."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"s{s}q{q}", "story": f"Story {s}. " + (f"The fox number {s} ran away. " * 180)[:5000],
             "question": f"Question {q}: where did it go?"} for s in range(stories) for q in range(questions)]
    (folder / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    job = {"name": "stories", "output_dir": str(folder / "results"), "models": ["sim:gpt-4o"],
           "providers": {"sim": {"base_url": url, "concurrency": 8}}, "params": {"max_tokens": 5},
           "prompt_cache": prompt_cache,
           "stages": [{"name": "qa", "dataset": {"path": str(folder / "rows.jsonl"), "id": "id"},
                       "prompt": {"system": "Answer briefly.", "user": "{{ story }}\n\n{{ question }}"}}]}
    path = folder / "job.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


async def test_each_group_reads_what_its_first_request_wrote_where_sending_at_once_misses(
        tmp_path: Path, server: SimServer):
    await run(write_story_job(tmp_path / "off", server.url, "off"))
    off = server.stats()["prompt_cache"]["hits"]
    server.reset()
    _, store = await run(write_story_job(tmp_path / "auto", server.url, "auto"))
    auto = server.stats()["prompt_cache"]
    assert auto["hits"] == 30 - 3, "all but each story's first question read the story from the cache"
    assert off < auto["hits"], "sent eight at a time, a story's first questions all missed"
    assert all(r["cached_tokens"] >= 1024 for r in store.responses() if r["cached_tokens"])


async def test_anthropic_breakpoints_write_once_read_after_and_are_priced_at_genai_prices_rates(
        tmp_path: Path, server: SimServer, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    model = "anthropic:claude-opus-4-1"
    path = write_job(tmp_path, server.url, model=model, prompt_cache="auto",
                     providers={"anthropic": {"base_url": server.root_url}})
    outcome, store = await run(path)
    rates = Pricing().rates(model)
    assert rates is not None
    # the breakpoint ends the shared "Question number": 3 + (3 + 1,250) + 3 + 4 tokens
    mark = 3 + 3 + 1250 + 3 + 4
    responses = store.responses()
    usages = [json.loads(r["response_json"])["usage"] for r in responses]
    assert sorted((u["cache_creation_input_tokens"], u["cache_read_input_tokens"]) for u in usages) == \
        [(0, mark)] * (ROWS - 1) + [(mark, 0)], "one write, then reads"
    for response, usage in zip(responses, usages, strict=True):
        by_hand = (usage["input_tokens"] * rates.input + usage["cache_read_input_tokens"] * rates.cached_input
                   + usage["cache_creation_input_tokens"] * rates.cache_write
                   + usage["output_tokens"] * rates.output) / 1_000_000
        assert response["cost"] == pytest.approx(by_hand, rel=1e-12)
    assert rates.cached_input == pytest.approx(rates.input / 10), "genai-prices: a read costs a tenth"
    # what the cache saved: each answer's price with all its input uncached, less what it cost (the write's premium
    # makes the first one's negative)
    uncached = sum(((u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]) * rates.input
                    + u["output_tokens"] * rates.output) / 1_000_000 for u in usages)
    saved = uncached - sum(r["cost"] for r in responses)
    assert saved > 0
    data = report.build(store, outcome.run_id)
    assert data["totals"]["cache_saved"] == pytest.approx(saved, rel=1e-9)
    assert data["totals"]["cached_input_tokens"] == (ROWS - 1) * mark
    assert f"by the provider's prompt cache ${saved:.4f}" in report.render(data, "text")
    assert outcome.stats.totals().cached_in == (ROWS - 1) * mark
    assert outcome.stats.totals().cache_saved == pytest.approx(saved, rel=1e-9)


async def test_the_marks_change_what_is_sent_not_the_memo_key(tmp_path: Path, server: SimServer):
    providers = {"sim": {"base_url": server.url}}
    store = open_store(tmp_path / "s.sqlite")
    marked = load_job(write_job(tmp_path, server.url, model="sim:gpt-4o", prompt_cache="auto", providers=providers))
    await execute(marked, store)
    sent = server.stats()["received"]
    plain = load_job(write_job(tmp_path, server.url, model="sim:gpt-4o", prompt_cache="off", providers=providers))
    outcome = await execute(plain, store)
    assert outcome.status == "completed" and server.stats()["received"] == sent, "every answer from the memo"


def test_the_plan_groups_by_the_longest_shared_prefix_with_a_breakpoint_at_each_level(tmp_path: Path):
    """An instruction shared by all, two stories each shared by their questions: a story's questions are one group,
    marked where the story and the word its questions start with end (and, at a story's edge, where it shares less
    with the other story too); a prompt under the minimum is not marked."""
    instruction = "Answer with the letter of the right option. " * 120  # ~5,300 characters
    story = {s: f"Story {s}: " + (f"the {s} fox ran far. " * 300) for s in ("red", "blue")}
    rows = [{"id": f"{s}{q}", "story": story[s], "question": f"Question {q} about it?"}
            for s in ("red", "blue") for q in range(3)]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    job_path = tmp_path / "job.yaml"
    job_path.write_text(json.dumps({
        "name": "stories", "models": ["anthropic:claude-opus-4-1"], "params": {"max_tokens": 5},
        "stages": [{"name": "qa", "dataset": {"path": str(tmp_path / "rows.jsonl"), "id": "id"},
                    "prompt": {"system": instruction, "user": "{{ story }}\n\n{{ question }}"}}]}), encoding="utf-8")
    job = load_job(job_path)
    tasks = list(StagePlan(job, job.stages[0]))

    class Anthropic:
        prompt_cache_style = "explicit"

    plan = PromptCachePlan(job, {"anthropic": Anthropic()})  # type: ignore[dict-item]
    plan.plan(tasks)
    marks = {task.item.split("|")[0]: plan.marks(task) for task in tasks}
    assert all(m is not None for m in marks.values())
    for s in ("red", "blue"):
        groups = {marks[f"{s}{q}"].group for q in range(3)}  # type: ignore[union-attr]
        assert len(groups) == 1, "a story's questions are one group"
        cuts = {marks[f"{s}{q}"].cuts for q in range(3)}  # type: ignore[union-attr]
        # the questions in the middle of a story share the story with both neighbours: one cut; at a story's edge
        # the neighbour of the other story shares less: two cuts, the shorter first
        for cut in cuts:
            # the questions share "Question" after the story's blank line: the cut is at the space after it
            assert cut[-1] == (1, len(story[s]) + len("\n\nQuestion"))
            # at a story's edge, the other story's neighbour shares the instruction and the word "Story"
            assert len(cut) == 1 or cut[0] == (1, len("Story"))
    assert marks["red0"].group != marks["blue0"].group  # type: ignore[union-attr]
    short = PromptCachePlan(job, {"anthropic": Anthropic()})  # type: ignore[dict-item]
    tiny = [t for t in tasks]
    for task in tiny:
        task.call.messages = [{"role": "user", "content": "Short question " + task.item}]
    short.plan(tiny)
    assert all(short.marks(t) is None for t in tiny), "under the model's minimum nothing is marked"


def test_a_documents_questions_are_one_group_whatever_words_they_share(tmp_path: Path):
    document = "The fox ran over the hill and far away into the woods. " * 120
    questions = ["What did it do?", "What did it see?", "Where did it go?", "Who saw it?", "Why did it run?"]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps({"id": str(i), "q": q}) for i, q in
                                                    enumerate(questions)), encoding="utf-8")
    job_path = tmp_path / "job.yaml"
    job_path.write_text(json.dumps({
        "name": "doc", "models": ["openai:gpt-4o"], "params": {"max_tokens": 5},
        "stages": [{"name": "qa", "dataset": {"path": str(tmp_path / "rows.jsonl"), "id": "id"},
                    "prompt": {"user": document + "\n\nQuestion: {{ q }}"}}]}), encoding="utf-8")
    job = load_job(job_path)
    tasks = list(StagePlan(job, job.stages[0]))

    class OpenAI:
        prompt_cache_style = "keyed"

    plan = PromptCachePlan(job, {"openai": OpenAI()})  # type: ignore[dict-item]
    plan.plan(tasks)
    marks = [plan.marks(task) for task in tasks]
    assert len({m.group for m in marks}) == 1, "one group: the words after the document add a few tokens only"
    assert {m.cuts for m in marks} == {((0, len(document) + len("\n\nQuestion:")),)}


async def test_the_gate_holds_a_group_until_its_first_answer_and_lapses_after_the_cache_lifetime():
    marks = CacheMarks("g", ((0, 0),))
    now = [100.0]
    plan = PromptCachePlan.__new__(PromptCachePlan)
    plan.clock = lambda: now[0]
    plan._marks = {}
    plan._groups = {}

    class T:
        def __init__(self, key: str) -> None:
            self.key = key

    first, second, third = T("a"), T("b"), T("c")
    for t in (first, second, third):
        plan._marks[t.key] = marks
    loop = asyncio.get_running_loop()
    answer = loop.create_future()
    assert plan.gate(first, answer) is None, "the first leads"
    assert plan.gate(second, loop.create_future()) is answer, "the next waits for its answer"
    answer.set_result("done")
    assert plan.gate(third, loop.create_future()) is None, "answered: warm"
    now[0] += WARM_FOR + 1
    lead = loop.create_future()
    assert plan.gate(second, lead) is None and plan.gate(third, loop.create_future()) is lead, "cold again"


async def test_groups_gone_cold_are_forgotten_so_memory_stays_flat():
    from runner.engine.prompt_cache import KEPT

    now = [0.0]
    plan = PromptCachePlan.__new__(PromptCachePlan)
    plan.clock = lambda: now[0]
    plan._marks, plan._groups, plan._priced = {}, {}, {}

    class T:
        def __init__(self, key: str) -> None:
            self.key = key

    loop = asyncio.get_running_loop()
    for i in range(KEPT):
        plan._marks[f"k{i}"] = CacheMarks(f"g{i}", ((0, 0),))
        answer = loop.create_future()
        assert plan.gate(T(f"k{i}"), answer) is None
        answer.set_result("done")
        plan.gate(T(f"k{i}"), loop.create_future())  # answered: warm, last used now
        plan.forget(f"k{i}")
    assert len(plan._groups) == KEPT and not plan._marks
    now[0] += WARM_FOR + 1
    plan._marks["new"] = CacheMarks("fresh", ((0, 0),))
    plan.gate(T("new"), loop.create_future())
    assert list(plan._groups) == ["fresh"], "every group gone cold is forgotten"


def test_breakpoints_split_a_message_where_the_shared_prefix_ends_and_keep_its_text():
    messages = [{"role": "system", "content": "instructions"}, {"role": "user", "content": "story\n\nquestion"}]
    marked = cache_blocks(messages, CacheMarks("g", ((1, 0), (1, 7)), ttl="1h"))
    assert marked[0]["content"] == [{"type": "text", "text": "instructions",
                                     "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    assert marked[1]["content"] == [{"type": "text", "text": "story\n\n",
                                     "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                                    {"type": "text", "text": "question"}]
    assert messages[1]["content"] == "story\n\nquestion", "the task's own messages are untouched"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_on_the_wire_a_group_carries_one_key_or_one_breakpoint_and_off_carries_none(
        tmp_path: Path, provider: str, monkeypatch: pytest.MonkeyPatch):
    """What the official SDKs put on the wire, recorded by a capture server that shares none of the simulated
    server's assumptions: OpenAI's requests of one group carry the same ``prompt_cache_key``; Claude's carry a
    ``cache_control`` breakpoint on the block that ends the shared story, its text unchanged; with ``off``, none."""
    from tests.providers.test_request_shaping import ANTHROPIC_ANSWER, OPENAI_ANSWER, Capture

    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    model = {"openai": "openai:gpt-4o", "anthropic": "anthropic:claude-opus-4-1"}[provider]
    answer = OPENAI_ANSWER if provider == "openai" else {**ANTHROPIC_ANSWER, "content": [{"type": "text", "text": "B"}]}
    bodies = {}
    for mode in ("auto", "off"):
        async with Capture(answer) as capture:
            base = capture.url + ("/v1" if provider == "openai" else "")
            path = write_story_job(tmp_path / mode, base, mode, stories=2, questions=3)
            job = json.loads(path.read_text())
            job["models"], job["providers"] = [model], {provider: {"base_url": base}}
            path.write_text(json.dumps(job))
            outcome, _ = await run(path)
            bodies[mode] = [r["body"] for r in capture.requests]
    assert len(bodies["auto"]) == len(bodies["off"]) == 6
    if provider == "openai":
        keys = [b.get("prompt_cache_key") for b in bodies["auto"]]
        assert len(set(keys)) == 2 and all(keys), "one key per story"
        assert all("prompt_cache_key" not in b for b in bodies["off"])
        return
    for body in bodies["auto"]:
        [turn] = body["messages"]
        marked = [block for block in turn["content"] if "cache_control" in block]
        assert len(marked) == 1 and marked[0]["text"].startswith("Story ")
        assert marked[0]["text"].endswith("\n\nQuestion") and marked[0]["cache_control"] == {"type": "ephemeral"}
        assert "".join(block["text"] for block in turn["content"]).startswith(marked[0]["text"])
    assert all(isinstance(b["messages"][0]["content"], str) for b in bodies["off"])


async def test_a_batch_marks_its_groups_for_an_hour_and_answers_as_online(
        tmp_path: Path, server: SimServer, monkeypatch: pytest.MonkeyPatch):
    """Message Batches lines are marked as online requests are, with the one-hour lifetime (a batch runs its lines
    in an order of its own); the strict server takes them, and the answers are the online run's."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    answers = {}
    for mode in ("batch", "online"):
        path = write_story_job(tmp_path / mode, server.url, "auto", stories=2, questions=3)
        job = json.loads(path.read_text())
        job.update(models=["anthropic:claude-opus-4-1"], providers={"anthropic": {"base_url": server.root_url}},
                   mode=mode, batch={"poll_interval": 0.05})
        path.write_text(json.dumps(job))
        outcome, store = await run(path)
        answers[mode] = sorted(r["response_text"] for r in store.responses())
    [batch] = server.batches.batches.values()
    assert len(batch.lines) == 6 and all(line.outcome == "succeeded" for line in batch.lines)
    for line in batch.lines:
        [turn] = line.body["messages"]
        [marked] = [block for block in turn["content"] if "cache_control" in block]
        assert marked["cache_control"] == {"type": "ephemeral", "ttl": "1h"} and marked["text"].startswith("Story ")
    assert answers["batch"] == answers["online"]


@pytest.mark.parametrize("prompt_cache", ["off", "auto"])
async def test_an_unexpected_error_sending_one_request_ends_the_run_resumable_and_nothing_waits_for_it(
        tmp_path: Path, server: SimServer, monkeypatch: pytest.MonkeyPatch, prompt_cache: str):
    """A defect (or an SDK that cannot take a parameter: openai 1.89 has no ``prompt_cache_key``) raised while one
    request is sent: before, its prompt-cache group's other requests waited for it for ever (the run hung), and
    without the cache the run ended "completed" with that task neither answered nor failed."""
    from runner.engine import online

    original, calls = online.Sender._attempt, []

    async def first_fails(self: Any, req: Any, endpoint: Any, tries: Any, *rest: Any) -> Any:
        calls.append(req.key)
        if len(calls) == 1:
            raise TypeError("create() got an unexpected keyword argument 'prompt_cache_key'")
        return await original(self, req, endpoint, tries, *rest)

    monkeypatch.setattr(online.Sender, "_attempt", first_fails)
    path = write_story_job(tmp_path, server.url, prompt_cache, stories=2, questions=3)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await asyncio.wait_for(execute(load_job(path), store), 30)
    assert outcome.status != "completed"
    assert "unexpected TypeError sending a request to sim:gpt-4o: create() got an unexpected keyword" in \
        outcome.message
    assert len(store.tasks(outcome.run_id, status="done")) < 6
    again = await asyncio.wait_for(execute(load_job(path), store, run_id=outcome.run_id), 30)
    assert again.status == "completed" and len(store.tasks(outcome.run_id, status="done")) == 6


def test_a_reservation_prices_at_the_write_price_only_what_the_marks_let_the_provider_write() -> None:
    """Issue 41: every input token was reserved at the one-hour cache-write price, whatever the marks. Checked
    against every usage a request can have (seed printed): at most ``writable`` tokens written, for an hour only
    when asked, the rest read, written or plain; the worst case is never below what the usage costs, and is below
    the old one where fewer tokens are writable or the lifetime is five minutes."""
    import random

    rates = Pricing().rates("anthropic:claude-opus-4-1")
    assert rates is not None and rates.hour_write > rates.cache_write > rates.input > rates.cached_input
    seed = 41
    draw = random.Random(seed)
    for _ in range(2000):
        tokens, out = draw.randint(1, 300_000), draw.randint(0, 4096)
        writable, hour = draw.randint(0, tokens), draw.random() < 0.5
        worst = rates.worst_case(tokens, out, writable, hour)
        written = draw.randint(0, writable)
        read = draw.randint(0, tokens - written)
        usage = (tokens, draw.randint(0, out), read, written, written if hour else 0)
        assert rates.cost(*usage) <= worst + 1e-12, f"seed {seed}: {usage} costs more than {worst}"
        assert worst <= rates.worst_case(tokens, out) + 1e-12, f"seed {seed}"
    assert rates.worst_case(1000, 0, 0, False) == pytest.approx(1000 * rates.input / 1e6)
    assert rates.worst_case(1000, 0, 1000, False) == pytest.approx(1000 * rates.cache_write / 1e6)
    assert rates.worst_case(1000, 0) == rates.worst_case(1000, 0, None, True) == \
        pytest.approx(1000 * rates.hour_write / 1e6)


async def test_a_budget_with_prompt_caching_is_spent_to_within_one_requests_worst_case(
        tmp_path: Path, server: SimServer, monkeypatch: pytest.MonkeyPatch):
    """Issue 41: a Claude budget with prompt caching stopped at 39 % of it, every input token reserved at the
    one-hour write price. Online marks ask for five minutes and only the prefix before the last mark can be
    written: the run stops once what is left is below one request's worst case, at 95 % of the budget or more."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    model = "anthropic:claude-opus-4-1"
    path = write_job(tmp_path, server.url, model=model, prompt_cache="auto", rows=1000,
                     providers={"anthropic": {"base_url": server.root_url}})
    job = json.loads(path.read_text())
    job["budget"] = {"usd": 2.0}
    path.write_text(json.dumps(job), encoding="utf-8")
    store = open_store(path.parent / "s.sqlite")
    outcome = await execute(load_job(path), store)
    spent = sum(r["cost"] for r in store.responses())
    assert outcome.status == "budget_exhausted", outcome.message
    assert 0.95 * 2.0 <= spent <= 2.0, f"${spent:.4f} of $2.00 spent when the budget stopped the run"

"""Budgets hold for providers whose tokenizer is not available here (Anthropic, Gemini, user servers): the input
tokens reserved are a true upper bound (``tokens.bound_call_tokens``, from UTF-8 bytes), never below what the
server counts, whatever the text: repetitive, non-ASCII, empty, several turns, a system prompt."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from runner.engine.run import execute
from runner.providers import tokens
from runner.providers.tokens import bound_call_tokens, bound_input_tokens, bound_text_tokens, count_input_tokens
from runner.spec.job import load_job
from runner.store import Store, open_store
from simserver import SimConfig, start_server
from simserver.answers import count_prompt_tokens

#: providers whose tokenizer is not available locally, and a model of each the simulated server answers
UNAVAILABLE = [("anthropic", "claude-sonnet-4-5"), ("gemini", "gemini-2.0-flash"),
               ("openai-compatible", "any-model"), ("local", "smollm2")]


pytestmark = pytest.mark.usefixtures("provider_keys")


def charged(store: Store, run_id: str) -> float:
    return sum(row["amount"] for row in store.ledger(run_id, kind="charge"))


@pytest.mark.parametrize("model", ["anthropic:claude-sonnet-4-5", "gemini:gemini-2.0-flash"])
@pytest.mark.parametrize("concurrency", [1, 16])
async def test_repetitive_long_prompts_never_overshoot_the_budget(tmp_path: Path, model: str,
                                                                   concurrency: int) -> None:
    # 4,000 repeats of "=" are 111 tokens by the expected count (o200k merges the run) and 1,006 by the simulated
    # server's; before the bound, a $1.00 budget spent several dollars.
    rows = [{"question": f"Item {i}: " + "=" * 4000} for i in range(40)]
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    provider = model.split(":")[0]
    async with await start_server(SimConfig()) as srv:
        job_data: dict[str, Any] = {
            "name": "bound", "output_dir": str(tmp_path / "results"), "models": [model],
            "providers": {provider: {"base_url": srv.root_url, "concurrency": concurrency, "timeout": 10}},
            "drop_unsupported": True,
            "params": {"max_tokens": 20},
            "prices": {model: {"input": 100.0, "output": 100.0}},  # USD per million tokens: ~$0.10 a request
            "budget": {"usd": 1.0},  # the whole job costs about $4
            "retry": {"max_attempts": 2, "backoff_initial": 0.01, "backoff_max": 0.05},
            "stages": [{"name": "ask", "dataset": {"path": str(dataset)}, "prompt": {"user": "{{ question }}"}}],
        }
        path = tmp_path / "job.yaml"
        path.write_text(json.dumps(job_data), encoding="utf-8")
        job = load_job(path)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        spent = charged(store, outcome.run_id)
        responses = list(store.responses())
        store.close()
    assert responses, "nothing was sent"
    assert all(r["input_tokens"] >= 1000 for r in responses)  # the server counted the long prompts
    assert spent <= 1.0 + 1e-9, spent
    assert outcome.status == "budget_exhausted", (outcome.status, outcome.message)
    assert spent > 0.5  # the bound is 4x too high for this text, not so high that nothing is sent


# -- the bound against the simulated server's count -------------------------------------------------------------
_ALPHABETS = [
    "a", "=", " ", "\n", "ab", "abcdefghijklmnopqrstuvwxyz", "0123456789", " \t\n.,;:!?-_=*#",
    "éüßñçøå", "новоеслово", "新しい言葉の意味", "这个新词", "한국어", "नमस्ते", "สวัสดี", "مرحبا",
    "👍😂🔥👨‍👩‍👧‍👦", "\u200b\u200d\ufeff", "ﷺ㍿ﬃ", "∀∃∑∫√∞≈≠", "\x00\x01\x1b\x7f",
]


def random_text(rng: random.Random) -> str:
    """A text of 0 to 6,000 characters: a run of one character, words from one alphabet, or a mix of several."""
    kind = rng.random()
    size = rng.choice([0, 1, 3, 17, 200, 1000, 4000, 6000])
    if kind < 0.3:
        return rng.choice("".join(_ALPHABETS)) * size
    alphabet = rng.choice(_ALPHABETS) if kind < 0.7 else "".join(rng.sample(_ALPHABETS, 4))
    return "".join(rng.choices(alphabet, k=size))


def random_messages(rng: random.Random) -> list[dict[str, str]]:
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": random_text(rng)})
    for turn in range(rng.randint(0, 5)):
        messages.append({"role": "user" if turn % 2 == 0 else "assistant", "content": random_text(rng)})
    return messages


def test_the_bound_is_at_least_the_simulated_servers_count_for_random_requests() -> None:
    rng = random.Random(20261124)
    ratios = []
    for _ in range(2000):
        messages = random_messages(rng)
        served = count_prompt_tokens(messages)
        for provider, model in UNAVAILABLE:
            expected = count_input_tokens(provider, model, messages)
            # (the expected count handed over, as the engine hands it: counting it again would double the time)
            bound = bound_call_tokens(provider, model, messages, counted=expected)
            assert bound >= served, (provider, messages)
            assert bound >= expected  # never below the expected count
        ratios.append(bound_input_tokens(messages) / served)
    assert min(ratios) >= 1


@pytest.mark.parametrize("messages", [
    [],
    [{"role": "user", "content": ""}],
    [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
    [{"role": "user", "content": "=" * 4000}],
    [{"role": "user", "content": " " * 4000}],
    [{"role": "system", "content": "Answer with one letter."}, {"role": "user", "content": "A. x\nB. y"},
     {"role": "assistant", "content": "A"}, {"role": "user", "content": "Sure?"}],
    [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, {"role": "user", "content": "c"}],
    [{"role": "user", "content": "新しい言葉の意味を説明してください。" * 100}],
    [{"role": "user", "content": [{"type": "text", "text": "=" * 3000}, {"type": "text", "text": "😂" * 500}]}],
], ids=["none", "empty", "empty-system", "run", "spaces", "turns", "two-systems", "cjk", "parts"])
@pytest.mark.parametrize("provider,model", UNAVAILABLE)
def test_every_message_shape_the_runner_sends_is_bounded(messages: list[dict[str, Any]], provider: str,
                                                         model: str) -> None:
    assert bound_call_tokens(provider, model, messages) >= count_prompt_tokens(messages)


def test_the_bound_is_bytes_plus_framing() -> None:
    assert bound_text_tokens("") == 0
    assert bound_text_tokens("=" * 4000) == 4000
    assert bound_text_tokens("新しい") == 9  # three characters of three UTF-8 bytes each
    assert bound_text_tokens("👍") == 4
    # NFKC lengthens some characters: the longer form counts
    assert bound_text_tokens("\ufdfa") == len(unicodedata.normalize("NFKC", "\ufdfa").encode()) == 33
    one = [{"role": "user", "content": "hi"}]
    assert bound_input_tokens(one) == tokens.BOUND_PER_REQUEST + tokens.BOUND_PER_MESSAGE + len("user") + 2
    named = [{"role": "user", "name": "ann", "content": "hi"}]
    assert bound_input_tokens(named) == bound_input_tokens(one) + tokens.BOUND_PER_MESSAGE + 3
    # log-likelihood pairs: bytes of both texts and framing, for the server's unknown tokenizer
    assert bound_call_tokens("local", "smollm2", [], [("=" * 100, "=" * 10)]) >= 110


def test_exact_counts_are_reserved_as_they_are() -> None:
    messages = [{"role": "user", "content": "=" * 4000}]
    assert bound_call_tokens("openai", "gpt-4o", messages) == count_input_tokens("openai", "gpt-4o", messages)
    assert bound_call_tokens("sim", "priced", messages) == count_prompt_tokens(messages) == 1006
    # an OpenAI model tiktoken does not know: counted with o200k_base, but reserved at the bound
    assert bound_call_tokens("openai", "gpt-99-preview", messages) == bound_input_tokens(messages)
    assert bound_call_tokens("anthropic", "claude-sonnet-4-5", messages) == bound_input_tokens(messages) == 4084
    assert count_input_tokens("anthropic", "claude-sonnet-4-5", messages) == 111  # the expected count

"""The prefix analysis (runner/plan/prefixes.py): what each request of a stage would read from and write to its
provider's prompt cache. Token counts are checked against counts written out here: the simulated server's
published rule (one token per four characters, 3 per message and per request), or a word counter."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from runner.plan.prefixes import cache_rule, cacheable, prefix_use, prompt_text

SYSTEM = "Answer with 1 or 2 only."
#: five solved WinoDict-like examples, the same in every 5-shot prompt (ends with a line break)
SHOTS = "".join(
    f"Example {k}: The word 'florp' means to carry something heavy with great care, as movers do with pianos. "
    f"Sentence: The movers florped the piano up the stairs while the dog watched them from the landing. "
    f"Who florped? Option 1: the movers. Option 2: the dog. Answer: 1\n" * 5 for k in range(1, 6))
QUESTIONS = [f"Q{k}: The girl florped her sister's cello to the car because it was fragile. What was fragile? "
             for k in range(1, 9)]


def five_shot(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": SHOTS + question}]


def sim_tokens(text: str) -> int:
    """The simulated server's rule for a text (simserver: one token per four characters, rounded up)."""
    return (len(text) + 3) // 4


def words(model: str, messages: Sequence[Mapping[str, Any]]) -> int:
    """A counter written here: one token per word, one per message."""
    return sum(1 + len(str(m["content"]).split()) for m in messages)


def test_five_shot_prompts_read_the_shared_examples_written_by_the_first() -> None:
    requests = [("sim:m", five_shot(q)) for q in QUESTIONS]
    uses = prefix_use(requests)
    # shared: the system message and the examples up to their last line break (a word cut in two is not counted),
    # by the simulated server's rule (3 per request, 3 per message), exact for sim:
    shared = 3 + (3 + sim_tokens(SYSTEM)) + (3 + sim_tokens(SHOTS.rstrip("\n")))
    assert shared > 1024
    cached = 1024 + (shared - 1024) // 128 * 128  # OpenAI's rule: from 1,024 tokens, in steps of 128
    assert uses[0].shared == 0 and uses[0].read == 0 and uses[0].written == cached
    for use in uses[1:]:
        assert (use.shared, use.read, use.written) == (shared, cached, 0)


def test_prompts_under_the_minimum_are_not_cached() -> None:
    short = [("sim:m", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]) for q in QUESTIONS]
    uses = prefix_use(short)
    assert all(u.read == 0 and u.written == 0 for u in uses)
    assert uses[1].shared > 0  # they do share a prefix: too short to cache
    # Anthropic's minimum depends on the model: the same prompts, 1,100 words long, cache on Sonnet 4.5 (1,024)
    # and not on Haiku 4.5 (4,096)
    long = [(m, five_shot(q)) for m in ("anthropic:claude-sonnet-4-5", "anthropic:claude-haiku-4-5")
            for q in QUESTIONS[:3]]
    uses = prefix_use(long, count=words)
    shared = words("", [{"content": SYSTEM}, {"content": SHOTS}])
    assert 1024 <= shared < 4096
    assert [(u.read, u.written) for u in uses] == [(0, shared), (shared, 0), (shared, 0), (0, 0), (0, 0), (0, 0)]


def test_models_do_not_share_a_cache_and_the_order_sent_decides_who_writes() -> None:
    a, b = five_shot(QUESTIONS[0]), five_shot(QUESTIONS[1])
    uses = prefix_use([("sim:x", a), ("sim:y", b), ("sim:y", a), ("sim:x", b)], count=words)
    shared = words("", [{"content": SYSTEM}, {"content": SHOTS}])
    cached = 1024 + (shared - 1024) // 128 * 128
    assert [(u.read, u.written) for u in uses] == [(0, cached), (0, cached), (cached, 0), (cached, 0)]


def test_a_longer_later_share_is_written_past_what_was_read() -> None:
    """Request 2 shares the examples with 1, and examples plus a long passage with 3: it reads the first part and
    writes the rest for 3."""
    passage = " ".join(["stone"] * 400) + "\n"
    first = five_shot("Q: which?")
    second, third = five_shot(passage + "Q: who?"), five_shot(passage + "Q: where?")
    uses = prefix_use([("openai:gpt-4o", m) for m in (first, second, third)], count=words)
    examples = words("", [{"content": SYSTEM}, {"content": SHOTS}])
    longer = words("", [{"content": SYSTEM}, {"content": SHOTS + passage}])
    rule = cache_rule("openai:gpt-4o")
    assert uses[1].read == cacheable(examples, rule) > 0
    assert uses[1].written == cacheable(longer, rule) - uses[1].read > 0
    assert uses[2].read == cacheable(longer, rule) and uses[2].written == 0


def test_each_provider_has_its_documented_rule() -> None:
    assert (cache_rule("openai:gpt-4o").minimum, cache_rule("openai:gpt-4o").increment) == (1024, 128)
    assert cache_rule("anthropic:claude-sonnet-4-5-20250929").minimum == 1024
    assert cache_rule("anthropic:claude-haiku-4-5").minimum == 4096
    assert cache_rule("anthropic:claude-3-5-haiku-latest").minimum == 2048
    assert cache_rule("gemini:gemini-2.5-flash").minimum == 1024
    assert cache_rule("gemini:gemini-2.5-pro").minimum == 2048
    assert cache_rule("vertex:claude-sonnet-4-5@20250929").minimum == 1024  # Claude on Vertex: Anthropic's rule
    assert cache_rule("local:smollm2-135m-instruct") is None
    assert all(r.source for r in (cache_rule("openai:gpt-4o"), cache_rule("gemini:gemini-2.5-pro")))
    assert [cacheable(n, cache_rule("openai:gpt-4o")) for n in (1023, 1024, 1151, 1152, 2000)] == \
        [0, 1024, 1024, 1152, 1920]


@pytest.mark.parametrize("seed", range(40))
def test_the_sorted_search_finds_what_comparing_every_pair_finds(seed: int) -> None:
    rng = random.Random(seed)
    requests = [(rng.choice(["sim:a", "sim:b"]), [{"role": "user", "content": " ".join(
        rng.choice(["x", "y"]) for _ in range(rng.randint(0, 8)))}]) for _ in range(rng.randint(1, 14))]
    texts = [prompt_text(m) for _, m in requests]

    def common(a: str, b: str) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    def tokens(index: int, chars: int) -> int:  # what the analysis counts for a prefix of so many characters
        text = texts[index][:chars]
        role, _, body = text.partition("\x1f")
        body = body.removesuffix("\x1e")
        if "\x1e" not in text:
            body = body[:body.rfind(" ")] if " " in body else ""
        return 0 if not (body or "\x1e" in text) else words("", [{"content": body}])

    uses = prefix_use(requests, count=words)
    for i, (model, _) in enumerate(requests):
        earlier = max([common(texts[i], texts[j]) for j in range(i) if requests[j][0] == model], default=0)
        assert uses[i].shared == tokens(i, earlier), (requests, i)

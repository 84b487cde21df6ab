"""Input-token counts: exact for OpenAI models through tiktoken, loaded from the runner's own files with no
network; estimates for the other providers that come out above what tiktoken counts."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tiktoken

from runner.providers import tokens
from runner.providers.tokens import count_input_tokens, count_text_tokens, estimate_text_tokens, exact
from simserver.answers import count_prompt_tokens

ROOT = Path(__file__).resolve().parents[2]

# The example of OpenAI's cookbook "How to count tokens with tiktoken" (section 6). Its prompt_tokens, as the
# OpenAI API reported them there: 124 for gpt-4o and gpt-4o-mini, 129 for gpt-4 and gpt-3.5-turbo.
COOKBOOK_MESSAGES = [
    {"role": "system", "content": "You are a helpful, pattern-following assistant that translates corporate "
                                  "jargon into plain English."},
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {"role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth to touch "
                                                          "base on opportunities for increased leverage."},
    {"role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to "
                                                               "do better."},
    {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client "
                                "deliverable."},
]

CORPUS = [
    # English
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Which of the following best describes the word 'gleamwright'? Answer with one letter.",
    "In 1998, researchers reported that the new term had entered three dictionaries within a year.",
    "A. a tool for polishing metal\nB. a person who repairs lamps\nC. a kind of bird\nD. none of the above",
    "It's not that I don't want to; it's that I can't — not yet, anyway.",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "ALL CAPS SENTENCES ARE TOKENIZED DIFFERENTLY FROM LOWER CASE ONES.",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\nmixed\n\n\nwith blank lines",
    # digits and numbers
    "1234567890",
    "3.14159265358979323846264338327950288419716939937510",
    "Call 555-0199 or +1 (202) 555-0143 before 2024-12-31T23:59:59Z.",
    "0x7fffffff 0b1010 1e-9 6.022e23 -273.15",
    "Invoice #88231: 17 items × $4.99 = $84.83 (tax 8.25%)",
    "".join(str(i) for i in range(200)),
    # CJK
    "新しい言葉の意味を説明してください。",
    "这个新词是什么意思?请从下面的选项中选择一个。",
    "한국어 문장도 토큰 수가 다릅니다.",
    "東京特許許可局許可局長",
    "龘靐齉爩",  # rare characters
    "日本語とEnglishが混ざった文章です。",
    # other scripts
    "Привет, как дела? Это новое слово.",
    "مرحبا بالعالم، هذه جملة عربية.",
    "नमस्ते, यह एक हिंदी वाक्य है।",
    "Γειά σου κόσμε· αυτή είναι μια ελληνική πρόταση.",
    "שלום עולם, זה משפט בעברית.",
    "สวัสดีชาวโลก นี่คือประโยคภาษาไทย",
    "Xin chào thế giới, đây là một câu tiếng Việt.",
    "Zürich, Kraków, São Paulo, Reykjavík, Ålesund",
    # emoji and symbols
    "👍",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 🇯🇵 🇫🇷 flags",
    "I ❤️ tokens 😂😂😂🔥🔥",
    "∀x ∈ ℝ, ∃y: x² + y² ≤ 1 ⇒ |x| ≤ 1",
    "→ ← ↑ ↓ ⇐ ⇒ ∑ ∏ ∫ √ ∞ ≈ ≠ ≡",
    "©®™ §¶ †‡ ‰ ′″ «» „“ ‹›",
    # code and markup
    "def f(x: int) -> int:\n    return x * 2 + 1\n",
    "for (let i = 0; i < n; i++) { sum += a[i] * b[i]; }",
    '{"id": 17, "choices": ["a", "b", "c"], "gold": 2, "meta": {"split": "cause"}}',
    "<div class=\"row\"><span id='x'>text</span></div>",
    "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id DESC LIMIT 10;",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "    if x:\n        if y:\n            if z:\n                return [i for i in range(10) if i % 2]\n",
    "https://example.org/path/to/page?query=a+b&lang=en#section-2",
    "C:\\Users\\someone\\Documents\\data_2024_v3_final(1).csv",
    "sha256: 446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    # repetition and edge cases
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "================================================================",
    "ha " * 40,
    "x",
    "<|endoftext|> is plain text in a message",
]


def test_the_cookbook_example_counts_what_the_openai_api_reported() -> None:
    assert count_input_tokens("openai", "gpt-4o", COOKBOOK_MESSAGES) == 124
    assert count_input_tokens("openai", "gpt-4o-mini", COOKBOOK_MESSAGES) == 124
    assert count_input_tokens("openai", "gpt-4", COOKBOOK_MESSAGES) == 129
    assert count_input_tokens("openai", "gpt-3.5-turbo", COOKBOOK_MESSAGES) == 129


def test_a_small_request_counted_by_hand() -> None:
    # o200k_base encodes "hello world" as [24912, 2375] and "user" as one token; the chat format adds 3 tokens
    # per message and 3 to prime the reply: 3 + 1 + 2 + 3 = 9.
    assert tokens.encoding("o200k_base").encode("hello world") == [24912, 2375]
    assert count_text_tokens("hello world", "gpt-4o") == 2
    assert count_input_tokens("openai", "gpt-4o", [{"role": "user", "content": "hello world"}]) == 9
    assert count_input_tokens("openai", "gpt-4o", []) == 3
    # cl100k_base (gpt-4) has its own ids for the same text.
    assert tokens.encoding("cl100k_base").encode("hello world") == [15339, 1917]


def test_content_given_as_text_parts_counts_as_the_joined_text() -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}]
    plain = [{"role": "user", "content": "hello world"}]
    for provider in ("openai", "anthropic"):
        assert count_input_tokens(provider, "gpt-4o", parts) == count_input_tokens(provider, "gpt-4o", plain)


def test_which_counts_are_exact() -> None:
    assert exact("openai", "gpt-4o") and exact("openai", "gpt-4o-2024-08-06") and exact("openai", "gpt-4")
    assert exact("sim", "gpt-test")
    for provider, model in [("anthropic", "claude-haiku-4-5"), ("gemini", "gemini-2.0-flash"),
                            ("openai-compatible", "llama/smollm2"), ("local", "smollm2")]:
        assert not exact(provider, model)
    # An OpenAI model tiktoken does not know yet is counted with o200k_base, and said not to be exact.
    assert not exact("openai", "gpt-99-preview")
    assert count_input_tokens("openai", "gpt-99-preview", COOKBOOK_MESSAGES) == 124


def test_the_simulated_server_is_counted_by_its_own_rule() -> None:
    messages = [{"role": "system", "content": "Answer with one letter."}, {"role": "user", "content": CORPUS[4]}]
    assert count_input_tokens("sim", "gpt-test", messages) == count_prompt_tokens(messages)


@pytest.mark.parametrize("provider", ["anthropic", "gemini", "openai-compatible", "local"])
def test_estimates_for_other_providers_are_at_least_the_tiktoken_count(provider: str) -> None:
    o200k, cl100k = tokens.encoding("o200k_base"), tokens.encoding("cl100k_base")
    assert len(CORPUS) >= 50
    for text in CORPUS:
        estimate = estimate_text_tokens(text)
        assert estimate >= len(o200k.encode_ordinary(text)), text
        assert estimate >= len(cl100k.encode_ordinary(text)), text
        messages = [{"role": "user", "content": text}]
        assert count_input_tokens(provider, "m", messages) >= count_input_tokens("openai", "gpt-4o", messages)
        assert count_input_tokens(provider, "m", messages) >= count_input_tokens("openai", "gpt-4", messages)
    whole = [{"role": "user", "content": text} for text in CORPUS]
    assert count_input_tokens(provider, "m", whole) >= count_input_tokens("openai", "gpt-4o", whole)


def test_non_ascii_text_is_reserved_at_up_to_its_utf8_bytes() -> None:
    # A byte-level tokenizer spends at most one token per byte; the estimate reaches that for such text, and
    # goes no higher for any text.
    for text in ["龘靐齉爩", "👨‍👩‍👧‍👦", "สวัสดีชาวโลก", "新しい言葉の意味", "नमस्ते"]:
        assert estimate_text_tokens(text) >= len(text.encode("utf-8"))
    for text in CORPUS:
        assert estimate_text_tokens(text) <= len(text.encode("utf-8")) + 1


def test_tiktoken_loads_the_shipped_files_with_no_network(tmp_path: Path) -> None:
    # A fresh interpreter whose network calls fail and whose tiktoken cache is an empty folder: the counts still
    # come, from runner/providers/data/tiktoken, and the user's TIKTOKEN_CACHE_DIR is left as it was.
    script = (
        "import os, socket, requests\n"
        "def refuse(*a, **k): raise AssertionError('network used')\n"
        "socket.socket.connect = refuse\n"
        "requests.get = refuse\n"
        "from runner.providers.tokens import count_input_tokens\n"
        "print(count_input_tokens('openai', 'gpt-4o', [{'role': 'user', 'content': 'hello world'}]),\n"
        "      count_input_tokens('openai', 'gpt-4', [{'role': 'user', 'content': 'hello world'}]),\n"
        "      os.environ['TIKTOKEN_CACHE_DIR'] == os.environ['EXPECTED_CACHE'],\n"
        "      os.listdir(os.environ['EXPECTED_CACHE']))\n"
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path), "EXPECTED_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["9", "9", "True", "[]"]


def test_the_shipped_files_read_here_are_the_encodings_tiktoken_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    # tokens._ranks reads a .tiktoken file in C calls; tiktoken's own reader (load_tiktoken_bpe, from the same
    # file through its cache folder) is the reference, and the encodings agree on a text too.
    from tiktoken.load import load_tiktoken_bpe

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tokens.DATA_DIR))
    for name in tokens.SHIPPED:
        path = tokens.DATA_DIR / hashlib.sha1(tokens._URL.format(name).encode()).hexdigest()
        ours = tokens._ranks(path.read_bytes())
        assert ours == load_tiktoken_bpe(tokens._URL.format(name), expected_hash=tokens.SHIPPED[name])
        theirs = tiktoken.get_encoding(name)
        mine = tokens.encoding(name)
        assert (mine.name, mine._pat_str, mine._special_tokens, mine.n_vocab) == (
            theirs.name, theirs._pat_str, theirs._special_tokens, theirs.n_vocab)
        text = "Hello, wörld! 12345 新しい言葉 <|endoftext|>"
        assert mine.encode_ordinary(text) == theirs.encode_ordinary(text)


def test_a_damaged_or_missing_vocabulary_file_is_an_error_not_a_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = hashlib.sha1(tokens._URL.format("o200k_base").encode()).hexdigest()
    (tmp_path / name).write_bytes((tokens.DATA_DIR / name).read_bytes()[:-10])
    monkeypatch.setattr(tokens, "DATA_DIR", tmp_path)
    with pytest.raises(RuntimeError, match="damaged"):
        tokens._load.__wrapped__("o200k_base")
    with pytest.raises(RuntimeError, match="missing"):
        tokens._load.__wrapped__("cl100k_base")
    with pytest.raises(ValueError, match="not shipped"):
        tokens.encoding("r50k_base")


def _in_new_process(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", "from runner.providers import tokens\nimport sys, time\n" + code],
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.split()


WAIT_BUILT = ("deadline = time.monotonic() + 60\n"
              "while not tokens.counts_now('openai', 'gpt-4o-mini') and time.monotonic() < deadline:\n"
              "    time.sleep(0.01)\n"
              "print(tokens.counts_now('openai', 'gpt-4o-mini'))\n")


def test_a_tokenizer_asked_for_is_built_in_its_own_thread_once_the_first_answer_is_back() -> None:
    # Whether a count can be made now is answered without tiktoken while nothing is built; a build asked for waits
    # for the run's first answer, and asks which encoding only then; asking whether a count is exact builds nothing.
    said = _in_new_process("print(tokens.counts_now('openai', 'gpt-4o-mini'), 'tiktoken' in sys.modules)\n"
                           "tokens.BUILD_AFTER = 600\n"
                           "tokens.build_soon('openai', 'gpt-4o-mini')\n"
                           "tokens.build_soon('anthropic', 'claude-haiku-4-5')\n"  # the same encoding, built once
                           "tokens.build_soon('sim', 'gpt-4o-mini')\n"  # needs none: nothing asked
                           "time.sleep(0.5)\n"
                           "print(len(tokens._building), 'tiktoken' in sys.modules)\n"
                           "print(tokens.exact('openai', 'gpt-4o-mini'), tokens.counts_now('openai', 'gpt-4o-mini'))\n"
                           "tokens.first_answer()\n" + WAIT_BUILT +
                           "print(tokens.counts_now('anthropic', 'claude-haiku-4-5'), sorted(tokens._built))\n")
    assert said == ["False", "False", "2", "False", "True", "False", "True", "True", "['o200k_base']"]


def test_a_tokenizer_asked_for_is_built_after_a_while_even_with_no_answer() -> None:
    said = _in_new_process("tokens.BUILD_AFTER = 0.2\n"
                           "tokens.build_soon('openai', 'gpt-4o-mini')\n" + WAIT_BUILT)
    assert said == ["True"]


def test_the_byte_bound_alone_is_the_bound_a_budget_reserves_where_no_count_is_exact() -> None:
    messages = [{"role": "system", "content": "Réponds en une lettre."}, {"role": "user", "content": "Question ﷺ?"}]
    assert tokens.byte_bound(messages) == tokens.bound_call_tokens("anthropic", "claude-haiku-4-5", messages)
    pairs = [("The cat sat on the", " mat")]
    assert tokens.byte_bound([], pairs) == tokens.bound_call_tokens("local", "m", [], pairs)
    assert tokens.byte_bound(messages) > count_input_tokens("openai", "gpt-4o-mini", messages)

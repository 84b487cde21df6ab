"""Input tokens of a request's messages, counted before it is sent: for budget reservations and estimates.

Each provider class counts its own requests (``Provider.count_input_tokens`` and ``Provider.tokens_exact``);
:func:`count_input_tokens` and :func:`exact` look the provider up by name and ask it. This module holds what
they share: the tiktoken encodings, OpenAI's chat framing constants, and the estimate. OpenAI models are counted
with tiktoken, exactly as the Chat Completions API counts them for plain text messages. Anthropic's and Google's
tokenizers are not public, and neither is a user server's, so two figures are kept for those:

- the *expected* count (:func:`estimate_input_tokens`, the provider's ``count_input_tokens`` by default): a
  heuristic from the o200k count, usually near or somewhat above the real count, but not a bound: 4,000 repeats
  of one character are 111 expected tokens where a tokenizer that does not merge that run spends up to 4,000;
- the *bound* (:func:`bound_input_tokens`, :func:`bound_call_tokens`): counted from UTF-8 bytes, which no
  tokenizer these providers use can exceed (the reasoning is beside the constants below). Budgets reserve the
  bound wherever the count is not exact: a reservation that is too high is given back when the response
  arrives, one that is too low could let a request overshoot a budget.

Estimates show both (``runner estimate``); the token buckets of rate limits take the expected count, since the
providers' own limits count real tokens and a bound 4x too high for English would cut throughput by as much (only
for a run's first moment, before the encoding is built, do they take the bound: "Counting without waiting for a
tokenizer" below).

tiktoken fetches its vocabulary files from the internet on first use, which this project cannot rely on. The
two files the OpenAI chat models use ship in ``runner/providers/data/tiktoken/`` under the names tiktoken's cache gives
them (the SHA-1 of their download address); each is checked against the SHA-256 tiktoken pins, read here, and
handed to tiktoken's own constructor of the encoding (its pattern and special tokens). No download is ever tried:
an encoding that is not shipped is never asked for (see ``runner/providers/data/tiktoken/README.md`` for the files'
origin and licence).
"""

from __future__ import annotations

import binascii
import functools
import hashlib
import math
import threading
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import provider_class

if TYPE_CHECKING:  # tiktoken (12 ms) is imported when an encoding is first built: not for a sim: run
    import tiktoken

    from .base import Provider

__all__ = ["bound_call_tokens", "bound_input_tokens", "bound_text_tokens", "build_soon", "byte_bound",
           "count_call_tokens", "count_encoding", "count_input_tokens", "count_text_tokens", "counts_now", "encoding",
           "estimate_input_tokens", "estimate_text_tokens", "exact", "first_answer", "message_text", "model_encoding",
           "model_encoding_name"]

#: where the shipped vocabulary files live, named as tiktoken's cache names them
DATA_DIR = Path(__file__).parent / "data" / "tiktoken"

_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"

#: encodings shipped with the project, and the SHA-256 tiktoken pins for each (``tiktoken_ext/openai_public.py``)
SHIPPED: dict[str, str] = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}

#: the encoding of OpenAI models tiktoken does not know yet (every chat model since gpt-4o uses it)
FALLBACK_ENCODING = "o200k_base"

# The chat format's overhead, from OpenAI's cookbook "How to count tokens with tiktoken" (num_tokens_from_messages,
# the rule for gpt-3.5-turbo-0613 and later, gpt-4, gpt-4o): each message is framed as
# <|start|>{role}<|message|>{content}<|end|>, i.e. 3 tokens besides its role and content; a ``name`` costs one more
# token besides its own; and every reply is primed with <|start|>assistant<|message|>, 3 tokens per request.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3

# The expected count for tokenizers that are not public (Anthropic, Gemini, user servers): a heuristic, NOT an
# upper bound (a long run of one character, which o200k merges into few tokens, can cost far more). Per text:
#
#     min(UTF-8 bytes + 1, ceil(ESTIMATE_FACTOR * o200k tokens) + UTF-8 bytes outside ASCII + ASCII digits)
#
# - ESTIMATE_FACTOR: o200k_base is one of the most compact tokenizers there is (a 200k vocabulary). Anthropic puts a
#   Claude token at about 3.5 English characters against about 4-4.5 for o200k (x1.15-1.3), and says its newer
#   tokenizer (Claude Opus 4.7) uses up to 35% more tokens than the one before for the same text; 1.5 covers
#   English prose and code of both. Gemini's 256k SentencePiece vocabulary is about as compact as o200k.
# - bytes outside ASCII: a smaller vocabulary covers far fewer CJK, Indic, Thai or emoji sequences, and byte-level
#   BPE (Claude) or SentencePiece with byte fallback (Gemini) then spends up to one token per byte. Reserving one
#   token per such byte (on top of the o200k share) is the most either can spend on them. ASCII text adds nothing.
# - ASCII digits: Gemini's tokenizer (like Gemma's) gives every digit its own token, where o200k groups them by three.
# - the cap: neither kind of tokenizer spends more than one token per byte (+1 for SentencePiece's leading space),
#   so the sum never needs to go above that; it is at least the o200k count too, which is never more than the bytes.
# Per message and per request, 8 tokens stand for the role markers and turn delimiters of the provider's format
# (about twice OpenAI's 3 + role; Anthropic and Google do not publish theirs).
ESTIMATE_FACTOR = 1.5
ESTIMATE_PER_MESSAGE = 8
ESTIMATE_PER_REQUEST = 8

# The upper bound for tokenizers that are not available here: what budgets reserve (bound_input_tokens).
#
# - One token per UTF-8 byte of text at most. A byte-level BPE (Claude's, GPT-2 style) starts from one token per
#   byte and every merge only joins tokens; a SentencePiece model with byte fallback (Gemini's, like Gemma's and
#   Llama 2's) gives a character in its vocabulary one piece and one outside it one token per UTF-8 byte, and a
#   piece of several characters covers at least as many bytes as characters. So a text's own tokens are at most
#   its bytes, however repetitive or exotic it is (4,000 repeats of "a": at most 4,000, where the expected count
#   says 111).
# - Normalisation: SentencePiece may apply NFKC before cutting, and NFKC can lengthen a text (U+FDFA, 3 bytes,
#   becomes 18 Arabic letters, 33 bytes); the bound takes the longer of the text's bytes and its NFKC form's.
#   ASCII is its own NFKC form, so ASCII text costs nothing extra to bound.
# - Framing: the text of each message is wrapped in role and turn markers the API adds, and each request gets a
#   few more (a BOS token, the primer of the reply, SentencePiece's dummy-prefix space before a text). Anthropic
#   and Google do not publish theirs; the published templates of their relatives spend a handful: OpenAI's chat
#   format 3 per message and 3 per request, Gemma's "<start_of_turn>user\n ... <end_of_turn>\n" 5 per turn
#   plus "<bos>" and "<start_of_turn>model\n". BOUND_PER_MESSAGE and BOUND_PER_REQUEST take several times those,
#   and every byte of the role and of a ``name`` is counted on top.
# What the bound does not cover: images, tools and response schemas (not counted at all here, as before).
BOUND_PER_MESSAGE = 16
BOUND_PER_REQUEST = 64

_DIGITS = "0123456789"
_load_lock = threading.Lock()
_build_lock = threading.Lock()
#: the encodings built in this process
_built: set[str] = set()


def encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken encoding ``name``, loaded from the shipped file (once per process)."""
    if name not in SHIPPED:
        raise ValueError(f"encoding {name!r} is not shipped with the runner; shipped: {', '.join(SHIPPED)}")
    if name in _built:
        return _load(name)
    with _build_lock:  # one build per encoding, whichever thread asks first (the other waits for it)
        built = _load(name)
    _built.add(name)
    return built


@functools.cache
def _load(name: str) -> tiktoken.Encoding:
    path = DATA_DIR / hashlib.sha1(_URL.format(name).encode()).hexdigest()
    # Checked here first: given a missing or altered file, tiktoken would delete it and try the network instead.
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RuntimeError(f"the tiktoken file for {name} is missing from {DATA_DIR}; reinstall the runner") from exc
    if hashlib.sha256(data).hexdigest() != SHIPPED[name]:
        raise RuntimeError(f"the tiktoken file for {name} in {DATA_DIR} is damaged; reinstall the runner")
    import tiktoken

    return tiktoken.Encoding(**_parameters(name, _ranks(data)))


def _ranks(data: bytes) -> dict[bytes, int]:
    """The token ranks of a ``.tiktoken`` file (a base64 token and its rank a line), as tiktoken's
    ``load_tiktoken_bpe`` reads them, in C calls rather than its loop over 200,000 lines (0.14 s instead of 0.3 s
    of a paid provider's start; tests/providers/test_tokens.py compares the two)."""
    fields = data.split()
    return dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2]), strict=True))


def _parameters(name: str, ranks: dict[bytes, int]) -> dict[str, Any]:
    """tiktoken's own constructor of encoding ``name`` (its pattern and special tokens), given the ranks read
    here: its file reader, which would look in its cache folder and then download, is not called."""
    from tiktoken_ext import openai_public

    with _load_lock:
        reader = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = lambda *args, **kwargs: ranks
        try:
            return openai_public.ENCODING_CONSTRUCTORS[name]()
        finally:
            openai_public.load_tiktoken_bpe = reader


@functools.cache
def model_encoding_name(model: str) -> tuple[str, bool]:
    """The name of an OpenAI model's encoding, and whether tiktoken knows the model (else the fallback's name),
    without building the encoding."""
    import tiktoken

    try:
        name = tiktoken.encoding_name_for_model(model)
    except KeyError:
        return FALLBACK_ENCODING, False
    if name not in SHIPPED:  # models older than the chat API (r50k, p50k): never downloaded, counted as o200k
        return FALLBACK_ENCODING, False
    return name, True


def model_encoding(model: str) -> tuple[tiktoken.Encoding, bool]:
    """The encoding of an OpenAI model, and whether tiktoken knows the model (else the fallback is used)."""
    name, known = model_encoding_name(model)
    return encoding(name), known


def _provider(name: str) -> type[Provider] | None:
    try:
        return provider_class(name)
    except KeyError:  # a provider nobody registered: estimated
        return None


def exact(provider: str, model: str) -> bool:
    """Whether ``count_input_tokens`` is the count the provider will report (for text messages), rather than an
    estimate meant to lie above it (``Provider.tokens_exact``)."""
    cls = _provider(provider)
    return cls.tokens_exact(model) if cls is not None else False


def count_input_tokens(provider: str, model: str, messages: Iterable[Mapping[str, Any]]) -> int:
    """Input tokens of a chat request, as the provider counts them (``Provider.count_input_tokens``): exact for
    OpenAI models tiktoken knows and for the simulated server, the expected count otherwise (see ``exact``), which
    is not a bound: budgets reserve :func:`bound_call_tokens`. Images, tools and response schemas are not
    counted."""
    cls = _provider(provider)
    return cls.count_input_tokens(model, messages) if cls is not None else estimate_input_tokens(messages)


def estimate_input_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Expected input tokens of a chat request for a tokenizer that is not public (the rule is above); usually at
    or above the real count, but not a bound (:func:`bound_input_tokens` is one)."""
    total = ESTIMATE_PER_REQUEST
    for message in messages:
        total += ESTIMATE_PER_MESSAGE + estimate_text_tokens(str(message.get("role", "")))
        total += estimate_text_tokens(message_text(message.get("content")))
    return total


def count_text_tokens(text: str, model: str = "gpt-4o") -> int:
    """Tokens of a bare text for an OpenAI model (no chat framing)."""
    return len(model_encoding(model)[0].encode_ordinary(text))


def estimate_text_tokens(text: str) -> int:
    """Expected token count of a text for a tokenizer that is not public (the rule is above); not a bound."""
    if not text:
        return 0
    tokens = math.ceil(ESTIMATE_FACTOR * len(encoding(FALLBACK_ENCODING).encode_ordinary(text)))
    tokens += sum(text.count(digit) for digit in _DIGITS)
    if text.isascii():
        return min(tokens, len(text) + 1)
    size = len(text.encode("utf-8", "surrogatepass"))
    ascii_chars = len(text.encode("ascii", "ignore"))
    return min(tokens + size - ascii_chars, size + 1)


def message_text(content: Any) -> str:
    """The text of a message's content: a string, or a list of parts of which the text ones count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(message_text(part.get("text")) if isinstance(part, Mapping) else message_text(part)
                       for part in content)
    return str(content)


def count_call_tokens(provider: str, model: str, messages: Iterable[Mapping[str, Any]],
                      pairs: Iterable[tuple[str, str]] | None = None) -> int:
    """Input tokens of a call: its messages, or for a log-likelihood call every context and continuation it has
    read (the expected count: the server's tokenizer is not known here)."""
    if pairs is not None:
        return sum(estimate_text_tokens(context) + estimate_text_tokens(rest) for context, rest in pairs)
    return count_input_tokens(provider, model, messages)


def bound_text_tokens(text: str) -> int:
    """At most how many tokens a text is for a byte-level BPE or a SentencePiece model with byte fallback: its
    UTF-8 bytes, or those of its NFKC form when longer (the reasoning is above ``BOUND_PER_MESSAGE``)."""
    if not text:
        return 0
    if text.isascii():
        return len(text)
    size = len(text.encode("utf-8", "surrogatepass"))
    normal = unicodedata.normalize("NFKC", text)
    return size if normal == text else max(size, len(normal.encode("utf-8", "surrogatepass")))


def bound_input_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """A true upper bound on the input tokens of a chat request for any provider whose tokenizer spends at most
    one token per byte (every one the runner speaks to): bytes of every text, role and name, plus
    ``BOUND_PER_MESSAGE`` per message and ``BOUND_PER_REQUEST``. Images, tools and schemas are not counted."""
    total = BOUND_PER_REQUEST
    for message in messages:
        total += BOUND_PER_MESSAGE + bound_text_tokens(str(message.get("role", "")))
        total += bound_text_tokens(message_text(message.get("content")))
        name = message.get("name")
        if name:
            total += BOUND_PER_MESSAGE + bound_text_tokens(str(name))
    return total


def bound_call_tokens(provider: str, model: str, messages: Iterable[Mapping[str, Any]],
                      pairs: Iterable[tuple[str, str]] | None = None, counted: int | None = None) -> int:
    """The input tokens a budget reserves for a call: the provider's own count where it is exact (``exact``), else
    a true upper bound, never below the expected count. ``counted``: :func:`count_call_tokens` of the call when the
    caller has it already (it is not counted again)."""
    if pairs is not None:  # a log-likelihood call: the server's tokenizer is not known here
        return max(byte_bound(messages, pairs), counted or 0)
    if counted is None:
        messages = list(messages)
        counted = count_input_tokens(provider, model, messages)
    if exact(provider, model):
        return counted
    return max(counted, bound_input_tokens(messages))


def byte_bound(messages: Iterable[Mapping[str, Any]], pairs: Iterable[tuple[str, str]] | None = None) -> int:
    """The upper bound of a call's input tokens from its UTF-8 bytes alone (:func:`bound_input_tokens`, or for a
    log-likelihood call every context and continuation it reads), which needs no tokenizer."""
    if pairs is None:
        return bound_input_tokens(messages)
    return BOUND_PER_REQUEST + sum(2 * BOUND_PER_MESSAGE + bound_text_tokens(context) + bound_text_tokens(rest)
                                   for context, rest in pairs)


# -- Counting without waiting for a tokenizer ---------------------------------------------------------------
# Building o200k_base costs about 0.3 s of CPU (its 200,000 ranks read, then tiktoken's Rust constructor, which
# holds the GIL throughout), more than the rest of `runner submit` before its first request. So the engine does
# not build it before sending: until it is built, a request's input tokens are taken as its byte bound, which is
# never below the count (budgets reserve a little more, token buckets take a little more, for the run's first
# moments), and the build runs in a thread of its own once the run's first answer has come back, or at the latest
# BUILD_AFTER seconds after it was first wanted. Where the bound is not good enough (a budget it does not fit),
# the caller counts, and so builds, at once (runner/engine/reserver.py).

#: seconds a tokenizer first wanted by the engine waits for the run's first answer before it is built anyway
BUILD_AFTER = 1.0
_first_answer = threading.Event()
#: the (provider, model, log-likelihood?) whose tokenizer a thread builds
_building: set[tuple[str, str, bool]] = set()


@functools.cache
def _count_encoding(provider: str, model: str) -> str | None:
    cls = _provider(provider)
    return cls.count_encoding(model) if cls is not None else FALLBACK_ENCODING


@functools.cache
def _needs_encoding(provider: str) -> bool:
    cls = _provider(provider)
    return cls.needs_encoding if cls is not None else True


def count_encoding(provider: str, model: str, pairs: object = None) -> str | None:
    """The encoding a count of a call of ``model`` at ``provider`` uses (``Provider.count_encoding``; a
    log-likelihood call, with ``pairs``, is estimated with the fallback's), None when it uses none."""
    return FALLBACK_ENCODING if pairs is not None else _count_encoding(provider, model)


def counts_now(provider: str, model: str, pairs: object = None) -> bool:
    """Whether a call of ``model`` at ``provider`` can be counted without building a tokenizer first. Before any
    is built this is answered without asking which one (for an OpenAI model, tiktoken's own import: some 15 ms)."""
    if pairs is None and not _needs_encoding(provider):
        return True
    if not _built:
        return False
    return count_encoding(provider, model, pairs) in _built


def build_soon(provider: str, model: str, pairs: object = None) -> None:
    """Have the tokenizer a count of such a call needs built in a thread of its own, once the run's first answer
    has come back (:func:`first_answer`) or ``BUILD_AFTER`` seconds from now, whichever is first; which tokenizer
    that is is asked there too."""
    wanted = (provider, model, pairs is not None)
    if wanted in _building or (pairs is None and not _needs_encoding(provider)):
        return
    _building.add(wanted)
    threading.Thread(target=_build_later, args=wanted, name="runner-tokenizer", daemon=True).start()


def _build_later(provider: str, model: str, pairs: bool) -> None:
    _first_answer.wait(BUILD_AFTER)
    try:
        name = count_encoding(provider, model, () if pairs else None)
        if name is not None:
            encoding(name)
    except Exception:  # the caller that needs the count builds it again, and says why it cannot
        _building.discard((provider, model, pairs))


def first_answer() -> None:
    """The run's first answer has come back: a tokenizer waiting to be built (:func:`build_soon`) need not wait."""
    if not _first_answer.is_set():
        _first_answer.set()

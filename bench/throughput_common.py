"""What the phases of ``bench/throughput.py`` share: the job they time (rows, the job file, its prompt), the
simulated server in its own process (:class:`SimProcess`) and the meters (:class:`Meter`, peak RSS from /proc,
another process's CPU), a job run through ``execute`` alone (:func:`run_job`), the figures' median and the ABBA
order of rounds, and what the measured code is (:func:`code_state`, :func:`versions`). Also used by
``bench/latency.py`` and ``bench/ratelimit.py``. Nothing here imports the runner at module level: a phase's child
process imports it from the checkout it measures (``BENCH_CODE``, set up by bench/throughput.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import selectors
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
#: the script a phase runs its child processes with (phases 5 and 6)
SCRIPT = ROOT / "bench" / "throughput.py"

TARGET_RATIO = 0.70
TARGET_HITS_PER_S = 20_000.0
TARGET_RSS_MB = 250.0

MODEL = "bench"
MAX_TOKENS = 5
INSTRUCTION = "Answer with the letter of the correct option only."
#: the runner renders this; the bare SDK loop builds the same text by hand
PROMPT_USER = "Question: {{ question }}\n{{ options_block }}\n" + INSTRUCTION
LETTERS = "ABCD"
STREAM_QUESTIONS = 4


# -- data -----------------------------------------------------------------------------------------------

def distinct_row(i: int, tag: str) -> dict[str, Any]:
    """A multiple-choice row whose question (hence every rendering of it) is unique to ``i``."""
    return {
        "question": f"[{tag} {i}] Which number is {i} plus one?",
        "choices": [str(i + 1), str(i + 2), str(i - 1), str(i + 10)],
        "gold": 0,
    }


def cycling_row(i: int) -> dict[str, Any]:
    """One of STREAM_QUESTIONS rows, repeated: the streamed job renders only a handful of prompts."""
    k = i % STREAM_QUESTIONS
    return {"question": f"Which number is {k} plus one?", "choices": [str(k + 1), str(k + 2), str(k + 3), str(k + 4)],
            "gold": 0}


def write_jsonl(path: Path, rows: Iterator[dict[str, Any]]) -> None:
    encode = json.JSONEncoder(separators=(",", ":")).encode
    with open(path, "w", encoding="utf-8") as out:
        chunk: list[str] = []
        for row in rows:
            chunk.append(encode(row))
            if len(chunk) == 10_000:
                out.write("\n".join(chunk) + "\n")
                chunk.clear()
        if chunk:
            out.write("\n".join(chunk) + "\n")


def bare_prompt(i: int, tag: str) -> str:
    row = distinct_row(i, tag)
    options = "\n".join(f"{LETTERS[j]}. {text}" for j, text in enumerate(row["choices"]))
    return f"Question: {row['question']}\n{options}\n{INSTRUCTION}"


#: the model each provider's job in phase 6 asks the simulated server for (one it serves under strict checks), and
#: the provider's settings beside its ``base_url``; the keys are test keys (:data:`BENCH_KEYS`)
PROVIDER_MODELS = {"sim": MODEL, "openai": "gpt-4o-mini", "azure-openai": "gpt-4o-mini",
                   "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.0-flash", "vertex": "gemini-2.0-flash",
                   "bedrock": "amazon.nova-pro-v1:0"}
BENCH_KEYS = {"OPENAI_API_KEY": "bench", "AZURE_OPENAI_API_KEY": "bench", "ANTHROPIC_API_KEY": "bench",
              "GEMINI_API_KEY": "bench"}


def provider_settings(provider: str, url: str) -> dict[str, Any]:
    """A provider's settings against the simulated server at ``url`` (its ``/v1`` URL), as a job gives them."""
    root = url.removesuffix("/v1")
    if provider == "azure-openai":
        return {"base_url": root + "/openai", "api_version": "2024-10-21"}
    if provider == "vertex":  # its credentials: google_credentials' key file, in the child's environment
        return {"base_url": root, "project": "sim-project", "location": "us-east5"}
    return {"base_url": root if provider in ("anthropic", "gemini", "bedrock") else url}


#: ``sim`` with a price of its own (gpt-4o-mini's): the lean wire with the engine's work for a priced model (each
#: request's worst case reserved in the store's ledger and settled), as every cloud provider's model has
PRICED_SIM = "sim+price"


def write_job(path: Path, name: str, dataset: Path, url: str, concurrency: int, out_dir: Path,
              shuffle: bool = True, provider: str = "sim") -> None:
    priced = provider == PRICED_SIM
    provider = provider.removesuffix("+price")
    model = f"{provider}:{PROVIDER_MODELS[provider]}"
    job = {
        "name": name,
        "output_dir": str(out_dir),
        "models": [model],
        "providers": {provider: {**provider_settings(provider, url), "concurrency": concurrency}},
        **({"prices": {model: {"input": 0.15, "output": 0.6}}} if priced else {}),
        "params": {"max_tokens": MAX_TOKENS, "temperature": 0},
        "stages": [{
            "name": "mc",
            "dataset": {"path": str(dataset)},
            "prompt": {"user": PROMPT_USER},
            "choices": {"seeds": [0], "shuffle": shuffle},
            "parse": "letter",
        }],
    }
    path.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")


def count_lines(path: Path) -> int:
    count = 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            count += block.count(b"\n")
    return count


# -- the simulated server in its own process ------------------------------------------------------------

class SimProcess:
    def __init__(self, timeout: float = 20.0, extra: list[str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simserver", "--host", "127.0.0.1", "--port", "0", *(extra or [])],
            cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )
        self.url = self._read_url(timeout)
        self.root = self.url.removesuffix("/v1")

    def _read_url(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.stop()
                raise RuntimeError(f"the simulated server printed nothing within {timeout:g} s")
        line = self.proc.stdout.readline().strip()
        prefix = "simulated server listening on "
        if not line.startswith(prefix):
            self.stop()
            raise RuntimeError(f"unexpected first line from the simulated server: {line!r}")
        return line.removeprefix(prefix)

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.root + "/sim/stats", timeout=30) as response:
            return json.loads(response.read())

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def completed(stats: dict[str, Any]) -> int:
    return int(stats["by_status"].get("200", 0))


class Meter:
    """Wall time, this process's CPU time and the server's CPU time over one phase."""

    def __init__(self, server: SimProcess) -> None:
        self.server = server

    def __enter__(self) -> Meter:
        self.server_cpu0 = self.server.cpu_seconds()
        self.cpu0 = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu = time.process_time() - self.cpu0
        self.server_cpu = self.server.cpu_seconds() - self.server_cpu0


# -- running a job, and its figures ---------------------------------------------------------------------

def run_job(job_path: Path, store_path: Path, timeout: float, reuse: bool = True) -> tuple[Any, float]:
    """Load the job, open the store, and time ``execute`` alone; returns (outcome, seconds)."""
    from runner.engine.run import execute
    from runner.spec.job import load_job
    from runner.store import open_store

    job = load_job(job_path)
    store = open_store(store_path)

    async def go() -> tuple[Any, float]:
        async with asyncio.timeout(timeout):
            started = time.perf_counter()
            outcome = await execute(job, store, reuse=reuse)
            return outcome, time.perf_counter() - started

    try:
        return asyncio.run(go())
    finally:
        store.close()


def report_totals(store_path: Path, run_id: str) -> dict[str, Any]:
    from runner.report.summary import build
    from runner.store import open_store

    store = open_store(store_path)
    try:
        return build(store, run_id)["totals"]
    finally:
        store.close()


# -- phase 5: the streamed job, in a fresh process ------------------------------------------------------


def proc_status_kb(field: str) -> int | None:
    """``VmHWM`` (peak RSS) or ``VmRSS`` (current) of this process from /proc/self/status, in kB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def vm_hwm_kb() -> int | None:
    return proc_status_kb("VmHWM")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: the throwaway PostgreSQL server every run's store is a schema of (``--db postgres``), else None (SQLite files)
_POSTGRES: Any = None


def use_postgres() -> str:
    """Every store from here on a new schema of one throwaway PostgreSQL server (devservers/postgres.py); returns
    its URL without a schema."""
    global _POSTGRES
    from devservers import postgres

    _POSTGRES = postgres.start_server()
    if _POSTGRES is None:
        raise SystemExit("--db postgres: no PostgreSQL server binary (install Debian's postgresql)")
    return _POSTGRES.url()


def stop_postgres() -> None:
    if _POSTGRES is not None:
        _POSTGRES.stop()


def new_store(folder: Path) -> str:
    """A fresh store for one run: ``folder/store.sqlite``, or a new PostgreSQL schema with ``--db postgres``."""
    return _POSTGRES.new_schema() if _POSTGRES is not None else str(folder / "store.sqlite")


def child_env(code: Path, url: str | None = None) -> dict[str, str]:
    """A child process's environment: the test keys, the checkout it measures; with ``url`` (the simulated server's)
    also Google's credentials for ``vertex:`` (:func:`google_credentials`) and made-up AWS keys for ``bedrock:``
    (bench/made_up_credentials.py), none of this machine's."""
    env = {**os.environ, **BENCH_KEYS, "BENCH_CODE": str(code), "PYTHONPATH": str(code)}
    if url is not None:
        from bench.made_up_credentials import aws_environment

        google = google_credentials(url.removesuffix("/v1"))
        env = {k: v for k, v in env.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_", "AWS_"))}
        env.update(google)
        env.update(aws_environment(Path(google["CLOUDSDK_CONFIG"]).parent))
    return env


_CREDENTIALS: dict[str, dict[str, str]] = {}


def google_credentials(root: str) -> dict[str, str]:
    """Application Default Credentials for ``vertex:`` against the simulated server at ``root``: a made-up
    service-account key file (bench/made_up_credentials.py) whose token endpoint is the
    server's ``/token``, written once per server into a folder removed at exit; no gcloud settings of this
    machine, no metadata server asked."""
    if root not in _CREDENTIALS:
        import atexit
        import shutil
        import tempfile

        from bench.made_up_credentials import service_account

        folder = Path(tempfile.mkdtemp(prefix="bench-google-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _CREDENTIALS[root] = {"GOOGLE_APPLICATION_CREDENTIALS": str(service_account(folder, root + "/token")),
                              "CLOUDSDK_CONFIG": str(folder / "gcloud"), "NO_GCE_CHECK": "True"}
    return _CREDENTIALS[root]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def abba(sides: list[tuple[str, Path]], rounds: int) -> Iterator[tuple[int, str, Path]]:
    """(round, side, checkout) with the sides' order reversed every other round."""
    for r in range(1, rounds + 1):
        for name, code in sides if r % 2 else sides[::-1]:
            yield r, name, code


# -- what is measured -----------------------------------------------------------------------------------

def code_state() -> str:
    """The commit measured, and whether runner/ or simserver/ differ from it."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        status = subprocess.run(["git", "status", "--porcelain", "--", "runner", "simserver"], cwd=ROOT,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return f"{ROOT} (git unavailable)"
    if rev.returncode or status.returncode:
        return f"{ROOT} (not a git checkout)"
    head, dirty = rev.stdout.strip(), status.stdout.split("\n")
    changed = [line[3:] for line in dirty if line.strip()]
    if changed:
        return f"{head or 'unknown'} + local changes in {', '.join(changed)}"
    return f"{head or 'unknown'} (runner/ and simserver/ as committed)"


def versions() -> str:
    import aiohttp
    import openai

    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        nproc = str(len(os.sched_getaffinity(0)))
    return (f"python {platform.python_version()} | openai {openai.__version__} | aiohttp {aiohttp.__version__} | "
            f"sqlite {sqlite3.sqlite_version} | nproc {nproc} | {platform.platform()}")

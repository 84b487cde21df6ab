#!/usr/bin/env python
"""Throughput and memory benchmark of the runner against the simulated server (zero latency).

    python bench/throughput.py [--n 10000] [--rows 1000000] [--concurrency 64] [--compare PATH] [--only ...]

In one run, against ``simserver`` started in its own process on 127.0.0.1, it prints:

1. the bare OpenAI SDK's requests/s (N distinct short multiple-choice requests, same concurrency bound);
2. the runner's uncached requests/s for a job of the same N requests, through spec -> plan -> dispatcher ->
   store -> results file (``runner.engine.run.execute``), checked against the server's ``/sim/stats``;
3. the ratio runner / bare SDK (target >= 70 %);
4. cache hits/s on a re-run of the same job on the same store (target >= 20,000/s), checked through
   ``runner.report.summary.build`` and the server's counters. The unchanged stage is replayed whole from the first
   run (runner/engine/replay.py), as a user's re-submit is; 4b is the same re-run with ``reuse=False`` (what
   ``--replan`` does), every request planned and looked up one by one: the path a re-run takes when the stage
   changed but most of its requests did not (a model added, a row appended);
5. peak RSS of a ``--rows``-row streamed job (rows cycling over 4 questions, so all but a handful of
   requests are served from the memo) run in a fresh subprocess (target <= 250 MB), its rows/s and the
   line count of its results file.

6. the runner's CPU per uncached request (the same job of N requests, each run in a fresh process that first
   warms up on its own small job, CPU measured around ``execute``) and, with ``--compare PATH`` (a checkout of
   another commit, e.g. ``git worktree add /tmp/wt-base HEAD~3``), the same for that checkout, run alternately
   (ABBA) with this one, and the ratio now / then (target <= 50 %, issue 25);
7. start-up: seconds from starting ``runner submit JOB`` to the first request reaching the server (the model
   probe) and to the first chat request, median of ``--startup`` runs (target <= 0.5 s to the first chat request
   on a quiet machine), through a relay in front of the server that notes when requests arrive; with
   ``--compare``, alternately for both checkouts.

Phases 1, 2 and 4 run ``--rounds`` times, interleaved (ABBA), after an untimed warm-up of both paths; each
figure is the rate over all rounds (requests / summed seconds), printed with every round's own figure, because
on a small shared machine a single round is noisy.

A script, not a test: pytest does not collect ``bench/``. (Over ~450 lines because it is one program whose five
phases share the server process, the job writers and the meters above; nothing imports it.) Every phase has a
timeout; the server subprocess is always stopped. ``--rows 0`` skips phase 5.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import selectors
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
#: the checkout whose runner a child process measures (phases 6 and 7 run the other one's with --compare)
CODE = Path(os.environ.get("BENCH_CODE") or ROOT).resolve()
if str(CODE) not in sys.path:
    sys.path.insert(0, str(CODE))

import yaml  # noqa: E402

if TYPE_CHECKING:
    import openai

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


def write_job(path: Path, name: str, dataset: Path, url: str, concurrency: int, out_dir: Path,
              shuffle: bool = True) -> None:
    job = {
        "name": name,
        "output_dir": str(out_dir),
        "models": [f"sim:{MODEL}"],
        "providers": {"sim": {"base_url": url, "concurrency": concurrency}},
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


# -- phase 1: the bare SDK ------------------------------------------------------------------------------

async def bare_sdk(url: str, n: int, concurrency: int, timeout: float, tag: str) -> tuple[int, float]:
    """N distinct requests through the SDK alone, ``concurrency`` worker tasks; returns (answers, seconds)."""
    import openai

    indices = iter(range(n))
    answered = 0

    async def worker(client: openai.AsyncOpenAI) -> None:
        nonlocal answered
        for i in indices:
            response = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": bare_prompt(i, tag)}],
                max_tokens=MAX_TOKENS, temperature=0,
            )
            if response.choices and response.choices[0].message.content:
                answered += 1

    async with asyncio.timeout(timeout):
        started = time.perf_counter()
        client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0,
                                    http_client=openai.DefaultAioHttpClient())
        try:
            await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        finally:
            await client.close()
        return answered, time.perf_counter() - started


# -- phases 2 and 4: the runner -------------------------------------------------------------------------

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


def stream_child(job_path: Path, store_path: Path, timeout: float) -> None:
    """Runs in the subprocess: execute the job, then print one JSON line with the peak RSS."""
    from runner.engine.run import execute
    from runner.spec.job import load_job
    from runner.store import open_store

    job = load_job(job_path)
    store = open_store(store_path)
    # imports, job and store: the floor under the peak
    before_kb = vm_hwm_kb() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    samples: list[tuple[float, int]] = []  # (seconds into execute, VmRSS kB): does memory grow with rows?

    async def sample(started: float) -> None:
        while True:
            samples.append((time.perf_counter() - started, proc_status_kb("VmRSS") or 0))
            await asyncio.sleep(1.0)

    async def go() -> tuple[Any, float]:
        async with asyncio.timeout(timeout):
            started = time.perf_counter()
            sampler = asyncio.create_task(sample(started))
            try:
                outcome = await execute(job, store)
            finally:
                sampler.cancel()
            return outcome, time.perf_counter() - started

    outcome, seconds = asyncio.run(go())
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    hwm = vm_hwm_kb()
    totals = outcome.stats.totals()
    store.close()
    print("STREAM " + json.dumps({
        "status": outcome.status, "message": outcome.message, "seconds": seconds,
        "hwm_kb_before": before_kb, "maxrss_kb": peak_kb, "vmhwm_kb": hwm,
        "done": totals.done, "cache_hits": totals.cache_hits, "sent": totals.sent, "errors": totals.errors,
        "results": {k: str(v) for k, v in (outcome.results or {}).items()},
        "rss_samples": samples,
    }), flush=True)


def run_stream(server: SimProcess, tmp: Path, rows: int, concurrency: int, timeout: float,
               out: Callable[[str], None]) -> bool:
    dataset = tmp / "stream.jsonl"
    started = time.perf_counter()
    write_jsonl(dataset, (cycling_row(i) for i in range(rows)))
    out(f"  (dataset of {rows:,} rows written in {time.perf_counter() - started:.1f} s, "
        f"{dataset.stat().st_size / 1e6:.0f} MB)")
    job_path = tmp / "stream.yaml"
    # shuffle off: every row of a question renders the same prompt, so only STREAM_QUESTIONS are sent
    write_job(job_path, "bench-stream", dataset, server.url, concurrency, tmp / "results", shuffle=False)
    store_path = tmp / "stream.sqlite"
    before = server.stats()
    command = [sys.executable, str(Path(__file__).resolve()), "--stream-child", "--job", str(job_path),
               "--store", str(store_path), "--timeout", str(timeout)]
    try:
        child = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        out(f"5. streamed job: TIMED OUT after {timeout + 60:.0f} s (use a smaller --rows or a larger "
            "--stream-timeout)")
        return False
    after = server.stats()
    lines = [line for line in child.stdout.splitlines() if line.startswith("STREAM ")]
    if child.returncode != 0 or not lines:
        out(f"5. streamed job: FAILED (exit {child.returncode})\n{child.stderr[-3000:]}")
        return False
    data = json.loads(lines[-1].removeprefix("STREAM "))
    results_path = Path(next(iter(data["results"].values())))
    result_lines = count_lines(results_path)
    sent = after["received"] - before["received"]
    old_digests = before["completed_by_digest"]
    prompts = sum(1 for k, v in after["completed_by_digest"].items() if v > old_digests.get(k, 0))
    # VmHWM is this process's own high-water mark. ru_maxrss is not: Linux carries the parent's RSS at fork
    # over the exec, so a child of a large parent reports at least the parent's size. VmHWM is the figure.
    peak_mb = (data["vmhwm_kb"] or data["maxrss_kb"]) / 1024
    ok = data["status"] == "completed" and result_lines == rows and data["done"] == rows
    out(f"5. streamed job rows:                {rows:,} (status {data['status']}, done {data['done']:,}, "
        f"cache hits {data['cache_hits']:,}; the server received {sent} requests for {prompts} distinct prompts)")
    out(f"5. streamed job peak RSS (VmHWM):    {peak_mb:.1f} MB ({data['hwm_kb_before'] / 1024:.1f} MB after "
        f"imports, job and store, before execute; ru_maxrss {data['maxrss_kb'] / 1024:.1f} MB, which Linux "
        f"floors at the parent's RSS at fork)  target <= {TARGET_RSS_MB:.0f} MB: "
        f"{'MET' if peak_mb <= TARGET_RSS_MB else 'MISSED'}")
    rss = data["rss_samples"]
    if rss:
        picks = [rss[min(len(rss) - 1, round(q * (len(rss) - 1)))] for q in (0, 0.25, 0.5, 0.75, 1)]
        out("5. streamed job RSS during execute: " + ", ".join(f"{kb / 1024:.0f} MB at {t:.0f} s" for t, kb in picks)
            + f" (max sampled {max(kb for _, kb in rss) / 1024:.0f} MB)")
    out(f"5. streamed job rows/s:              {rows / data['seconds']:,.0f} ({data['seconds']:.1f} s in execute)")
    out(f"5. streamed job results file:        {result_lines:,} lines, "
        f"{results_path.stat().st_size / 1e6:.0f} MB ({'OK' if result_lines == rows else 'WRONG COUNT'}); "
        f"store {store_path.stat().st_size / 1e6:.0f} MB")
    return ok and peak_mb <= TARGET_RSS_MB


# -- phase 6: CPU per uncached request, each checkout in a fresh process ---------------------------------

def cpu_child(job_path: Path, warm_path: Path, store_path: Path, timeout: float) -> None:
    """Runs in the subprocess: a warm-up job (imports, first-call caches), then the measured one; prints one JSON
    line with the CPU seconds of the measured ``execute`` and where ``runner`` was imported from."""
    import runner

    run_job(warm_path, store_path.with_name("warm.sqlite"), timeout)
    cpu0 = time.process_time()
    outcome, seconds = run_job(job_path, store_path, timeout)
    cpu = time.process_time() - cpu0
    totals = outcome.stats.totals()
    print("CPU " + json.dumps({"status": outcome.status, "seconds": seconds, "cpu": cpu, "sent": totals.sent,
                               "done": totals.done, "runner": str(Path(runner.__file__).resolve().parent.parent),
                               "results": str(next(iter((outcome.results or {}).values())))}), flush=True)


def child_env(code: Path) -> dict[str, str]:
    return {**os.environ, "BENCH_CODE": str(code), "PYTHONPATH": str(code)}


def phase_cpu(server: SimProcess, tmp: Path, code: Path, n: int, warmup: int, concurrency: int, timeout: float,
              tag: str) -> dict[str, Any]:
    """One measured run of ``code``'s runner in a fresh process: CPU seconds per request and requests/s."""
    folder = tmp / tag
    folder.mkdir()
    jobs = []
    for name, count in (("warm", max(warmup, 1)), ("job", n)):
        dataset = folder / f"{name}.jsonl"
        write_jsonl(dataset, (distinct_row(i, f"{tag}-{name}") for i in range(count)))
        write_job(folder / f"{name}.yaml", f"bench-cpu-{name}", dataset, server.url, concurrency, folder / name)
        jobs.append(folder / f"{name}.yaml")
    before = server.stats()
    command = [sys.executable, str(Path(__file__).resolve()), "--cpu-child", "--job", str(jobs[1]), "--warm-job",
               str(jobs[0]), "--store", str(folder / "store.sqlite"), "--timeout", str(timeout)]
    child = subprocess.run(command, cwd=code, env=child_env(code), capture_output=True, text=True,
                           timeout=2 * timeout + 60)
    lines = [line for line in child.stdout.splitlines() if line.startswith("CPU ")]
    if child.returncode != 0 or not lines:
        raise SystemExit(f"CPU run of {code}: exit {child.returncode}\n{child.stderr[-3000:]}")
    data = json.loads(lines[-1].removeprefix("CPU "))
    served = completed(server.stats()) - completed(before)
    if data["runner"] != str(code) or data["status"] != "completed" or data["sent"] != n or served != n + warmup \
            or count_lines(Path(data["results"])) != n:
        raise SystemExit(f"CPU run of {code}: {data}, the server completed {served}; expected {n} + {warmup} "
                         f"requests by the runner under {code}")
    return {"cpu_ms": 1000 * data["cpu"] / n, "rps": n / data["seconds"]}


# -- phase 7: start-up, from `runner submit` to the first request ----------------------------------------

class FirstRequestRelay:
    """A TCP relay in front of the simulated server that notes when the first request and the first chat request
    arrive (``time.perf_counter``, comparable with this process's own start times)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.first_any: float | None = None
        self.first_chat: float | None = None
        #: the process sending (its CPU seconds are read when its first chat request arrives), and those seconds
        self.sender: int | None = None
        self.sender_cpu: float | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self, sender: int | None = None) -> None:
        self.first_any = self.first_chat = self.sender_cpu = None
        self.sender = sender

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pump, args=(inbound, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, inbound, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, requests: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if requests:
                    seen = time.perf_counter()
                    if self.first_any is None:
                        self.first_any = seen
                    if self.first_chat is None and b"POST " in data and b"/chat/completions" in data:
                        self.first_chat = seen
                        if self.sender is not None:
                            with contextlib.suppress(OSError):
                                self.sender_cpu = process_cpu_seconds(self.sender)
                target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def phase_startup(relay: FirstRequestRelay, tmp: Path, code: Path, rows: int, timeout: float,
                  tag: str) -> tuple[float, float, float]:
    """One ``runner submit`` of a ``rows``-row job under ``code``, as a user types it, against the relay; returns
    the seconds to the first request and to the first chat request, and the CPU seconds the process had used
    when its first chat request arrived (what a busy machine does not stretch)."""
    folder = tmp / tag
    folder.mkdir()
    dataset = folder / "rows.jsonl"
    write_jsonl(dataset, (distinct_row(i, tag) for i in range(rows)))
    job = folder / "job.yaml"
    write_job(job, "bench-startup", dataset, relay.url, 8, folder / "results")
    command = [sys.executable, "-c", "import sys; from runner.cli import main; sys.exit(main())", "submit",
               str(job), "--db", str(folder / "store.sqlite")]
    relay.reset()
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=folder, env=child_env(code), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    relay.sender = child.pid
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        stdout, stderr = child.communicate()
    if child.returncode != 0 or relay.first_any is None or relay.first_chat is None or relay.sender_cpu is None:
        raise SystemExit(f"runner submit under {code}: exit {child.returncode}\n{stdout[-2000:]}{stderr[-2000:]}")
    return relay.first_any - started, relay.first_chat - started, relay.sender_cpu


# -- the whole benchmark --------------------------------------------------------------------------------

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


def phase_bare(server: SimProcess, n: int, concurrency: int, timeout: float, tag: str) -> tuple[float, Meter]:
    before = server.stats()
    with Meter(server) as m:
        answered, seconds = asyncio.run(bare_sdk(server.url, n, concurrency, timeout, tag))
    served = completed(server.stats()) - completed(before)
    if answered != n or served != n:
        raise SystemExit(f"bare SDK: {answered} answers, server completed {served}; expected {n}")
    return seconds, m


def phase_runner(server: SimProcess, tmp: Path, n: int, concurrency: int, timeout: float,
                 tag: str) -> tuple[float, Meter, Path, Path, int]:
    """A fresh job and store under ``tmp/tag``; returns (seconds, meter, job, store, result lines)."""
    folder = tmp / tag
    folder.mkdir()
    dataset = folder / "rows.jsonl"
    write_jsonl(dataset, (distinct_row(i, tag) for i in range(n)))
    job_path = folder / "job.yaml"
    write_job(job_path, "bench-throughput", dataset, server.url, concurrency, folder / "results")
    store_path = folder / "store.sqlite"
    before = server.stats()
    with Meter(server) as m:
        outcome, seconds = run_job(job_path, store_path, timeout)
    after = server.stats()
    received = after["received"] - before["received"]
    served = completed(after) - completed(before)
    result_lines = count_lines(next(iter((outcome.results or {}).values())))
    if outcome.status != "completed" or received != n or served != n or result_lines != n:
        raise SystemExit(f"runner: status {outcome.status} ({outcome.message}), server received {received}, "
                         f"completed {served}, results lines {result_lines}; expected {n}")
    return seconds, m, job_path, store_path, result_lines


def phase_hits(server: SimProcess, job_path: Path, store_path: Path, n: int, timeout: float,
               reuse: bool = True) -> tuple[float, Meter]:
    before = server.stats()
    with Meter(server) as m:
        outcome, seconds = run_job(job_path, store_path, timeout, reuse)
    received = server.stats()["received"] - before["received"]
    totals = report_totals(store_path, outcome.run_id)
    if outcome.status != "completed" or totals["cache_hits"] != n or totals["done"] != n or received != 0:
        raise SystemExit(f"re-run: status {outcome.status}, report cache_hits {totals['cache_hits']}, "
                         f"server received {received}; expected {n} hits and no request")
    return seconds, m


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="requests in phases 1, 2 and 4")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the streamed job (0 skips it)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of phases 1, 2 and 4 (interleaved, ABBA; rates over all rounds are reported)")
    parser.add_argument("--warmup", type=int, default=500, help="untimed requests through each path first")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed for each timed phase")
    parser.add_argument("--stream-timeout", type=float, default=1500.0, help="seconds allowed for phase 5")
    parser.add_argument("--tmp", default=None, help="parent folder of the temporary directory")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--compare", type=Path, default=None, metavar="PATH",
                        help="another checkout (a git worktree of an earlier commit) measured in phases 6 and 7 "
                             "alternately with this one")
    parser.add_argument("--startup", type=int, default=5, help="runs of `runner submit` per checkout in phase 7")
    parser.add_argument("--startup-rows", type=int, default=20, help="rows of phase 7's job")
    parser.add_argument("--only", default="main,cpu,startup",
                        help="the phases to run, comma-separated: main (1-5), cpu (6), startup (7)")
    parser.add_argument("--stream-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpu-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--warm-job", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.n < 1 or args.rounds < 1 or args.concurrency < 1 or args.rows < 0 or args.warmup < 0 \
            or args.startup < 1 or args.startup_rows < 1:
        parser.error("--n, --rounds, --concurrency, --startup and --startup-rows must be at least 1; --rows and "
                     "--warmup at least 0")
    only = {part.strip() for part in args.only.split(",") if part.strip()}
    if not only or only - {"main", "cpu", "startup"}:
        parser.error("--only takes main, cpu and startup, comma-separated")
    if args.compare is not None and not (args.compare / "runner" / "__init__.py").is_file():
        parser.error(f"--compare {args.compare}: no runner package there; give a checkout of the project "
                     "(git worktree add /tmp/wt-base COMMIT)")

    if args.stream_child:
        stream_child(Path(args.job), Path(args.store), args.timeout)
        return 0
    if args.cpu_child:
        cpu_child(Path(args.job), Path(args.warm_job), Path(args.store), args.timeout)
        return 0

    def out(text: str) -> None:
        print(text, flush=True)

    n, concurrency = args.n, args.concurrency
    out(f"versions: {versions()}")
    out(f"code: {code_state()}; runner and simserver imported from {ROOT}")
    out(f"settings: n={n:,} rows={args.rows:,} concurrency={concurrency} rounds={args.rounds} "
        f"warmup={args.warmup} date={time.strftime('%Y-%m-%d %H:%M:%S %Z')} "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-throughput-", dir=args.tmp))
    server = SimProcess()
    all_met = True
    try:
        out(f"server: {server.url} (pid {server.proc.pid})")
        if "main" in only:
            all_met &= run_main(args, server, tmp, out)
        else:
            out("1-5. skipped (--only)")
        sides = [("now", ROOT)] + ([("then", args.compare.resolve())] if args.compare is not None else [])
        if "cpu" in only:
            all_met &= run_cpu(args, server, tmp, sides, out)
        if "startup" in only:
            all_met &= run_startup(args, server, tmp, sides, out)
        out(f"all targets met: {'yes' if all_met else 'no'}")
        out(f"load average at the end (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        out(f"code at the end: {code_state()}")
        return 0
    finally:
        server.stop()
        if args.keep:
            out(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run_main(args: argparse.Namespace, server: SimProcess, tmp: Path, out: Callable[[str], None]) -> bool:
    """Phases 1-5."""
    n, concurrency = args.n, args.concurrency
    all_met = True
    if args.warmup > 0:
        # first calls pay for lazy imports and caches in the SDK, pydantic and jinja2: not measured
        phase_bare(server, args.warmup, concurrency, args.timeout, "warmup-bare")
        phase_runner(server, tmp, args.warmup, concurrency, args.timeout, "warmup-runner")
        out(f"warm-up: {args.warmup} requests through the bare SDK and {args.warmup} through the runner")

    bare_rps: list[float] = []
    runner_rps: list[float] = []
    hits_rps: list[float] = []
    planned_rps: list[float] = []

    def load() -> str:
        return f"load {os.getloadavg()[0]:.2f}"

    for r in range(1, args.rounds + 1):
        # ABBA order: odd rounds measure the bare SDK first, even rounds the runner first, so a slow drift
        # in background load does not favour one side
        for side in ("bare", "runner") if r % 2 else ("runner", "bare"):
            if side == "bare":
                seconds, m = phase_bare(server, n, concurrency, args.timeout, f"bare-{r}")
                bare_rps.append(n / seconds)
                out(f"   round {r} bare SDK:   {n / seconds:8,.0f} requests/s ({n:,} in {seconds:.2f} s; "
                    f"CPU: bench {m.cpu:.1f} s, server {m.server_cpu:.1f} s; {load()})")
                continue
            seconds, m, job_path, store_path, lines = phase_runner(server, tmp, n, concurrency, args.timeout,
                                                                   f"runner-{r}")
            runner_rps.append(n / seconds)
            out(f"   round {r} runner:     {n / seconds:8,.0f} requests/s ({n:,} in {seconds:.2f} s; status "
                f"completed, server completed {n:,}, {lines:,} result lines; "
                f"CPU: bench {m.cpu:.1f} s, server {m.server_cpu:.1f} s; {load()})")
            seconds, m = phase_hits(server, job_path, store_path, n, args.timeout)
            hits_rps.append(n / seconds)
            out(f"   round {r} cache hits: {n / seconds:8,.0f} hits/s ({n:,} in {seconds:.2f} s; report "
                f"cache_hits {n:,}, server received 0; CPU: bench {m.cpu:.1f} s; {load()})")
            seconds, m = phase_hits(server, job_path, store_path, n, args.timeout, reuse=False)
            planned_rps.append(n / seconds)
            out(f"   round {r} hits, planned one by one: {n / seconds:8,.0f} hits/s ({n:,} in {seconds:.2f} s; "
                f"report cache_hits {n:,}, server received 0; CPU: bench {m.cpu:.1f} s; {load()})")

    # Each figure is requests over the seconds summed over all rounds (the rate of one long interleaved
    # run); the median and range of the rounds show the noise.
    total = n * args.rounds

    def overall(rates: list[float]) -> float:
        return total / sum(n / rate for rate in rates)

    def spread(rates: list[float]) -> str:
        return f"median {median(rates):,.0f}, rounds {min(rates):,.0f}-{max(rates):,.0f}"

    bare, runner, hits = overall(bare_rps), overall(runner_rps), overall(hits_rps)
    out(f"1. bare SDK requests/s:              {bare:,.0f} ({total:,} requests in {args.rounds} rounds; "
        f"{spread(bare_rps)})")
    out(f"2. runner uncached requests/s:       {runner:,.0f} ({total:,} requests in {args.rounds} rounds; "
        f"{spread(runner_rps)}; every run completed, the server counted {n:,} completions each)")
    ratio = runner / bare
    ratios = [x / b for x, b in zip(runner_rps, bare_rps, strict=True)]
    met = ratio >= TARGET_RATIO
    all_met &= met
    out(f"3. runner / bare SDK:                {100 * ratio:.1f} % (median of the rounds' ratios "
        f"{100 * median(ratios):.1f} %, rounds {100 * min(ratios):.0f}-{100 * max(ratios):.0f} %)  "
        f"target >= {100 * TARGET_RATIO:.0f} %: {'MET' if met else 'MISSED'}")
    met = hits >= TARGET_HITS_PER_S
    all_met &= met
    out(f"4. cache hits/s (re-run):            {hits:,.0f} ({spread(hits_rps)}; each re-run: report "
        f"cache_hits == {n:,}, server received 0; the unchanged stage replayed whole)  "
        f"target >= {TARGET_HITS_PER_S:,.0f}/s: {'MET' if met else 'MISSED'}")
    out(f"4b. cache hits/s, planned one by one: {overall(planned_rps):,.0f} ({spread(planned_rps)}; "
        "reuse=False, as `--replan`: every request planned, looked up, parsed and recorded)")

    if args.rows > 0:
        all_met &= run_stream(server, tmp, args.rows, concurrency, args.stream_timeout, out)
    else:
        out("5. streamed job: skipped (--rows 0)")
    return all_met


def abba(sides: list[tuple[str, Path]], rounds: int) -> Iterator[tuple[int, str, Path]]:
    """(round, side, checkout) with the sides' order reversed every other round."""
    for r in range(1, rounds + 1):
        for name, code in sides if r % 2 else sides[::-1]:
            yield r, name, code


def run_cpu(args: argparse.Namespace, server: SimProcess, tmp: Path, sides: list[tuple[str, Path]],
            out: Callable[[str], None]) -> bool:
    """Phase 6: CPU per uncached request of each checkout, fresh processes, ABBA rounds."""
    figures: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in sides}
    for r, name, code in abba(sides, args.rounds):
        got = phase_cpu(server, tmp, code, args.n, args.warmup, args.concurrency, args.timeout, f"cpu-{name}-{r}")
        figures[name].append(got)
        out(f"   round {r} {name} ({code}): {got['cpu_ms']:.3f} ms CPU per request, {got['rps']:,.0f} requests/s "
            f"(load {os.getloadavg()[0]:.2f})")
    for name, code in sides:
        cpu = [f["cpu_ms"] for f in figures[name]]
        out(f"6. CPU per uncached request, {name}: {median(cpu):.3f} ms (median of {len(cpu)}; rounds "
            f"{min(cpu):.3f}-{max(cpu):.3f}; {median([f['rps'] for f in figures[name]]):,.0f} requests/s) "
            f"[{code}]")
    if len(sides) < 2:
        return True
    ratios = [a["cpu_ms"] / b["cpu_ms"] for a, b in zip(figures["now"], figures["then"], strict=True)]
    ratio = median([f["cpu_ms"] for f in figures["now"]]) / median([f["cpu_ms"] for f in figures["then"]])
    met = ratio <= 0.5
    out(f"6. CPU per request now / then:      {100 * ratio:.1f} % (rounds {100 * min(ratios):.0f}-"
        f"{100 * max(ratios):.0f} %)  target <= 50 %: {'MET' if met else 'MISSED'}")
    return met


def run_startup(args: argparse.Namespace, server: SimProcess, tmp: Path, sides: list[tuple[str, Path]],
                out: Callable[[str], None]) -> bool:
    """Phase 7: seconds from `runner submit` to the first request and the first chat request, ABBA runs."""
    for _, code in sides:
        # as pip's install does: with PYTHONDONTWRITEBYTECODE set (as on the machine this was written on) every
        # start would otherwise compile each module changed since its .pyc was written, or all of a fresh checkout
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(code / "runner")], check=True, timeout=600,
                       stdout=subprocess.DEVNULL)
    out(f"   runner/ compiled to bytecode in {', '.join(str(code) for _, code in sides)} (python -m compileall)")
    relay = FirstRequestRelay(int(server.url.rsplit(":", 1)[1].split("/")[0]))
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in sides}
    try:
        for r, name, code in abba(sides, args.startup):
            got = phase_startup(relay, tmp, code, args.startup_rows, args.timeout, f"startup-{name}-{r}")
            figures[name].append(got)
            out(f"   run {r} {name}: first request {got[0]:.3f} s, first chat request {got[1]:.3f} s, CPU by then "
                f"{got[2]:.2f} s (load {os.getloadavg()[0]:.2f})")
    finally:
        relay.close()
    met = True
    for name, code in sides:
        first = median([f[0] for f in figures[name]])
        chat = median([f[1] for f in figures[name]])
        cpu = median([f[2] for f in figures[name]])
        verdict = ""
        if name == "now":
            met = chat <= 0.5
            verdict = f"  target <= 0.5 s: {'MET' if met else 'MISSED'}"
        out(f"7. start-up, {name}: first request {first:.3f} s, first chat request {chat:.3f} s, CPU by then "
            f"{cpu:.2f} s (medians of {len(figures[name])}; `runner submit` of a {args.startup_rows}-row job; the "
            f"CPU figure has a resolution of 0.01 s) [{code}]{verdict}")
    return met


if __name__ == "__main__":
    sys.exit(main())

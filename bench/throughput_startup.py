"""Phase 7 of ``bench/throughput.py``: start-up, the seconds from ``runner submit JOB`` to the first request
reaching the server and to the first chat request (and the CPU the process used by then), through a relay in front
of the server that notes when requests arrive (:class:`FirstRequestRelay`); with ``--compare``, both checkouts in
turn.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.throughput_common import (
    SimProcess,
    abba,
    child_env,
    distinct_row,
    median,
    process_cpu_seconds,
    write_job,
    write_jsonl,
)


class FirstRequestRelay:
    """A TCP relay in front of the simulated server that notes when the first request and the first chat request
    arrive (``time.perf_counter``, comparable with this process's own start times)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.first_any: float | None = None
        self.first_chat: float | None = None
        #: what marks the first answer request in a request's bytes (its path; bench/startup_providers.py sets
        #: each provider's)
        self.chat_marker = b"/chat/completions"
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
                    if self.first_chat is None and b"POST " in data and self.chat_marker in data:
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
    return timed_submit(relay, command, folder, child_env(code), timeout, f"under {code}")


def timed_submit(relay: FirstRequestRelay, command: list[str], cwd: Path, env: dict[str, str], timeout: float,
                 what: str) -> tuple[float, float, float]:
    """Run ``command`` (a ``runner submit``) against the relay: the seconds to its first request and to its first
    answer request, and the CPU seconds the process had used when that arrived; a failed run ends the benchmark
    with its output (``what`` names it)."""
    relay.reset()
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    relay.sender = child.pid
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        stdout, stderr = child.communicate()
    if child.returncode != 0 or relay.first_any is None or relay.first_chat is None or relay.sender_cpu is None:
        raise SystemExit(f"runner submit {what}: exit {child.returncode}\n{stdout[-2000:]}{stderr[-2000:]}")
    return relay.first_any - started, relay.first_chat - started, relay.sender_cpu


# -- the whole benchmark --------------------------------------------------------------------------------


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

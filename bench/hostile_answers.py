"""Peak memory and time of one request against a hostile server, at the default bounds (64 MiB an answer, 600 s
in all, 60 s between reads), on each path that reads answers: issue 41's reproductions (an endless body, a 1 MiB
gzip answer that inflates to 1 GiB, a slow trickle, a reset) after the bounds.

Each case runs in a child process of its own, which sends one request through one provider and prints its error
class; the parent reads the child's peak RSS (``os.wait4``'s ``ru_maxrss`` of that child) and its wall time. The child's
baseline (the interpreter, the runner and the path's SDK imported, a request answered ``{}`` at once) is measured the
same way, so the answer's own share is the difference. The trickle sends a byte every 50 ms with
``total_timeout: 5`` (the default 600 s would take ten minutes to show the same bound).

    python bench/hostile_answers.py [--paths "lean openai,openai SDK"]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from devservers.hostile import MIB, HostileServer  # noqa: E402

PATHS = ["lean openai", "openai SDK", "lean anthropic", "anthropic SDK", "google-genai", "boto3"]
CASES = ["baseline", "endless", "bomb", "trickle", "reset"]

CHILD = r'''
import asyncio, json, os, sys, time
from typing import ClassVar
sys.path.insert(0, os.getcwd())
os.environ.update(ANTHROPIC_API_KEY="k", GEMINI_API_KEY="k", AWS_ACCESS_KEY_ID="AKIATEST", AWS_SECRET_ACCESS_KEY="s",
                  AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
from runner.providers.base import ProviderSettings
path, url, case = sys.argv[1], sys.argv[2], sys.argv[3]
extra = {"total_timeout": 5.0} if case == "trickle" else {}
def provider():
    if path in ("lean openai", "openai SDK"):
        from runner.providers.openai_servers import SimProvider
        class SDK(SimProvider):
            lean_wire: ClassVar[bool] = False
        return (SimProvider if path == "lean openai" else SDK)(ProviderSettings(base_url=url + "/v1", **extra)), "m"
    if path in ("lean anthropic", "anthropic SDK"):
        from runner.providers.anthropic_messages import AnthropicProvider
        class SDK(AnthropicProvider):
            lean_wire: ClassVar[bool] = False
        cls = AnthropicProvider if path == "lean anthropic" else SDK
        return cls(ProviderSettings(base_url=url, **extra)), "claude-haiku-4-5"
    if path == "google-genai":
        from runner.providers.gemini import GeminiProvider
        return GeminiProvider(ProviderSettings(base_url=url, **extra)), "gemini-2.5-flash"
    from runner.providers.bedrock import BedrockProvider
    return BedrockProvider(ProviderSettings(base_url=url, **extra)), "amazon.nova-pro-v1:0"
async def main():
    p, model = provider()
    await p.start()
    try:
        await p.execute(model, [{"role": "user", "content": "hi"}], {"max_tokens": 5})
        print("answered")
    except Exception as exc:
        print(getattr(exc, "error_class", type(exc).__name__))
    finally:
        await p.aclose()
asyncio.run(main())
'''


async def main(paths: list[str]) -> None:
    # about 1 MiB that inflates to 1 GiB; a trickle longer than its 5 s
    server = HostileServer(bomb=1024 * MIB, chunk=MIB, trickle=100_000)
    url = await server.start()
    print(f"python {sys.version.split()[0]}, pid {os.getpid()}; bomb {len(server.bomb) / MIB:.2f} MiB -> 1 GiB")
    print("| path | case | error class | seconds | peak RSS of the child (MiB) |")
    print("|---|---|---|---:|---:|")
    for path in paths:
        for case in CASES:
            error, seconds, peak = await measure(url, path, case, server)
            print(f"| {path} | {case} | {error} | {seconds:.1f} | {peak:.0f} |", flush=True)
    server.close()


async def measure(url: str, path: str, case: str, server: HostileServer) -> tuple[str, float, float]:
    """One case in a child of its own: what it printed, its seconds, and its peak RSS in MiB (``wait4``'s
    accounting of that child alone)."""
    server.mode = "empty" if case == "baseline" else case
    began = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", CHILD, path, url, case], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
    assert child.stdout is not None
    out = await asyncio.to_thread(child.stdout.read)
    _, status, usage = await asyncio.to_thread(os.wait4, child.pid, 0)
    seconds = time.monotonic() - began
    return out.decode().strip() or f"exit {status}", seconds, usage.ru_maxrss / 1024


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default=",".join(PATHS))
    asyncio.run(main(parser.parse_args().paths.split(",")))

"""Start-up per provider (issue 39 item 2): the seconds from ``runner submit JOB`` to the first request and to the
first answer request (chat completions, messages, generateContent, converse) reaching the simulated server, and
the CPU the process had used by then, for a job of one model of each provider; and ``runner --help``. Medians of
``--runs`` (5) per provider, the providers interleaved round by round.

    python bench/startup_providers.py [--runs 5] [--rows 20] [--providers sim,openai,...]

Each provider is pointed at one simulated server (``python -m simserver``) through a relay that notes when
requests arrive (bench/throughput_startup.py's :class:`FirstRequestRelay`); keys and credentials are made up and
come from the environment as a user's would (Vertex AI's from a service-account key file whose token endpoint is
the simulated server's). The target is 0.5 s to the first answer request for every provider and 0.15 s for
``runner --help``.

The runs share one memo of genai-prices' rates (runner/providers/price_memo.py) in the bench's temporary folder,
empty at the start: a provider's first run may look its price up in genai-prices (and write the memo), its later
runs read it, as a user's second command does. ``--cold-prices`` gives every run an empty memo of its own instead.
The memo of checked private keys (runner/providers/key_memo.py) is shared the same way, in the same folder: the
first Vertex run checks the made-up service account's RSA key whole, the later runs skip the check.

Seconds on a shared 2-core machine move by tens of percent from one run to the next. ``--instructions`` counts
instead what the process executes up to its first answer request, which repeats to about 0.1 %: each provider's
submit runs under valgrind (``--tool=cachegrind --cache-sim=no``) and ends as it is about to send that request
(bench/stop_at_first_answer.py), and valgrind's count is read; twice per provider, with an empty memo of prices
and of checked keys and then with the ones the first run wrote. Compare providers with each other and with
``sim:``, not with seconds.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bench.made_up_credentials import aws_environment, service_account  # noqa: E402
from bench.throughput_common import SimProcess, distinct_row, median, write_jsonl  # noqa: E402
from bench.throughput_startup import FirstRequestRelay, timed_submit  # noqa: E402

#: per provider: the model asked, what marks an answer request in its path, and its settings (``{root}``: the
#: relay's address without ``/v1``)
PROVIDERS: dict[str, tuple[str, bytes, dict[str, str]]] = {
    "sim": ("sim:gpt-4o-mini", b"/chat/completions", {"base_url": "{root}/v1"}),
    "openai": ("openai:gpt-4o-mini", b"/chat/completions", {"base_url": "{root}/v1"}),
    "azure-openai": ("azure-openai:gpt-4o-mini", b"/chat/completions",
                     {"base_url": "{root}/openai", "api_version": "2024-10-21"}),
    "anthropic": ("anthropic:claude-haiku-4-5", b"/v1/messages", {"base_url": "{root}"}),
    "gemini": ("gemini:gemini-2.0-flash", b":generateContent", {"base_url": "{root}"}),
    "vertex": ("vertex:gemini-2.0-flash", b":generateContent",
               {"base_url": "{root}", "project": "sim-project", "location": "us-east5"}),
    "bedrock": ("bedrock:amazon.nova-pro-v1:0", b"/converse", {"base_url": "{root}"}),
}

TARGET_FIRST_ANSWER = 0.5
TARGET_HELP = 0.15


def environment(folder: Path, root: str) -> dict[str, str]:
    """Made-up keys for every provider, from the environment as a user's; nothing of this machine's clouds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "CLOUDSDK_"))}
    env.update({
        "OPENAI_API_KEY": "sk-simulated", "ANTHROPIC_API_KEY": "sk-ant-simulated", "GEMINI_API_KEY": "simulated",
        "AZURE_OPENAI_API_KEY": "simulated", **aws_environment(folder),
        "CLOUDSDK_CONFIG": str(folder / "gcloud"), "NO_GCE_CHECK": "True",
        "GOOGLE_APPLICATION_CREDENTIALS": str(service_account(folder, root + "/token")),
        "PYTHONPATH": str(ROOT), "RUNNER_PRICE_MEMO": str(folder / "genai-prices-rates.json"),
        "RUNNER_KEY_MEMO": str(folder / "validated-keys.json"),
    })
    return env


def write_job(path: Path, provider: str, root: str, dataset: Path, out_dir: Path) -> None:
    model, _, settings = PROVIDERS[provider]
    job = {
        "name": f"startup-{provider}", "output_dir": str(out_dir), "models": [model],
        "providers": {provider: {key: value.format(root=root) for key, value in settings.items()}},
        "params": {"max_tokens": 5, "temperature": 0},
        "stages": [{"name": "mc", "dataset": {"path": str(dataset)}, "prompt": {"user": "{{ question }}"},
                    "choices": {"seeds": [0]}, "parse": "letter"}],
    }
    path.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")


def one_start(relay: FirstRequestRelay, provider: str, folder: Path, env: dict[str, str], rows: int,
              timeout: float, cold_prices: bool = False) -> tuple[float, float, float]:
    """One ``runner submit`` (the installed command, as a user types it): seconds to the first request and to the
    first answer request, and the CPU seconds the process had used when that arrived; with ``cold_prices``, with an
    empty memo of genai-prices' rates of its own."""
    folder.mkdir(parents=True)
    if cold_prices:
        env = {**env, "RUNNER_PRICE_MEMO": str(folder / "genai-prices-rates.json")}
    dataset = folder / "rows.jsonl"
    write_jsonl(dataset, (distinct_row(i, folder.name) for i in range(rows)))
    job = folder / "job.yaml"
    write_job(job, provider, relay.url.removesuffix("/v1"), dataset, folder / "results")
    relay.chat_marker = PROVIDERS[provider][1]
    command = [str(Path(sys.executable).parent / "runner"), "submit", str(job), "--db", str(folder / "store.sqlite")]
    return timed_submit(relay, command, folder, env, timeout, f"of a {provider} job")


def counted_start(relay: FirstRequestRelay, provider: str, folder: Path, env: dict[str, str], rows: int,
                  timeout: float, memo: Path) -> int:
    """Instructions one ``runner submit`` executes up to its first answer request, under valgrind, the process
    ended there by bench/stop_at_first_answer.py."""
    folder.mkdir(parents=True)
    dataset = folder / "rows.jsonl"
    write_jsonl(dataset, (distinct_row(i, folder.name) for i in range(rows)))
    job = folder / "job.yaml"
    write_job(job, provider, relay.url.removesuffix("/v1"), dataset, folder / "results")
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
               sys.executable, "-m", "bench.stop_at_first_answer", PROVIDERS[provider][1].decode(), "submit",
               str(job), "--db", str(folder / "store.sqlite")]
    done = subprocess.run(command, cwd=folder, env={**env, "RUNNER_PRICE_MEMO": str(memo), "PYTHONHASHSEED": "0",
                                                    "RUNNER_KEY_MEMO": str(memo.with_suffix(".keys.json"))},
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=timeout * 20)  # valgrind runs a program some 20-50 times slower
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or "first answer request" not in done.stderr or found is None:
        raise SystemExit(f"runner submit of a {provider} job under valgrind reached no answer request "
                         f"(exit {done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def instructions(relay: FirstRequestRelay, providers: list[str], tmp: Path, env: dict[str, str], rows: int,
                 timeout: float) -> int:
    """``--instructions``: each provider's count with an empty memo of prices and of checked keys, then with the
    ones it wrote."""
    print(f"{'provider':<14}{'first command':>16}{'later command':>16}{'later / sim':>13}")
    counts = {}
    for provider in providers:
        memo = tmp / f"{provider}-prices.json"
        counts[provider] = [counted_start(relay, provider, tmp / f"{provider}-{which}", env, rows, timeout, memo)
                            for which in ("cold", "warm")]
    for provider, (cold, warm) in counts.items():
        ratio = f"{warm / counts['sim'][1]:.2f}x" if "sim" in counts else "-"
        print(f"{provider:<14}{cold / 1e6:>14,.0f}M{warm / 1e6:>14,.0f}M{ratio:>13}")
    return 0


def help_seconds(runs: int) -> float:
    """The median wall seconds of ``runner --help``."""
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([str(Path(sys.executable).parent / "runner"), "--help"], check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - started)
    return median(walls)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--cold-prices", action="store_true",
                        help="every run with an empty memo of genai-prices' rates of its own (a first command)")
    parser.add_argument("--instructions", action="store_true",
                        help="instructions to the first answer request under valgrind instead of seconds")
    args = parser.parse_args()
    providers = args.providers.split(",")
    unknown = [name for name in providers if name not in PROVIDERS]
    if unknown:
        parser.error(f"unknown provider(s) {', '.join(unknown)}: choose among {', '.join(PROVIDERS)}")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "runner")], check=True,
                   stdout=subprocess.DEVNULL)  # as pip's install does
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions runs each submit under valgrind, which is not installed: apt-get install "
                     "valgrind")
    if args.instructions:
        print(f"instructions to the first answer request of a {args.rows}-row job under valgrind, each provider with "
              "an empty memo of prices and of checked keys (a first command), then with the ones it wrote (a later "
              "command)")
    else:
        print(f"load {os.getloadavg()[0]:.2f}; {args.runs} runs per provider of a {args.rows}-row job, interleaved; "
              f"{'every run with an empty memo of prices' if args.cold_prices else 'one memo of prices for all runs'}")
    server = SimProcess()
    relay = FirstRequestRelay(int(server.url.rsplit(":", 1)[1].split("/")[0]))
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in providers}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
            env = environment(Path(tmp), relay.url.removesuffix("/v1"))
            if args.instructions:
                return instructions(relay, providers, Path(tmp), env, args.rows, args.timeout)
            for r in range(args.runs):
                for provider in providers if r % 2 == 0 else reversed(providers):
                    got = one_start(relay, provider, Path(tmp) / f"{provider}-{r}", env, args.rows, args.timeout,
                                    args.cold_prices)
                    figures[provider].append(got)
        helped = help_seconds(args.runs)
    finally:
        relay.close()
        server.stop()
    met = helped <= TARGET_HELP
    print(f"{'provider':<14}{'first request':>15}{'first answer req.':>19}{'CPU by then':>13}  target "
          f"<= {TARGET_FIRST_ANSWER} s")
    for provider in providers:
        first, chat, cpu = (median([f[i] for f in figures[provider]]) for i in range(3))
        met = met and chat <= TARGET_FIRST_ANSWER
        print(f"{provider:<14}{first:>13.3f} s{chat:>17.3f} s{cpu:>11.2f} s  "
              f"{'MET' if chat <= TARGET_FIRST_ANSWER else 'MISSED'}")
    print(f"runner --help: {helped:.3f} s (median of {args.runs}; target <= {TARGET_HELP} s: "
          f"{'MET' if helped <= TARGET_HELP else 'MISSED'})")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""What the runner's planned prompt caching saves against sending as planned, and against the best possible
(issue 24's acceptance):

    python bench/prompt_cache.py [--stories 20] [--items 60] [--docs 3] [--latency 0.3] [--rpm 3000]
                                 [--bound-rpm 120] [--bound-docs 4]

Three jobs, each run twice per provider (``prompt_cache: off``, then ``auto``), through the official SDKs against
``simserver`` in its own process, which caches prompts as each API documents (simserver/prompt_cache.py) and
limits each model to ``--rpm`` requests a minute with ``--latency`` seconds per answer:

- **Know-No MC-Test**: the bundled job's with-gold stage (the paper's prompt: task, story, question, options) over
  the first ``--stories`` stories, four questions each, options shuffled under seeds 0, 1, 2;
- **WinoDict 5-shot**: the bundled build's items (``--items`` of them), each asked as a two-option question after
  its five solved examples (the paper's 5-shot context), seeds 0, 1, 2;
- **long context**: ``--docs`` documents of ~6,000 tokens (twelve MC-Test stories each), every question of their
  stories asked about the whole document; and the same with each document in the system message ("long ctx,
  system"), whose shared part is whole messages: Gemini's rows then store it as an explicit cached content
  (runner/engine/stored_prompts.py), and its "auto" includes the creation and storage the ledger charged.

Models: ``openai:gpt-4o``, ``anthropic:claude-opus-4-1`` and ``gemini:gemini-2.5-flash``, priced by genai-prices.
For each job and model the script prints the input cost of each run, the saving of ``auto`` over ``off``, and the
best saving: every repeat of a cacheable prefix read from the cache and each prefix written once, in the plan's
order (``runner.plan.prefixes.prefix_use`` with the server's token rule), priced at the same rates; the ratio
saving / best (goal: at least 0.90 where the best is not 0), and each run's wall time. Outputs are the same in both
runs (the server's answers depend on the prompt only), so the cost difference is the input's. A first, untimed run
warms the process up. Then, for throughput at the rate limit, the long-context job with ``--bound-docs`` documents
on ``openai:gpt-4o`` limited to ``--bound-rpm`` requests a minute (the server's bucket starts full, so the run is
bound by the limit once that burst is spent): off and auto, their wall times and auto / off.

A script, not a test: pytest does not collect ``bench/``. The server subprocess is always stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.mixed import SimProcess  # noqa: E402

MODELS = ("openai:gpt-4o", "anthropic:claude-opus-4-1", "gemini:gemini-2.5-flash")
KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}
MCTEST = ROOT / "runner" / "bundled" / "data" / "knowno" / "MCTest_1000.jsonl"
GOAL = 0.90


def post(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(url.removesuffix("/v1") + path, data=json.dumps(body or {}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def providers(url: str) -> dict[str, Any]:
    root = url.removesuffix("/v1")
    return {"openai": {"base_url": url, "timeout": 30}, "anthropic": {"base_url": root, "timeout": 30},
            "gemini": {"base_url": root, "timeout": 30}}


def stories(n: int) -> list[dict[str, Any]]:
    with open(MCTEST, encoding="utf-8") as lines:
        return [json.loads(line) for _, line in zip(range(n), lines, strict=False)]


def mctest_job(folder: Path, n: int) -> dict[str, Any]:
    data = folder / "mctest.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in stories(n)), encoding="utf-8")
    return {"name": "mctest", "params": {"temperature": 0, "top_p": 0.9, "max_tokens": 8}, "drop_unsupported": True,
            "stages": [{"name": "with-gold", "dataset": {"path": str(data), "id": "id", "explode": "question_list"},
                        "prompt": "knowno/mctest",
                        "choices": {"field": "options", "gold": "gold_option", "seeds": [0, 1, 2]},
                        "variants": {"style": ["with_gold"]}, "parse": "letter"}]}


def winodict_job(folder: Path, n: int) -> dict[str, Any]:
    from runner.engine.run import execute
    from runner.spec.job import load_job
    from runner.store import open_store

    build = folder / "build.yaml"
    build.write_text(json.dumps({
        "name": "winodict-build", "seed": 0,
        "stages": [{"name": "items", "dataset": {"path": "data/winodict/concepts.jsonl", "id": "id"},
                    "recipe": "winodict.items",
                    "args": {"buckets": ["prob1_of_5", "prob3_of_5", "prob5_of_5"], "strategy": "definition_last"},
                    "write": str(folder / "winodict.jsonl")}]}), encoding="utf-8")
    outcome = asyncio.run(execute(load_job(build), open_store(folder / "build.sqlite")))
    assert outcome.status == "completed", outcome.message
    items = (folder / "winodict.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    (folder / "items.jsonl").write_text("\n".join(items), encoding="utf-8")
    user = ("{% for example in examples[:5] %}{{ example }}\n\n{% endfor %}{{ definition_sentence }}\n{{ sentence }}"
            "\nWho or what does the blank (_) stand for?\n{{ options_block }}\nAnswer:")
    return {"name": "winodict", "params": {"temperature": 0, "max_tokens": 8},
            "stages": [{"name": "five-shot", "dataset": {"path": str(folder / "items.jsonl"), "id": "id"},
                        "prompt": {"system": "Answer with exactly one of \"A\" or \"B\", without explanation.",
                                   "user": user},
                        "choices": {"field": "options", "gold": "label", "seeds": [0, 1, 2]}, "parse": "letter"}]}


def longdoc_job(folder: Path, docs: int, *, in_system: bool = False) -> dict[str, Any]:
    """The long-context job; ``in_system``: each document in the system message, the question alone in the user
    message (the layout whose shared part is whole messages, which Gemini's explicit caching stores)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    source = stories(12 * docs)
    for d in range(docs):
        part = source[12 * d:12 * (d + 1)]
        document = "\n\n".join(story["story"] for story in part)
        for s, story in enumerate(part):
            for q, item in enumerate(story["question_list"]):
                rows.append({"id": f"d{d}s{s}q{q}", "document": document, "question": item["question"],
                             "options": item["options"], "gold": item["options"].index(item["gold_option"])})
    data = folder / "longdoc.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in rows), encoding="utf-8")
    instruction = "Answer with the letter of the right option only."
    prompt = {"system": instruction + "\n\nDocument:\n{{ document }}",
              "user": "Question: {{ question }}\n{{ options_block }}\nAnswer:"} if in_system else \
        {"system": instruction,
         "user": "Document:\n{{ document }}\n\nQuestion: {{ question }}\n{{ options_block }}\nAnswer:"}
    return {"name": "longdoc-system" if in_system else "longdoc", "params": {"temperature": 0, "max_tokens": 8},
            "stages": [{"name": "qa", "dataset": {"path": str(data), "id": "id"},
                        "prompt": prompt,
                        "choices": {"field": "options", "gold": "gold", "seeds": [0]}, "parse": "letter"}]}


def sim_count(model: str, messages: Any) -> int:
    from runner.providers.sim_tokens import count_prompt_tokens

    return count_prompt_tokens(list(messages))


def best_saving(job_path: Path, model: str) -> tuple[float, int]:
    """(USD, tokens read) of the best possible caching of the job's requests to ``model``, in plan order."""
    from runner.plan.prefixes import prefix_use
    from runner.plan.stage import StagePlan
    from runner.providers.pricing import PER, Pricing
    from runner.spec.job import load_job

    job = load_job(job_path)
    requests, seen = [], set()
    for stage in job.llm_stages():
        for task in StagePlan(job, stage):
            if task.model == model and task.key not in seen:  # an identical request is sent once
                seen.add(task.key)
                requests.append((model, task.call.messages))
    rates = Pricing(job).require(model)
    uses = prefix_use(requests, count=sim_count)
    read, written = sum(u.read for u in uses), sum(u.written for u in uses)
    return (read * (rates.input - rates.cached_input) - written * (rates.cache_write - rates.input)) / PER, read


def run(job: dict[str, Any], folder: Path, url: str, model: str, mode: str
        ) -> tuple[float, float, float, int, Path]:
    """(cost, the same answers' cost with no input read from a cache, wall seconds, requests sent, job path) of one
    run in a fresh store."""
    from runner.engine.run import execute
    from runner.providers.pricing import Pricing
    from runner.report import summary
    from runner.spec.job import load_job
    from runner.store import open_store

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.yaml"
    path.write_text(json.dumps({**job, "models": [model], "providers": providers(url), "prompt_cache": mode,
                                "output_dir": str(folder / "results")}), encoding="utf-8")
    post(url, "/sim/reset")
    store = open_store(folder / "store.sqlite")
    started = time.perf_counter()
    outcome = asyncio.run(execute(load_job(path), store))
    wall = time.perf_counter() - started
    assert outcome.status == "completed", outcome.message
    totals = summary.build(store, outcome.run_id)["totals"]
    rates = Pricing(load_job(path)).require(model)
    uncached = sum(rates.cost(r["input_tokens"], r["output_tokens"]) for r in store.responses())
    return totals["cost"], uncached, wall, totals["sent"], path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stories", type=int, default=20)
    parser.add_argument("--items", type=int, default=60)
    parser.add_argument("--docs", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.3)
    parser.add_argument("--rpm", type=int, default=3000)
    parser.add_argument("--bound-rpm", type=int, default=120)
    parser.add_argument("--bound-docs", type=int, default=4)
    args = parser.parse_args()
    for variable in KEYS.values():
        os.environ.setdefault(variable, "bench-key")
    server = SimProcess(args.latency)
    try:
        post(server.url, "/sim/config", {"rpm": args.rpm})
        with tempfile.TemporaryDirectory(prefix="bench-prompt-cache-") as tmp:
            base = Path(tmp)
            jobs = {"Know-No MC-Test": mctest_job(base, args.stories),
                    "WinoDict 5-shot": winodict_job(base, args.items),
                    "long context": longdoc_job(base, args.docs),
                    "long ctx, system": longdoc_job(base / "system", args.docs, in_system=True)}
            for model in MODELS:  # imports, each SDK's first client: not timed
                run(longdoc_job(base / "warm", 1), base / "warm" / model.replace(":", "-"), server.url, model, "off")
            print(f"latency {args.latency} s, {args.rpm} requests a minute per model; cost in USD; saved: against "
                  "the same answers with no input read from a cache")
            print(f"{'job':16} {'model':26} {'sent':>5} {'uncached':>9} {'off':>9} {'auto':>9} {'best':>9} "
                  f"{'off/best':>8} {'auto/best':>9} {'wall off':>8} {'wall auto':>9} {'auto/off':>8}")
            for name, job in jobs.items():
                for model in MODELS:
                    tag = f"{job['name']}-{model.replace(':', '-')}"
                    off, uncached, wall_off, sent, path = run(job, base / tag / "off", server.url, model, "off")
                    auto, _, wall_auto, _, _ = run(job, base / tag / "auto", server.url, model, "auto")
                    best, _ = best_saving(path, model)

                    def share(cost: float, best: float = best, uncached: float = uncached) -> str:
                        return f"{(uncached - cost) / best:.2f}" if best > 1e-9 else "-"

                    print(f"{name:16} {model:26} {sent:>5} {uncached:>9.4f} {off:>9.4f} {auto:>9.4f} "
                          f"{uncached - best:>9.4f} {share(off):>8} {share(auto):>9} {wall_off:>8.1f} "
                          f"{wall_auto:>9.1f} {wall_auto / wall_off:>8.2f}")
            post(server.url, "/sim/config", {"rpm": args.bound_rpm})
            bound = longdoc_job(base / "bound", args.bound_docs)
            walls = {mode: run(bound, base / "bound" / mode, server.url, MODELS[0], mode)[2]
                     for mode in ("off", "auto")}
            print(f"at {args.bound_rpm} requests a minute, long context ({args.bound_docs} documents) on {MODELS[0]}: "
                  f"wall off {walls['off']:.1f} s, auto {walls['auto']:.1f} s, "
                  f"auto/off {walls['auto'] / walls['off']:.2f}")
    finally:
        server.stop()
    print(f"best: the cost with every repeat of a cacheable prefix read from the cache; goal: auto/best (the share "
          f"of the best saving) >= {GOAL:.2f} where there is one ('-': no prefix reaches the provider's minimum); "
          "auto/off wall time about 1")


if __name__ == "__main__":
    main()

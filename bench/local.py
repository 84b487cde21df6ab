"""Time the embedded model (runner/providers/local.py) on the papers' four evaluation jobs, with and without prompt
prefix reuse, and check that reuse changes no answer.

    python bench/local.py                 # 2-item slices: old and new, interleaved request by request
    python bench/local.py --check         # and the new model again in other orders, compared with the old
    python bench/local.py --new-only --old-figures bench/local-old.json   # old figures from an earlier run

For each job the requests are the ones the runner sends (the stage plans, in dispatch order, identical requests
once). "old" is llama-cpp-python's ``Llama`` with ``reset()`` before every request, the provider's code before
prefix reuse; "new" is the provider as it ships. The two models are loaded side by side and each request goes to
one then the other, so both see the same machine load. Per job: prompt tokens per request, prompt tokens/s (all
prompt tokens, reused ones included, over the time to the first generated token: the rate a user sees), the
new model's share of prompt tokens reused and its rate over the tokens it evaluated, seconds per request,
requests/s, and the projected time of the 10-item slice (its request count times the seconds per request).

Every answer is compared with the old model's, by text and by a SHA-256 of every generation step's full logits
vector (bit for bit). ``--check`` then sends the same requests to a fresh new model in three more orders: all
four jobs shuffled together, everything reversed, and the first requests of each job twice in a row (a prompt
fully in the cache). The exit status is 1 if any answer or logits vector differs.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.plan.request import Task  # noqa: E402
from runner.plan.stage import StagePlan  # noqa: E402
from runner.providers.base import ProviderSettings  # noqa: E402
from runner.providers.local import LocalProvider  # noqa: E402
from runner.spec.job import load_job  # noqa: E402

JOBS = ["newterm-eval-2023", "newterm-eval-2022", "knowno-mctest", "knowno-bank77"]


def job_requests(name: str, limit: int) -> list[Task]:
    """The job's requests on a ``limit``-item slice, in the order the runner dispatches them, each key once."""
    job = load_job(ROOT / "jobs" / f"{name}.yaml")
    job.limit = limit
    seen: set[str] = set()
    out = []
    for stage in job.stages:
        for req in StagePlan(job, stage):
            if req.key not in seen:
                seen.add(req.key)
                out.append(req)
    return out


@dataclass
class Answer:
    text: str
    logits: str  # SHA-256 of every step's logits, in order
    prompt_tokens: int
    output_tokens: int
    prompt_seconds: float  # to the first generated token
    seconds: float
    reused: int


@dataclass
class Meter:
    """A provider whose model reports, per request, the time to its first token and a digest of its logits."""

    provider: LocalProvider
    answers: list[Answer] = field(default_factory=list)

    @classmethod
    async def start(cls, reuse_prefix: bool) -> Meter:
        provider = LocalProvider(ProviderSettings(), reuse_prefix=reuse_prefix)
        await provider.start()
        return cls(provider)

    async def ask(self, req: Task) -> Answer:
        import llama_cpp
        import numpy as np

        llm = self.provider.llm
        generate = type(llm).generate
        n_vocab = llm.n_vocab()
        digest = hashlib.sha256()
        first: list[float] = []
        reused_before = getattr(llm, "reused", 0)

        def metered(tokens: Any, *args: Any, **kwargs: Any) -> Any:
            for token in generate(llm, tokens, *args, **kwargs):
                if not first:
                    first.append(time.perf_counter())
                logits = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
                digest.update(np.ctypeslib.as_array(logits, shape=(n_vocab,)).tobytes())
                yield token

        llm.generate = metered
        try:
            started = time.perf_counter()
            done = await self.provider.execute(req.model_name, req.messages, req.call.params)
            ended = time.perf_counter()
        finally:
            del llm.generate
        answer = Answer(done.text, digest.hexdigest(), done.input_tokens, done.output_tokens,
                        (first[0] if first else ended) - started, ended - started,
                        getattr(llm, "reused", 0) - reused_before)
        self.answers.append(answer)
        return answer

    async def close(self) -> None:
        await self.provider.aclose()


def figures(answers: list[Answer]) -> dict[str, float]:
    n = len(answers)
    prompt = sum(a.prompt_tokens for a in answers)
    reused = sum(a.reused for a in answers)
    prompt_s = sum(a.prompt_seconds for a in answers)
    total_s = sum(a.seconds for a in answers)
    return {"requests": n, "prompt_tokens_per_request": prompt / n, "output_tokens_per_request":
            sum(a.output_tokens for a in answers) / n, "prompt_tokens_per_s": prompt / prompt_s,
            "reused_share": reused / prompt, "evaluated_tokens_per_s": (prompt - reused) / prompt_s,
            "s_per_request": total_s / n, "requests_per_s": n / total_s, "seconds": total_s}


def compare(reference: dict[str, Answer], got: dict[str, Answer]) -> tuple[int, int, int]:
    """(compared, answers differing, logits differing)."""
    keys = [k for k in got if k in reference]
    return (len(keys), sum(reference[k].text != got[k].text for k in keys),
            sum(reference[k].logits != got[k].logits for k in keys))


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=2, help="items per job (default 2)")
    ap.add_argument("--jobs", nargs="+", default=JOBS, choices=JOBS)
    ap.add_argument("--check", action="store_true", help="also run the new model in three other orders")
    ap.add_argument("--new-only", action="store_true", help="do not run the old model (no answer check)")
    ap.add_argument("--old-figures", type=Path,
                    help="with --new-only: read the old figures from this file; without: write them there")
    ap.add_argument("--projected-limit", type=int, default=10)
    args = ap.parse_args()
    os.chdir(ROOT)
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    plans = {name: job_requests(name, args.limit) for name in args.jobs}
    slice_sizes = {name: len(job_requests(name, args.projected_limit)) for name in args.jobs}

    new = await Meter.start(reuse_prefix=True)
    old = None if args.new_only else await Meter.start(reuse_prefix=False)
    reference: dict[str, Answer] = {}
    results: dict[str, dict[str, dict[str, float]]] = {}
    old_figures = (json.loads(args.old_figures.read_text()) if args.new_only and args.old_figures else {})
    differing = 0
    for name, reqs in plans.items():
        by_model: dict[str, list[Answer]] = {"old": [], "new": []}
        got: dict[str, Answer] = {}
        for i, req in enumerate(reqs):
            order = [("old", old), ("new", new)] if i % 2 == 0 else [("new", new), ("old", old)]
            for label, meter in order:
                if meter is None:
                    continue
                answer = await meter.ask(req)
                by_model[label].append(answer)
                (reference if label == "old" else got)[req.key] = answer
        results[name] = {label: figures(a) for label, a in by_model.items() if a}
        if "old" not in results[name] and name in old_figures:
            results[name]["old"] = old_figures[name]
        line = f"{name}: {len(reqs)} requests, {results[name]['new']['prompt_tokens_per_request']:.0f} prompt tokens"
        if old is not None:
            n, texts, logits = compare(reference, got)
            differing += texts + logits
            line += f"; answers differing from the old model: {texts} of {n}, logits differing: {logits} of {n}"
        print(line, flush=True)
    await new.close()
    if old is not None:
        await old.close()

    print(f"\n{'job':18} {'model':5} {'tok/req':>7} {'prompt tok/s':>12} {'reused':>6} {'eval tok/s':>10} "
          f"{'out/req':>7} {'s/req':>6} {'req/s':>6} {f'{args.projected_limit}-item slice':>16}")
    totals = {"old": 0.0, "new": 0.0}
    for name, per in results.items():
        for label in ("old", "new"):
            f = per.get(label)
            if not f:
                continue
            projected = slice_sizes[name] * f["s_per_request"]
            totals[label] += projected
            print(f"{name:18} {label:5} {f['prompt_tokens_per_request']:7.0f} {f['prompt_tokens_per_s']:12.0f} "
                  f"{f['reused_share']:6.0%} {f['evaluated_tokens_per_s']:10.0f} {f['output_tokens_per_request']:7.1f} "
                  f"{f['s_per_request']:6.2f} {f['requests_per_s']:6.2f} "
                  f"{slice_sizes[name]:5d} req {projected / 60:5.1f} min")
    for label, seconds in totals.items():
        if seconds:
            print(f"{args.projected_limit}-item slices of the {len(results)} jobs, {label}: "
                  f"{sum(slice_sizes.values())} requests, projected {seconds / 60:.1f} min")
    if old is not None and args.old_figures:
        args.old_figures.write_text(json.dumps({n: r["old"] for n, r in results.items()}, indent=1))

    if args.check and reference:
        everything = [req for reqs in plans.values() for req in reqs]
        twice = [req for reqs in plans.values() for req in reqs[:5] for _ in range(2)]
        orders = {"all jobs shuffled together": random.Random(1).sample(everything, len(everything)),
                  "everything reversed": everything[::-1],
                  "first 5 of each job twice in a row": twice}
        checker = await Meter.start(reuse_prefix=True)
        for label, reqs in orders.items():
            texts = logits = 0
            for req in reqs:
                answer = await checker.ask(req)
                texts += answer.text != reference[req.key].text
                logits += answer.logits != reference[req.key].logits
            differing += texts + logits
            print(f"check, {label}: answers differing from the old model's: {texts} of {len(reqs)}, "
                  f"logits differing: {logits} of {len(reqs)}", flush=True)
        await checker.close()
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

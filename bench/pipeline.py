"""Time the NewTerm construction pipeline (jobs/newterm-build.yaml) on the simulated server with the tests'
response script (5 terms): a first run, then a re-run of the unchanged job, which reuses every stage.

    python bench/pipeline.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.engine.run import execute  # noqa: E402
from runner.providers.base import ProviderSettings  # noqa: E402
from runner.spec.job import load_job  # noqa: E402
from runner.store import open_store  # noqa: E402
from simserver import start_server  # noqa: E402
from simserver.config import SimConfig  # noqa: E402

DATA = ROOT / "tests" / "data" / "newterm_build"


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with await start_server(SimConfig(script=str(DATA / "script.yaml"))) as server:
            store = open_store(Path(tmp) / "bench.sqlite")
            for label in ("first run", "unchanged re-run"):
                job = load_job(ROOT / "jobs" / "newterm-build.yaml", {
                    "model": "sim:gpt-sim", "terms": str(DATA / "terms.jsonl"), "out": f"{tmp}/benchmark"})
                job.providers = {"sim": ProviderSettings(base_url=server.url)}
                job.embeddings = "lexical"
                job.output_dir = f"{tmp}/results"
                started = time.perf_counter()
                outcome = await execute(job, store)
                elapsed = time.perf_counter() - started
                stages = store.run_stages(outcome.run_id)
                print(f"{label}: {outcome.status} in {elapsed:.2f} s; {sum(s.get('sent', 0) for s in stages)} "
                      f"requests sent; {sum(1 for s in stages if s['reused'])} of {len(stages)} stages reused")


if __name__ == "__main__":
    asyncio.run(main())

"""A seed's dataset and job file, written from its :class:`faultsim.draw.Scenario`: every model through the simulated
server, short timeouts and retries, the job's own prices, its budget if it drew one."""

from __future__ import annotations

import json
from pathlib import Path

from faultsim.draw import PRICE, Scenario

__all__ = ["HANG_SECONDS", "JOB_NAME", "MAX_ATTEMPTS", "STAGE", "write_job"]

JOB_NAME = "chaos"
STAGE = "mc"
#: a request's timeout in the runner: well above what a loaded machine takes to answer one (a request timed out
#: after the server answered it would be sent and billed again, and no runner can tell), and below a hang's length
TIMEOUT = 4.0
#: how long a ``fault_timeout`` hangs: past the runner's timeout, so the runner gives up on it first
HANG_SECONDS = 6.0
#: attempts a request gets before the runner gives up on it (server errors, timeouts)
MAX_ATTEMPTS = 10


def write_rows(path: Path, count: int) -> Path:
    with open(path, "w", encoding="utf-8") as out:
        for i in range(count):
            row = {"id": f"r{i}", "question": f"Question number {i}: which is right?",
                   "choices": [f"first {i}", f"second {i}", f"third {i}", f"fourth {i}"], "gold": i % 4}
            out.write(json.dumps(row) + "\n")
    return path


def write_job(folder: Path, scenario: Scenario, sim_url: str, results: Path) -> Path:
    """The job file of ``scenario`` in ``folder``, its results under ``results``; ``sim_url`` ends in ``/v1``."""
    dataset = write_rows(folder / "rows.jsonl", scenario.rows)
    root = sim_url.removesuffix("/v1")
    common = {"concurrency": scenario.concurrency, "timeout": TIMEOUT}
    job = {
        "name": JOB_NAME,
        "output_dir": str(results),
        "models": list(scenario.models),
        "providers": {"sim": {"base_url": sim_url, **common}, "openai": {"base_url": sim_url, **common},
                      "anthropic": {"base_url": root, **common}},
        "params": {"temperature": 0, "max_tokens": 5},
        "retry": {"max_attempts": MAX_ATTEMPTS, "backoff_initial": 0.01, "backoff_max": 0.1, "max_elapsed": 120},
        "prices": {model: PRICE for model in scenario.models},
        "mode": scenario.mode,
        "batch": {"poll_interval": 0.1, "max_requests": 1000, "max_resubmits": 2},
        "stages": [{"name": STAGE, "dataset": {"path": str(dataset)},
                    "prompt": {"system": "Answer with one letter.",
                               "user": "{{ question }}\n{{ options_block }}\nAnswer:"},
                    "choices": {"seeds": list(range(scenario.option_seeds)), "gold": "gold"}, "parse": "letter"}],
    }
    if scenario.budget is not None:
        job["budget"] = {"usd": scenario.budget}
    path = folder / "job.yaml"
    path.write_text(json.dumps(job, indent=1), encoding="utf-8")
    return path

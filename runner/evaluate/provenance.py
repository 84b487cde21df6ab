"""A result line's provenance (:func:`line_provenance`): what produced the lines of one stage and model. Its own
module, which the dispatcher imports when a run starts; the lines themselves, parsed and scored, are
runner/evaluate/results.py's, imported when the first is recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner.version import version

if TYPE_CHECKING:
    from runner.plan.prompts import Prompt

__all__ = ["line_provenance", "runner_version"]


def runner_version() -> str:
    """The runner's version naming the code that runs (:func:`runner.version.version`: in a git checkout, its
    commit now, even in an editable install made commits ago; asked once per process)."""
    return version()


def line_provenance(*, run_id: str, job_hash: str, prompt: Prompt, model_id: str,
                    params: dict[str, Any]) -> dict[str, Any]:
    """What produced the lines of one stage and model: ``params`` as they are sent (the cache key's; no key or
    header is ever among them)."""
    return {
        "run_id": run_id,
        "job_hash": job_hash,
        "prompt": {"name": prompt.name, "path": prompt.path, "sha256": prompt.sha256},
        "model_id": model_id,
        "params": params,
        "runner_version": runner_version(),
    }

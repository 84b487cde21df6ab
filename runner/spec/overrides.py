"""What a front door sets over the job file once it is loaded: ``--budget`` (:func:`set_budget`), from
``runner submit``, ``runner resume`` and the Python API's ``budget=``."""

from __future__ import annotations

from runner.errors import RunnerError
from runner.spec.schema import Job
from runner.spec.settings import JobBudget


def set_budget(job: Job, usd: float) -> None:
    """``--budget USD``: the run's USD limit, over what the job file says."""
    if not usd > 0:
        raise RunnerError(f"--budget must be more than 0 USD (got {usd:g})")
    if job.budget is None:
        job.budget = JobBudget(usd=usd)
    else:
        job.budget.usd = usd

"""Every bundled job, rendered for today's models of each provider and sent online and through the Batch APIs to
the strict simulated server (which refuses what the real APIs refuse: simserver/strict.py and the published
documents it checks against): not one request is refused.

Each job runs with the model swapped in (``--var model=…`` where the job has it, every stage's models otherwise),
``limit: 2`` and ``drop_unsupported: true``: the papers' jobs ask for temperature 0, which o3, GPT-5 and Claude Fable
do not take, and the runner leaves it out (and says so) instead of sending it. WinoDict's log-likelihood stage is left
out: no chat API scores log-likelihoods, and the runner refuses that before sending. A second test shows the same
jobs without ``drop_unsupported`` are refused by ``runner validate`` before anything is sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from runner.engine.run import execute
from runner.errors import JobFileError
from runner.spec.job import job_from_dict
from runner.store import open_store
from simserver import SimConfig, start_server

ROOT = Path(__file__).resolve().parents[2]
#: knowno-judge judges the no-hint answers of a knowno-mctest run: it comes after it
JOBS = sorted((path.name for path in (ROOT / "jobs").glob("*.yaml") if path.name != "winodict-build.yaml"),
              key=lambda name: (name == "knowno-judge.yaml", name))
#: the models of issue 19's acceptance list: for Anthropic a Claude 3.5, a Claude 4.5 and the newest family
#: genai-prices knows (Claude Fable 5.2)
MODELS = {
    "openai": ["gpt-4o", "gpt-5", "o3"],
    "anthropic": ["claude-3-5-haiku-20241022", "claude-sonnet-4-5", "claude-fable-5-2"],
    "gemini": ["gemini-2.0-flash", "gemini-2.5-pro"],
}
#: each provider's first model in the fast path (`-m "not slow"`), its others in the whole suite only: the same jobs
#: through the same provider code, a few seconds each
MATRIX = [pytest.param(f"{provider}:{model}", marks=() if index == 0 else pytest.mark.slow)
          for provider, models in MODELS.items() for index, model in enumerate(models)]


pytestmark = pytest.mark.usefixtures("provider_keys")


@pytest.fixture(scope="module")
def winodict_items(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """WinoDict items from the build job (a data stage: no request)."""
    import asyncio

    folder = tmp_path_factory.mktemp("winodict")
    data = yaml.safe_load((ROOT / "jobs" / "winodict-build.yaml").read_text())
    data["output_dir"] = str(folder / "results")
    job = job_from_dict(data, {"out": str(folder / "items.jsonl")} if "out" in (data.get("vars") or {}) else None,
                        base_dir=ROOT)
    job.limit = 4
    outcome = asyncio.run(execute(job, open_store(folder / "s.sqlite")))
    assert outcome.status == "completed"
    found = sorted(folder.rglob("*.jsonl"))
    items = next(path for path in found if "winodict" in path.name and path.stat().st_size > 0)
    return items


def rendered(name: str, model: str, base: str, mode: str, out: Path, items: Path, *, drop: bool = True,
             answers: Path | None = None) -> dict[str, Any]:
    """The bundled job ``name`` as a dict, for ``model`` on the server at ``base``."""
    data = yaml.safe_load((ROOT / "jobs" / name).read_text())
    provider = model.split(":")[0]
    variables = dict(data.get("vars") or {})
    for key in ("model", "chat_model", "judge"):
        if key in variables:
            variables[key] = model
    if "items" in variables:
        variables["items"] = str(items)
    if "answers" in variables and answers is not None:
        variables["answers"] = str(answers)
    data["vars"] = variables
    data["models"] = [model]
    data["stages"] = [stage for stage in data["stages"] if stage.get("parse") != "loglikelihood"]
    for stage in data["stages"]:
        if "models" in stage:
            stage["models"] = [model]
    data.pop("report", None)
    data["providers"] = {provider: {"base_url": base, "timeout": 10}}
    data["drop_unsupported"] = drop
    data["limit"] = 2
    data["mode"] = mode
    data["batch"] = {"poll_interval": 0.05}
    data["output_dir"] = str(out)
    data["retry"] = {"max_attempts": 2, "backoff_initial": 0.01, "backoff_max": 0.05}
    return data


async def _run_all(model: str, mode: str, tmp_path: Path, items: Path) -> None:
    async with await start_server(SimConfig(batch_delay=0.0)) as srv:
        base = srv.url if model.startswith("openai:") else srv.root_url
        answers = None
        received: dict[str, int] = {}
        for name in JOBS:
            job = job_from_dict(rendered(name, model, base, mode, tmp_path / name, items, answers=answers),
                                base_dir=ROOT)
            store = open_store(tmp_path / f"{name}.sqlite")
            await execute(job, store)
            if name == "knowno-mctest.yaml":
                answers = next((tmp_path / name).rglob("no-hint.jsonl"))
            now = srv.stats()
            received[name] = now["received"] + now.get("batch_lines", 0) - sum(received.values())
            refused = [task for task in store.tasks(store.list_runs(1)[0]["id"], status="failed")
                       if task["error_class"] in ("bad_request", "refused")]
            assert not refused, f"{name}: {refused[0]['error']}"
        stats = srv.stats()
    client_errors = {status: n for status, n in stats["by_status"].items() if status.startswith("4")}
    assert not client_errors, (model, mode, stats["by_status"])
    lines = stats.get("batch_results", {})
    assert not any(n for k, n in lines.items() if k != "succeeded"), lines
    # every job sent requests (newterm-build's later stages depend on what the simulated answers let through)
    assert all(received.values()), received


@pytest.mark.parametrize("mode", ["online", "batch"])
@pytest.mark.parametrize("model", MATRIX)
async def test_bundled_jobs_are_accepted(model, mode, tmp_path, winodict_items):
    await _run_all(model, mode, tmp_path, winodict_items)


@pytest.mark.parametrize("model", ["openai:o3", "anthropic:claude-fable-5-2"])
def test_without_drop_unsupported_they_are_refused_before_sending(model, tmp_path, winodict_items):
    data = rendered("newterm-eval-2023.yaml", model, "http://127.0.0.1:9", "online", tmp_path, winodict_items,
                    drop=False)
    with pytest.raises(JobFileError, match=f"{model} takes no temperature: remove params.temperature"):
        job_from_dict(data, base_dir=ROOT)

"""What a pool (``pools:``) does beyond its online requests (issue 38): ``runner check`` probes every endpoint of a
pool with its own settings, ``runner estimate`` prices a pooled model per endpoint and says which price a budget
reserves, and a pooled model's Batch API lines go through the first endpoint of its pool with a Batch API (not the
named model's provider), priced and charged there, said in the run's notes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any

import pytest

from runner.preflight import PreflightFailed, probe_models, require
from runner.spec.job import load_job
from tests.engine.test_pools import MODEL, questions, servers, write_job
from tests.helpers import ROOT, run_cli

DEAR = "sim:gpt-4o-dear"
PRICES = {MODEL: {"input": 1.0, "output": 2.0, "batch_input": 0.5, "batch_output": 1.0},
          DEAR: {"input": 10.0, "output": 20.0, "batch_input": 5.0, "batch_output": 10.0}}


def edit(path: Path, **changes: Any) -> Path:
    job = json.loads(path.read_text())
    job.update(changes)
    path.write_text(json.dumps(job))
    return path


def dear_pool(path: Path, first: str = "sim", second: str = "sim:b") -> Path:
    """The job's pool: ``first`` at the model's price, ``second`` serving ``gpt-4o-dear`` at ten times it."""
    return edit(path, prices=PRICES, pools={MODEL: {"endpoints": [first, {"endpoint": second, "model": "gpt-4o-dear"}],
                                                    "same_model": True}})


# -- runner check ---------------------------------------------------------------------------------------------------

@pytest.fixture
def two_servers() -> Iterator[tuple[str, str]]:
    """Two simulated servers in processes of their own (the CLI runs its own event loop): the first takes any key,
    the second only ``another-key``; yields their ``/v1`` URLs."""
    with ExitStack() as stack:
        urls = []
        for extra in ([], ["--api-key", "another-key"]):
            proc = subprocess.Popen([sys.executable, "-m", "simserver", "--port", "0", *extra], cwd=ROOT,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            stack.callback(proc.wait, timeout=10)
            stack.callback(proc.terminate)
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert "listening on" in line, line
            urls.append(line.rsplit(" ", 1)[-1].strip())
        yield urls[0], urls[1]


def test_check_probes_every_endpoint_of_a_pool_and_fails_on_the_one_that_refuses_its_key(
        tmp_path, monkeypatch, capsys, two_servers) -> None:
    good, refusing = two_servers
    path = write_job(tmp_path, [good, refusing, good], questions(3))
    code, out, err = run_cli(monkeypatch, capsys, "check", str(path))
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["ok", "failed", "ok"], out
    assert lines[0].split() == ["ok", MODEL, "at", "sim"] and lines[2].split() == ["ok", MODEL, "at", "sim:c"]
    assert lines[1].startswith(f"failed  {MODEL} at sim:b: ") and "key" in lines[1], lines[1]
    assert code == 1 and "Traceback" not in err
    # each endpoint asked with its own settings: the same pool on the good server alone passes
    path = write_job(tmp_path / "fine", [good, good, good], questions(3))
    code, out, _ = run_cli(monkeypatch, capsys, "check", str(path))
    assert code == 0 and len(out.splitlines()) == 3, out


async def test_submit_stops_before_sending_when_one_endpoint_of_a_pool_is_down(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        up = (await servers(stack, count=1))[0]
        path = write_job(tmp_path, [up.url, "http://127.0.0.1:9/v1"], questions(3))
        job = load_job(path)
        probes = await probe_models(job, timeout=2)
        assert [p.model for p in probes] == [f"{MODEL} at sim", f"{MODEL} at sim:b"]
        assert probes[0].ok and not probes[1].ok and "is the server running?" in (probes[1].problem or "")
        with pytest.raises(PreflightFailed) as failed:
            await require(job, timeout=2)
        assert str(failed.value).startswith(f"{MODEL} at sim:b: ")
        assert up.stats()["by_status"].get("200", 0) == 0, "a probe is no model request"

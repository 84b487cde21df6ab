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

from runner.engine.checks import BatchModeError, check_before_sending
from runner.engine.run import execute
from runner.preflight import PreflightFailed, probe_models, require
from runner.report.estimate import estimate
from runner.report.estimate_render import render, summary_lines
from runner.spec.job import load_job
from runner.spec.pools import batch_endpoint
from runner.store import open_store
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


# -- runner estimate ------------------------------------------------------------------------------------------------

def test_estimate_prices_a_pooled_model_per_endpoint_and_says_the_dearest_is_reserved(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.sqlite")
    alone: dict[str, Any] = {}
    for label, price in (("cheap", PRICES[MODEL]), ("dear", PRICES[DEAR])):
        path = write_job(tmp_path / label, ["http://127.0.0.1:9/v1"], questions(30), pooled=False)
        alone[label] = estimate(load_job(edit(path, prices={MODEL: price})), store)
    pooled = estimate(load_job(dear_pool(write_job(tmp_path / "pool", ["http://127.0.0.1:9/v1"] * 2,
                                                   questions(30)))), store)
    group, cheap, dear = pooled.groups[0], alone["cheap"].groups[0], alone["dear"].groups[0]
    assert cheap.cost_high is not None and dear.cost_high == pytest.approx(10 * cheap.cost_high)
    assert group.cost_low == pytest.approx(cheap.cost_low) and group.cost_high == pytest.approx(dear.cost_high)
    assert pooled.high == pytest.approx(dear.cost_high), "a budget must cover the dearest endpoint"
    [pool] = pooled.totals["pools"]
    assert pool["reserved_at"] == "sim:b"
    assert [(e["endpoint"], e["priced_as"]) for e in pool["endpoints"]] == [("sim", MODEL), ("sim:b", DEAR)]
    assert [e["cost_high"] for e in pool["endpoints"]] == pytest.approx([cheap.cost_high, dear.cost_high])
    said = [line for line in summary_lines(pooled) if line.startswith("pool:")]
    assert said == [f"pool: qa {MODEL} over 2 endpoints: sim ${cheap.cost_low:,.4f} – ${cheap.cost_high:,.4f} (as "
                    f"{MODEL}, job prices: {MODEL}), sim:b ${dear.cost_low:,.4f} – ${dear.cost_high:,.4f} (as "
                    f"{DEAR}, job prices: {DEAR}); a budget reserves the dearest endpoint's price (sim:b)"], said
    assert "pool: sim as" in group.price and "sim:b as sim:gpt-4o-dear" in group.price
    # a job without a pool says what it said before: no pool line, no pools total
    assert "pools" not in alone["cheap"].totals and "pool:" not in render(alone["cheap"], "text")


def test_estimate_says_which_endpoint_takes_a_pooled_batch_stage_and_prices_it_there(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.sqlite")
    path = dear_pool(write_job(tmp_path, ["http://127.0.0.1:9/v1"] * 3, questions(30)), first="sim:b",
                     second="sim:c")
    job = json.loads(path.read_text())
    job["stages"][0]["mode"] = "batch"
    job["pools"][MODEL]["endpoints"].reverse()  # the dear endpoint first: it takes the batches
    found = estimate(load_job(edit(path, **job)), store)
    lines = summary_lines(found)
    assert f"pool: qa {MODEL}'s Batch API lines go through endpoint sim:c alone, the first of its pool with a " \
           "Batch API (batches are not spread over a pool)" in lines
    group = found.groups[0]
    assert group.batch_price is not None and found.totals["pools"][0]["batch_via"] == "sim:c"
    cheap = found.totals["pools"][0]["endpoints"][1]["cost_high"]
    assert group.batch_high == pytest.approx(cheap * 10 / 2), "at sim:c's Batch API price (5/10 per M tokens)"


# -- Batch API stages -----------------------------------------------------------------------------------------------

async def test_a_pooled_batch_goes_through_the_first_endpoint_of_its_pool_priced_and_charged_there(
        tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        named, first, second = await servers(stack)
        path = write_job(tmp_path, [named.url, first.url, second.url], questions(40))
        job = json.loads(path.read_text())
        job["stages"][0]["mode"] = "batch"
        job["batch"] = {"poll_interval": 0.02}
        job["budget"] = {"usd": 1.0}
        job["prices"] = PRICES  # the dear endpoint first: it takes the batches
        job["pools"] = {MODEL: {"endpoints": [{"endpoint": "sim:b", "model": "gpt-4o-dear"}, "sim:c"],
                                "same_model": True}}
        edit(path, **job)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(path), store)
        assert outcome.status == "completed", outcome.message
        # not the named model's provider (sim, the first server), nor the pool's second endpoint
        assert first.stats()["batch_lines"] == 40 and "batches" not in named.stats() and "batches" not in second.stats()
        assert sum(s.stats()["by_status"].get("200", 0) for s in (named, second)) == 0
        assert [n for n in outcome.stats.notes if "Batch API lines" in n] == [
            f"stage qa: the Batch API lines of {MODEL} go through endpoint sim:b alone, the first of its pool with "
            "a Batch API (a pool's batches are not spread over its endpoints; its online requests are)"]
        used = {r["key"]: (r["input_tokens"], r["output_tokens"]) for r in store.responses()}
        charges = store.ledger(outcome.run_id, "charge")
        assert len(charges) == 40 and {r["endpoint"] for r in charges} == {"sim:b"}
        for row in charges:  # at sim:b's Batch API price (gpt-4o-dear's), not the pooled model's
            inputs, outputs = used[row["key"]]
            assert row["amount"] == pytest.approx((inputs * 5.0 + outputs * 10.0) / 1e6, rel=1e-9)
        results = [json.loads(line) for line in next((tmp_path / "results").rglob("qa.jsonl")).read_text().splitlines()]
        assert len(results) == 40 and all(r["provenance"]["sent_with"].endswith(" at sim:b") for r in results)


def test_the_batch_endpoint_is_the_first_of_the_pool_with_a_batch_api(tmp_path: Path) -> None:
    path = write_job(tmp_path, ["http://127.0.0.1:9/v1"] * 2, questions(3))
    job = json.loads(path.read_text())
    job["models"] = ["anthropic:claude-haiku-4-5"]
    job["providers"] = {"bedrock:us-east-1": {"region": "us-east-1"}, "anthropic": {}}
    job["pools"] = {"anthropic:claude-haiku-4-5": {"endpoints": [
        {"endpoint": "bedrock:us-east-1", "model": "us.anthropic.claude-haiku-4-5-20251001-v1:0"}, "anthropic"],
        "same_model": True}}
    edit(path, **job)
    assert batch_endpoint(load_job(path), "anthropic:claude-haiku-4-5").endpoint == "anthropic", \
        "Bedrock without a batch_folder and role has no Batch API"
    job["providers"]["bedrock:us-east-1"].update(batch_folder="s3://runner-batches/p",
                                                 batch_role_arn="arn:aws:iam::123456789012:role/runner-batch")
    edit(path, **job)
    assert batch_endpoint(load_job(path), "anthropic:claude-haiku-4-5").endpoint == "bedrock:us-east-1"
    assert batch_endpoint(load_job(path), MODEL) is None


def test_mode_batch_is_refused_when_no_endpoint_of_the_pool_has_a_batch_api(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    path = write_job(tmp_path, ["http://127.0.0.1:9/v1"], questions(3), pooled=False)
    job = json.loads(path.read_text())
    job["models"] = ["bedrock:anthropic.claude-haiku"]
    job["providers"] = {"bedrock": {"region": "us-east-1"}, "bedrock:eu": {"region": "eu-west-1"}}
    job["pools"] = {"bedrock:anthropic.claude-haiku": {"endpoints": ["bedrock", "bedrock:eu"]}}
    job["stages"][0]["mode"] = "batch"
    with pytest.raises(BatchModeError, match="needs an S3 folder and a service role"):
        check_before_sending(load_job(edit(path, **job)))


class _Lines:
    """What settle_results asks of a batch's lines, and the failures it gives them."""

    def __init__(self, key: str) -> None:
        self.waiting = {key: ["task"]}
        self.resumed: dict[str, Any] = {}
        self.reservations: dict[str, Any] = {key: None}
        self.refiled: set[str] = set()
        self.resubmits: dict[str, int] = {}
        self.failed: list[Any] = []

    def release(self, reservation: Any, ledger_id: Any) -> None:
        pass

    def fail(self, key: str, tasks: list[Any], error: Any) -> None:
        self.failed.append(error)


@pytest.mark.parametrize("endpoint", ["sim:b", None])
def test_a_pooled_batchs_refusal_the_provider_billed_is_charged_at_the_endpoint_that_took_the_batch(
        endpoint: str | None) -> None:
    """A refused line's bill (a content filter's, a model's refusal) is charged where the batch went, as its
    answers are: the endpoint's price, not the pooled model's."""
    from runner.engine.batch_outcomes import settle_results
    from runner.engine.batch_records import OpenBatch
    from runner.errors import Refused
    from runner.providers.batching import BatchResult
    from runner.providers.records import Completion

    billed = Completion("", finish_reason="content_filter", input_tokens=40, output_tokens=0)
    lines = _Lines("k")
    batch = OpenBatch("b1", "qa", MODEL, "sim:b", "batch_1", 0, keys={"k": 7})
    results = {"k": BatchResult("k", error=Refused("withheld by the content filter", billed=billed))}
    statuses, online = settle_results(lines, batch, results, "sim", endpoint=endpoint, late=False,  # type: ignore[arg-type]
                                      max_resubmits=1, store=None)  # type: ignore[arg-type]
    assert statuses == {"k": "failed"} and online == []
    (error,) = lines.failed
    assert error.billed is billed and billed.endpoint == endpoint



ROLE = "arn:aws:iam::123456789012:role/runner-batch"


@pytest.mark.parametrize(("only", "extra", "batches"), [
    (None, {}, None), ("vertex", {"batch_folder": "gs://runner-batches/p"}, True),
    ("bedrock", {"batch_folder": "s3://runner-batches/p"}, False),
    ("bedrock", {"batch_folder": "s3://runner-batches/p", "batch_role_arn": ROLE}, True)])
def test_a_provider_says_whether_an_endpoint_batches_as_the_built_endpoint_does(
        only: str | None, extra: dict[str, str], batches: bool | None) -> None:
    """The pool asks the class (``sends_batches``) what an endpoint built from the same settings says
    (``supports_batch``): the two agree for every provider (without settings) and for the two that need some."""
    from runner.providers.base import ProviderSettings, provider_class, provider_names

    names = [only] if only else [name for name in provider_names() if name != "local"]
    for name in names:
        cls = provider_class(name)
        settings = ProviderSettings.model_validate({"base_url": "http://127.0.0.1:9", **extra})
        said = cls.sends_batches(settings)
        assert said is bool(cls(settings).supports_batch), (name, extra)
        assert batches is None or said is batches, (name, extra)
    assert len(names) >= (1 if only else 8), names

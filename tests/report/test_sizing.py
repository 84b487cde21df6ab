"""``runner estimate --detect / --halfwidth``: the items a comparison or an accuracy needs before anything is paid,
from a pilot run's scores or from the stated defaults, and their cost at the estimate's prices; bad settings end in
one sentence."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from runner.engine.run import execute
from runner.evaluate import power
from runner.evaluate.sequential import expected_stop
from runner.spec.job import load_job
from runner.store import open_store
from simserver import start_server
from tests.helpers import run_cli, write_job, write_rows

MODELS = ["sim:alpha", "sim:beta"]
PRICES = "prices: {sim:alpha: {input: 1000, output: 2000}, sim:beta: {input: 500, output: 500}}"


@pytest.fixture
async def server():
    async with await start_server() as srv:
        yield srv


def _job(tmp_path, url: str, rows: int = 60):
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    providers = f"providers: {{sim: {{base_url: {json.dumps(url)}}}}}"
    return write_job(tmp_path / "job.yaml", dataset, models=MODELS, seeds="[0, 1]", extra=f"{providers}\n{PRICES}",
                     name="sizing")


def _sizing(monkeypatch, capsys, *args: str) -> dict:
    code, out, err = await_cli(monkeypatch, capsys, "estimate", *args, "--format", "json")
    assert code == 0, err
    return json.loads(out)


async def test_without_a_pilot_the_defaults_are_used_and_said(tmp_path, server, monkeypatch, capsys):
    job = _job(tmp_path, server.url)
    code, out, err = await_cli(monkeypatch, capsys, "estimate", str(job), "--db", str(tmp_path / "s.sqlite"),
                               "--detect", "0.05", "--halfwidth", "0.1")
    assert code == 0, err
    # (1.96 + 0.84)² · 0.35 / 0.05² = 1,098.9 (the default spread of a difference of two 0/1 scores correlated
    # 0.3), 1,101 with t quantiles
    needed = power.items_to_detect(0.05, math.sqrt(0.35))
    assert needed == 1101
    row = next(line for line in out.splitlines() if "sim:alpha vs sim:beta" in line)
    assert "detect 0.05" in row and "1,101 (more than there are)" in row and " 60 " in row
    assert f"power {power.power_at(60, 0.05, math.sqrt(0.35)):.2f}" in row and "defaults (two models" in row
    for model in MODELS:  # ± 0.1 on an accuracy near 0.5: 1.96² · 0.25 / 0.01 = 96.04 items, more than the 60
        line = next(line for line in out.splitlines() if "± 0.1" in line and f" {model} " in line)
        assert "97 (more than there are)" in line and f"± {1.959964 * 0.5 / math.sqrt(60):.3f}" in line
    assert "sizing at alpha 0.05, power 0.8" in out


async def test_a_pilot_runs_spread_gives_the_counts_and_the_estimate_their_cost(tmp_path, server, monkeypatch, capsys):
    job = _job(tmp_path, server.url)
    store = open_store(tmp_path / "s.sqlite")
    pilot = (await execute(load_job(job), store)).run_id
    # the pilot's item means (two seeds averaged) per model, as the sizing must read them
    scores: dict[str, dict[str, list[float]]] = {}
    for task in store.tasks(pilot):
        scores.setdefault(task["model"], {}).setdefault(task["row_id"], []).append(task["score"])
    means = {m: {item: statistics.fmean(v) for item, v in items.items()} for m, items in scores.items()}
    sd = statistics.stdev(means["sim:beta"][i] - means["sim:alpha"][i] for i in means["sim:alpha"])
    found = _sizing(monkeypatch, capsys, str(job), "--db", str(tmp_path / "s.sqlite"), "--detect", "0.3",
                    "--halfwidth", "0.2", "--pilot", pilot, "--alpha", "0.1", "--power", "0.9")
    detect = [n for n in found["sizing"]["needs"] if n["goal"] == "detect"]
    assert len(detect) == 1 and detect[0]["models"] == MODELS
    assert detect[0]["sd"] == pytest.approx(sd) and detect[0]["source"] == f"pilot run {pilot} (60 items)"
    assert detect[0]["items"] == power.items_to_detect(0.3, sd, alpha=0.1, power=0.9)
    assert detect[0]["available"] == 60
    for need in (n for n in found["sizing"]["needs"] if n["goal"] == "halfwidth"):
        (model,) = need["models"]
        assert need["sd"] == pytest.approx(statistics.stdev(means[model].values()))
    # everything is in the cache now: the estimate sends nothing, so the sizing's items cost nothing either
    assert all(n["cost_low"] == 0 for n in found["sizing"]["needs"])
    assert found["estimate"]["totals"]["to_send"] == 0


async def test_the_cost_is_the_needed_items_at_the_estimates_price_per_request(tmp_path, server, monkeypatch, capsys):
    job = _job(tmp_path, server.url, rows=200)
    found = _sizing(monkeypatch, capsys, str(job), "--db", str(tmp_path / "s.sqlite"), "--detect", "0.2")
    (need,) = found["sizing"]["needs"]
    groups = {g["model"]: g for g in found["estimate"]["groups"]}
    items = min(need["items"], 200)
    expected = sum(groups[m]["cost_low"] / groups[m]["to_send"] * items * 2 for m in MODELS)  # two seeds an item
    assert need["cost_low"] == pytest.approx(expected)
    assert need["items"] == power.items_to_detect(0.2, math.sqrt(0.35)) and need["items"] <= 200


async def test_each_row_says_where_a_stop_rule_is_expected_to_end(tmp_path, server, monkeypatch, capsys):
    job = _job(tmp_path, server.url, rows=400)
    found = _sizing(monkeypatch, capsys, str(job), "--db", str(tmp_path / "s.sqlite"), "--detect", "0.2",
                    "--halfwidth", "0.08")
    needs = {n["goal"]: n for n in found["sizing"]["needs"]}
    # one pair: decide: all runs one sequence of (1 + B − A) / 2, spread 0.35 / 4, settled at a distance of 0.1
    assert needs["detect"]["with_stop"] == expected_stop(0.35 / 4, 0.05, 0.1, 400)
    # two models: halfwidth: splits alpha between their two sequences
    assert needs["halfwidth"]["with_stop"] == expected_stop(0.25, 0.025, 0.08, 400)
    code, out, _ = await_cli(monkeypatch, capsys, "estimate", str(job), "--db", str(tmp_path / "s.sqlite"),
                             "--halfwidth", "0.01")
    assert code == 0 and "not within them" in out and "'with stop:' is where" in out


@pytest.mark.parametrize(("args", "sentence"), [
    (["--detect", "0"], "--detect must be a difference of accuracy between 0 and 1"),
    (["--halfwidth", "0.5"], "--halfwidth must be between 0 and 0.5"),
    (["--detect", "0.1", "--alpha", "0.6"], "--alpha must be between 0 and 0.5"),
    (["--detect", "0.1", "--power", "1"], "--power must be between 0 and 1"),
    (["--detect", "0.1", "--pilot", "nope"], "no run 'nope' in "),
    (["--detect", "0.1", "--format", "csv"], "--detect and --halfwidth print text, json or md, not csv"),
])
async def test_bad_settings_end_in_one_sentence(tmp_path, server, monkeypatch, capsys, args, sentence):
    job = _job(tmp_path, server.url)
    code, out, err = await_cli(monkeypatch, capsys, "estimate", str(job), "--db", str(tmp_path / "s.sqlite"), *args)
    assert code != 0 and not out
    assert err.count("\n") == 1 and sentence in err


def await_cli(monkeypatch, capsys, *args: str):
    """``runner ARGS`` in this process from a test that holds a running event loop (the CLI starts its own)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(run_cli, monkeypatch, capsys, *args).result()


async def test_a_clustered_stage_is_sized_with_its_design_effect(tmp_path, server, monkeypatch, capsys):
    from runner.evaluate.clusters import intra_cluster_correlation
    from tests.report.test_clustered_reports import _rows

    rows = _rows(tmp_path / "topics.jsonl", 60)  # 12 topics of 5 items
    providers = f"providers: {{sim: {{base_url: {json.dumps(server.url)}}}}}"
    job = write_job(tmp_path / "clustered.yaml", rows, models=MODELS, seeds="[0, 1]", name="clustered",
                    extra=f"{providers}\n{PRICES}", stage_extra="    cluster: topic")
    found = _sizing(monkeypatch, capsys, str(job), "--db", str(tmp_path / "s.sqlite"), "--detect", "0.2")
    (need,) = found["sizing"]["needs"]
    # no pilot: the default intra-cluster correlation 0.3 over clusters of 5 items: 1 + 4 x 0.3
    assert need["clusters"] == 12 and need["design_effect"] == pytest.approx(2.2)
    assert need["items"] == power.items_to_detect(0.2, math.sqrt(0.35), design=2.2, cluster_size=5)
    assert "intra-cluster correlation 0.3 (default)" in need["source"]

    store = open_store(tmp_path / "s.sqlite")
    pilot = (await execute(load_job(job), store)).run_id
    scores: dict[str, dict[str, list[float]]] = {}
    topic = {}
    for line in store.iter_results(pilot, "mc"):
        r = json.loads(line)
        scores.setdefault(r["model"], {}).setdefault(r["id"], []).append(r["score"])
        topic[r["id"]] = r["fields"]["topic"]
    means = {m: {i: statistics.fmean(v) for i, v in items.items()} for m, items in scores.items()}
    differences = {i: means["sim:beta"][i] - means["sim:alpha"][i] for i in means["sim:alpha"]}
    icc = intra_cluster_correlation(differences, topic)
    found = _sizing(monkeypatch, capsys, str(job), "--db", str(tmp_path / "s.sqlite"), "--detect", "0.2",
                    "--pilot", pilot)
    (need,) = found["sizing"]["needs"]
    assert need["design_effect"] == pytest.approx(power.design_effect(icc, 5))
    assert f"intra-cluster correlation {icc:.2f} (pilot)" in need["source"]

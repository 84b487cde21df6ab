"""A stage's ``cluster:`` field (issue 36, item 1): its result lines carry the field, the report's interval over items
is cluster-robust (equal to runner/evaluate/clusters.py on the run's item means, itself checked against statsmodels)
with the number of clusters and the design effect in every format, the three choice seeds of an item stay one item,
and a row without the field is refused by `runner validate` naming its file and line."""

from __future__ import annotations

import csv
import io
import json
import statistics

import pytest

from runner.engine.run import execute
from runner.evaluate.clusters import clustered_mean
from runner.report import summary
from runner.spec.job import load_job
from runner.store import open_store
from simserver import start_server
from tests.helpers import run_cli, write_job


def _rows(path, count: int, *, topic_every: int = 5, missing_at: int | None = None):
    with open(path, "w", encoding="utf-8") as out:
        for i in range(count):
            row = {"question": f"Question number {i}: which is right?",
                   "choices": [f"first {i}", f"second {i}", f"third {i}", f"fourth {i}"], "gold": i % 4,
                   "topic": f"topic-{i // topic_every}"}
            if i == missing_at:
                del row["topic"]
            out.write(json.dumps(row) + "\n")
    return path


@pytest.fixture
async def server():
    async with await start_server() as srv:
        yield srv


def _job(tmp_path, url: str, rows):
    providers = f"providers: {{sim: {{base_url: {json.dumps(url)}}}}}"
    return write_job(tmp_path / "job.yaml", rows, models=["sim:gpt-sim"], seeds="[0, 1, 2]", extra=providers,
                     stage_extra="    cluster: topic", name="clustered")


async def test_the_reports_interval_is_cluster_robust_over_the_stages_clusters(tmp_path, server):
    job = _job(tmp_path, server.url, _rows(tmp_path / "rows.jsonl", 60))
    store = open_store(tmp_path / "s.sqlite")
    run = (await execute(load_job(job), store)).run_id
    results = [json.loads(line) for line in store.iter_results(run, "mc")]
    # ids are line numbers from 1; five rows a topic
    assert len(results) == 180 and all(r["fields"]["topic"] == f"topic-{(int(r['id']) - 1) // 5}" for r in results)
    # the item means (three seeds averaged: one item, not three) and their clusters, read back from the store
    scores: dict[str, list[float]] = {}
    topic: dict[str, str] = {}
    for r in results:
        scores.setdefault(r["id"], []).append(r["score"])
        topic[r["id"]] = r["fields"]["topic"]
    means = {item: statistics.fmean(values) for item, values in scores.items()}
    expected = clustered_mean(means, topic)

    data = summary.build(store, run)
    (row,) = data["rows"]
    figures = row["items"]
    assert figures["ci_method"] == "cluster-t" and figures["n"] == 60 and figures["clusters"] == 12
    assert figures["se"] == pytest.approx(expected.se, abs=1e-12)
    assert figures["design_effect"] == pytest.approx(expected.design_effect, abs=1e-12)
    assert figures["low"] == pytest.approx(max(0.0, expected.low), abs=1e-12)
    assert figures["high"] == pytest.approx(min(1.0, expected.high), abs=1e-12)

    clusters = f"12 clusters, design effect {expected.design_effect:.2f}"
    assert any(f"over 60 items in {clusters}" in line for line in summary.summary_lines(data))
    assert f"60 in {clusters}" in summary.render(data, "text")
    line = next(iter(csv.DictReader(io.StringIO(summary.render(data, "csv")))))
    assert line["clusters"] == "12" and float(line["design_effect"]) == pytest.approx(expected.design_effect)
    assert "12 clusters" in summary.render(data, "md")
    assert json.loads(summary.render(data, "json"))["ci_method"]["clustered"].startswith("with a stage's cluster:")


def test_a_row_without_the_cluster_field_is_refused_by_validate_naming_its_line(tmp_path, monkeypatch, capsys):
    rows = _rows(tmp_path / "rows.jsonl", 10, missing_at=6)
    job = _job(tmp_path, "http://127.0.0.1:9/v1", rows)
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(job))
    assert code == 2
    assert f"{rows}:7: the row has no 'topic' field, which the stage's cluster: names" in err


async def test_compare_gives_every_pair_a_cluster_robust_test_holm_adjusted_with_a_verdict(tmp_path, server):
    from statsmodels.stats.multitest import multipletests

    from runner.evaluate.clusters import paired_clustered
    from runner.report import compare

    rows = _rows(tmp_path / "rows.jsonl", 60)
    providers = f"providers: {{sim: {{base_url: {json.dumps(server.url)}}}}}"
    job = write_job(tmp_path / "three.yaml", rows, models=["sim:alpha", "sim:beta", "sim:gamma"], seeds="[0, 1]",
                    extra=providers, stage_extra="    cluster: topic", name="three")
    store = open_store(tmp_path / "s.sqlite")
    run = (await execute(load_job(job), store)).run_id
    data = compare.build(store, run)
    assert [(r["model_a"], r["model_b"]) for r in data["rows"]] == [
        ("sim:alpha", "sim:beta"), ("sim:alpha", "sim:gamma"), ("sim:beta", "sim:gamma")]
    means: dict[str, dict[str, list[float]]] = {}
    topic = {}
    for line in store.iter_results(run, "mc"):
        r = json.loads(line)
        means.setdefault(r["model"], {}).setdefault(r["id"], []).append(r["score"])
        topic[r["id"]] = r["fields"]["topic"]
    item_means = {m: {i: statistics.fmean(v) for i, v in items.items()} for m, items in means.items()}
    for row in data["rows"]:
        expected = paired_clustered(item_means[row["model_a"]], item_means[row["model_b"]], topic)
        assert row["test"] == "cluster-t" and row["clusters"] == 12
        assert row["p_value"] == pytest.approx(expected.p_value, abs=1e-12)
        assert (row["wins"], row["ties"], row["losses"]) == (expected.wins, expected.ties, expected.losses)
        assert row["low"] == pytest.approx(expected.difference.low, abs=1e-12)
    adjusted = multipletests([r["p_value"] for r in data["rows"]], method="holm")[1]
    assert [r["p_holm"] for r in data["rows"]] == pytest.approx(list(adjusted), abs=1e-12)
    for row in data["rows"]:
        decided = row["p_holm"] < 0.05
        assert row["verdict"] == (("B better" if row["difference"] > 0 else "A better") if decided
                                  else "not decided at alpha 0.05")
    text = compare.render(data, "text")
    assert "60 in 12 clusters" in text and "cluster-robust t (design effect" in text

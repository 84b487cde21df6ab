"""``runner compare``: runs against the simulated server with scripted answers, then compared item by item: two
runs of one model (McNemar's exact test on a table built to have 10 and 2 discordant items), the models of one
run (every pair, and --models), fractional item scores (the sign-flip test), the CLI's output in every format,
and the one-sentence refusals."""

from __future__ import annotations

import csv
import html
import io
import json
import statistics
from pathlib import Path

import pytest
import pytest_asyncio

from runner.engine.run import execute
from runner.evaluate import stats
from runner.report import compare
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import fresh, run_cli

pytestmark = pytest.mark.asyncio(loop_scope="module")

LETTERS = "ABCD"
#: run A's model alpha is wrong on rows 10 and 11, run B's on rows 0-9: 10 items right in A only, 2 in B only
WRONG = {"a": set(range(10, 12)), "b": set(range(10))}


def _rows(path: Path, ids: list[int], phrase: str) -> Path:
    """Multiple-choice rows with ids r<i>, a subject and a gold at i % 4; ``phrase`` tells the runs' prompts (and
    so their cache keys and scripted answers) apart."""
    with open(path, "w", encoding="utf-8") as out:
        for i in ids:
            out.write(json.dumps({"qid": f"r{i}", "question": f"Question r{i}: {phrase}",
                                  "choices": [f"first {i}", f"second {i}", f"third {i}", f"fourth {i}"],
                                  "gold": i % 4, "subject": "even" if i % 2 == 0 else "odd"}) + "\n")
    return path


def _job(tmp: Path, name: str, rows: Path, url: str, *, stage: str = "mc", choices: str = "{seeds: [0], "
         "shuffle: false, gold: gold}") -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text("\n".join([
        f"name: {name}",
        'models: ["sim:alpha", "sim:beta"]',
        "params: {temperature: 0, max_tokens: 5}",
        f"output_dir: {json.dumps(str(tmp / 'results'))}",
        "retry: {max_attempts: 10, backoff_initial: 0.01, backoff_max: 0.05, max_elapsed: 60}",
        f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: 8, timeout: 5}}}}",
        "stages:",
        f"  - name: {stage}",
        f"    dataset: {{path: {json.dumps(str(rows))}, id: qid}}",
        "    prompt:",
        "      system: Answer with one letter.",
        "      user: \"{{ question }}\\n{{ options_block }}\\nAnswer:\"",
        f"    choices: {choices}",
        "    parse: letter",
        "    record: [subject]",
    ]) + "\n", encoding="utf-8")
    return path


def _script(path: Path) -> Path:
    """alpha answers the gold letter except on its run's WRONG rows; beta always answers A."""
    lines = ["responses:"]
    for run, phrase in (("a", "which is right?"), ("b", "which one is right?")):
        for i in range(22):
            letter = LETTERS[(i + 1) % 4] if i in WRONG[run] else LETTERS[i % 4]
            lines.append(f"  - {{contains: ['Question r{i}: {phrase}'], model: alpha, response: '{letter}'}}")
    lines.append("  - {model: beta, response: 'A'}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def runs(shared_srv, tmp_path_factory):
    """Run A (rows r0-r20), run B (r0-r19 and r21), a run of another stage, a run of other rows, and a run of
    three shuffled seeds (fractional item scores), all in one store."""
    tmp = tmp_path_factory.mktemp("compare")
    server = fresh(shared_srv, script=str(_script(tmp / "script.yaml")))
    store = open_store(tmp / "cache.sqlite")
    jobs = {
        "a": _job(tmp, "runa", _rows(tmp / "a.jsonl", list(range(21)), "which is right?"), server.url),
        "b": _job(tmp, "runb", _rows(tmp / "b.jsonl", [*range(20), 21], "which one is right?"), server.url),
        "other_stage": _job(tmp, "otherstage", _rows(tmp / "c.jsonl", [0, 1], "which is right?"), server.url,
                            stage="other"),
        "other_rows": _job(tmp, "otherrows", _rows(tmp / "d.jsonl", [40, 41], "which is right?"), server.url),
        "seeds": _job(tmp, "seeds", _rows(tmp / "e.jsonl", list(range(12)), "which is right?"), server.url,
                      choices="{seeds: [0, 1, 2], gold: gold}"),
    }
    out = {"store": store, "db": str(tmp / "cache.sqlite"), "tmp": tmp}
    for key, path in jobs.items():
        outcome = await execute(load_job(path), store)
        assert outcome.status == "completed"
        out[key] = outcome
    return out


def _item_means(outcome, model: str, stage: str = "mc") -> dict[str, float]:
    """Item means read from the run's results file (not the store), seeds averaged per row id."""
    scores: dict[str, list[float]] = {}
    for line in outcome.results[stage].read_text(encoding="utf-8").splitlines():
        result = json.loads(line)
        if result["model"] == model and result.get("score") is not None:
            scores.setdefault(result["id"], []).append(result["score"])
    return {item: statistics.fmean(values) for item, values in scores.items()}


async def test_two_runs_of_one_model_are_compared_with_mcnemars_exact_test(runs):
    data = compare.build(runs["store"], runs["a"].run_id, runs["b"].run_id)
    assert data["mode"] == "runs" and [(r["model_a"], r["model_b"]) for r in data["rows"]] == [
        ("sim:alpha", "sim:alpha"), ("sim:beta", "sim:beta")]
    alpha = data["rows"][0]
    # 20 shared rows, r20 only in A, r21 only in B; alpha right on 18 of them in A, 10 in B
    assert (alpha["n"], alpha["only_a"], alpha["only_b"]) == (20, 1, 1)
    assert (alpha["mean_a"], alpha["mean_b"]) == (pytest.approx(18 / 20), pytest.approx(10 / 20))
    assert (alpha["test"], alpha["a_only_right"], alpha["b_only_right"]) == ("mcnemar-exact", 10, 2)
    assert alpha["p_value"] == pytest.approx(0.0386, abs=5e-5)
    differences = [-1.0] * 10 + [1.0] * 2 + [0.0] * 8
    se = statistics.stdev(differences) / 20 ** 0.5
    assert alpha["difference"] == pytest.approx(-0.4) and alpha["se"] == pytest.approx(se)
    assert (alpha["low"], alpha["high"]) == (pytest.approx(-0.4 - 1.96 * se, abs=1e-4),
                                             pytest.approx(-0.4 + 1.96 * se, abs=1e-4))
    # beta answered A everywhere in both runs: no discordant item, no spread, p = 1
    beta = data["rows"][1]
    assert (beta["difference"], beta["low"], beta["p_value"], beta["a_only_right"]) == (0.0, None, 1.0, 0)
    # --stage and a model pair across the runs
    data = compare.build(runs["store"], runs["a"].run_id, runs["b"].run_id, stage="mc",
                         models=("sim:beta", "sim:alpha"))
    (row,) = data["rows"]
    expected = stats.paired(_item_means(runs["a"], "sim:beta"), _item_means(runs["b"], "sim:alpha"))
    assert row["model_a"] == "sim:beta" and row["model_b"] == "sim:alpha"
    assert {k: row[k] for k in expected.as_dict()} == expected.as_dict()


async def test_one_runs_models_are_compared_pair_by_pair_and_fractional_scores_get_the_sign_flip_test(runs):
    seeds = runs["seeds"]
    data = compare.build(runs["store"], seeds.run_id)
    assert data["mode"] == "models" and data["every_pair"]
    (row,) = data["rows"]
    alpha, beta = _item_means(seeds, "sim:alpha"), _item_means(seeds, "sim:beta")
    assert any(0 < v < 1 for v in [*alpha.values(), *beta.values()])  # three shuffled seeds: fractional items
    expected = stats.paired(alpha, beta)
    assert (row["model_a"], row["model_b"], row["n"], row["test"]) == ("sim:alpha", "sim:beta", 12, "sign-flip")
    assert {k: row[k] for k in expected.as_dict()} == expected.as_dict()
    assert row["a_only_right"] is None and row["resamples"] == 0  # 12 items: every sign pattern
    # the same figures every time (exact here; a fixed seed where it draws)
    assert compare.build(runs["store"], seeds.run_id)["rows"] == data["rows"]
    data = compare.build(runs["store"], seeds.run_id, models=["sim:beta", "sim:alpha"])
    assert data["rows"][0]["difference"] == pytest.approx(-row["difference"])
    assert not data["every_pair"]


async def test_the_cli_prints_every_format(runs, monkeypatch, capsys):
    a, b, db = runs["a"].run_id, runs["b"].run_id, runs["db"]
    data = compare.build(runs["store"], a, b)
    code, text, _ = run_cli(monkeypatch, capsys, "compare", a, b, "--db", db)
    assert code == 0
    head, header, alpha, beta, note = text.splitlines()
    assert head.startswith(f"A = run {a} (job runa), B = run {b} (job runb)")
    assert header.split()[:4] == ["stage", "model", "items", "only"]
    assert alpha.split() == ["mc", "sim:alpha", "20", "1", "1", "90.0%", "50.0%", "-40.0",
                             f"[{100 * data['rows'][0]['low']:+.1f},", f"{100 * data['rows'][0]['high']:+.1f}]",
                             "McNemar", "exact", "(10", "vs", "2", "right", "on", "one", "side", "only)", "0.0386",
                             # B higher on 2 items, equal on 8, lower on 10; Holm over the two rows doubles the
                             # smaller p: 0.0771 (0.03857 twice), over alpha 0.05
                             "2/8/10", "0.0771", "not", "decided", "at", "alpha", "0.05"]
    assert data["rows"][0]["p_holm"] == pytest.approx(2 * data["rows"][0]["p_value"])
    assert beta.split()[:8] == ["mc", "sim:beta", "20", "1", "1", "25.0%", "25.0%", "+0.0"]
    assert "McNemar's exact binomial test" in note and "sign-flip" in note
    code, out, _ = run_cli(monkeypatch, capsys, "compare", a, b, "--db", db, "--format", "json")
    assert code == 0 and json.loads(out) == json.loads(json.dumps(data))
    code, out, _ = run_cli(monkeypatch, capsys, "compare", a, b, "--db", db, "--format", "csv")
    table = list(csv.DictReader(io.StringIO(out)))
    assert [(r["model_a"], r["n"], r["a_only_right"], r["b_only_right"]) for r in table] == [
        ("sim:alpha", "20", "10", "2"), ("sim:beta", "20", "0", "0")]
    assert float(table[0]["p_value"]) == pytest.approx(data["rows"][0]["p_value"])
    code, out, _ = run_cli(monkeypatch, capsys, "compare", a, "--db", db, "--format", "md", "--models", "sim:alpha",
                           "sim:beta")
    assert code == 0 and "| stage | model A | model B | items |" in out
    assert "| mc | sim:alpha | sim:beta | 21 | 0 | 0 | 90.5% | 28.6% |" in out
    page_path = runs["tmp"] / "compare.html"
    code, out, _ = run_cli(monkeypatch, capsys, "compare", a, b, "--db", db, "--format", "html", "-o",
                           str(page_path))
    page = page_path.read_text(encoding="utf-8")
    assert code == 0 and f"wrote {page_path}" in out and page.startswith("<!DOCTYPE html>")
    assert "<td>sim:alpha</td><td>20</td><td>1</td><td>1</td><td>90.0%</td><td>50.0%</td><td>-40.0</td>" in page
    assert html.escape(compare.METHOD_NOTE) in page and "<script" not in page


async def test_refusals_are_one_sentence(runs, monkeypatch, capsys):
    db = runs["db"]
    a, other_stage, other_rows = runs["a"].run_id, runs["other_stage"].run_id, runs["other_rows"].run_id
    cases = [
        (["nope"], "no run 'nope'"),
        ([a, "nope"], "no run 'nope'"),
        ([a, other_stage], f"runs {a} and {other_stage} share no scored stage"),
        ([a, other_rows], f"runs {a} and {other_rows} share no scored items"),
        ([a, other_rows, "--stage", "other"], f"--stage other: run {a} has no scored stage 'other'"),
        ([a, "--models", "sim:alpha", "sim:gamma"], "--models sim:alpha sim:gamma: no scored stage"),
        ([a, "--format", "xml"], "--format must be one of text, json, csv, md, html"),
    ]
    for args, message in cases:
        code, out, err = run_cli(monkeypatch, capsys, "compare", *args, "--db", db)
        assert code == 1 and out == "", (args, out)
        assert err.startswith("Error: ") and message in err and len(err.strip().splitlines()) == 1, (args, err)


async def test_three_runs_give_every_pair_model_by_model_with_holm_across_all_their_rows(runs, monkeypatch, capsys):
    from statsmodels.stats.multitest import multipletests

    ids = [runs[key].run_id for key in ("a", "b", "seeds")]
    data = compare.build_runs(runs["store"], ids)
    pairs = [(ids[0], ids[1]), (ids[0], ids[2]), (ids[1], ids[2])]
    assert [(row["run_a"], row["run_b"]) for row in data["rows"]] == [pair for pair in pairs for _ in range(2)]
    # each row is its pair's own comparison; only the adjustment spans the three pairs
    alone = [row for a, b in pairs for row in compare.build(runs["store"], a, b)["rows"]]
    keep = ("model_a", "model_b", "n", "mean_a", "mean_b", "difference", "p_value", "wins", "ties", "losses")
    assert [{k: row[k] for k in keep} for row in data["rows"]] == [{k: row[k] for k in keep} for row in alone]
    expected = multipletests([row["p_value"] for row in data["rows"]], alpha=0.05, method="holm")[1]
    assert [row["p_holm"] for row in data["rows"]] == pytest.approx(list(expected), abs=1e-12)
    assert all(row["verdict"] in ("A better", "B better", "not decided at alpha 0.05") for row in data["rows"])

    code, out, _ = run_cli(monkeypatch, capsys, "compare", *ids, "--db", runs["db"])
    assert code == 0 and out.splitlines()[0].startswith(f"Runs {ids[0]} (job runa), {ids[1]} (job runb)")
    assert "run A" in out.splitlines()[1] and "p (Holm)" in out.splitlines()[1]
    code, _, err = run_cli(monkeypatch, capsys, "compare", ids[0], ids[1], ids[0], "--db", runs["db"])
    assert code != 0 and "a run is named twice" in err

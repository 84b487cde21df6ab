"""``runner costs``: spend across runs from the ledger, saved money from cache hits, grouped by model, job or day,
with ``--since``, in every format. The runs are real (the engine against the simulated server, priced sim models);
a few ledger rows on other days are inserted by hand."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest

from runner.cli import main
from runner.engine.run import execute
from runner.report import costs
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimServer, start_server

PRICES = {"sim:cheap": {"input": 100.0, "output": 400.0}, "sim:dear": {"input": 3000.0, "output": 9000.0}}
DAY1, DAY2 = "2025-03-01", "2025-03-02"


def _job(folder: Path, url: str, name: str, models: list[str], rows: int, offset: int) -> Path:
    dataset = folder / f"{name}.jsonl"
    dataset.write_text("".join(json.dumps({"question": f"Question {offset + i} for {name}: why?"}) + "\n"
                               for i in range(rows)), encoding="utf-8")
    job = {
        "name": name, "output_dir": str(folder / "results"), "models": models,
        "providers": {"sim": {"base_url": url, "timeout": 10}},
        "params": {"temperature": 0, "max_tokens": 6}, "prices": PRICES,
        "stages": [{"name": "ask", "dataset": {"path": str(dataset)}, "prompt": {"user": "{{ question }}"}}],
    }
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


@pytest.fixture
async def ledger(tmp_path: Path) -> dict:
    """alpha (sim:cheap) run twice, the second time all from the cache; beta (sim:cheap and sim:dear) once; then
    a charge on DAY1 for alpha's first run, a possibly billed row on DAY2 for beta's run, and on DAY2 a reservation
    left by a run the store does not know (not alive: possibly billed too)."""
    store = open_store(tmp_path / "s.sqlite")
    async with await start_server() as server:
        srv: SimServer = server
        alpha = load_job(_job(tmp_path, srv.url, "alpha", ["sim:cheap"], rows=5, offset=0))
        a1 = await execute(alpha, store)
        a2 = await execute(alpha, store)
        beta = load_job(_job(tmp_path, srv.url, "beta", ["sim:cheap", "sim:dear"], rows=4, offset=100))
        b1 = await execute(beta, store)
    assert {a1.status, a2.status, b1.status} == {"completed"}
    reports = {o.run_id: report.build(store, o.run_id) for o in (a1, a2, b1)}
    assert reports[a2.run_id]["totals"]["cache_hits"] == 5 and reports[a2.run_id]["totals"]["saved"] > 0
    [today] = {row["created"][:10] for row in store.ledger()}
    # ledger rows (LEDGER_COLUMNS: run_id, stage, model, key, kind, amount, created, tokens, tier, endpoint) written
    # as the writer does
    store.write_batch(
        [], [],
        [(a1.run_id, "ask", "sim:cheap", "k1", "charge", 0.5, f"{DAY1}T10:00:00.000+00:00", 30, None, "sim:b"),
         (b1.run_id, "ask", "sim:dear", "k2", "possibly_billed", 0.25, f"{DAY2}T11:00:00.000+00:00", 30, None, None),
         ("19990101-000000-dead", "ask", "sim:dear", "k3", "reserved", 0.125, f"{DAY2}T12:00:00.000+00:00", 30,
          None, None)],
    )
    return {"store": store, "today": today, "a1": a1.run_id, "a2": a2.run_id, "b1": b1.run_id, "reports": reports}


def _sent(rep: dict, model: str) -> tuple[int, float]:
    """(requests sent, their cost) of one model in a run's report: what its ledger charges must add up to."""
    rows = [r for r in rep["rows"] if r["model"] == model]
    return sum(r["sent"] for r in rows), sum(r["cost"] for r in rows)


def _by(data: dict) -> dict[str, dict]:
    return {row[data["by"]]: row for row in data["rows"]}


def test_sums_per_model(ledger: dict) -> None:
    reps, a1, a2, b1 = ledger["reports"], ledger["a1"], ledger["a2"], ledger["b1"]
    rows = _by(costs.build(ledger["store"], by="model"))
    assert set(rows) == {"sim:cheap", "sim:dear"}
    cheap_a, cheap_b, dear_b = _sent(reps[a1], "sim:cheap"), _sent(reps[b1], "sim:cheap"), _sent(reps[b1], "sim:dear")
    assert cheap_a[0] == 5 and cheap_b[0] == 4 and dear_b[0] == 4
    cheap, dear = rows["sim:cheap"], rows["sim:dear"]
    assert cheap["runs"] == 3  # alpha's two (the second only saved money) and beta
    assert cheap["requests_charged"] == 5 + 4 + 1
    assert cheap["charged"] == pytest.approx(cheap_a[1] + cheap_b[1] + 0.5, rel=1e-9)
    assert cheap["saved"] == pytest.approx(reps[a2]["totals"]["saved"], rel=1e-9) and cheap["cache_hits"] == 5
    assert cheap["possibly_billed"] == 0
    assert dear["runs"] == 2 and dear["requests_charged"] == 4  # beta, and the unknown run's reservation
    assert dear["charged"] == pytest.approx(dear_b[1], rel=1e-9)
    assert dear["possibly_billed"] == pytest.approx(0.375) and dear["possibly_billed_requests"] == 2
    assert dear["saved"] == 0


def test_sums_per_job_and_per_day(ledger: dict) -> None:
    reps, a1, a2, b1, today = ledger["reports"], ledger["a1"], ledger["a2"], ledger["b1"], ledger["today"]
    jobs = _by(costs.build(ledger["store"], by="job"))
    assert set(jobs) == {"alpha", "beta", costs.UNKNOWN_JOB}
    assert jobs["alpha"]["runs"] == 2 and jobs["alpha"]["requests_charged"] == 6
    assert jobs["alpha"]["charged"] == pytest.approx(reps[a1]["totals"]["cost"] + 0.5, rel=1e-9)
    assert jobs["alpha"]["saved"] == pytest.approx(reps[a2]["totals"]["saved"], rel=1e-9)
    assert jobs["beta"]["runs"] == 1 and jobs["beta"]["requests_charged"] == 8
    assert jobs["beta"]["charged"] == pytest.approx(reps[b1]["totals"]["cost"], rel=1e-9)
    assert jobs["beta"]["possibly_billed"] == pytest.approx(0.25)
    assert jobs[costs.UNKNOWN_JOB]["possibly_billed"] == pytest.approx(0.125)

    data = costs.build(ledger["store"], by="day")
    days = _by(data)
    assert list(days) == [DAY1, DAY2, today]  # chronological
    assert (days[DAY1]["charged"], days[DAY1]["requests_charged"], days[DAY1]["runs"]) == (0.5, 1, 1)
    assert days[DAY2]["possibly_billed"] == pytest.approx(0.375) and days[DAY2]["charged"] == 0
    engine = sum(reps[r]["totals"]["cost"] for r in (a1, b1))
    assert days[today]["charged"] == pytest.approx(engine, rel=1e-9) and days[today]["runs"] == 3
    assert days[today]["requests_charged"] == 13
    t = data["totals"]
    assert t["runs"] == 4 and t["requests_charged"] == 14
    assert t["charged"] == pytest.approx(engine + 0.5, rel=1e-9) and t["possibly_billed"] == pytest.approx(0.375)


def test_sums_per_endpoint_of_a_pooled_model(ledger: dict) -> None:
    rows = _by(costs.build(ledger["store"], by="endpoint"))
    assert set(rows) == {"sim:cheap", "sim:cheap at sim:b", "sim:dear"}
    pooled = rows["sim:cheap at sim:b"]  # the charge a pool's endpoint sim:b answered (the ledger's endpoint column)
    assert (pooled["charged"], pooled["requests_charged"], pooled["runs"]) == (0.5, 1, 1)
    assert rows["sim:cheap"]["requests_charged"] == 5 + 4 and rows["sim:cheap"]["cache_hits"] == 5


def test_since(ledger: dict) -> None:
    store, today = ledger["store"], ledger["today"]
    days = _by(costs.build(store, by="day", since=DAY2))
    assert list(days) == [DAY2, today]
    only_today = costs.build(store, by="model", since=today)
    assert only_today["totals"]["possibly_billed"] == 0 and only_today["totals"]["requests_charged"] == 13
    assert costs.build(store, by="model", since="2999-01-01")["rows"] == []


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["runner", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code or 0, out, err


def test_every_format_through_the_cli(ledger: dict, monkeypatch, capsys) -> None:
    db = ledger["store"].path
    code, out, err = _cli(monkeypatch, capsys, "costs", "--db", db)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("Costs by model")
    assert lines[1].split()[:4] == ["model", "runs", "requests", "charged"]
    assert any(line.startswith("sim:cheap ") for line in lines) and any(line.startswith("total ") for line in lines)
    assert "possibly billed" in out and "saved by 5 cache hits" in out

    code, out, _ = _cli(monkeypatch, capsys, "costs", "--db", db, "--by", "job", "--format", "json")
    data = json.loads(out)
    assert data["by"] == "job" and {r["job"] for r in data["rows"]} == {"alpha", "beta", costs.UNKNOWN_JOB}

    code, out, _ = _cli(monkeypatch, capsys, "costs", "--db", db, "--by", "day", "--format", "csv", "--since", DAY2)
    assert out.splitlines()[0].startswith("day,runs,requests_charged,charged,possibly_billed,saved")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["day"] for r in rows] == [DAY2, ledger["today"], "total"]

    code, out, _ = _cli(monkeypatch, capsys, "costs", "--db", db, "--format", "md")
    assert "| model | runs | requests charged | charged | possibly billed | saved by the cache |" in out
    assert "|---|---|" in out and "| sim:dear | 2 | 4 |" in out


def test_user_errors_are_one_sentence(tmp_path: Path, monkeypatch, capsys) -> None:
    for args, expected in [
        (("--since", "01/03/2025"), "Error: --since must be a date written YYYY-MM-DD (e.g. 2025-01-31), not "
                                    "'01/03/2025'"),
        (("--since", "2025-02-30"), "Error: --since must be a date written YYYY-MM-DD"),
        (("--by", "week"), "Error: --by must be one of model, job, day, endpoint, not 'week'"),
        (("--format", "xml"), "Error: --format must be one of text, json, csv, md, not 'xml'"),
    ]:
        code, out, err = _cli(monkeypatch, capsys, "costs", *args)
        assert code == 1 and len(err.strip().splitlines()) == 1 and err.startswith(expected), err
    code, out, err = _cli(monkeypatch, capsys, "costs")
    assert code == 0 and "no spend recorded" in out


def test_a_run_re_priced_pays_what_its_report_says(ledger: dict) -> None:
    """``runner costs RUN``: per stage and model, what was paid is the report's cost, and the run's own model at its
    job's price costs it again (beta sent every request: none was in the cache)."""
    from runner.report import whatif

    run, rep = ledger["b1"], ledger["reports"][ledger["b1"]]
    data = whatif.build(ledger["store"], run)
    paid = {(r["stage"], r["model"]): r["paid"] for r in data["rows"]}
    assert paid == pytest.approx({(r["stage"], r["model"]): r["cost"] for r in rep["rows"]}, rel=1e-9)
    for row in data["rows"]:
        assert row["target"] == row["model"] and row["cost"] == pytest.approx(row["paid"], rel=1e-9)
    # alpha's second run paid nothing (all from the cache), yet its requests cost what the first run paid for them
    again = whatif.build(ledger["store"], ledger["a2"])["rows"][0]
    assert again["paid"] == 0 and again["sent"] == 0 and again["requests"] == 5
    first = ledger["reports"][ledger["a1"]]["rows"][0]
    assert again["cost"] == pytest.approx(first["cost"], rel=1e-9)

"""Issue 21's acceptance, end to end through the CLI: an MMLU-style CSV (letter gold, a subject column) runs, the
report gives per-subject accuracy with intervals, and `runner compare` gives the paired difference of two models
with its interval and McNemar's test; every figure checked against a hand computation."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.providers.base import Completion
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import run_cli
from tests.plan.test_dataset_formats import MMLU_CSV, mmlu_job, reference_rows


def _answers(model, messages, params, n) -> Completion:
    """``fake:all`` knows every answer; ``fake:arith`` only the arithmetic ones (history: the first wrong option)."""
    content = messages[-1]["content"]
    [row] = [r for r in reference_rows() if r["question"] in content]
    right = row[row["answer"]]
    shown = dict(re.findall(r"^([A-D])\. (.*)$", content, flags=re.M))
    knows = model == "all" or row["subject"] == "arithmetic"
    letter = next(k for k, text in shown.items() if (text == right) == knows)
    return Completion(text=f"The answer is {letter}.", finish_reason="stop", input_tokens=20, output_tokens=4)


def _wilson(right: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    p = right / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.fixture
async def mmlu_run(tmp_path: Path, fake_provider) -> tuple[Path, str]:
    fake_provider.behaviour = _answers
    job = mmlu_job(tmp_path, MMLU_CSV, model="fake:arith")
    job.write_text(job.read_text().replace("models: [fake:arith]", "models: [fake:arith, fake:all]"))
    db = tmp_path / "store.sqlite"
    outcome = await execute(load_job(job), open_store(db))
    assert outcome.status == "completed"
    return db, outcome.run_id


def test_the_report_gives_per_subject_accuracy_with_intervals(mmlu_run, monkeypatch, capsys, fake_provider):
    db, run_id = mmlu_run
    code, out, err = run_cli(monkeypatch, capsys, "report", run_id, "--db", str(db), "--format", "json")
    assert code == 0, err
    rows = {row["model"]: row for row in json.loads(out)["rows"]}
    # 8 rows, 4 arithmetic and 4 history, 2 seeds each
    arith = rows["fake:arith"]
    assert arith["accuracy"] == 0.5 and arith["items"]["n"] == 8
    # over items: 4 right, 4 wrong; SE = sd([1]*4 + [0]*4, n-1) / sqrt(8)
    assert arith["items"]["se"] == pytest.approx(math.sqrt(8 * 0.25 / 7) / math.sqrt(8))
    by_subject = arith["by_field"]["subject"]
    assert (by_subject["arithmetic"]["n"], by_subject["arithmetic"]["mean"]) == (4, 1.0)
    assert (by_subject["history"]["n"], by_subject["history"]["mean"]) == (4, 0.0)
    # every item alike: SE 0, so the Wilson interval of 4 of 4 and of 0 of 4
    assert by_subject["arithmetic"]["ci_method"] == "wilson"
    assert (by_subject["arithmetic"]["low"], by_subject["arithmetic"]["high"]) == pytest.approx(_wilson(4, 4))
    assert (by_subject["history"]["low"], by_subject["history"]["high"]) == pytest.approx(_wilson(0, 4))
    code, text, err = run_cli(monkeypatch, capsys, "report", run_id, "--db", str(db))
    assert code == 0, err
    assert "mmlu by subject" in text
    assert re.search(r"fake:arith\s+arithmetic\s+4\s+100\.0%\s+0\.0\s+\[51\.0%, 100\.0%\]", text), text


def test_compare_gives_the_paired_difference_of_two_models_with_its_interval(mmlu_run, monkeypatch, capsys,
                                                                             fake_provider):
    db, run_id = mmlu_run
    code, out, err = run_cli(monkeypatch, capsys, "compare", run_id, "--db", str(db),
                             "--models", "fake:arith", "fake:all", "--format", "json")
    assert code == 0, err
    found = json.loads(out)
    (pair,) = found["rows"] if "rows" in found else found["comparisons"]
    # B - A on the 8 items: +1 on the 4 history items, 0 on the arithmetic ones
    differences = [1.0] * 4 + [0.0] * 4
    mean = sum(differences) / 8
    se = math.sqrt(sum((d - mean) ** 2 for d in differences) / 7) / math.sqrt(8)
    assert pair["n"] == 8 and (pair["only_a"], pair["only_b"]) == (0, 0)
    assert pair["difference"] == pytest.approx(mean) and (pair["a_only_right"], pair["b_only_right"]) == (0, 4)
    assert (pair["low"], pair["high"]) == pytest.approx((mean - 1.959964 * se, mean + 1.959964 * se))
    # McNemar's exact test: 4 items right in B only, none in A only: p = 2 * 0.5**4
    assert pair["test"] == "mcnemar-exact" and pair["p_value"] == pytest.approx(0.125)
    code, text, err = run_cli(monkeypatch, capsys, "compare", run_id, "--db", str(db),
                              "--models", "fake:arith", "fake:all")
    assert code == 0, err
    assert "+50.0" in text and "mcnemar" in text.lower(), text

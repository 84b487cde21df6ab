"""The papers' report layouts computed from a real run against the simulated server, checked against the
results files."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.errors import JobFileError
from runner.report import layouts
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from runner.store.rows import TaskRow
from simserver import start_server

ROWS = [{"question": f"Item {i}: pick one.", "choices": [f"w{i}", f"x{i}", f"y{i}", f"z{i}"], "gold": i % 4,
         "term": f"term{i}", "meaning": f"meaning {i}"} for i in range(12)]

STAGE = """\
  - name: {name}
    dataset: {{path: rows.jsonl}}
    prompt:
      system: "{{% if setting == 'gold' %}}Given that {{{{ term }}}} means {{{{ meaning }}}}. {{% endif %}}One letter."
      user: "[{name} {{{{ template }}}}] {{{{ question }}}}\\n{{{{ options_block }}}}\\nAnswer:"
    choices: {{seeds: [0, 1, 2], gold: gold}}
    variants: {{setting: [base, gold], template: [0, 1, 2]}}
    parse: letter
"""


def newterm_job(tmp_path: Path, url: str) -> Path:
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    text = (f"name: nt\nmodels: [sim:a, sim:b]\nparams: {{temperature: 0, max_tokens: 5}}\n"
            f"output_dir: {json.dumps(str(tmp_path / 'results'))}\n"
            f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: 16}}}}\n"
            "report: {layout: newterm, tasks: {COMA: coma, COST: cost}}\n"
            "stages:\n" + STAGE.format(name="coma") + STAGE.format(name="cost"))
    path = tmp_path / "nt.yaml"
    path.write_text(text, encoding="utf-8")
    return path


async def test_the_newterm_layout_averages_items_and_templates_then_seeds(tmp_path):
    async with await start_server() as srv:
        job = load_job(newterm_job(tmp_path, srv.url))
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
    assert outcome.status == "completed"
    # Recompute from the results files: per model, task and setting, the mean score of each seed.
    per_seed: dict[tuple[str, str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for task, stage in (("COMA", "coma"), ("COST", "cost")):
        for line in outcome.results[stage].read_text().splitlines():
            r = json.loads(line)
            per_seed[r["model"], task, r["variant"]["setting"]][r["seed"]].append(r["score"])
    data = report.build(store, outcome.run_id)["layout"]
    assert data["layout"] == "newterm" and {row["model"] for row in data["rows"]} == {"sim:a", "sim:b"}
    for row in data["rows"]:
        figures = {}
        for task in ("COMA", "COST"):
            for setting in ("base", "gold"):
                means = [statistics.fmean(v) for _, v in sorted(per_seed[row["model"], task, setting].items())]
                figures[task, setting] = statistics.fmean(means)
                if setting == "base":
                    assert row[task]["mean"] == pytest.approx(figures[task, setting])
                    assert row[task]["std"] == pytest.approx(statistics.stdev(means))
                    assert row[task]["n"] == 12 * 3 * 3  # items × templates × seeds
        assert row["CSJ"] is None
        assert row["Avg"]["mean"] == pytest.approx((figures["COMA", "base"] + figures["COST", "base"]) / 2)
        assert row["Gold"]["mean"] == pytest.approx((figures["COMA", "gold"] + figures["COST", "gold"]) / 2)
    text = report.render(report.build(store, outcome.run_id), "text")
    assert "COMA" in text and "Avg" in text and "Gold" in text and "NewTerm Table 1" in text
    md = report.render(report.build(store, outcome.run_id), "md")
    assert "| model | COMA | COST | CSJ | Avg | Gold |" in md


def test_a_layout_naming_a_missing_stage_is_a_job_file_error(tmp_path):
    path = newterm_job(tmp_path, "http://127.0.0.1:9/v1")
    path.write_text(path.read_text().replace("COST: cost", "COST: nosuch"), encoding="utf-8")
    with pytest.raises(JobFileError, match=r"report\.tasks\.COST: no stage named 'nosuch'"):
        load_job(path)


def test_cells_show_mean_and_std_in_percent():
    assert layouts.cell({"mean": 0.7018, "std": 0.0123}) == "70.18 ± 1.23"
    assert layouts.cell({"mean": 0.5, "std": None}) == "50.00"
    assert layouts.cell(None) == "-"


def test_the_report_says_which_stages_used_the_reference_scoring():
    job = {"stages": [{"name": "coma", "choices": {"seeds": [0, 1, 2]}, "scoring": "newterm-reference"},
                      {"name": "csj", "scoring": "newterm-reference"}, {"name": "cost", "choices": {"seeds": [0]}}]}
    note = report._shuffle_note({"job_json": json.dumps(job)})
    assert note == {"coma": {"shuffle": True, "seeds": [0, 1, 2], "scoring": "newterm-reference"},
                    "csj": {"shuffle": False, "seeds": None, "scoring": "newterm-reference"},
                    "cost": {"shuffle": True, "seeds": [0]}}


async def test_the_report_breaks_accuracy_down_by_variant_and_shows_position_bias(tmp_path):
    async with await start_server() as srv:
        job = load_job(newterm_job(tmp_path, srv.url))
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
    built = report.build(store, outcome.run_id)
    lines = [json.loads(x) for x in outcome.results["coma"].read_text().splitlines()]
    for row in (r for r in built["rows"] if r["stage"] == "coma"):
        mine = [x for x in lines if x["model"] == row["model"]]
        for key in ("setting", "template"):
            expected = defaultdict(list)
            for x in mine:
                expected[str(x["variant"][key])].append(x["score"])
            assert row["accuracy_by_variant"][key] == pytest.approx(
                {k: statistics.fmean(v) for k, v in expected.items()})
        bias = row["position_bias"]
        assert set(bias) == {"A", "B", "C", "D"}
        assert sum(b["chosen"] for b in bias.values()) == pytest.approx(1.0)
        valid = [x for x in mine if x.get("valid")]
        gold_a = sum(1 for x in valid if x["permutation"].index(x["gold"]) == 0) / len(valid)
        assert bias["A"]["gold"] == pytest.approx(gold_a)
        assert row["balanced_accuracy"] is None  # the golds are option indices, not true/false
    text = report.render(built, "text")
    assert "by template: 0 " in text and "answers by position (chosen/gold): A " in text


def test_balanced_accuracy_for_true_false_golds(tmp_path):
    store = open_store(tmp_path / "s.sqlite")
    run_id = store.create_run("j", "j.yaml", json.dumps({"name": "j", "stages": []}), "fp", 4)
    results = [(True, 1.0), (True, 1.0), (True, 0.0), (False, 1.0)]  # recall 2/3 on true, 1/1 on false
    store.write_batch([TaskRow(run_id, "csj", str(i), "m", str(i), "{}", f"k{i}", "done", 0, 1, None, None, 1, 1, 0.0,
                               0.1, sc, 1, json.dumps({"gold": g, "score": sc, "valid": True, "variant": {}}), 0,
                               0.0, None)
                       for i, (g, sc) in enumerate(results)], [], [])
    (row,) = report.build(store, run_id)["rows"]
    assert row["balanced_accuracy"] == pytest.approx((2 / 3 + 1) / 2)
    assert row["accuracy"] == pytest.approx(0.75)


def test_a_layout_may_relabel_a_column_in_text_and_markdown():
    data = {"columns": ["with_gold", "no_hint"], "rows": [{"model": "m", "with_gold": {"mean": 0.5, "std": None},
                                                          "no_hint": None}], "note": "n"}
    assert layouts.render_text(data)[0].split() == ["model", "with_gold", "no_hint"]
    data["labels"] = {"no_hint": "no_hint (judged by sim:j)"}
    assert layouts.render_text(data)[0].startswith("model  with_gold  no_hint (judged by sim:j)")
    assert layouts.render_text(data, markdown=True)[0] == "| model | with_gold | no_hint (judged by sim:j) |"

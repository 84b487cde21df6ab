"""WinoDict end to end: jobs/winodict-build.yaml builds a slice of items, jobs/winodict-eval.yaml scores each twin
by the log-likelihood of its continuation (0, 1 and 5 shots) and asks chat models in the prompt form, and
`runner report` prints the paper's Table 2 layout.

On the simulated server (its /v1/completions answers echo + logprobs by a rule a test can recompute) the sums
and choices are checked by hand; on the embedded model and on llama.cpp's own server (slow) the job runs on a
7-item slice (one twin, every form of its word) and its table prints. The embedded model answers at chance: only
shapes and agreement are pinned.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.providers.base import ProviderSettings
from runner.report import layouts
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimConfig, start_server
from simserver.completions import token_logprobs, tokens
from tests.helpers import ROOT, run_cli

BUILD = ROOT / "jobs" / "winodict-build.yaml"
EVAL = ROOT / "jobs" / "winodict-eval.yaml"
SLICE = 20
#: one twin's seven items (its five synthetic-word buckets, the original word with its definition and without)
SLOW_SLICE = 7
#: items scored on the embedded model and on llama.cpp's server: one twin's three kinds, a synthetic word and the
#: original word with its definition and without (each item at 0, 1 and 5 shots costs the embedded model about 5 s of
#: CPU, and llama.cpp's server about 8 s a zero-shot request on a slow day; the simulated server's test checks every
#: bucket by hand)
EMBEDDED_KINDS = ("prob1_of_5", "unchanged", "unchanged-none")
SHOTS = (0, 1, 5)


@pytest.fixture
def items(tmp_path, monkeypatch, capsys) -> Path:
    """A 20-twin slice built by the build job (140 items: 20 twins x 6 buckets, and the original words also
    without a definition)."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "built"
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(BUILD), "--limit", str(SLICE), "--db",
                           str(tmp_path / "build.sqlite"), "--var", f"out={out}")
    assert code == 0, err
    return out / "winodict.jsonl"


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def continuation_logprob(model: str, context: str, continuation: str) -> float:
    """The simulated server's summed log-probability of ``continuation`` after ``context``: the tokens of the whole
    text that start at or after the context's end (what the provider sums from the echoed logprobs)."""
    text = context + continuation
    total, offset = 0.0, 0
    for token, logprob in zip(tokens(text), token_logprobs(model, text), strict=True):
        if offset >= len(context):
            total += logprob
        offset += len(token)
    return total


async def test_winodict_on_the_simulated_server_scores_each_twin_by_hand(tmp_path, items):
    rows = {row["id"]: row for row in read(items)[:SLICE]}
    assert {row["bucket"] for row in rows.values()} == {"prob1_of_5", "prob2_of_5", "prob3_of_5", "prob4_of_5",
                                                         "prob5_of_5", "unchanged"}, "a slice spans every bucket"
    async with await start_server(SimConfig()) as server:
        job = load_job(EVAL, {"items": str(items), "model": "sim:lm", "chat_model": "sim:chat"})
        job.limit, job.output_dir = SLICE, str(tmp_path / "results")
        job.providers["sim"] = ProviderSettings(base_url=server.url)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        assert outcome.status == "completed", outcome.message
        scored = read(outcome.results["loglikelihood"])
        assert len(scored) == SLICE * len(SHOTS)
        for line in scored:
            row, shots = rows[line["id"]], line["variant"]["shots"]
            prefix = "".join(example + "\n\n" for example in row["examples"][:shots])
            expected = [continuation_logprob("lm", prefix + context, row["continuation"])
                        for context in row["contexts"]]
            assert line["logprobs"] == pytest.approx(expected, abs=1e-6)
            best = 0 if expected[0] >= expected[1] else 1
            assert line["parsed"] == best and line["score"] == float(best == row["label"])
            # the recorded fields, and the key concept the stage clusters by
            assert line["fields"] == {"bucket": row["bucket"], "pos": row["pos"], "strategy": row["strategy"],
                                      "lemma": row["lemma"]}
        chat = read(outcome.results["prompt_form"])
        assert len(chat) == SLICE * 3 and all(line["valid"] for line in chat)

        data = report.build(store, outcome.run_id)
        layout = data["layout"]
        assert layout["columns"] == ["WinoDict 0-shot", "WinoDict 1-shot", "WinoDict 5-shot", "Original 0-shot",
                                     "Original 1-shot", "Original 5-shot", "Original Def Suffix 0-shot",
                                     "Original Def Suffix 1-shot", "Original Def Suffix 5-shot",
                                     "prompt form WinoDict", "prompt form Original",
                                     "prompt form Original with definition"]
        by_model = {row["model"]: row for row in layout["rows"]}
        # Table 2's Original: the original words without a definition; Table 3's Original / Def Suffix: with it
        for shots in SHOTS:
            for column, strategy in (("Original", "none"), ("Original Def Suffix", "definition_last")):
                mine = [line["score"] for line in scored if line["variant"]["shots"] == shots
                        and line["fields"]["bucket"] == "unchanged" and line["fields"]["strategy"] == strategy]
                assert mine, (column, shots)
                figure = by_model["sim:lm"][f"{column} {shots}-shot"]
                assert figure["mean"] == pytest.approx(sum(mine) / len(mine)) and figure["n"] == len(mine)
        chat_by = {}
        for line in chat:
            kind = ("Original" if line["fields"]["bucket"] == "unchanged" else "WinoDict",
                    line["fields"]["strategy"])
            chat_by.setdefault(kind, []).append(line["score"])
        assert set(chat_by) == {("WinoDict", "definition_last"), ("Original", "definition_last"), ("Original", "none")}
        for name, kind in (("prompt form Original", ("Original", "none")),
                           ("prompt form Original with definition", ("Original", "definition_last"))):
            assert by_model["sim:chat"][name]["mean"] == pytest.approx(sum(chat_by[kind]) / len(chat_by[kind]))
        five = by_model["sim:lm"]["WinoDict 5-shot"]
        per_bucket = {}
        for line in scored:
            if line["variant"]["shots"] == 5 and line["fields"]["bucket"] != "unchanged":
                per_bucket.setdefault(line["fields"]["bucket"], []).append(line["score"])
        means = [sum(v) / len(v) for v in per_bucket.values()]
        assert five["mean"] == pytest.approx(sum(means) / len(means)) and five["seeds"] == 5
        text = "\n".join(layouts.render_text(layout))
        assert "WinoDict 0-shot" in text and "sim:lm" in text and "sim:chat" in text
        received = server.stats()["received"]

        again = await execute(job, store)  # unchanged: everything from the memo (or replayed), nothing sent
        assert again.status == "completed" and server.stats()["received"] == received


def test_a_chat_only_model_in_the_loglikelihood_stage_fails_with_a_sentence(tmp_path, items, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    code, out, err = run_cli(monkeypatch, capsys, "submit", str(EVAL), "--limit", "2", "--db",
                             str(tmp_path / "s.sqlite"), "--var", f"items={items}", "--var", "model=openai:gpt-4o-mini",
                             "--var", "chat_model=local:smollm2")
    assert code == 2
    [error] = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert error.startswith("Error: "), err
    assert "stage loglikelihood scores log-likelihoods, and openai:gpt-4o-mini cannot score" in err
    assert "Traceback" not in err and "run " not in out  # refused before a run was created


def first_twin_kinds(items: Path, folder: Path) -> tuple[Path, list[dict]]:
    """The first twin's EMBEDDED_KINDS items, in a file of their own: (its path, the items)."""
    first_twin = read(items)[:SLOW_SLICE]
    chosen = [row for row in first_twin if row["id"].split("-", 2)[2] in EMBEDDED_KINDS]
    assert len(chosen) == len(EMBEDDED_KINDS), [row["id"] for row in first_twin]
    three = folder / "three.jsonl"
    three.write_text("".join(json.dumps(row) + "\n" for row in chosen), encoding="utf-8")
    return three, chosen


@pytest.mark.slow  # the embedded model on nine 0-, 1- and 5-shot pairs and nine chat answers: one to two minutes
async def test_winodict_on_the_embedded_model_prints_the_table(tmp_path, items):
    three, chosen = first_twin_kinds(items, tmp_path)
    job = load_job(EVAL, {"items": str(three)})
    job.output_dir = str(tmp_path / "results")
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed", outcome.message
    scored = read(outcome.results["loglikelihood"])
    assert len(scored) == len(chosen) * len(SHOTS)
    assert all(line["valid"] and len(line["logprobs"]) == 2 and all(lp < 0 for lp in line["logprobs"])
               for line in scored)
    chat = read(outcome.results["prompt_form"])
    assert len(chat) == len(chosen) * 3  # three choice seeds each
    layout = report.build(store, outcome.run_id)["layout"]
    [row] = layout["rows"]
    assert all(row.get(f"WinoDict {n}-shot") is not None and row.get(f"Original {n}-shot") is not None
               and row.get(f"Original Def Suffix {n}-shot") is not None for n in SHOTS)
    text = report.render(report.build(store, outcome.run_id), "text")
    assert "WinoDict 5-shot" in text and "Original 0-shot" in text


@pytest.mark.slow
async def test_winodict_on_llama_cpp_server_prints_the_table(tmp_path, items, llama_server):
    """The same GGUF behind llama.cpp's own server (openai-compatible: echo + logprobs) takes the same three items at
    zero shots and the table prints. Its figures are not the embedded model's: llama-cpp-python 0.3.36's server
    returns prompt logprobs shifted by one token (the upstream bug DESIGN notes;
    tests/providers/test_loglikelihood_providers.py pins it), so only the shape is checked here."""
    text = EVAL.read_text(encoding="utf-8").replace(
        "params: {temperature: 0, max_tokens: 8}",
        f"params: {{temperature: 0, max_tokens: 8}}\nendpoints: {{llama: {{base_url: {json.dumps(llama_server.url)},"
        " timeout: 120}}", 1)
    path = tmp_path / "winodict-eval.yaml"
    path.write_text(text, encoding="utf-8")
    three, chosen = first_twin_kinds(items, tmp_path)
    job = load_job(path, {"items": str(three), "model": "openai-compatible:llama/smollm2"})
    job.output_dir = str(tmp_path / "results")
    job.stages = [stage for stage in job.stages if stage.name == "loglikelihood"]
    # zero-shot only: the server computes every prompt token's logprobs in Python, about 15 s for a 5-shot pair
    job.stages[0].variants = {"shots": [0]}
    assert job.report is not None
    job.report.chat_stage = None
    store = open_store(tmp_path / "s.sqlite")
    served = await execute(job, store)
    assert served.status == "completed", served.message
    scored = read(served.results["loglikelihood"])
    assert len(scored) == len(chosen)
    assert all(line["valid"] and len(line["logprobs"]) == 2 and all(lp < 0 for lp in line["logprobs"])
               for line in scored)
    data = report.build(store, served.run_id)
    [row] = data["layout"]["rows"]
    assert row["model"] == "openai-compatible:llama/smollm2"
    assert row.get("WinoDict 0-shot") is not None and row.get("Original 0-shot") is not None
    assert "WinoDict 0-shot" in report.render(data, "text")

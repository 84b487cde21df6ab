"""The quickstart job end-to-end on the real embedded model (SmolLM2-135M via llama-cpp-python).

The model answers at about chance level, so these tests pin the shape and determinism of its output,
never its correctness.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
import yaml

from runner.cli import main
from runner.providers.base import ProviderSettings
from runner.providers.local import LocalProvider
from tests.helpers import ROOT


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["runner", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code or 0, out, err


def test_quickstart_on_three_items_then_all_cache_hits(tmp_path, monkeypatch, capsys):
    job = yaml.safe_load((ROOT / "jobs" / "quickstart.yaml").read_text())
    job["stages"][0]["dataset"]["limit"] = 3
    job["output_dir"] = str(tmp_path / "results")
    path = tmp_path / "quickstart3.yaml"
    path.write_text(yaml.safe_dump(job))
    monkeypatch.chdir(ROOT)  # the job names data/ and prompts/ from the project root, as a user runs it

    code, out, err = _cli(monkeypatch, capsys, "submit", str(path))
    assert code == 0, err
    assert "Traceback" not in err
    run_id = re.search(r"run (\S+): completed", out).group(1)
    assert re.search(r"^accuracy: coma local:smollm2-135m-instruct: \d+\.\d% ± \d+\.\d over seeds \[0, 1, 2\]",
                     out, re.M)
    assert re.search(r"^cost: \$0\.0000 for 9 requests", out, re.M)

    results = tmp_path / "results" / "quickstart" / run_id / "coma.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(rows) == 9
    assert {(r["id"], r["seed"]) for r in rows} == {(str(i), s) for i in (1, 2, 3) for s in (0, 1, 2)}
    for r in rows:
        assert r["model"] == "local:smollm2-135m-instruct" and r["status"] == "done"
        assert isinstance(r["response"], str) and sorted(r["permutation"]) == [0, 1, 2, 3]
        assert len(r["cache_key"]) == 64
        if r["valid"]:
            assert r["parsed"] == r["permutation"]["ABCD".index(r["answer_letter"])]
            assert r["score"] == float(r["parsed"] == r["gold"])
        else:
            assert r["score"] == 0.0 and r["invalid_reason"]

    code, out, err = _cli(monkeypatch, capsys, "report", run_id, "--format", "json")
    data = json.loads(out)
    row = data["rows"][0]
    assert row["requests"] == 9 and row["scored"] == 9 and set(row["accuracy_by_seed"]) == {"0", "1", "2"}
    assert row["input_tokens"] > 0 and row["latency_p50"] > 0

    code, out, err = _cli(monkeypatch, capsys, "submit", str(path))
    assert code == 0, err
    assert "(0 sent, 9 cache hits = 100.0%, 0 failed)" in out
    second_id = re.search(r"run (\S+): completed", out).group(1)
    again = [json.loads(line) for line in
             (tmp_path / "results" / "quickstart" / second_id / "coma.jsonl").read_text().splitlines()]
    assert [r["response"] for r in again] == [r["response"] for r in rows]


async def test_embedded_model_is_deterministic_at_temperature_zero():
    provider = LocalProvider(ProviderSettings())
    await provider.start()
    try:
        messages = [{"role": "system", "content": "Answer with one letter."},
                    {"role": "user", "content": "Which is a fruit?\nA. carrot\nB. apple\nAnswer:"}]
        first = await provider.execute("smollm2", messages, {"temperature": 0.0, "max_tokens": 6})
        second = await provider.execute("smollm2", messages, {"temperature": 0.0, "max_tokens": 6})
    finally:
        await provider.aclose()
    assert first.text == second.text and first.text.strip()
    assert first.input_tokens == second.input_tokens > 10
    assert 0 < first.output_tokens <= 6
    assert first.finish_reason in ("stop", "length")


def test_a_missing_local_model_file_fails_the_run_in_one_line(tmp_path, monkeypatch, capsys):
    job = yaml.safe_load((ROOT / "jobs" / "quickstart.yaml").read_text())
    job["providers"] = {"local": {"model_path": str(tmp_path / "missing.gguf")}}
    job["output_dir"] = str(tmp_path / "results")
    path = tmp_path / "bad-model.yaml"
    path.write_text(yaml.safe_dump(job))
    monkeypatch.chdir(ROOT)
    code, out, err = _cli(monkeypatch, capsys, "submit", str(path))
    assert code == 1
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "missing.gguf does not exist" in errors[0] and "model_path" in errors[0]

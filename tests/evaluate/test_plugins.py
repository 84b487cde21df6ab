"""One's own parser and scorer (runner.evaluate.plugins): named by import path beside the job or by an installed
entry point, read and scored through the shown order, their failures kept apart from the paid answers, and a
missing one refused by the job check naming the key."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.engine.run import execute
from runner.errors import JobFileError
from runner.evaluate import plugins
from runner.providers.base import Completion
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import ROOT, write_rows

EXAMPLE = Path(__file__).resolve().parents[1] / "data" / "plugins" / "option_words.py"


@pytest.fixture(autouse=True)
def _fresh_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test loads its plug-ins anew (the loader remembers them per process)."""
    monkeypatch.setattr(plugins, "_loaded", {})
    plugins.entry_point_names.cache_clear()
    for name in ("option_words", "broken_words", "mypkg", "mypkg.scoring"):  # not a walk over sys.modules: a thread
        sys.modules.pop(name, None)  # another test left running may import meanwhile


def _job(tmp_path: Path, stage: str, *, seeds: str = "[0, 1, 2]", choices: bool = True) -> Path:
    shutil.copy(EXAMPLE, tmp_path / "option_words.py")
    dataset = write_rows(tmp_path / "rows.jsonl", 6)
    text = "\n".join(line for line in [
        "name: plugins",
        'models: ["fake:m1"]',
        "params: {temperature: 0, max_tokens: 50}",
        f"output_dir: {json.dumps(str(tmp_path / 'results'))}",
        "stages:",
        "  - name: mc",
        f"    dataset: {{path: {json.dumps(str(dataset))}}}",
        "    prompt:",
        "      user: \"{{ question }}\\n{{ options_block }}\\nAnswer:\"",
        f"    choices: {{seeds: {seeds}, gold: gold}}" if choices else "    gold: gold",
        stage,
    ] if line) + "\n"
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _lines(outcome: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in outcome.results["mc"].read_text().splitlines()]


def _shown(messages: list[dict[str, str]]) -> list[str]:
    """The option texts of a prompt, in the order shown (``A. text`` lines)."""
    return [line[3:] for line in messages[-1]["content"].splitlines() if line[:3] in ("A. ", "B. ", "C. ", "D. ")]


async def test_an_own_parser_beside_the_job_reads_answers_mapped_back_through_the_shown_order(tmp_path,
                                                                                             fake_provider):
    job = load_job(_job(tmp_path, "    parse: option_words:last_option_named"))

    def reply(model, messages, params, n):
        shown = _shown(messages)
        # names the shown A first, then settles on the shown C: the parser takes the last one named
        return Completion(text=f"Maybe {shown[0]}... no: {shown[2]}.", input_tokens=20, output_tokens=5)

    fake_provider.behaviour = reply
    rows = _lines(await execute(job, open_store(tmp_path / "s.sqlite")))
    assert len(rows) == 18 and len({tuple(r["permutation"]) for r in rows}) > 1
    for r in rows:
        assert r["valid"] is True and r["answer_letter"] == "C"
        assert r["parsed"] == r["permutation"][2]
        assert r["score"] == (1.0 if r["parsed"] == r["gold"] else 0.0)


async def test_an_own_scorer_gives_partial_credit_and_invalid_answers_score_zero(tmp_path, fake_provider):
    job = load_job(_job(tmp_path, "    parse: option_words:last_option_named\n"
                                  "    scorer: option_words:partial_credit", seeds="[0]"))
    answers = ["first 0", "third 1", "fourth 2", "no idea at all", "nothing here", "fourth 5"]

    def reply(model, messages, params, n):
        number = int(messages[-1]["content"].split("Question number ")[1].split(":")[0])
        return Completion(text=answers[number], input_tokens=20, output_tokens=5)

    fake_provider.behaviour = reply
    rows = sorted(_lines(await execute(job, open_store(tmp_path / "s.sqlite"))), key=lambda r: int(r["id"]))
    # golds are i % 4: 0, 1, 2, 3, 0, 1; the answers name options 0, 2, 3, none, none, 3
    assert [r["score"] for r in rows] == [1.0, 0.5, 0.5, 0.0, 0.0, 0.0]
    assert rows[3]["valid"] is False and rows[3]["invalid_reason"] == "the model said it has no idea"
    assert rows[4]["valid"] is False and rows[4]["invalid_reason"] == "the parser found no answer"


async def test_an_own_scorer_scores_a_text_stage(tmp_path, fake_provider):
    (tmp_path / "exact_words.py").write_text(
        "def same_words(parsed, gold):\n    return parsed.lower().split() == str(gold).lower().split()\n")
    rows_path = tmp_path / "rows.jsonl"
    rows_path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n"
                                 for q, a in [("2+2?", "four"), ("Capital of France?", "Paris")]))
    path = tmp_path / "job.yaml"
    path.write_text("\n".join([
        "name: words", 'models: ["fake:m1"]', f"output_dir: {json.dumps(str(tmp_path / 'out'))}", "stages:",
        "  - name: mc", f"    dataset: {{path: {json.dumps(str(rows_path))}}}",
        "    prompt: {user: \"{{ question }}\"}", "    gold: answer", "    scorer: exact_words:same_words"]) + "\n")
    fake_provider.behaviour = lambda m, messages, p, n: Completion(
        text="  FOUR " if "2+2" in messages[-1]["content"] else "Lyon", input_tokens=5, output_tokens=1)
    rows = {r["gold"]: r for r in _lines(await execute(load_job(path), open_store(tmp_path / "s.sqlite")))}
    assert rows["four"]["score"] == 1.0 and rows["Paris"]["score"] == 0.0


async def test_a_parser_that_crashes_or_returns_no_option_keeps_the_answer_marked_and_the_run_told(
        tmp_path, fake_provider):
    (tmp_path / "broken_words.py").write_text(
        "def crash(answer, *, options, row):\n    return options[99]\n\n"
        "def beyond(answer, *, options, row):\n    return 7\n")
    for name, reason in [("crash", "parser broken_words:crash failed: IndexError: list index out of range"),
                         ("beyond", "the parser broken_words:beyond returned 7, not the index of one of the 4 options "
                                    "shown")]:
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(tmp_path / "broken_words.py", folder / "broken_words.py")
        job = load_job(_job(folder, f"    parse: broken_words:{name}", seeds="[0]"))
        outcome = await execute(job, open_store(folder / "s.sqlite"))
        rows = _lines(outcome)
        assert len(rows) == 6
        assert all(r["response"] == "A" and r["valid"] is False and r["invalid_reason"] == reason for r in rows)
        # the parser's fault, not the model's: not scored, and said once to the run
        assert all(r["score"] is None for r in rows)
        assert outcome.stats.notes.count(reason) == 1
        sys.modules.pop("broken_words", None)
        plugins._loaded.clear()


@pytest.mark.parametrize(("stage", "message"), [
    ("    parse: no_such_module:read", "mc.parse: the parser 'no_such_module:read': no module named 'no_such_module'"),
    ("    parse: option_words:missing", "the parser 'option_words:missing': module 'option_words' has no 'missing'"),
    ("    parse: option_words:__doc__", "the parser 'option_words:__doc__' is not a function (it is a str)"),
    ("    scorer: not_installed_scorer", "no scorer named 'not_installed_scorer': name one by import path"),
])
def test_a_parser_or_scorer_that_cannot_be_loaded_is_refused_naming_the_line_and_key(tmp_path, stage, message):
    path = _job(tmp_path, "    parse: letter\n" + stage if stage.lstrip().startswith("scorer") else stage)
    with pytest.raises(JobFileError) as caught:
        load_job(path)
    text = str(caught.value)
    assert message.split(": ", 1)[-1] in text, text
    key = "scorer" if "scorer" in stage else "parse"
    assert f"job.yaml:{12 if key == 'scorer' else 11}: stages[0].{key}:" in text, text


def test_the_cli_refuses_a_missing_parser_in_one_line(tmp_path):
    path = _job(tmp_path, "    parse: no_such_module:read")
    proc = subprocess.run([sys.executable, "-m", "runner.cli", "validate", str(path)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "no module named 'no_such_module'" in proc.stderr


async def test_a_scorer_an_installed_package_registers_as_an_entry_point(tmp_path, fake_provider, monkeypatch):
    site = tmp_path / "site"
    (site / "mypkg").mkdir(parents=True)
    (site / "mypkg" / "__init__.py").write_text("")
    (site / "mypkg" / "scoring.py").write_text("def never(parsed, gold):\n    return False\n")
    info = site / "mypkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[llm_job_runner.scorers]\nnever_right = mypkg.scoring:never\n")
    monkeypatch.syspath_prepend(str(site))
    plugins.entry_point_names.cache_clear()
    job = load_job(_job(tmp_path, "    parse: letter\n    scorer: never_right", seeds="[0]"))
    fake_provider.behaviour = lambda *a: Completion(text="A", input_tokens=5, output_tokens=1)
    rows = _lines(await execute(job, open_store(tmp_path / "s.sqlite")))
    assert len(rows) == 6 and all(r["valid"] is True and r["score"] == 0.0 for r in rows)
    assert ROOT  # the repository root is importable for the CLI tests above

"""Text from outside never drives the user's terminal: a provider's error body carrying escape sequences (retitle,
clear screen, 8-bit CSI, DCS) reaches the live view, the plain log, the CLI's ``Error:`` lines and ``runner
report`` with its printable part and without a single control character."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from runner.engine.run import execute
from runner.errors import AuthError, BadRequest
from runner.report import summary as reports
from runner.report.progress import LiveView, PlainView
from runner.report.terminal import clean, clean_lines
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import run_cli, write_job, write_rows

#: an error body as a hostile or broken server could send it: OSC title (BEL- and ST-ended), clear screen, SGR,
#: cursor moves, an 8-bit CSI, a DCS query, OSC 52 (clipboard), a bare CR that would overwrite the line, NUL, DEL
HOSTILE = ("\x1b]0;owned\x07\x1b[2J\x1b[H\x1b[31mquota page\x1b[0m says: \x9b2Jtry later\r\x00\x7f "
           "\x1bP+q544e\x1b\\\x1b]52;c;ZXZpbA==\x1b\\(code 42)\x1bc\x90junk\x9c")
PRINTABLE = ["quota page", "says:", "try later", "(code 42)"]
#: C0 controls but newline, DEL and C1 controls
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def assert_safe(text: str) -> None:
    assert not CONTROL.search(text), repr(text)
    for part in PRINTABLE:
        assert part in text, (part, text)
    assert "owned" not in text and "ZXZpbA" not in text  # a title or clipboard payload is not shown either


def test_clean_drops_sequences_and_controls_and_keeps_the_rest() -> None:
    assert_safe(clean(HOSTILE))
    assert clean("plain text, é 新 👍") == "plain text, é 新 👍"
    assert clean("two\nlines\tand a tab") == "two lines and a tab"
    assert clean("two\r\nlines\tand a tab", newlines=True) == "two\nlines\tand a tab"
    assert clean("\x1b[38;2;255;0;0mred\x1b[m \x1b(B\x1b7saved\x1b8") == "red saved"
    assert clean("an unended title \x1b]0;never ends\nnext line", newlines=True) == "an unended title \nnext line"
    assert clean("lone escape at the end \x1b") == "lone escape at the end "
    assert clean(42) == "42"
    assert clean_lines(["a\x07b", "c\nd"]) == ["ab", "c\nd"]


async def test_the_live_view_and_the_plain_log_show_the_error_without_its_escapes(tmp_path, fake_provider) -> None:
    dataset = write_rows(tmp_path / "rows.jsonl", 4)
    job = load_job(write_job(tmp_path / "job.yaml", dataset, models=["fake:m1"]))
    fake_provider.behaviour = lambda m, msgs, p, n: BadRequest(HOSTILE, status=400) \
        if "number 2" in msgs[-1]["content"] else None
    plain_out = io.StringIO()
    plain = PlainView(plain_out, 10)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store, view=plain)
    assert outcome.status == "completed"
    assert HOSTILE in outcome.stats.last_error["fake:m1"]  # kept as it came; cleaned where it is shown
    plain.note(f"a note quoting it: {HOSTILE}")
    assert "last error fake:m1: bad_request:" in plain_out.getvalue()
    assert_safe(plain_out.getvalue())

    console = Console(record=True, width=200, file=io.StringIO(), force_terminal=False, color_system=None)
    live = LiveView(io.StringIO(), console=console)
    live.stats = outcome.stats
    live.title = f"job {HOSTILE}"
    live.note(HOSTILE)
    console.print(live.render())
    shown = console.export_text()
    assert "last error fake:m1" in shown
    assert_safe(shown)

    text = reports.render(reports.build(store, outcome.run_id), "text")
    assert not CONTROL.search(text)


def test_the_cli_error_line_shows_the_error_without_its_escapes(monkeypatch, capsys, tmp_path,
                                                                fake_provider) -> None:
    dataset = write_rows(tmp_path / "rows.jsonl", 3)
    path = write_job(tmp_path / "job.yaml", dataset, models=["fake:m1"])
    fake_provider.behaviour = lambda m, msgs, p, n: AuthError(f"key refused: {HOSTILE}", status=401)
    monkeypatch.setenv("RUNNER_PROGRESS_INTERVAL", "0.05")
    code, out, err = run_cli(monkeypatch, capsys, "submit", str(path))
    assert code != 0
    assert "Error:" in err and "key refused" in err
    assert_safe(err)
    assert not CONTROL.search(out)


@pytest.mark.parametrize("fmt", ["text", "md"])
async def test_report_text_and_md_carry_no_control_characters(tmp_path, fake_provider, fmt) -> None:
    # a report's text from outside: a Batch API's ids and states, the names of the run (here planted)
    dataset = write_rows(tmp_path / "rows.jsonl", 3)
    job = load_job(write_job(tmp_path / "job.yaml", dataset, models=["fake:m1"]))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    data = reports.build(store, outcome.run_id)
    data["run"]["job_name"] = HOSTILE
    data["rows"][0]["model"] = f"fake:{HOSTILE}"
    data["batches"] = [{"stage": "mc", "model": "fake:m1", "provider_batch_id": f"b-{HOSTILE}", "round": 0,
                        "lines": 3, "state": "ended", "provider_state": HOSTILE, "by_status": {"done": 3}}]
    text = reports.render(data, fmt)
    assert_safe(text)
    assert "quota page" in text.splitlines()[0]  # the head line

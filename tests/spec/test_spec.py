"""Job-file validation: every error names ``file:line``, the dotted key and what is wrong; the CLI turns it into
one ``Error: ...`` line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import runner.cli
from runner.errors import JobFileError
from runner.spec.job import load_job

ROWS = [
    {"question": "q1", "choices": ["a", "b", "c", "d"], "gold": 1, "split": "cause"},
    {"question": "q2", "choices": ["a", "b", "c", "d"], "gold": 2, "split": "cause"},
    {"question": "q3", "choices": ["a", "b", "c", "d"], "gold": 0, "split": "cause"},
]

# Line numbers matter: the tests below assert them. Keep this text as it is (append, never insert).
BASE = """\
name: test-job
models:
  - sim:gpt-test
params:
  temperature: 0
  max_tokens: 16
providers:
  sim:
    rpm: 100
stages:
  - name: mc
    dataset:
      path: DATASET
    prompt:
      system: "Answer with one letter."
      user: "{{ question }}\\n{{ options_block }}"
    choices:
      seeds: [0]
      gold: gold
    parse: letter
"""
# line:        1 name, 2 models, 3 - sim:gpt-test, 4 params, 5 temperature, 6 max_tokens, 7 providers, 8 sim,
#              9 rpm, 10 stages, 11 - name: mc, 12 dataset, 13 path, 14 prompt, 15 system, 16 user, 17 choices,
#              18 seeds, 19 gold, 20 parse


def write_dataset(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    return path


def write_job(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    """Write a job whose dataset is an absolute path to a 3-row file in ``tmp_path``."""
    dataset = write_dataset(tmp_path / "rows.jsonl")
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace("DATASET", str(dataset)), encoding="utf-8")
    return path


def variant(old: str, new: str) -> str:
    assert BASE.count(old) == 1, f"{old!r} must occur once in BASE"
    return BASE.replace(old, new)


def error_of(path: Path) -> str:
    with pytest.raises(JobFileError) as info:
        load_job(path)
    message = str(info.value)
    assert "\n" not in message, "an error is one line"
    assert info.value.exit_code == 2
    return message


def split_error(path: Path, message: str) -> tuple[int, str, str]:
    """``<file>:<line>: <key>: <text>`` -> (line, key, text)."""
    prefix = f"{path}:"
    assert message.startswith(prefix), message
    match = re.match(r"(\d+): ([A-Za-z0-9_.\[\]]+): (.+)", message[len(prefix):])
    assert match, f"not '<file>:<line>: <key>: <what>': {message}"
    return int(match[1]), match[2], match[3]


def test_base_job_is_valid(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, BASE))
    assert job.name == "test-job"
    assert job.models == ["sim:gpt-test"]
    assert job.params.temperature == 0.0
    assert job.params.max_tokens == 16
    assert job.providers["sim"].rpm == 100
    (stage,) = job.stages
    assert stage.name == "mc"
    assert stage.parse == "letter"
    assert stage.choices is not None and stage.choices.seeds == [0]
    assert Path(stage.dataset.path) == (tmp_path / "rows.jsonl").resolve()
    assert job.path == str(tmp_path / "job.yaml")


MALFORMED = [
    pytest.param(
        "params:\n  temperature: 0\n", "colour: red\nparams:\n  temperature: 0\n",
        4, "colour", "unknown key 'colour'", id="unknown-top-level-key",
    ),
    pytest.param(
        "    parse: letter\n", "    parse: letter\n    colour: red\n",
        21, "stages[0].colour", "unknown key 'colour'", id="unknown-stage-key",
    ),
    pytest.param(
        "    dataset:\n      path: DATASET\n", "    dataset:\n      path: DATASET\n      limt: 2\n",
        14, "stages[0].dataset.limt", "unknown key 'limt'", id="unknown-dataset-key",
    ),
    pytest.param(
        "  temperature: 0\n", "  temperature: hot\n",
        5, "params.temperature", "valid number", id="wrong-type-top-params",
    ),
    pytest.param(
        "    parse: letter\n", "    parse: letter\n    params:\n      temperature: hot\n",
        22, "stages[0].params.temperature", "valid number", id="wrong-type-stage-params",
    ),
    pytest.param(
        "  max_tokens: 16\n", "  max_tokens: 0\n",
        6, "params.max_tokens", "must be from 1 to 1,000,000 (got 0)", id="max-tokens-zero",
    ),
    pytest.param(
        "  temperature: 0\n", "  temperature: 3\n",
        5, "params.temperature", "less than or equal to 2", id="temperature-too-high",
    ),
    pytest.param(
        "    dataset:\n      path: DATASET\n", "",
        11, "stages[0]", "reads either dataset: or from:", id="dataset-missing",
    ),
    pytest.param(
        "      path: DATASET\n", "      path: no-such-rows.jsonl\n",
        13, "stages[0].dataset.path", "dataset file 'no-such-rows.jsonl' does not exist", id="dataset-file-absent",
    ),
    pytest.param(
        "  - sim:gpt-test\n", "  - nosuch:model\n",
        3, "models[0]", "unknown provider 'nosuch'", id="unknown-provider",
    ),
    pytest.param(
        "  - sim:gpt-test\n", "  - gpt-test\n",
        3, "models[0]", "must be written provider:model", id="model-without-provider",
    ),
    pytest.param(
        "  - sim:gpt-test\n", "  - 'sim:'\n",
        3, "models[0]", "model 'sim:' has no model name after the colon: write it as sim:MODEL", id="model-name-empty",
    ),
    pytest.param(
        "  - sim:gpt-test\n", "  - 'anthropic:  '\n",
        3, "models[0]", "model 'anthropic:  ' has no model name after the colon", id="model-name-blank",
    ),
    pytest.param(
        "    parse: letter\n", "    parse: letter\n    models: [sim:ok, 'openai:']\n",
        21, "stages[0].models[1]", "model 'openai:' has no model name after the colon", id="model-name-empty-in-stage",
    ),
    pytest.param(
        "    parse: letter\n", "    parse: letter\n    models: [sim:ok, other:bad]\n",
        21, "stages[0].models[1]", "unknown provider 'other'", id="unknown-provider-in-stage",
    ),
    pytest.param(
        '    prompt:\n      system: "Answer with one letter."\n      user: "{{ question }}\\n{{ options_block }}"\n',
        "    prompt: nosuch/template\n",
        14, "stages[0].prompt", "no prompt template 'nosuch/template'", id="unknown-prompt-template",
    ),
    pytest.param(
        "    choices:\n      seeds: [0]\n      gold: gold\n", "",
        11, "stages[0]", "parse: letter needs a choices: section", id="letter-without-choices",
    ),
    pytest.param(
        "    rpm: 100\n", "    rpmm: 100\n",
        9, "providers.sim.rpmm", "unknown key 'rpmm'", id="unknown-key-in-provider-settings",
    ),
    pytest.param(
        "  sim:\n    rpm: 100\n", "  nosuch:\n    rpm: 100\n",
        8, "providers.nosuch", "unknown provider 'nosuch'", id="unknown-provider-in-providers",
    ),
    pytest.param(
        "    parse: letter\n", "    parse: letter\n    samples: 0\n",
        21, "stages[0].samples", "must be from 1 to 1,000 (got 0)", id="samples-zero",
    ),
    pytest.param(
        "  - name: mc\n", "  - name: 'has space'\n",
        11, "stages[0].name", "should match pattern", id="bad-stage-name",
    ),
    pytest.param(
        "  - sim:gpt-test\n", "  - openai-compatible:my-vllm/llama\nendpoints:\n  my-vlm: {base_url: 'http://h/v1'}\n",
        3, "models[0]", "no endpoint named 'my-vllm'; did you mean 'my-vlm'?", id="unknown-endpoint",
    ),
    pytest.param(
        "  - sim:gpt-test\n", "  - openai-compatible:llama\nendpoints:\n  llama: {base_url: 'http://h/v1'}\n",
        3, "models[0]", "openai-compatible:ENDPOINT/MODEL", id="endpoint-model-without-slash",
    ),
    pytest.param(
        "  - sim:gpt-test\n", "  - openai-compatible:llama/x\nendpoints:\n  llama: {api_key_env: K}\n",
        5, "endpoints.llama", "an endpoint needs base_url:", id="endpoint-without-base-url",
    ),
    pytest.param(
        "    rpm: 100\n", "    rpm: -5\n",
        9, "providers.sim.rpm", "greater than 0", id="negative-rpm",
    ),
]


@pytest.mark.parametrize(("old", "new", "line", "key", "gist"), MALFORMED)
def test_malformed_job_names_file_line_and_key(
    tmp_path: Path, old: str, new: str, line: int, key: str, gist: str
) -> None:
    path = write_job(tmp_path, variant(old, new))
    got_line, got_key, text = split_error(path, error_of(path))
    assert (got_line, got_key) == (line, key)
    assert gist in text


def test_missing_stages(tmp_path: Path) -> None:
    path = write_job(tmp_path, BASE.split("stages:\n")[0])
    assert split_error(path, error_of(path)) == (1, "stages", "required key 'stages' is missing")


def test_duplicate_stage_name(tmp_path: Path) -> None:
    text = BASE + "  - name: mc\n    dataset: {path: DATASET}\n    prompt: {user: hi}\n"
    path = write_job(tmp_path, text)
    assert split_error(path, error_of(path)) == (21, "stages[1].name", "stage name 'mc' is used twice")


def test_stage_without_any_model(tmp_path: Path) -> None:
    path = write_job(tmp_path, variant("models:\n  - sim:gpt-test\n", ""))
    line, key, text = split_error(path, error_of(path))
    assert (line, key) == (9, "stages[0]")
    assert "no models" in text


def test_yaml_syntax_error(tmp_path: Path) -> None:
    path = write_job(tmp_path, variant("  max_tokens: 16\n", "  max_tokens: [16\n"))
    message = error_of(path)
    assert message.startswith(f"{path}:7: not valid YAML: ")


def test_key_given_twice(tmp_path: Path) -> None:
    path = write_job(tmp_path, variant("  max_tokens: 16\n", "  max_tokens: 16\n  max_tokens: 17\n"))
    message = error_of(path)
    assert message.startswith(f"{path}:7: ")
    assert "'max_tokens' appears twice" in message


def test_key_given_twice_names_dotted_key(tmp_path: Path) -> None:
    # The same name is legal at two places (job params and stage params): the message must say which one.
    path = write_job(tmp_path, variant("    parse: letter\n",
                                       "    parse: letter\n    params:\n      max_tokens: 1\n      max_tokens: 2\n"))
    line, key, text = split_error(path, error_of(path))
    assert (line, key) == (23, "stages[0].params.max_tokens")
    assert "twice" in text


def test_misspelt_stage_key_is_reported_where_it_is(tmp_path: Path) -> None:
    path = write_job(tmp_path, variant("    dataset:\n", "    datset:\n"))
    line, key, text = split_error(path, error_of(path))
    assert (line, key) == (12, "stages[0].datset")
    assert "unknown key 'datset'" in text


def test_inline_prompt_with_misspelt_user_key(tmp_path: Path) -> None:
    path = write_job(tmp_path, variant('      user: "', '      usr: "'))
    line, key, text = split_error(path, error_of(path))
    assert key.startswith("stages[0].prompt")
    assert "valid string" not in text
    assert "'user'" in text or "'usr'" in text


def test_letter_without_choices_message_is_short(tmp_path: Path) -> None:
    path = write_job(tmp_path, variant("    choices:\n      seeds: [0]\n      gold: gold\n", ""))
    message = error_of(path)
    assert "{{ question }}" not in message
    assert "(got {" not in message


def test_empty_and_non_mapping_job_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    assert error_of(empty) == f"{empty}:1: the job file is empty"
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n", encoding="utf-8")
    assert error_of(listing).startswith(f"{listing}:1: a job file must be a mapping")


def test_reserved_field_cannot_be_set_from_the_file(tmp_path: Path) -> None:
    path = write_job(tmp_path, BASE + "base_dir: /etc\n")
    assert split_error(path, error_of(path)) == (21, "base_dir", "unknown key 'base_dir'")


def test_absent_job_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    assert error_of(path) == f"{path}: no such job file"


# -- through the CLI -----------------------------------------------------------------------------------------

def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["runner", *args])
    with pytest.raises(SystemExit) as info:
        runner.cli.main()
    out, err = capsys.readouterr()
    code = info.value.code
    return (0 if code is None else int(code)), out, err


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        ("  temperature: 0\n", "  temperature: hot\n", ":5: params.temperature: "),
        ("  - sim:gpt-test\n", "  - nosuch:model\n", ":3: models[0]: "),
        ("  max_tokens: 16\n", "  max_tokens: [16\n", ":7: not valid YAML"),
        # it ended in "unexpected ValueError" (the versions sent with were read before the problems were raised)
        ("  - sim:gpt-test\n", "  - 'sim:'\n", ":3: models[0]: model 'sim:' has no model name after the colon"),
    ],
    ids=["wrong-type", "unknown-provider", "yaml-syntax", "empty-model-name"],
)
def test_cli_validate_bad_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], old: str, new: str,
    where: str,
) -> None:
    path = write_job(tmp_path, variant(old, new))
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"Error: {path}{where}")
    assert "Traceback" not in err


def test_cli_validate_absent_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nope.yaml"
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2
    assert err == f"Error: {path}: no such job file\n"


def test_cli_validate_good_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_job(tmp_path, BASE)
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 0
    assert err == ""
    assert "valid job 'test-job'" in out
    assert "mc (1 model(s))" in out


# -- relative dataset paths ----------------------------------------------------------------------------------

def test_relative_dataset_resolves_from_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The job lives two folders away from the data: neither its folder nor its parent holds rows.jsonl.
    job_path = tmp_path / "jobs" / "sub" / "job.yaml"
    job_path.parent.mkdir(parents=True)
    job_path.write_text(BASE.replace("DATASET", "rows.jsonl"), encoding="utf-8")
    workdir = tmp_path / "work"
    dataset = write_dataset(workdir / "rows.jsonl")

    monkeypatch.chdir(tmp_path)
    line, key, text = split_error(job_path, error_of(job_path))
    assert (line, key) == (13, "stages[0].dataset.path")
    assert "does not exist" in text

    monkeypatch.chdir(workdir)
    job = load_job(job_path)
    assert Path(job.stages[0].dataset.path) == dataset.resolve()
    code, out, _ = run_cli(monkeypatch, capsys, "validate", str(job_path))
    assert code == 0
    assert "valid job" in out


def test_working_directory_wins_over_job_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job_path = tmp_path / "jobs" / "job.yaml"
    job_path.parent.mkdir(parents=True)
    job_path.write_text(BASE.replace("DATASET", "rows.jsonl"), encoding="utf-8")
    beside_job = write_dataset(tmp_path / "jobs" / "rows.jsonl")
    in_cwd = write_dataset(tmp_path / "work" / "rows.jsonl")

    monkeypatch.chdir(tmp_path / "work")
    assert Path(load_job(job_path).stages[0].dataset.path) == in_cwd.resolve()
    monkeypatch.chdir(tmp_path)  # no rows.jsonl here: the job's own folder is next
    assert Path(load_job(job_path).stages[0].dataset.path) == beside_job.resolve()


def test_relative_job_path_through_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_dataset(tmp_path / "data" / "rows.jsonl")
    (tmp_path / "job.yaml").write_text(BASE.replace("DATASET", "data/rows.jsonl"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, "validate", "job.yaml")
    assert (code, err) == (0, "")
    assert out.startswith("job.yaml: valid job 'test-job'")


def test_unknown_key_suggests_the_closest_allowed_one(tmp_path: Path) -> None:
    path = write_job(tmp_path, variant("    dataset:\n", "    datset:\n"))
    assert "did you mean 'dataset'?" in error_of(path)


def test_a_stored_job_keeps_its_parameters(tmp_path: Path) -> None:
    """A resumed run reads its job back from JSON, where every stage parameter is present (most as null): the
    job-level parameters must still apply, or the resumed requests would have other cache keys."""
    job = load_job(write_job(tmp_path, BASE))
    again = type(job).model_validate_json(job.model_dump_json())
    assert again.stage_params(again.stages[0]) == job.stage_params(job.stages[0])
    assert again.stage_params(again.stages[0]).max_tokens == 16


# -- every problem, not only the first -----------------------------------------------------------------------

def _problem_lines(err: str, path: Path, count: int) -> list[tuple[int, str, str]]:
    """stderr of a job file with ``count`` problems: one ``file:line: key: problem`` line each, then one
    ``Error: N problems in FILE``."""
    lines = err.splitlines()
    assert lines[-1] == f"Error: {count} problems in {path}", err
    assert len(lines) == count + 1 and sum(line.startswith("Error:") for line in lines) == 1, err
    assert "Traceback" not in err
    return [split_error(path, line) for line in lines[:-1]]


def test_cli_validate_lists_every_schema_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = variant("  temperature: 0\n  max_tokens: 16\n", "  temperature: hot\n  max_tokens: 0\n")
    text = text.replace("name: test-job\n", "name: test-job\ncolour: red\n")  # every line below moves down one
    path = write_job(tmp_path, text)
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2 and out == ""
    problems = _problem_lines(err, path, 3)
    assert [(line, key) for line, key, _ in problems] == [
        (2, "colour"), (6, "params.temperature"), (7, "params.max_tokens")]
    assert "unknown key 'colour'" in problems[0][2] and "must be from 1 to 1,000,000" in problems[2][2]
    # submit lists them the same way
    code, _, submitted = run_cli(monkeypatch, capsys, "submit", str(path))
    assert code == 2 and submitted == err


def test_cli_validate_lists_every_cross_field_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = variant("  - sim:gpt-test\n", "  - nosuch:model\n").replace("      path: DATASET\n",
                                                                    "      path: no-such-rows.jsonl\n")
    path = write_job(tmp_path, text.replace("    parse: letter\n", "    parse: lettter\n"))
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2
    problems = _problem_lines(err, path, 3)
    assert [(line, key) for line, key, _ in problems] == [
        (3, "models[0]"), (13, "stages[0].dataset.path"), (20, "stages[0].parse")]
    assert "did you mean 'letter'" in problems[2][2]


def _keyed_rows(path: Path, golds: list[object], ids: list[str]) -> Path:
    rows = [{**ROWS[0], "id": row_id, "gold": gold} for row_id, gold in zip(ids, golds, strict=True)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_cli_validate_says_a_var_problem_and_the_datasets_problems_in_one_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The battery's case: a ``${var}`` problem hid the dataset's repeated id until it was fixed, and the two ended
    with different exit codes (2 and 1)."""
    rows = _keyed_rows(tmp_path / "keyed.jsonl", [0, 1], ["a", "a"])
    text = variant("      path: DATASET\n", f"      path: {rows}\n      id: id\n")  # lines below move down one
    path = write_job(tmp_path, text.replace('"Answer with one letter."', '"Answer ${how}."'))
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"{path}:16: stages[0].prompt.system: ${{how}} is not defined: add it to vars: or pass --var how=VALUE",
        f"{rows}:2: id 'a' (field 'id') was already used on line 1 ({rows}:1); each row's id must be unique: fix the "
        "rows, name another id field, or leave out dataset.id to number rows by line",
        f"Error: 2 problems in {path}"]
    # a run is refused for the job file's problem before its rows are read
    code, _, submitted = run_cli(monkeypatch, capsys, "submit", str(path))
    assert code == 2 and submitted.splitlines()[-1].startswith(f"Error: {path}:16: stages[0].prompt.system: ${{how}}")
    # the var fixed: the repeated id alone, with the same exit code
    path.write_text(path.read_text(encoding="utf-8").replace("${how}", "one letter"), encoding="utf-8")
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"Error: {rows}:2: id 'a' (field 'id')")


def test_cli_validate_says_every_problem_of_the_file_and_of_the_rows_it_can_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _keyed_rows(tmp_path / "keyed.jsonl", [0, 9, 1, "Z", 2], ["a", "b", "c", "d", "c"])
    text = variant("      path: DATASET\n", f"      path: {rows}\n      id: id\n")
    text = text.replace("  temperature: 0\n", "  temperature: hot\n").replace("sim:gpt-test", "sim:${model}")
    # a second stage whose dataset path holds an undefined var: its rows cannot be read, so they are not
    text += "  - name: other\n    dataset: {path: '${folder}/rows.jsonl'}\n    prompt: {user: hi}\n"
    path = write_job(tmp_path, text)
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2
    lines = err.splitlines()
    assert lines[:3] == [
        f"{path}:3: models[0]: ${{model}} is not defined: add it to vars: or pass --var model=VALUE",
        f"{path}:5: params.temperature: Input should be a valid number, unable to parse string as a number (got "
        "'hot')",
        f"{path}:23: stages[1].dataset.path: ${{folder}} is not defined: add it to vars: or pass --var "
        "folder=VALUE"]
    assert lines[3:] == [
        f"{rows}:2: gold 9 (field 'gold') is not an option's index: the row has 4 options, numbered 0 to 3",
        f"{rows}:4: the gold answer 'Z' is not one of the options, nor a letter among A to D",
        f"{rows}:5: id 'c' (field 'id') was already used on line 3 ({rows}:3); each row's id must be unique: fix the "
        "rows, name another id field, or leave out dataset.id to number rows by line",
        f"Error: 6 problems in {path}"]


def test_cli_validate_says_at_most_twenty_row_problems_of_a_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _keyed_rows(tmp_path / "keyed.jsonl", [7] * 30, [f"r{n}" for n in range(30)])
    path = write_job(tmp_path, variant("      path: DATASET\n", f"      path: {rows}\n"))
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    lines = err.splitlines()
    assert code == 2 and len(lines) == 22
    assert lines[19] == f"{rows}:20: gold 7 (field 'gold') is not an option's index: the row has 4 options, numbered " \
                        "0 to 3"
    assert lines[20:] == [f"{rows}: 20 rows have problems; the rows after them were not checked",
                          f"Error: 21 problems in {path}"]


def test_every_undefined_var_is_said(tmp_path: Path) -> None:
    path = write_job(tmp_path, variant("name: test-job\n", "name: ${a}-${b}\n").replace("sim:gpt-test", "sim:${c}"))
    with pytest.raises(JobFileError) as info:
        load_job(path)
    assert [split_error(path, line)[:2] for line in info.value.problems] == [(1, "name"), (3, "models[0]")]
    assert "${a} is not defined" in info.value.problems[0]  # a string's first undefined var is its problem


def test_one_problem_is_still_one_error_line(tmp_path: Path) -> None:
    path = write_job(tmp_path, variant("  temperature: 0\n", "  temperature: hot\n"))
    line, key, _ = split_error(path, error_of(path))
    assert (line, key) == (5, "params.temperature")


def test_a_split_on_a_file_is_a_key_problem_listed_with_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the split check needs the dataset reader's idea of a file's format (runner/plan/datasets.py) yet is made while
    # the keys are read, so it is listed with the other key problems; the cross-field checks wait until those are fixed
    text = variant("      path: DATASET\n", "      path: DATASET\n      split: test\n")  # lines below move down one
    path = write_job(tmp_path, text.replace("  temperature: 0\n", "  temperature: hot\n").replace(
        "  - sim:gpt-test\n", "  - nosuch:model\n"))
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2
    problems = _problem_lines(err, path, 2)
    assert [(line, key) for line, key, _ in problems] == [(5, "params.temperature"), (12, "stages[0].dataset")]
    assert problems[1][2] == ("split: is only for a Hugging Face dataset folder (format: hf), and this dataset is "
                              "read as jsonl")
    one_left = write_job(tmp_path, text.replace("  - sim:gpt-test\n", "  - nosuch:model\n"), name="one_left.yaml")
    assert split_error(one_left, error_of(one_left))[:2] == (12, "stages[0].dataset")  # not yet the model


def test_a_providers_own_settings_are_kept_in_the_stored_job_and_its_fingerprint(tmp_path: Path):
    """The job a run stores is what `runner resume` runs again: vertex's project and location, azure-openai's
    deployments (settings a provider declares beside the shared ones) must come back from it, and changing them
    must change the job's fingerprint."""
    from runner.spec.schema import Job

    def job_with(project: str) -> Job:
        path = tmp_path / f"{project}.yaml"
        path.write_text(
            "name: keep\nmodels: [vertex:gemini-2.0-flash]\n"
            f"providers: {{vertex: {{project: {project}, location: us-central1, timeout: 7}}}}\n"
            "stages:\n  - name: s\n    dataset: {path: rows.jsonl}\n    prompt: {user: '{{ q }}'}\n",
            encoding="utf-8")
        (tmp_path / "rows.jsonl").write_text('{"q": "hi"}\n', encoding="utf-8")
        return load_job(path)

    job = job_with("lab-one")
    stored = Job.model_validate_json(job.model_dump_json())
    assert stored.providers["vertex"].provider_options == {"project": "lab-one", "location": "us-central1"}
    assert stored.providers["vertex"].timeout == 7
    assert job_with("lab-two").fingerprint() != job.fingerprint()


def test_a_providers_entry_may_add_its_own_providers_keys_alone(tmp_path: Path) -> None:
    # runner/providers/base.py ProviderEntry: vertex's project and location are vertex's; azure-openai's deployments
    # under vertex: is an unknown key at its own line, and only the providers named are loaded to tell
    import subprocess

    def job(settings: str) -> Path:
        path = tmp_path / "job.yaml"
        path.write_text("name: t\nmodels: ['vertex:gemini-2.0-flash']\nproviders:\n"
                        f"  vertex: {{{settings}}}\n"
                        "stages:\n  - name: s\n    dataset: {path: rows.jsonl}\n    prompt: {user: hi}\n",
                        encoding="utf-8")
        (tmp_path / "rows.jsonl").write_text('{"q": 1}\n', encoding="utf-8")
        return path

    probe = ("import sys\nfrom runner.spec.job import load_job\nfrom runner.providers.base import PROVIDERS\n"
             f"job = load_job({str(job('project: p, location: us-east5'))!r})\n"
             "print(sorted(job.providers['vertex']._provider_options), sorted(PROVIDERS.classes))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    options, loaded = done.stdout.strip().split("] [")
    assert options == "['location', 'project'" and "'vertex'" in loaded and "azure" not in loaded
    assert "bedrock" not in loaded and "openai" not in loaded.replace("openai-compatible", "")
    with pytest.raises(JobFileError, match=r"job.yaml:4: providers\.vertex\.deployments: unknown key 'deployments'"):
        load_job(job("project: p, deployments: {a: b}"))

"""A hostile or broken job file is refused in one sentence, quickly and within bounded memory: an alias bomb, NUL
bytes, deep nesting, a pipe or a device instead of a file, a huge file, numbers that would size endless work, and
``vars:`` that refer to themselves. Each case used to hang, exhaust memory, end in "unexpected …" or pass
validation and send a wrong prompt."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runner.errors import JobFileError
from runner.spec.fields import MAX_SAMPLES, MAX_TOKENS, MAX_VARIANTS
from runner.spec.job import load_job
from runner.spec.yamlfile import MAX_DEPTH, MAX_FILE_BYTES, MAX_VALUES
from tests.helpers import ROOT, only_error, run_cli, runner_cmd, write_rows

#: a subprocess may not take more address space than this: the unbounded loader took 3.4 GB on the bomb
ADDRESS_SPACE = 2 * 1024**3


def bounded_run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``runner ARGS`` in its own process, its address space capped (a runaway fails fast instead of swapping)."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RUNNER_RAISE_ERRORS", None)
    return subprocess.run(runner_cmd(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=cap)


def alias_bomb(path: Path, levels: int = 9) -> Path:
    """The "billion laughs" file: each anchor a list of nine aliases of the one before (9**9 strings), ~500 bytes."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    lines += ["name: bomb", "models: [sim:m]", f"stages: *a{levels - 1}"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def job_text(rows: Path, *, params: str = "{temperature: 0, max_tokens: 5}", stage: str = "", top: str = "") -> str:
    """A one-stage job; ``top`` (lines at the top level) goes on line 4, ``stage`` (the stage's lines) at the end."""
    return f"name: hostile\nmodels: [sim:m]\nparams: {params}\n{top + chr(10) if top else ''}" + textwrap.dedent(f"""\
        stages:
          - name: mc
            dataset: {{path: {rows}}}
            prompt: {{user: "{{{{ question }}}}\\n{{{{ options_block }}}}"}}
            choices: {{seeds: [0], gold: gold}}
            parse: letter
        """) + stage


def error_of(path: Path) -> str:
    with pytest.raises(JobFileError) as info:
        load_job(path)
    return str(info.value)


# -- the YAML itself -----------------------------------------------------------------------------------------

def test_an_alias_bomb_is_refused_in_a_moment_and_little_memory(tmp_path: Path) -> None:
    """Measured in a process of its own: the refusal's time and the growth of its peak memory."""
    bomb = alias_bomb(tmp_path / "bomb.yaml")
    assert bomb.stat().st_size < 600
    script = textwrap.dedent(f"""\
        import resource, time
        from runner.errors import JobFileError
        from runner.spec.job import load_job
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        try:
            load_job({str(bomb)!r})
        except JobFileError as exc:
            print("refused:", exc)
        print("seconds:", time.perf_counter() - start)
        print("grew_kb:", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
        """)
    import resource

    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE)))
    out = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert done.returncode == 0, done.stderr[-2000:]
    assert out["refused"] == (f"{bomb}:6: more than {MAX_VALUES:,} values with the aliases (*name) expanded; "
                              "write the values out or use fewer aliases")
    assert float(out["seconds"]) < 1.0
    assert int(out["grew_kb"]) < 100 * 1024


def test_an_alias_bomb_through_the_cli_is_one_sentence(tmp_path: Path) -> None:
    done = bounded_run("validate", str(alias_bomb(tmp_path / "bomb.yaml")))
    assert done.returncode == 2 and "aliases (*name) expanded" in only_error(done.stderr)


def test_a_few_aliases_still_work(tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", 2)
    text = job_text(rows, params="&p {temperature: 0, max_tokens: 5}") + "    params: *p\n"
    (tmp_path / "job.yaml").write_text(text, encoding="utf-8")
    assert load_job(tmp_path / "job.yaml").stages[0].params.max_tokens == 5


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("name: loop\nmodels: &m [sim:m, *m]\nstages: []\n", encoding="utf-8")
    assert error_of(path) == f"{path}:2: alias *m repeats a value it is inside of, which never ends"


def test_a_nul_byte_is_named_with_its_line(tmp_path: Path, monkeypatch, capsys) -> None:
    path = tmp_path / "nul.yaml"
    path.write_bytes(b"name: x\nmodels: [sim:m]\ndescription: a\x00b\nstages: []\n")
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2
    assert only_error(err) == f"Error: {path}:3: a NUL byte (\\x00) in the job file; it must be text (is it the " \
                             "right file?)"


def test_a_control_character_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bell.yaml"
    path.write_text("name: x\nmodels: [sim:m]\ndescription: \x07\nstages: []\n", encoding="utf-8")
    assert error_of(path).startswith(f"{path}:3: not valid YAML: character '\\x07' is not allowed")


@pytest.mark.parametrize("opening", ["[", "{a: "])
def test_deep_nesting_is_refused_at_the_depth_limit(tmp_path: Path, monkeypatch, capsys, opening: str) -> None:
    path = tmp_path / "deep.yaml"
    closing = "]" if opening == "[" else "}"
    path.write_text("name: x\nstages: " + opening * 100_000 + "1" + closing * 100_000 + "\n", encoding="utf-8")
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2
    assert only_error(err) == f"Error: {path}:2: values nested more than {MAX_DEPTH} deep; a job file needs far " \
                             "fewer levels"


def test_a_number_with_too_many_digits(tmp_path: Path, monkeypatch, capsys) -> None:
    path = tmp_path / "digits.yaml"
    path.write_text("name: x\nparams: {max_tokens: 1" + "0" * 5000 + "}\nstages: []\n", encoding="utf-8")
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2 and only_error(err).startswith(f"Error: {path}:2: not valid YAML: the number 1000")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_pipe_is_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    done = bounded_run("validate", str(fifo), timeout=30)  # it used to wait for a writer for ever
    assert done.returncode == 2
    assert only_error(done.stderr) == f"Error: {fifo}: not a regular file (a pipe); a job file must be a YAML " \
                                     "file on disk"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero here")
def test_a_device_is_not_read() -> None:
    done = bounded_run("validate", "/dev/zero", timeout=30)  # it used to read until memory ran out
    assert done.returncode == 2
    assert only_error(done.stderr) == "Error: /dev/zero: not a regular file (a device); a job file must be a " \
                                     "YAML file on disk"


def test_a_folder_is_not_a_job_file(tmp_path: Path) -> None:
    assert error_of(tmp_path) == f"{tmp_path}: not a regular file (a folder); a job file must be a YAML file on disk"


# -- a dataset path that is not a file ----------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_dataset_that_is_a_pipe_is_said_so_and_never_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    path = tmp_path / "job.yaml"
    path.write_text(job_text(fifo), encoding="utf-8")
    done = bounded_run("validate", str(path), timeout=30)  # opening the pipe would wait for a writer for ever
    assert done.returncode == 2
    assert only_error(done.stderr) == f"Error: {path}:6: stages[0].dataset.path: dataset file {str(fifo)!r} is a " \
                                      "named pipe (FIFO), not a regular file"


@pytest.mark.parametrize(("dataset", "problem"), [
    ("/dev/null", "dataset file '/dev/null' is a device, not a regular file"),
    ("{folder}, format: jsonl", "dataset path '{folder}' is a directory, not a jsonl file"),
    ("{folder}", "dataset path '{folder}' is a directory, and not one written by Hugging Face datasets' save_to_disk "
                 "(it has no state.json or dataset_dict.json)"),
], ids=["device", "directory-as-jsonl", "directory-not-saved-by-datasets"])
def test_a_dataset_that_is_not_a_file_is_said_so(tmp_path: Path, monkeypatch, capsys, dataset: str,
                                                  problem: str) -> None:
    """Each used to be "does not exist" (a device) or a dataset error from the first read (a folder)."""
    if dataset == "/dev/null" and not Path(dataset).exists():
        pytest.skip("no /dev/null here")
    folder = tmp_path / "rows.jsonl"
    folder.mkdir()
    path = tmp_path / "job.yaml"
    path.write_text(job_text(Path(dataset.format(folder=folder))), encoding="utf-8")
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert (code, out) == (2, "")
    assert only_error(err) == f"Error: {path}:6: stages[0].dataset.path: {problem.format(folder=folder)}"


def test_an_options_file_that_is_a_directory_is_said_so(tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", 2)
    (tmp_path / "options.json").mkdir()
    path = tmp_path / "job.yaml"
    text = job_text(rows).replace("choices: {seeds: [0],", "choices: {options_file: options.json, seeds: [0],")
    path.write_text(text, encoding="utf-8")
    assert error_of(path) == f"{path}:8: stages[0].choices.options_file: options file 'options.json' is a " \
                             "directory, not a regular file"


def test_a_job_file_over_the_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with open(path, "w", encoding="utf-8") as out:
        out.write("name: x\nstages: []\n")
        out.write(("#" * 99 + "\n") * (MAX_FILE_BYTES // 100 + 1))
    size = path.stat().st_size
    assert error_of(path) == f"{path}: {size:,} bytes is more than a job file may hold ({MAX_FILE_BYTES:,} bytes)"


def test_a_prompt_template_file_is_read_within_the_same_bounds(tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", 2)
    (tmp_path / "prompts").mkdir()
    alias_bomb(tmp_path / "prompts" / "bomb.yaml")
    text = job_text(rows).replace('prompt: {user: "{{ question }}\\n{{ options_block }}"}', "prompt: bomb")
    (tmp_path / "job.yaml").write_text(text, encoding="utf-8")
    message = error_of(tmp_path / "job.yaml")
    assert "stages[0].prompt:" in message and "aliases (*name) expanded" in message


# -- numbers that size work ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("params", "stage", "top", "key", "problem"), [
    ("{max_tokens: 1000000000000000000000000000000}", "", "", "params.max_tokens",
     f"must be from 1 to {MAX_TOKENS:,} (got 1000000000000000000000000000000)"),
    ("{max_tokens: 5, seed: 18446744073709551616}", "", "", "params.seed",
     "must be from -9,223,372,036,854,775,808 to 9,223,372,036,854,775,807 (got 18446744073709551616)"),
    ("{max_tokens: 5, reasoning: {budget_tokens: 99999999}}", "", "", "params.reasoning.budget_tokens",
     f"must be from 0 to {MAX_TOKENS:,} (got 99999999)"),
    ("{max_tokens: 5}", "    samples: 1000000000\n", "", "stages[0].samples",
     f"must be from 1 to {MAX_SAMPLES:,} (got 1000000000)"),
    ("{max_tokens: 5}", "", "limit: 100000000000000000000", "limit",
     "must be from 1 to 1,000,000,000 (got 100000000000000000000)"),
    ("{max_tokens: 5}", "    min_items: 10000000000\n", "", "stages[0].min_items",
     "must be from 0 to 1,000,000,000 (got 10000000000)"),
    ("{max_tokens: 5}", "", "budget: {tokens: 10000000000000000000000}", "budget.tokens",
     "must be from 1 to 1,000,000,000,000,000 (got 10000000000000000000000)"),
    ("{max_tokens: 5}", "", "mode: auto\ndeadline: 99999999999999999999999999d", "deadline",
     "more than a year: a duration must be at most 366d (got '99999999999999999999999999d')"),
], ids=["max_tokens", "seed", "budget_tokens", "samples", "limit", "min_items", "budget_tokens_total", "deadline"])
def test_numbers_beyond_their_range_name_the_key_and_the_range(tmp_path: Path, monkeypatch, capsys, params: str,
                                                               stage: str, top: str, key: str, problem: str) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", 2)
    path = tmp_path / "job.yaml"
    path.write_text(job_text(rows, params=params, stage=stage, top=top), encoding="utf-8")
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2
    line = only_error(err)
    assert line.startswith(f"Error: {path}:") and line.endswith(f": {key}: {problem}"), line


def test_too_many_choice_seeds(tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", 2)
    path = tmp_path / "job.yaml"
    seeds = ", ".join(str(n) for n in range(2000))
    path.write_text(job_text(rows).replace("choices: {seeds: [0],", f"choices: {{seeds: [{seeds}],"),
                    encoding="utf-8")
    assert error_of(path) == f"{path}:8: stages[0].choices.seeds: must list from 1 to 1,000 seeds, not 2,000"


def test_variants_whose_product_is_too_large(tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", 2)
    path = tmp_path / "job.yaml"
    values = ", ".join(str(n) for n in range(200))
    path.write_text(job_text(rows, stage=f"    samples: 100\n    variants: {{t: [{values}]}}\n"), encoding="utf-8")
    assert error_of(path) == (f"{path}:11: stages[0].variants: 100 samples x 200 variants.t make 20,000 requests per "
                              f"row and model; at most {MAX_VARIANTS:,}: use fewer seeds, samples or variant values")


def test_estimate_of_huge_max_tokens_no_longer_overflows(tmp_path: Path, monkeypatch, capsys) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", 2)
    path = tmp_path / "job.yaml"
    path.write_text(job_text(rows, params="{max_tokens: 1000000000000000000000000000000}"), encoding="utf-8")
    monkeypatch.setenv("RUNNER_DB", str(tmp_path / "db.sqlite"))
    code, _, err = run_cli(monkeypatch, capsys, "estimate", str(path))
    assert code == 2 and "params.max_tokens: must be from 1" in only_error(err)


# -- vars ----------------------------------------------------------------------------------------------------

def vars_job(tmp_path: Path, variables: str) -> Path:
    rows = write_rows(tmp_path / "rows.jsonl", 2)
    path = tmp_path / "job.yaml"
    text = job_text(rows, top="vars:\n" + variables).replace('prompt: {user: "', 'prompt: {user: "${a} ')
    path.write_text(text, encoding="utf-8")
    return path


def test_a_var_that_refers_to_itself(tmp_path: Path, monkeypatch, capsys) -> None:
    path = vars_job(tmp_path, '  a: "${a}"\n')
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2
    assert only_error(err) == f"Error: {path}:5: vars.a: ${{a}} refers to itself: give 'a' a value that does not use it"


def test_vars_in_a_circle_are_named(tmp_path: Path) -> None:
    path = vars_job(tmp_path, '  a: "${b}"\n  b: "x ${c}"\n  c: "${a}"\n')
    assert error_of(path) == (f"{path}:5: vars.a: vars 'a', 'b', 'c' refer to each other in a circle "
                              "(${a} -> ${b} -> ${c} -> ${a}): give one of them a value of its own")


def test_a_var_may_use_another(tmp_path: Path) -> None:
    path = vars_job(tmp_path, '  a: "${b}/x"\n  b: root\n')
    job = load_job(path)
    assert job.stages[0].prompt.user.startswith("root/x ")  # type: ignore[union-attr]
    assert job.vars == {"a": "root/x", "b": "root"}
    overridden = load_job(path, {"b": "other"})
    assert overridden.stages[0].prompt.user.startswith("other/x ")  # type: ignore[union-attr]


def test_a_var_that_uses_an_undefined_one(tmp_path: Path) -> None:
    path = vars_job(tmp_path, '  a: "${nope}"\n')
    assert error_of(path) == f"{path}:5: vars.a: ${{nope}} is not defined: add it to vars: or pass --var nope=VALUE"


def test_vars_that_expand_without_end_are_refused(tmp_path: Path) -> None:
    chain = '  v0: "' + "x" * 100 + '"\n' + "".join(f'  v{i}: "{f"${{v{i - 1}}}" * 10}"\n' for i in range(1, 9))
    path = vars_job(tmp_path, chain + '  a: "${v8}"\n')
    assert "characters to the job" in error_of(path)


def test_libyaml_and_pyyaml_read_every_bundled_file_alike(tmp_path):
    """The fast path (libyaml's parser under this module's bounded composer) gives every bundled job, prompt and
    schema file the data and key lines PyYAML's own parser gives."""
    from runner.spec import yamlfile

    assert yamlfile._FastLoader is not None, "PyYAML without libyaml: the fast path is not taken"
    files = sorted(p for folder in ("jobs", "prompts", "deploy") for p in (ROOT / folder).rglob("*.y*ml"))
    assert len(files) > 30
    for path in files:
        fast, _ = yamlfile._composed(path, path.read_text(encoding="utf-8"), None, yamlfile._FastLoader)
        slow, _ = yamlfile._composed(path, path.read_text(encoding="utf-8"), None, yamlfile._BoundedLoader)
        lines_fast: dict = {}
        lines_slow: dict = {}
        yamlfile._walk(path, fast, (), lines_fast)
        yamlfile._walk(path, slow, (), lines_slow)
        assert lines_fast == lines_slow, path
        assert yamlfile._FastLoader("", path).construct_document(fast) == \
            yamlfile._BoundedLoader("", path).construct_document(slow), path


def test_a_document_libyaml_refuses_is_said_in_pyyamls_words(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: x\nmodels: [a\nstages: []\n", encoding="utf-8")
    assert error_of(path).startswith(f"{path}:3: not valid YAML: expected ',' or ']', but got ':'")

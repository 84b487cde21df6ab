"""Datasets as researchers have them (issue 21): CSV, TSV, a JSON array, Parquet and Hugging Face save_to_disk
folders beside JSONL (runner/plan/datasets.py), options from several columns (``choices.fields``), gold answers
given as a letter or as digits, and an MMLU-style CSV job run end to end, the same as Parquet and as a Hugging
Face folder.

The reference rows come from Python's own ``csv.DictReader``; the Parquet file and the Hugging Face folder are
written from them by pyarrow and by ``datasets`` themselves."""

from __future__ import annotations

import csv
import datetime
import decimal
import json
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runner.engine.run import execute
from runner.errors import JobFileError, RunnerError
from runner.plan import datasets as formats
from runner.plan.datasets import count_dataset, dataset_digest, dataset_format, read_dataset
from runner.plan.stage import StagePlan, check_datasets, count_rows, gold_index, iter_rows
from runner.providers.base import Completion
from runner.spec.inputs import Choices, Dataset
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import run_cli

DATA = Path(__file__).resolve().parents[1] / "data" / "datasets"
MMLU_CSV = DATA / "mmlu_style.csv"
LETTERS = "ABCD"


def reference_rows() -> list[dict[str, str]]:
    with open(MMLU_CSV, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def write_parquet(path: Path, rows: list[dict], row_group_size: int = 3) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def save_hf(path: Path, rows: list[dict] | None = None, splits: dict[str, list[dict]] | None = None) -> Path:
    import datasets

    datasets.disable_progress_bars()
    if splits is not None:
        datasets.DatasetDict({name: datasets.Dataset.from_list(part) for name, part in splits.items()}).save_to_disk(
            str(path))
    else:
        datasets.Dataset.from_list(rows or []).save_to_disk(str(path))
    return path


def error_of(source, limit: int | None = None) -> str:
    with pytest.raises(RunnerError) as info:
        list(read_dataset(source, limit))
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- which reader ---------------------------------------------------------------------------------------------

def test_the_format_comes_from_the_name_a_folder_or_the_setting(tmp_path: Path) -> None:
    names = {"a.jsonl": "jsonl", "a.NDJSON": "jsonl", "a.json": "json", "a.csv": "csv", "a.TSV": "tsv",
             "a.parquet": "parquet", "a.txt": "jsonl", "a": "jsonl"}
    assert {name: dataset_format(tmp_path / name) for name in names} == names
    assert dataset_format(tmp_path) == "hf"
    assert dataset_format(tmp_path / "a.txt", "csv") == "csv"


def test_a_file_with_another_name_is_read_as_its_format_says(tmp_path: Path) -> None:
    path = write(tmp_path / "mmlu.txt", MMLU_CSV.read_text(encoding="utf-8"))
    as_csv = list(read_dataset(Dataset(path=str(path), format="csv")))
    assert [row for _, _, row in as_csv] == reference_rows()
    # without the setting, the old rule: JSONL, whose first line this is not
    assert error_of(path) == f"{path}:1: not valid JSON (Expecting value)"


# -- CSV and TSV ----------------------------------------------------------------------------------------------

def test_csv_rows_are_strings_with_physical_line_numbers() -> None:
    rows = list(read_dataset(MMLU_CSV))
    assert [row for _, _, row in rows] == reference_rows()
    assert all(isinstance(value, str) for _, _, row in rows for value in row.values())  # "54" stays text
    # the third question's cell spans lines 4 and 5: the next row starts on line 6
    assert [line for line, _, _ in rows] == [2, 3, 4, 6, 7, 8, 9, 10]
    assert [number for _, number, _ in rows] == list(range(1, 9))
    assert rows[2][2]["question"] == "Which of these numbers is prime,\ngiven that exactly one is?"
    assert rows[5][2]["question"] == 'Who wrote the first draft of the "Declaration of Independence"?'
    assert rows[7][2]["D"] == "Alexandria, Egypt"
    assert count_dataset(MMLU_CSV) == 8 and count_dataset(MMLU_CSV, 3) == 3
    assert [line for line, _, _ in read_dataset(MMLU_CSV, 4)] == [2, 3, 4, 6]


def test_stage_iter_rows_and_count_rows_read_every_format(tmp_path: Path) -> None:
    parquet = write_parquet(tmp_path / "m.parquet", reference_rows())
    assert [row for _, row in iter_rows(MMLU_CSV, 2)] == reference_rows()[:2]
    assert [row for _, row in iter_rows(parquet)] == reference_rows()
    assert count_rows(MMLU_CSV) == count_rows(parquet) == 8 and count_rows(parquet, 5) == 5


def test_tsv_is_csv_with_tabs(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.tsv", 'question\tanswer\nIs 2, 3 or 4 even?\t"4, and 2"\n\nWhy?\tno\n')
    assert list(read_dataset(path)) == [(2, 1, {"question": "Is 2, 3 or 4 even?", "answer": "4, and 2"}),
                                        (4, 2, {"question": "Why?", "answer": "no"})]
    assert count_dataset(path) == 2


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeffquestion,answer\nq,A\n".encode())
    assert list(read_dataset(path)) == [(2, 1, {"question": "q", "answer": "A"})]


def test_a_row_with_the_wrong_number_of_cells_names_its_line(tmp_path: Path) -> None:
    lines = MMLU_CSV.read_text(encoding="utf-8").splitlines()
    lines[7] += ",extra"  # the sixth row, on line 8 (the quoted cell spans lines 4 and 5)
    path = write(tmp_path / "mmlu.csv", "\n".join(lines) + "\n")
    assert error_of(path) == f"{path}:8: row has 8 cells, the header has 7 (format csv)"
    assert [line for line, _, _ in read_dataset(path, 5)][-1] == 7  # the rows before it are read


def test_a_csv_without_a_header_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "empty.csv", "\n\n")
    message = ("{}:1: the file has no header line; a CSV dataset's first line names its columns (format csv)")
    assert error_of(path) == message.format(path)
    with pytest.raises(RunnerError, match=re.escape(message.format(path))):
        count_dataset(path)


def test_a_header_naming_a_column_twice_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "dup.tsv", "q\tA\tA\nx\ty\tz\n")
    assert error_of(path) == f"{path}:1: the header names column 'A' twice (format tsv)"


def test_a_quoted_cell_never_closed_names_the_line_it_opens_on(tmp_path: Path) -> None:
    path = write(tmp_path / "open.csv", 'q,a\nx,1\n"never closed,2\ny,3\n')
    assert error_of(path) == f"{path}:3: the row cannot be read as CSV: a quoted cell is never closed (format csv)"


def test_text_after_a_closing_quote_is_an_error_not_a_guess(tmp_path: Path) -> None:
    path = write(tmp_path / "quotes.csv", 'q,a\n"Hi," she said,1\n')
    message = error_of(path)
    assert message.startswith(f"{path}:2: the row cannot be read as CSV: ") and message.endswith("(format csv)")


def test_a_csv_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes(b"q,a\nfine,1\ncaf\xe9,2\n")
    assert error_of(path) == (f"{path}:3: a dataset file must be UTF-8, and this line is not (byte 0xe9); convert "
                              "the file, e.g. with iconv -f latin1 -t utf-8 (format csv)")


# -- JSON arrays and JSONL ------------------------------------------------------------------------------------

def test_a_json_array_of_objects_with_the_line_each_starts_on(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.json", '[\n  {"q": "a", "gold": 1},\n  {"q": "b",\n   "gold": 2}, {"q": "c"}\n]\n')
    assert list(read_dataset(path)) == [(2, 1, {"q": "a", "gold": 1}), (3, 2, {"q": "b", "gold": 2}),
                                        (4, 3, {"q": "c"})]
    assert count_dataset(path) == 3 and count_dataset(path, 2) == 2
    assert list(read_dataset(write(tmp_path / "none.json", " [ ] "))) == []


@pytest.mark.parametrize(("text", "expected"), [
    ('{"rows": [{"q": 1}]}', "1: a JSON dataset must be one array of objects, [{...}, {...}] (format json)"),
    ('[\n {"q": 1},\n 7\n]', "3: element 2 of the array must be a JSON object (format json)"),
    ('[\n {"q": 1},\n {"q": }\n]', "3: not valid JSON (Expecting value) (format json)"),
    ('[\n {"q": 1}\n {"q": 2}\n]', "3: not valid JSON (expected ',' or ']' after an element) (format json)"),
    ('[\n {"q": 1},\n', "3: not valid JSON (the file ends before the array is closed with ]) (format json)"),
    ('[{"q": 1}]\n[]', "2: not valid JSON (text after the array's closing ]) (format json)"),
])
def test_a_json_file_that_is_not_an_array_of_objects(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path / "rows.json", text)
    assert error_of(path) == f"{path}:{expected}"


def test_a_large_json_array_is_refused_for_jsonl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(formats, "MAX_JSON_BYTES", 1 << 20)
    path = write(tmp_path / "big.json", "[" + ",".join(['{"q": "%s"}' % ("x" * 1000)] * 3000) + "]")
    assert error_of(path) == (f"{path}: a JSON dataset is read whole, and this one has 3 MiB (more than 1 MiB): "
                              "write it as JSONL, one object per line, which is read line by line (format json)")


def test_jsonl_is_read_as_before(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.jsonl", '{"q": 1}\n\n{"q": 2}\n[3]\n')
    assert list(read_dataset(path, 2)) == [(1, 1, {"q": 1}), (3, 3, {"q": 2})]  # a row's number is its line
    assert error_of(path) == f"{path}:4: each line must be a JSON object"
    assert count_dataset(path) == 3


# -- Parquet --------------------------------------------------------------------------------------------------

def test_parquet_rows_across_row_groups_equal_the_csv_rows(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "mmlu.parquet", reference_rows(), row_group_size=3)
    assert pq.ParquetFile(path).num_row_groups == 3
    rows = list(read_dataset(path))
    assert [row for _, _, row in rows] == reference_rows()
    assert [(line, number) for line, number, _ in rows] == [(n, n) for n in range(1, 9)]
    assert [number for _, number, _ in read_dataset(path, 4)] == [1, 2, 3, 4]


def test_parquet_rows_are_counted_from_the_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_parquet(tmp_path / "mmlu.parquet", reference_rows())

    def no_reading(*args, **kwargs):
        raise AssertionError("the rows were read to count them")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", no_reading)
    assert count_dataset(path) == 8 and count_dataset(path, 5) == 5


def test_parquet_values_become_what_a_json_row_holds(tmp_path: Path) -> None:
    table = pa.table({
        "day": pa.array([datetime.date(2024, 2, 29)]),
        "at": pa.array([datetime.datetime(2024, 2, 29, 12, 30)], pa.timestamp("s")),
        "price": pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)),
        "text_bytes": pa.array([b"caf\xc3\xa9"]),
        "raw": pa.array([b"\xff\x00"]),
        "gold": pa.array([2], pa.int64()),
        "questions": pa.array([[{"q": "Who?", "options": ["a", "b"]}]]),
    })
    pq.write_table(table, tmp_path / "typed.parquet")
    [(_, _, row)] = list(read_dataset(tmp_path / "typed.parquet"))
    assert row == {"day": "2024-02-29", "at": "2024-02-29T12:30:00", "price": "1.50", "text_bytes": "café",
                   "raw": "/wA=", "gold": 2, "questions": [{"q": "Who?", "options": ["a", "b"]}]}
    json.dumps(row)  # a result line can hold any of it


def test_a_file_that_is_not_parquet_says_so(tmp_path: Path) -> None:
    path = write(tmp_path / "mmlu.parquet", MMLU_CSV.read_text(encoding="utf-8"))
    expected = (f"{path}: not a Parquet file (it does not end with Parquet's footer); name its format with "
                "dataset.format if it is another (format parquet)")
    assert error_of(path) == expected
    with pytest.raises(RunnerError, match=re.escape(expected)):
        count_dataset(path)


def test_a_truncated_parquet_file_is_one_sentence(tmp_path: Path) -> None:
    whole = write_parquet(tmp_path / "whole.parquet", reference_rows()).read_bytes()
    path = tmp_path / "cut.parquet"
    path.write_bytes(whole[: len(whole) // 2] + whole[-8:])  # the end marker kept, the footer broken
    message = error_of(path)
    assert message.startswith(f"{path}: ") and message.endswith("(format parquet)")


def test_parquet_without_pyarrow_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_parquet(tmp_path / "mmlu.parquet", reference_rows())
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    assert error_of(path) == f"{path}: reading Parquet needs pyarrow: pip install pyarrow (format parquet)"


# -- Hugging Face save_to_disk folders -------------------------------------------------------------------------

def test_a_hugging_face_folder_reads_as_the_csv(tmp_path: Path) -> None:
    folder = save_hf(tmp_path / "mmlu_hf", reference_rows())
    rows = list(read_dataset(folder))
    assert [row for _, _, row in rows] == reference_rows()
    assert [number for _, number, _ in rows] == list(range(1, 9))
    assert count_dataset(folder) == 8 and count_dataset(folder, 2) == 2
    assert len(list(read_dataset(Dataset(path=str(folder), format="hf"), 3))) == 3


def test_a_dataset_dict_folder_reads_the_split_named(tmp_path: Path) -> None:
    rows = reference_rows()
    folder = save_hf(tmp_path / "mmlu_dict", splits={"test": rows, "dev": rows[:2]})
    dev = Dataset(path=str(folder), split="dev")
    assert [row for _, _, row in read_dataset(dev)] == rows[:2]
    assert count_dataset(dev) == 2 and count_dataset(Dataset(path=str(folder), split="test")) == 8
    assert count_dataset(folder) == 10  # a bare path names no split: the splits together
    assert error_of(Dataset(path=str(folder))) == (
        f"{folder}: the folder holds the splits test, dev: choose one with dataset.split (format hf)")
    assert error_of(Dataset(path=str(folder), split="train")) == (
        f"{folder}: the folder has no split 'train' (its splits: test, dev) (format hf)")


def test_a_split_of_a_folder_without_splits_is_refused(tmp_path: Path) -> None:
    folder = save_hf(tmp_path / "one", reference_rows())
    assert error_of(Dataset(path=str(folder), split="test")) == (
        f"{folder}: dataset.split 'test' names a split, but the folder holds one dataset without splits; leave out "
        "dataset.split (format hf)")


def test_a_folder_not_written_by_save_to_disk(tmp_path: Path) -> None:
    (tmp_path / "loose").mkdir()
    write(tmp_path / "loose" / "rows.csv", "q\nx\n")
    assert error_of(tmp_path / "loose") == (
        f"{tmp_path / 'loose'}: not a folder written by Hugging Face datasets' save_to_disk (it has no state.json or "
        "dataset_dict.json) (format hf)")
    assert error_of(Dataset(path=str(MMLU_CSV), format="hf")) == (
        f"{MMLU_CSV}: a Hugging Face dataset is a folder written by save_to_disk, and this is a file; name its format "
        "with dataset.format (format hf)")


def test_a_damaged_folder_is_one_sentence(tmp_path: Path) -> None:
    folder = save_hf(tmp_path / "broken", reference_rows())
    (folder / "state.json").write_text("{not json", encoding="utf-8")
    message = error_of(folder)
    assert message.startswith(f"{folder}: cannot be read as a Hugging Face dataset folder: ")
    assert message.endswith("(format hf)")


def test_a_folder_without_the_datasets_package_says_what_to_install(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    folder = save_hf(tmp_path / "mmlu_hf", reference_rows())
    monkeypatch.setitem(sys.modules, "datasets", None)
    assert error_of(folder) == (f"{folder}: reading a Hugging Face dataset folder needs the datasets package: "
                                "pip install datasets (format hf)")


def test_a_split_on_a_file_is_refused(tmp_path: Path) -> None:
    assert error_of(Dataset.model_construct(path=str(MMLU_CSV), format=None, split="test")) == (
        f"{MMLU_CSV}: dataset.split 'test' is only for a Hugging Face dataset folder, and this dataset is read as csv "
        "(format csv)")
    job = write(tmp_path / "job.yaml", MMLU_JOB.format(dataset=f"{{path: {json.dumps(str(MMLU_CSV))}, split: test}}",
                                                       choices="fields: [A, B, C, D], gold: answer",
                                                       model="sim:m", output=json.dumps(str(tmp_path / "results"))))
    with pytest.raises(JobFileError, match=r"job.yaml:\d+: stages\[0\]\.dataset: split: is only for a Hugging Face "
                                           r"dataset folder \(format: hf\), and this dataset is read as csv"):
        load_job(job)


def test_a_folder_digest_follows_its_files(tmp_path: Path) -> None:
    folder = save_hf(tmp_path / "a", reference_rows())
    same = save_hf(tmp_path / "b", reference_rows())
    changed = save_hf(tmp_path / "c", [dict(row, answer="A") for row in reference_rows()])
    assert dataset_digest(folder) == dataset_digest(same) != dataset_digest(changed)
    assert dataset_digest(MMLU_CSV) != dataset_digest(folder)


# -- options from columns, gold answers -----------------------------------------------------------------------

def choices(**settings) -> Choices:
    return Choices(gold="answer", **settings)


@pytest.mark.parametrize(("gold", "options", "index"), [
    ("B", ["w", "x", "y", "z"], 1),
    ("b", ["w", "x", "y", "z"], 1),
    ("(B)", ["w", "x", "y", "z"], 1),
    ("B.", ["w", "x", "y", "z"], 1),
    (" D ", ["w", "x", "y", "z"], 3),
    ("2", ["w", "x", "y", "z"], 2),
    (2, ["w", "x", "y", "z"], 2),
    ("y", ["w", "x", "y", "z"], 2),
    # an option's exact text wins over the letter or the index it would also spell
    ("B", ["C", "A", "B", "D"], 2),
    ("1", ["10", "0", "1", "2"], 2),
    ("42", ["32", "40", "42", "52"], 2),
])
def test_a_gold_answer_is_read_in_the_order_choices_gold_says(gold, options, index) -> None:
    assert gold_index("rows.csv", 5, {"answer": gold}, choices(), options) == index


@pytest.mark.parametrize(("gold", "message"), [
    ("E", "rows.csv:5: the gold answer 'E' is not one of the options, nor a letter among A to D"),
    ("7", "rows.csv:5: gold 7 (field 'answer') is not an option's index: the row has 4 options, numbered 0 to 3"),
    ("maybe", "rows.csv:5: the gold answer 'maybe' is not one of the options"),
    ("B or C", "rows.csv:5: the gold answer 'B or C' is not one of the options"),
    ("-1", "rows.csv:5: the gold answer '-1' is not one of the options"),
])
def test_a_gold_answer_that_names_no_option_is_one_sentence(gold, message) -> None:
    with pytest.raises(RunnerError) as info:
        gold_index("rows.csv", 5, {"answer": gold}, choices(), ["w", "x", "y", "z"])
    assert str(info.value) == message


def test_options_file_field_and_fields_exclude_each_other(tmp_path: Path) -> None:
    assert choices(fields=["A", "B"]).fields == ["A", "B"]
    assert choices(field="choices", fields=["A", "B"]).fields == ["A", "B"]  # the default named is no second one
    for settings, named in ((dict(fields=["A"], options_file="o.json"), "fields and options_file"),
                            (dict(field="opts", fields=["A"]), "field and fields"),
                            (dict(field="opts", options_file="o.json"), "field and options_file")):
        with pytest.raises(ValueError, match=f"the options come from one of field:, fields: and options_file:, and "
                                             f"this names {named}"):
            choices(**settings)
    job = write(tmp_path / "job.yaml", MMLU_JOB.format(
        dataset=f"{{path: {json.dumps(str(MMLU_CSV))}}}", choices="fields: [A, B], options_file: o.json",
        model="sim:m", output=json.dumps(str(tmp_path / "results"))))
    with pytest.raises(JobFileError, match=r"stages\[0\]\.choices: the options come from one of"):
        load_job(job)


def test_a_row_without_one_of_the_option_columns_names_it(tmp_path: Path) -> None:
    path = write(tmp_path / "three.csv", "question,A,B,C,answer\nq,x,y,z,B\n")
    job = load_job(mmlu_job(tmp_path, path))
    with pytest.raises(RunnerError) as info:
        check_datasets(job)
    assert str(info.value) == f"{path}:2: the row has no value in field 'D', one of choices.fields ['A', 'B', 'C', 'D']"


def test_validate_names_the_csv_line_of_a_bad_letter(tmp_path: Path, monkeypatch, capsys) -> None:
    lines = MMLU_CSV.read_text(encoding="utf-8").splitlines()
    lines[5] = lines[5].replace(",B,arithmetic", ",F,arithmetic")  # the row on line 6, after the two-line cell
    path = write(tmp_path / "mmlu.csv", "\n".join(lines) + "\n")
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(mmlu_job(tmp_path, path)))
    assert code == 2
    assert err.strip() == f"Error: {path}:6: the gold answer 'F' is not one of the options, nor a letter among A to D"


# -- end to end -----------------------------------------------------------------------------------------------

MMLU_JOB = """\
name: mmlu
models: [{model}]
params: {{temperature: 0, max_tokens: 5}}
output_dir: {output}
stages:
  - name: mmlu
    dataset: {dataset}
    prompt:
      system: Answer with one letter.
      user: "{{{{ question }}}}\\n{{{{ options_block }}}}\\nAnswer:"
    choices: {{{choices}, seeds: [0, 1]}}
    parse: letter
    record: [subject]
"""


def mmlu_job(tmp_path: Path, dataset: Path, name: str = "job.yaml", model: str = "sim:m") -> Path:
    """The MMLU-style job on ``dataset``: ``sim:m`` to validate and plan, ``fake:m`` to run (fake_provider)."""
    return write(tmp_path / name, MMLU_JOB.format(dataset=f"{{path: {json.dumps(str(dataset))}}}",
                                                  choices="fields: [A, B, C, D], gold: answer", model=model,
                                                  output=json.dumps(str(tmp_path / "results"))))


def answers_arithmetic_only(model, messages, params, n) -> Completion:
    """Knows the arithmetic answers and gets every history question wrong: the letter shown beside the right
    option's text, or beside the first other one."""
    content = messages[-1]["content"]
    [row] = [r for r in reference_rows() if r["question"] in content]
    right = row[row["answer"]]
    shown = dict(re.findall(r"^([A-D])\. (.*)$", content, flags=re.M))
    assert sorted(shown.values()) == sorted(row[letter] for letter in LETTERS), content
    letter = next(k for k, text in shown.items() if (text == right) == (row["subject"] == "arithmetic"))
    return Completion(text=letter, finish_reason="stop", input_tokens=20, output_tokens=1)


#: what two runs of the same rows must agree on (a line also says its run and whether it was a cache hit)
SAME = ("id", "seed", "variant", "permutation", "response", "parsed", "gold", "score", "fields", "cache_key")


def result_lines(outcome) -> list[dict]:
    lines = [json.loads(line) for line in outcome.results["mmlu"].read_text(encoding="utf-8").splitlines()]
    return sorted(({key: line.get(key) for key in SAME} for line in lines), key=lambda r: (int(r["id"]), r["seed"]))


async def test_an_mmlu_style_csv_job_runs_end_to_end(tmp_path: Path, fake_provider) -> None:
    fake_provider.behaviour = answers_arithmetic_only
    job = load_job(mmlu_job(tmp_path, MMLU_CSV, model="fake:m"))
    outcome = await execute(job, open_store(tmp_path / "store.sqlite"))
    assert outcome.status == "completed"
    lines = result_lines(outcome)
    # 8 rows x 2 seeds; two seeds that happen to shuffle a row alike ask one question, sent once
    assert len(lines) == 16
    assert len(fake_provider.history) == len({(line["id"], tuple(line["permutation"])) for line in lines}) > 8
    reference = reference_rows()
    assert [(line["id"], line["seed"]) for line in lines] == [(str(n), s) for n in range(1, 9) for s in (0, 1)]
    for line in lines:
        row = reference[int(line["id"]) - 1]
        assert line["gold"] == LETTERS.index(row["answer"])
        assert line["fields"] == {"subject": row["subject"]}
        assert line["score"] == (1.0 if row["subject"] == "arithmetic" else 0.0)
    # the question whose cell spans two lines reached the prompt whole
    assert any("Which of these numbers is prime,\ngiven that exactly one is?" in h[1][-1]["content"]
               for h in fake_provider.history)


async def test_the_same_rows_as_parquet_and_as_a_hugging_face_folder_give_the_same_results(
        tmp_path: Path, fake_provider) -> None:
    fake_provider.behaviour = answers_arithmetic_only
    store = open_store(tmp_path / "store.sqlite")
    from_csv = await execute(load_job(mmlu_job(tmp_path, MMLU_CSV, model="fake:m")), store)
    sent = len(fake_provider.history)
    parquet = write_parquet(tmp_path / "mmlu.parquet", reference_rows())
    from_parquet = await execute(load_job(mmlu_job(tmp_path, parquet, "parquet.yaml", "fake:m")), store)
    # the Hugging Face folder is named after validation, which looks for a file (see test_a_folder_validates);
    # reuse off: the stage's content address hashes its dataset as a file (see test_a_folder_stage_is_replayed)
    hf_job = load_job(mmlu_job(tmp_path, MMLU_CSV, "hf.yaml", "fake:m"))
    hf_job.stages[0].dataset.path = str(save_hf(tmp_path / "mmlu_hf", reference_rows()))
    from_hf = await execute(hf_job, store, reuse=False)
    assert from_csv.status == from_parquet.status == from_hf.status == "completed"
    # the same prompts (cache keys), so nothing was sent again, and the same results
    assert len(fake_provider.history) == sent
    assert result_lines(from_csv) == result_lines(from_parquet) == result_lines(from_hf)
    assert len(result_lines(from_hf)) == 16


def test_validate_reads_every_row_of_a_parquet_job(tmp_path: Path, monkeypatch, capsys) -> None:
    rows = reference_rows()
    rows[6]["answer"] = "Z"
    parquet = write_parquet(tmp_path / "mmlu.parquet", rows)
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(mmlu_job(tmp_path, parquet)))
    assert code == 2
    assert err.strip() == (f"Error: {parquet}:7: the gold answer 'Z' is not one of the options, nor a letter among "
                           "A to D")


def test_dataset_limit_and_id_hold_for_csv(tmp_path: Path) -> None:
    text = MMLU_CSV.read_text(encoding="utf-8").replace("question,", "key,question,", 1)
    lines = text.splitlines()
    numbered = [lines[0]] + [f"k{n}," + line if not line.startswith("given") else line
                             for n, line in enumerate(lines[1:], start=1)]
    path = write(tmp_path / "keyed.csv", "\n".join(numbered) + "\n")
    job_path = write(tmp_path / "job.yaml", MMLU_JOB.format(
        dataset=f"{{path: {json.dumps(str(path))}, id: key, limit: 3}}", choices="fields: [A, B, C, D], gold: answer",
        model="sim:m", output=json.dumps(str(tmp_path / "results"))))
    job = load_job(job_path)
    plan = StagePlan(job, job.stages[0])
    assert plan.total() == 6 and sorted({task.row_id for task in plan}) == ["k1", "k2", "k3"]


def test_a_repeated_csv_id_names_both_physical_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "ids.csv", 'key,question,A,B,answer\nk1,"two\nlines",x,y,A\nk2,q,x,y,B\nk1,q,x,y,A\n')
    job = write(tmp_path / "job.yaml", MMLU_JOB.format(
        dataset=f"{{path: {json.dumps(str(path))}, id: key}}", choices="fields: [A, B], gold: answer",
        model="sim:m", output=json.dumps(str(tmp_path / "results"))))
    with pytest.raises(RunnerError) as info:
        check_datasets(load_job(job))
    assert str(info.value).startswith(f"{path}:5: id 'k1' (field 'key') was already used on line 2 ({path}:2); ")

# -- a dataset folder (Hugging Face) through validation and replay ------------------------------------------

def test_a_folder_validates(tmp_path: Path) -> None:
    folder = save_hf(tmp_path / "mmlu_hf", reference_rows())
    job = load_job(mmlu_job(tmp_path, folder))
    assert job.stages[0].dataset.path == str(folder)


async def test_a_folder_stage_is_replayed(tmp_path: Path, fake_provider) -> None:
    fake_provider.behaviour = answers_arithmetic_only
    job = load_job(mmlu_job(tmp_path, MMLU_CSV, model="fake:m"))
    job.stages[0].dataset.path = str(save_hf(tmp_path / "mmlu_hf", reference_rows()))
    store = open_store(tmp_path / "store.sqlite")
    first = await execute(job, store)
    second = await execute(job, store)
    assert first.status == second.status == "completed"
    assert len(result_lines(first)) == len(result_lines(second)) == 16

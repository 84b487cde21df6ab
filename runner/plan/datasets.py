"""Read a stage's dataset in the formats researchers have benchmarks in: JSONL, a JSON array, CSV, TSV, Parquet
and a folder written by Hugging Face ``datasets`` (``save_to_disk``).

Every reader yields ``(line, number, row)``: ``line`` is where the row starts in the file (the physical line of a
text file, quoted multi-line CSV cells counted; the row's place from 1 in Parquet and Hugging Face folders),
what errors name; ``number`` is the row's place among the rows from 1 (a JSONL row's line, as always), a row's
default id. Rows are streamed where the format allows: JSONL, CSV and TSV line by line, Parquet and Hugging Face
folders in record batches; a JSON array is read whole, so a large one is refused. Every reader counts its rows
without building them (Parquet and Hugging Face folders from their metadata).

CSV and TSV cells stay strings, as written: nothing is guessed to be a number. TSV is CSV with tabs (a cell may be
quoted). Values a JSON row cannot hold (dates, decimals, bytes) are turned into text.

A file that cannot be read is one sentence naming the file, the line (or row) and the format.
"""

from __future__ import annotations

import base64
import csv
import datetime
import decimal
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.errors import RunnerError

if TYPE_CHECKING:
    from runner.spec.inputs import Dataset

__all__ = ["FORMATS", "MAX_JSON_BYTES", "count_dataset", "dataset_digest", "dataset_format", "format_of_name",
           "read_dataset"]

#: the values of ``dataset.format``
FORMATS = ("jsonl", "json", "csv", "tsv", "parquet", "hf")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv",
             ".parquet": "parquet"}
#: a JSON array is parsed whole: past this size, JSONL (streamed) is asked for
MAX_JSON_BYTES = 64 << 20
#: rows per Parquet / Arrow record batch
_BATCH_ROWS = 1024

Row = tuple[int, int, dict[str, Any]]


def format_of_name(path: str | Path) -> str | None:
    """The format a file's name says (its suffix, any case), or None."""
    return _SUFFIXES.get(Path(path).suffix.lower())


def dataset_format(path: str | Path, given: str | None = None) -> str:
    """The format to read ``path`` as: ``given`` (``dataset.format``), else a folder is a Hugging Face one and a
    file is what its suffix says; anything else is JSONL, as every dataset was before there were formats."""
    if given is not None:
        return given
    if os.path.isdir(path):
        return "hf"
    return format_of_name(path) or "jsonl"


def folder_problem(path: str | Path, given: str | None = None) -> str | None:
    """What is wrong with a folder named as a dataset (``given``: its ``dataset.format``), said after its name:
    only a Hugging Face dataset folder is read as one; None when it is one."""
    if given not in (None, "hf"):
        return f"is a directory, not a {given} file"
    if not _saved_by_datasets(Path(path)):
        return ("is a directory, and not one written by Hugging Face datasets' save_to_disk (it has no state.json "
                "or dataset_dict.json)")
    return None


def _saved_by_datasets(folder: Path) -> bool:
    return (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file()


def _settings(source: str | Path | Dataset) -> tuple[str, str | None, str | None]:
    """(path, given format, split) of a ``dataset:`` setting or a bare path."""
    if isinstance(source, (str, Path)):
        return str(source), None, None
    return source.path, source.format, source.split


def read_dataset(source: str | Path | Dataset, limit: int | None = None) -> Iterator[Row]:
    """(line, number, row) of each row of a dataset, at most ``limit`` rows, streamed where the format allows."""
    path, given, split = _settings(source)
    fmt = dataset_format(path, given)
    _check_split(path, fmt, split)
    if fmt == "hf":
        rows = _hf_rows(path, split)
    elif fmt == "parquet":
        rows = _parquet_rows(path)
    elif fmt in ("csv", "tsv"):
        rows = _delimited_rows(path, fmt)
    elif fmt == "json":
        rows = _json_rows(path)
    else:
        rows = _jsonl_rows(path)
    if limit is None:
        yield from rows
        return
    if limit <= 0:
        return
    for count, row in enumerate(rows, start=1):
        yield row
        if count >= limit:
            return


def count_dataset(source: str | Path | Dataset, limit: int | None = None) -> int:
    """How many rows a dataset has (at most ``limit``), without building them. A bare path to a Hugging Face
    DatasetDict folder names no split: its splits' rows are counted together."""
    path, given, split = _settings(source)
    fmt = dataset_format(path, given)
    _check_split(path, fmt, split)
    if fmt == "hf":
        count = _hf_count(path, split, every_split=isinstance(source, (str, Path)))
    elif fmt == "parquet":
        count = _parquet_file(path).metadata.num_rows
    elif fmt in ("csv", "tsv"):
        count = _count_records(path, fmt, limit)
    elif fmt == "json":
        count = sum(1 for _ in _json_rows(path))
    else:
        count = _count_lines(path, limit)
    return count if limit is None else min(count, limit)


def dataset_digest(path: str | Path) -> str:
    """SHA-256 of a dataset's bytes: a file's, or a folder's files (each by its path inside the folder), read in
    chunks. What a stage's content address can hold for a Hugging Face folder as for a file."""
    import hashlib

    digest = hashlib.sha256()
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    for file in files:
        if root.is_dir():
            name = file.relative_to(root).as_posix().encode("utf-8")
            digest.update(len(name).to_bytes(8, "big") + name + file.stat().st_size.to_bytes(8, "big"))
        with open(file, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def _check_split(path: str, fmt: str, split: str | None) -> None:
    if split is not None and fmt != "hf":
        raise RunnerError(f"{path}: dataset.split {split!r} is only for a Hugging Face dataset folder, and this "
                          f"dataset is read as {fmt} (format {fmt})")


# -- JSONL --------------------------------------------------------------------------------------------------------

def _jsonl_rows(path: str) -> Iterator[Row]:
    """Each non-blank line, a JSON object; its number is its line."""
    try:
        with open(path, encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RunnerError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise RunnerError(f"{path}:{line_no}: each line must be a JSON object")
                yield line_no, line_no, row
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc) from None


def _count_lines(path: str, limit: int | None) -> int:
    count = 0
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                count += 1
                if limit is not None and count >= limit:
                    break
    return count


def _not_utf8(path: str, exc: UnicodeDecodeError, fmt: str | None = None) -> RunnerError:
    suffix = f" (format {fmt})" if fmt else ""
    return RunnerError(f"{path}:{_undecodable_line(path)}: a dataset file must be UTF-8, and this line is not "
                       f"(byte 0x{exc.object[exc.start]:02x}); convert the file, e.g. with "
                       f"iconv -f latin1 -t utf-8{suffix}")


def _undecodable_line(path: str | Path) -> int:
    """The number of the first line of a file that is not valid UTF-8 (a decoder reads ahead by blocks, so the
    line being parsed when it fails is not necessarily the culprit)."""
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return line_no
    return 1


# -- JSON array ---------------------------------------------------------------------------------------------------

def _json_rows(path: str) -> Iterator[Row]:
    """The objects of one JSON array, each with the line it starts on; the file is parsed whole."""
    size = os.path.getsize(path)
    if size > MAX_JSON_BYTES:
        raise RunnerError(f"{path}: a JSON dataset is read whole, and this one has {size / (1 << 20):.0f} MiB (more "
                          f"than {MAX_JSON_BYTES >> 20} MiB): write it as JSONL, one object per line, which is read "
                          "line by line (format json)")
    try:
        with open(path, encoding="utf-8-sig") as handle:
            text = handle.read()
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc, "json") from None
    decoder = json.JSONDecoder()
    pos, line = _skip_space(text, 0), 1
    if not text.startswith("[", pos):
        raise RunnerError(f"{path}:{_line_at(text, pos)}: a JSON dataset must be one array of objects, "
                          "[{...}, {...}] (format json)")
    pos = _skip_space(text, pos + 1)
    counted, number = 0, 0
    while not text.startswith("]", pos):
        if number:
            if not text.startswith(",", pos):
                raise _bad_json(path, text, pos, "expected ',' or ']' after an element")
            pos = _skip_space(text, pos + 1)
        line += text.count("\n", counted, pos)
        counted = pos
        try:
            row, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise _bad_json(path, text, exc.pos, exc.msg) from None
        number += 1
        if not isinstance(row, dict):
            raise RunnerError(f"{path}:{line}: element {number} of the array must be a JSON object (format json)")
        yield line, number, row
        pos = _skip_space(text, end)
    if _skip_space(text, pos + 1) < len(text):
        raise _bad_json(path, text, _skip_space(text, pos + 1), "text after the array's closing ]")


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _line_at(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _bad_json(path: str, text: str, pos: int, why: str) -> RunnerError:
    if pos >= len(text):
        why = "the file ends before the array is closed with ]"
    return RunnerError(f"{path}:{_line_at(text, pos)}: not valid JSON ({why}) (format json)")


# -- CSV and TSV --------------------------------------------------------------------------------------------------

def _records(path: str, fmt: str) -> Iterator[tuple[int, list[str]]]:
    """(the line a record starts on, its cells) of each non-blank record, the header first."""
    delimiter = "," if fmt == "csv" else "\t"
    start = 1
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle, delimiter=delimiter, strict=True)
            try:
                for cells in reader:
                    if cells:
                        yield start, cells
                    start = reader.line_num + 1
            except csv.Error as exc:
                why = "a quoted cell is never closed" if str(exc) == "unexpected end of data" else str(exc)
                raise RunnerError(f"{path}:{start}: the row cannot be read as {fmt.upper()}: {why} "
                                  f"(format {fmt})") from None
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc, fmt) from None


def _header(path: str, fmt: str, records: Iterator[tuple[int, list[str]]]) -> list[str]:
    first = next(records, None)
    if first is None:
        raise RunnerError(f"{path}:1: the file has no header line; a {fmt.upper()} dataset's first line names its "
                          f"columns (format {fmt})")
    line, names = first
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise RunnerError(f"{path}:{line}: the header names column {name!r} twice (format {fmt})")
        seen.add(name)
    return names


def _delimited_rows(path: str, fmt: str) -> Iterator[Row]:
    records = _records(path, fmt)
    names = _header(path, fmt, records)
    for number, (line, cells) in enumerate(records, start=1):
        if len(cells) != len(names):
            raise RunnerError(f"{path}:{line}: row has {len(cells)} cells, the header has {len(names)} "
                              f"(format {fmt})")
        yield line, number, dict(zip(names, cells, strict=True))


def _count_records(path: str, fmt: str, limit: int | None) -> int:
    records = _records(path, fmt)
    _header(path, fmt, records)
    count = 0
    for _ in records:
        count += 1
        if limit is not None and count >= limit:
            break
    return count


# -- Parquet and Hugging Face folders (Arrow) ---------------------------------------------------------------------

def _parquet_file(path: str) -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise RunnerError(f"{path}: reading Parquet needs pyarrow: pip install pyarrow (format parquet)") from None
    try:
        return pyarrow.parquet.ParquetFile(path)
    except (pyarrow.ArrowException, OSError) as exc:
        if "magic bytes" in str(exc):
            raise RunnerError(f"{path}: not a Parquet file (it does not end with Parquet's footer); name its "
                              "format with dataset.format if it is another (format parquet)") from None
        raise RunnerError(f"{path}: cannot be read as Parquet: {_first_sentence(exc)} (format parquet)") from None


def _parquet_rows(path: str) -> Iterator[Row]:
    import pyarrow

    parquet = _parquet_file(path)
    batches = parquet.iter_batches(batch_size=_BATCH_ROWS)
    yield from _arrow_rows(path, "parquet", batches, pyarrow.ArrowException)


def _arrow_rows(path: str, fmt: str, batches: Iterable[Any], errors: type[Exception]) -> Iterator[Row]:
    """Rows of Arrow record batches (or tables), numbered from 1; values turned into what a JSON row holds."""
    number = 0
    iterator = iter(batches)
    while True:
        try:
            batch = next(iterator, None)
        except errors as exc:
            raise RunnerError(f"{path}: row {number + 1} and after cannot be read: {_first_sentence(exc)} "
                              f"(format {fmt})") from None
        if batch is None:
            return
        for row in batch.to_pylist():
            number += 1
            yield number, number, {str(k): _plain(v) for k, v in row.items()}


def _plain(value: Any) -> Any:
    """A value as a JSON row holds it: lists, objects, text, numbers, true/false, null."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):  # Arrow's maps: (key, value) pairs
        return [_plain(v) for v in value]
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    if isinstance(value, decimal.Decimal):
        return str(value)
    return str(value)


def _first_sentence(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(". ")[0].rstrip(".")


def _hf_folder(path: str) -> Any:
    """The ``datasets`` object saved in a folder: a Dataset or a DatasetDict."""
    folder = Path(path)
    if not folder.is_dir():
        raise RunnerError(f"{path}: a Hugging Face dataset is a folder written by save_to_disk, and this is a file; "
                          "name its format with dataset.format (format hf)")
    if not _saved_by_datasets(folder):
        raise RunnerError(f"{path}: not a folder written by Hugging Face datasets' save_to_disk (it has no state.json "
                          "or dataset_dict.json) (format hf)")
    try:
        import datasets
    except ImportError:
        raise RunnerError(f"{path}: reading a Hugging Face dataset folder needs the datasets package: "
                          "pip install datasets (format hf)") from None
    try:
        return datasets.load_from_disk(str(folder))
    except Exception as exc:  # datasets raises many types for a damaged folder
        raise RunnerError(f"{path}: cannot be read as a Hugging Face dataset folder: {_first_sentence(exc)} "
                          "(format hf)") from None


def _hf_split(path: str, loaded: Any, split: str | None) -> Any:
    """The Dataset a folder's object and ``dataset.split`` name."""
    import datasets

    if isinstance(loaded, datasets.DatasetDict):
        names = ", ".join(loaded)
        if split is None:
            raise RunnerError(f"{path}: the folder holds the splits {names}: choose one with dataset.split "
                              "(format hf)")
        if split not in loaded:
            raise RunnerError(f"{path}: the folder has no split {split!r} (its splits: {names}) (format hf)")
        return loaded[split]
    if split is not None:
        raise RunnerError(f"{path}: dataset.split {split!r} names a split, but the folder holds one dataset without "
                          "splits; leave out dataset.split (format hf)")
    return loaded


def _hf_rows(path: str, split: str | None) -> Iterator[Row]:
    import pyarrow

    dataset = _hf_split(path, _hf_folder(path), split)
    yield from _arrow_rows(path, "hf", dataset.with_format("arrow").iter(batch_size=_BATCH_ROWS),
                           pyarrow.ArrowException)


def _hf_count(path: str, split: str | None, every_split: bool) -> int:
    import datasets

    loaded = _hf_folder(path)
    if every_split and isinstance(loaded, datasets.DatasetDict):
        return sum(part.num_rows for part in loaded.values())
    return _hf_split(path, loaded, split).num_rows

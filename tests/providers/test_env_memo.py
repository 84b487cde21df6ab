"""``runner/providers/env_memo.py``: a cloud's credentials made once per process for the same environment and files,
made again when any variable or any of the files changes, never kept when making them failed, and made once however
many threads ask at once."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from runner.providers.env_memo import EnvironmentMemo, file_state


def counted() -> tuple[list[int], object]:
    made: list[int] = []

    def make() -> int:
        made.append(len(made))
        return len(made)

    return made, make


def test_the_same_environment_and_files_give_the_value_made_before(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    memo: EnvironmentMemo[int] = EnvironmentMemo()
    made, make = counted()
    key_file = tmp_path / "key.json"
    key_file.write_text("{}")
    assert [memo.get("scope", [str(key_file), None], make) for _ in range(3)] == [1, 1, 1]
    monkeypatch.setenv("RUNNER_TEST_MEMO_VARIABLE", "a")  # any variable
    assert memo.get("scope", [str(key_file), None], make) == 2
    assert memo.get("other scope", [str(key_file), None], make) == 3
    assert memo.get("scope", [str(key_file), None], make) == 4  # only the last one is kept
    key_file.write_text('{"changed": true}')
    os.utime(key_file, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert memo.get("scope", [str(key_file), None], make) == 5
    appearing = tmp_path / "later.json"
    assert memo.get("scope", [str(key_file), str(appearing)], make) == 5  # (a file not there is no file)
    appearing.write_text("{}")
    assert memo.get("scope", [str(key_file), str(appearing)], make) == 6
    appearing.unlink()
    assert memo.get("scope", [str(key_file), str(appearing)], make) == 7
    memo.forget()
    assert memo.get("scope", [str(key_file), str(appearing)], make) == 8
    assert len(made) == 8


def test_what_failed_to_load_is_not_kept() -> None:
    memo: EnvironmentMemo[int] = EnvironmentMemo()
    attempts = []

    def failing() -> int:
        attempts.append(1)
        raise ValueError("no credentials")

    for _ in range(2):
        with pytest.raises(ValueError, match="no credentials"):
            memo.get("k", [], failing)
    assert len(attempts) == 2 and memo.get("k", [], lambda: 5) == 5


def test_threads_asking_at_once_get_one_value() -> None:
    memo: EnvironmentMemo[object] = EnvironmentMemo()
    made = []

    def slow() -> object:
        made.append(1)
        time.sleep(0.05)
        return object()

    got = []
    threads = [threading.Thread(target=lambda: got.append(memo.get("k", [], slow))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1 and len({id(value) for value in got}) == 1


def test_a_file_s_state_is_none_where_there_is_no_file(tmp_path: Path) -> None:
    assert file_state(None) is None and file_state(str(tmp_path / "missing")) is None
    (tmp_path / "here").write_text("x")
    assert file_state(str(tmp_path / "here")) is not None

"""The runner's version names the code that runs (runner/version.py): ``runner --version`` and every result line
carry git's version of the checkout (its commit's hash; a dirty tree dated), the same string setuptools-scm builds
into the package's metadata; without git, the installed metadata's version."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from runner import version as runner_version
from runner.report.cells import sent_with_lines
from runner.version import FALLBACK, git_version, installed_version, version
from tests.helpers import ROOT, run_cli

HAS_GIT = shutil.which("git") is not None
IN_CHECKOUT = HAS_GIT and (ROOT / ".git").exists()


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org",
                           "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def fresh_version():
    """version() asked anew in this test (it is cached per process), and cached anew after it."""
    version.cache_clear()
    yield version
    version.cache_clear()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A new git checkout of a project with one commit."""
    root = tmp_path / "checkout"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n", encoding="utf-8")
    (root / "a.txt").write_text("one\n", encoding="utf-8")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "first")
    return root


def _head(root: Path) -> str:
    return _git(root, "rev-parse", "HEAD")


@pytest.mark.skipif(not IN_CHECKOUT, reason="the tests run from a git checkout of the project")
def test_runner_version_names_the_head_commit(monkeypatch, capsys, fresh_version) -> None:
    code, out, err = run_cli(monkeypatch, capsys, "--version")
    assert code == 0, err
    assert out == f"runner {git_version(ROOT)}\n"
    exact = subprocess.run(["git", "-C", str(ROOT), "describe", "--tags", "--exact-match", "--match", "*[0-9]*"],
                           capture_output=True, text=True).returncode == 0
    if not exact:  # on a release tag the version is the tag; otherwise it names the commit
        assert f"+g{_head(ROOT)[:9]}" in out
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip() != ""
    assert (".d" in out.split("+")[-1]) == dirty
    # the same from the installed command, in a process of its own
    done = subprocess.run([sys.executable, "-c", "from runner.cli import main; main()", "--version"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout == out, done.stderr


@pytest.mark.skipif(not IN_CHECKOUT, reason="the tests run from a git checkout of the project")
def test_a_result_line_and_the_report_carry_the_version(tmp_path, sim_server, monkeypatch, capsys,
                                                         fresh_version) -> None:
    (tmp_path / "job.yaml").write_text(json.dumps({
        "name": "versioned", "models": ["sim:gpt-v"], "params": {"temperature": 0, "max_tokens": 5},
        "providers": {"sim": {"base_url": sim_server, "timeout": 5}},
        "stages": [{"name": "mc", "dataset": {"path": "data/newterm/benchmark_2023/COMA_clean.jsonl", "limit": 2},
                    "prompt": "newterm/coma-exercise", "choices": {"field": "choices", "gold": "gold"},
                    "parse": "letter"}],
    }), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUNNER_DB", str(tmp_path / "cache.sqlite"))
    code, out, err = run_cli(monkeypatch, capsys, "submit", "job.yaml", "--no-check")
    assert code == 0, out + err
    run_id = next(line.split()[1].rstrip(":") for line in out.splitlines() if line.endswith(": completed"))
    expected = git_version(ROOT)
    lines = [json.loads(line) for line in (tmp_path / "results" / "versioned" / run_id / "mc.jsonl").open()]
    assert lines and {line["provenance"]["runner_version"] for line in lines} == {expected}
    code, out, err = run_cli(monkeypatch, capsys, "report", run_id)
    assert code == 0, err
    assert f"runner {expected}" in next(line for line in out.splitlines() if line.startswith("sent with: "))
    code, out, err = run_cli(monkeypatch, capsys, "report", run_id, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["sent_with"]["runner"] == expected


def test_sent_with_names_the_runner_last() -> None:
    assert sent_with_lines({"sent_with": {"runner": "0.1.dev3+gabc"}}) == ["sent with: runner 0.1.dev3+gabc"]
    assert sent_with_lines({"sent_with": {"sdk": {"openai": "3.0"}, "runner": "0.2.0"}}) == \
        ["sent with: SDKs openai 3.0; runner 0.2.0"]


@pytest.mark.skipif(not HAS_GIT, reason="needs git")
def test_the_scheme_commits_tags_and_a_dirty_tree(repo: Path) -> None:
    day = datetime(2026, 11, 29, tzinfo=UTC)
    assert git_version(repo, today=day) == f"0.1.dev1+g{_head(repo)[:9]}"
    (repo / "new.txt").write_text("untracked files do not count\n", encoding="utf-8")
    assert git_version(repo, today=day) == f"0.1.dev1+g{_head(repo)[:9]}"
    (repo / "a.txt").write_text("two\n", encoding="utf-8")  # a tracked file changed: dirty, dated
    assert git_version(repo, today=day) == f"0.1.dev1+g{_head(repo)[:9]}.d20261129"
    _git(repo, "commit", "-q", "-am", "second")
    _git(repo, "tag", "v0.2.0")
    assert git_version(repo, today=day) == "0.2.0"
    (repo / "a.txt").write_text("three\n", encoding="utf-8")
    assert git_version(repo, today=day) == f"0.2.1.dev0+g{_head(repo)[:9]}.d20261129"
    _git(repo, "commit", "-q", "-am", "third")
    assert git_version(repo, today=day) == f"0.2.1.dev1+g{_head(repo)[:9]}"
    _git(repo, "tag", "not-a-release")  # no digit: not a release tag
    assert git_version(repo, today=day) == f"0.2.1.dev1+g{_head(repo)[:9]}"


@pytest.mark.skipif(not HAS_GIT, reason="needs git")
def test_the_version_is_the_one_setuptools_scm_builds(repo: Path) -> None:
    """What runs from a checkout says what a wheel built from it would carry (pyproject.toml's settings)."""
    setuptools_scm = pytest.importorskip("setuptools_scm")

    def built() -> str:
        return setuptools_scm.get_version(root=str(repo), fallback_version=FALLBACK)

    assert git_version(repo) == built()
    (repo / "a.txt").write_text("two\n", encoding="utf-8")
    assert git_version(repo) == built()
    _git(repo, "commit", "-q", "-am", "second")
    _git(repo, "tag", "v1.4")
    assert git_version(repo) == built() == "1.4"
    (repo / "b.txt").write_text("b\n", encoding="utf-8")
    _git(repo, "add", "b.txt")
    _git(repo, "commit", "-q", "-m", "third")
    assert git_version(repo) == built() == f"1.5.dev1+g{_head(repo)[:9]}"


def test_without_git_the_installed_version(tmp_path, monkeypatch, fresh_version) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git to be found
    assert git_version(ROOT) is None
    assert fresh_version() == installed_version()
    assert git_version(tmp_path) is None  # not a checkout


@pytest.mark.skipif(not IN_CHECKOUT, reason="the tests run from a git checkout of the project")
def test_git_asked_early_answers_as_git_asked_when_needed(monkeypatch, fresh_version) -> None:
    # runner submit starts git first thing (runner/cli/__init__.py), so that it runs beside the imports
    late = fresh_version()
    version.cache_clear()
    monkeypatch.setattr(runner_version, "_EARLY", {})
    runner_version.ask_git_early()
    started = dict(runner_version._EARLY)
    assert set(started) == {runner_version._DESCRIBE, runner_version._COUNT}
    assert fresh_version() == late
    assert runner_version._EARLY == {}  # its answer was taken, the count's reaped: neither is taken again
    assert all(started_git.returncode == 0 for started_git in started.values())
    runner_version.ask_git_early()  # the version is known: git is not asked again
    assert runner_version._EARLY == {}


def test_the_version_is_asked_once_a_process(monkeypatch, fresh_version) -> None:
    calls = []
    monkeypatch.setattr(runner_version, "git_version", lambda root: calls.append(root) or "9.9")
    assert fresh_version() == fresh_version() == "9.9" and calls == [runner_version.SOURCE_ROOT]


def test_not_installed_and_not_in_git(monkeypatch, fresh_version) -> None:
    import importlib.metadata

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    monkeypatch.setattr(runner_version, "git_version", lambda root: None)
    assert installed_version() == FALLBACK == fresh_version() == "0.0"


def test_a_copy_of_the_package_outside_the_checkout_says_the_installed_version(tmp_path) -> None:
    copy = tmp_path / "elsewhere"
    (copy / "runner").mkdir(parents=True)
    for name in ("__init__.py", "version.py"):
        shutil.copy2(ROOT / "runner" / name, copy / "runner" / name)
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run([sys.executable, "-c", "import runner.version as v; print(v.SOURCE_ROOT); "
                           "print(v.version()); print(v.installed_version())"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    root, said, installed = done.stdout.splitlines()
    assert Path(root) == copy and said == installed

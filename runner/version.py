"""The runner's version, naming the code that runs: what ``runner --version`` prints, every result line's
``provenance.runner_version`` and a report's ``sent with`` line carry.

The version is setuptools-scm's, from git: ``0.1.dev457+g1a2b3c4d5`` is the 457th commit, whose hash starts
``1a2b3c4d5``, with no release tag before it (a tag ``v0.2.0`` makes it ``0.2.0`` on the tagged commit, then
``0.2.1.dev3+g…`` three commits later), and ``….d20261129`` at the end says the work tree had changes not committed
(tracked files only), on that day (UTC).

Installed from a wheel or an sdist, the version is the one the build wrote into the package's metadata. An editable
install of a git checkout (the README's ``pip install -e .``) would keep the version of the commit it was installed
at, however many commits later it runs; so when the package sits at the top of a git checkout, this module asks git
itself, the way setuptools-scm does, once per process (two ``git`` calls without a tag, one with; a few
milliseconds, and only when something asks for the version: ``runner --help`` never does). Where git is missing or
fails, the installed metadata's version is used; without either, ``0.0`` (pyproject.toml's ``fallback_version``, what a
build from a copy with no git metadata gets).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import os
import re
import subprocess
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

#: the distribution whose version this is
DISTRIBUTION = "llm-job-runner"

#: the folder holding the ``runner`` package: the top of the git checkout when the runner runs from one
SOURCE_ROOT = Path(__file__).resolve().parent.parent

#: what a version without git metadata nor installed metadata is (pyproject.toml's [tool.setuptools_scm])
FALLBACK = "0.0"

#: the release tags git describe considers, as setuptools-scm's default
TAG_PATTERN = "*[0-9]*"

#: how many hex digits of the commit's hash the version shows (setuptools-scm's: ``g`` and 9)
HASH_DIGITS = 9

#: seconds one git call may take before the installed metadata's version is used instead
GIT_TIMEOUT = 10.0

#: the git commands of a version: the nearest tag, the distance and the commit; and the count of commits, for a
#: checkout with no release tag
_DESCRIBE = ("describe", "--dirty", "--tags", "--long", "--always", "--abbrev=40", "--match", TAG_PATTERN)
_COUNT = ("rev-list", "--count", "HEAD")

_DESCRIBED = re.compile(r"(?P<tag>.+)-(?P<distance>\d+)-g(?P<node>[0-9a-f]+)")


@cache
def version() -> str:
    """This runner's version: git's when the package is in a git checkout, else the installed one (per process)."""
    try:
        return git_version(SOURCE_ROOT) or installed_version()
    finally:
        _reap()  # an early answer not taken (the count, where a tag was found) is not taken later either


def installed_version() -> str:
    """The version in the installed distribution's metadata (for an editable install: as it was installed)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # a source tree never installed, outside git
        return FALLBACK


def git_version(root: Path, *, today: datetime | None = None) -> str | None:
    """setuptools-scm's version (its default ``guess-next-dev`` and ``node-and-date`` schemes) of the git checkout
    whose top is ``root``; None when ``root`` is not one (an installed package's folder), or git is not there or
    fails. ``today``: the day a dirty tree is dated with (default: now, UTC)."""
    if not (root / ".git").exists() or not (root / "pyproject.toml").is_file():  # .git: a folder, or a file (a
        # `git worktree`, a submodule); pyproject.toml: the checkout of this project, not an installed package's
        return None
    described = _git(root, *_DESCRIBE)
    if not described:
        return None
    dirty = described.endswith("-dirty")
    described = described.removesuffix("-dirty")
    found = _DESCRIBED.fullmatch(described)
    if found:
        tag, distance, node = _release(found["tag"]), int(found["distance"]), found["node"]
    elif re.fullmatch(r"[0-9a-f]{40,64}", described):  # no release tag: counted from the first commit, after 0.0
        count = _git(root, *_COUNT)
        if count is None or not count.isdigit():
            return None
        tag, distance, node = FALLBACK, int(count), described
    else:
        return None
    if distance == 0 and not dirty:
        return tag
    local = f"g{node[:HASH_DIGITS]}"
    if dirty:
        local += f".d{(today or datetime.now(UTC)):%Y%m%d}"
    return f"{_next(tag)}.dev{distance}+{local}"


def _release(tag: str) -> str:
    """A tag's version: ``v0.2.0`` is 0.2.0."""
    return tag[1:] if tag[:1] in ("v", "V") and tag[1:2].isdigit() else tag


def _next(release: str) -> str:
    """The release after ``release`` that a commit past it guesses (setuptools-scm's guess-next-dev): its last
    number plus one, ``0.2.0`` -> ``0.2.1``; a dev release stays itself."""
    release = release.split("+")[0]
    if ".dev" in release:
        return release.split(".dev")[0]
    found = re.fullmatch(r"(.*?)(\d+)", release)
    return f"{found[1]}{int(found[2]) + 1}" if found else release


#: git commands started ahead of their use (:func:`ask_git_early`), by their arguments
_EARLY: dict[tuple[str, ...], subprocess.Popen[str]] = {}


def ask_git_early() -> None:
    """Start the git commands :func:`version` will ask, in the background, when the runner runs from a git
    checkout: a command that will need the version (``runner submit``, ``resume``, ``work``) calls this first
    thing, so that git runs on another core while the runner imports, instead of on the way to the first
    request (some 0.03 s of git, more on a busy machine). :func:`version` takes their answers."""
    if _EARLY or version.cache_info().currsize or not (SOURCE_ROOT / ".git").exists() \
            or not (SOURCE_ROOT / "pyproject.toml").is_file():  # asked already, or not a checkout
        return
    for args in (_DESCRIBE, _COUNT):
        try:
            _EARLY[args] = subprocess.Popen(_command(SOURCE_ROOT, args), stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
                                            env=_environment())
        except OSError:  # no git: version() finds out again and uses the installed metadata
            break
    atexit.unregister(_reap)  # (registered once however often this is called)
    atexit.register(_reap)  # never asked (the command failed first): not left a zombie


def _reap() -> None:
    while _EARLY:
        started = _EARLY.popitem()[1]
        with contextlib.suppress(subprocess.SubprocessError):
            started.communicate(timeout=GIT_TIMEOUT)


def _command(root: Path, args: tuple[str, ...]) -> list[str]:
    return ["git", "-C", str(root), *args]


def _environment() -> dict[str, str]:
    """This process's environment without the variables that point git elsewhere, and with no optional lock (a
    commit under way elsewhere is not disturbed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    env["GIT_OPTIONAL_LOCKS"] = "0"
    return env


def _git(root: Path, *args: str) -> str | None:
    """One git command's output in ``root``, stripped (the answer of the one started early, when it was); None
    when git is missing, fails or takes too long."""
    started = _EARLY.pop(args, None) if root == SOURCE_ROOT else None
    try:
        if started is not None:
            out, _ = started.communicate(timeout=GIT_TIMEOUT)
            code = started.returncode
        else:
            done = subprocess.run(_command(root, args), capture_output=True, text=True, env=_environment(),
                                  timeout=GIT_TIMEOUT, stdin=subprocess.DEVNULL)
            out, code = done.stdout, done.returncode
    except (OSError, subprocess.SubprocessError):
        if started is not None:
            started.kill()
            started.communicate()
        return None
    return out.strip() if code == 0 else None

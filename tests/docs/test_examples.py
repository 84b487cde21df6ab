"""Every shell and Python example of the documentation (docs/*.md and README.md) runs, and one whose output is
shown prints it: tests/docs/examples.py says how a page's blocks are read and run.

One simulated server for the module (the test process's own, tests/conftest.py), a folder and a store per page; the
runner's commands are forks of the prefork server. The pages run in one test process (xdist_group), in order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.examples import RUN, Page, blocks, unlabelled_shell
from tests.helpers import ROOT

pytestmark = pytest.mark.xdist_group("docs_examples")

PAGES = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").glob("*.md")) + ["README.md"]


@pytest.fixture(scope="module")
def sim_url(_sim_processes) -> str:
    return _sim_processes.fresh(0.02)


@pytest.fixture(scope="module")
def pages_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("docs-examples")


@pytest.mark.parametrize("page", PAGES)
def test_every_example_of_the_page_runs(page, sim_url, pages_root):
    text = (ROOT / page).read_text(encoding="utf-8")
    Page.make(page, pages_root, sim_url).run_page(text)


@pytest.mark.parametrize("page", PAGES)
def test_every_shell_and_python_block_runs_or_says_why_not(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    assert unlabelled_shell(text, page) == [], "label these blocks console (a transcript) or bash (commands)"
    for block in blocks(text, page):
        if block.lang in RUN and block.not_run is not None:
            assert len(block.not_run) > 10, f"{block.where}: say why the block is not run"
        if block.lang not in RUN:
            assert block.not_run is None, f"{block.where}: only shell and Python blocks are run, or marked not run"


def test_the_docs_run_examples_against_the_simulated_server_and_the_cli():
    """Most task pages show commands that run; the markers stay the exception."""
    found = [block for page in PAGES for block in blocks((ROOT / page).read_text(encoding="utf-8"), page)
             if block.lang in RUN]
    run = [block for block in found if block.not_run is None]
    assert len(run) >= 15 and len(run) > len(found) - len(run), (len(run), len(found))


def test_a_block_with_a_wrong_flag_fails(sim_url, pages_root):
    """A command of a page changed by hand to a flag the runner does not have fails the page's run."""
    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    command = "$ runner submit first.yaml --run-id first-1"
    doctored = text.replace(command, command + " --no-such-flag", 1)
    assert doctored != text
    with pytest.raises(AssertionError, match="no-such-flag"):
        Page.make("doctored", pages_root, sim_url).run_page(doctored)

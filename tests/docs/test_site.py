"""The documentation site (mkdocs.yml, docs/) builds with warnings as errors, without the network: every page in the
navigation, every link and anchor between pages, every image it shows (mkdocs' own checks under --strict).

The build runs in this process, where a guard refuses any connection that is not to the loopback address, so a
theme or plug-in that fetched something would fail the test rather than pass on a machine with the network.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import shutil
import socket
from pathlib import Path

import pytest

from tests.helpers import ROOT

mkdocs_config = pytest.importorskip("mkdocs.config", reason="mkdocs is in the test extra: pip install -e '.[test]'")
from mkdocs.commands.build import build  # noqa: E402
from mkdocs.exceptions import Abort  # noqa: E402


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection but to 127.0.0.1 (or ::1) fails, as it would on a machine without the network."""
    real_connect = socket.socket.connect

    def connect(sock: socket.socket, address: object) -> None:
        host = address[0] if isinstance(address, tuple) else None
        try:
            loopback = host is not None and ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise AssertionError(f"the docs build tried to reach {address!r}")
        real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")


def _build(config_file: Path, site: Path) -> None:
    config = mkdocs_config.load_config(str(config_file), site_dir=str(site), strict=True)
    build(config)


def test_the_site_builds_strictly_offline(offline, tmp_path):
    site = tmp_path / "site"
    _build(ROOT / "mkdocs.yml", site)
    pages = {path.relative_to(site).as_posix() for path in site.rglob("index.html")}
    for page in ("getting-started/index.html", "troubleshooting/index.html", "reference/job-file/index.html",
                 "reference/cli/index.html", "reference/providers/index.html", "viewer/index.html"):
        assert page in pages
    viewer = (site / "viewer" / "index.html").read_text(encoding="utf-8")
    assert re.search(r'<img[^>]+src="\.\./screenshots/runs-1000\.png"', viewer)
    assert (site / "screenshots" / "runs-1000.png").stat().st_size > 0


def test_every_page_is_in_the_navigation():
    """A page left out of mkdocs.yml's nav would build without being reachable (mkdocs says it only at INFO)."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").rglob("*.md")):
        name = page.relative_to(ROOT / "docs").as_posix()
        assert f": {name}\n" in nav, f"{name} is not in mkdocs.yml's nav"


def test_a_broken_link_fails_the_build(offline, tmp_path, caplog):
    """The strict build is what catches a link to a page or an anchor that is not there."""
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "getting-started.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the budget page](budgets.md#no-such-section).\n",
                    encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="mkdocs"), pytest.raises(Abort):
        _build(copy / "mkdocs.yml", tmp_path / "site")
    assert "no-such-section" in caplog.text


def test_the_readme_links_only_to_files_that_exist():
    """README.md is read on the forge, outside the site: its relative links are checked here."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README.md links to {target}, which is not there"

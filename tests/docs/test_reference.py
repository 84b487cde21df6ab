"""The generated references (docs/reference/, written by scripts/gen_reference.py) are complete and up to date:
every setting the job file's schema has, every command and option of ``runner``, every registered provider, each
found in its page; and a committed page that differs from what the script writes now fails."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
import typing

import pytest
import typer.main
from pydantic import BaseModel

from runner.cli import app
from runner.providers.base import Provider, ProviderSettings, provider_class, provider_names
from runner.providers.capability_table import RULES
from runner.spec.schema import Job
from tests.helpers import ROOT

REFERENCE = ROOT / "docs" / "reference"
#: filled in by the loader, not read from a job file (runner/spec/schema.py says so)
LOADER_FIELDS = {"path", "base_dir", "sent_with"}


def _generator() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_reference"] = module
    spec.loader.exec_module(module)
    return module


def _models(annotation: object) -> list[tuple[str, type[BaseModel]]]:
    """The pydantic models inside a field's type, with the path suffix each takes ([] a list's item, .KEY a map's
    value)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    if origin is list:
        return [("[]" + s, m) for s, m in _models(args[0])]
    if origin is dict:
        return [(".KEY" + s, m) for s, m in _models(args[1])]
    if args:
        return [found for arg in args for found in _models(arg)]
    return []


def schema_paths(model: type[BaseModel] = Job, prefix: str = "") -> list[str]:
    """Every setting of the job file, as a path (``stages[].choices.seeds``), walked from the schema itself."""
    paths = []
    for name, field in model.model_fields.items():
        if model is Job and name in LOADER_FIELDS:
            continue
        path = prefix + (field.alias or name)
        paths.append(path)
        for suffix, inner in _models(field.annotation):
            paths.extend(schema_paths(inner, path + suffix + "."))
    return paths


def _cells(line: str) -> list[str]:
    """A Markdown table row's cells: split at the pipes that are neither escaped nor inside code."""
    cells, cell, code, previous = [], "", False, ""
    for char in line.strip().strip("|"):
        if char == "`":
            code = not code
        if char == "|" and not code and previous != "\\":
            cells.append(cell.strip())
            cell = ""
        else:
            cell += char
        previous = char
    return [*cells, cell.strip()]


def _rows(text: str) -> dict[str, str]:
    """The reference table's rows by their first cell's code: path -> the row's last cell (its meaning)."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = _cells(line)
            rows[cells[0].strip("`")] = cells[-1]
    return rows


def test_every_setting_of_the_schema_is_in_the_job_file_reference():
    rows = _rows((REFERENCE / "job-file.md").read_text(encoding="utf-8"))
    paths = schema_paths()
    assert len(paths) > 200 and "stages[].choices.seeds" in paths and "providers.KEY.rpm" in paths
    missing = [path for path in paths if path not in rows]
    assert not missing, f"not in docs/reference/job-file.md: {missing}"
    unexplained = [path for path in paths if not rows[path]]
    assert not unexplained, f"no meaning (a #: comment above the field) for: {unexplained}"


def test_every_providers_own_setting_is_in_the_job_file_reference():
    rows = _rows((REFERENCE / "job-file.md").read_text(encoding="utf-8"))
    own = [f"providers.{name}.{field}" for name in provider_names()
           for field in provider_class(name).Options.model_fields
           if provider_class(name).Options is not Provider.Options and field not in ProviderSettings.model_fields]
    assert "providers.vertex.project" in own and "providers.bedrock.batch_role_arn" in own
    assert [path for path in own if not rows.get(path)] == []


def _command_sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## `runner ?([a-z-]*)`$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_command_and_option_is_in_the_cli_reference():
    sections = _command_sections((REFERENCE / "cli.md").read_text(encoding="utf-8"))
    root = typer.main.get_command(app)
    commands = {"": root, **{name: command for name, command in root.commands.items() if not command.hidden}}
    assert {"submit", "resume", "report", "view", "sim"} <= set(commands)
    assert set(sections) == set(commands)
    for name, command in commands.items():
        section = sections[name]
        for param in command.params:
            if param.param_type_name == "argument":
                assert re.search(rf"^\| `\[?{param.name.upper()}(\.\.\.)?\]?` \|", section, re.M), (name, param.name)
            else:
                for option in [*param.opts, *param.secondary_opts]:
                    assert f"`{option}`" in section, f"runner {name} {option} is not in docs/reference/cli.md"
            assert " ".join((param.help or "").split()).replace("\\[", "[") in section


def test_every_provider_and_capability_rule_is_in_the_providers_reference():
    text = (REFERENCE / "providers.md").read_text(encoding="utf-8")
    for name in provider_names():
        assert f"| `{name}` | `{name}:MODEL` |" in text
    for rule in RULES:
        assert f"| {rule.provider} | {rule.family.replace('|', chr(92) + '|')} |" in text, rule.family


@pytest.mark.parametrize("name", ["job-file.md", "cli.md", "providers.md"])
def test_the_committed_reference_is_what_the_code_makes_now(name):
    made = _generator().GENERATED[name]()
    committed = (REFERENCE / name).read_text(encoding="utf-8")
    assert committed == made, f"docs/reference/{name} is stale: run python scripts/gen_reference.py"


def test_a_changed_field_makes_the_reference_stale(monkeypatch):
    """The staleness check sees a change to the schema: a new meaning for a field is a different page."""
    generator = _generator()
    monkeypatch.setattr(generator, "_meaning", lambda model, name: "changed" if name == "max_attempts" else "x")
    assert generator.job_file_reference() != (REFERENCE / "job-file.md").read_text(encoding="utf-8")

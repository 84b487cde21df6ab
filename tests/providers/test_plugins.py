"""A provider from another package (tests/data/plugin_provider, installed with pip into a folder) used from a job
by name, in a subprocess with that folder on PYTHONPATH; a broken plug-in; two packages claiming one name; and a
provider whose SDK extra is not installed (its modules hidden by a ``sys.meta_path`` finder)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runner.errors import ModelSetupError
from runner.providers.base import provider_class, provider_names
from tests.helpers import ROOT, one_error, runner_cmd, sim_stats, write_rows
from tests.providers.test_provider_registry import install_dist, on_path  # noqa: F401 - on_path is a fixture

PLUGIN = ROOT / "tests" / "data" / "plugin_provider"
BROKEN = ("provider 'broken' cannot be loaded from the runner-echo package's entry point broken = "
          "'runner_echo.broken:BrokenProvider': RuntimeError: the echo plug-in's broken module was imported")


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plug-in package installed by pip into a folder of its own (offline, with the setuptools already
    installed), built from a copy so that the build leaves nothing in tests/data."""
    root = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PLUGIN, root / "src")
    target = root / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(target), str(source)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return target


def environment(plugin_dir: Path | None, **extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env.pop("PYTHONPATH", None)
    if plugin_dir is not None:
        env["PYTHONPATH"] = str(plugin_dir)
    return env


def run(args: list[str], plugin_dir: Path | None, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(runner_cmd(*args), cwd=cwd, env=environment(plugin_dir, **extra), capture_output=True,
                          text=True, timeout=120)


def echo_job(tmp_path: Path, model: str = "echo:anything", rows: int = 4, prefix: str | None = "> ") -> Path:
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    job = {
        "name": "plugged",
        "models": [model],
        "providers": {"echo": {"prefix": prefix}} if prefix is not None and model.startswith("echo:") else {},
        "output_dir": str(tmp_path / "results"),
        "stages": [{"name": "say", "dataset": {"path": str(dataset)},
                    "prompt": {"user": "Repeat the last line.\n{{ question }}"}}],
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")  # JSON is YAML
    return path


def test_a_plug_in_provider_runs_a_job_by_name_and_a_rerun_is_all_cache_hits(tmp_path, plugin_dir):
    job, log, db = echo_job(tmp_path), tmp_path / "echo.log", str(tmp_path / "s.sqlite")
    first = run(["submit", str(job), "--db", db], plugin_dir, tmp_path, RUNNER_ECHO_LOG=str(log))
    assert first.returncode == 0, first.stderr
    results = sorted((tmp_path / "results").rglob("say*.jsonl"))
    assert results, list((tmp_path / "results").rglob("*"))
    answers = sorted(json.loads(line)["response"] for line in results[-1].read_text().splitlines())
    assert answers == sorted(f"> Question number {i}: which is right?" for i in range(4))
    assert len(log.read_text().splitlines()) == 4
    again = run(["submit", str(job), "--db", db], plugin_dir, tmp_path, RUNNER_ECHO_LOG=str(log))
    assert again.returncode == 0, again.stderr
    assert len(log.read_text().splitlines()) == 4  # nothing reached the provider the second time


def test_validate_knows_the_plug_in_only_where_it_is_installed(tmp_path, plugin_dir):
    known = run(["validate", str(echo_job(tmp_path))], plugin_dir, tmp_path)
    assert known.returncode == 0, known.stderr
    unknown = run(["validate", str(echo_job(tmp_path, prefix=None))], None, tmp_path)
    assert unknown.returncode == 2
    assert "unknown provider 'echo' in 'echo:anything'" in one_error(unknown.stderr)


def test_an_unknown_provider_lists_the_installed_ones_plug_ins_included(tmp_path, plugin_dir):
    done = run(["validate", str(echo_job(tmp_path, "nosuch:model"))], plugin_dir, tmp_path)
    assert done.returncode == 2
    error = one_error(done.stderr)
    installed = error.split("(installed: ", 1)[1].split(")", 1)[0].split(", ")
    assert {"echo", "broken", "not-a-provider", "openai", "sim", "groq"} <= set(installed)


@pytest.mark.parametrize(("model", "sentence"), [
    ("broken:x", BROKEN),
    ("not-a-provider:x", "provider 'not-a-provider' cannot be loaded from the runner-echo package's entry point "
                         "not-a-provider = 'runner_echo.echo:last_line': <function last_line at "),
])
def test_a_broken_plug_in_is_one_sentence_when_named(tmp_path, plugin_dir, model, sentence):
    job = echo_job(tmp_path, model)
    for command in (["validate", str(job)], ["submit", str(job), "--db", str(tmp_path / "s.sqlite")]):
        done = run(command, plugin_dir, tmp_path)
        assert done.returncode == 2, done.stderr
        assert sentence in one_error(done.stderr)
    assert not (tmp_path / "results").exists()


def test_two_packages_claiming_one_name_are_named_both(on_path, plugin_dir, monkeypatch):  # noqa: F811
    monkeypatch.syspath_prepend(str(plugin_dir))
    install_dist(on_path, "echo-rival", {"echo": "rival_echo:EchoProvider"}, {"rival_echo": ""})
    assert "echo" in provider_names()
    with pytest.raises(ModelSetupError) as claimed:
        provider_class("echo")
    message = str(claimed.value)
    assert message.startswith("provider 'echo' is claimed twice, by the ")
    assert "the runner-echo package's entry point echo = 'runner_echo.echo:EchoProvider'" in message
    assert "the echo-rival package's entry point echo = 'rival_echo:EchoProvider'" in message
    assert message.endswith(": uninstall one of them")
    assert provider_class("sim").name == "sim"  # the others are untouched


#: a ``sys.meta_path`` finder that says the named top-level packages are not installed, then runs the CLI
HIDING = """
import sys

class Hidden:
    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Hidden(sys.argv[1].split(",")))
from runner.cli import main
sys.argv = ["runner", *sys.argv[2:]]
main()
"""


def hidden_run(hide: str, args: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", HIDING, hide, *args], cwd=cwd, env=environment(None, **extra),
                          capture_output=True, text=True, timeout=600)  # the embedded model on a loaded machine


def test_a_provider_whose_extra_is_missing_stops_before_anything_is_sent(tmp_path, sim_server):
    dataset = write_rows(tmp_path / "rows.jsonl", 3)
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({
        "name": "claude", "models": ["anthropic:claude-haiku-4-5"], "output_dir": str(tmp_path / "results"),
        "providers": {"anthropic": {"base_url": sim_server.removesuffix("/v1")}},
        "stages": [{"name": "ask", "dataset": {"path": str(dataset)}, "prompt": {"user": "{{ question }}"}}],
    }), encoding="utf-8")
    done = hidden_run("anthropic", ["submit", str(job), "--db", str(tmp_path / "s.sqlite")], tmp_path,
                      ANTHROPIC_API_KEY="test-key")
    assert done.returncode != 0
    error = one_error(done.stderr)
    assert "pip install 'llm-job-runner[anthropic]'" in error and "no request was sent" in error
    assert sim_stats(sim_server)["received"] == 0
    # the same job with the SDK there is sent (the finder hid it, nothing else)
    done = hidden_run("nothing", ["submit", str(job), "--db", str(tmp_path / "s.sqlite")], tmp_path,
                      ANTHROPIC_API_KEY="test-key")
    assert done.returncode == 0, done.stderr
    assert sim_stats(sim_server)["received"] == 3


def test_the_quickstart_validates_with_no_extra(tmp_path):
    """The embedded model's job names no provider whose SDK is an extra."""
    done = hidden_run("anthropic,google,boto3,azure", ["validate", str(ROOT / "jobs" / "quickstart.yaml")], tmp_path)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow  # the embedded model on a busy machine: a minute or more
def test_the_quickstart_runs_with_no_extra(tmp_path):
    done = hidden_run("anthropic,google,boto3,azure", ["submit", str(ROOT / "jobs" / "quickstart.yaml"), "--limit",
                                                        "2", "--db", str(tmp_path / "s.sqlite")], tmp_path)
    assert done.returncode == 0, done.stderr

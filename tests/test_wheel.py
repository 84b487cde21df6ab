"""The bundled jobs, prompts and data: found from any folder, local files first, and shipped in the wheel.

The last test builds the wheel from a copy of the sources, installs it into a fresh virtual environment (with
the system's site-packages, so nothing is downloaded) and runs ``runner`` from an empty folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from runner.bundled import ROOT as BUNDLED
from runner.bundled import bundled_file, locate_job
from runner.spec.job import job_from_dict, load_job
from tests.helpers import ROOT, run_cli, write_rows

COMA = "data/newterm/benchmark_2023/COMA_clean.jsonl"


def _coma_job(name: str = "bundled", *, base_url: str = "http://127.0.0.1:9/v1", limit: int = 3) -> dict:
    """A job that names the bundled COMA data and prompt template by their relative paths, as jobs/ does."""
    return {
        "name": name,
        "models": ["sim:gpt-wheel"],
        "params": {"temperature": 0, "max_tokens": 5},
        "providers": {"sim": {"base_url": base_url, "timeout": 5}},
        "stages": [{
            "name": "coma",
            "dataset": {"path": COMA, "limit": limit},
            "prompt": "newterm/coma-exercise",
            "choices": {"field": "choices", "gold": "gold", "seeds": [0, 1], "shuffle": True},
            "parse": "letter",
        }],
    }


def test_the_repository_folders_are_links_to_the_bundled_ones() -> None:
    for name in ("jobs", "prompts", "data"):
        link = ROOT / name
        assert link.is_symlink() and not Path(os.readlink(link)).is_absolute(), name
        assert link.resolve() == BUNDLED / name
    assert (ROOT / "jobs" / "quickstart.yaml").is_file() and (ROOT / COMA).is_file()


def test_a_job_in_an_empty_folder_finds_the_bundled_data_and_prompts(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    job = job_from_dict(_coma_job())
    assert Path(job.stages[0].dataset.path) == BUNDLED / COMA
    path = tmp_path / "job.json"  # a job file elsewhere (YAML is a superset of JSON)
    path.write_text(json.dumps(_coma_job()), encoding="utf-8")
    assert Path(load_job(path).stages[0].dataset.path) == BUNDLED / COMA
    assert bundled_file("../pyproject.toml") is None and bundled_file(BUNDLED / COMA) is None


def test_local_files_win_over_the_bundled_ones(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / COMA).parent.mkdir(parents=True)
    local = write_rows(tmp_path / COMA, 3)
    template = tmp_path / "prompts" / "newterm" / "coma-exercise.yaml"
    template.parent.mkdir(parents=True)
    template.write_text("user: 'Local template: {{ question }}\n{{ options_block }}'\n", encoding="utf-8")
    job = job_from_dict(_coma_job())
    assert Path(job.stages[0].dataset.path) == local.resolve()

    from runner.plan.stage import StagePlan

    request = StagePlan(job, job.stages[0]).first_request()
    assert request.messages[-1]["content"].startswith("Local template: Question number 0")


def test_the_cli_uses_a_bundled_job_and_says_so(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, "validate", "jobs/quickstart.yaml")
    assert code == 0, err
    assert "using the bundled jobs/quickstart.yaml" in err
    assert "jobs/quickstart.yaml: valid job 'quickstart'" in out
    assert locate_job("quickstart.yaml") == (BUNDLED / "jobs" / "quickstart.yaml", True)

    local = tmp_path / "jobs" / "quickstart.yaml"  # a file of that name here wins
    local.parent.mkdir()
    local.write_text(json.dumps(_coma_job("mine")), encoding="utf-8")
    code, out, err = run_cli(monkeypatch, capsys, "validate", "jobs/quickstart.yaml")
    assert code == 0 and "valid job 'mine'" in out and "bundled" not in err

    code, out, err = run_cli(monkeypatch, capsys, "validate", "jobs/no-such-job.yaml")
    assert code == 2 and "jobs/no-such-job.yaml: no such job file" in err


def _can_build_wheels() -> bool:
    """setuptools builds wheels itself from 70.1; before that it needs the ``wheel`` package."""
    import setuptools

    major, minor = (int(part) for part in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def _sources(target: Path) -> Path:
    """A copy of what the wheel is built from, so the build leaves nothing (build/, egg-info) in the tree."""
    target.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, target / name)
    for package in ("runner", "simserver"):
        shutil.copytree(ROOT / package, target / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    return target


@pytest.mark.slow  # a wheel built and installed in a new virtualenv: 5.5 s
@pytest.mark.skipif(not _can_build_wheels(), reason="building the wheel offline needs `pip install wheel` "
                                                    "(or setuptools>=70.1)")
def test_the_wheel_ships_the_bundled_files_and_runs_from_an_empty_folder(tmp_path, sim_server) -> None:
    src = _sources(tmp_path / "src")
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(dist), str(src)], check=True, capture_output=True, text=True)
    (wheel,) = dist.glob("llm_job_runner-*.whl")

    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {path.relative_to(ROOT).as_posix() for path in (ROOT / "runner" / "bundled").rglob("*")
               if path.is_file() and "__pycache__" not in path.parts}
    assert shipped - names == set()
    for expected in ("runner/bundled/jobs/quickstart.yaml", "runner/bundled/prompts/newterm/coma-exercise.yaml",
                     f"runner/bundled/{COMA}", "runner/bundled/data/knowno/SOURCES.md",
                     "runner/bundled/data/winodict/original_words.tsv", "runner/providers/data/tiktoken/" +
                     next((ROOT / "runner/providers/data/tiktoken").iterdir()).name):
        assert expected in names, expected
    assert sum(1 for name in names if name.startswith("runner/bundled/prompts/")) >= 20
    assert sum(1 for name in names if name.startswith("runner/bundled/jobs/")) >= 10
    # every bundled provider is an entry point, and the SDKs of the extras are not dependencies
    with zipfile.ZipFile(wheel) as archive:
        (info,) = {name.split("/")[0] for name in names if name.endswith(".dist-info/METADATA")}
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        metadata = archive.read(f"{info}/METADATA").decode()
    assert "[runner.providers]" in entry_points and "sim = runner.providers.openai_servers:SimProvider" in entry_points
    required = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    for sdk in ("anthropic", "google-genai", "boto3", "azure-identity"):
        assert all("extra ==" in line for line in required if line.split()[1].startswith(sdk)), sdk

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # The dependencies are this interpreter's. Run from a virtualenv, the new environment's "system" packages are
    # the base interpreter's, without them: a .pth file adds this environment's package folders after its own (their
    # .pth files are not read, so an editable install of the repository does not come along).
    own = env_dir / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (own / "outer-packages.pth").write_text("".join(f"{folder}\n" for folder in site.getsitepackages()))
    # this pip installs into the new environment (pip --python, 22.3+): no pip of its own to set up there
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "-q", str(wheel)], check=True, capture_output=True, text=True)
    runner_cmd = env_dir / "bin" / "runner"

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RUNNER_SIM_URL", "VIRTUAL_ENV")}
    env["RUNNER_DB"] = str(empty / "cache.sqlite")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=empty, env=env, capture_output=True, text=True, timeout=120)

    where = run(str(python), "-c", "import runner, runner.bundled; print(runner.__file__); "
                                   "print(runner.bundled.ROOT)")
    assert where.returncode == 0, where.stderr
    for line in where.stdout.splitlines():
        assert Path(line).is_relative_to(env_dir), where.stdout  # the installed package, not the repository

    done = run(str(runner_cmd), "validate", "jobs/quickstart.yaml")
    assert done.returncode == 0, done.stderr
    assert "using the bundled jobs/quickstart.yaml" in done.stderr
    assert "jobs/quickstart.yaml: valid job 'quickstart'" in done.stdout

    (empty / "sim.yaml").write_text(json.dumps(_coma_job("wheelsim", base_url=sim_server)), encoding="utf-8")
    done = run(str(runner_cmd), "submit", "sim.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    run_id = next(line.split()[1].rstrip(":") for line in done.stdout.splitlines() if line.endswith(": completed"))
    results = empty / "results" / "wheelsim" / run_id / "coma.jsonl"
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(lines) == 6 and {line["status"] for line in lines} == {"done"}
    assert sorted({line["id"] for line in lines}) == ["1", "2", "3"]  # the bundled COMA's first three items

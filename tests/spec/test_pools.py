"""Pooled endpoints in the job file (``pools:``, runner/spec/pools.py): a good pool loads; each bad one is refused at
validate time, before anything is sent, in one sentence at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.spec.job import load_job
from tests.spec.test_spec import BASE, error_of, write_job

POOLED = BASE.replace("""providers:
  sim:
    rpm: 100
""", """providers:
  sim:
    rpm: 100
  sim:b:
    base_url: http://127.0.0.1:1/v1
pools:
  sim:gpt-test:
    endpoints: ENDPOINTS
""")


def split_error(path: Path, message: str) -> tuple[int, str, str]:
    """``<file>:<line>: <key>: <text>`` -> (line, key, text); a pool's key holds a colon (``pools.sim:gpt-test``)."""
    assert message.startswith(f"{path}:"), message
    line, key, text = message[len(f"{path}:"):].split(": ", 2)
    return int(line), key, text


def pooled(tmp_path: Path, endpoints: str, extra: str = "") -> Path:
    return write_job(tmp_path, POOLED.replace("ENDPOINTS", endpoints) + extra)


def test_a_pool_of_a_provider_and_a_labelled_endpoint_loads(tmp_path: Path) -> None:
    job = load_job(pooled(tmp_path, "[sim, 'sim:b']"))
    members = job.pools["sim:gpt-test"].members()
    assert [m.endpoint for m in members] == ["sim", "sim:b"]
    assert not job.pools["sim:gpt-test"].same_model


@pytest.mark.parametrize(("endpoints", "line", "key", "said"), [
    ("[sim, 'simm:b']", 14, "pools.sim:gpt-test.endpoints[1]", "unknown provider 'simm' in 'simm:b'; did you mean"),
    ("[]", 14, "pools.sim:gpt-test.endpoints", "the list is empty: name the endpoints that serve 'sim:gpt-test'"),
    ("[sim, 'sim:b', sim]", 14, "pools.sim:gpt-test.endpoints[2]", "endpoint 'sim' is listed twice"),
    ("[sim, 'sim:c']", 14, "pools.sim:gpt-test.endpoints[1]", "endpoint 'sim:c' has no settings: add them"),
    ("[sim, {endpoint: 'sim:b', model: other}]", 13, "pools.sim:gpt-test",
     "the memo keys the answers of sim (gpt-test) and sim:b (other) apart"),
])
def test_a_bad_endpoint_list_is_refused_in_one_sentence_at_its_line(
        tmp_path: Path, endpoints: str, line: int, key: str, said: str) -> None:
    path = pooled(tmp_path, endpoints)
    found = split_error(path, error_of(path))
    assert found[:2] == (line, key)
    assert found[2].startswith(said), found[2]


def test_endpoints_keyed_apart_pool_once_the_job_says_they_serve_the_same_weights(tmp_path: Path) -> None:
    path = pooled(tmp_path, "[sim, {endpoint: 'sim:b', model: other}]\n    same_model: true")
    assert load_job(path).pools["sim:gpt-test"].same_model


def test_a_pool_of_a_model_no_stage_asks_and_a_labelled_provider_unknown_are_refused(tmp_path: Path) -> None:
    text = POOLED.replace("ENDPOINTS", "[sim]").replace("  sim:gpt-test:\n    endpoints", "  sim:other:\n    endpoints")
    path = write_job(tmp_path, text)
    assert split_error(path, error_of(path))[2] == "no stage asks 'sim:other': a pool serves a model of models:"
    text = POOLED.replace("ENDPOINTS", "[sim]").replace("  sim:b:\n", "  smi:b:\n")
    path = write_job(tmp_path, text)
    key, said = split_error(path, error_of(path))[1:]
    assert key == "providers.smi:b" and said.startswith("unknown provider 'smi' in 'smi:b'"), said

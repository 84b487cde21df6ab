"""DESIGN invariant 1: the cache key is the SHA-256 of the canonical JSON (sorted keys, no whitespace) of
provider, model id, messages, every output-changing parameter and the sample index; never an API key, never
dict order."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from runner.plan.request import cache_key, canonical_json, canonical_request, canonical_tail, canonical_text
from runner.plan.request import key_of as plan_key_of
from runner.plan.stage import StagePlan
from runner.spec.job import load_job

FAKE_SECRET = "sk-fake-0123456789abcdefSECRET"

MESSAGES = [
    {"role": "system", "content": "Answer with one letter."},
    {"role": "user", "content": "Which is a fruit?\nA. carrot\nB. apple"},
]
PARAMS: dict[str, Any] = {
    "temperature": 0.7,
    "max_tokens": 32,
    "top_p": 0.9,
    "stop": ["\n"],
    "seed": 7,
    "response_format": {"type": "json_object"},
    "logprobs": True,
}


def key_of(
    provider: str = "sim",
    model: str = "gpt-test",
    messages: list[dict[str, str]] | None = None,
    params: dict[str, Any] | None = None,
    sample: int = 0,
) -> str:
    return cache_key(canonical_request(provider, model, MESSAGES if messages is None else messages,
                                       PARAMS if params is None else params, sample))


def test_key_is_sha256_of_compact_sorted_json() -> None:
    canonical = canonical_request("sim", "gpt-test", MESSAGES, PARAMS)
    text = canonical_json(canonical)
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert cache_key(canonical) == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", cache_key(canonical))


def test_canonical_json_has_no_whitespace_outside_strings() -> None:
    messages = [{"role": "user", "content": "no-spaces-here"}]
    text = canonical_json(canonical_request("sim", "gpt-test", messages, PARAMS))
    assert not re.search(r"\s", text), text
    assert ": " not in text and ", " not in text


def test_dict_order_does_not_change_the_key() -> None:
    reordered_messages = [{"content": m["content"], "role": m["role"]} for m in MESSAGES]
    reordered_params = dict(reversed(list(PARAMS.items())))
    reordered_params["response_format"] = {"type": "json_object"}
    assert list(reordered_params) != list(PARAMS)
    assert [list(m) for m in reordered_messages] != [list(m) for m in MESSAGES]
    assert key_of(messages=reordered_messages, params=reordered_params) == key_of()
    assert canonical_json(canonical_request("sim", "gpt-test", reordered_messages, reordered_params)) == \
        canonical_json(canonical_request("sim", "gpt-test", MESSAGES, PARAMS))


def test_model_changes_the_key() -> None:
    assert key_of(model="gpt-test-2") != key_of()


def test_provider_changes_the_key() -> None:
    assert key_of(provider="local") != key_of()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("temperature", 0.8),
        ("max_tokens", 33),
        ("top_p", 0.95),
        ("stop", ["END"]),
        ("seed", 8),
        ("response_format", {"type": "text"}),
        ("logprobs", False),
    ],
)
def test_each_generation_parameter_changes_the_key(name: str, value: Any) -> None:
    assert PARAMS[name] != value
    assert key_of(params={**PARAMS, name: value}) != key_of()
    # and dropping it changes the key too
    assert key_of(params={k: v for k, v in PARAMS.items() if k != name}) != key_of()


@pytest.mark.parametrize(
    "messages",
    [
        [MESSAGES[0], {"role": "user", "content": "Which is a fruit?\nA. carrot\nB. pear"}],
        [MESSAGES[1]],
        [MESSAGES[1], MESSAGES[0]],
        [{"role": "developer", "content": MESSAGES[0]["content"]}, MESSAGES[1]],
        [*MESSAGES, {"role": "assistant", "content": "B"}],
    ],
    ids=["content", "dropped-system", "order", "role", "extra-turn"],
)
def test_messages_change_the_key(messages: list[dict[str, str]]) -> None:
    assert key_of(messages=messages) != key_of()


def test_sample_index_changes_the_key() -> None:
    keys = {key_of(sample=i) for i in range(4)}
    assert len(keys) == 4
    assert key_of(sample=0) == key_of()


@pytest.mark.parametrize("name", ["temperature", "top_p"])
def test_integer_and_float_spellings_share_a_key(name: str) -> None:
    value = 0 if name == "temperature" else 1
    assert key_of(params={**PARAMS, name: value}) == key_of(params={**PARAMS, name: float(value)})


def test_unset_parameters_do_not_change_the_key() -> None:
    unset = {name: None for name in ("top_p", "stop", "seed", "response_format", "logprobs")}
    assert key_of(params={"temperature": 0, "max_tokens": 8, **unset}) == \
        key_of(params={"temperature": 0, "max_tokens": 8})
    assert key_of(params={name: None for name in PARAMS}) == key_of(params={})


def test_no_api_key_in_canonical_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_SECRET)
    monkeypatch.setenv("RUNNER_SIM_KEY", FAKE_SECRET)
    text = canonical_json(canonical_request("sim", "gpt-test", MESSAGES, PARAMS, 2))
    assert FAKE_SECRET not in text
    assert set(json.loads(text)) == {"provider", "model", "messages", "params", "sample"}


# -- end to end: job file -> StagePlan -> keys ---------------------------------------------------------------

JOB = """\
name: key-job
models: [MODEL]
params:
  temperature: 0
  max_tokens: 8
providers:
  sim:
    api_key_env: RUNNER_SIM_KEY
stages:
  - name: mc
    dataset: {path: DATASET}
    prompt:
      system: "Answer with one letter."
      user: "{{ question }}\\n{{ options_block }}"
    choices: {seeds: [0, 1]}
    parse: letter
"""


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    rows = [{"question": f"q{i}", "choices": ["a", "b", "c", "d"], "gold": i % 4, "split": "cause"} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def plan_keys(tmp_path: Path, dataset: Path, model: str, name: str, extra: str = "") -> list[str]:
    path = tmp_path / name
    path.write_text(JOB.replace("MODEL", model).replace("DATASET", str(dataset)) + extra, encoding="utf-8")
    job = load_job(path)
    return [request.key for request in StagePlan(job, job.stages[0])]


def test_same_job_gives_same_keys(tmp_path: Path, dataset: Path) -> None:
    first = plan_keys(tmp_path, dataset, "sim:gpt-test", "a.yaml")
    second = plan_keys(tmp_path, dataset, "sim:gpt-test", "b.yaml")
    assert len(first) == 6  # 3 rows x 2 seeds
    assert len(set(first)) == 6
    assert first == second


def test_job_differing_in_model_gives_different_keys(tmp_path: Path, dataset: Path) -> None:
    one = plan_keys(tmp_path, dataset, "sim:gpt-test", "a.yaml")
    other = plan_keys(tmp_path, dataset, "sim:gpt-other", "b.yaml")
    assert not set(one) & set(other)


def test_job_params_change_every_key(tmp_path: Path, dataset: Path) -> None:
    base = plan_keys(tmp_path, dataset, "sim:gpt-test", "a.yaml")
    path = tmp_path / "b.yaml"
    text = JOB.replace("MODEL", "sim:gpt-test").replace("DATASET", str(dataset))
    path.write_text(text.replace("  max_tokens: 8\n", "  max_tokens: 9\n"), encoding="utf-8")
    job = load_job(path)
    assert not set(base) & {r.key for r in StagePlan(job, job.stages[0])}


def test_model_aliases_share_keys(tmp_path: Path, dataset: Path) -> None:
    short = plan_keys(tmp_path, dataset, "local:smollm2", "a.yaml")
    long = plan_keys(tmp_path, dataset, "local:smollm2-135m-instruct", "b.yaml")
    assert short == long
    assert not set(short) & set(plan_keys(tmp_path, dataset, "sim:smollm2", "c.yaml"))


def test_plan_keys_hold_no_api_key(tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_SECRET)
    monkeypatch.setenv("RUNNER_SIM_KEY", FAKE_SECRET)
    with_secret = plan_keys(tmp_path, dataset, "sim:gpt-test", "a.yaml")
    path = tmp_path / "a.yaml"
    job = load_job(path)
    for request in StagePlan(job, job.stages[0]):
        assert FAKE_SECRET not in request.call.canonical
        assert request.key == plan_key_of(request.call.canonical)
        # The plan writes the canonical JSON directly; it must be exactly the canonical form of the request.
        body = canonical_request("sim", request.call.model_id, request.messages, request.call.params)
        assert request.call.canonical == canonical_json(body) and request.key == cache_key(body)
    monkeypatch.setenv("RUNNER_SIM_KEY", "another-fake-key")
    monkeypatch.delenv("OPENAI_API_KEY")
    assert plan_keys(tmp_path, dataset, "sim:gpt-test", "b.yaml") == with_secret


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "plain"}],
    [{"role": "system", "content": 'quotes " and \\ backslash'}, {"role": "user", "content": "line\nbreak\ttab"}],
    [{"role": "user", "content": "unicode: naïve — 新しい 🙂 \u2028 \x00"}],
    [{"content": "key order reversed", "role": "user"}],
    [{"role": "user", "content": "extra keys", "name": "bob"}],
])
@pytest.mark.parametrize("sample", [0, 3])
def test_directly_written_canonical_text_equals_the_canonical_json(messages: list, sample: int) -> None:
    params = {"temperature": 0, "max_tokens": 5, "top_p": None, "stop": ["\n", "é"], "seed": 7}
    body = canonical_request("sim", "gpt-ü", messages, params, sample)
    text = canonical_text(messages, canonical_tail("sim", "gpt-ü", params, sample))
    assert text == canonical_json(body)
    assert plan_key_of(text) == cache_key(body)

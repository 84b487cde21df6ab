"""The providers' Batch API clients (``provider.batches()``: OpenAIBatches, AnthropicBatches, GeminiBatches)
through the real openai, anthropic and google-genai SDKs against the simulated server on 127.0.0.1: answers
equal the online ``execute`` answers, custom ids map back, per-line errors, expiry, a bad line, cancel, a new
provider instance reading a batch by id, and error translation."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from runner.errors import AuthError, BadRequest, RateLimited, TransientError
from runner.providers import anthropic_batch, gemini_batch, openai_batch
from runner.providers.anthropic_messages import AnthropicProvider
from runner.providers.base import Provider, ProviderSettings
from runner.providers.batching import CLOCK_SKEW, ENDED, RUNNING, Batches, BatchLine, BatchStatus, Lookup, batch_label
from runner.providers.gemini import GeminiProvider
from runner.providers.local import LocalProvider
from runner.providers.openai_chat import OpenAIChatProvider
from runner.providers.openai_servers import OpenAICompatibleProvider, SimProvider
from simserver import SimServer
from tests.helpers import fresh

pytestmark = pytest.mark.asyncio(loop_scope="module")

CLASSES: dict[str, type[Provider]] = {"openai": OpenAIChatProvider, "sim": SimProvider,
                                      "anthropic": AnthropicProvider, "gemini": GeminiProvider}
PROVIDERS = list(CLASSES)
KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY",
        "sim": "RUNNER_SIM_KEY"}
#: each provider's words for a batch still running, after its creation answer
RUNNING_STATES = {"openai": {"in_progress", "finalizing"}, "sim": {"in_progress", "finalizing"},
                  "anthropic": {"in_progress"}, "gemini": {"JOB_STATE_RUNNING"}}
MC = "Which is a fruit?\nA. carrot\nB. apple\nC. potato\nAnswer:"


@pytest.fixture
def srv(shared_srv: SimServer, monkeypatch: pytest.MonkeyPatch) -> SimServer:
    """The module's server with the default config, the real clock and no batches; every key exported."""
    fresh(shared_srv)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    for variable in KEYS.values():
        monkeypatch.setenv(variable, "secret-key-" + variable.lower())
    return shared_srv


@asynccontextmanager
async def opened(kind: str, srv: SimServer, base_url: str | None = None) -> AsyncIterator[Provider]:
    url = base_url or (srv.url if kind in ("openai", "sim") else srv.root_url)
    provider = CLASSES[kind](ProviderSettings(base_url=url, timeout=5))
    await provider.start()
    try:
        yield provider
    finally:
        await provider.aclose()


def make_lines(n: int, prefix: str = "row") -> list[BatchLine]:
    variants: list[tuple[list[dict[str, str]], dict[str, Any]]] = [
        ([{"role": "user", "content": MC}], {"temperature": 0, "max_tokens": 5}),
        ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}],
         {"temperature": 0.7, "top_p": 0.9, "max_tokens": 9, "seed": 3}),
        ([{"role": "user", "content": "Tell me more."}], {"stop": ["e"], "max_tokens": 20}),
        ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
          {"role": "user", "content": "And?"}], {}),
    ]
    return [BatchLine(f"{prefix}-{i}", *(variants[i] if i < len(variants) else
                                         ([{"role": "user", "content": f"question {i}"}], {"max_tokens": 6})))
            for i in range(n)]


def picked(salt: str, ids: list[str], fraction: float) -> set[str]:
    """The ids the simulated server's documented hash rule picks (sha256(salt NUL id) / 2**64 < fraction)."""
    return {i for i in ids
            if int.from_bytes(hashlib.sha256(f"{salt}\0{i}".encode()).digest()[:8], "big") / 2**64 < fraction}


async def ended(batches: Batches, batch_id: str, seconds: float = 5.0) -> BatchStatus:
    deadline = time.monotonic() + seconds
    while True:
        status = await batches.status(batch_id)
        if status.state == ENDED or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.05)


def sim_batch(srv: SimServer, batch_id: str) -> Any:
    return srv.batches.batches[batch_id.removeprefix("batches/")]


def without_ids(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in ("id", "created", "response_id", "responseId",
                                                    "automatic_function_calling_history")}


# -- answers --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_batch_answers_equal_the_online_answers(srv: SimServer, kind: str) -> None:
    srv.configure(batch_delay=1.0)  # long enough that the first look finds it running (gemini's submit took 0.4 s)
    lines = make_lines(5)
    async with opened(kind, srv) as provider:
        assert provider.supports_batch
        batches = provider.batches()
        batch_id = await batches.submit("sim-model", lines, label="run-1/stage-a")
        first = await batches.status(batch_id)
        assert first.state == RUNNING and first.provider_state in RUNNING_STATES[kind]
        status = await ended(batches, batch_id)
        assert status.state == ENDED and (status.total, status.succeeded, status.failed) == (5, 5, 0)
        results = await batches.results(batch_id)
        assert [r.custom_id for r in results] == [line.custom_id for line in lines]
        for line, result in zip(lines, results, strict=True):
            assert result.error is None and not result.retry and result.completion is not None
            online = await provider.execute("sim-model", line.messages, line.params)
            got = result.completion
            assert (got.text, got.finish_reason, got.input_tokens, got.output_tokens, got.cached_tokens) == (
                online.text, online.finish_reason, online.input_tokens, online.output_tokens, online.cached_tokens)
            assert got.text and got.input_tokens > 0 and got.output_tokens > 0
            assert without_ids(got.raw) == without_ids(online.raw)
            assert got.rate is None  # no headers come with a batch line
    # what the batch lines carried is what the online path sends
    body = sim_batch(srv, batch_id).lines[1].body
    if kind in ("openai", "sim"):
        cap = "max_completion_tokens" if kind == "openai" else "max_tokens"
        assert body == {"model": "sim-model", "messages": lines[1].messages, "temperature": 0.7, "top_p": 0.9,
                        "seed": 3, cap: 9}
    elif kind == "anthropic":
        assert body == {"model": "sim-model", "messages": [{"role": "user", "content": "Say something."}],
                        "system": "Be brief.", "max_tokens": 9, "temperature": 0.7, "top_p": 0.9}
    else:
        assert body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
        assert body["generationConfig"] == {"temperature": 0.7, "topP": 0.9, "maxOutputTokens": 9, "seed": 3,
                                            "candidateCount": 1}
    assert srv.stats()["batch_results"]["succeeded"] == 5


# -- lines that failed ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_line_errors_and_expired_lines_come_back_to_retry(srv: SimServer, kind: str) -> None:
    lines = make_lines(12)
    ids = [line.custom_id for line in lines]
    # the server picks by the custom id it was sent (Anthropic's carries the label's hash before the engine's id)
    sent = {anthropic_batch.wire_id("run/stage", i) if kind == "anthropic" else i: i for i in ids}
    expired = {sent[i] for i in picked("expire", list(sent), 0.25)}
    errored = {sent[i] for i in picked("error", list(sent), 0.35)} - expired
    assert expired and errored and len(expired | errored) < len(ids)
    srv.configure(batch_expire=0.25, batch_line_errors=0.35)
    async with opened(kind, srv) as provider:
        batches = provider.batches()
        batch_id = await batches.submit("sim-model", lines, label="run/stage")
        status = await ended(batches, batch_id)
        assert status.state == ENDED and status.provider_state in ("expired", "ended", "JOB_STATE_EXPIRED")
        assert status.succeeded == len(ids) - len(expired | errored)
        results = {r.custom_id: r for r in await batches.results(batch_id)}
    assert set(results) == set(ids)
    for cid, result in results.items():
        if cid in expired:
            assert isinstance(result.error, TransientError) and result.error.error_class == "batch_expired"
            assert result.retry and result.completion is None
        elif cid in errored:
            assert isinstance(result.error, TransientError) and result.error.status == 500 and result.retry
            assert result.error.error_class == "server_error"
        else:
            assert result.error is None and result.completion and result.completion.text and not result.retry


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_batch_expired_by_the_server_comes_back_to_retry(srv: SimServer, kind: str) -> None:
    srv.configure(batch_delay=60)
    async with opened(kind, srv) as provider:
        batches = provider.batches()
        batch_id = await batches.submit("sim-model", make_lines(3), label="run/stage")
        assert (await batches.status(batch_id)).state == RUNNING
        with pytest.raises(BadRequest, match="has not ended"):
            await batches.results(batch_id)
        assert srv.expire_batch(batch_id.removeprefix("batches/"))
        assert (await batches.status(batch_id)).state == ENDED
        results = await batches.results(batch_id)
    assert [r.custom_id for r in results] == ["row-0", "row-1", "row-2"]
    assert all(r.retry and r.error and r.error.error_class == "batch_expired" for r in results)


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_bad_line_fails_alone_without_retry(srv: SimServer, kind: str) -> None:
    lines = make_lines(3)
    if kind == "anthropic":  # a system prompt and no conversation: the Messages API wants a message
        lines[1] = BatchLine("bad", [{"role": "system", "content": "Only this."}], {})
    else:  # an output cap of 0: the simulated server wants at least 1
        lines[1] = BatchLine("bad", [{"role": "user", "content": "hello"}], {"max_tokens": 0})
    async with opened(kind, srv) as provider:
        batches = provider.batches()
        batch_id = await batches.submit("sim-model", lines, label="run/stage")
        status = await ended(batches, batch_id)
        results = {r.custom_id: r for r in await batches.results(batch_id)}
    assert status.provider_state in ("completed", "ended", "JOB_STATE_SUCCEEDED")
    bad = results["bad"]
    assert isinstance(bad.error, BadRequest) and bad.error.status == 400 and not bad.retry
    assert bad.error.error_class == "bad_request" and bad.completion is None
    assert all(results[cid].completion for cid in ("row-0", "row-2"))


@pytest.mark.parametrize("kind", ["openai", "sim"])
async def test_an_openai_batch_whose_input_file_failed_fails_the_line_it_names(srv: SimServer, kind: str) -> None:
    async with opened(kind, srv) as provider:
        good = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}
        wrong_url = {**good, "custom_id": "b", "url": "/v1/embeddings"}
        data = f"{json.dumps(good)}\n{json.dumps(wrong_url)}\n".encode()
        client: Any = provider.client  # type: ignore[attr-defined]
        upload = await client.files.create(file=("in.jsonl", data), purpose="batch")
        batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                            completion_window="24h")
        batches = provider.batches()
        status = await batches.status(batch.id)
        assert (status.state, status.provider_state) == (ENDED, "failed")
        results = await batches.results(batch.id)
    assert [r.custom_id for r in results] == ["a", "b"]
    good, bad = results
    assert isinstance(bad.error, BadRequest) and not bad.retry and "mismatched_url (param url)" in str(bad.error)
    assert good.retry and good.error is not None and good.error.error_class == "batch_refused"


# -- cancel, a new process ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_cancel_keeps_what_was_done_and_retries_the_rest(srv: SimServer, kind: str,
                                                               now: list[float]) -> None:
    srv.configure(batch_delay=8)
    async with opened(kind, srv) as provider:
        batches = provider.batches()
        batch_id = await batches.submit("sim-model", make_lines(4), label="run/stage")
        now[0] += 4  # lines are done at 2, 4, 6 and 8 seconds
        await batches.cancel(batch_id)
        status = await batches.status(batch_id)
        assert status.state == ENDED and status.provider_state in ("cancelled", "ended", "JOB_STATE_CANCELLED")
        await batches.cancel(batch_id)  # an ended batch: nothing to stop, no error
        results = await batches.results(batch_id)
    assert [r.custom_id for r in results] == ["row-0", "row-1", "row-2", "row-3"]
    assert [bool(r.completion) for r in results] == [True, True, False, False]
    for result in results[2:]:
        assert result.retry and result.error and result.error.error_class == "batch_cancelled"


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_new_provider_instance_reads_a_batch_by_id(srv: SimServer, kind: str) -> None:
    srv.configure(batch_delay=0.2)
    lines = make_lines(3, prefix="resume")
    async with opened(kind, srv) as first:
        batch_id = await first.batches().submit("sim-model", lines, label="run/stage")
        expected = [await first.execute("sim-model", line.messages, line.params) for line in lines]
    async with opened(kind, srv) as second:  # a later process: nothing but the id survives
        batches = second.batches()
        assert (await ended(batches, batch_id)).state == ENDED
        results = await batches.results(batch_id)
    assert [r.custom_id for r in results] == [line.custom_id for line in lines]
    assert [r.completion.text for r in results if r.completion] == [c.text for c in expected]


# -- errors, labels, providers without a Batch API --------------------------------------------------------------


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_sdk_errors_are_translated_and_name_no_key(srv: SimServer, kind: str) -> None:
    async with opened(kind, srv) as provider:
        batches = provider.batches()
        with pytest.raises(BadRequest) as missing:
            await batches.status("batches/nope" if kind == "gemini" else "nope")
        assert missing.value.status == 404 and isinstance(missing.value.__cause__, Exception)
        with pytest.raises(BadRequest, match="twice"):
            await batches.submit("sim-model", make_lines(1) * 2, label="run/stage")
        srv.configure(api_key="the-only-key")
        with pytest.raises(AuthError) as refused:
            await batches.submit("sim-model", make_lines(1), label="run/stage")
        assert KEYS[kind] in str(refused.value) and "secret-key" not in str(refused.value)
        assert refused.value.__cause__ is not None
    async with opened(kind, srv, base_url="http://127.0.0.1:9/v1") as unreachable:
        with pytest.raises(TransientError):
            await unreachable.batches().submit("sim-model", make_lines(1), label="run/stage")


async def test_a_rate_limited_line_is_retried_as_online(srv: SimServer) -> None:
    async with opened("sim", srv) as provider:
        batches: Any = provider.batches()
        line = {"custom_id": "x", "response": {"status_code": 429, "body": {"error": {"code": "rate_limit_exceeded",
                                                                                        "message": "slow down"}}}}
        result = batches._line(line)
        assert isinstance(result.error, RateLimited) and result.retry
        quota = {"custom_id": "y", "response": {"status_code": 429, "body": {"error": {"code": "insufficient_quota"}}}}
        assert type(batches._line(quota).error).__name__ == "QuotaExceeded" and not batches._line(quota).retry


async def test_labels_never_carry_the_key(srv: SimServer) -> None:
    async with opened("openai", srv) as openai_provider, opened("gemini", srv) as gemini_provider:
        openai_key, gemini_key = openai_provider.api_key(), gemini_provider.api_key()
        oa_id = await openai_provider.batches().submit("m", make_lines(1), label=f"run/{openai_key}/x")
        ge_id = await gemini_provider.batches().submit("m", make_lines(1), label=f"run/{gemini_key}/x")
    assert sim_batch(srv, oa_id).info["metadata"] == {"runner": "run/***/x"}
    assert sim_batch(srv, ge_id).info["displayName"] == "run/***/x"


# -- finding a batch the store never recorded (by its label, or Anthropic's custom ids) ---------------------------


PAGED = {"openai": openai_batch, "sim": openai_batch, "anthropic": anthropic_batch, "gemini": gemini_batch}


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_find_names_the_batch_of_a_label_and_its_lines_across_pages(srv: SimServer, kind: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Five batches, two to a list page: each is found by its label (and lines), the oldest three pages back;
    one the store knows, one never submitted and one from before the intent are not found."""
    srv.configure(batch_delay=0.0)
    monkeypatch.setattr(PAGED[kind], "PAGE", 2)
    since = time.time()
    submitted: list[tuple[str, str, list[str]]] = []
    async with opened(kind, srv) as provider:
        batches = provider.batches()
        for i in range(5):
            lines = make_lines(3, prefix=f"b{i}")
            ids = [line.custom_id for line in lines]
            label = batch_label("20261124-101010-ab12", "stage" * 40, f"{kind}:sim-model", 0, ids)  # cut to fit
            submitted.append((await batches.submit("sim-model", lines, label=label), label, ids))
        for batch_id, label, ids in submitted:
            assert await batches.find(label, ids, since=since) == Lookup(batch_id)
        oldest, label, ids = submitted[0]
        assert await batches.find(label, ids, since=since, known={oldest}) == Lookup(None)
        never = [line.custom_id for line in make_lines(3, prefix="never")]
        assert await batches.find(batch_label("r", "s", "m", 0, never), never, since=since) == Lookup(None)
        assert await batches.find(label, ids, since=since + 2 * CLOCK_SKEW) == Lookup(None)


async def test_a_label_cut_to_the_providers_limit_keeps_its_digest(srv: SimServer) -> None:
    label = batch_label("run", "s" * 700, "sim:m", 2, ["a", "b"])
    async with opened("openai", srv) as openai_provider, opened("gemini", srv) as gemini_provider:
        oa_id = await openai_provider.batches().submit("m", make_lines(1), label=label)
        ge_id = await gemini_provider.batches().submit("m", make_lines(1), label=label)
    sent = [sim_batch(srv, oa_id).info["metadata"]["runner"], sim_batch(srv, ge_id).info["displayName"]]
    assert [len(one) for one in sent] == [512, 128]
    assert all(one.startswith("run/sss") and one.endswith(label[-34:]) for one in sent)


async def test_anthropic_finds_a_running_batch_once_its_custom_ids_can_be_read(srv: SimServer) -> None:
    """A Message Batch has no label: one of the right size made since the intent is undecided while it runs, and
    it is the batch once its results carry exactly the lines' custom ids."""
    srv.configure(batch_delay=60.0)
    since = time.time()
    async with opened("anthropic", srv) as provider:
        batches = provider.batches()
        ours = make_lines(3, prefix="ours")
        ids = [line.custom_id for line in ours]
        label = batch_label("run", "stage", "anthropic:m", 0, ids)
        other = await batches.submit("sim-model", make_lines(3, prefix="theirs"), label="another run")
        bigger = await batches.submit("sim-model", make_lines(4, prefix="ours"), label="another run")
        batch_id = await batches.submit("sim-model", ours, label=label)
        assert await batches.find(label, ids, since=since) == Lookup(None, undecided=2), "same size, running"
        assert srv.expire_batch(batch_id) and srv.expire_batch(other) and srv.expire_batch(bigger)
        assert await batches.find(label, ids, since=since) == Lookup(batch_id)
        assert await batches.find(label, ids[:2] + ["not-ours"], since=since) == Lookup(None)


async def test_anthropic_custom_ids_are_checked_before_sending(srv: SimServer) -> None:
    async with opened("anthropic", srv) as provider:
        for bad in ("run:1/a", "x" * 48):
            with pytest.raises(BadRequest, match="a request key or 1 to 47 letters"):
                await provider.batches().submit("m", [BatchLine(bad, [{"role": "user", "content": "x"}], {})],
                                                label="run/stage")
    assert "batches" not in srv.stats()


async def test_anthropic_finds_its_own_runs_batch_of_the_same_requests_not_another_runs(srv: SimServer) -> None:
    """Two runs sending the same requests send the same request keys: each line's custom id carries its batch's
    label too (a Message Batch has no other place for it), so each run adopts its own batch. The keys, 64 hex
    digits, are sent in 43 characters to leave room for the label's 17 within Anthropic's 64."""
    srv.configure(batch_delay=0.0)
    since = time.time()
    keys = [hashlib.sha256(f"request {i}".encode()).hexdigest() for i in range(3)]
    lines = [BatchLine(key, line.messages, line.params) for key, line in zip(keys, make_lines(3), strict=True)]
    labels = [batch_label(run, "stage", "anthropic:sim-model", 0, keys) for run in ("run-a", "run-b")]
    async with opened("anthropic", srv) as provider:
        batches = provider.batches()
        ours, theirs = [await batches.submit("sim-model", lines, label=label) for label in labels]
        for batch_id in (ours, theirs):
            await ended(batches, batch_id)
        assert await batches.find(labels[0], keys, since=since) == Lookup(ours)  # theirs is the newer one
        assert await batches.find(labels[1], keys, since=since) == Lookup(theirs)
        assert await batches.find(labels[0], keys, since=since, known={ours}) == Lookup(None)
        assert [r.custom_id for r in await batches.results(ours)] == keys
    sent = [line.custom_id for line in sim_batch(srv, ours).lines]
    assert [len(one) for one in sent] == [60] * 3 and all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", one) for one in sent)
    assert len({one[:16] for one in sent}) == 1 and not set(sent) & {
        line.custom_id for line in sim_batch(srv, theirs).lines}


async def test_anthropic_reads_the_custom_ids_of_a_batch_sent_before_they_carried_the_label() -> None:
    key = hashlib.sha256(b"x").hexdigest()
    assert anthropic_batch.engine_id(key) == key and anthropic_batch.engine_id("row-0") == "row-0"
    assert anthropic_batch.engine_id(anthropic_batch.wire_id("run/s", key)) == key
    assert anthropic_batch.engine_id(anthropic_batch.wire_id("run/s", "row-0")) == "row-0"


async def test_providers_without_a_batch_api_say_to_use_online_mode() -> None:
    assert all(cls.supports_batch for cls in CLASSES.values())
    assert not OpenAICompatibleProvider.supports_batch and not LocalProvider.supports_batch
    compatible = OpenAICompatibleProvider(ProviderSettings(),
                                          endpoints={"my-vllm": ProviderSettings(base_url="http://127.0.0.1:9/v1")})
    for provider in (compatible, compatible._client("my-vllm/llama")):
        with pytest.raises(BadRequest, match=r"openai-compatible has no Batch API.*use mode: online"):
            provider.batches()


# -- what a failed line says ---------------------------------------------------------------------------------

#: per provider: a line the simulated server's online validation refuses, and the words its error must carry
BAD_LINES = {
    "openai": ({"stop": 5}, "400 invalid_request_error (param stop): Invalid 'stop': expected a string or a list "
                            "of strings."),
    "sim": ({"stop": 5}, "400 invalid_request_error (param stop): Invalid 'stop': expected a string or a list of "
                         "strings."),
    "anthropic": ({"stop": "x"}, "400 invalid_request_error: stop_sequences: Input should be a valid list of "
                                 "strings"),
    "gemini": ({"max_tokens": 0}, "400 INVALID_ARGUMENT (param generation_config.max_output_tokens): * "
                                  "GenerateContentRequest.generation_config.max_output_tokens: must be a positive "
                                  "integer"),
}


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_failed_lines_error_carries_the_providers_message_and_parameter(srv: SimServer, kind: str) -> None:
    params, said = BAD_LINES[kind]
    lines = [*make_lines(1), BatchLine("bad", [{"role": "user", "content": "hello"}], params)]
    async with opened(kind, srv) as provider:
        batches = provider.batches()
        batch_id = await batches.submit("sim-model", lines, label="run/stage")
        await ended(batches, batch_id)
        bad = {r.custom_id: r for r in await batches.results(batch_id)}["bad"]
    assert isinstance(bad.error, BadRequest) and bad.error.error_class == "bad_request" and not bad.retry
    assert str(bad.error) == f"{provider.where}: {said}"  # type: ignore[attr-defined]


async def test_the_documented_error_lines_keep_message_code_and_parameter(srv: SimServer) -> None:
    """Each provider's per-line error as its documentation shows it, read without the simulated server."""
    from types import SimpleNamespace

    from anthropic.types.messages import MessageBatchIndividualResponse

    async with opened("openai", srv) as openai_provider, opened("anthropic", srv) as claude, \
            opened("gemini", srv) as gemini_provider:
        # OpenAI's error file (as openai/openai-openapi#302 shows one): the error in the response body
        message = ("This model's maximum context length is 128000 tokens. However, you requested 1000024 tokens "
                   "(24 in the messages, 1000000 in the completion). Please reduce the length of the messages or "
                   "completion.")
        line = {"id": "batch_req_1", "custom_id": "request-5", "error": None, "response": {
            "status_code": 400, "request_id": "r", "body": {"error": {
                "message": message, "type": "invalid_request_error", "param": "messages",
                "code": "context_length_exceeded"}}}}
        error = openai_provider.batches()._line(line).error  # type: ignore[attr-defined]
        assert isinstance(error, BadRequest)
        assert str(error) == (f"{openai_provider.where}: 400 invalid_request_error context_length_exceeded "  # type: ignore[attr-defined]
                              f"(param messages): {message}")
        # a line OpenAI could not run, without a response
        line = {"id": "batch_req_2", "custom_id": "x", "response": None,
                "error": {"code": "some_new_code", "message": "Something new went wrong."}}
        error = openai_provider.batches()._line(line).error  # type: ignore[attr-defined]
        assert isinstance(error, TransientError) and str(error).endswith("some_new_code: Something new went wrong.")
        # Anthropic's errored result
        item = MessageBatchIndividualResponse.model_validate({"custom_id": "c", "result": {
            "type": "errored", "error": {"type": "error", "error": {
                "type": "invalid_request_error", "message": "max_tokens: Field required"}}}})
        result = claude.batches()._line(item)  # type: ignore[attr-defined]
        assert isinstance(result.error, BadRequest) and not result.retry
        assert str(result.error) == f"{claude.where}: 400 invalid_request_error: max_tokens: Field required"  # type: ignore[attr-defined]
        # a google.rpc.Status with a BadRequest field violation in its details
        status = SimpleNamespace(code=3, message="Invalid value at 'generation_config.temperature' (TYPE_FLOAT)",
                                 details=[{"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [
                                     {"field": "generation_config.temperature", "description": "Invalid value"}]}])
        error = gemini_provider.batches()._error(status)  # type: ignore[attr-defined]
        assert isinstance(error, BadRequest) and error.status == 400
        assert str(error) == (f"{gemini_provider.where}: 400 INVALID_ARGUMENT (param generation_config.temperature): "  # type: ignore[attr-defined]
                              "Invalid value at 'generation_config.temperature' (TYPE_FLOAT)")
        # an auth error keeps the runner's words only (a provider's 401 text may quote part of the key)
        line = {"custom_id": "k", "response": {"status_code": 401, "body": {"error": {
            "message": "Incorrect API key provided: sk-abc***xyz.", "type": "invalid_request_error"}}}}
        error = openai_provider.batches()._line(line).error  # type: ignore[attr-defined]
        assert isinstance(error, AuthError) and "sk-abc" not in str(error)


# -- an input file refused for some of its lines ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["openai", "sim"])
async def test_a_refused_input_file_fails_the_lines_it_names_and_returns_the_others(srv: SimServer,
                                                                                    kind: str) -> None:
    async with opened(kind, srv) as provider:
        batches: Any = provider.batches()
        lines = make_lines(3)
        data = batches.input_file("sim-model", lines).decode().splitlines()
        second = json.loads(data[1])
        second["body"]["model"] = "another-model"  # OpenAI: one model per input file
        data[1] = json.dumps(second)
        client: Any = provider.client  # type: ignore[attr-defined]
        upload = await client.files.create(file=("in.jsonl", "\n".join(data).encode()), purpose="batch")
        batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                            completion_window="24h")
        assert (await batches.status(batch.id)).provider_state == "failed"
        results = {r.custom_id: r for r in await batches.results(batch.id)}
    assert list(results) == ["row-0", "row-1", "row-2"]
    named = results["row-1"]
    assert isinstance(named.error, BadRequest) and not named.retry and named.error.error_class == "bad_request"
    assert str(named.error).startswith(f"{provider.where}: batch {batch.id} refused its input file at line 2: "  # type: ignore[attr-defined]
                                       "mismatched_model (param body.model): The model 'another-model' does not")
    for cid in ("row-0", "row-2"):
        assert results[cid].retry and results[cid].error is not None
        assert results[cid].error.error_class == "batch_refused"
        assert "for other lines (2)" in str(results[cid].error)


# -- Gemini: inline batches under 20 MB -----------------------------------------------------------------------------


async def test_gemini_lines_over_20_mb_are_cut_into_batches_under_it(srv: SimServer) -> None:
    from runner.providers import gemini_batch

    big = "y" * (5 * 1024 * 1024)  # five lines of 5 MB: 25 MB in one batch
    lines = [BatchLine(f"big-{i}", [{"role": "user", "content": f"{i} {big}"}], {"max_tokens": 3}) for i in range(5)]
    async with opened("gemini", srv) as provider:
        batches: Any = provider.batches()
        with pytest.raises(BadRequest, match=r"400 INVALID_ARGUMENT: Request payload size exceeds the limit: "
                                             r"20971520 bytes\."):
            await batches.submit("sim-model", lines, label="run/stage")  # all at once: refused
        parts = batches.chunks("sim-model", lines)
        assert len(parts) == 2 and [line for part in parts for line in part] == lines
        for part in parts:
            assert sum(gemini_batch.inline_size(r) for r in batches.requests("sim-model", part)) \
                <= gemini_batch.INLINE_BUDGET < gemini_batch.INLINE_LIMIT
            batch_id = await batches.submit("sim-model", part, label="run/stage")  # each one taken
            await ended(batches, batch_id)
            assert all(r.completion for r in await batches.results(batch_id))
        assert batches.chunks("sim-model", make_lines(3)) == [make_lines(3)]

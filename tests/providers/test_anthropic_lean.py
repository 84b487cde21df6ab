"""The anthropic provider over the lean wire (``runner/providers/lean_http.py``) against the SDK path it replaces
online: both run against the same server answering the same way and must give the same completion, or raise the
same error class with the same message, status, error class and wait. Where a proxy applies, the provider keeps
the SDK (the rule in ``runner/providers/anthropic_messages.py``'s docstring).

Servers: the simulated one, strict (it checks every Anthropic body against the SDK's own request types and the
capability table), with its faults (401, 429 with retry-after, 402 billing, 500, 529, a malformed body, a hang, a
refusal), in this process or its own; and a scripted aiohttp app answering any status, body and headers, which
also records what was sent. Nothing connects anywhere but 127.0.0.1 (:func:`_local_only`)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import pytest

from runner.errors import (
    AuthError,
    BadRequest,
    ModelSetupError,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientError,
)
from runner.providers.anthropic_messages import AnthropicProvider, proxied
from runner.providers.base import CacheMarks, Completion, ProviderSettings
from simserver import SimConfig, start_server
from tests.helpers import ROOT, isolated_aws, scripted_server, sim_stats, submit_lines, write_job, write_rows
from tests.providers.test_vertex import CLOUD_VARIABLES as VERTEX_VARIABLES
from tests.providers.test_vertex import credentials_file, private_key  # noqa: F401  (a fixture)

MODEL = "claude-haiku-4-5"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Which number is 2 plus one?"}]
PARAMS: dict[str, Any] = {"max_tokens": 5, "temperature": 0}
KEY = "sk-ant-test-key"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


class SDKClaude(AnthropicProvider):
    """The anthropic provider as it was before the lean wire: through the SDK."""

    lean_wire: ClassVar[bool] = False


@pytest.fixture(autouse=True)
def _local_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key exported, no proxy or other base URL from the user's environment, and no connection in this process
    to anywhere but 127.0.0.1."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    for variable in PROXY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
        monkeypatch.delenv(variable.upper(), raising=False)
    connect = socket.socket.connect

    def local_connect(sock: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else address
        assert host in ("127.0.0.1", "::1") or sock.family == socket.AF_UNIX, f"a test connected to {address}"
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_connect)


def both(url: str, timeout: float = 60.0) -> tuple[AnthropicProvider, AnthropicProvider]:
    settings = ProviderSettings(base_url=url, timeout=timeout)
    return AnthropicProvider(settings), SDKClaude(settings)


async def outcome(provider: AnthropicProvider, params: dict[str, Any] | None = None,
                  messages: list[dict[str, Any]] | None = None) -> Completion | ProviderError:
    """What one request gives: its completion, or the runner's error it raised."""
    await provider.start()
    try:
        return await provider.execute(MODEL, messages or MESSAGES, {**PARAMS, **(params or {})})
    except ProviderError as exc:
        return exc
    finally:
        await provider.aclose()


def described(error: Any) -> tuple[Any, ...]:
    assert isinstance(error, ProviderError), error
    return (type(error).__name__, str(error), error.status, error.error_class, getattr(error, "retry_after", None))


def without_ids(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in ("id", "content")}


# -- the simulated server -----------------------------------------------------------------------------------------

async def test_an_answer_is_the_same_completion_without_the_sdk() -> None:
    async with await start_server(SimConfig(rpm=6000, itpm=1_000_000)) as srv:
        lean, sdk = both(srv.root_url)
        got, expected = await outcome(lean), await outcome(sdk)
        assert lean.wire is None and lean._client is None  # closed, and the SDK's client never built
        stats = srv.stats()
    assert isinstance(got, Completion) and isinstance(expected, Completion)
    assert (got.text, got.input_tokens, got.output_tokens, got.finish_reason) == \
        (expected.text, expected.input_tokens, expected.output_tokens, expected.finish_reason)
    assert got.text and got.input_tokens > 0
    assert without_ids(got.raw) == without_ids(expected.raw)
    assert got.rate is not None and set(got.rate) == set(expected.rate or {}) == {"requests", "input_tokens"}
    assert got.rate["requests"].limit == 6000 and got.rate["input_tokens"].limit == 1_000_000
    assert stats["by_status"] == {"200": 2} and stats["by_route"]["anthropic"] == 2


@pytest.mark.parametrize(("model", "params"), [
    (MODEL, {"temperature": 0.5, "stop": ["\n\n"], "max_tokens": 7}),
    (MODEL, {"top_p": 0.9, "temperature": None}),
    (MODEL, {"reasoning": {"budget_tokens": 1024}, "max_tokens": 2048, "temperature": None}),
    ("claude-opus-4-6", {"reasoning": {"effort": "low"}, "max_tokens": 2048, "temperature": None}),
    (MODEL, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": {"type": "object", "properties": {"letter": {"type": "string"}},
                                     "required": ["letter"], "additionalProperties": False}}}}),
])
async def test_every_field_is_sent_as_the_strict_server_accepts_it(model: str, params: dict[str, Any]) -> None:
    """The strict server checks each body against the SDK's request types (``simserver/strict_anthropic.py``); a
    field the lean wire sent wrongly would be a 400 here."""
    async with await start_server() as srv:
        answers = []
        for provider in both(srv.root_url):
            await provider.start()
            try:
                answers.append(await provider.execute(model, MESSAGES, {**PARAMS, **params}))
            finally:
                await provider.aclose()
        assert srv.stats()["by_status"] == {"200": 2}
    got, expected = answers
    assert (got.text, got.thinking, got.output_tokens) == (expected.text, expected.thinking, expected.output_tokens)
    assert bool(got.thinking) == ("reasoning" in params)  # the thinking field went, and was read back


async def test_prompt_cache_breakpoints_are_sent_and_read_back_alike() -> None:
    system = "You answer questions about numbers. " * 1000  # past the model's smallest cacheable prefix
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Which number is 2 plus one?"}]
    async with await start_server() as srv:
        answers = []
        for provider in both(srv.root_url):
            marked, params = provider.mark_prompt_cache(MODEL, messages, PARAMS,
                                                        CacheMarks(cuts=((0, len(system)),), group="g"))
            answers.append(await outcome(provider, params, marked))
        assert srv.stats()["by_status"] == {"200": 2}
    got, expected = answers
    assert isinstance(got, Completion) and isinstance(expected, Completion)
    assert got.cache_write_tokens > 0 and expected.cached_tokens == got.cache_write_tokens  # the second read it
    assert got.input_tokens == expected.input_tokens


@pytest.mark.parametrize(("fault", "config", "kind", "said"), [
    ("401", {"fault_401": 1.0}, AuthError, "the key was refused (401); check the variable ANTHROPIC_API_KEY"),
    ("429", {"fault_429": 1.0, "retry_after": 0.7}, RateLimited, "rate limited (429)"),
    ("quota", {"fault_quota": 1.0}, QuotaExceeded,
     "the account's credit is exhausted (402); add credit or change the key"),
    ("500", {"fault_500": 1.0}, TransientError, "server error 500 api_error"),
    ("529", {"fault_503": 1.0}, TransientError, "server error 529 overloaded_error"),
    ("malformed", {"fault_malformed": 1.0}, TransientError, "the response was not valid JSON (JSONDecodeError)"),
    ("refusal", {"fault_refusal": 1.0}, ProviderError, "the model refused (stop_reason refusal)"),
])
async def test_a_simulated_fault_is_the_same_error_on_both_paths(fault: str, config: dict[str, Any],
                                                                 kind: type[ProviderError], said: str) -> None:
    async with await start_server(SimConfig(**config)) as srv:
        lean, sdk = both(srv.root_url)
        got, expected = await outcome(lean), await outcome(sdk)
    assert described(got) == described(expected)
    assert isinstance(got, kind) and str(got) == f"anthropic at {srv.root_url}: {said}"
    assert KEY not in str(got)
    if fault == "429":
        assert got.retry_after == pytest.approx(0.7)
    if fault in ("500", "529"):
        assert got.status == int(fault) and got.retryable


async def test_a_request_the_strict_server_refuses_is_the_same_bad_request() -> None:
    async with await start_server() as srv:
        lean, sdk = both(srv.root_url)
        got, expected = await outcome(lean, {"temperature": 1.5}), await outcome(sdk, {"temperature": 1.5})
    assert described(got) == described(expected)
    assert isinstance(got, BadRequest) and got.status == 400 and not got.retryable
    assert str(got) == (f"anthropic at {srv.root_url}: request rejected (400 invalid_request_error: temperature: "
                        "Input should be less than or equal to 1)")


async def test_a_timeout_is_the_same_transient_error() -> None:
    async with await start_server(SimConfig(fault_timeout=1.0, hang_seconds=3)) as srv:
        lean, sdk = both(srv.root_url, timeout=0.3)
        got, expected = await outcome(lean), await outcome(sdk)
    assert described(got) == described(expected)
    assert isinstance(got, TransientError) and got.error_class == "timeout"
    assert str(got) == f"anthropic at {srv.root_url}: timed out after 0.3 s"


async def test_a_server_that_is_not_there_is_a_connection_error_on_both_paths() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    lean, sdk = both(url)
    got, expected = await outcome(lean), await outcome(sdk)
    assert isinstance(got, TransientError) and isinstance(expected, TransientError)
    assert got.error_class == expected.error_class == "connection" and got.retryable
    # the reason is worded apart: the lean wire says aiohttp's sentence, the SDK path its exception's name
    assert str(got).startswith(f"anthropic at {url}: connection failed (Cannot connect to host ")
    assert str(expected).startswith(f"anthropic at {url}: connection failed (")


async def test_the_probe_knows_a_model_and_says_an_unknown_one_as_the_sdk_path_did() -> None:
    async with await start_server(SimConfig(models=MODEL)) as srv:
        said = []
        for provider in both(srv.root_url):
            await provider.start()
            try:
                await provider.probe(MODEL)
                with pytest.raises(ModelSetupError) as unknown:
                    await provider.probe("claude-nope/1")
                said.append(str(unknown.value))
            finally:
                await provider.aclose()
        assert srv.stats()["received"] == 0  # lookups are not model requests
    assert said[0] == said[1]
    assert said[0] == (f"anthropic:claude-nope/1 is not a model anthropic at {srv.root_url} knows (404 "
                       "not_found_error: model: claude-nope/1): check the model id")


# -- a scripted server: any status, any body ----------------------------------------------------------------------

@pytest.fixture
async def scripted() -> AsyncIterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """A server answering every request with ``answer["status"]``, ``["body"]`` (bytes) and ``["headers"]``; each
    request it got (method, path, headers, body) goes into the list (``tests/helpers.scripted_server``)."""
    async with scripted_server() as served:
        yield served


def error_json(kind: str, message: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_1"}).encode()


MESSAGE = json.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
                      "content": [{"type": "text", "text": "C"}], "stop_reason": "end_turn", "stop_sequence": None,
                      "usage": {"input_tokens": 12, "output_tokens": 1}}).encode()


async def test_the_lean_wire_sends_the_sdks_request(scripted: tuple[str, dict[str, Any], list[dict[str, Any]]]
                                                    ) -> None:
    url, answer, seen = scripted
    answer.update(status=200, body=MESSAGE)
    params = {"temperature": 0.2, "stop": ["\n"]}
    for provider in both(url):
        assert isinstance(await outcome(provider, params), Completion)
    lean, sdk = seen
    assert lean["method"] == sdk["method"] == "POST" and lean["path"] == sdk["path"] == "/v1/messages"
    assert json.loads(lean["body"]) == json.loads(sdk["body"]) == {
        "model": MODEL, "messages": [MESSAGES[1]], "system": "Be brief.", "max_tokens": 5, "stop_sequences": ["\n"],
        "temperature": 0.2}
    headers = {name.lower(): value for name, value in lean["headers"].items()}
    assert headers["x-api-key"] == KEY and headers["anthropic-version"] == "2023-06-01"
    assert headers["content-type"] == "application/json" and headers["accept"] == "application/json"
    assert "authorization" not in headers
    assert {name.lower(): value for name, value in sdk["headers"].items()}["anthropic-version"] == "2023-06-01"


async def test_the_probe_asks_the_models_endpoint(scripted: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps({"type": "model", "id": MODEL, "display_name": "Claude",
                                               "created_at": "2025-10-01T00:00:00Z"}).encode())
    provider = AnthropicProvider(ProviderSettings(base_url=url + "/prefix/"))
    await provider.start()
    try:
        await provider.probe("claude a/b")
    finally:
        await provider.aclose()
    [asked] = seen
    assert (asked["method"], asked["path"]) == ("GET", "/prefix/v1/models/claude%20a%2Fb")
    assert asked["headers"]["x-api-key"] == KEY and asked["body"] == b""


@pytest.mark.parametrize(("status", "body", "headers", "kind"), [
    (400, error_json("invalid_request_error", "max_tokens: Field required"), {}, BadRequest),
    (400, error_json("invalid_request_error", "Your credit balance is too low to access the Anthropic API."), {},
     QuotaExceeded),
    (401, error_json("authentication_error", "invalid x-api-key sk-ant-***"), {}, AuthError),
    (402, error_json("billing_error", "Payment required"), {}, QuotaExceeded),
    (403, error_json("permission_error", "not allowed"), {}, AuthError),
    (404, error_json("not_found_error", "model: claude-x"), {}, BadRequest),
    (408, error_json("timeout_error", "request timed out"), {}, TransientError),
    (409, error_json("conflict_error", "conflict"), {}, TransientError),
    (413, b"request entity too large", {}, BadRequest),
    (429, error_json("rate_limit_error", "slow down"), {"retry-after": "2"}, RateLimited),
    (429, error_json("rate_limit_error", "slow down"), {"retry-after-ms": "1500"}, RateLimited),
    (500, b"Internal Server Error", {}, TransientError),
    (502, b"<html>bad gateway</html>", {}, TransientError),
    (529, error_json("overloaded_error", "Overloaded"), {}, TransientError),
    (418, b"", {}, BadRequest),
])
async def test_each_status_is_the_same_error_on_both_paths(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], status: int, body: bytes,
        headers: dict[str, str], kind: type[ProviderError]) -> None:
    url, answer, _ = scripted
    answer.update(status=status, body=body, headers=headers)
    if not body.startswith(b"{"):
        answer["content_type"] = "text/plain"
    lean, sdk = both(url)
    got, expected = await outcome(lean), await outcome(sdk)
    assert described(got) == described(expected)
    assert type(got) is kind and "sk-ant" not in str(got)
    if status == 429:
        assert got.retry_after == pytest.approx(2.0 if "retry-after" in headers else 1.5)


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'"text"', b"", b'{"content": 3}', b'{"content": [3]}',
                                  b'{"content": [{"type": "text", "text": 5}]}',
                                  b'{"content": [], "usage": [1]}'])
async def test_a_malformed_success_body_is_the_same_error(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], body: bytes) -> None:
    url, answer, _ = scripted
    answer.update(status=200, body=body)
    lean, sdk = both(url)
    got, expected = await outcome(lean), await outcome(sdk)
    assert described(got) == described(expected)
    assert isinstance(got, TransientError) and got.error_class == "malformed_response"


async def test_a_404_probe_of_a_base_url_without_the_api_is_the_same_setup_error(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    url, answer, _ = scripted
    answer.update(status=404, body=b"Not Found", content_type="text/plain")
    said = []
    for provider in both(url):
        await provider.start()
        try:
            with pytest.raises(ModelSetupError) as failed:
                await provider.probe(MODEL)
            said.append(str(failed.value))
        finally:
            await provider.aclose()
    assert said[0] == said[1] == (f"anthropic:{MODEL} is not a model anthropic at {url} knows (404: no reason given): "
                                  "check the model id")


# -- batches and proxies: the SDK --------------------------------------------------------------------------------

async def test_the_batch_api_builds_the_sdk_client_on_first_use() -> None:
    async with await start_server() as srv:
        provider = AnthropicProvider(ProviderSettings(base_url=srv.root_url, timeout=5))
        await provider.start()
        try:
            assert provider.wire is not None and provider._client is None
            await provider.execute(MODEL, MESSAGES, PARAMS)
            assert provider._client is None
            from runner.providers.batching import BatchLine

            batches = provider.batches()
            batch_id = await batches.submit(MODEL, [BatchLine("a", MESSAGES, PARAMS)], label="run/stage")
            assert type(provider._client).__name__ == "AsyncAnthropic"
            assert (await batches.status(batch_id)).total == 1
        finally:
            await provider.aclose()
        assert provider._client is None and provider.wire is None


@pytest.mark.parametrize(("variables", "base_url", "sdk"), [
    ({"HTTPS_PROXY": "http://127.0.0.1:9"}, None, True),  # api.anthropic.com through a proxy
    ({"https_proxy": "http://127.0.0.1:9"}, None, True),
    ({"HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "api.anthropic.com"}, None, False),
    ({"HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "*"}, None, False),
    ({"HTTP_PROXY": "http://127.0.0.1:9"}, None, False),  # a proxy for the other scheme
    ({"ALL_PROXY": "socks5://127.0.0.1:9"}, None, True),
    ({"HTTP_PROXY": "http://127.0.0.1:9"}, "http://127.0.0.1:8765", True),
    ({"HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "localhost,127.0.0.1"}, "http://127.0.0.1:8765", False),
    ({"HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "gateway.example"}, "http://gateway.example/anthropic", False),
    ({}, None, False),
])
async def test_where_a_proxy_applies_the_provider_keeps_the_sdk(monkeypatch: pytest.MonkeyPatch,
                                                                variables: dict[str, str], base_url: str | None,
                                                                sdk: bool) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert proxied(base_url or "https://api.anthropic.com") is sdk
    provider = AnthropicProvider(ProviderSettings(base_url=base_url))
    await provider.start()  # builds a client or a wire; sends nothing
    try:
        if sdk:
            assert provider.wire is None and type(provider._client).__name__ == "AsyncAnthropic"
        else:
            assert provider.wire is not None and provider._client is None
            assert provider.wire.host == urlsplit(base_url or "https://api.anthropic.com").hostname
    finally:
        await provider.aclose()


async def test_anthropic_base_url_from_the_environment_is_the_lean_wires_default_as_the_sdks(
        monkeypatch: pytest.MonkeyPatch, scripted: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    url, answer, seen = scripted
    answer.update(status=200, body=MESSAGE)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
    for provider in (AnthropicProvider(ProviderSettings()), SDKClaude(ProviderSettings())):
        assert isinstance(await outcome(provider), Completion)
    assert [asked["path"] for asked in seen] == ["/v1/messages", "/v1/messages"]


# -- a whole run in a process of its own --------------------------------------------------------------------------

def test_a_submit_of_a_job_of_every_lean_provider_never_imports_an_sdk(tmp_path: Path, sim_server: str,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      private_key: str) -> None:  # noqa: F811
    """``runner submit`` (the probes, then every request) of a job asking ``anthropic:``, ``openai:``,
    ``azure-openai:``, ``gemini:``, both of ``vertex:``'s families (its credentials a service-account key file
    whose token endpoint is the simulated server's) and both of ``bedrock:``'s (made-up AWS keys) of the simulated
    server, in a process of its own: it completes, and the process never imported the anthropic, openai or
    google-genai package (each costs seconds of CPU to import). (Nor botocore, with the AWS keys in the
    environment: test_sigv4.py.)"""
    for variable in ("OPENAI_BASE_URL", "OPENAI_CUSTOM_HEADERS", "GOOGLE_GEMINI_BASE_URL", *VERTEX_VARIABLES):
        monkeypatch.delenv(variable, raising=False)
    for variable in ("OPENAI_API_KEY", "AZURE_OPENAI_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.setenv(variable, "test-key")
    root = sim_server.removesuffix("/v1")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(credentials_file(tmp_path, root + "/token", private_key)))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no user's gcloud settings
    isolated_aws(monkeypatch, tmp_path, "AKIDSIMULATEDSUBMIT")
    dataset = write_rows(tmp_path / "rows.jsonl", 3)
    models = [f"anthropic:{MODEL}", "openai:gpt-4o-mini", "azure-openai:gpt-4o-mini", "gemini:gemini-2.0-flash",
              "vertex:gemini-2.0-flash", "vertex:claude-3-5-haiku@20241022", "bedrock:amazon.nova-pro-v1:0",
              "bedrock:us.anthropic.claude-3-5-haiku-20241022-v1:0"]
    job = write_job(tmp_path / "job.yaml", dataset, models=models,
                    extra=f"providers: {{anthropic: {{base_url: '{root}'}}, openai: {{base_url: '{sim_server}'}}, "
                          f"gemini: {{base_url: '{root}'}}, azure-openai: {{base_url: '{root}/openai', "
                          f"api_version: '2024-10-21'}}, vertex: {{base_url: '{root}', project: sim-project, "
                          f"location: us-east5}}, bedrock: {{base_url: '{root}'}}}}")
    code = ("import sys\n" + submit_lines(job, tmp_path / "s.sqlite") +
            "sdk = sorted(name for name in sys.modules if name.split('.')[0] in ('anthropic', 'openai')\n"
            "             or name.startswith('google.genai'))\n"
            "print('RESULT', exit_code, ','.join(sdk) or '-', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert result == ["RESULT 0 -"], done.stdout + done.stderr
    assert "completed" in done.stdout
    stats = sim_stats(sim_server)
    routes = ("anthropic", "openai", "azure-openai", "gemini", "vertex-gemini", "vertex-anthropic", "bedrock-converse",
              "bedrock-invoke")
    assert {route: stats["by_route"].get(route) for route in routes} == \
        {"anthropic": 3, "openai": 3, "azure-openai": 4, "gemini": 3, "vertex-gemini": 3, "vertex-anthropic": 3,
         "bedrock-converse": 3, "bedrock-invoke": 3}, stats
    # Azure's probe: a request with no messages, refused unbilled (a 400), which tells the deployment exists
    assert stats["by_status"] == {"200": 24, "400": 1}

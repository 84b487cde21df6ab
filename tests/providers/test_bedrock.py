"""The bedrock provider through its SDKs (boto3's Converse, the anthropic SDK's AsyncAnthropicBedrock for Claude)
against the simulated server, which checks every request's SigV4 access key id: answers and usage, prices from
genai-prices, the memo, a budget, errors, the setup sentences (region, credentials) and the pre-flight probe.
The kill -9 and resume test runs the runner and the server in processes of their own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.errors import AuthError, BadRequest, ModelSetupError, RunnerError, TransientError
from runner.providers.base import ProviderSettings, provider_class, split_model
from runner.providers.bedrock import BedrockProvider
from runner.providers.pricing import Pricing
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import Store, open_store
from simserver import SimConfig, simulated_reply, start_server
from tests.helpers import isolated_aws, one_error, runner_cmd, sim_stats, write_job, write_rows

ACCESS_KEY = "AKIDSIMULATEDBEDROCK"
SECRET = "simulated-secret-never-shown"
CONVERSE = "bedrock:amazon.nova-pro-v1:0"
CLAUDE = "bedrock:us.anthropic.claude-3-5-haiku-20241022-v1:0"
ROUTES = {CONVERSE: "bedrock-converse", CLAUDE: "bedrock-invoke"}


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """AWS credentials from the environment only (tests/helpers.py)."""
    isolated_aws(monkeypatch, tmp_path, ACCESS_KEY, SECRET)


def make_job(tmp_path: Path, url: str, model: str, rows: int, *, settings: str = "timeout: 2", extra: str = "",
             name: str = "job", params: str | None = None):
    dataset = write_rows(tmp_path / f"{name}.jsonl", rows)
    lines = f"providers: {{bedrock: {{base_url: {json.dumps(url)}, {settings}}}}}\n{extra}"
    path = write_job(tmp_path / f"{name}.yaml", dataset, models=[model], extra=lines, name=name)
    if params is not None:
        path.write_text(path.read_text().replace("params: {temperature: 0, max_tokens: 5}", f"params: {params}"))
    return path


def statuses(store: Store, run_id: str) -> dict[str, int]:
    return dict(Counter(task["status"] for task in store.tasks(run_id)))


def error_classes(store: Store, run_id: str) -> dict[str, int]:
    return dict(Counter(task["error_class"] for task in store.tasks(run_id, status="failed")))


def test_a_model_id_keeps_its_own_colon():
    assert split_model(CONVERSE) == ("bedrock", "amazon.nova-pro-v1:0")
    assert provider_class("bedrock") is BedrockProvider


async def test_claude_signs_with_the_keys_of_the_environment_each_run_finds(tmp_path, monkeypatch):
    # the anthropic SDK keeps one boto3 session a process per region and profile, with the first keys it found: a
    # second run after AWS_ACCESS_KEY_ID changed signed with the old keys (20 auth failures) until the runner gave
    # the SDK the keys its own session finds
    for n, key in enumerate(("AKIDSIMULATEDFIRST", "AKIDSIMULATEDSECOND")):
        isolated_aws(monkeypatch, tmp_path, key)
        async with await start_server(SimConfig(api_key=key)) as srv:
            job = load_job(make_job(tmp_path, srv.root_url, CLAUDE, 3, name=f"job{n}"))
            outcome = await execute(job, open_store(tmp_path / f"s{n}.sqlite"))
        assert outcome.status == "completed", (key, outcome.message)


@pytest.mark.parametrize("model", [CONVERSE, CLAUDE])
async def test_answers_usage_and_prices_through_each_sdk(tmp_path, model):
    # the server takes only this access key id: every request was signed with the chain's credentials
    async with await start_server(SimConfig(api_key=ACCESS_KEY)) as srv:
        job = load_job(make_job(tmp_path, srv.root_url, model, 20))
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
        stats = srv.stats()
    assert outcome.status == "completed", outcome.message
    assert stats["received"] == 20 and stats["by_route"][ROUTES[model]] == 20
    pricing = Pricing(job)
    for row in store.responses():
        request = json.loads(row["request_json"])
        params = request["params"]
        expected, _ = simulated_reply(request["model"], request["messages"], params.get("temperature"),
                                      params.get("max_tokens"), params.get("top_p"), params.get("stop"),
                                      params.get("seed"))
        assert row["response_text"] == expected
        assert row["input_tokens"] > 0 and row["output_tokens"] > 0
        assert row["cost"] == pytest.approx(pricing.cost(model, row["input_tokens"], row["output_tokens"]))
    assert "genai-prices" in pricing.rates(model).source and "/" in pricing.rates(model).source
    built = report.build(store, outcome.run_id)
    assert built["totals"]["sent"] == 20 and built["totals"]["failed"] == 0 and built["totals"]["cost"] > 0


async def test_claude_goes_as_bedrock_messages_with_thinking(tmp_path):
    model = "bedrock:us.anthropic.claude-sonnet-4-5-20250929-v1:0"
    async with await start_server() as srv:
        path = make_job(tmp_path, srv.root_url, model, 3,
                        params="{max_tokens: 2000, reasoning: {budget_tokens: 1024}}")
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(path), store)
    assert outcome.status == "completed", outcome.message
    rows = store.responses()
    assert len(rows) == 3 and all(row["thinking"] for row in rows)
    raw = json.loads(rows[0]["response_json"])
    assert [block["type"] for block in raw["content"]] == ["thinking", "text"]


def _botocore_refuses_bearer_over_http() -> bool:
    """Whether the installed botocore refuses to send a bearer token (AWS_BEARER_TOKEN_BEDROCK, set by the caller)
    to an http endpoint such as the simulated server's: botocore 1.44 and later do, before anything is sent."""
    import boto3
    import botocore.exceptions

    refusal = getattr(botocore.exceptions, "InvalidEndpointConfigurationError", None)
    if refusal is None:
        return False
    client = boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url="http://127.0.0.1:9")
    try:
        client.converse(modelId="m", messages=[{"role": "user", "content": [{"text": "x"}]}])
    except refusal:
        return True
    except Exception:  # noqa: BLE001 - nothing listens on port 9: the request was let through to be sent
        return False
    return False


async def test_a_bedrock_api_key_is_sent_as_a_bearer_token_by_both_sdks(tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", "bedrock-api-key-simulated")
    async with await start_server(SimConfig(api_key="bedrock-api-key-simulated")) as srv:
        for model in (CONVERSE, CLAUDE):
            store = open_store(tmp_path / "s.sqlite")
            job = load_job(make_job(tmp_path, srv.root_url, model, 3, name=split_model(model)[1][:6]))
            outcome = await execute(job, store)
            if model == CONVERSE:  # refused as botocore 1.44 and later refuse it (the wire with any): nothing sent
                assert "needs an https base_url" in (outcome.message or "") and statuses(store, outcome.run_id) == {}
                continue
            assert statuses(store, outcome.run_id) == {"done": 3}
            assert "bedrock-api-key-simulated" not in json.dumps(report.build(store, outcome.run_id), default=str)
        probe = BedrockProvider(ProviderSettings(base_url=srv.root_url)).probe("amazon.nova-pro-v1:0")
        with pytest.raises(ModelSetupError, match="needs an https base_url"):  # over the wire too (bedrock_probe.py),
            await probe  # with any botocore, as botocore 1.44 and later refuse it
        assert srv.stats()["received"] == 3  # the Claude requests alone


async def test_a_second_run_is_answered_from_the_memo(tmp_path):
    async with await start_server() as srv:
        for model in (CONVERSE, CLAUDE):
            job = load_job(make_job(tmp_path, srv.root_url, model, 10, name=split_model(model)[1][:6]))
            store = open_store(tmp_path / "memo.sqlite")
            first = await execute(job, store)
            before = srv.stats()["received"]
            second = await execute(job, store)
            assert (first.status, second.status) == ("completed", "completed")
            assert srv.stats()["received"] == before
            assert report.build(store, second.run_id)["totals"]["cache_hits"] == 10


async def test_a_budget_is_never_overshot(tmp_path):
    async with await start_server() as srv:
        path = make_job(tmp_path, srv.root_url, CONVERSE, 60, extra="budget: {usd: 0.0005}",
                        settings="timeout: 2, concurrency: 8")
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(path), store)
        received = srv.stats()["received"]
    spent = sum(row["amount"] for row in store.ledger(outcome.run_id, kind="charge"))
    assert outcome.status == "budget_exhausted"
    assert 0 < spent <= 0.0005 and 0 < received < 60


async def test_refused_credentials_stop_the_endpoint_and_name_no_secret(tmp_path):
    async with await start_server(SimConfig(api_key="AKIDSOMEONEELSE")) as srv:
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(make_job(tmp_path, srv.root_url, CONVERSE, 20)), store)
        assert srv.stats()["received"] == 1
    assert error_classes(store, outcome.run_id) == {"auth": 20}
    message = store.tasks(attempts=1)[0]["error"]
    assert "UnrecognizedClientException" in message and "AWS_ACCESS_KEY_ID" in message
    assert SECRET not in message and ACCESS_KEY not in message


@pytest.mark.parametrize("model", [CONVERSE, CLAUDE])
async def test_throttling_server_errors_and_filters_are_told_apart(tmp_path, model):
    async with await start_server(SimConfig(fault_429=0.3, fault_503=0.2, retry_after=0.01, seed=4)) as srv:
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(make_job(tmp_path, srv.root_url, model, 20)), store)
        stats = srv.stats()
    assert statuses(store, outcome.run_id) == {"done": 20}
    assert stats["by_status"]["429"] > 0 and stats["by_status"]["503"] > 0
    assert stats["received"] == 20 + outcome.stats.totals().retries
    async with await start_server(SimConfig(fault_filter=1.0)) as srv:
        store = open_store(tmp_path / "f.sqlite")
        outcome = await execute(load_job(make_job(tmp_path, srv.root_url, model, 5, name="filtered")), store)
        assert srv.stats()["received"] == 5
    assert error_classes(store, outcome.run_id) == {"refused": 5}


async def test_an_exhausted_quota_stops_the_run(tmp_path):
    async with await start_server(SimConfig(fault_quota=1.0)) as srv:
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(make_job(tmp_path, srv.root_url, CONVERSE, 20)), store)
        assert srv.stats()["received"] == 1
    assert outcome.status == "failed" and "quota" in outcome.message


async def test_what_converse_cannot_carry_is_refused_before_sending(tmp_path):
    provider = BedrockProvider(ProviderSettings())
    hello = [{"role": "user", "content": "Hello"}]
    with pytest.raises(BadRequest, match=r"takes temperature 0 to 1, not 1\.5"):
        provider.converse_request("amazon.nova-pro-v1:0", hello, {"temperature": 1.5})
    with pytest.raises(BadRequest, match="takes no seed, logprobs through the Converse API"):
        provider.converse_request("amazon.nova-pro-v1:0", hello, {"seed": 3, "logprobs": True})
    async with await start_server() as srv:
        path = make_job(tmp_path, srv.root_url, CONVERSE, 3, params="{temperature: 1.5, max_tokens: 5}")
        store = open_store(tmp_path / "s.sqlite")
        try:  # refused by the job's checks where the capability table knows Converse, else item by item
            outcome = await execute(load_job(path), store)
        except RunnerError as exc:
            assert "temperature 0 to 1" in str(exc)
        else:
            assert error_classes(store, outcome.run_id) == {"bad_request": 3}
            assert "takes temperature 0 to 1" in store.tasks(outcome.run_id)[0]["error"]
        assert srv.stats()["received"] == 0


@pytest.mark.parametrize(("unset", "words"), [(("AWS_REGION",), "needs an AWS region"),
                                              (("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
                                               "found no AWS credentials")])
def test_a_missing_region_or_credentials_is_one_sentence(tmp_path, monkeypatch, capsys, unset, words):
    for variable in unset:
        monkeypatch.delenv(variable)
    path = make_job(tmp_path, "http://127.0.0.1:9", CONVERSE, 2)
    monkeypatch.setattr(sys, "argv", ["runner", "submit", str(path), "--db", str(tmp_path / "s.sqlite")])
    from runner.cli import main

    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 1
    line = one_error(capsys.readouterr().err)
    assert words in line and CONVERSE in line and "(no request was sent)" in line
    assert SECRET not in line


async def test_the_probe_says_each_problem_in_one_sentence(tmp_path, monkeypatch):
    async with await start_server(SimConfig(models="amazon.nova-pro-v1:0,us.anthropic.claude-3-5-haiku-"
                                                   "20241022-v1:0")) as srv:
        provider = BedrockProvider(ProviderSettings(base_url=srv.root_url, timeout=2))
        await provider.probe("amazon.nova-pro-v1:0")
        await provider.probe("us.anthropic.claude-3-5-haiku-20241022-v1:0")
        with pytest.raises(ModelSetupError, match=r"bedrock:amazon\.nova-nope-v1:0 is not a model"):
            await provider.probe("amazon.nova-nope-v1:0")
        srv.configure(api_key="AKIDSOMEONEELSE")
        with pytest.raises(AuthError, match="credentials were refused"):
            await provider.probe("amazon.nova-pro-v1:0")
        assert srv.stats()["received"] == 0  # lookups are not model requests
    with pytest.raises(TransientError, match="is the endpoint right and reachable"):
        await provider.probe("amazon.nova-pro-v1:0")  # the server is gone
    monkeypatch.delenv("AWS_REGION")
    with pytest.raises(ModelSetupError, match="needs an AWS region"):
        await BedrockProvider(ProviderSettings(base_url="http://127.0.0.1:9")).probe("amazon.nova-pro-v1:0")


def _wait_for_done(db: Path, count: int, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while True:
        store = open_store(db)
        try:
            if len(store.tasks(status="done")) >= count:
                return
        finally:
            store.close()
        assert time.monotonic() < deadline, f"timed out waiting for {count} finished tasks"
        time.sleep(0.02)


@pytest.mark.slow  # three runner processes: 20 to 40 s on a loaded two-core machine
@pytest.mark.parametrize("sim_server", [0.02], indirect=True)
def test_kill_9_then_resume_sends_nothing_twice(tmp_path, sim_server):
    db = tmp_path / "store.sqlite"
    model = CONVERSE
    path = make_job(tmp_path, sim_server.removesuffix("/v1"), model, 120, settings="timeout: 5, concurrency: 2")
    open_store(db).close()
    proc = subprocess.Popen(runner_cmd("submit", str(path), "--db", str(db)), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_done(db, 20, 60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    store = open_store(db)
    stored = [json.loads(r["request_json"])["messages"] for r in store.responses()]
    run_id = store.list_runs()[0]["id"]
    store.close()
    assert 20 <= len(stored) < 120
    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", str(db)), cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    from simserver import message_digest

    completed = sim_stats(sim_server)["completed_by_digest"]
    for messages in stored:
        assert completed[message_digest(messages)] == 1, "a request with a stored response was sent again"
    assert len(completed) == 120
    store = open_store(db)
    built = report.build(store, run_id)
    assert built["totals"]["failed"] == 0 and built["totals"]["sent"] == 120  # each request paid once
    assert SECRET not in json.dumps(built, default=str)
    assert not any(SECRET in (row["request_json"] + (row["response_json"] or "")) for row in store.responses())
    store.close()


@pytest.mark.parametrize("model", [CONVERSE, CLAUDE])
async def test_a_timeout_is_retried_and_a_missing_server_is_a_connection_error(tmp_path, model):
    async with await start_server(SimConfig(fault_timeout=0.3, hang_seconds=5, seed=2)) as srv:
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(make_job(tmp_path, srv.root_url, model, 6, settings="timeout: 0.3")), store)
    assert statuses(store, outcome.run_id) == {"done": 6} and outcome.stats.totals().retries > 0
    path = make_job(tmp_path, srv.root_url, model, 3, name="gone")  # the server is closed: its port refuses
    text = path.read_text().replace("retry: {max_attempts: 10,", "retry: {max_attempts: 2,")
    path.write_text(text)
    store = open_store(tmp_path / "gone.sqlite")
    outcome = await execute(load_job(path), store)
    assert error_classes(store, outcome.run_id) == {"connection": 3}
    assert {task["attempts"] for task in store.tasks()} == {2}


async def test_claude_on_bedrock_is_marked_for_the_prompt_cache(tmp_path):
    """A Claude request through AnthropicBedrock carries cache_control where the shared instruction ends (the
    server caches nothing unmarked for Claude): every request but the first reads it from the server's cache."""
    system = ("Read the question and the options, then answer with the letter of the right option only. " * 180)
    async with await start_server(SimConfig(api_key=ACCESS_KEY)) as server:
        path = make_job(tmp_path, server.root_url, CLAUDE, 12)
        path.write_text(path.read_text().replace("system: Answer with one letter.",
                                                 f"system: {json.dumps(system[:16000])}"), encoding="utf-8")
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(path), store)
        assert outcome.status == "completed", outcome.message
        assert server.stats()["prompt_cache"]["hits"] == 11
        assert sorted(r["cached_tokens"] > 0 for r in store.responses()) == [False] + [True] * 11


# -- structured outputs and effort through Converse's outputConfig ----------------------------------------------

GPT_OSS = "bedrock:openai.gpt-oss-120b-1:0"
LETTER = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["A", "B", "C", "D"]}},
          "required": ["answer"], "additionalProperties": False}


def structured(path: Path) -> Path:
    """The job at ``path`` with its stage asking a JSON answer to a schema, scored as a letter."""
    text = path.read_text(encoding="utf-8").replace("    parse: letter\n", f"    parse: json\n    schema: "
                                                    f"{json.dumps(LETTER)}\n    answer_field: answer\n"
                                                    "    score_as: letter\n")
    path.write_text(text, encoding="utf-8")
    return path


def _has_output_config() -> bool:
    from runner.providers.bedrock_converse import output_members

    return {"textFormat", "effort"} <= output_members()


@pytest.mark.skipif(not _has_output_config(), reason="the installed botocore's Converse has no outputConfig")
async def test_a_schema_goes_as_output_config_text_format_through_boto3(tmp_path):
    """A stage's schema on a model Bedrock's structured outputs page lists is sent as outputConfig.textFormat (the
    strict server checks it against botocore's shape and answers an instance of the schema)."""
    provider = BedrockProvider(ProviderSettings())
    request = provider.converse_request("openai.gpt-oss-120b-1:0", [{"role": "user", "content": "A?"}], {
        "max_tokens": 20, "response_format": {"type": "json_schema", "json_schema": {"name": "mc", "schema": LETTER}}})
    assert request["outputConfig"] == {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": {
        "schema": json.dumps(LETTER, separators=(",", ":")), "name": "mc"}}}}
    async with await start_server(SimConfig(api_key=ACCESS_KEY)) as srv:
        path = structured(make_job(tmp_path, srv.root_url, GPT_OSS, 6, params="{max_tokens: 50}"))
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(path), store)
        stats = srv.stats()
    assert outcome.status == "completed", outcome.message
    assert stats["by_route"]["bedrock-converse"] == 6 and stats["by_status"] == {"200": 6}
    for task in store.tasks(outcome.run_id):
        line = json.loads(task["result_json"])
        assert line["valid"] and set(json.loads(line["response"])) == {"answer"}  # the server read the schema


def test_validate_refuses_a_schema_where_converse_has_no_structured_outputs(tmp_path, monkeypatch, capsys):
    from tests.helpers import run_cli

    path = structured(make_job(tmp_path, "http://127.0.0.1:9", CONVERSE, 2))
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2
    assert one_error(err).startswith(f"Error: {path}:9: stages[0]: {CONVERSE} has no structured outputs with a JSON "
                                     "Schema: use a model that has them, or remove the stage's schema:")
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(structured(make_job(
        tmp_path, "http://127.0.0.1:9", GPT_OSS, 2, name="oss"))))
    assert code == 0, err


@pytest.mark.skipif(not _has_output_config(), reason="the installed botocore's Converse has no outputConfig")
async def test_an_effort_goes_as_output_config_effort_and_what_converse_lacks_is_refused():
    """reasoning.effort maps to outputConfig.effort (for the models a Converse rule lets take one: none yet, as no
    AWS page names one, so ``runner validate`` refuses it first); a budget or a word the field does not document is
    refused before sending."""
    provider = BedrockProvider(ProviderSettings())
    hello = [{"role": "user", "content": "Hello"}]
    assert provider.converse_request("openai.gpt-oss-120b-1:0", hello, {"reasoning": {"effort": "high"}})[
        "outputConfig"] == {"effort": "high"}
    with pytest.raises(BadRequest, match="takes no thinking budget through the Converse API"):
        provider.converse_request("openai.gpt-oss-120b-1:0", hello, {"reasoning": {"budget_tokens": 1024}})
    with pytest.raises(BadRequest, match="takes reasoning effort low, medium, high, xhigh, max through the Converse"):
        provider.converse_request("openai.gpt-oss-120b-1:0", hello, {"reasoning": {"effort": "minimal"}})
    with pytest.raises(BadRequest, match="has no JSON mode without a schema"):
        provider.converse_request("openai.gpt-oss-120b-1:0", hello, {"response_format": {"type": "json_object"}})
    async with await start_server(SimConfig(api_key=ACCESS_KEY)) as srv:
        provider = BedrockProvider(ProviderSettings(base_url=srv.root_url, timeout=2))
        await provider.start()
        try:
            answer = await provider.execute("openai.gpt-oss-120b-1:0", hello,
                                            {"max_tokens": 5, "reasoning": {"effort": "high"}})
        finally:
            await provider.aclose()
    assert answer.text
    from runner.providers.capabilities import shape

    assert shape("bedrock", "openai.gpt-oss-120b-1:0", {"reasoning": {"effort": "high"}}).problems == [
        "bedrock:openai.gpt-oss-120b-1:0 does not reason: remove reasoning:, or set drop_unsupported: true to leave "
        "it out"]

"""Vertex AI (``vertex:``) through google-genai in Vertex mode and the anthropic SDK's AsyncAnthropicVertex against
the simulated server: answers and usage, the memo, a budget, errors, the probe, missing settings and credentials,
and kill -9 then resume.

No test reaches Google: the credentials are a service-account key file written here (a fresh RSA key) whose
``token_uri`` is the simulated server's ``/token``, and :func:`_local_only` fails any connection to anywhere but
127.0.0.1 made in this process.
"""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.errors import AuthError, ModelSetupError, TransientError
from runner.providers import capabilities
from runner.providers.base import ProviderSettings, provider_class
from runner.providers.pricing import Pricing
from runner.providers.vertex import VertexProvider
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimServer, simulated_reply, start_server
from tests.helpers import one_error, run_cli, runner_cmd, sim_stats, write_job, write_rows

GEMINI = "vertex:gemini-2.0-flash"
CLAUDE = "vertex:claude-3-5-haiku@20241022"
#: the variables that would point the SDKs elsewhere (the user's own cloud settings)
CLOUD_VARIABLES = ("GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION", "GOOGLE_API_KEY", "GEMINI_API_KEY",
                   "GOOGLE_GENAI_USE_VERTEXAI", "ANTHROPIC_VERTEX_PROJECT_ID", "CLOUD_ML_REGION",
                   "ANTHROPIC_VERTEX_BASE_URL", "GOOGLE_APPLICATION_CREDENTIALS")


@pytest.fixture(scope="module")
def private_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


@pytest.fixture(autouse=True)
def _local_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing in this process connects anywhere but 127.0.0.1; no user's gcloud settings are read, and no probe
    of a cloud machine's metadata server is made."""
    for variable in CLOUD_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setattr("google.auth.compute_engine._metadata._NO_GCE_CHECK", True)
    connect = socket.socket.connect

    def local_connect(sock: socket.socket, address: object) -> object:
        host = address[0] if isinstance(address, tuple) else address
        assert host in ("127.0.0.1", "::1", "localhost") or sock.family == socket.AF_UNIX, \
            f"a test connected to {address}"
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_connect)


def credentials_file(folder: Path, token_uri: str, private_key: str, email: str = "runner") -> Path:
    """A service-account key file as the Google Cloud console writes it, its token endpoint ``token_uri``."""
    path = folder / f"{email}-key.json"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "sim-project", "private_key_id": "0123456789abcdef",
        "private_key": private_key, "client_email": f"{email}@sim-project.iam.gserviceaccount.com",
        "client_id": "100000000000000000001", "token_uri": token_uri,
    }), encoding="utf-8")
    return path


@pytest.fixture
async def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_key: str):
    async with await start_server() as server:
        path = credentials_file(tmp_path, server.root_url + "/token", private_key)
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
        yield server


def vertex_settings(root_url: str, *, project: str | None = "sim-project", location: str | None = "us-east5",
                    more: str = "") -> str:
    entries = [f"base_url: {json.dumps(root_url)}", "timeout: 2"]
    entries += [f"project: {project}"] if project else []
    entries += [f"location: {location}"] if location else []
    entries += [more] if more else []
    return f"providers: {{vertex: {{{', '.join(entries)}}}}}"


def make_job(tmp_path: Path, root_url: str, models: list[str], rows: int, *, name: str = "job", extra: str = "",
             **settings: str | None):
    dataset = write_rows(tmp_path / f"{name}.jsonl", rows)
    lines = vertex_settings(root_url, **settings) + ("\n" + extra if extra else "")
    return write_job(tmp_path / f"{name}.yaml", dataset, models=models, extra=lines, name=name)


def errors_of(store, run_id: str) -> dict[str, int]:
    return dict(Counter(task["error_class"] for task in store.tasks(run_id, status="failed")))


async def test_gemini_and_claude_on_vertex_answer_with_usage_and_genai_prices(tmp_path, srv: SimServer):
    job = load_job(make_job(tmp_path, srv.root_url, [GEMINI, CLAUDE], 12))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    stats = srv.stats()
    assert outcome.status == "completed"
    assert stats["by_route"]["vertex-gemini"] == 12 and stats["by_route"]["vertex-anthropic"] == 12
    assert stats["by_route"]["gemini"] == stats["by_route"]["anthropic"] == 0
    for row in store.responses():
        request = json.loads(row["request_json"])
        params = request["params"]
        expected, _ = simulated_reply(request["model"], request["messages"], params.get("temperature"),
                                      params.get("max_tokens"), params.get("top_p"), params.get("stop"),
                                      params.get("seed"))
        assert request["provider"] == "vertex"
        assert row["response_text"] == expected
        assert row["input_tokens"] > 0 and row["output_tokens"] > 0
    built = report.build(store, outcome.run_id)
    assert built["totals"]["sent"] == 24 and built["totals"]["failed"] == 0
    pricing = Pricing(job)
    # genai-prices' Google provider prices both (Claude through its Anthropic fallback)
    assert pricing.rates(GEMINI).source.endswith("google/gemini-2.0-flash")
    assert "google/claude-3-5-haiku" in pricing.rates(CLAUDE).source
    from_usage = sum(pricing.cost(f"vertex:{json.loads(r['request_json'])['model']}", r["input_tokens"],
                                  r["output_tokens"]) for r in store.responses())
    assert built["totals"]["cost"] == pytest.approx(from_usage) and from_usage > 0


async def test_a_second_run_is_answered_from_the_memo(tmp_path, srv: SimServer):
    job = load_job(make_job(tmp_path, srv.root_url, [GEMINI, CLAUDE], 8))
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(job, store)
    sent = srv.stats()["received"]
    second = await execute(job, store)
    assert first.status == second.status == "completed"
    assert sent == 16 and srv.stats()["received"] == 16
    assert report.build(store, second.run_id)["totals"]["sent"] == 0


async def test_vertex_answers_are_not_gemini_answers_in_the_memo(tmp_path, srv: SimServer, monkeypatch):
    """The same model and prompt through the Developer API (gemini:) and through Vertex are two cache keys."""
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    dataset = write_rows(tmp_path / "rows.jsonl", 4)
    extra = (vertex_settings(srv.root_url).removesuffix("}}")
             + f"}}, gemini: {{base_url: {json.dumps(srv.root_url)}}}}}")
    job = load_job(write_job(tmp_path / "job.yaml", dataset, models=[GEMINI, "gemini:gemini-2.0-flash"],
                             extra=extra))
    store = open_store(tmp_path / "s.sqlite")
    assert (await execute(job, store)).status == "completed"
    by_route = srv.stats()["by_route"]
    assert by_route["vertex-gemini"] == 4 and by_route["gemini"] == 4
    assert len({row["key"] for row in store.responses()}) == 8


async def test_a_budget_is_never_overshot(tmp_path, srv: SimServer):
    prices = f"prices: {{{GEMINI}: {{input: 2000, output: 8000}}, {CLAUDE}: {{input: 2000, output: 8000}}}}"
    job = load_job(make_job(tmp_path, srv.root_url, [GEMINI, CLAUDE], 40, extra=prices + "\nbudget: {usd: 0.6}",
                            more="concurrency: 4"))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    spent = sum(row["amount"] for row in store.ledger(outcome.run_id, kind="charge"))
    assert outcome.status == "budget_exhausted"
    assert 0 < spent <= 0.6
    assert srv.stats()["received"] < 80


@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
async def test_rate_limits_and_server_errors_are_retried(tmp_path, srv: SimServer, model):
    srv.configure(fault_429=0.3, fault_500=0.2, retry_after=0.02, seed=4)
    job = load_job(make_job(tmp_path, srv.root_url, [model], 20))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    stats = srv.stats()
    assert outcome.status == "completed"
    assert stats["by_status"]["429"] > 0 and stats["by_status"]["500"] > 0
    assert stats["received"] == 20 + outcome.stats.totals().retries


@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
async def test_a_refused_token_stops_the_endpoint_after_one_request(tmp_path, srv: SimServer, model):
    srv.configure(fault_401=1.0)
    job = load_job(make_job(tmp_path, srv.root_url, [model], 10))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert srv.stats()["received"] == 1
    assert errors_of(store, outcome.run_id) == {"auth": 10}
    message = store.tasks(attempts=1)[0]["error"]
    assert "GOOGLE_APPLICATION_CREDENTIALS" in message and "ya29" not in message


async def test_revoked_credentials_are_refused_before_any_model_request(tmp_path, srv: SimServer, monkeypatch,
                                                                       private_key):
    path = credentials_file(tmp_path, srv.root_url + "/token", private_key, email="revoked")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    job = load_job(make_job(tmp_path, srv.root_url, [GEMINI, CLAUDE], 5))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert srv.stats()["received"] == 0
    assert errors_of(store, outcome.run_id) == {"auth": 10}
    message = store.tasks(attempts=1)[0]["error"]
    assert "refused" in message and "GOOGLE_APPLICATION_CREDENTIALS" in message and "PRIVATE KEY" not in message


@pytest.mark.parametrize(("setting", "variable"), [("project", "GOOGLE_CLOUD_PROJECT"),
                                                   ("location", "GOOGLE_CLOUD_LOCATION")])
def test_a_missing_project_or_location_is_one_sentence(tmp_path, monkeypatch, capsys, setting, variable):
    path = make_job(tmp_path, "http://127.0.0.1:9", [GEMINI], 2, **{setting: None})
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(path), "--db", str(tmp_path / "s.sqlite"))
    assert code == 1
    assert one_error(err) == (f"Error: {GEMINI} needs a Google Cloud {setting}: set providers: {{vertex: "
                              f"{{{setting}: ...}}}} in the job or export {variable} (no request was sent)")


async def test_the_project_and_location_may_come_from_the_environment(tmp_path, srv: SimServer, monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "env-project")
    monkeypatch.setenv("GOOGLE_CLOUD_LOCATION", "europe-west4")
    job = load_job(make_job(tmp_path, srv.root_url, [GEMINI], 3, project=None, location=None))
    assert (await execute(job, open_store(tmp_path / "s.sqlite"))).status == "completed"
    assert srv.stats()["by_route"]["vertex-gemini"] == 3


async def test_no_credentials_stop_the_job_with_one_sentence(tmp_path, srv: SimServer, monkeypatch):
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    job = load_job(make_job(tmp_path, srv.root_url, [GEMINI], 3))
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    assert srv.stats()["received"] == 0
    assert outcome.status == "failed"
    assert "vertex needs Google credentials" in outcome.message and "GOOGLE_APPLICATION_CREDENTIALS" in \
        outcome.message


def test_the_settings_are_validated_by_the_providers_options():
    with pytest.raises(ModelSetupError, match="providers: vertex: region is not one of its settings"):
        VertexProvider(ProviderSettings.model_validate({"region": "x"}))
    assert provider_class("vertex").extra == "vertex"
    # batch prediction is the endpoint's where the job names a Cloud Storage folder for its files (test_vertex_batch)
    assert not VertexProvider(ProviderSettings()).supports_batch
    assert VertexProvider(ProviderSettings.model_validate({"batch_folder": "gs://bucket/runs"})).supports_batch


async def started(root_url: str, **options: str) -> VertexProvider:
    provider = VertexProvider(ProviderSettings.model_validate(
        {"base_url": root_url, "timeout": 2, "project": "sim-project", "location": "us-east5", **options}))
    await provider.start()
    return provider


async def test_claude_thinking_and_gemini_structured_output_map_as_their_own_providers(srv: SimServer):
    provider = await started(srv.root_url)
    try:
        model = "claude-sonnet-4-5@20250929"
        asked = {"max_tokens": 50, "reasoning": {"budget_tokens": 1024}}
        shaped = capabilities.shape("anthropic", model, asked).params
        answer = await provider.execute(model, [{"role": "user", "content": "Think first."}], shaped)
        assert answer.thinking and answer.text and answer.reasoning_tokens > 0
        schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
        params = {"max_tokens": 60, "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
        answer = await provider.execute("gemini-2.0-flash", [{"role": "user", "content": "Answer in JSON."}], params)
        assert set(json.loads(answer.text)) == {"answer"}
    finally:
        await provider.aclose()


async def test_a_job_with_reasoning_is_shaped_by_the_capability_table(tmp_path, srv: SimServer):
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"q": f"Question {i}?"}) + "\n" for i in range(3)), encoding="utf-8")
    spec = {"name": "think", "output_dir": str(tmp_path / "results"),
            "models": ["vertex:claude-sonnet-4-5@20250929", "vertex:gemini-2.5-flash"],
            "providers": {"vertex": {"base_url": srv.root_url, "project": "p", "location": "us-east5"}},
            "params": {"max_tokens": 5, "reasoning": {"effort": "low"}},
            "stages": [{"name": "ask", "dataset": {"path": str(dataset)}, "prompt": {"user": "{{ q }}"}}]}
    (tmp_path / "think.yaml").write_text(json.dumps(spec), encoding="utf-8")
    job = load_job(tmp_path / "think.yaml")
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed" and srv.stats()["by_status"] == {"200": 6}
    for row in store.responses():
        assert json.loads(row["request_json"])["params"]["max_tokens"] > 5  # the thinking allowance was added
        assert row["response_text"]


async def test_the_probe_knows_models_and_says_what_is_wrong_in_one_sentence(srv: SimServer, tmp_path, monkeypatch,
                                                                             private_key):
    srv.configure(models="gemini-2.0-flash,claude-3-5-haiku@20241022")
    provider = await started(srv.root_url)
    try:
        await provider.probe("gemini-2.0-flash")
        await provider.probe("claude-3-5-haiku@20241022")
        with pytest.raises(ModelSetupError, match=r"^vertex:gemini-9 is not a model Vertex AI knows"):
            await provider.probe("gemini-9")
        with pytest.raises(ModelSetupError, match=r"^vertex:claude-nope@1 is not a model"):
            await provider.probe("claude-nope@1")
        assert srv.stats()["received"] == 0  # lookups are not model requests
    finally:
        await provider.aclose()
    path = credentials_file(tmp_path, srv.root_url + "/token", private_key, email="revoked")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    provider = await started(srv.root_url)
    try:
        with pytest.raises(AuthError, match="^vertex:gemini-2.0-flash: Google refused"):
            await provider.probe("gemini-2.0-flash")
    finally:
        await provider.aclose()


async def test_the_probe_of_a_stopped_endpoint_is_one_sentence(srv: SimServer):
    provider = await started("http://127.0.0.1:9")  # the token endpoint answers; Vertex's does not
    try:
        started_at = time.monotonic()
        with pytest.raises(TransientError, match=r"^vertex:gemini-2.0-flash: vertex at http://127.0.0.1:9 did not "
                                                 r"answer \(connection\); is the endpoint reachable\?$"):
            await provider.probe("gemini-2.0-flash")
        assert time.monotonic() - started_at < 5
    finally:
        await provider.aclose()


def finished(db: Path) -> int:
    store = open_store(db)
    try:
        return len(store.tasks())
    finally:
        store.close()


@pytest.mark.slow  # a provider's kill and resume in new processes (the engine's stays in the fast path): 7 s
@pytest.mark.parametrize("sim_server", [0.02], indirect=True)
def test_sigkill_then_resume_sends_nothing_twice(tmp_path, sim_server, monkeypatch, private_key):
    root = sim_server.removesuffix("/v1")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS",
                       str(credentials_file(tmp_path, root + "/token", private_key)))
    monkeypatch.setenv("RUNNER_CHECK_TIMEOUT", "60")  # the pre-flight check on a busy machine: not what is tested
    # the project and location from the environment, which both processes see (the stored job of a run does not
    # keep a provider's own settings yet: ProviderSettings' dump leaves out its provider options)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "sim-project")
    monkeypatch.setenv("GOOGLE_CLOUD_LOCATION", "us-east5")
    db = tmp_path / "store.sqlite"
    job = make_job(tmp_path, root, [GEMINI], 150, project=None, location=None, more="concurrency: 2")
    open_store(db).close()
    proc = subprocess.Popen(runner_cmd("submit", str(job), "--db", str(db)), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while finished(db) < 30:
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "timed out waiting for 30 finished tasks"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    store = open_store(db)
    stored = [json.loads(row["request_json"])["messages"] for row in store.responses()]
    run_id = store.list_runs()[0]["id"]
    store.close()
    assert 30 <= len(stored) < 150
    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", str(db)), cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    completed = sim_stats(sim_server)["completed_by_digest"]
    assert len(completed) == 150
    for messages in stored:  # (those answered but not yet committed at the kill may have been answered twice)
        digest = hashlib.sha256(json.dumps(messages, sort_keys=True, separators=(",", ":"),
                                           ensure_ascii=False).encode()).hexdigest()
        assert completed[digest] == 1, "a request with a stored response was sent again"
    # the two in flight, and the answers that came within the writer's last commit window (its 10 ms interval and the
    # commit itself, ARCHITECTURE.md "Known limits"): over the lean wire two slots answer a few more in that window
    assert sum(completed.values()) <= 150 + 6
    store = open_store(db)
    try:
        totals = report.build(store, run_id)["totals"]
        assert totals["failed"] == 0 and len(store.tasks(status="done")) == 150
    finally:
        store.close()


#: an instruction of 16,000 characters: past Claude 3.5 Haiku's minimum of 2,048 tokens by any count
LONG_SYSTEM = ("Read the question and the options, then answer with the letter of the right option only. "
               * 180)[:16000]


async def test_claude_on_vertex_is_marked_for_the_prompt_cache_and_gemini_stores_the_instruction(
        tmp_path, srv: SimServer):
    """Planned prompt caching through both SDKs in Vertex mode: a Claude request carries cache_control where the
    shared instruction ends (the server caches nothing unmarked for Claude), and every request but its first reads
    the instruction from the server's cache; Gemini's twelve requests read it from the cached content stored for
    them (runner/engine/stored_prompts.py), the first included."""
    path = make_job(tmp_path, srv.root_url, [GEMINI, CLAUDE], 12)
    path.write_text(path.read_text().replace("system: Answer with one letter.",
                                             f"system: {json.dumps(LONG_SYSTEM)}"), encoding="utf-8")
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed", outcome.message
    assert srv.stats()["prompt_cache"]["hits"] == 11
    assert srv.stats()["cached_contents"]["reads"] == 12
    by_model = Counter((json.loads(r["request_json"])["model"], r["cached_tokens"] > 0) for r in store.responses())
    assert by_model == {(GEMINI.split(":")[1], True): 12,
                        (CLAUDE.split(":")[1], True): 11, (CLAUDE.split(":")[1], False): 1}


async def test_gemini_on_vertex_stores_a_shared_system_prompt_once_and_reads_it(tmp_path, srv: SimServer):
    """Gemini's explicit caching over the Vertex-mode client (runner/engine/stored_prompts.py): the project's
    cachedContents, named by every request, deleted at the end; Claude on Vertex keeps its breakpoints."""
    shared = ("Read the question and the options, then answer with the letter of the right option only. " * 70)[:6000]
    dataset = write_rows(tmp_path / "rows.jsonl", 10)
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({
        "name": "stored", "output_dir": str(tmp_path / "results"), "models": ["vertex:gemini-2.5-flash"],
        "providers": {"vertex": {"base_url": srv.root_url, "project": "sim-project", "location": "us-east5"}},
        "params": {"temperature": 0, "max_tokens": 5}, "prompt_cache": "auto",
        "stages": [{"name": "mc", "dataset": {"path": str(dataset)},
                    "prompt": {"system": shared, "user": "{{ question }}\n{{ options_block }}\nAnswer:"},
                    "choices": {"seeds": [0], "gold": "gold"}, "parse": "letter"}]}), encoding="utf-8")
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed", outcome.message
    cached = srv.stats()["cached_contents"]
    assert (cached["created"], cached["deleted"], cached["reads"]) == (1, 1, 10)
    tokens = 3 + 3 + len(shared) // 4
    assert [r["cached_tokens"] for r in store.responses()] == [tokens] * 10
    charges = [row for row in store.ledger(outcome.run_id) if row["key"].startswith("stored-prompt:")]
    assert charges and sum(row["amount"] for row in charges) > 0


ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["A", "B", "C", "D"]}},
                 "required": ["answer"], "additionalProperties": False}


def structured_job(tmp_path: Path, model: str) -> Path:
    """A job whose stage asks for a JSON answer to a schema (``parse: json``), on ``model``."""
    dataset = write_rows(tmp_path / "rows.jsonl", 2)
    path = write_job(tmp_path / "job.yaml", dataset, models=[model], extra=vertex_settings("http://127.0.0.1:9"))
    text = path.read_text(encoding="utf-8").replace("    parse: letter\n", f"    parse: json\n    schema: "
                                                    f"{json.dumps(ANSWER_SCHEMA)}\n    answer_field: answer\n"
                                                    "    score_as: letter\n")
    path.write_text(text, encoding="utf-8")
    return path


def test_validate_refuses_structured_output_where_vertex_does_not_serve_it(tmp_path, monkeypatch, capsys):
    """Google Cloud serves Claude's structured outputs for Opus 4.7, Sonnet 4.6 and Opus 4.6 only (the 4.5 models
    'coming soon'): a stage with a schema on vertex:claude-sonnet-4-5 is refused before anything is sent."""
    path = structured_job(tmp_path, "vertex:claude-sonnet-4-5@20250929")
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2
    problem = one_error(err)  # one sentence at the stage's line, no traceback
    assert problem.startswith(f"Error: {path}:8: stages[0]: vertex:claude-sonnet-4-5@20250929 has no structured "
                              "outputs on Vertex AI (Google Cloud offers them for Claude Opus 4.7, Sonnet 4.6 and "
                              "Opus 4.6"), problem
    assert "use vertex:claude-sonnet-4-6 or a later Claude model" in problem
    ok = structured_job(tmp_path, "vertex:claude-sonnet-4-6")
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(ok))
    assert code == 0, err


async def test_the_strict_server_refuses_claude_structured_output_where_vertex_does_not_serve_it(srv: SimServer):
    """The same rule on the simulated server's side, from its own table: the request is refused there too, so a
    runner that let it through would fail against the strict server."""
    provider = await started(srv.root_url)
    params = {"max_tokens": 60, "response_format": {"type": "json_schema", "json_schema": {"schema": ANSWER_SCHEMA}}}
    try:
        with pytest.raises(Exception, match="structured outputs are not supported"):
            await provider.execute("claude-sonnet-4-5@20250929", [{"role": "user", "content": "A?"}], params)
        answer = await provider.execute("claude-sonnet-4-6", [{"role": "user", "content": "A?"}], params)
        assert set(json.loads(answer.text)) == {"answer"}
    finally:
        await provider.aclose()

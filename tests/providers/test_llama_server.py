"""A job through the ``openai-compatible`` provider against llama-cpp-python's own OpenAI-compatible server.

The server (``llama_cpp.server`` from ``llama-cpp-python[server]``, FastAPI + uvicorn) is code this project did
not write; it serves the embedded SmolLM2-135M GGUF on 127.0.0.1 and is started and stopped by the fixture.

Starting it: plain ``python -m llama_cpp.server --model ...`` loads the model, answers ``GET /v1/models``, and then
dies with SIGSEGV (exit 139) on the first chat completion on this project's machines: it is the crash
``runner/providers/local_llama.py`` works around (llama.cpp's AMX "extra" CPU buffer type,
``ggml_backend_amx_mul_mat``, on a CPU reporting AMX_INT8). llama.cpp 0.3.36 has no environment variable and the
server no flag for it (``use_extra_bufts`` is only a field of ``llama_model_params``), so the server is started by a
two-line launcher: it enters ``runner.providers.local_llama.without_extra_buffers()`` (the same patch the local
provider loads with: the default model parameters get ``use_extra_bufts=False``) and runs the server's own
``__main__`` with ``runpy``, with the server's own command-line flags. Every line of the server is still theirs.

SmolLM2 answers at about chance level: these tests pin the shape of its answers, usage and determinism, never
their correctness (DESIGN, Conventions).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import LlamaServer, tail, write_job, write_rows

pytestmark = pytest.mark.slow  # llama.cpp's server started and the embedded model's weights loaded in it

MODEL = "openai-compatible:llama/smollm2"
ROWS = 4
def _job(tmp_path: Path, server: LlamaServer, name: str):
    dataset = write_rows(tmp_path / f"{name}.jsonl", ROWS)
    extra = f"endpoints:\n  llama: {{base_url: {json.dumps(server.url)}, timeout: 120}}"
    return load_job(write_job(tmp_path / f"{name}.yaml", dataset, models=[MODEL], extra=extra, name=name))


def _results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_job_runs_against_llama_cpp_server_and_resubmitting_it_costs_nothing(tmp_path, llama_server):
    job = _job(tmp_path, llama_server, "llamajob")
    store = open_store(tmp_path / "s.sqlite")
    before = llama_server.chat_requests()

    first = await execute(job, store)
    assert first.status == "completed", first.message
    sent = llama_server.chat_requests() - before
    assert sent == ROWS, tail(llama_server.log)
    totals = first.stats.totals()
    assert (totals.done, totals.sent, totals.cache_hits, totals.errors) == (ROWS, ROWS, 0, 0)
    assert totals.tokens_in > 0 and totals.tokens_out > 0

    rows = _results(first.results["mc"])
    assert len(rows) == ROWS and {r["id"] for r in rows} == {str(i) for i in range(1, ROWS + 1)}  # line numbers
    for r in rows:
        assert r["model"] == MODEL and r["status"] == "done"
        assert isinstance(r["response"], str) and r["response"].strip()
        assert r["finish_reason"] in ("stop", "length") and len(r["cache_key"]) == 64
    tasks = [(t["key"], t["input_tokens"], t["output_tokens"], t["cache_hit"]) for t in store.tasks(first.run_id)]
    assert len(tasks) == ROWS and all(t[1] > 0 and t[2] > 0 and not t[3] for t in tasks)
    columns = ("provider", "model", "response_text", "finish_reason", "input_tokens", "output_tokens", "response_json")
    stored = [tuple(r[c] for c in columns) for r in store.responses()]
    assert len(stored) == ROWS
    for provider, model, text, finish, tokens_in, tokens_out, body in stored:
        # the cache key names the server and the model it serves, not the job's label for the server
        assert (provider, model) == ("openai-compatible", f"{llama_server.url.rstrip('/')}/smollm2")
        assert text.strip() and finish in ("stop", "length")
        assert 0 < tokens_out <= 5 < tokens_in  # max_tokens 5; the prompt is a question with four options
        raw = json.loads(body)
        assert raw["object"] == "chat.completion" and raw["model"] == "smollm2"  # the server's own answer
        assert (raw["usage"]["prompt_tokens"], raw["usage"]["completion_tokens"]) == (tokens_in, tokens_out)
    assert {t[0] for t in tasks} == {r["cache_key"] for r in rows}

    second = await execute(job, store)
    assert second.status == "completed", second.message
    again = second.stats.totals()
    assert (again.cache_hits, again.sent, again.errors) == (ROWS, 0, 0)
    assert llama_server.chat_requests() - before == ROWS  # the server saw no new request
    cached = _results(second.results["mc"])
    assert all(r["cache_hit"] for r in cached)
    assert {(r["id"], r["response"]) for r in cached} == {(r["id"], r["response"]) for r in rows}


async def test_the_same_prompts_give_the_same_text_without_the_cache(tmp_path, llama_server):
    """Temperature 0 is greedy decoding: two uncached runs (two stores) ask the server again and get the same
    text, whatever order the concurrent requests reach it in and whatever prompt prefix it kept from the last."""
    job = _job(tmp_path, llama_server, "llamajob")
    before = llama_server.chat_requests()
    one = await execute(job, open_store(tmp_path / "one.sqlite"))
    two = await execute(job, open_store(tmp_path / "two.sqlite"))
    assert (one.status, two.status) == ("completed", "completed")
    assert llama_server.chat_requests() - before == 2 * ROWS
    answers = [{r["id"]: r["response"] for r in _results(outcome.results["mc"])} for outcome in (one, two)]
    assert answers[0] == answers[1] and len(answers[0]) == ROWS

"""Every answer is bounded (``runner/providers/answer_bounds.py``, issue 41): the hostile server of
``devservers/hostile.py`` sends an endless body, a slow trickle, a gzip bomb, a coding not asked for, or resets the
connection mid-answer. Each path that reads answers (the lean wire for ``sim``, ``anthropic`` and ``bedrock``, the
openai and anthropic SDKs' clients, google-genai's, boto3's for Bedrock) fails each case within its time bound, with
bounded memory (tracemalloc's peak of the call) and one error class per case, retryable."""

from __future__ import annotations

import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import pytest

from devservers.hostile import HostileServer, gzip_of_zeros
from runner.errors import TransientError
from runner.providers.answer_bounds import (
    MIB,
    Bound,
    Inflater,
    OutOfBounds,
    bounds_of,
    is_download,
    out_of_bounds,
    too_large,
)
from runner.providers.anthropic_messages import AnthropicProvider
from runner.providers.base import Provider, ProviderSettings
from runner.providers.bedrock import BedrockProvider
from runner.providers.gemini import GeminiProvider
from runner.providers.openai_servers import SimProvider
from tests.helpers import isolated_aws


def bounded(url: str, total: float) -> ProviderSettings:
    """The settings every case runs under: a MiB an answer, ``total`` seconds in all, five between bytes."""
    return ProviderSettings(base_url=url, max_answer_mb=1, total_timeout=total, timeout=5.0)


MESSAGES = [{"role": "user", "content": "Which number is 2 plus one?"}]


@pytest.fixture
async def hostile() -> AsyncIterator[tuple[HostileServer, str]]:
    state = HostileServer(bomb=64 * MIB)
    url = await state.start()
    yield state, url
    state.close()


class SDKSim(SimProvider):
    lean_wire: ClassVar[bool] = False


class SDKClaude(AnthropicProvider):
    lean_wire: ClassVar[bool] = False


class SDKBedrock(BedrockProvider):
    lean_wire: ClassVar[bool] = False


#: each path that reads answers: its name, and its provider for a base URL
PATHS: dict[str, Callable[[str, float], Provider]] = {
    "lean openai": lambda url, total: SimProvider(bounded(f"{url}/v1", total)),
    "openai SDK": lambda url, total: SDKSim(bounded(f"{url}/v1", total)),
    "lean anthropic": lambda url, total: AnthropicProvider(bounded(url, total)),
    "anthropic SDK": lambda url, total: SDKClaude(bounded(url, total)),
    "google-genai": lambda url, total: GeminiProvider(bounded(url, total)),
    "lean bedrock": lambda url, total: BedrockProvider(bounded(url, total)),
    "boto3": lambda url, total: SDKBedrock(bounded(url, total)),
}
MODELS = {"lean openai": "gpt-test", "openai SDK": "gpt-test", "lean anthropic": "claude-haiku-4-5",
          "anthropic SDK": "claude-haiku-4-5", "google-genai": "gemini-2.5-flash",
          "lean bedrock": "amazon.nova-pro-v1:0", "boto3": "amazon.nova-pro-v1:0"}
#: each hostile answer's error class, the total time its request is given, and the seconds it may take at most
#: (generous beside what each takes on a quiet machine, well under a second but the trickle's one: the suite runs
#: four test processes on two cores; without the bounds the endless body and the trickle never end)
CASES = {"endless": ("answer_too_large", 60.0, 20.0), "trickle": ("answer_too_slow", 1.0, 8.0),
         "bomb": ("answer_inflated_too_large", 60.0, 20.0), "brotli": ("malformed_response", 60.0, 20.0),
         "reset": ("connection", 60.0, 20.0)}
#: botocore reads answers as sent (urllib3 with decode_content=False): a coded one is refused unread
COMPRESSED_UNREAD = {("boto3", "bomb"): "malformed_response"}


async def _ask(provider: Provider, model: str) -> tuple[BaseException, float, int]:
    """The error of one request, its seconds, and the peak of memory it allocated (tracemalloc)."""
    began = time.monotonic()
    tracemalloc.start()
    try:
        await provider.execute(model, MESSAGES, {"max_tokens": 5, "temperature": 0})
    except Exception as exc:
        return exc, time.monotonic() - began, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    raise AssertionError("the hostile answer was taken")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", list(PATHS))
async def test_each_hostile_answer_fails_in_bounded_time_and_memory_with_its_own_class(
        hostile: tuple[HostileServer, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any, path: str,
        case: str) -> None:
    for variable in ("ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.setenv(variable, "test-key")
    isolated_aws(monkeypatch, tmp_path, "AKIATEST")
    state, url = hostile
    state.mode = case
    error_class, total, most = CASES[case]
    provider = PATHS[path](url, total)
    await provider.start()
    try:
        await _ask(provider, MODELS[path])  # the first also imports what the path imports on first use
        error, seconds, peak = await _ask(provider, MODELS[path])
    finally:
        await provider.aclose()
    error_class = COMPRESSED_UNREAD.get((path, case), error_class)
    assert isinstance(error, TransientError) and error.retryable, repr(error)
    assert error.error_class == error_class, f"{path}, {case}: {error!r} ({error.error_class})"
    assert seconds < most, f"{path}, {case}: {seconds:.1f} s"
    # the answer is read up to its bound (1 MiB) at most twice over (chunks, then joined), never its whole size
    assert peak < 8 * MIB, f"{path}, {case}: {peak / MIB:.1f} MiB at the peak"
    assert state.requests == 2  # sent once per call: the bound is the retry policy's to count


def test_an_inflater_stops_at_its_bound_without_inflating_further() -> None:
    inflater, bomb = Inflater(Bound(MIB, 60)), gzip_of_zeros(8 * MIB)
    with pytest.raises(OutOfBounds) as caught:
        for start in range(0, len(bomb), 4096):
            assert len(inflater.feed(bomb[start:start + 4096])) <= MIB
    assert caught.value.error_class == "answer_inflated_too_large" and inflater.size <= MIB + 1
    small = zlib.compress(b"x" * 1000)
    whole = Inflater(Bound(1000, 60))
    assert whole.feed(small[:5]) + whole.feed(small[5:]) + whole.end() == b"x" * 1000
    with pytest.raises(zlib.error):  # a body cut short of its end
        cut = Inflater(Bound(1000, 60))
        cut.feed(small[:-4])
        cut.end()


def test_downloads_of_batch_results_take_the_larger_bound() -> None:
    assert is_download("/v1/files/file-abc/content") and is_download("/v1/messages/batches/msgbatch_1/results")
    assert is_download("/download/v1beta/files/batch-1:download")
    assert not is_download("/v1/chat/completions") and not is_download("/v1/messages")
    bounds = bounds_of(ProviderSettings())
    assert bounds.of("/v1/files/f/content") == Bound(4096 * MIB, 3600, "max_download_mb")
    assert bounds.of("/v1/messages") == Bound(64 * MIB, 600, "max_answer_mb")
    # a download past its bound names its own setting
    assert "(max_download_mb)" in str(too_large(bounds.download)) and "(max_answer_mb)" in str(too_large(bounds.answer))


def test_a_bound_is_found_however_deep_an_sdk_wrapped_it() -> None:
    bound = OutOfBounds("answer_too_large", "too large")
    try:
        try:
            raise bound
        except OutOfBounds as exc:
            raise ConnectionError("wrapped") from exc
    except ConnectionError as outer:
        assert out_of_bounds(outer) is bound
    assert out_of_bounds(ValueError("x")) is None


def test_the_bounds_are_settings_with_defaults() -> None:
    settings = ProviderSettings()
    assert (settings.max_answer_mb, settings.max_download_mb, settings.answer_seconds()) == (64.0, 4096.0, 600.0)
    assert ProviderSettings(timeout=900).answer_seconds() == 900  # never below the time between bytes
    assert ProviderSettings(total_timeout=30).answer_seconds() == 30


def _job(tmp_path: Any, url: str, rows: int = 3) -> Any:
    import json

    from runner.spec.job import load_job
    from tests.helpers import write_rows

    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(json.dumps({
        "name": "hostile", "output_dir": str(tmp_path / "results"), "models": ["openai-compatible:raw/m"],
        "endpoints": {"raw": {"base_url": f"{url}/v1", "timeout": 5, "concurrency": 1, "max_answer_mb": 1}},
        "params": {"temperature": 0, "max_tokens": 5},
        "retry": {"max_attempts": 2, "backoff_initial": 0.01, "backoff_max": 0.02, "max_elapsed": 30},
        "stages": [{"name": "mc", "dataset": {"path": str(dataset)},
                    "prompt": {"user": "{{ question }}\n{{ options_block }}\nAnswer:"},
                    "choices": {"seeds": [0], "gold": "gold"}, "parse": "letter"}]}), encoding="utf-8")
    return load_job(job_file)


async def test_a_run_against_an_endless_body_fails_its_tasks_within_their_attempts(
        hostile: tuple[HostileServer, str], tmp_path: Any) -> None:
    """The issue's reproduction through the whole runner: an endless answer filled 4 GB in 48 s, and the run then
    ended ``completed``, exit 0, with tasks neither done nor failed. Now each attempt ends at the bound, each task
    fails after its two attempts, and the run fails."""
    from runner.engine.run import execute
    from runner.store import open_store

    state, url = hostile
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(_job(tmp_path, url), store)
    tasks = store.tasks(outcome.run_id)
    assert [t["status"] for t in tasks] == ["failed"] * 3, tasks
    assert {t["error_class"] for t in tasks} == {"answer_too_large"}
    assert state.requests == 3 * 2  # each request once per attempt
    assert store.get_run(outcome.run_id)["status"] == "failed"


@pytest.mark.parametrize("lose", [False, True])
async def test_a_run_is_completed_only_when_every_task_is_done_or_failed(tmp_path: Any, lose: bool) -> None:
    """ARCHITECTURE.md's invariant, checked by the run itself as it ends (``left_unanswered``): a task lost on its way
    to the store (here the store drops the first answer it is given to write) leaves the run failed, resumable, and
    never ``completed``; and the resume then completes it."""
    from runner.engine.run import execute
    from runner.store import open_store
    from simserver import SimConfig, start_server

    server = await start_server(SimConfig())
    store = open_store(tmp_path / "s.sqlite")
    if lose:
        write, dropped = store.write_finished, []

        def lossy(batch: list[Any]) -> list[Any]:
            if not dropped and batch:
                dropped.append(batch[0])
                batch = batch[1:]
            return write(batch)

        store.write_finished = lossy  # type: ignore[method-assign]
    try:
        job = _job(tmp_path, server.url.removesuffix("/v1"))
        outcome = await execute(job, store)
        run = store.get_run(outcome.run_id)
        statuses = [t["status"] for t in store.tasks(outcome.run_id)]
        if not lose:
            assert run["status"] == "completed" and statuses == ["done"] * 3
            return
        assert run["status"] == "failed", run["message"]
        assert "1 of its 3 tasks were neither answered nor failed" in run["message"], run["message"]
        store.write_finished = write  # type: ignore[method-assign]
        await execute(job, store, run_id=outcome.run_id)
        assert store.get_run(outcome.run_id)["status"] == "completed"
        assert [t["status"] for t in store.tasks(outcome.run_id)] == ["done"] * 3
    finally:
        await server.close()


@pytest.mark.parametrize("path", list(PATHS))
async def test_a_200_answer_with_nothing_in_it_is_malformed_not_an_empty_answer(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, path: str) -> None:
    """A server answering ``200 {}`` gave an empty completion on the OpenAI, Gemini and Bedrock paths: stored in
    the memo and scored as a wrong answer. Each API's published definition requires what carries the answer
    (OpenAI's ``choices``, Gemini's ``candidates`` unless ``promptFeedback`` says why none, Anthropic's ``content``,
    Converse's ``output`` and ``stopReason``): without it, the answer is malformed, retried, never stored."""
    from tests.helpers import scripted_server

    for variable in ("ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.setenv(variable, "test-key")
    isolated_aws(monkeypatch, tmp_path, "AKIATEST")
    async with scripted_server() as (url, answer, _):
        answer.update(status=200, body=b"{}")
        provider = PATHS[path](url, 60.0)
        await provider.start()
        try:
            with pytest.raises(TransientError) as caught:
                await provider.execute(MODELS[path], MESSAGES, {"max_tokens": 5, "temperature": 0})
        finally:
            await provider.aclose()
    assert caught.value.error_class == "malformed_response", repr(caught.value)


def test_a_urllib3_without_read1_is_read_within_the_bounds_too() -> None:
    """botocore takes urllib3 from 1.25 on; ``read1`` came later. Without it the body is read in small blocking
    reads, each checked against the bounds."""
    from runner.providers.bounded_boto import read_bounded

    class Endless:  # urllib3's HTTPResponse as older releases have it: read(), no read1()
        closed = False

        def read(self, amt: int, decode_content: bool) -> bytes:
            assert decode_content is False
            return b"a" * amt

        def close(self) -> None:
            self.closed = True

    raw = Endless()
    with pytest.raises(OutOfBounds, match=r"larger than 1 MiB \(max_answer_mb\)"):
        read_bounded(raw, Bound(MIB, 60), time.monotonic())
    assert raw.closed
    with pytest.raises(OutOfBounds, match="took longer than 5 s"):
        read_bounded(Endless(), Bound(10 * MIB, 5), time.monotonic() - 6)


def test_an_sdk_client_is_bounded_in_the_http_library_it_is_built_on() -> None:
    """The SDKs are built on httpx2, but openai before 3.0 (which pyproject.toml allows: `.ci/run --oldest`) on
    httpx, which asserts that an answer's stream is its own AsyncByteStream: a bounded client answers with its own
    library's Response and stream (with httpx2's, every openai 1.98 batch submit failed as a connection error)."""
    import anthropic
    import httpx2
    import openai

    from runner.providers.bounded_httpx import _stream_class, http_library

    for sdk in (openai, anthropic):
        http = http_library(sdk.DefaultAioHttpClient)
        assert http.__name__ in ("httpx", "httpx2")
        assert issubclass(sdk.DefaultAioHttpClient, http.AsyncClient)
        assert issubclass(_stream_class(http), http.AsyncByteStream)
    assert http_library(httpx2.AsyncClient) is httpx2
    with pytest.raises(TypeError, match="neither"):
        http_library(dict)

"""The lean wire's connections (``runner/providers/lean_http.py``) against a raw HTTP/1.1 server of the test's own
(asyncio streams), which answers as it is told: kept-alive connections are reused, one the server closed or reset is
a connection error and never sent again by the wire itself (the runner's retries count every send), chunked and gzip
answers are read whole, an answer cut short is a connection error, a request that waits too long a timeout."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from runner.errors import RateLimited, TransientError
from runner.providers.lean_http import LeanWire

OK = json.dumps({"choices": [{"message": {"content": "B"}, "finish_reason": "stop"}]}).encode()


class RawServer:
    """Counts connections and requests; ``respond(connection_index, request_index_on_it)`` gives the raw bytes to
    write back (None: close the connection without answering; ``(seconds, bytes, close)``: wait that long first,
    and close the connection after writing when ``close``)."""

    def __init__(self, respond: Callable[[int, int], bytes | None | tuple[float, bytes, bool]]) -> None:
        self.respond = respond
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                answer = self.respond(index, served)
                served += 1
                if answer is None:
                    break
                seconds, answer, close = answer if isinstance(answer, tuple) else (0.0, answer, False)
                await asyncio.sleep(seconds)
                writer.write(answer)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def plain(body: bytes = OK, status: str = "200 OK", extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            .encode() + body)


@pytest.fixture
async def raw() -> AsyncIterator[Callable[[Callable[..., Any]], Any]]:
    servers: list[asyncio.base_events.Server] = []

    async def start(respond: Callable[[int, int], Any]) -> tuple[RawServer, LeanWire]:
        state = RawServer(respond)
        server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return state, LeanWire(f"http://127.0.0.1:{port}/v1", "k", timeout=0.5)

    yield start
    for server in servers:
        server.close()


async def ask(wire: LeanWire) -> Any:
    answer = await wire.request("POST", "/chat/completions", {"model": "m", "messages": []}, where="srv",
                                key_variable="KEY")
    return json.loads(answer.content)


async def test_one_kept_alive_connection_serves_requests_one_after_another(raw) -> None:
    state, wire = await raw(lambda c, r: plain())
    for _ in range(20):
        assert (await ask(wire))["choices"][0]["message"]["content"] == "B"
    await wire.aclose()
    assert state.connections == 1 and len(state.requests) == 20
    first = state.requests[0]
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer k\r\n" in first and b"\r\nHost: 127.0.0.1:" in first
    assert first.endswith(b'{"model":"m","messages":[]}')


async def test_concurrent_requests_each_take_a_connection_and_give_it_back(raw) -> None:
    state, wire = await raw(lambda c, r: (0.01, plain(), False))
    for _ in range(3):
        await asyncio.gather(*(ask(wire) for _ in range(8)))
    await wire.aclose()
    assert state.connections == 8 and len(state.requests) == 24


async def test_a_kept_alive_connection_the_server_closed_is_a_connection_error_not_a_send_of_its_own(raw) -> None:
    # every connection answers its first request and closes at the second without answering: the wire does not
    # send it again by itself (the runner's retry policy does, and counts it: issue 41)
    state, wire = await raw(lambda c, r: plain() if r == 0 else None)
    await ask(wire)
    with pytest.raises(TransientError) as failed:
        await ask(wire)
    assert failed.value.error_class == "connection" and "Server disconnected" in str(failed.value)
    await ask(wire)  # the next goes on a new connection
    await wire.aclose()
    assert state.connections == 2 and len(state.requests) == 3


async def test_a_new_connection_closed_before_answering_is_a_connection_error(raw) -> None:
    state, wire = await raw(lambda c, r: None)
    with pytest.raises(TransientError) as failed:
        await ask(wire)
    assert failed.value.error_class == "connection" and "Server disconnected" in str(failed.value)
    assert state.connections == 1  # a fresh connection is not tried again: the runner's retry decides


async def test_an_answer_cut_short_is_a_connection_error(raw) -> None:
    state, wire = await raw(lambda c, r: (0.0, plain()[:-5], True))
    with pytest.raises(TransientError, match="connection failed") as failed:
        await ask(wire)
    assert failed.value.error_class == "connection"


async def test_chunked_and_gzip_answers_are_read_whole(raw) -> None:
    packed = gzip.compress(OK)
    chunked = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"".join(b"%x\r\n%s\r\n" % (len(OK[i:i + 7]), OK[i:i + 7]) for i in range(0, len(OK), 7))
               + b"0\r\n\r\n")
    answers = [chunked, plain(packed, extra="Content-Encoding: gzip\r\n")]
    state, wire = await raw(lambda c, r: answers[r])
    assert (await ask(wire))["choices"][0]["finish_reason"] == "stop"
    assert (await ask(wire))["choices"][0]["finish_reason"] == "stop"
    await wire.aclose()
    assert state.connections == 1


async def test_an_answer_slower_than_the_timeout_is_a_timeout(raw) -> None:
    state, wire = await raw(lambda c, r: (2.0, plain(), False))
    with pytest.raises(TransientError, match=r"timed out after 0\.5 s") as failed:
        await ask(wire)
    assert failed.value.error_class == "timeout"


async def test_an_error_answer_is_mapped_and_its_connection_kept(raw) -> None:
    body = json.dumps({"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}}).encode()
    state, wire = await raw(lambda c, r: plain(body, "429 Too Many Requests", "retry-after-ms: 250\r\n")
                            if r == 0 else plain())
    with pytest.raises(RateLimited) as limited:
        await ask(wire)
    assert limited.value.retry_after == pytest.approx(0.25)
    await ask(wire)
    await wire.aclose()
    assert state.connections == 1


async def test_an_answer_that_came_while_this_process_was_held_up_is_read_not_timed_out() -> None:
    """The answer comes 0.2 s after the request while this process's loop is held up for 2 s (as a stopped worker
    is): when the loop runs again the read's timer (0.5 s) is late, and the answer waiting in the socket is read
    rather than the request failing as a timeout and being sent, and paid for, again."""
    import socket
    import threading
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    requests: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            requests.append(conn.recv(65536))
            time.sleep(0.2)
            conn.sendall(plain())
            conn.recv(1)  # until the client closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    wire = LeanWire(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", "k", timeout=0.5)
    asyncio.get_running_loop().call_later(0.05, time.sleep, 2.0)  # the loop held up, as by SIGSTOP
    try:
        assert (await ask(wire))["choices"][0]["message"]["content"] == "B"
    finally:
        await wire.aclose()
        listener.close()
    assert len(requests) == 1


async def test_a_run_sends_a_request_reset_mid_answer_once_per_attempt_of_its_retry_policy(tmp_path) -> None:
    """Issue 41: a connection reset in the middle of an answer, on a kept-alive connection, was sent again by the
    wire besides the runner's retries (3 sends for 2 attempts). Through the whole runner: the first request is
    answered, every later one reset after half its answer, with ``max_attempts: 2``."""
    import socket
    import struct

    from runner.engine.run import execute
    from runner.spec.job import load_job
    from runner.store import open_store
    from tests.helpers import write_rows

    sends: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                sends.append(1)
                if len(sends) == 1:
                    writer.write(plain())
                    await writer.drain()
                    continue
                writer.write(plain()[:60])  # half an answer, then a reset (RST, not FIN)
                await writer.drain()
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                           struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    dataset = write_rows(tmp_path / "rows.jsonl", 3)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(json.dumps({
        "name": "resets", "output_dir": str(tmp_path / "results"), "models": ["openai-compatible:raw/m"],
        "endpoints": {"raw": {"base_url": f"http://127.0.0.1:{port}/v1", "timeout": 5, "concurrency": 1}},
        "params": {"temperature": 0, "max_tokens": 5},
        "retry": {"max_attempts": 2, "backoff_initial": 0.01, "backoff_max": 0.02, "max_elapsed": 30},
        "stages": [{"name": "mc", "dataset": {"path": str(dataset)},
                    "prompt": {"user": "{{ question }}\n{{ options_block }}\nAnswer:"},
                    "choices": {"seeds": [0], "gold": "gold"}, "parse": "letter"}]}), encoding="utf-8")
    store = open_store(tmp_path / "s.sqlite")
    try:
        outcome = await execute(load_job(job_file), store)
    finally:
        server.close()
    tasks = store.tasks(outcome.run_id)
    failed = [t for t in tasks if t["status"] == "failed"]
    assert len(tasks) == 3 and len(failed) == 2, tasks
    assert {t["error_class"] for t in failed} == {"connection"}
    assert len(sends) == 1 + 2 * 2, f"{len(sends)} sends: the 2 reset requests were sent beyond their 2 attempts"

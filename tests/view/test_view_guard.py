"""``runner view`` closed to other sites, with raw requests (tests/view/test_view_browser.py does the same in
Chromium): a ``Host`` that is not the viewer's own address is refused (DNS rebinding), a request without the token
is refused, the token in the URL becomes a cookie, and no answer gives another origin permission to read it."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from runner.store import open_store
from runner.view.app import make_app
from runner.view.guard import Guard, cookie_name

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "a-token-for-the-tests-only"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def guarded(view_runs) -> AsyncIterator[dict[str, Any]]:
    """The viewer with a token over the runs' store at a free port of 127.0.0.1; the lines it logged."""
    lines: list[str] = []
    runner = web.AppRunner(make_app(open_store(view_runs["db"]), Guard(TOKEN, log=lines.append)), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    yield {"base": f"http://127.0.0.1:{port}", "port": port, "lines": lines}
    await runner.cleanup()


async def get(url: str, **headers: str) -> tuple[int, dict[str, str], str]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers, allow_redirects=False) as got:
        return got.status, dict(got.headers), await got.text()


async def test_another_host_is_refused_even_with_the_token(guarded):
    base, port, lines = guarded["base"], guarded["port"], guarded["lines"]
    for host in (f"evil.example:{port}", f"127.0.0.1.evil.example:{port}", f"localhost:{port + 1}", "localhost",
                 f"127.0.0.2:{port}", f"[::2]:{port}", f"localhost.:{port}"):
        for path in ("/api/runs", "/", "/costs"):
            status, headers, text = await get(f"{base}{path}?token={TOKEN}", Host=host)
            assert status == 403, (host, path, text)
            assert "Set-Cookie" not in headers and "only at its own address" in text
            assert f"Host {host!r}" in "\n".join(lines)
    count = len(lines)
    await get(f"{base}/api/runs", Host=f"evil.example:{port}")
    assert len(lines) == count  # the same refusal again within a minute: not logged again
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
        status, _, text = await get(f"{base}/api/runs", Host=host, Authorization=f"token {TOKEN}")
        assert status == 200, (host, text)


async def test_a_request_without_the_token_is_refused_and_the_token_becomes_a_cookie(view_runs, guarded):
    base, port, lines = guarded["base"], guarded["port"], guarded["lines"]
    for path in ("/", "/api/runs", f"/runs/{view_runs['a']}", f"/api/runs/{view_runs['a']}/answers", "/costs",
                 "/static-does-not-exist"):
        for headers in ({}, {"Authorization": f"token {TOKEN}x"}, {"Cookie": f"{cookie_name(port)}=wrong"},
                        {"Cookie": f"{cookie_name(port + 1)}={TOKEN}"}):
            status, answer, text = await get(base + path, **headers)
            assert status == 403 and "asks for its token" in text, (path, headers, text)
            assert "Set-Cookie" not in answer
    assert "refused a request for /api/runs without the viewer's token" in "\n".join(lines)

    status, headers, _ = await get(f"{base}/costs?by=model&token={TOKEN}")
    assert status == 303 and headers["Location"] == "/costs?by=model"  # the token leaves the address bar
    cookie = headers["Set-Cookie"]
    assert re.match(rf"{cookie_name(port)}={TOKEN}; HttpOnly; Path=/; SameSite=Strict$", cookie), cookie
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:  # as a browser keeps it
        async with session.get(f"{base}/?token={TOKEN}") as first:  # follows the redirect with the cookie
            assert first.status == 200 and "token" not in str(first.url)
        async with session.get(f"{base}/api/runs") as later:
            assert later.status == 200 and len((await later.json())["runs"]) == 2
    status, _, text = await get(f"{base}/api/runs?token={TOKEN}")  # an API answer needs no redirect
    assert status == 200 and '"runs"' in text
    for scheme in ("token", "Bearer"):
        assert (await get(f"{base}/api/runs", Authorization=f"{scheme} {TOKEN}"))[0] == 200


async def test_no_answer_lets_another_origin_read_it(view_runs, guarded):
    base = guarded["base"]
    for path in ("/api/runs", "/", f"/api/runs/{view_runs['a']}/answers", "/api/runs/none/answers"):
        _, headers, _ = await get(base + path, Origin="http://evil.example", Authorization=f"token {TOKEN}")
        assert not any(name.lower().startswith("access-control-") for name in headers), headers
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
        assert headers["Referrer-Policy"] == "no-referrer"
    async with aiohttp.ClientSession() as session:
        async with session.options(f"{base}/api/runs", headers={
                "Origin": "http://evil.example", "Access-Control-Request-Method": "GET",
                "Authorization": f"token {TOKEN}"}) as preflight:
            assert preflight.status in (403, 405)
            assert not any(name.lower().startswith("access-control-") for name in preflight.headers)
    _, headers, _ = await get(f"{base}/", Authorization=f"token {TOKEN}")
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]


async def test_which_hosts_a_bind_serves():
    loopback = Guard("t")
    assert loopback.host_allowed("127.0.0.1:8431", 8431) and loopback.host_allowed("[::1]:8431", 8431)
    assert not loopback.host_allowed("127.0.0.1:8431", 8432)
    assert not loopback.host_allowed("192.168.1.9:8431", 8431) and not loopback.host_allowed(None, 8431)
    assert loopback.host_allowed("localhost", 80) and loopback.host_allowed("localhost:80", 80)
    lan = Guard("t", bound="192.168.1.9")
    assert lan.host_allowed("192.168.1.9:8431", 8431) and not lan.host_allowed("192.168.1.10:8431", 8431)
    anywhere = Guard("t", bound="0.0.0.0", allow=["lab-box.local"])
    # bound to every interface: any address written as digits (no page can rebind one), and the names allowed
    for host in ("10.0.0.7:8431", "[fe80::1]:8431", "lab-box.local:8431", "LAB-BOX.local:8431", "localhost:8431"):
        assert anywhere.host_allowed(host, 8431), host
    for host in ("evil.example:8431", "10.0.0.7.nip.io:8431", "lab-box.local:9999", "[::1:8431"):
        assert not anywhere.host_allowed(host, 8431), host


async def test_runner_view_prints_its_token_refuses_without_it_and_no_token_warns(view_runs):
    command = [sys.executable, "-m", "runner.cli", "view", "--db", str(view_runs["db"]), "--no-browser", "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = await asyncio.to_thread(process.stdout.readline)
        found = re.fullmatch(r"runner view: (http://127\.0\.0\.1:(\d+)/)\?token=([A-Za-z0-9_-]{43}) "
                             r"\(read-only; Ctrl-C stops it\)\n", line)
        assert found, line
        base, port, token = found.group(1), int(found.group(2)), found.group(3)
        assert (await get(f"{base}api/runs?token={token}"))[0] == 200
        assert (await get(f"{base}api/runs"))[0] == 403
        assert (await get(f"{base}api/runs?token={token}", Host=f"evil.example:{port}"))[0] == 403
        with socket.create_connection(("127.0.0.1", port)) as raw:  # a malformed request: one line, no traceback
            raw.sendall(b"GET / HTTP/1.1\r\nHost: x\n\r\n")
            raw.recv(1000)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=10)
    assert "Traceback" not in err, err
    assert "runner view: refused a request for /api/runs without the viewer's token\n" in err
    assert f"runner view: refused a request for /api/runs with Host 'evil.example:{port}'" in err
    assert re.search(r"^runner view: Error handling request.*: .+$", err, re.M), err

    process = subprocess.Popen([*command, "--no-token"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = await asyncio.to_thread(process.stdout.readline)
        found = re.fullmatch(r"runner view: (http://127\.0\.0\.1:(\d+)/) \(read-only; Ctrl-C stops it\)\n", line)
        assert found, line
        assert (await get(f"{found.group(1)}api/runs"))[0] == 200
        assert (await get(f"{found.group(1)}api/runs", Host="evil.example"))[0] == 403  # the Host check stays
    finally:
        process.terminate()
        _, err = process.communicate(timeout=10)
    assert err.startswith("runner view: --no-token: any program or user of this machine"), err

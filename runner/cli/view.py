"""``runner view``: the store's runs, answers, comparisons and costs in the browser; the web app is
runner/view/app.py, imported (with aiohttp.web and Jinja2) only when the command runs."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Annotated

import typer

from runner.cli.common import DbOption, later, open_db, say
from runner.errors import RunnerError

if TYPE_CHECKING:
    from aiohttp import web

asyncio = later("asyncio")
webbrowser = later("webbrowser")

__all__ = ["DEFAULT_PORT", "register", "serve", "view"]

DEFAULT_PORT = 8431


def register(app: typer.Typer) -> None:
    app.command()(view)


async def serve(runner: web.AppRunner, host: str, port: int, open_browser: bool, token: str | None = None) -> None:
    """Serve until interrupted; the URL (with the token, when there is one) is printed and opened once the socket
    listens."""
    from aiohttp import web

    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        if exc.errno == errno.EADDRINUSE:
            raise RunnerError(f"port {port} on {host} is in use: choose another with --port N") from None
        raise RunnerError(f"cannot listen on {host}:{port} ({exc.strerror}): choose another --host or --port") from None
    bound = runner.addresses[0][1] if runner.addresses else port
    url = f"http://{'[' + host + ']' if ':' in host else host}:{bound}/" + (f"?token={token}" if token else "")
    say(f"runner view: {url} (read-only; Ctrl-C stops it)")
    if open_browser:
        webbrowser.open(url)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def _one_line_server_errors() -> None:
    """aiohttp's server logs a malformed request (or a page's error) with its traceback; here it is one line."""
    import logging

    class OneLine(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            reason = f": {str(record.exc_info[1]).strip().splitlines()[0]}" if record.exc_info and record.exc_info[1] \
                else ""
            say(f"runner view: {record.getMessage()}{reason}", err=True)

    server_log = logging.getLogger("aiohttp.server")
    server_log.addHandler(OneLine(logging.WARNING))
    server_log.propagate = False


def view(
    db: DbOption = None,
    port: Annotated[int, typer.Option("--port", help="The port to listen on (0: any free one).")] = DEFAULT_PORT,
    host: Annotated[str, typer.Option("--host", help="The address to listen on; anything but 127.0.0.1 shows the "
                                      "store to other machines.")] = "127.0.0.1",
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Do not open the browser.")] = False,
    no_token: Annotated[bool, typer.Option("--no-token", help="Serve without the token the printed URL carries: "
                                           "any program or user of this machine may then read the store.")] = False,
    allow_host: Annotated[list[str] | None, typer.Option(
        "--allow-host", help="Serve this name too (say a machine name behind --host 0.0.0.0); only the address "
        "listened on, 127.0.0.1 and localhost otherwise. Repeat for several.")] = None,
) -> None:
    """A local, read-only web page of the store: every run (live progress of running ones), a run's report, its
    answers (searched, filtered), two runs or models compared item by item, and the costs. Only requests naming
    its own address and carrying the token of the URL it prints are answered."""
    from aiohttp import web  # aiohttp.web and Jinja2 only for this command: the runner starts without them

    from runner.view.app import make_app
    from runner.view.guard import Guard, new_token

    if not 0 <= port <= 65535:
        raise RunnerError(f"--port must be between 0 and 65535, not {port}")
    token = None if no_token else new_token()
    if no_token:
        say("runner view: --no-token: any program or user of this machine that reaches the port can read the store's "
            "runs, prompts and answers", err=True)
    guard = Guard(token, bound=host, allow=allow_host or (), log=lambda line: say(line, err=True))
    _one_line_server_errors()
    runner = web.AppRunner(make_app(open_db(db), guard), access_log=None)
    try:
        asyncio.run(serve(runner, host, port, not no_browser, token))
    except KeyboardInterrupt:  # Ctrl-C is how it stops
        say("runner view: stopped")

"""``runner view``: the store's runs, answers, comparisons and costs in the browser; the web app is
runner/view/app.py, imported (with aiohttp.web and Jinja2) only when the command runs."""

from __future__ import annotations

import asyncio
import errno
import webbrowser
from typing import TYPE_CHECKING, Annotated

import typer

from runner.cli.common import DbOption, open_db, say
from runner.errors import RunnerError

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["DEFAULT_PORT", "register", "serve", "view"]

DEFAULT_PORT = 8431


def register(app: typer.Typer) -> None:
    app.command()(view)


async def serve(runner: web.AppRunner, host: str, port: int, open_browser: bool) -> None:
    """Serve until interrupted; the URL is printed (and opened) once the socket listens."""
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
    url = f"http://{'[' + host + ']' if ':' in host else host}:{bound}/"
    say(f"runner view: {url} (read-only; Ctrl-C stops it)")
    if open_browser:
        webbrowser.open(url)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def view(
    db: DbOption = None,
    port: Annotated[int, typer.Option("--port", help="The port to listen on (0: any free one).")] = DEFAULT_PORT,
    host: Annotated[str, typer.Option("--host", help="The address to listen on; anything but 127.0.0.1 shows the "
                                      "store to other machines.")] = "127.0.0.1",
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Do not open the browser.")] = False,
) -> None:
    """A local, read-only web page of the store: every run (live progress of running ones), a run's report, its
    answers (searched, filtered), two runs or models compared item by item, and the costs."""
    from aiohttp import web  # aiohttp.web and Jinja2 only for this command: the runner starts without them

    from runner.view.app import make_app

    if not 0 <= port <= 65535:
        raise RunnerError(f"--port must be between 0 and 65535, not {port}")
    runner = web.AppRunner(make_app(open_db(db)), access_log=None)
    try:
        asyncio.run(serve(runner, host, port, not no_browser))
    except KeyboardInterrupt:  # Ctrl-C is how it stops
        say("runner view: stopped")

"""A simulated LLM provider that speaks the OpenAI, Anthropic and Gemini wire formats.

Point the official SDKs (or the runner) at it for tests, demos and benchmarks: it answers deterministically,
enforces per-model rate limits, injects the faults a real provider produces, counts what it received, and only
ever listens on its bind address (127.0.0.1 by default). Nothing here talks to the network.

The server lives in the :mod:`simserver` package (routes and the fault order in ``simserver.server``,
the answer and digest rule in ``simserver.answers``, rate limits in ``simserver.buckets``); this module
re-exports its API and is its command line.

Run it in-process with :func:`start_server`, blocking with :func:`serve`, or as
``python -m simserver --port 0 --rpm 600 --fault-503 0.1`` (prints one "listening" line).
``--script FILE`` loads a response script (:mod:`simserver.script`) that decides the answers' text; one
that cannot be loaded is reported in one line on stderr, with exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from simserver.answers import message_digest, simulated_reply
from simserver.config import FIELD_KINDS, SimConfig
from simserver.script import ScriptError
from simserver.server import SimServer, serve, start_server

__all__ = ["SimConfig", "SimServer", "main", "message_digest", "serve", "simulated_reply", "start_server"]


def main(argv: list[str] | None = None) -> None:
    """``python -m simserver``: every SimConfig field is a flag (``--fault-429 0.3``)."""
    parser = argparse.ArgumentParser(prog="python -m simserver",
                                     description="Simulated OpenAI, Anthropic and Gemini LLM server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    for f in dataclasses.fields(SimConfig):
        flag = "--" + f.name.replace("_", "-")
        if FIELD_KINDS[f.name] is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, type=FIELD_KINDS[f.name], default=f.default)
    parser.add_argument("--lenient", dest="strict", action="store_false",
                        help="take what the real APIs refuse (the same as --no-strict)")
    args = vars(parser.parse_args(argv))
    try:
        config = SimConfig(**{f.name: args[f.name] for f in dataclasses.fields(SimConfig)})
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    # ``serve`` is looked up here, in this module, so a test can replace ``simserver.serve``.
    try:
        serve(args["host"], args["port"], config)
    except ScriptError as exc:  # raised before the server listens
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        sys.exit(2)

"""``runner sim``: the simulated provider server (simserver/), started to dry-run a job with the ``sim:`` provider
without spending. The only place in runner/ that imports simserver."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.errors import RunnerError

__all__ = ["register", "sim"]


def register(app: typer.Typer) -> None:
    app.command()(sim)


def sim(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0 picks a free one).")] = 8765,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    latency: Annotated[float, typer.Option(help="Seconds added to each answer.")] = 0.0,
    rpm: Annotated[int | None, typer.Option(help="Requests per minute before 429s.")] = None,
    fault_429: Annotated[float, typer.Option("--fault-429", help="Fraction of requests answered 429.")] = 0.0,
    retry_after: Annotated[float, typer.Option(help="Seconds of Retry-After sent with each 429.")] = 0.2,
    fault_500: Annotated[float, typer.Option("--fault-500", help="Fraction of requests answered 500.")] = 0.0,
    fault_timeout: Annotated[float, typer.Option("--fault-timeout", help="Fraction that hang.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the fault dice (answers never depend on it).")] = 0,
    script: Annotated[Path | None, typer.Option(help="A response script: the answers' text by prompt template and "
                                                     "term (format in simserver/script.py).")] = None,
    models: Annotated[str | None, typer.Option(help="The only models the model lookups know (runner check), "
                                                    "comma-separated; default: every model.")] = None,
) -> None:
    """Start the simulated provider server, to dry-run a job with the `sim:` provider without spending."""
    from simserver import SimConfig, serve

    try:
        config = SimConfig(latency=latency, rpm=rpm, fault_429=fault_429, retry_after=retry_after,
                           fault_500=fault_500, fault_timeout=fault_timeout, seed=seed,
                           script=str(script) if script is not None else None, models=models)
    except (ValueError, TypeError) as exc:
        raise RunnerError(f"runner sim: {exc}") from None
    try:
        serve(host=host, port=port, config=config)
    except ValueError as exc:  # a response script that does not load
        raise RunnerError(f"runner sim: {exc}") from None
    except OSError as exc:
        raise RunnerError(f"runner sim cannot listen on {host}:{port} ({exc.strerror or exc}); "
                          "choose another --port") from None

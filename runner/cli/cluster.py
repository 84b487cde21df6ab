"""The ``runner`` command's cluster options, ``--ray [ADDRESS]`` and ``--workers N`` of ``submit`` and ``work``
(runner/cli/run.py): checked before anything is done, and the Ray cluster they join (runner/cluster/ray_workers.py,
imported only when --ray is given). Options, not commands: it registers none."""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from runner.errors import RunnerError

if TYPE_CHECKING:
    from runner.store import Store

__all__ = ["RayCommand", "RayOption", "WorkersOption", "check_ray", "ray_cluster", "ray_flag"]


class RayCommand(typer.core.TyperCommand):
    """A command whose ``--ray`` may come without a value: ``--ray`` alone is ``--ray local`` (click's options
    with an optional value are not available through typer)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, ray_flag(args))


def ray_flag(args: list[str]) -> list[str]:
    """``--ray`` not followed by an address ("auto", "local", or anything with a colon) becomes ``--ray=local``."""
    out = list(args)
    for i, arg in enumerate(out):
        following = out[i + 1] if i + 1 < len(out) else ""
        if arg == "--ray" and not (":" in following or following in ("auto", "local")):
            out[i] = "--ray=local"
    return out


RayOption = Annotated[
    str | None,
    typer.Option("--ray", help="Run the workers as Ray actors, which Ray places and starts again when one dies: "
                 "--ray alone uses RAY_ADDRESS's cluster or starts a Ray here; --ray ADDRESS joins that cluster "
                 "(auto, HOST:6379, ray://HOST:10001). Needs Ray: `pip install 'llm-job-runner\\[ray]'`.",
                 show_default=False),
]

WorkersOption = Annotated[
    int | None,
    typer.Option("--workers", help="How many Ray workers (with --ray; default 2).", show_default=False),
]


def check_ray(ray: str | None, workers: int | None, otherwise: str) -> None:
    """``--workers`` only with ``--ray``; with --ray, Ray installed (said before anything else is done)."""
    if workers is not None and ray is None:
        raise RunnerError(f"--workers starts Ray workers: add --ray (or {otherwise})")
    if ray is not None:
        from runner.cluster import ray_workers

        ray_workers.import_ray()
        ray_workers.check_workers(2 if workers is None else workers)


def ray_cluster(store: Store, ray: str | None, workers: int | None) -> AbstractContextManager[ModuleType | None]:
    """The Ray cluster of ``--ray`` (runner/cluster/ray_workers.py), joined and checked before the run is made;
    nothing without --ray."""
    from contextlib import nullcontext

    if ray is None:
        return nullcontext()
    from runner.cluster import ray_workers

    return ray_workers.cluster(store, ray, 2 if workers is None else workers)

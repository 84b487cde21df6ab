"""The simulated server's routes for the model lookups a pre-flight check asks (``runner check``) (issue 23: being
built)."""

from __future__ import annotations

from typing import Any


def add_routes(server: Any, app: Any) -> None:
    """Add this module's routes to ``app`` (``server`` is the :class:`~simserver.server.SimServer`): none yet."""

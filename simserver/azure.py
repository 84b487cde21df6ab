"""The simulated server's routes for Azure OpenAI's paths (deployments, ``api-version``) to the Chat Completions format
and its Batch API (issue 23: being built)."""

from __future__ import annotations

from typing import Any


def add_routes(server: Any, app: Any) -> None:
    """Add this module's routes to ``app`` (``server`` is the :class:`~simserver.server.SimServer`): none yet."""

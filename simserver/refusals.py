"""A refusal of strict mode (:mod:`simserver.strict`): why the real API would refuse a body, as the format's error
body carries it; and what the rules of the three APIs share (the published documents they are checked against, and
what a JSON number is)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from typing import Any


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the real API would refuse a body: what the format's error body carries."""

    message: str
    param: str | None = None
    code: str | None = None  #: OpenAI's error code (unsupported_parameter, unsupported_value, invalid_value...)
    status: int = 400


def published(name: str) -> dict[str, Any]:
    """One of the published documents extracted to ``simserver/published/`` (``scripts/extract_published.py``)."""
    return json.loads(files("simserver").joinpath("published", name).read_text())


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

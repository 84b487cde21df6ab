"""A scriptable in-process provider for engine tests: ``FakeProvider.behaviour`` decides each answer and
``FakeProvider.history`` records every call (model, messages, params, loop time)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, ClassVar

from runner.providers.base import Completion, Provider

Behaviour = Callable[[str, list[dict[str, str]], dict[str, Any], int], Completion | Exception | None]


class FakeProvider(Provider):
    name: ClassVar[str] = "fake"
    default_concurrency: ClassVar[int] = 8
    history: ClassVar[list[tuple[str, list[dict[str, str]], dict[str, Any], float]]] = []
    behaviour: ClassVar[Behaviour | None] = None
    latency: ClassVar[float] = 0.0

    @classmethod
    def reset(cls) -> None:
        cls.history = []
        cls.behaviour = None
        cls.latency = 0.0

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        loop = asyncio.get_running_loop()
        FakeProvider.history.append((model, messages, params, loop.time()))
        if FakeProvider.latency:
            await asyncio.sleep(FakeProvider.latency)
        outcome = FakeProvider.behaviour(model, messages, params, len(FakeProvider.history)) \
            if FakeProvider.behaviour else None
        if isinstance(outcome, Exception):
            raise outcome
        if isinstance(outcome, Completion):
            return outcome
        return Completion(text="A", finish_reason="stop", input_tokens=10, output_tokens=1, raw={"fake": True})

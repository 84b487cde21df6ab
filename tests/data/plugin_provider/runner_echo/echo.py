"""``echo:ANY``: answers with the last line of the request's last message, word for word."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from runner.providers.base import Completion, Provider


def last_line(messages: list[dict[str, Any]]) -> str:
    content = str(messages[-1].get("content") or "") if messages else ""
    lines = [line for line in content.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


class EchoProvider(Provider):
    name: ClassVar[str] = "echo"
    key_env_var: ClassVar[str | None] = None

    class Options(Provider.Options):
        #: put before every answer, to show a plug-in's own setting reaches it
        prefix: str = ""

    async def execute(self, model: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> Completion:
        text = self.options.prefix + last_line(messages)
        if os.environ.get("RUNNER_ECHO_LOG"):  # the tests count the requests that reached the provider
            with open(os.environ["RUNNER_ECHO_LOG"], "a", encoding="utf-8") as log:
                log.write(text + "\n")
        words = sum(len(str(m.get("content") or "").split()) for m in messages)
        return Completion(text=text, finish_reason="stop", input_tokens=words, output_tokens=len(text.split()))

"""``runner`` started with a fault the runner has no switch for, as a script for ``python -c SCRIPT ARGS``: the patch
is applied in that process before the runner's command line runs, so the runner's own code holds no test hook.
Shared by the tests and the seeded fault simulation (``scripts/chaos.py``).

- :data:`KILLED_AFTER_SUBMIT`: the Batch API clients die (SIGKILL) right after the provider accepted a batch, before
  the store records its id (before it is sent, with ``KILL_BEFORE_SUBMIT`` set): a batch accepted but not recorded.
- :data:`REFUSED_INPUT_FILE`: the first OpenAI-format batch input file a process sends names another model on its
  last line, so the provider refuses the file (OpenAI: one model per file) as it refuses a bad line.
- :data:`WITHOUT_FENCING`: fencing switched off (a lease is always held, in the engine and in the store): a broken
  guarantee, for showing that the seeded simulation catches it.
"""

from __future__ import annotations

__all__ = ["KILLED_AFTER_SUBMIT", "REFUSED_INPUT_FILE", "WITHOUT_FENCING", "killed_after_submit", "launcher"]

_MAIN = """
import sys
sys.argv = ["runner", *sys.argv[1:]]
from runner.cli import main
main()
"""


def launcher(*patches: str) -> str:
    """The script running ``runner ARGS`` after ``patches`` (Python source, applied in order)."""
    return "\n".join((*patches, _MAIN))


def killed_after_submit(*clients: str) -> str:
    """The patch killing a process right after its Batch API clients (``module.Class`` under ``runner.providers``)
    had a batch accepted (or before it is sent, with ``KILL_BEFORE_SUBMIT`` set)."""
    imports = "\n".join(f"from runner.providers import {client.split('.')[0]}" for client in clients)
    return f"""
import os, signal
{imports}

def dying(cls):
    submit = cls.submit

    async def accepted_then_killed(self, *args, **kwargs):
        if os.environ.get("KILL_BEFORE_SUBMIT"):
            os.kill(os.getpid(), signal.SIGKILL)
        await submit(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    cls.submit = accepted_then_killed

for cls in ({", ".join(clients)},):
    dying(cls)
"""


KILLED_AFTER_SUBMIT = killed_after_submit("openai_batch.OpenAIBatches", "anthropic_batch.AnthropicBatches",
                                          "gemini_batch.GeminiBatches")

REFUSED_INPUT_FILE = """
import json
from runner.providers.openai_batch import OpenAIBatches

_input_file = OpenAIBatches.input_file
_refused = []

def refused_once(self, model, lines):
    data = _input_file(self, model, lines)
    if _refused or len(lines) < 2:
        return data
    _refused.append(model)
    items = [json.loads(raw) for raw in data.decode().splitlines()]
    items[-1]["body"]["model"] = "another-model"
    return "".join(json.dumps(item) + "\\n" for item in items).encode()

OpenAIBatches.input_file = refused_once
"""

WITHOUT_FENCING = """
from runner.engine.workers import Crew
from runner.store.sql_workers import WorkerSQL

Crew.holds = lambda self, fence: True
WorkerSQL.holds = lambda self, tx, fence: True
"""

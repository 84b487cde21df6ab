"""Run a ``runner`` command in this process as the console script does, and end the process the moment it is about
to send its first answer request: bench/startup_providers.py's ``--instructions`` runs it under valgrind, so what is
counted is exactly the way to that request (a request stopped from outside would let the process run on for as long
as a signal takes to land, which under valgrind is long enough for a timer to start a tokenizer build).

    python -m bench.stop_at_first_answer MARKER runner-arguments...

MARKER is a piece of the answer request's path (``/chat/completions``, ``:generateContent``...). The lean wire's
``LeanWire.request`` is wrapped as its module is first imported; the process ends with ``os._exit(0)`` when a request
whose path holds MARKER is about to go, having printed ``first answer request`` to standard error. A command that
ends before such a request exits with 3.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

LEAN_WIRE = "runner.providers.lean_http"


def _wrap(module: ModuleType, marker: str) -> None:
    sent = module.LeanWire.request

    async def request(self: Any, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if marker in path:
            print(f"first answer request {method} {path}", file=sys.stderr, flush=True)
            os._exit(0)
        return await sent(self, method, path, *args, **kwargs)

    module.LeanWire.request = request


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the lean wire's request as its module is executed, then steps aside."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != LEAN_WIRE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.loader is not None
        run = spec.loader.exec_module
        marker = self.marker

        def exec_module(module: ModuleType) -> None:
            run(module)
            _wrap(module, marker)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def main() -> int:
    marker, arguments = sys.argv[1], sys.argv[2:]
    sys.meta_path.insert(0, _Finder(marker))
    sys.argv = ["runner", *arguments]
    from runner.cli import main as runner_main

    try:
        runner_main()
    except SystemExit as exc:
        print(f"the command ended (exit {exc.code}) before a request to a path with {marker}", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())

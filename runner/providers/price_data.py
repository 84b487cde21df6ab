"""genai-prices, imported without the HTTP client of its price updates.

genai-prices imports httpx2 as it loads (for ``UpdatePrices``, which fetches newer prices from the network). The
runner never asks for that: its prices are the installed snapshot's, so that a run's costs can be reproduced. The
client is most of what importing genai-prices costs (httpx2: about 0.04 s of CPU of some 0.1 s on this project's
machine, on the way to a paid model's first request), so :func:`load` lends genai-prices a stand-in for httpx2
while it imports: genai-prices only names the module at import and reads its attributes when it updates prices,
and the stand-in imports the real module the first time one of its attributes is read (PEP 562's module
``__getattr__``). (The standard library's ``LazyLoader`` would not do: the ``import httpx2`` statement itself reads
the module's ``__spec__``, which loads it.) The stand-in is taken back out of ``sys.modules`` afterwards, so whatever
imports httpx2 later (the SDKs) gets the real module as always; where httpx2 is imported already, genai-prices gets
that one.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["load"]

#: the HTTP client genai-prices imports for its network updates
UPDATE_CLIENT = "httpx2"


def load() -> ModuleType:
    """The ``genai_prices`` package, imported (once) without loading its update client."""
    loaded = sys.modules.get("genai_prices")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec(UPDATE_CLIENT) if UPDATE_CLIENT not in sys.modules else None
    if spec is None:  # imported already (or missing: genai-prices says so as it would)
        import genai_prices

        return genai_prices
    stand_in = _stand_in(spec)
    sys.modules[UPDATE_CLIENT] = stand_in
    try:
        import genai_prices
    finally:
        if sys.modules.get(UPDATE_CLIENT) is stand_in:
            del sys.modules[UPDATE_CLIENT]
    return genai_prices


def _stand_in(spec: ModuleSpec) -> ModuleType:
    """A module named as the update client that imports the real one when an attribute of it is first read."""
    stand_in = ModuleType(spec.name)
    stand_in.__spec__ = spec  # what an import statement reads of a module it finds imported

    def real(attribute: str) -> object:
        if sys.modules.get(spec.name) is stand_in:
            del sys.modules[spec.name]
        return getattr(importlib.import_module(spec.name), attribute)

    stand_in.__getattr__ = real  # type: ignore[method-assign]
    return stand_in

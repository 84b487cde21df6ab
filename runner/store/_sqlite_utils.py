"""sqlite-utils, imported without pandas.

sqlite-utils imports pandas at import time when it is installed (to insert pandas' types, which the store never
does): 30 MB and 0.3 s of every runner process. It is kept from doing so unless pandas is loaded already; pandas
stays importable afterwards (``runner.load_results`` uses it).
"""

from __future__ import annotations

import sys

_blocked = "pandas" not in sys.modules
if _blocked:
    sys.modules["pandas"] = None  # type: ignore[assignment]  # "import pandas" raises ImportError meanwhile
try:
    import sqlite_utils
finally:
    if _blocked:
        del sys.modules["pandas"]

__all__ = ["sqlite_utils"]

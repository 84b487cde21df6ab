"""sqlite-utils, imported without pandas and numpy.

sqlite-utils imports pandas and numpy at import time when they are installed (to insert their types, which the
store never does): 30 MB and 0.3 s for pandas, 0.06 s more for numpy. It is kept from doing so unless they are
loaded already; both stay importable afterwards (``runner.load_results`` uses pandas).
"""

from __future__ import annotations

import sys

_blocked = [name for name in ("pandas", "numpy") if name not in sys.modules]
for _name in _blocked:
    sys.modules[_name] = None  # type: ignore[assignment]  # "import pandas" raises ImportError meanwhile
try:
    import sqlite_utils
finally:
    for _name in _blocked:
        del sys.modules[_name]

__all__ = ["sqlite_utils"]

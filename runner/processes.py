"""This machine's processes, as the runs and workers in the store name them by pid: :func:`pid_alive`. Used by the
run service (a resume refused while its run's process lives), a resume's recovery (this machine's crashed workers)
and the reports (a run marked running whose process is gone)."""

from __future__ import annotations

import os
from typing import Any


def pid_alive(pid: Any) -> bool:
    """Whether process ``pid`` lives on this machine."""
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return False
    return True

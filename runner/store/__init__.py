"""The store: the memo, runs, tasks, the ledger and content-addressed stage results, behind one interface.

    base        :class:`Store`, the interface every backend implements, and the records it trades in.
    sqlite      :class:`SQLiteStore`, the embedded default (one file, WAL mode).
    writer      :class:`Writer`, the single task that commits a run's finished tasks in batches.
    migrations  the schema, as append-only migrations.

:func:`open_store` opens the store a command names (``--db`` or ``RUNNER_DB``, else ``cache.sqlite``).
"""

from __future__ import annotations

from pathlib import Path

from runner.store.base import CachedResponse, Finished, GroupSummary, Store, default_path, dumps, now
from runner.store.sqlite import SQLiteStore
from runner.store.writer import Writer

__all__ = ["CachedResponse", "Finished", "GroupSummary", "SQLiteStore", "Store", "Writer", "default_path", "dumps",
           "now", "open_store"]


def open_store(path: str | Path | None = None) -> Store:
    """The store at ``path`` (a file), or the default one."""
    return SQLiteStore(path)

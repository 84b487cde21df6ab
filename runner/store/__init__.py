"""The store: the memo, runs, tasks, the ledger and content-addressed stage results, behind one interface.

    base        :class:`Store`, the interface the engine uses, and the records it trades in.
    rows        :class:`TaskRow`, :class:`ResponseRow`, :class:`LedgerRow`: the rows the engine writes, typed.
    sql         :class:`SQLStore`: the queries of :class:`Store`, written once for both databases.
    dialect     what SQLite and PostgreSQL spell differently (placeholders, JSON, order, time stamps).
    reads       :class:`Reads`: the reports' questions (runner/report/*), written once.
    sqlite      :class:`SQLiteStore`, the embedded default (one file, WAL mode).
    postgres    :class:`PostgresStore`, a PostgreSQL database several processes and machines share.
    writer      :class:`Writer`, the single task that commits a run's finished tasks in batches.
    migrations  the schema, as append-only migrations, one list for both databases.

:func:`open_store` opens the store a command names (``--db`` or ``RUNNER_DB``, else ``cache.sqlite``): a
``postgresql://`` or ``postgres://`` URL opens a PostgreSQL store, anything else an SQLite file.
"""

from __future__ import annotations

import re
from pathlib import Path

from runner.store.base import CachedResponse, Finished, ReserveAsk, Store, default_path, dumps, now
from runner.store.reads import GroupSummary, Reads
from runner.store.rows import LedgerRow, ResponseRow, TaskRow
from runner.store.sqlite import SQLiteStore
from runner.store.writer import Writer

__all__ = ["CachedResponse", "Finished", "GroupSummary", "LedgerRow", "Reads", "ReserveAsk", "ResponseRow",
           "SQLiteStore", "Store", "TaskRow", "Writer", "default_path", "dumps", "now", "open_store"]


#: a PostgreSQL URL, also after a Path folded its "//" into "/" (group 2 is then empty)
_POSTGRES_URL = re.compile(r"^(postgres(?:ql)?):/(/?)")


def open_store(path: str | Path | None = None) -> Store:
    """The store at ``path`` (a file or a PostgreSQL URL), or the default one (``RUNNER_DB``, else cache.sqlite)."""
    where = str(path or default_path())
    match = _POSTGRES_URL.match(where)
    if match is None:
        return SQLiteStore(path)
    from runner.store.postgres import PostgresStore  # psycopg is imported only for a PostgreSQL store

    return PostgresStore(f"{match.group(1)}://" + where[match.end():] if not match.group(2) else where)

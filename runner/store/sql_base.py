"""What the store's shared queries stand on: :class:`SQLBase`, the primitives a backend gives (one statement each,
with ``?`` placeholders, and :meth:`SQLBase.atomic`, one transaction) and the :class:`Tx` a transaction's body
writes through. The queries are :class:`~runner.store.sql_workers.WorkerSQL` (the worker protocol's),
:class:`~runner.store.sql_batch_api.BatchAPISQL` (the Batch API's batches) and :class:`~runner.store.sql.SQLStore`
(the memo, runs, tasks, ledger and stage outputs), written once for SQLite and PostgreSQL; a backend
(:mod:`runner.store.sqlite`, :mod:`runner.store.postgres`) subclasses SQLStore.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from runner.store.base import Store
from runner.store.dialect import Dialect

__all__ = ["Cursor", "SQLBase", "T", "Tx", "insert_sql", "upsert"]


def insert_sql(table: str, columns: tuple[str, ...], tail: str = "") -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)}){tail}"


def upsert(table: str, columns: tuple[str, ...], key: tuple[str, ...]) -> str:
    """Insert a row, or replace the columns of the row with the same ``key`` (both databases' ON CONFLICT)."""
    rest = [c for c in columns if c not in key]
    return insert_sql(table, columns, f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET "
                      + ", ".join(f"{c} = excluded.{c}" for c in rest))


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Tx(Protocol):
    """A transaction's statements, with ``?`` placeholders (sqlite3's Connection is one)."""

    def execute(self, sql: str, args: Any = ()) -> Cursor: ...

    def executemany(self, sql: str, rows: Any) -> Any: ...


T = TypeVar("T")


class SQLBase(Store):
    """A store on a SQL database: subclasses set :attr:`dialect` and :attr:`task_sql` and provide the primitives
    below (each one statement, its own transaction) and :meth:`atomic`."""

    dialect: Dialect
    #: a finished task's row, replacing the row of a task run again (a new place in the run's order)
    task_sql: str
    #: the task table's columns, without PostgreSQL's seq
    task_columns: str

    # -- primitives ------------------------------------------------------------------------------------------
    def rows(self, sql: str, args: Any = ()) -> list[tuple]:
        raise NotImplementedError

    def row(self, sql: str, args: Any = ()) -> tuple | None:
        raise NotImplementedError

    def execute(self, sql: str, args: Any = ()) -> int:
        """One statement; its row count."""
        raise NotImplementedError

    def dicts(self, sql: str, args: Any = ()) -> list[dict[str, Any]]:
        raise NotImplementedError

    def stream(self, sql: str, args: Any = ()) -> Iterator[tuple]:
        """A query's rows, fetched as they are read: memory does not grow with the result."""
        raise NotImplementedError

    def atomic(self, body: Callable[[Tx], T]) -> T:
        """``body`` in one transaction that holds the write lock (SQLite) or is run again when the server chose it as
        a deadlock's victim (PostgreSQL)."""
        raise NotImplementedError

"""What SQLite and PostgreSQL spell differently, as data: the store's queries are written once
(:mod:`runner.store.sql`, :mod:`runner.store.reads`, :mod:`runner.store.migrations`) with ``?`` placeholders and
these fragments, and each backend's :class:`Dialect` turns them into its own SQL.

Why SQL text and not SQLAlchemy Core: the hot path (the writer's batches, the memo lookups) runs the same few
statements hundreds of thousands of times; a shared text costs nothing per statement on SQLite (the text is
SQLite's own) and one cached string conversion on PostgreSQL, adds no dependency, and measured faster than
SQLAlchemy Core on that path (bench/RESULTS.md, "One query layer for both stores").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner.lazy_re import lazy_compile
from runner.store.base import dumps

_PATH_PART = lazy_compile(r'\.(?:"([^"]*)"|([^.\[]+))|\[(\d+)\]')


def _json_path_list(path: str) -> list[str]:
    """A SQLite JSON path (``$.variant.shots``, ``$.a[0]``) as the text[] of PostgreSQL's ``#>``."""
    if not path.startswith("$"):
        raise ValueError(f"bad JSON path {path!r}")
    parts, rest = [], path[1:]
    while rest:
        match = _PATH_PART.match(rest)
        if match is None:
            raise ValueError(f"bad JSON path {path!r}")
        parts.append(next(g for g in match.groups() if g is not None))
        rest = rest[match.end():]
    return parts


def _pg_scalar(value: str) -> str:
    """SQLite's json_extract of a jsonb ``value``: true/false as 1/0 and JSON null as NULL."""
    return (f"(CASE jsonb_typeof({value}) WHEN 'boolean' THEN to_jsonb(({value})::boolean::int)"
            f" WHEN 'null' THEN NULL ELSE {value} END)")


def _pg_json_type(value: str) -> str:
    """SQLite's json_type of a jsonb ``value`` (integer, real, text, true, false, null, object, array)."""
    return (f"(CASE jsonb_typeof({value}) WHEN 'number' THEN CASE WHEN ({value})::text ~ '^-?[0-9]+$'"
            f" THEN 'integer' ELSE 'real' END WHEN 'string' THEN 'text' WHEN 'boolean' THEN ({value})::text"
            f" ELSE jsonb_typeof({value}) END)")


def _pg_json_path(path: str) -> str:
    """A constant SQLite JSON path as a PostgreSQL text[] literal."""
    return "ARRAY[" + ", ".join("'" + part.replace("'", "''") + "'" for part in _json_path_list(path)) + "]::text[]"


def _pg_json_argument(value: Any) -> Any:
    from psycopg.types.json import Jsonb  # psycopg is imported only for a PostgreSQL store

    return Jsonb(int(value) if isinstance(value, bool) else value)


@dataclass(frozen=True, eq=False)  # hashed by identity: the cache of converted texts is keyed by it
class Dialect:
    """One database's spelling of what the shared queries need."""

    name: str
    #: the SQL text the backend runs for a shared text (``?`` placeholders)
    convert: Callable[[str], str]
    #: the time of the statement as ISO text, as SQLite's strftime('%Y-%m-%dT%H:%M:%fZ', 'now') gives it
    stamp: str
    #: the column that orders a run's tasks as they were (last) written
    task_order: str
    #: the ORDER BY of "any one task" (SQLite: none, the index's first)
    any_task_order: str
    #: what follows a text column in ORDER BY (or min()) for code point order
    text_order: str
    #: ``{0}`` contains the text ``{1}``
    contains: str
    #: what follows the fence check (fencing.HELD_SQL) in a write transaction
    hold_lock: str
    #: a list of values is one parameter (PostgreSQL's ``= ANY(?)``), or as many as values (SQLite's ``IN``)
    one_parameter_list: bool
    #: a truth value as 1, 0 or NULL
    as_int: str
    #: the value at a JSON path given as a parameter (``?``: :meth:`json_path`) of JSON text ``{0}``, to select
    json_at: str
    #: a column selected with :attr:`json_at` as SQLite's json_extract returns it (true as 1, JSON null as NULL)
    json_scalar: Callable[[str], str]
    #: the value at a constant JSON path ``{1}`` of JSON text ``{0}``, as json_extract returns it
    json_const: Callable[[str, str], str]
    #: the JSON type at a constant path, as SQLite's json_type names it
    json_type_const: Callable[[str, str], str]
    #: the JSON number 1, to compare a :attr:`json_const` with
    json_one: str
    #: the bare value of a grouped column, taken from the group's first task
    first_of_group: Callable[[str], str]
    #: the parameter of :attr:`json_at` for a SQLite JSON path (``$.variant.seed``)
    json_path: Callable[[str], Any]
    #: the parameter to compare a :attr:`json_scalar` with a Python value
    json_argument: Callable[[Any], Any]

    def sql(self, text: str) -> str:
        return _converted(self, text)

    def in_list(self, column: str, values: list[Any]) -> tuple[str, list[Any]]:
        """``column`` is one of ``values``: the condition and its parameters."""
        if self.one_parameter_list:
            return f"{column} = ANY(?)", [list(values)]
        return f"{column} IN ({', '.join('?' * len(values))})", list(values)


@functools.lru_cache(maxsize=1024)
def _converted(dialect: Dialect, text: str) -> str:
    return dialect.convert(text)


_PG_MARKS = lazy_compile(r"'(?:[^']|'')*'|[?%]")


def _pg_convert(text: str) -> str:
    """``?`` as psycopg's ``%s`` and ``%`` as ``%%``, outside quoted literals (a regular expression may hold ``?``)."""
    return _PG_MARKS.sub(lambda m: {"?": "%s", "%": "%%"}.get(m.group(0), m.group(0).replace("%", "%%")), text)


def _pg_const(column: str, path: str) -> str:
    return f"({column}::jsonb #> {_pg_json_path(path)})"


SQLITE = Dialect(
    name="sqlite",
    convert=lambda text: text,
    stamp="strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    task_order="rowid",
    any_task_order="",
    text_order="",
    contains="instr({0}, {1}) > 0",
    hold_lock="",
    one_parameter_list=False,
    as_int="({0})",
    json_at="json_extract({0}, ?)",
    json_scalar=lambda column: column,
    json_const=lambda column, path: f"json_extract({column}, '{path}')",
    json_type_const=lambda column, path: f"json_type({column}, '{path}')",
    json_one="1",
    first_of_group=lambda column: column,
    json_path=lambda path: path,
    json_argument=lambda value: value,
)

POSTGRES = Dialect(
    name="postgres",
    convert=_pg_convert,
    stamp="to_char(clock_timestamp() at time zone 'utc', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')",
    task_order="seq",
    any_task_order=" ORDER BY seq",
    text_order=' COLLATE "C"',
    contains="strpos({0}, {1}) > 0",
    # the lease row stays locked against a takeover until the write commits
    hold_lock=" FOR SHARE",
    one_parameter_list=True,
    as_int="({0})::int",
    json_at="{0}::jsonb #> ?::text[]",
    json_scalar=_pg_scalar,
    json_const=lambda column, path: _pg_scalar(_pg_const(column, path)),
    json_type_const=lambda column, path: _pg_json_type(_pg_const(column, path)),
    json_one="'1'::jsonb",
    first_of_group=lambda column: f"(array_agg({column} ORDER BY seq))[1]",
    json_path=_json_path_list,
    json_argument=_pg_json_argument,
)


def sql_value(value: Any) -> Any:
    """A JSON value as SQLite's json_extract returns it: an object or array as its compact text, true as 1."""
    if isinstance(value, dict | list):
        return dumps(value)
    if isinstance(value, bool):
        return int(value)
    return value


def zero(total: Any) -> Any:
    """SQLite's coalesce(sum(x), 0): the sum, or the integer 0 when there was nothing to add."""
    return 0 if total is None else total


def _order(value: Any) -> tuple:
    """SQLite's sort order: NULL, then numbers, then text (byte order, which is code point order)."""
    if value is None:
        return (0, 0)
    if isinstance(value, int | float):
        return (1, value)
    return (2, str(value))


def sqlite_sorted(rows: list[tuple], width: int) -> list[tuple]:
    """Rows of a grouped query in the order SQLite returns them: by their first ``width`` columns."""
    return sorted(rows, key=lambda row: tuple(_order(v) for v in row[:width]))


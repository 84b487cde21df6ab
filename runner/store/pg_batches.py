"""Many rows in one statement for PostgreSQL, never in a pipeline inside a transaction.

psycopg's ``executemany`` sends its statements in pipeline mode: the statements go out together and the Sync that
ends them goes last. A process stopped (SIGSTOP, swapped out) between the two leaves its session *active*, waiting
for the rest of the pipeline, with the row locks its statements took: ``idle_in_transaction_session_timeout`` never
fires for an active session, so every other worker waiting on those rows waits until the process wakes
(ARCHITECTURE.md invariant 8). So a transaction's batch of rows is sent as ordinary statements, each ending in its
own Sync: after each one the session is *idle in transaction*, and the server ends it past the bound.

An ``INSERT ... VALUES (...)`` becomes one multi-row ``VALUES`` statement per :data:`MAX_PARAMETERS` parameters
(one round trip instead of one per row). A ``DO UPDATE`` upsert may not touch one row twice in a statement, so of the
rows with the same conflict key only the last is kept, in the last one's place, which is what running them one after
another leaves (the task table's order included). A
``DELETE ... WHERE column = ?`` of one parameter becomes ``= ANY(?)``. Any other statement runs row by row.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

#: PostgreSQL's bound on the parameters of one statement (the protocol counts them in 16 bits)
MAX_PARAMETERS = 65_535

_INSERT = re.compile(r"^\s*INSERT INTO (\w+) \(([^)]*)\) VALUES ", re.IGNORECASE)
_CONFLICT_UPDATE = re.compile(r"\bON CONFLICT \(([^)]*)\) DO UPDATE\b", re.IGNORECASE)
_DELETE_ONE = re.compile(r"^\s*DELETE FROM (\w+) WHERE (\w+) = \?\s*$", re.IGNORECASE)


def _values_group(sql: str, start: int) -> int:
    """The index just past the parenthesised group that opens at ``sql[start]`` (quotes and nesting respected)."""
    depth, index, quoted = 0, start, False
    while index < len(sql):
        char = sql[index]
        if quoted:
            quoted = char != "'"
        elif char == "'":
            quoted = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    raise ValueError(f"unbalanced VALUES group in {sql!r}")


def batched(sql: str, rows: Iterable[Sequence[Any]]) -> list[tuple[str, list[Any]]]:
    """The statements (with their parameters, in ``?`` spelling) that do what running ``sql`` once per row does."""
    rows = [tuple(row) for row in rows]
    if not rows:
        return []
    insert = _INSERT.match(sql)
    if insert is not None:
        opening = insert.end()
        closing = _values_group(sql, opening)
        head, group, tail = sql[:opening], sql[opening:closing], sql[closing:]
        width = group.count("?")
        # rows of another width run one by one, where the database refuses them with its own error
        if all(len(row) == width for row in rows) and "RETURNING" not in tail.upper():
            conflict = _CONFLICT_UPDATE.search(tail)
            if conflict is not None:
                columns = [c.strip() for c in insert.group(2).split(",")]
                key = [columns.index(c.strip()) for c in conflict.group(1).split(",")]
                last: dict[tuple[Any, ...], tuple[Any, ...]] = {}
                for row in rows:  # a later row replaces an earlier one, in the later one's place (its order)
                    last.pop(conflict_key := tuple(row[i] for i in key), None)
                    last[conflict_key] = row
                rows = list(last.values())
            per_statement = max(1, MAX_PARAMETERS // max(1, width))
            return [(head + ", ".join([group] * len(part)) + tail, [value for row in part for value in row])
                    for part in (rows[i:i + per_statement] for i in range(0, len(rows), per_statement))]
    delete = _DELETE_ONE.match(sql)
    if delete is not None and len(rows[0]) == 1:
        return [(f"DELETE FROM {delete.group(1)} WHERE {delete.group(2)} = ANY(?)", [[row[0] for row in rows]])]
    return [(sql, list(row)) for row in rows]


def execute_batched(execute: Callable[[str, Sequence[Any]], Any], sql: str, rows: Iterable[Sequence[Any]]) -> None:
    """Run ``sql`` for every row through ``execute`` (one statement at a time), as :func:`batched` groups them."""
    for statement, parameters in batched(sql, rows):
        execute(statement, parameters)

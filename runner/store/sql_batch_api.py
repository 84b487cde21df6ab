"""The Batch API's records, written once for SQLite and PostgreSQL: :class:`BatchAPISQL` keeps each batch a run
submitted (its provider's id, its round and state) and its lines (each request's key, its reservation in the ledger
and its status), from the intent written before the provider is asked to the batch collected
(runner/engine/batch_records.py writes them). :class:`~runner.store.sql.SQLStore` is one.
"""

from __future__ import annotations

from typing import Any

from runner.store.base import now
from runner.store.dialect import sqlite_sorted
from runner.store.sql_base import SQLBase, Tx, upsert

__all__ = ["BatchAPISQL"]


class BatchAPISQL(SQLBase):
    """The Batch API's batches and their lines (see the module's docstring)."""

    def record_batch(self, batch_id: str, run_id: str, stage: str, model: str, provider_batch_id: str | None,
                     round: int, lines: list[tuple[str, int | None]], *, state: str = "running") -> None:
        def body(tx: Tx) -> None:
            tx.execute("INSERT INTO batches (id, run_id, stage, model, provider_batch_id, round, state,"
                       " provider_state, lines, created, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (batch_id, run_id, stage, model, provider_batch_id, round, state,
                        "submitted" if state == "running" else state, len(lines), now(), now()))
            tx.executemany(upsert("batch_lines", ("batch_id", "key", "ledger_id", "status"), ("batch_id", "key")),
                           [(batch_id, key, ledger, "pending") for key, ledger in lines])
        self.atomic(body)

    def open_batches(self, run_id: str, stage: str) -> list[dict[str, Any]]:
        c = self.dialect.text_order
        found = self.dicts("SELECT * FROM batches WHERE run_id = ? AND stage = ? AND state != 'collected'"
                           f" ORDER BY created{c} NULLS FIRST, id{c}", (run_id, stage))
        for batch in found:
            batch["lines"] = {key: (ledger, status) for key, ledger, status in self.rows(
                f"SELECT key, ledger_id, status FROM batch_lines WHERE batch_id = ? ORDER BY key{c}", (batch["id"],))}
        return found

    def update_batch(self, batch_id: str, **fields: Any) -> None:
        fields.setdefault("updated", now())
        assignments = ", ".join(f"{name} = ?" for name in fields)
        self.execute(f"UPDATE batches SET {assignments} WHERE id = ?", (*fields.values(), batch_id))

    def finish_batch(self, batch_id: str, statuses: dict[str, str]) -> None:
        def body(tx: Tx) -> None:
            tx.executemany("UPDATE batch_lines SET status = ? WHERE batch_id = ? AND key = ?",
                           [(status, batch_id, key) for key, status in statuses.items()])
            tx.execute("UPDATE batches SET state = 'collected', updated = ? WHERE id = ?", (now(), batch_id))
        self.atomic(body)

    def drop_batch(self, batch_id: str) -> None:
        def body(tx: Tx) -> None:
            tx.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))
            tx.execute("DELETE FROM batches WHERE id = ?", (batch_id,))
        self.atomic(body)

    def batches(self, run_id: str) -> list[dict[str, Any]]:
        c = self.dialect.text_order
        found = self.dicts(f"SELECT * FROM batches WHERE run_id = ? ORDER BY created{c} NULLS FIRST, id{c}",
                           (run_id,))
        for batch in found:
            batch["by_status"] = dict(sqlite_sorted(self.rows(
                "SELECT status, count(*) FROM batch_lines WHERE batch_id = ? GROUP BY status", (batch["id"],)), 1))
        return found

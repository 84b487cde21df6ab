"""A PostgreSQL session lost at a transaction's COMMIT: the store asks the server what became of the transaction
(runner/store/postgres.py), so a write is applied exactly once whether the COMMIT reached the server or not.

The cut is made by a TCP relay between the store and the server that, once armed, sees the client's COMMIT go by
and then closes both sides: either after the server has answered (the transaction committed, the answer lost) or
before the COMMIT is passed on (it did not)."""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Iterator
from contextlib import suppress
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from runner.store import open_store

#: the message psycopg sends to end a transaction: a simple query ('Q', its length, the text and a NUL), or in a
#: psycopg from before its pull request 820 (May 2024; the floor, 3.1, is one) an extended-protocol Parse ('P', its
#: length, the unnamed statement's empty name, the text, no parameter types), its Bind, Execute and Sync sent with it
COMMITS = (b"Q\x00\x00\x00\x0bCOMMIT\x00", b"P\x00\x00\x00\x0e\x00COMMIT\x00\x00\x00")


class CommitCutter:
    """A relay to the server at ``target``. ``arm(deliver)`` cuts the next connection's stream at its COMMIT:
    with ``deliver`` the server gets the COMMIT and its answer is dropped, without it the COMMIT is dropped."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed: bool | None = None  # None: pass everything; True/False: cut at COMMIT, delivering it or not
        self.cuts = 0
        self.held: list[socket.socket] = []
        self.hold = True
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, deliver: bool, hold: bool = True) -> None:
        """``hold``: an undelivered COMMIT's server side stays open (a network cut: its transaction waits, in
        progress); otherwise it is closed (the session ends and its transaction rolls back)."""
        self.armed, self.hold = deliver, hold

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client, socket.create_connection(self.target)),
                             daemon=True).start()

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        """Both directions in one thread, so that nothing of the server's answer to a cut COMMIT slips through."""
        with client, server:
            while True:
                readable, _, _ = select.select([client, server], [], [])
                if server in readable:
                    if not (data := server.recv(65536)):
                        return
                    client.sendall(data)
                if client in readable:
                    if not (data := client.recv(65536)):
                        return
                    if self.armed is not None and any(commit in data for commit in COMMITS):
                        self._cut(data, client, server)
                        return
                    server.sendall(data)

    def _cut(self, data: bytes, client: socket.socket, server: socket.socket) -> None:
        deliver, self.armed = self.armed, None
        if deliver:
            server.sendall(data)
            server.settimeout(10)
            server.recv(65536)  # the server's answer (committed), dropped
        elif self.hold:
            self.held.append(server.dup())
        self.cuts += 1
        client.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread; a close alone would not
        self.listener.close()
        for sock in self.held:
            sock.close()


@pytest.fixture
def relayed(pg_url: str) -> Iterator[tuple[Any, CommitCutter]]:
    """A PostgreSQL store reached through a :class:`CommitCutter`, with a table of one counter."""
    parts = urlsplit(pg_url)
    cutter = CommitCutter((parts.hostname or "127.0.0.1", parts.port or 5432))
    netloc = parts.netloc.rsplit(":", 1)[0] + f":{cutter.port}"
    store = open_store(urlunsplit(parts._replace(netloc=netloc)))
    store.execute("CREATE TABLE counter (n integer NOT NULL)")
    store.execute("INSERT INTO counter VALUES (0)")
    try:
        yield store, cutter
    finally:
        store.close()
        cutter.close()


def counter(store: Any) -> int:
    return store.row("SELECT n FROM counter")[0]


@pytest.mark.parametrize("delivered", [True, False], ids=["committed", "not-committed"])
def test_a_single_write_cut_at_its_commit_is_applied_once(relayed, delivered):
    store, cutter = relayed
    cutter.arm(deliver=delivered)
    assert store.execute("UPDATE counter SET n = n + 1") == 1
    assert cutter.cuts == 1
    assert counter(store) == 1


@pytest.mark.parametrize("delivered", [True, False], ids=["committed", "not-committed"])
def test_a_transaction_cut_at_its_commit_returns_what_it_found_and_is_applied_once(relayed, delivered):
    store, cutter = relayed
    cutter.arm(deliver=delivered)
    found = store.atomic(lambda tx: tx.execute("UPDATE counter SET n = n + 1 RETURNING n").fetchone()[0])
    assert cutter.cuts == 1
    assert found == 1 and counter(store) == 1


def test_a_read_only_transaction_cut_at_its_commit_returns_what_it_read(relayed):
    store, cutter = relayed
    cutter.arm(deliver=True)
    assert store.atomic(lambda tx: tx.execute("SELECT n FROM counter").fetchone()[0]) == 0
    assert cutter.cuts == 1


def test_a_server_that_does_not_come_back_after_the_cut_is_said(relayed):
    store, cutter = relayed
    store._wait = 0.3
    cutter.arm(deliver=True)
    cutter.close()  # no new connection: the outcome cannot be learnt
    with pytest.raises(psycopg.OperationalError) as raised:
        store.execute("UPDATE counter SET n = n + 1")
    assert store.failure(raised.value, "RUN").startswith(f"the PostgreSQL store {store.path} went away")


@pytest.mark.parametrize("delivered", [True, False], ids=["committed", "not-committed"])
def test_after_a_server_restart_only_a_rollback_is_trusted(relayed, monkeypatch, delivered):
    """The server restarted between the cut and the question (here: its start time read as another): after a
    crash a transaction id may be given again, so 'committed' is not believed (the call fails, the run ends
    resumable); a transaction that did not commit runs again."""
    import runner.store.postgres as postgres

    store, cutter = relayed
    monkeypatch.setattr(postgres, "_STARTED_SQL", "SELECT clock_timestamp()")
    cutter.arm(deliver=delivered, hold=False)  # a restart ends every session
    if delivered:
        with pytest.raises(psycopg.OperationalError) as raised:
            store.execute("UPDATE counter SET n = n + 1")
        assert "went away" in (store.failure(raised.value, "RUN") or "")
    else:
        assert store.execute("UPDATE counter SET n = n + 1") == 1
    assert counter(store) == 1

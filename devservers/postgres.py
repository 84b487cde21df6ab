"""A throwaway PostgreSQL server for the tests and bench/workers.py: one per pytest session, a fresh schema per test.

The server is Debian's (``/usr/lib/postgresql/<version>/bin``), started with ``initdb`` and ``pg_ctl`` in a temporary
folder, listening on 127.0.0.1 on a free port and on a Unix socket in that folder, without fsync and full page writes (a
test server need not survive the machine's crash) but with synchronous commit: a commit it acknowledged survives
the crash of its own processes (``restart``, as the fault simulation does), as on a real server; without it, a
commit acknowledged less than a second before an immediate stop is lost. PostgreSQL refuses
to run as root, so under root the binaries run as the ``postgres`` OS user.

Local connections are trusted, except for the role :data:`PASSWORD_ROLE`, which must give its password
(:data:`PASSWORD`) over TCP: the wrong-credentials test needs one role that checks.

A test's store lives in its own schema of one shared database (``options=-csearch_path=...`` in the URL), which is
much faster than ``CREATE DATABASE`` per test and keeps tests from seeing each other's rows;
:meth:`PgServer.new_database` makes a whole new database where a test needs one.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

#: a role that must authenticate with a password over TCP (the wrong-credentials test)
PASSWORD_ROLE = "runner_pw"
PASSWORD = "s3cret-Pa55word"
#: the database the per-test schemas live in
TEST_DB = "runner_tests"


def find_bin() -> Path | None:
    """The folder of Debian's PostgreSQL server binaries (the newest version installed), or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
                        if Path(p).parent.name.isdigit() else 0)
    for folder in reversed(candidates):
        if all(os.access(Path(folder) / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres")):
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PgServer:
    """One PostgreSQL server in a temporary folder; :meth:`start`, then URLs, then :meth:`stop`."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="runner-pg-"))
        self.data = self.root / "data"
        self.port = 0
        self._as_root = os.geteuid() == 0
        self._schemas = itertools.count(1)
        self._databases = itertools.count(1)

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, cwd=self.root, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr or result.stdout}")

    def start(self) -> PgServer:
        if self._as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C",
                  "--no-sync")
        with open(self.data / "pg_hba.conf", "w", encoding="utf-8") as hba:
            hba.write(f"local all all trust\nhost all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n"
                      "host all all 127.0.0.1/32 trust\n")
        self.port = _free_port()
        self._serve()
        self.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN SUPERUSER PASSWORD '{PASSWORD}'")
        self.execute(f"CREATE DATABASE {TEST_DB}")
        return self

    def _serve(self) -> None:
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
                   " -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w",
                  "-t", "60", "start")

    def restart(self, down: float = 0.0) -> None:
        """Stop the server at once (``-m immediate``: every session cut, as a crash does), wait ``down`` seconds,
        start it again on the same port with the same data."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        time.sleep(down)
        self._serve()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            if self.port:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = TEST_DB, user: str = "postgres", password: str | None = None,
            schema: str | None = None) -> str:
        auth = user + (f":{quote(password, safe='')}" if password else "")
        query = f"?options={quote(f'-csearch_path={schema}', safe='')}" if schema else ""
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}{query}"

    def execute(self, sql: str, database: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            conn.execute(sql)

    def new_schema(self) -> str:
        """The URL of a new, empty schema in the shared test database (a fresh store for one test)."""
        name = f"t{os.getpid()}_{next(self._schemas)}"
        self.execute(f"CREATE SCHEMA {name}", TEST_DB)
        return self.url(schema=name)

    def new_database(self) -> str:
        """The URL of a new, empty database."""
        name = f"db{os.getpid()}_{next(self._databases)}"
        self.execute(f"CREATE DATABASE {name}")
        return self.url(name)


def start_server() -> PgServer | None:
    """A started server, or None when PostgreSQL's binaries are not installed."""
    bindir = find_bin()
    if bindir is None:
        return None
    server = PgServer(bindir)
    try:
        return server.start()
    except BaseException:
        server.stop()
        raise

"""When the store or the results files fail mid-run: a full disk (a real one: a small tmpfs, and ENOSPC injected), a
corrupt SQLite page, a PostgreSQL backend terminated, an output folder that cannot be made, a password in --db.

Each ends in one ``Error:`` line naming the file and how to go on, never "unexpected", and a non-zero exit; a run
stopped by a full disk resumes with nothing sent twice (the simulated server counts what it answered)."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devservers.faults import fill, mount_tmpfs, unmount
from runner.store import open_store
from tests.helpers import ROOT, one_error, runner_cmd, sim_stats, write_job, write_rows


def runner(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    env.pop("RUNNER_RAISE_ERRORS", None)
    return subprocess.run(runner_cmd(*args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run_id_of(out: str) -> str:
    return out.split("run ", 1)[1].split(":", 1)[0]


def sim_job(tmp_path: Path, url: str, rows: int, output_dir: Path | None = None, concurrency: int = 8) -> Path:
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    extra = f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: {concurrency}}}}}"
    job = write_job(tmp_path / "job.yaml", dataset, models=["sim:gpt-sim"], extra=extra)
    if output_dir is not None:
        text = job.read_text(encoding="utf-8").replace(json.dumps(str(tmp_path / "results")),
                                                       json.dumps(str(output_dir)))
        job.write_text(text, encoding="utf-8")
    return job


def answered_once(url: str, total: int) -> None:
    """The server answered every request of the job exactly once, over the run and its resume."""
    completed = sim_stats(url)["completed_by_digest"]
    assert len(completed) == total
    assert set(completed.values()) == {1}, "a request was sent again after its answer came back"


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[callable]:
    """``mount(name, size)``: a tmpfs of ``size`` at tmp_path/name (the tests run as root); skips when it cannot."""
    mounted: list[Path] = []

    def mount(name: str, size: str, *options: str) -> Path:
        point = tmp_path / name
        why_not = mount_tmpfs(point, size, *options)
        if why_not is not None:
            pytest.skip(f"cannot mount a tmpfs here ({why_not}): the ENOSPC injection tests cover the same path")
        mounted.append(point)
        return point

    try:
        yield mount
    finally:
        for point in reversed(mounted):
            unmount(point)


# -- defect 1: a full results disk ------------------------------------------------------------------------------------
@pytest.mark.parametrize("sim_server", [0.01], indirect=True)
def test_a_full_results_disk_stops_the_run_and_the_resume_pays_nothing_twice(tmp_path, sim_server, tmpfs):
    results = tmpfs("results", "64k")  # about 100 result lines of the 400
    db = tmp_path / "store.sqlite"
    job = sim_job(tmp_path, sim_server, rows=400, output_dir=results)
    done = runner("submit", str(job), "--db", str(db), cwd=tmp_path)
    line = one_error(done.stderr)
    assert done.returncode == 1
    run_id = run_id_of(done.stdout)
    assert line.startswith(f"Error: the disk holding {results}/testjob/{run_id}/mc.jsonl is full: free space, then "
                           f"`runner resume {run_id}`"), line
    assert "every answer received is in the store" in line
    store = open_store(db)
    stored = [t for t in store.tasks(run_id) if t["status"] == "done"]
    assert store.get_run(run_id)["status"] == "failed"
    store.close()
    # dispatching stopped at once, and every answer that came back is in the store
    received = sim_stats(sim_server)["received"]
    assert len(stored) == received < 400
    subprocess.run(["mount", "-o", "remount,size=4m", str(results)], check=True)
    resumed = runner("resume", run_id, "--db", str(db), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    answered_once(sim_server, 400)
    lines = (results / "testjob" / run_id / "mc.jsonl").read_text().splitlines()
    assert sorted(int(json.loads(line)["id"]) for line in lines) == list(range(1, 401))


async def test_enospc_on_the_results_file_stops_dispatching_and_keeps_every_answer(tmp_path, fake_provider,
                                                                                   monkeypatch):
    """The same with ENOSPC injected into the results file's writes (no mount needed)."""
    import runner.engine.results_files as run_module
    from runner.engine.run import execute
    from runner.errors import RunnerError
    from runner.spec.job import load_job

    real_open = open
    written = [0]

    class Full:
        def __init__(self, handle):
            self.handle = handle

        def write(self, text: str) -> int:
            written[0] += 1
            if written[0] > 50:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.handle.write(text)

        def __getattr__(self, name):
            return getattr(self.handle, name)

    def full_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        return Full(handle) if mode == "a" else handle

    monkeypatch.setattr(run_module, "open", full_open, raising=False)
    fake_provider.latency = 0.002
    dataset = write_rows(tmp_path / "rows.jsonl", 600)
    job = load_job(write_job(tmp_path / "job.yaml", dataset, models=["fake:m"]))
    store = open_store(tmp_path / "store.sqlite")
    run_ids: list[str] = []
    with pytest.raises(RunnerError, match=r"the disk holding .*mc\.jsonl is full: free space, then `runner resume "):
        await execute(job, store, on_run_id=run_ids.append)
    sent = len(fake_provider.history)
    assert sent < 600, "dispatching went on after the results file failed"
    assert len([t for t in store.tasks(run_ids[0]) if t["status"] == "done"]) == sent
    monkeypatch.setattr(run_module, "open", real_open, raising=False)
    outcome = await execute(load_job(tmp_path / "job.yaml"), store, run_id=run_ids[0])
    assert outcome.status == "completed"
    assert len(fake_provider.history) == 600, "an answered request was sent again"
    store.close()


# -- defect 2: causes hidden ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sim_server", [0.01], indirect=True)
def test_a_full_disk_under_the_sqlite_store_is_said_and_resumes_paying_nothing_twice(tmp_path, sim_server, tmpfs):
    disk = tmpfs("store", "32m")
    db = disk / "store.sqlite"
    open_store(db).close()
    filler = fill(disk, 160_000)
    job = sim_job(tmp_path, sim_server, rows=600)
    done = runner("submit", str(job), "--db", str(db), cwd=tmp_path)
    line = one_error(done.stderr)
    assert done.returncode == 1
    run_id = run_id_of(done.stdout)
    assert "cannot rollback" not in line
    assert line.startswith(f"Error: the disk holding the store {db} is full (database or disk is full): free space, "
                           f"then `runner resume {run_id}`"), line
    received = sim_stats(sim_server)["received"]
    assert received < 600
    filler.unlink()
    resumed = runner("resume", run_id, "--db", str(db), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    answered_once(sim_server, 600)


def test_a_failed_commit_keeps_its_own_error(tmp_path, tmpfs):
    """SQLite rolls a transaction back itself when its COMMIT finds the disk full: the store's ROLLBACK must not
    replace that error by "cannot rollback - no transaction is active"."""
    disk = tmpfs("store", "2m")
    store = open_store(disk / "store.sqlite")
    fill(disk, 20_000)
    big = "x" * 4000
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for n in range(200):
            task = ("r", "s", f"i{n}", "m", "1", "{}", f"k{n}", "done", 0, 1, None, None, 1, 1, 0.0, None, None, 1,
                    big, 0, 0.0, None, 0.0)
            store.write_batch([task], [], [])
    store.close()


def _completed_store(tmp_path: Path, url: str, rows: int) -> tuple[Path, Path, str]:
    db = tmp_path / "store.sqlite"
    job = sim_job(tmp_path, url, rows=rows)
    done = runner("submit", str(job), "--db", str(db), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return db, job, run_id_of(done.stdout)


def _corrupt(db: Path, start: float) -> None:
    """Overwrite the pages of the store from ``start`` (a fraction of the file) on, page 1 and the last kept."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    size = db.stat().st_size
    with open(db, "r+b") as out:
        for offset in range(int(size * start) // page * page, size - page, page):
            out.seek(offset)
            out.write(bytes([0xA5]) * page)


@pytest.mark.parametrize("sim_server", [0.0], indirect=True)
def test_a_corrupt_sqlite_store_is_said_with_how_to_recover(tmp_path, sim_server):
    db, job, run_id = _completed_store(tmp_path, sim_server, rows=300)
    _corrupt(db, 0.3)
    done = runner("submit", str(job), "--db", str(db), cwd=tmp_path)
    line = one_error(done.stderr)
    assert done.returncode == 1
    assert f"the store {db} is corrupt (database disk image is malformed)" in line, line
    assert f"`sqlite3 {db} .recover | sqlite3 NEW.sqlite`" in line and "--db NEW.sqlite" in line
    report = runner("report", run_id, "--db", str(db), cwd=tmp_path)
    assert f"the store {db} is corrupt" in one_error(report.stderr) and report.returncode == 1
    # the advice works: the recovered file opens, and the job runs on it
    recovered = tmp_path / "NEW.sqlite"
    subprocess.run(f"sqlite3 {db} .recover | sqlite3 {recovered}", shell=True, check=True, capture_output=True)
    again = runner("submit", str(job), "--db", str(recovered), cwd=tmp_path)
    assert again.returncode == 0, again.stderr


def test_an_output_folder_that_cannot_be_created_is_said_before_the_run_is_made(tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    dataset = write_rows(tmp_path / "rows.jsonl", 3)
    job = write_job(tmp_path / "job.yaml", dataset, models=["sim:m"])
    job.write_text(job.read_text().replace(json.dumps(str(tmp_path / "results")),
                                           json.dumps(str(tmp_path / "afile" / "results"))))
    db = tmp_path / "store.sqlite"
    done = runner("submit", str(job), "--db", str(db), cwd=tmp_path)
    line = one_error(done.stderr)
    assert done.returncode == 1
    assert line == (f"Error: the output folder {tmp_path}/afile/results/testjob cannot be created (Not a directory): "
                    f"set output_dir (or the stage's output:) in {job} to a folder that can be")
    assert open_store(db).list_runs() == [], "a run was made"


def test_a_read_only_output_folder_is_said_before_the_run_is_made(tmp_path, tmpfs):
    folder = tmpfs("ro", "1m", "ro")
    dataset = write_rows(tmp_path / "rows.jsonl", 3)
    job = write_job(tmp_path / "job.yaml", dataset, models=["sim:m"])
    job.write_text(job.read_text().replace(json.dumps(str(tmp_path / "results")), json.dumps(str(folder))))
    db = tmp_path / "store.sqlite"
    done = runner("submit", str(job), "--db", str(db), cwd=tmp_path)
    line = one_error(done.stderr)
    assert done.returncode == 1
    assert line.startswith(f"Error: the output folder {folder}/testjob cannot be created (Read-only file system)"), line
    assert open_store(db).list_runs() == []


def test_a_password_in_db_is_warned_about_once_and_never_printed(tmp_path):
    url = "postgresql://someone:hunter2-secret@127.0.0.1:1/nodb"
    done = runner("runs", "--db", url, cwd=tmp_path, timeout=60)
    assert "hunter2" not in done.stdout + done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "--db carries a password" in warnings[0] and "RUNNER_DB" in warnings[0]
    one_error(done.stderr)
    assert done.returncode == 1
    # through RUNNER_DB, as suggested: no warning
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUNNER_DB": url}
    quiet = subprocess.run(runner_cmd("runs"), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert "warning" not in quiet.stderr and "hunter2" not in quiet.stdout + quiet.stderr


def _submit_under_way(tmp_path: Path, sim_server: str, env: dict[str, str]) -> subprocess.Popen:
    """``runner submit`` of a 300-row job on the PostgreSQL store, once 30 of its requests have reached the server."""
    job = sim_job(tmp_path, sim_server, rows=300, concurrency=4)
    proc = subprocess.Popen(runner_cmd("submit", str(job)), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while sim_stats(sim_server)["received"] < 30:
        if time.monotonic() >= deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError("the run did not get going")
        time.sleep(0.05)
    return proc


def _allow_connections(pg_server: Any, allowed: bool) -> list:
    """Let the test database take new sessions or not; when not, end its sessions (the pids ended)."""
    import psycopg

    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE runner_tests ALLOW_CONNECTIONS {str(allowed).lower()}")
        if allowed:
            return []
        return conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
                            " AND pid != pg_backend_pid()", ("runner_tests",)).fetchall()


@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_a_postgresql_backend_terminated_mid_run_is_said_and_the_run_resumes(tmp_path, sim_server, pg_server,
                                                                              pg_url):
    open_store(pg_url).close()
    # the runner tries to connect again for 2 s (RUNNER_STORE_WAIT), then ends the run, resumable
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUNNER_DB": pg_url, "RUNNER_STORE_WAIT": "2"}
    proc = _submit_under_way(tmp_path, sim_server, env)
    try:
        # the server goes away for this database: its sessions ended and no new one taken until the resume (with
        # its sessions only ended, or back within the wait, the runner connects again and the run goes on: the
        # test below)
        assert _allow_connections(pg_server, False)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        _allow_connections(pg_server, True)
    line = one_error(err)
    assert proc.returncode == 1
    run_id = run_id_of(out)
    assert "the PostgreSQL store postgresql://postgres@127.0.0.1" in line and "went away" in line, line
    assert f"once the server is back, `runner resume {run_id}`" in line
    resumed = subprocess.run(runner_cmd("resume", run_id), cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    answered_once(sim_server, 300)


@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_a_postgresql_backend_terminated_mid_run_is_connected_to_again_and_the_run_completes(
        tmp_path, sim_server, pg_server, pg_url):
    """The server ends the run's session and takes no new one for 2 s (a restart): the runner tries to connect
    again (RUNNER_STORE_WAIT, 30 s by default) and goes on; every request is answered once, in one run."""
    open_store(pg_url).close()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUNNER_DB": pg_url}
    proc = _submit_under_way(tmp_path, sim_server, env)
    try:
        killed = _allow_connections(pg_server, False)
        time.sleep(2)
        _allow_connections(pg_server, True)
        assert killed
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        _allow_connections(pg_server, True)
    assert proc.returncode == 0, err
    assert f"run {run_id_of(out)}: completed" in out
    answered_once(sim_server, 300)

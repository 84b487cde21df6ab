"""`runner` and simulated-server processes for the tests, forked from one that has imported them already.

A test that starts ``python -m runner.cli ...`` pays for a new interpreter importing the runner (about 1 s of CPU on
this project's 2-core machines), and the suite starts some three hundred of them. Here each test process keeps one
*prefork server*: a child process that has imported ``runner.cli`` and ``simserver`` and then only forks. A test's
``subprocess.Popen([sys.executable, "-m", "runner.cli", ...])`` (or ``subprocess.run``) asks it for the process
instead: the server forks, and the fork takes the test's cwd, environment, argv, standard streams and session,
then runs the module as ``python -m`` would. The process is a real one with its own pid, so kill -9, SIGSTOP,
``/proc`` and the store's pid checks see what they would see; what is not the same is that its imports were done
before it was asked for, and that every fork shares the server's hash seed.

Only what a fork can reproduce is forked: ``-m runner.cli`` or ``-m simserver`` with the test process's interpreter,
no shell, ``preexec_fn``, ``pass_fds``, user, group or umask, and an environment whose settings read at interpreter
start (``PYTHON*``, the locale, ``TZ``) equal the server's. Anything else, and what asyncio starts (its child
watcher waits for its own children), is started as usual. ``RUNNER_TEST_PREFORK=0`` turns the whole thing off.

:func:`install` (tests/conftest.py) puts :class:`PreforkPopen` in place of ``subprocess.Popen`` in the test process.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import gc
import io
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

#: the modules a fork may run
MODULES = ("runner.cli", "simserver")

#: what the server imports before it forks: the two command lines, and what their runs import later (the report,
#: the lean wire and the SDKs' bounded transport, the PostgreSQL store), and the SDKs that cost most to import and
#: that about one run in ten needs (anthropic's batches and the strict server's Anthropic checks, 3.3 s of CPU;
#: google-genai, 1.4 s). Not numpy or scipy: their BLAS starts threads, and a fork of a process with threads is unsafe.
PRELOADED = ("runner.cli", "simserver.cli", "runner.report.summary", "runner.report.runs", "runner.spec.job",
             "runner.providers.openai_servers", "runner.providers.lean_http", "runner.providers.bounded_httpx",
             "runner.store.postgres", "runner.providers.gemini", "runner.providers.anthropic_messages", "anthropic",
             "google.genai")

#: environment settings a Python process reads when it starts, before any of the test's code could see them
_READ_AT_START = ("PYTHON", "LC_", "LANG", "TZ")
#: ... but for these, which Python reads where they are used (Ray's ray.init() sets PYTHONBREAKPOINT in the test
#: process for good, which made every later fork of that process a new interpreter)
_READ_LATER = frozenset({"PYTHONBREAKPOINT", "PYTHONASYNCIODEBUG"})

_REAL_POPEN = subprocess.Popen


#: the project's root, where the server imports the runner from (its sys.path[0])
ROOT = Path(__file__).resolve().parent.parent


def _on_root(path: str) -> bool:
    return bool(path) and Path(path).resolve() == ROOT


def _started_with(env: dict[str, str]) -> dict[str, str]:
    """The settings of ``env`` a new interpreter reads at start, but a PYTHONPATH of the project's root alone (as
    many tests give their runner processes): the server imported the runner from there already, and a fork puts
    it on its path as the interpreter would (:func:`_become`)."""
    found = {k: v for k, v in env.items() if k.startswith(_READ_AT_START) and k not in _READ_LATER}
    if all(_on_root(path) for path in found.get("PYTHONPATH", "x").split(os.pathsep)):
        del found["PYTHONPATH"]
    return found


# ---- the server, in its own process ----


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _serve(path: str) -> tuple[dict[str, Any], list[int]] | None:
    """Fork for each request until the test process goes; returns only in a fork: its request and its streams."""
    for module in PRELOADED:
        __import__(module)
    from runner.cli.common import import_now

    import_now()  # what the command line imports on first use, imported in the server
    if len(os.listdir("/proc/self/task")) != 1:
        return None  # a fork of a process with threads could hold a lock no thread will release
    gc.freeze()  # what is imported stays out of the forks' collections, which would otherwise copy its pages
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "lifeline")  # a pipe from the test process: EOF when it ends
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "lifeline":
                return None
            if key.data == "accept":
                conn, _ = listener.accept()
                fds = array.array("i")
                message, ancillary, _, _ = conn.recvmsg(1 << 20, socket.CMSG_LEN(3 * fds.itemsize))
                for level, kind, data in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                try:
                    request = json.loads(message)
                except ValueError:
                    request = {"probe": True}  # a probe that closed before it wrote
                if request.get("probe"):
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    for other in list(selector.get_map().values()):
                        if other.data not in ("accept", "lifeline"):
                            os.close(other.fd)
                            other.data[1].close()
                    selector.close()
                    listener.close()
                    conn.close()
                    return request, list(fds)
                for fd in fds:
                    os.close(fd)
                _send(conn, {"pid": pid})
                selector.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, conn))
            else:
                pid, conn = key.data
                _, status, usage = os.wait4(pid, 0)
                selector.unregister(key.fd)
                os.close(key.fd)
                with contextlib.suppress(OSError):
                    _send(conn, {"status": status, "cpu": usage.ru_utime + usage.ru_stime})
                conn.close()


def _become(request: dict[str, Any], fds: list[int]) -> str:
    """Turn this fork into the process the test asked for, as far as a fresh ``python -m`` would differ."""
    for target, fd in enumerate(fds):
        if fd != target:
            os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    if request["new_session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    sys.path[0] = os.getcwd()  # as -m puts it
    for path in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
        sys.path.insert(1, path)  # only the project's root (_started_with): where the interpreter would put it
    # the standard streams, made as a new interpreter makes them for these descriptors
    encoding = sys.stdout.encoding
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                 encoding=encoding, errors=sys.stdin.errors)
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                                   encoding=encoding, errors=sys.stdout.errors,
                                                   line_buffering=os.isatty(1))
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                                   encoding=encoding, errors="backslashreplace", line_buffering=True)
    return request["module"]


def _server_main() -> None:
    """``python -m tests.prefork SOCKET``: serve, and in each fork run the module asked for."""
    asked = _serve(sys.argv[1])
    if asked is None:
        return
    module = _become(*asked)
    os._exit(_run(module))


def _run(module: str) -> int:
    """Run ``module`` as ``python -m`` would and end as an interpreter ends (its non-daemon threads joined, its
    atexit functions run, its streams flushed), but without tearing its modules down: a fork that freed every object
    it inherited would write to, and so copy, every page of the server's memory (about 0.3 s of CPU each)."""
    import runpy
    import traceback

    code: int = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints it
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code == -signal.SIGINT:  # dies of the signal, as an interpreter does after an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code & 0xFF


# ---- the test process's side ----


#: where a test process finds the prefork server its pytest-xdist controller started for every worker to share
SHARED = "RUNNER_TEST_PREFORK"


class _Server:
    """A prefork server: one per test run (pytest-xdist's controller starts it, see :func:`start_shared`), or one
    per test process where nobody started it (``-n0``)."""

    def __init__(self) -> None:
        shared = os.environ.get(SHARED + "_SERVER")
        if shared:
            self.pid, self.path, env = json.loads(shared)
            self.env = dict(env)
            self.process = None
            return
        folder = tempfile.mkdtemp(prefix="runner-prefork-")
        self.path = os.path.join(folder, "socket")
        self.env = _started_with(dict(os.environ))
        self.process = _REAL_POPEN([sys.executable, "-m", "tests.prefork", self.path], cwd=ROOT,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   text=True)
        self.pid = self.process.pid
        atexit.register(self.stop)

    @property
    def shared(self) -> str:
        """What ``RUNNER_TEST_PREFORK_SERVER`` holds for the test processes: the server's pid, socket and start-up
        environment."""
        return json.dumps([self.pid, self.path, self.env])

    def ready(self) -> bool:
        """Whether the server has imported what it forks with and listens (waited for, up to a minute)."""
        if self.process is not None:
            self.process.stdout.readline()  # "ready", or nothing where it could not serve
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _alive(self.pid):
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(self.path)
                probe.sendmsg([json.dumps({"probe": True}).encode()])
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)

    def fork(self, request: dict[str, Any], fds: list[int]) -> tuple[int, _Reply]:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        conn.sendmsg([json.dumps(request).encode()],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
        reply = _Reply(conn)
        return reply.read(block=True)["pid"], reply


class _Reply:
    """The server's messages about one fork: its pid, then its wait status when it ends."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""
        self.status: int | None = None

    def read(self, block: bool) -> dict[str, Any] | None:
        while b"\n" not in self.buffer:
            self.conn.setblocking(block)
            try:
                chunk = self.conn.recv(4096)
            except BlockingIOError:
                return None
            if not chunk:
                return {}
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def wait_status(self, pid: int, block: bool) -> int | None:
        if self.status is None:
            message = self.read(block)
            if message is None:
                return None
            if "status" not in message:  # the server went before the fork: wait for the pid to go too
                while _alive(pid):
                    if not block:
                        return None
                    time.sleep(0.05)
                message = {"status": 255 << 8}
            self.status = message["status"]
            global forks_cpu
            forks_cpu += message.get("cpu", 0.0)
            self.conn.close()
        return self.status


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


_server: _Server | None = None
_server_ready: bool | None = None
_server_lock = threading.Lock()


def _the_server() -> _Server | None:
    global _server, _server_ready
    with _server_lock:
        if _server is None:
            _server = _Server()
        if _server_ready is None:
            _server_ready = _server.ready()
        return _server if _server_ready else None


def server_pid() -> int | None:
    """The pid of the prefork server this test process forks from, once it has answered."""
    return _server.pid if _server is not None and _server_ready else None


def start_shared() -> None:
    """Start the prefork server the test processes this one starts will share (pytest-xdist's controller calls
    this before it starts them): it is not waited for here, only where a process is first asked for."""
    global _server
    with _server_lock:
        if _server is None and SHARED + "_SERVER" not in os.environ and _enabled():
            _server = _Server()
            os.environ[SHARED + "_SERVER"] = _server.shared


#: CPU seconds of the forks of this test process that have ended (a fork is the server's child, so the test
#: process's own RUSAGE_CHILDREN does not count it)
forks_cpu = 0.0

#: why the last ``-m runner.cli`` or ``-m simserver`` was not forked, where the environment was why
last_unforked: str | None = None

#: the pids of the ``runner`` processes forked for this test process (kept while they may be running)
_runner_forks: set[int] = set()


def runner_forks() -> list[int]:
    """The ``runner`` processes forked for this test process that are still running: each a child of its prefork
    server (a pid that has ended and been taken by another process is not)."""
    server = _server.pid if _server is not None else None
    running = []
    for pid in list(_runner_forks):
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            parent = None
        if parent == server:
            running.append(pid)
        else:
            _runner_forks.discard(pid)
    return running


def _module_of(args: Any, kwargs: dict[str, Any]) -> str | None:
    """The module a fork can run for this ``Popen``, or None where it must be started as usual."""
    if isinstance(args, (str, bytes)) or len(args) < 3 or list(map(str, args[:2])) != [sys.executable, "-m"]:
        return None
    module = str(args[2])
    if module not in MODULES:
        return None
    usual = (kwargs["executable"] is None and kwargs["preexec_fn"] is None and not kwargs["pass_fds"]
             and not kwargs["shell"] and kwargs["gid"] is None and kwargs["gids"] is None and kwargs["uid"] is None
             and kwargs["umask"] == -1 and kwargs["process_group"] == -1 and kwargs["close_fds"])
    if not usual:
        return None
    cwd = kwargs["cwd"]
    if cwd is not None and not os.path.isdir(cwd):
        return None  # started as usual, to fail as usual
    return module


class PreforkPopen(_REAL_POPEN):
    """``subprocess.Popen``, with ``python -m runner.cli`` and ``python -m simserver`` forked from the prefork
    server."""

    _reply: _Reply | None = None

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
                       restore_signals, gid, gids, uid, umask, start_new_session, process_group):
        usual = (args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags, shell,
                 p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid, gids, uid, umask,
                 start_new_session, process_group)
        module = _module_of(args, locals())
        caller = sys._getframe(2).f_globals.get("__name__", "")
        environment = dict(os.environ if env is None else env)
        server = _the_server() if module and not caller.startswith("asyncio") else None
        if server is not None and _started_with(environment) != server.env:
            global last_unforked
            differ = sorted(set(_started_with(environment).items()) ^ set(server.env.items()))
            last_unforked = f"{module}: the environment differs from the server's in {sorted({k for k, _ in differ})}"
        if server is None or _started_with(environment) != server.env:
            return super()._execute_child(*usual)
        streams = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
                   errwrite if errwrite != -1 else 2]
        request = {"module": module, "argv": [str(a) for a in args[2:]], "cwd": os.path.abspath(cwd or os.getcwd()),
                   "env": {str(k): str(v) for k, v in environment.items()}, "new_session": bool(start_new_session)}
        try:
            self.pid, self._reply = server.fork(request, streams)
            self._child_created = True
            if module == "runner.cli":
                _runner_forks.add(self.pid)
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _try_wait(self, wait_flags):
        if self._reply is None:
            return super()._try_wait(wait_flags)
        status = self._reply.wait_status(self.pid, block=not wait_flags & os.WNOHANG)
        return (0, 0) if status is None else (self.pid, status)

    def _internal_poll(self, _deadstate=None, **kwargs):
        if self._reply is None:
            return super()._internal_poll(_deadstate, **kwargs)
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)
            except OSError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()
        return self.returncode


def _enabled() -> bool:
    return os.environ.get(SHARED, "1") != "0" and hasattr(os, "pidfd_open")


def install() -> None:
    """Put :class:`PreforkPopen` in place of ``subprocess.Popen`` in this process (unless RUNNER_TEST_PREFORK=0)."""
    if _enabled():
        subprocess.Popen = PreforkPopen  # type: ignore[misc]


if __name__ == "__main__":
    _server_main()

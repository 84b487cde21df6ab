"""What starting the runner imports: ``runner submit`` reaches its first request in about half a second (issue 25),
so the command line's modules keep the heavy libraries that a run of the simulated server or an OpenAI-compatible
server never uses out of the start, importing them where they are used: the OpenAI SDK and aiohttp (the lean wire
speaks to those servers, with h11, runner/providers/lean_http.py), sqlite-utils with numpy and pandas (only for
looking at the store's tables), rich (only for a terminal's live view), genai-prices with its httpx (only to price
a paid model).

A plain online job's submit, to its first answer request, leaves out what that path does not use either: the Batch
API side, the deadline planner and the prefixes stored at a provider (runner/engine/assembly.py imports them where
a run uses them), pipelines and their data steps, the result lines' parsers and scorers (imported when the first
line is recorded), the report tables of ``runner estimate``, the other commands' modules, standard modules used
only on rare paths, and pydantic's scan of every package for plug-ins."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import write_job, write_rows

KEPT_OUT = ("openai", "sqlite_utils", "numpy", "pandas", "rich", "genai_prices", "httpx2")

#: what a submit of a plain online job (no Batch API, no deadline, no pipeline, no local model) has not imported
#: when it sends its first answer request
NOT_BEFORE_THE_FIRST_REQUEST = (
    "runner.engine.batch", "runner.engine.batch_lines", "runner.engine.batch_records", "runner.engine.batch_outcomes",
    "runner.providers.batching", "runner.engine.deadline", "runner.plan.deadline", "runner.plan.deadline_inputs",
    "runner.engine.stored_prompts", "runner.engine.pipeline", "runner.plan.steps", "runner.evaluate.results",
    "runner.evaluate.parse", "runner.evaluate.parsers.letters", "runner.report.tables", "runner.cli.jobs",
    "runner.cli.reports", "runner.cli.sim", "runner.cli.view",
    "statistics", "gzip", "pkgutil", "shlex", *KEPT_OUT, "tiktoken", "aiohttp",
)


def imported_after(code: str) -> set[str]:
    """The modules loaded after ``code`` in a new interpreter; not those the command line will import on first use
    (runner/cli/common.py's ``later``: in ``sys.modules``, but not run yet)."""
    probe = (f"import sys, json\n{code}\n"
             "print(json.dumps(sorted(name for name, module in sys.modules.items()\n"
             "                        if type(module).__name__ != '_LazyModule')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_the_command_line_starts_with_its_commands_alone_and_a_submit_without_the_heavy_libraries() -> None:
    assert "typer" not in imported_after("import runner.cli")  # `runner --help` (runner/cli/quick.py) needs none
    # what a command loads before it runs: its own module alone of the command modules
    loaded = imported_after("from runner.cli import typer_app\ntyper_app.build_app('submit')")
    assert "typer" in loaded and "runner.cli.run" in loaded
    assert not [name for name in ("runner.cli.jobs", "runner.cli.reports", "runner.cli.sim", "runner.cli.view")
                if name in loaded]
    assert not [name for name in ("runner.service", "runner.engine.run", "runner.store", "runner.spec.schema",
                                  "asyncio", "pydantic", "yaml", "jinja2", *KEPT_OUT) if name in loaded]
    loaded = imported_after("import runner.cli\nfrom runner.cli.common import service\nservice.run")
    assert "runner.service" in loaded and "runner.store.sqlite" in loaded  # the modules a submit uses are there
    assert not [name for name in (*KEPT_OUT, "tiktoken") if name in loaded]


def test_a_simulated_run_starts_without_the_sdk_and_the_live_view_without_a_terminal() -> None:
    loaded = imported_after(
        "import asyncio\n"
        "from runner.providers.base import ProviderSettings\n"
        "from runner.providers.openai_servers import SimProvider\n"
        "from runner.report.progress import make_view\n"
        "import io\n"
        "make_view(io.StringIO())\n"
        "provider = SimProvider(ProviderSettings(base_url='http://127.0.0.1:9/v1'))\n"
        "async def go():\n"
        "    await provider.start()\n"
        "    await provider.aclose()\n"
        "asyncio.run(go())\n")
    assert "runner.providers.lean_http" in loaded and "h11" in loaded
    assert not [name for name in (*KEPT_OUT, "aiohttp") if name in loaded]


def test_the_store_still_shows_its_tables_through_sqlite_utils(tmp_path) -> None:
    from runner.store import open_store

    store = open_store(tmp_path / "s.sqlite")
    try:
        assert "tasks" in store.db.table_names()
    finally:
        store.close()


def test_the_parsers_compile_their_patterns_on_first_use() -> None:
    # The answer parsers' patterns are compiled when an answer is first parsed, not when a submit starts.
    probe = ("import re\n"
             "from runner.evaluate import parse\n"
             "from runner.evaluate.parsers import lazy, refusals\n"
             "import sys\n"
             "patterns = [value for name, module in sys.modules.items() if name.startswith('runner.evaluate.parsers')\n"
             "            for value in vars(module).values() if isinstance(value, lazy.LazyPattern)]\n"
             "print(len(patterns), sum(p._compiled is not None for p in patterns))\n"
             "said = refusals.is_refusal(\"I'm sorry, I can't help with that.\")\n"
             "print(said, refusals._REFUSAL._compiled is not None)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    counts, used = done.stdout.splitlines()
    total, compiled = map(int, counts.split())
    assert total > 30 and compiled == 0
    assert used == "True True"


def first_answer_request(tmp_path, model: str, providers: str) -> dict:
    """What a ``runner submit`` of a five-row job of ``model`` had loaded when its first answer request left: the
    runner command in a new interpreter, stopped there."""
    job = write_job(tmp_path / "job.yaml", write_rows(tmp_path / "rows.jsonl", 5), models=[model],
                    extra=f"providers: {providers}")
    probe = ("import json, os, sys\n"
             "import runner.cli\n"
             "import runner.providers.lean_http as lean\n"
             "sent = lean.LeanWire.request\n"
             "async def request(self, method, path, *args, **kwargs):\n"
             "    if path.startswith('/chat/completions'):\n"
             "        from runner.providers import tokens\n"
             "        loader = sys.modules.get('pydantic.plugin._loader')\n"
             "        print(json.dumps({'modules': sorted(n for n, m in sys.modules.items()\n"
             "                                            if type(m).__name__ != '_LazyModule'),\n"
             "                          'plugins': getattr(loader, '_plugins', None) is not None,\n"
             "                          'encodings': sorted(tokens._built)}), flush=True)\n"
             "        os._exit(0)\n"
             "    return await sent(self, method, path, *args, **kwargs)\n"
             "lean.LeanWire.request = request\n"
             f"sys.argv = ['runner', 'submit', {str(job)!r}, '--db', {str(tmp_path / 'store.sqlite')!r}]\n"
             "runner.cli.main()\n")
    env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))


def test_a_submit_reaches_its_first_answer_request_without_what_that_path_does_not_use(tmp_path, sim_server) -> None:
    said = first_answer_request(tmp_path, "sim:gpt-4o-mini", f"{{sim: {{base_url: {json.dumps(sim_server)}}}}}")
    loaded = set(said["modules"])
    assert {"runner.engine.run", "runner.engine.prompt_cache", "runner.providers.lean_http"} <= loaded  # the path
    assert not [name for name in NOT_BEFORE_THE_FIRST_REQUEST if name in loaded]
    assert not said["plugins"]  # pydantic did not look for plug-ins (PYDANTIC_DISABLE_PLUGINS, runner/cli/__init__.py)
    assert said["encodings"] == []


def test_a_paid_submit_reaches_its_first_answer_request_without_a_tokenizer_or_an_http_client(tmp_path,
                                                                                             sim_server) -> None:
    # OpenAI over the lean wire: priced by genai-prices (without its httpx2: runner/providers/price_data.py), its
    # input tokens bounded until o200k_base is built, after the first answer (runner/providers/tokens.py)
    said = first_answer_request(tmp_path, "openai:gpt-4o-mini", f"{{openai: {{base_url: {json.dumps(sim_server)}}}}}")
    loaded = set(said["modules"])
    assert {"genai_prices", "runner.providers.openai_chat", "runner.providers.lean_http"} <= loaded
    assert not [name for name in ("openai", "httpx2", "httpx", "aiohttp", "tiktoken", "runner.engine.batch")
                if name in loaded]
    assert said["encodings"] == []


def test_a_run_holds_garbage_collection_off_only_until_its_store_opens(tmp_path, sim_server, monkeypatch,
                                                                         capsys) -> None:
    # runner/cli/__init__.py: off while the command imports and reads its job, on (what was loaded frozen) from the
    # store's opening, and as it was however the command ends
    import gc

    import runner.cli.run
    import runner.store
    from tests.helpers import run_cli

    seen: dict[str, tuple[bool, int]] = {}
    read, opened = runner.cli.run.load_job, runner.store.open_store

    def load_job(*args, **kwargs):
        seen["job"] = (gc.isenabled(), gc.get_freeze_count())
        return read(*args, **kwargs)

    def open_store(*args, **kwargs):
        seen["store"] = (gc.isenabled(), gc.get_freeze_count())
        return opened(*args, **kwargs)

    monkeypatch.setattr(runner.cli.run, "load_job", load_job)  # the submit command's own name for it
    monkeypatch.setattr(runner.store, "open_store", open_store)
    job = write_job(tmp_path / "job.yaml", write_rows(tmp_path / "rows.jsonl", 3), models=["sim:gpt-4o-mini"],
                    extra=f"providers: {{sim: {{base_url: {json.dumps(sim_server)}}}}}")
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(job), "--db", str(tmp_path / "store.sqlite"))
    assert code == 0, err
    assert seen["job"] == (False, 0) and seen["store"][0] and seen["store"][1] > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0  # after the command: as before it
    (tmp_path / "bad.yaml").write_text("name: [\n", encoding="utf-8")
    code, _, _ = run_cli(monkeypatch, capsys, "submit", str(tmp_path / "bad.yaml"))
    assert code != 0 and gc.isenabled() and gc.get_freeze_count() == 0  # ended before its store: on again

"""Pipelines: stages that read earlier stages' rows, run in order, each output kept under a content address.

A stage's address is the SHA-256 of its definition (prompt text, models, parameters, parser and recipe
source, data operation) and of the content of its input rows. When the store has a complete output at that
address, the stage is *reused*: no request is planned and its rows are read back. Changing one stage's
prompt therefore re-runs that stage, and the stages after it only where its rows changed.

An LLM stage's output rows are its input rows with the parsed answer in ``as:`` (and the raw answer in
``<as>_response``), one per input row, model and variant. A row whose answer cannot be parsed, or whose list
answer has fewer than ``min_items`` items, is asked again, up to ``max_rounds`` times, each round with a new
sample index so the cache does not give back the same answer. What each stage took in, dropped (by rule) and
gave out is the run's funnel, shown by ``runner report``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import IO, Any

from runner.engine.address import content_address, file_digest, rows_digest
from runner.engine.dispatch import Dispatcher
from runner.engine.replay import copy_tasks
from runner.engine.stats import RunStats
from runner.errors import RunnerError
from runner.plan.prompts import load_prompt
from runner.plan.request import canonical_json, canonical_params
from runner.plan.stage import StagePlan, dataset_rows, model_key
from runner.plan.steps import run_step
from runner.recipes import Context, get_parser, get_step, source_of
from runner.spec.schema import Job
from runner.spec.stage import Stage
from runner.store import Store, Writer, dumps
from runner.store.offloop import LoopStore, off_loop

#: bump when the meaning of a stage's definition changes, so older stored outputs are not reused
PIPELINE_VERSION = 1

Rows = list[dict[str, Any]]
#: a stage's answers by (row id, model, variant without its round), in round order
Answers = dict[tuple[str, str, str], list[dict[str, Any]]]


def public(row: dict[str, Any]) -> dict[str, Any]:
    """A row without its internal fields (``_id``, ``_shuffle``, ...), as written to output files."""
    return {k: v for k, v in row.items() if not k.startswith("_")}


class Pipeline:
    """Runs a pipeline job's stages in order through one dispatcher; records each stage's funnel."""

    def __init__(self, job: Job, store: Store | LoopStore, run_id: str, dispatcher: Dispatcher, writer: Writer,
                 stats: RunStats, note: Any, rows_dir: Path, results: dict[str, IO[str]] | None = None) -> None:
        self.job = job
        #: the store, its calls made off the event loop (runner/store/offloop.py)
        self.store = off_loop(store)
        self.run_id = run_id
        self.dispatcher = dispatcher
        self.writer = writer
        self.stats = stats
        self.note = note
        self.rows_dir = rows_dir
        #: each LLM stage's results file (a reused stage's copied tasks are written there)
        self.results = results or {}
        self._similarity: Any = None

    # -- the whole pipeline ----------------------------------------------------------------------------
    async def run(self) -> None:
        outputs: dict[str, tuple[str, Rows]] = {}  # stage -> (digest of its rows, rows)
        for position, stage in enumerate(self.job.stages):
            if self.dispatcher.stopping:
                return
            if stage.from_ is not None:
                inputs = {name: outputs[name][1] for name in stage.from_}
                input_digests = [outputs[name][0] for name in stage.from_]
            else:
                rows = _dataset_rows(self.job, stage)
                inputs, input_digests = {"dataset": rows}, [rows_digest(rows)]
            address = self.address(stage, input_digests)
            funnel: dict[str, Any] = {"stage": stage.name, "kind": "llm" if stage.is_llm else stage.data_ops()[0],
                                      "hash": address, "rows_in": sum(len(rows) for rows in inputs.values())}
            stored = await self.store.stage_output(address)
            if stored is not None:
                out = await self.store.stage_rows(address)
                built = json.loads(stored["funnel"])
                funnel.update({k: v for k, v in built.items() if k in ("dropped", "rejected", "requests", "rounds")},
                              reused=True, built_in=stored["run_id"], cost=0.0, cost_when_built=stored["cost"])
                self.note(f"stage {stage.name}: reused ({len(out)} rows, built in run {stored['run_id']})")
                if stage.is_llm and not await self.store.has_tasks(self.run_id, stage.name):
                    # its answers, as cache hits: the report and the results file show them as a re-run would
                    await self.store.run(copy_tasks, self.store.sync, stored["run_id"], stored["stage"], self.run_id,
                                         stage.name, self.stats, self.results.get(stage.name), add_total=True)
                complete = True
            elif stage.is_llm:
                got = await self._run_llm(stage, next(iter(inputs.values())), funnel)
                if got is None:  # stopped: Ctrl-C, a budget, a fatal error; a resume goes on from here
                    return
                out, complete = got
            else:
                outcome = run_step(stage, inputs, self._context())
                out, complete = outcome.rows, True
                funnel.update(dropped=dict(outcome.dropped), cost=0.0)
            funnel.setdefault("reused", False)
            funnel["rows_out"] = len(out)
            if stage.write:
                funnel["write"] = stage.write
            if complete and stored is None:
                await self.store.save_stage_output(address, stage.name, self.run_id, out, funnel.get("cost", 0.0),
                                                   funnel)
            await self.store.record_run_stage(self.run_id, stage.name, position, address, funnel)
            if stage.is_llm:  # `runner runs` shows progress against the requests planned so far
                await self.store.set_run(self.run_id, total=self.stats.totals().total)
            self._write(stage, out)
            outputs[stage.name] = (rows_digest(out), out)

    def address(self, stage: Stage, input_digests: list[str]) -> str:
        """The stage's content address: its definition and its inputs' content."""
        body: dict[str, Any] = {
            "version": PIPELINE_VERSION,
            "stage": stage.model_dump(mode="json", by_alias=True, exclude={
                "name", "output", "budget", "write", "dataset", "from_", "prompt", "models"}),
            "inputs": input_digests,
            "field": stage.field,
        }
        if stage.is_llm:
            body["prompt"] = load_prompt(self.job, stage.prompt).text  # type: ignore[arg-type]
            body["models"] = [list(model_key(m, self.job.endpoints, self.job)) for m in self.job.stage_models(stage)]
            body["params"] = canonical_params(self.job.stage_params(stage).model_dump())
            if stage.choices is not None and stage.choices.options_file:
                body["options"] = file_digest(stage.choices.options_file)
            if stage.parse_recipe:
                body["parser"] = source_of(get_parser(stage.parse))  # type: ignore[arg-type]
            if stage.parse_plugin or stage.scorer is not None:  # one's own: an edit of its module re-reads answers
                from runner.evaluate import plugins

                plugins.load_stage_plugins(stage, self.job.base_dir)
                if stage.parse_plugin:
                    body["parser"] = source_of(plugins.load(stage.parse, plugins.PARSER_GROUP))
                if stage.scorer is not None:
                    body["scorer"] = source_of(plugins.load(stage.scorer, plugins.SCORER_GROUP))
        else:
            body["seed"] = self.job.seed
            if stage.recipe is not None:
                body["recipe"] = source_of(get_step(stage.recipe))  # type: ignore[arg-type]
            if stage.recipe is not None or stage.similarity is not None:
                body["similarity"] = self._context().similarity.name
        return content_address(body)

    def _context(self) -> Context:
        if self._similarity is None:
            from runner.plan.similarity import get_similarity

            self._similarity = get_similarity(self.job.embeddings)
        return Context(similarity=self._similarity, seed=self.job.seed)

    def _write(self, stage: Stage, rows: Rows) -> None:
        """Every stage's rows go to ``<run dir>/rows/<stage>.jsonl`` (ids included, for inspection); a stage
        with ``write:`` also writes them, without internal fields, where it says."""
        self.rows_dir.mkdir(parents=True, exist_ok=True)
        targets = [(self.rows_dir / f"{stage.name}.jsonl", False)]
        if stage.write:
            targets.append((Path(stage.write), True))
        for path, clean in targets:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(path.name + ".part")
            with open(partial, "w", encoding="utf-8") as out:
                out.writelines(dumps(public(row) if clean else row) + "\n" for row in rows)
            partial.replace(path)

    # -- an LLM stage --------------------------------------------------------------------------------------
    async def _run_llm(self, stage: Stage, rows: Rows, funnel: dict[str, Any]) -> tuple[Rows, bool] | None:
        """Send the stage's requests, in rounds while answers fall short; its output rows, and whether every
        request was answered (only then is the output kept for reuse)."""
        first = StagePlan(self.job, stage, rows=rows)
        first.first_request()  # a template that cannot render fails here, before anything is sent
        only: set[tuple[str, str, str]] | None = None
        results: Answers = {}
        rounds = 0
        for round in range(stage.max_rounds):
            plan = first if round == 0 else StagePlan(self.job, stage, rows=rows, round=round, only=only)
            self._count(plan, only)
            await self.dispatcher.run_stage(plan)
            rounds += 1
            if self.dispatcher.stopping:
                return None
            await self.writer.flush()
            results = await self.store.run(self._results, stage)
            only = {key for key, answers in results.items() if _short(stage, answers)}
            if not only:
                break
        out, dropped, failed = self._outputs(stage, first, rows, results, rounds)
        rejected: Counter[str] = Counter()
        for answers in results.values():
            for answer in answers:
                rejected.update(answer.get("rejected") or {})
        cost, sent = await self.store.stage_cost(self.run_id, stage.name)
        funnel.update(requests=sum(len(a) for a in results.values()), sent=sent, cost=cost, rounds=rounds,
                      dropped=dict(dropped), rejected=dict(rejected))
        return out, failed == 0

    def _count(self, plan: StagePlan, only: set[tuple[str, str, str]] | None) -> None:
        """Add the plan's requests to the live view's totals, per model."""
        if only is None:
            per_model = plan.total() // max(1, len(plan.models))
            for model in plan.models:
                self.stats.counters(plan.stage.name, model).total += per_model
        else:
            for _, model, _ in only:
                self.stats.counters(plan.stage.name, model).total += 1

    def _results(self, stage: Stage) -> Answers:
        """The stage's answers in this run, by (row id, model, variant without round), in round order."""
        found: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for line in self.store.sync.iter_results(self.run_id, stage.name):
            result = json.loads(line)
            variant = dict(result.get("variant") or {})
            result["_round"] = variant.pop("round", 0)
            found.setdefault((result["id"], result["model"], canonical_json(variant)), []).append(result)
        for answers in found.values():
            answers.sort(key=lambda r: r["_round"])
        return found

    def _outputs(self, stage: Stage, plan: StagePlan, rows: Rows, results: Answers,
                 rounds: int) -> tuple[Rows, Counter[str], int]:
        out: Rows = []
        dropped: Counter[str] = Counter()
        failed = 0
        for row in rows:
            row_id = str(row["_id"])
            for variant, base_json, variant_text in zip(plan.variants, plan.base_json, plan.variant_text, strict=True):
                for model in plan.models:
                    answers = results.get((row_id, model, base_json), [])
                    done = [a for a in answers if a.get("status") == "done"]
                    if not done:
                        failed += 1
                        dropped["request failed"] += 1
                        continue
                    value, used = _value(stage, done)
                    if used is None:
                        after = f" after {rounds} rounds" if rounds > 1 else ""
                        dropped[(f"fewer than {max(stage.min_items, 1)} valid items{after}" if stage.parses_list
                                 else f"answer unreadable{after}")] += 1
                        continue
                    new = {k: v for k, v in row.items() if k != "_id"}
                    new.update(variant)
                    if len(plan.models) > 1:
                        new["model"] = model
                    new[stage.field] = value
                    new[f"{stage.field}_response"] = used["response"]
                    new["_id"] = (row_id + (f"|{variant_text}" if variant_text else "")
                                  + (f"|{model}" if len(plan.models) > 1 else ""))
                    out.append(new)
        return out, dropped, failed


def _dataset_rows(job: Job, stage: Stage) -> Rows:
    """A dataset stage's rows with their ids. Rows downstream are told apart by id alone, so ids named by a
    field must be unique (line numbers are)."""
    rows: Rows = []
    seen: dict[str, int] = {}
    for line_no, row_id, row in dataset_rows(job, stage):
        if row_id in seen and stage.dataset is not None and not stage.dataset.explode:
            raise RunnerError(f"{stage.dataset.path}:{line_no}: id {row_id!r} (field {stage.dataset.id!r}) was "
                              f"already used on line {seen[row_id]}; ids must be unique: name another id field, or "
                              "none (line numbers)")
        seen.setdefault(row_id, line_no)
        rows.append({**row, "_id": row_id})
    return rows


def _short(stage: Stage, answers: list[dict[str, Any]]) -> bool:
    """Whether a (row, model, variant) should be asked again: it was answered, but not usably."""
    done = [a for a in answers if a.get("status") == "done"]
    if not done:
        return False  # a request that failed was retried by the dispatcher already
    return _value(stage, done)[1] is None


def _value(stage: Stage, done: list[dict[str, Any]]) -> tuple[Any, dict[str, Any] | None]:
    """The answer's value over its rounds, and the result it came from (None: not usable yet). A list answer
    gathers the distinct items of every round; any other takes the first round that parsed."""
    if stage.parses_list:
        items: list[Any] = []
        seen: set[str] = set()
        first_used = None
        for answer in done:
            for item in answer.get("parsed") or []:
                key = canonical_json(item)
                if key not in seen:
                    seen.add(key)
                    items.append(item)
                    first_used = first_used or answer
        if len(items) < max(stage.min_items, 1) or first_used is None:
            return None, None
        return items[: stage.max_items] if stage.max_items else items, first_used
    for answer in done:
        parsed = answer.get("parsed")
        if answer.get("valid", True) and parsed is not None and parsed != "":
            return parsed, answer
    return None, None

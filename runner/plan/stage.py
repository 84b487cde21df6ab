"""Expand a stage lazily into Tasks, each with its provider Call: rows × models × variants (seed, sample, user
variables).

Nothing here holds more than one row at a time: rows are streamed from the JSONL file and each Task is
built when the dispatcher asks for the next one.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runner.errors import RunnerError
from runner.plan.choices import LETTERS, NONE_OF_THEM, append_none_of_them, drop_option, options_block, permutation
from runner.plan.prompts import Prompt, load_prompt
from runner.plan.request import (
    LOGLIKELIHOOD,
    Call,
    Task,
    canonical_json,
    canonical_loglikelihood,
    canonical_params,
    canonical_tail,
    canonical_text,
    key_of,
)
from runner.providers.base import provider_class, split_model
from runner.spec.job import Choices, Job, Stage


def iter_rows(path: str | Path, limit: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) for each non-blank line of a JSONL file, streamed."""
    count = 0
    try:
        with open(path, encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                if limit is not None and count >= limit:
                    return
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RunnerError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise RunnerError(f"{path}:{line_no}: each line must be a JSON object")
                count += 1
                yield line_no, row
    except UnicodeDecodeError as exc:
        raise RunnerError(f"{path}:{_undecodable_line(path)}: a dataset file must be UTF-8, and this line is not "
                          f"(byte 0x{exc.object[exc.start]:02x}); convert the file, e.g. with "
                          "iconv -f latin1 -t utf-8") from None


def _undecodable_line(path: str | Path) -> int:
    """The number of the first line of a file that is not valid UTF-8 (a decoder reads ahead by blocks, so the
    line being parsed when it fails is not necessarily the culprit)."""
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return line_no
    return 1


def count_rows(path: str | Path, limit: int | None = None) -> int:
    count = 0
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                count += 1
                if limit is not None and count >= limit:
                    break
    return count


def _options_file(path: str) -> list[Any]:
    try:
        options = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunnerError(f"{path}: cannot read the options file ({exc})") from None
    if not isinstance(options, list) or not options:
        raise RunnerError(f"{path}: an options file must hold one non-empty JSON list")
    return options


def model_key(model: str, endpoints: dict[str, Any]) -> tuple[str, str, str]:
    """(provider, model name, the model id in cache keys: aliases and endpoints resolved)."""
    provider, name = split_model(model)
    return provider, name, provider_class(provider).model_id(name, endpoints)


def dataset_rows(job: Job, stage: Stage) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line number, row id, row) of a stage's dataset: its rows, or with ``explode`` the elements of each
    row's list, merged with the row's other fields; at most the job's limit."""
    dataset = stage.dataset
    assert dataset is not None
    limit = job.stage_limit(stage)
    count = 0
    # Ids named by a field must be unique (line numbers are, and so are ``<id>.<n>`` of unique ids): two rows with
    # one id would be paid for twice and kept as one task. Only a hash of each id is kept, so memory stays small.
    seen: set[int] | None = set() if dataset.id is not None else None
    for line_no, row in iter_rows(dataset.path, None if dataset.explode else limit):
        row_id = dataset_row_id(stage, line_no, row)
        if seen is not None:
            digest = hash(row_id)
            if digest in seen:
                _refuse_repeated_id(stage, row_id, line_no)
            seen.add(digest)
        if dataset.explode is None:
            yield line_no, row_id, row
            continue
        elements = row.get(dataset.explode)
        if not isinstance(elements, list) or not all(isinstance(e, dict) for e in elements):
            raise RunnerError(f"{dataset.path}:{line_no}: field {dataset.explode!r} must be a list of objects")
        parent = {k: v for k, v in row.items() if k != dataset.explode}
        for n, element in enumerate(elements, start=1):
            if limit is not None and count >= limit:
                return
            count += 1
            yield line_no, f"{row_id}.{n}", {**parent, **element}


def _refuse_repeated_id(stage: Stage, row_id: str, line_no: int) -> None:
    """Raise naming both lines when an earlier row has ``row_id`` (a hash seen before may be another id's)."""
    assert stage.dataset is not None
    path = stage.dataset.path
    for first, row in iter_rows(path):
        if first >= line_no:
            return
        if dataset_row_id(stage, first, row) == row_id:
            raise RunnerError(f"{path}:{line_no}: id {row_id!r} (field {stage.dataset.id!r}) was already used on line "
                              f"{first} ({path}:{first}); each row's id must be unique: fix the rows, name another id "
                              "field, or leave out dataset.id to number rows by line")


def dataset_row_id(stage: Stage, line_no: int, row: dict[str, Any]) -> str:
    assert stage.dataset is not None
    id_field = stage.dataset.id
    if id_field is None:
        return str(line_no)
    if id_field not in row:
        raise RunnerError(f"{stage.dataset.path}:{line_no}: the row has no id field {id_field!r}")
    return str(row[id_field])


def gold_index(where: str, line_no: int, row: dict[str, Any], choices: Choices, options: list[Any]) -> Any:
    """A multiple-choice row's gold answer as an option's index: given by its text, or an index that must be one
    of the options' (a gold of 7 among 4 options would score every answer wrong without a word)."""
    gold = row.get(choices.gold) if choices.gold else None
    if isinstance(gold, str):  # the gold option given by its text: its index among the options
        try:
            return [str(o) for o in options].index(gold)
        except ValueError:
            raise RunnerError(f"{where}:{line_no}: the gold answer {gold!r} is not one of the options") from None
    if isinstance(gold, int) and not isinstance(gold, bool) and not 0 <= gold < len(options):
        raise RunnerError(f"{where}:{line_no}: gold {gold} (field {choices.gold!r}) is not an option's index: the row "
                          f"has {len(options)} options, numbered 0 to {len(options) - 1}")
    return gold


def check_datasets(job: Job) -> None:
    """Read every dataset a stage reads, streamed, for what only its rows can say: JSON objects, ids unique (with
    ``dataset.id``), each multiple-choice row's options a list and its gold one of them. Raises RunnerError naming
    the file and line. ``runner validate`` runs it; a run finds the same while it plans."""
    for stage in job.stages:
        if stage.dataset is None:
            continue
        choices = stage.choices if stage.is_llm else None
        shared = _options_file(choices.options_file) if choices is not None and choices.options_file else None
        for line_no, _, row in dataset_rows(job, stage):
            if choices is None:
                continue
            options = shared if shared is not None else row.get(choices.field)
            if not isinstance(options, list) or not options:
                raise RunnerError(f"{stage.dataset.path}:{line_no}: field {choices.field!r} must be a non-empty list")
            gold_index(stage.dataset.path, line_no, row, choices, options)


class StagePlan:
    """The requests of one stage, produced on demand."""

    def __init__(self, job: Job, stage: Stage, rows: list[dict[str, Any]] | None = None, round: int = 0,
                 only: set[tuple[str, str, str]] | None = None) -> None:
        """``rows``: in a pipeline, the stage's input rows (each with its id in ``_id``) instead of its dataset.
        ``round``: a content retry's round: each request gets a new sample index, so a fresh answer.
        ``only``: the (row id, model, variant without round) to ask again in that round."""
        self.job = job
        self.stage = stage
        self.input_rows = rows
        self.round = round
        self.only = only
        #: recipe parsers read the row an answer belongs to
        self.keep_row = stage.parse_recipe
        self.models = job.stage_models(stage)
        self.params = job.stage_params(stage).model_dump()
        #: per model, the parameters as that model is sent them (capabilities.shape): what the cache key holds
        self.model_params = {m: job.model_params(stage, m) for m in self.models}
        self.prompt: Prompt = load_prompt(job, stage.prompt)
        self._model_ids = {m: model_key(m, job.endpoints) for m in self.models}
        self._params = {m: canonical_params(p) for m, p in self.model_params.items()}
        axes: dict[str, list[Any]] = {}
        if stage.choices is not None:
            axes["seed"] = list(stage.choices.seeds)
        if stage.samples > 1:
            axes["sample"] = list(range(stage.samples))
        axes.update(stage.variants)
        if round:
            axes["round"] = [round]
        names = list(axes)
        self.variants = [dict(zip(names, values, strict=True)) for values in itertools.product(*axes.values())]
        self.shared_options: list[Any] | None = None
        if stage.choices is not None and stage.choices.options_file:
            self.shared_options = _options_file(stage.choices.options_file)
        self.variant_json = [canonical_json(v) for v in self.variants]
        #: the variant as the task's item writes it ("seed=0,template=1")
        self.variant_text = [",".join(f"{k}={v}" for k, v in variant.items()) for variant in self.variants]
        #: each variant without its round: what ``only`` names
        self.base_json = [canonical_json({k: v for k, v in variant.items() if k != "round"})
                          for variant in self.variants]
        self._tails = {
            (model, index): canonical_tail(p, model_id, self.model_params[model], self.sample_of(variant))
            for model, (p, _, model_id) in self._model_ids.items() for index, variant in enumerate(self.variants)
        }

    def sample_of(self, variant: dict[str, Any]) -> int:
        """The request's sample index in its cache key: the variant's, moved on by the content-retry round."""
        return variant.get("sample", 0) + self.round * self.stage.samples + self.stage.sample_offset


    def total(self) -> int:
        if self.only is not None:
            return len(self.only)
        if self.input_rows is not None:
            rows = len(self.input_rows)
        elif self.stage.dataset is not None and self.stage.dataset.explode:
            rows = sum(1 for _ in self.rows())
        else:
            rows = count_rows(self.stage.dataset.path, self.job.stage_limit(self.stage))
        return rows * len(self.models) * len(self.variants)

    def __iter__(self) -> Iterator[Task]:
        for line_no, row_id, row in self.rows():
            yield from self.expand(line_no, row, row_id)

    def rows(self) -> Iterator[tuple[int, str, dict[str, Any]]]:
        """(line number, row id, row) of the stage's items: its input rows in a pipeline, else its dataset's."""
        if self.input_rows is not None:
            for n, row in enumerate(self.input_rows, start=1):
                yield n, str(row["_id"]), row
            return
        yield from dataset_rows(self.job, self.stage)

    def row_id(self, line_no: int, row: dict[str, Any]) -> str:
        if self.input_rows is not None:
            return str(row["_id"])
        return dataset_row_id(self.stage, line_no, row)

    def expand(self, line_no: int, row: dict[str, Any], row_id: str | None = None) -> Iterator[Task]:
        row_id = row_id if row_id is not None else self.row_id(line_no, row)
        choices = self.stage.choices
        original: list[str] | None = None
        gold = row.get(self.stage.gold) if choices is None and self.stage.gold else None
        if choices is not None:
            original = self.shared_options if choices.options_file else row.get(choices.field)
            if not isinstance(original, list) or not original:
                raise RunnerError(
                    f"{self.where}:{line_no}: field {choices.field!r} must be a non-empty list"
                )
            gold = gold_index(self.where, line_no, row, choices, original)
        gold_text = (str(original[gold]) if self.stage.review and choices is not None and choices.drop_gold
                     and original is not None and isinstance(gold, int) and 0 <= gold < len(original) else None)
        only = self.only
        for index, (variant, variant_json, base_json, variant_text) in enumerate(
                zip(self.variants, self.variant_json, self.base_json, self.variant_text, strict=True)):
            if only is not None and not any((row_id, m, base_json) in only for m in self.models):
                continue
            context = dict(row)
            context["row"] = row
            context.update(variant)
            perm = options = None
            if original is not None and choices is not None:
                if choices.drop_gold and isinstance(gold, int):
                    options, perm, _ = drop_option([str(o) for o in original], gold, row_id, variant["seed"],
                                                   choices.shuffle)
                else:
                    perm = permutation(len(original), row_id, variant["seed"], choices.shuffle)
                    options = [str(original[i]) for i in perm]
                if choices.none_option:
                    options, perm = append_none_of_them(options, perm, choices.none_option)
                context["options"] = options
                if len(options) <= len(LETTERS):  # more options (Bank-77's 77 intents) are shown without letters
                    context.update(letters=LETTERS[: len(options)], options_block=options_block(options))
            pairs: list[tuple[str, str]] | None = None
            try:
                if self.prompt.scores_loglikelihood:  # one (context, continuation) per option, in shown order
                    messages = []
                    pairs = [self.prompt.render_pair({**context, "option": option, "option_index": i})
                             for i, option in enumerate(options or ())]
                else:
                    messages = self.prompt.render(context)
            except Exception as exc:  # jinja2 raises many types: undefined names, bad filters, ...
                raise RunnerError(
                    f"{self.where}:{line_no}: prompt {self.prompt.name!r} of stage "
                    f"{self.stage.name!r} cannot be rendered: {exc}"
                ) from None
            recorded = {name: row.get(name) for name in self.stage.record} if self.stage.record else None
            # a recipe parser sees what the template saw: the row and the variant's values (a split, a relation)
            parser_row = {**row, **{k: v for k, v in variant.items() if k != "round"}} if self.keep_row else row
            for model in self.models:
                if only is not None and (row_id, model, base_json) not in only:
                    continue
                provider, name, model_id = self._model_ids[model]
                if pairs is None:
                    text = canonical_text(messages, self._tails[model, index])
                    call = Call(provider=provider, model_name=name, model_id=model_id, messages=messages,
                                params=self._params[model], canonical=text, key=key_of(text))
                else:
                    text = canonical_json(canonical_loglikelihood(provider, model_id, pairs))
                    call = Call(provider=provider, model_name=name, model_id=model_id, messages=messages, params={},
                                canonical=text, key=key_of(text), kind=LOGLIKELIHOOD, pairs=pairs)
                yield Task(
                    stage=self.stage.name,
                    item=f"{row_id}|{model}|{variant_text}",
                    row_id=row_id,
                    model=model,
                    variant=variant,
                    variant_json=variant_json,
                    call=call,
                    perm=perm,
                    options=options,
                    # without the gold option, the right answer is "none of them"
                    gold=NONE_OF_THEM if choices is not None and choices.drop_gold else gold,
                    n_options=len(original) if original is not None else 0,
                    gold_text=gold_text,
                    fields=recorded,
                    extra={"row": parser_row} if self.keep_row else {},
                )

    @property
    def where(self) -> str:
        """What a row's line number counts in: the dataset file, or the earlier stage's rows."""
        if self.stage.dataset is not None:
            return self.stage.dataset.path
        return f"stage {self.stage.name} (rows of {', '.join(self.stage.from_ or [])})"

    def first_request(self) -> Task | None:
        """Render the first request, so a template that cannot render fails before anything is sent."""
        return next(iter(self), None)

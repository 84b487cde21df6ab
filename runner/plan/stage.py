"""Expand a stage lazily into Tasks, each with its provider Call: rows × models × variants (seed, sample, user
variables).

Nothing here holds more than one row at a time: rows are streamed from the dataset (runner/plan/datasets.py
reads each format) and each Task is built when the dispatcher asks for the next one.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runner.errors import RunnerError
from runner.lazy_re import lazy_compile
from runner.plan.choices import LETTERS, NONE_OF_THEM, append_none_of_them, drop_option, options_block, permutation
from runner.plan.datasets import count_dataset, read_dataset
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
from runner.spec.inputs import Choices, Dataset
from runner.spec.schema import Job
from runner.spec.stage import Stage


def iter_rows(source: str | Path | Dataset, limit: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of each row of a dataset (a ``dataset:`` setting, or a file named by its path), streamed:
    a JSONL file's non-blank lines, or the rows of any format runner/plan/datasets.py reads."""
    for line_no, _, row in read_dataset(source, limit):
        yield line_no, row


def count_rows(source: str | Path | Dataset, limit: int | None = None) -> int:
    return count_dataset(source, limit)


def _options_file(path: str) -> list[Any]:
    try:
        options = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunnerError(f"{path}: cannot read the options file ({exc})") from None
    if not isinstance(options, list) or not options:
        raise RunnerError(f"{path}: an options file must hold one non-empty JSON list")
    return options


def model_key(model: str, endpoints: dict[str, Any], job: Job | None = None) -> tuple[str, str, str]:
    """(provider, model name as the provider is asked for it, the model id in cache keys: aliases and endpoints
    resolved). With ``job``, a local model's weights are found as the job names them (a GGUF path from its folder,
    ``providers.local.model_path``): its name is then the file's absolute path and its id the file's content."""
    provider, name = split_model(model)
    if job is not None and provider == "local":
        from runner.providers.local import local_model

        found = local_model(name, job)
        return provider, found.name, found.model_id
    settings = job.providers.get(provider) if job is not None else None
    return provider, name, provider_class(provider).model_id(name, endpoints, settings)


def dataset_rows(job: Job, stage: Stage) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line number, row id, row) of a stage's dataset: its rows, or with ``explode`` the elements of each
    row's list, merged with the row's other fields; at most the job's limit."""
    assert stage.dataset is not None
    return _rows(stage.dataset, job.stage_limit(stage))


def _rows(dataset: Dataset, limit: int | None) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """:func:`dataset_rows` of ``dataset``, at most ``limit`` rows."""
    count = 0
    # Ids named by a field must be unique (row numbers are, and so are ``<id>.<n>`` of unique ids): two rows with
    # one id would be paid for twice and kept as one task. Only a hash of each id is kept, so memory stays small.
    seen: set[int] | None = set() if dataset.id is not None else None
    for line_no, number, row in read_dataset(dataset, None if dataset.explode else limit):
        row_id = _row_id(dataset, line_no, row, number)
        if seen is not None:
            digest = hash(row_id)
            if digest in seen:
                _refuse_repeated_id(dataset, row_id, line_no)
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


def _refuse_repeated_id(dataset: Dataset, row_id: str, line_no: int) -> None:
    """Raise naming both lines when an earlier row has ``row_id`` (a hash seen before may be another id's)."""
    path = dataset.path
    for first, number, row in read_dataset(dataset):
        if first >= line_no:
            return
        if _row_id(dataset, first, row, number) == row_id:
            raise RunnerError(f"{path}:{line_no}: id {row_id!r} (field {dataset.id!r}) was already used on line "
                              f"{first} ({path}:{first}); each row's id must be unique: fix the rows, name another id "
                              "field, or leave out dataset.id to number rows by line")


def dataset_row_id(stage: Stage, line_no: int, row: dict[str, Any], number: int | None = None) -> str:
    """The row's id: its ``dataset.id`` field, else its number among the rows (``line_no`` when not given)."""
    assert stage.dataset is not None
    return _row_id(stage.dataset, line_no, row, number)


def _row_id(dataset: Dataset, line_no: int, row: dict[str, Any], number: int | None = None) -> str:
    id_field = dataset.id
    if id_field is None:
        return str(line_no if number is None else number)
    if id_field not in row:
        raise RunnerError(f"{dataset.path}:{line_no}: the row has no id field {id_field!r}")
    return str(row[id_field])


def row_options(where: str, line_no: int, row: dict[str, Any], choices: Choices,
                shared: list[Any] | None) -> list[Any]:
    """A multiple-choice row's options in their original order: the options file's, the values of
    ``choices.fields`` (one column each), or the list in ``choices.field``."""
    if shared is not None:
        return shared
    if choices.fields is not None:
        for name in choices.fields:
            if row.get(name) is None:
                raise RunnerError(f"{where}:{line_no}: the row has no value in field {name!r}, one of choices.fields "
                                  f"{choices.fields}")
        return [row[name] for name in choices.fields]
    options = row.get(choices.field)
    if not isinstance(options, list) or not options:
        raise RunnerError(f"{where}:{line_no}: field {choices.field!r} must be a non-empty list")
    return options


#: a gold answer given as a letter: "B", "b", "(B)", "B." or "B)"
_GOLD_LETTER = lazy_compile(r"\(([A-Za-z])\)|([A-Za-z])[.)]?")


def gold_index(where: str, line_no: int, row: dict[str, Any], choices: Choices, options: list[Any]) -> Any:
    """A multiple-choice row's gold answer as an option's index, in the order ``Choices.gold`` says: an option's
    text, an index, a letter, a string of digits. An index must be one of the options' (a gold of 7 among 4
    options would score every answer wrong without a word)."""
    gold = row.get(choices.gold) if choices.gold else None
    if isinstance(gold, str):
        texts = [str(o) for o in options]
        if gold in texts:  # the gold option given by its text: its index among the options
            return texts.index(gold)
        answer = gold.strip()
        letter = _GOLD_LETTER.fullmatch(answer)
        if letter is not None:
            index = LETTERS.index((letter[1] or letter[2]).upper())
            if index < len(options):
                return index
            raise RunnerError(f"{where}:{line_no}: the gold answer {gold!r} is not one of the options, nor a letter "
                              f"among A to {LETTERS[min(len(options), len(LETTERS)) - 1]}")
        if not (answer.isascii() and answer.isdigit()):
            raise RunnerError(f"{where}:{line_no}: the gold answer {gold!r} is not one of the options")
        gold = int(answer)  # an index written as text, as a CSV cell holds it
    if isinstance(gold, int) and not isinstance(gold, bool) and not 0 <= gold < len(options):
        raise RunnerError(f"{where}:{line_no}: gold {gold} (field {choices.gold!r}) is not an option's index: the row "
                          f"has {len(options)} options, numbered 0 to {len(options) - 1}")
    return gold


def check_datasets(job: Job) -> None:
    """Read every dataset a stage reads, streamed, for what only its rows can say: rows readable in their format,
    ids unique (with ``dataset.id``), each multiple-choice row's options present and its gold one of them, the
    ``cluster:`` field in every row. Raises
    RunnerError naming the file and line of the first problem; a run finds the same while it plans."""
    for stage in job.stages:
        if stage.dataset is None:
            continue
        problems = dataset_problems(stage.dataset, stage.choices if stage.is_llm else None, job.stage_limit(stage),
                                    most=1, cluster=stage.cluster)
        if problems:
            raise RunnerError(problems[0])


#: the problems :func:`dataset_problems` says of one dataset at most, by default
MOST_ROW_PROBLEMS = 20


def dataset_problems(dataset: Dataset, choices: Choices | None, limit: int | None,
                     most: int = MOST_ROW_PROBLEMS, cluster: str | None = None) -> list[str]:
    """Each problem of a dataset's rows (``file:line: what``; the first ``limit`` rows): a row with options or a
    gold that is not one of them is said and the reading goes on, while a row that cannot be read or an id used
    twice ends it. At most ``most`` problems, then a sentence saying the reading stopped there. With ``cluster``
    (the stage's ``cluster:`` field), the first row without it is said too."""
    problems: list[str] = []
    stopped = False
    try:
        shared = _options_file(choices.options_file) if choices is not None and choices.options_file else None
        for line_no, _, row in _rows(dataset, limit):
            if cluster is not None and row.get(cluster) in (None, ""):
                problems.append(f"{dataset.path}:{line_no}: the row has no {cluster!r} field, which the stage's "
                                f"cluster: names (every row needs one: the items it groups answer alike)")
                cluster = None  # the first such row is said, not every one
            if choices is None:
                continue
            try:
                gold_index(dataset.path, line_no, row, choices, row_options(dataset.path, line_no, row, choices,
                                                                            shared))
            except RunnerError as exc:
                problems.append(str(exc))
                if len(problems) >= most:
                    stopped = True
                    break
    except RunnerError as exc:  # a row that cannot be read, an id used twice: the rows after it are not read
        problems.append(str(exc))
    if stopped and most > 1:
        problems.append(f"{dataset.path}: {most} rows have problems; the rows after them were not checked")
    return problems


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
        self.keep_row = stage.parse_recipe or stage.parse_plugin
        #: the row fields each result line carries (record: and cluster:)
        self.recorded = stage.recorded_fields
        if stage.parse_plugin or stage.scorer is not None:  # one's own parser or scorer, from the job's folder
            from runner.evaluate.plugins import load_stage_plugins

            load_stage_plugins(stage, job.base_dir)
        self.models = job.stage_models(stage)
        self.params = job.stage_params(stage).model_dump()
        #: per model, the parameters as that model is sent them (capabilities.shape): what the cache key holds
        self.model_params = {m: job.model_params(stage, m) for m in self.models}
        self.prompt: Prompt = load_prompt(job, stage.prompt)
        self._model_ids = {m: model_key(m, job.endpoints, job) for m in self.models}
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
            rows = count_rows(self.stage.dataset, self.job.stage_limit(self.stage))
        return rows * len(self.models) * len(self.variants)

    def __iter__(self) -> Iterator[Task]:
        for line_no, row_id, row in self.rows():
            yield from self.expand(line_no, row, row_id)

    def rows(self) -> Iterator[tuple[int, str, dict[str, Any]]]:
        """(line number, row id, row) of the stage's items: its input rows in a pipeline, else its dataset's. A
        stage that stops early (``stop:``) asks its items in an order shuffled by the rule's seed, the same in every
        attempt of the run (its confidence sequence is valid for items drawn in a random order)."""
        if self.input_rows is not None:
            for n, row in enumerate(self.input_rows, start=1):
                yield n, str(row["_id"]), row
            return
        if self.stage.stop is None:
            yield from dataset_rows(self.job, self.stage)
            return
        found = list(dataset_rows(self.job, self.stage))
        shuffle = random.Random(f"stop:{self.stage.stop.seed}").shuffle
        field = self.stage.cluster
        if self.stage.stop.target == "population" and field is not None:
            # whole clusters in a shuffled order, each cluster's items together (the clusters are the draws)
            by: dict[str, list[tuple[int, str, dict[str, Any]]]] = {}
            for entry in found:
                by.setdefault(str(entry[2].get(field)), []).append(entry)
            groups = list(by.values())
            shuffle(groups)
            found = [entry for group in groups for entry in group]
        else:
            shuffle(found)
        yield from found

    def cluster_order(self) -> list[tuple[str, list[str]]]:
        """(cluster, its row ids) in the order :meth:`rows` gives them (each row its own cluster without a
        ``cluster:`` field)."""
        field = self.stage.cluster
        order: dict[str, list[str]] = {}
        for _, row_id, row in self.rows():
            order.setdefault(row_id if field is None else str(row.get(field)), []).append(row_id)
        return list(order.items())

    def item_order(self) -> list[str]:
        """The row ids in the order :meth:`rows` gives them."""
        return [row_id for _, row_id, _ in self.rows()]

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
            original = row_options(self.where, line_no, row, choices, self.shared_options)
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
            recorded = {name: row.get(name) for name in self.recorded} if self.recorded else None
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

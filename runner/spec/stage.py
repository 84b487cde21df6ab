"""A stage of the job file: its model (:class:`Stage`), an LLM stage (a prompt sent to each of its models per row)
or a data stage (one data operation over earlier stages' rows, runner/spec/steps.py), with the ``stop:`` rule an
LLM stage may carry (:class:`StopRule`) and the answer kinds it can parse without a parser of its own
(``BUILTIN_PARSES``). The job that holds the stages is runner/spec/schema.py's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from runner.evaluate.plugins import PARSER_GROUP, entry_point_names, is_import_path
from runner.spec.fields import MAX_COUNT, MAX_ROWS, MAX_SAMPLES, Seed, Strict, deadline_seconds, within
from runner.spec.inputs import Choices, Dataset, InlinePrompt
from runner.spec.settings import BudgetLimit, Fallback, Mode, Params, PromptCacheMode, Tier, tier_setting
from runner.spec.steps import (
    DATA_OPS,
    DedupeStep,
    ExplodeStep,
    FilterStep,
    GroupStep,
    JoinStep,
    SampleStep,
    ShuffleStep,
    SimilarityStep,
    TopKStep,
)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
BUILTIN_PARSES = ("letter", "letters", "yes_no", "scale", "label", "none_of_them", "text", "lines", "loglikelihood",
                  "json")


class StopRule(Strict):
    """A stage's ``stop:``: stop asking once the answer is known (runner/engine/early_stop.py). Items are asked in
    an order shuffled by ``seed``; after each answered item an anytime-valid confidence sequence of the benchmark's
    mean (runner/evaluate/sequential.py) is updated, and the stage stops sending when the rule holds."""

    #: stop once every model's accuracy is known to within this (a half-width, in [0, 1] units)
    halfwidth: float | None = Field(default=None, gt=0, lt=0.5)
    #: stop once the sign of each pair's difference is settled: two of the stage's models, or "all" (every pair)
    decide: list[str] | Literal["all"] | None = None
    #: the error allowed over every look and every sequence together (split evenly between them)
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    #: items answered before the rule is looked at
    min_items: int = Field(default=0, ge=0, le=MAX_ROWS)
    #: the order the items are asked in
    seed: Seed = 0
    #: what the sequences are of: the benchmark's own mean (its items drawn without replacement: exact once all are
    #: in), or the mean of the population its items (or, with cluster:, its clusters) are drawn from, which a
    #: finite benchmark may never settle
    target: Literal["benchmark", "population"] = "benchmark"

    @model_validator(mode="after")
    def _one_rule(self) -> StopRule:
        if self.halfwidth is None and self.decide is None:
            raise ValueError("stop: needs halfwidth: (each model's accuracy to within it) or decide: (two of the "
                             "stage's models, or all)")
        if isinstance(self.decide, list) and (len(self.decide) != 2 or self.decide[0] == self.decide[1]):
            raise ValueError("decide: names two different models of the stage, or is all")
        return self


class Stage(Strict):
    #: the stage's name: its results file is ``<name>.jsonl``, and ``from:`` and reports name it
    name: str = Field(pattern=NAME_PATTERN)
    #: the rows the stage reads (or, in a pipeline, ``from:``)
    dataset: Dataset | None = None
    #: in a pipeline: the earlier stage(s) whose output rows this stage reads
    from_: list[str] | None = Field(default=None, alias="from")
    #: the models this stage asks, instead of the job's
    models: list[str] | None = None
    #: a template file's name under prompts/ (``newterm/coma-exercise``), or an inline prompt
    prompt: str | InlinePrompt | None = None
    #: multiple choice: where the options and the gold come from, and the seeds of their shuffle
    choices: Choices | None = None
    #: more axes to cross with the rows, each a list of values the prompt sees by name (``{template: [0, 1, 2]}``)
    variants: dict[str, list[Any]] = Field(default_factory=dict)
    #: how many times each prompt is asked (the sample index is part of the cache key)
    samples: Annotated[int, within(1, MAX_SAMPLES)] = 1
    #: the stage's generation parameters, merged over the job's
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
    #: the stage's results file, instead of ``<output_dir>/<job>/<run id>/<stage>.jsonl``
    output: str | None = None
    #: the most this stage may spend, in USD and/or tokens (it stops alone when spent)
    budget: BudgetLimit | None = None
    #: how the stage's requests are sent: online, through the providers' Batch APIs, or auto (the job's when unset)
    mode: Mode | None = None
    #: provider prompt caching planned by the runner (auto) or not (off); the job's when unset
    prompt_cache: PromptCacheMode | None = None
    #: the service tier its requests are sent at (standard, flex, priority: runner/providers/tiers.py), or one per
    #: model, ``{provider:model: tier}``; the job's for the models it does not name
    tier: Tier | dict[str, Tier] | None = None
    #: ``standard``: a flex request the provider still sheds after ``retry.flex_wait`` is sent at standard (and
    #: said once in the run's notes); unset: it fails (``flex_unavailable``); the job's when unset
    fallback: Fallback | None = None
    #: when this stage's answers are needed (the job's ``deadline:`` form); the job's when unset
    deadline: str | None = None
    #: row fields copied into each result line (under ``fields``), for reports by them (WinoDict's bucket)
    record: list[str] = Field(default_factory=list)
    #: the row field whose items answer alike (a story, a passage, a term, a concept): every mean, difference and
    #: interval of the stage is then cluster-robust over its values (runner/evaluate/clusters.py), and it is
    #: recorded in each result line as ``record:`` fields are
    cluster: str | None = Field(default=None, min_length=1)
    #: stop asking once the answer is known (``StopRule``)
    stop: StopRule | None = None
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
    min_items: Annotated[int, within(0, MAX_COUNT)] = 1
    #: keep at most this many items of a list answer
    max_items: Annotated[int | None, within(1, MAX_COUNT)] = None
    #: how many times a row whose answer cannot be parsed (or has too few items) is asked, each time with a
    #: new sample index so the cache does not return the same answer
    max_rounds: int = Field(default=1, ge=1, le=20)
    #: added to every request's sample index: a stage that sends the very prompt another stage sends gets its
    #: own answers (NewTerm's COST and CSJ sentences share a prompt but not their samples)
    sample_offset: Annotated[int, within(0, MAX_COUNT)] = 0

    # -- pipelines: data operations (exactly one, instead of a prompt)
    #: rows of several ``from:`` stages joined on equal fields
    join: JoinStep | None = None
    #: true: the rows of the ``from:`` stages one after the other
    concat: bool | None = None
    #: a row per element of a list field
    explode: ExplodeStep | None = None
    #: a row per group of rows sharing fields, their other fields collected into lists
    group: GroupStep | None = None
    #: the first row of each group of rows sharing fields
    dedupe: DedupeStep | None = None
    #: ``n`` rows drawn at random (seeded) from each group
    sample: SampleStep | None = None
    #: the rows in a seeded random order
    shuffle: ShuffleStep | None = None
    #: the ``k`` rows of each group with the highest (or lowest) score
    top_k: TopKStep | None = None
    #: only the rows a Jinja expression keeps
    filter: FilterStep | None = None
    #: fields set on every row, each from a Jinja expression over the row (``{F: EXPRESSION}``)
    set: dict[str, str] | None = None
    #: the similarity of two text fields of each row, into a new field
    similarity: SimilarityStep | None = None
    #: a named Python step of runner/recipes/ (``newterm.related_terms``), with ``args:``
    recipe: str | None = None
    #: arguments of ``recipe:``
    args: dict[str, Any] = Field(default_factory=dict)
    #: write the stage's output rows (without fields starting with "_") to this JSONL file
    write: str | None = None

    @field_validator("from_", mode="before")
    @classmethod
    def _one_source(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    _tier = field_validator("tier", mode="before")(tier_setting)
    _deadline = field_validator("deadline", mode="before")(lambda value: deadline_setting(value))

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
    def recorded_fields(self) -> list[str]:
        """The row fields each result line carries: ``record:``, and the ``cluster:`` field."""
        if self.cluster is None or self.cluster in self.record:
            return self.record
        return [*self.record, self.cluster]

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


def deadline_setting(value: Any) -> Any:
    if value is None:
        return None
    deadline_seconds(str(value), 0.0)  # raises a ValueError pydantic reports at the key's line
    return str(value)

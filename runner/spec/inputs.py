r"""What an LLM stage reads and renders, in the job file's schema (runner/spec/schema.py): its rows
(:class:`Dataset`, read by runner/plan/datasets.py), its prompt written in the job file (:class:`InlinePrompt`, with
its earlier :class:`Turn`\ s) and its answer options (:class:`Choices`, shuffled per row and seed)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, model_validator

from runner.spec.fields import MAX_ROWS, Strict, seeds_within, within

__all__ = ["FORMAT_OF_NAME", "Choices", "Dataset", "InlinePrompt", "Turn"]

#: the key, in the validation context, of the dataset reader's ``format_of_name`` (runner/plan/datasets.py): the
#: loader hands it in (``validation_context`` in runner/spec/checks.py), so the schema imports nothing of the plan
FORMAT_OF_NAME = "format_of_name"


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
    limit: Annotated[int | None, within(1, MAX_ROWS)] = None
    #: the field holding each row's id; by default the row's number: its line in a JSONL file, its place from 1
    #: (the header not counted) in the other formats
    id: str | None = None
    #: a field holding a list of objects (e.g. MC-Test's ``question_list``): each becomes a row of its own,
    #: with the parent row's fields and its own, and the id ``<parent id>.<n>``
    explode: str | None = None

    @model_validator(mode="after")
    def _split_of_a_folder(self, info: ValidationInfo) -> Dataset:
        # checked here rather than in runner/spec/checks.py so it is reported with the file's other key errors;
        # a Dataset built without the loader's context goes by ``format:`` alone
        format_of_name = (info.context or {}).get(FORMAT_OF_NAME)
        fmt = self.format or (format_of_name(self.path) if format_of_name is not None else None)
        if self.split is not None and fmt not in (None, "hf"):
            raise ValueError(f"split: is only for a Hugging Face dataset folder (format: hf), and this dataset is "
                             f"read as {fmt}")
        return self


class Turn(Strict):
    #: who says it
    role: Literal["user", "assistant"]
    #: the turn's text (a Jinja2 template, as the prompt's)
    content: str


class InlinePrompt(Strict):
    """A chat prompt (``user``, with an optional ``system`` and earlier ``messages``), or a log-likelihood prompt:
    a ``context`` and the ``continuation`` whose log-probability after it is scored, rendered once per option
    (``option``, ``option_index``) of a ``parse: loglikelihood`` stage."""

    #: the system message (a Jinja2 template over the row's fields)
    system: str | None = None
    #: earlier turns of a conversation (few-shot examples, a previous answer), between system and user
    messages: list[Turn] = Field(default_factory=list)
    #: the user message (a Jinja2 template over the row's fields)
    user: str | None = None
    #: log-likelihood: the text before each option's continuation (a template)
    context: str | None = None
    #: log-likelihood: the text whose log-probability after the context is scored, once per option (a template)
    continuation: str | None = None
    #: the paper and table the prompt reproduces (free text, as a template file's ``source:``)
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
    #: the seeds of the option shuffle: each is one request per row and model
    seeds: Annotated[list[int], AfterValidator(seeds_within)] = Field(default_factory=lambda: [0, 1, 2])
    #: false: the options are shown in the row's order under every seed
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

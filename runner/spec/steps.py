"""The data operations a pipeline stage may do instead of sending a prompt (join, explode, sample, filter, ...):
their settings as the job file writes them. runner/plan/steps.py carries them out."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from runner.spec.fields import MAX_COUNT, Seed, Strict, within


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
    #: the field a non-object element is stored under (default: the list field's name)
    as_: str | None = Field(default=None, alias="as")


class GroupStep(Strict):
    #: the fields whose values make a group
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
    #: rows drawn from each group
    n: Annotated[int, within(1, MAX_COUNT)]
    #: the draw's seed (the job's ``seed:`` when unset)
    seed: Seed | None = None


class ShuffleStep(Strict):
    #: the order's seed (the job's ``seed:`` when unset)
    seed: Seed | None = None


class TopKStep(KeyedStep):
    #: rows kept from each group
    k: Annotated[int, within(1, MAX_COUNT)]
    #: the numeric field ranked (rows without it rank last)
    score: str
    #: desc: the highest scores; asc: the lowest
    order: Literal["desc", "asc"] = "desc"


class FilterStep(Strict):
    #: a Jinja expression over the row's fields, e.g. ``rating >= 8 if gold else rating <= 3``
    keep: str
    #: the funnel report's name for the rows it drops
    rule: str | None = None


class SimilarityStep(Strict):
    #: the first text field
    a: str
    #: the second text field
    b: str
    #: the new field the similarity (a cosine) goes into
    as_: str = Field(alias="as")


#: the data operations a stage may be instead of a prompt (exactly one per stage)
DATA_OPS = ("join", "concat", "explode", "group", "dedupe", "sample", "shuffle", "top_k", "filter", "set",
            "similarity", "recipe")


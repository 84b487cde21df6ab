"""A finished task's result line: the raw answer parsed by the stage's parser, mapped back from the shown order
to the original options, and scored by the parse kind's scorer (:mod:`runner.evaluate.scorers`).

The line is what the results file and the store's task row hold; the dispatcher only hands over the text, and
the model's thinking, which the line keeps (``thinking``, ``reasoning_tokens``) and no parser reads.

``parse: json`` (:mod:`runner.evaluate.structured`): ``parsed`` is the answer's JSON value. With
``answer_field:``, that field is read by the ``score_as`` parser exactly as a plain answer of that kind would
be (a letter mapped back through the shown order, ``answer_letter`` as for letters) into ``answer``, which is
scored against the gold; without ``score_as`` the field's value itself is compared with the gold. Without
``answer_field:``, the parsed value is scored by equality with the gold when the row has one, and not scored
otherwise (a structured answer without a gold is data, as ``parse: text`` is). Invalid JSON, a schema
violation and a missing field make the answer invalid (``invalid_reason`` says why), scored wrong like any
invalid answer.

Every line carries its ``provenance`` (:func:`line_provenance`): the run, the job's fingerprint, the prompt
template (name, file and SHA-256), the model id that keys the cache (for a local model, its weights' content), the
parameters sent and the runner's version. It is the same for every task of a stage and model, so the dispatcher
builds it once per pair and hands the same object to each line; the recorder adds what produced the line's answer
(``reported_model``, ``sent_with``: runner/engine/recorder.py ``Origins``).
"""

from __future__ import annotations

from typing import Any

from runner.evaluate import plugins
from runner.evaluate.parse import parse_answer, parse_letter
from runner.evaluate.provenance import line_provenance, runner_version
from runner.evaluate.scorers import score
from runner.evaluate.structured import field_text, parse_json
from runner.plan.choices import LETTERS, NONE_OF_THEM, inverse_partial
from runner.plan.request import Task
from runner.providers.base import parse_loglikelihoods
from runner.recipes import parse_items
from runner.spec.stage import Stage

__all__ = ["line_provenance", "result_line", "runner_version"]


def result_line(stage: Stage, req: Task, text: str | None, *, status: str, cache_hit: bool,
                notes: list[str], thinking: str | None = None, reasoning_tokens: int = 0,
                provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """The result line of one finished task: the answer parsed, mapped back through the shown order and scored.
    ``notes``: where a recipe parser's failure is told to the run (once per message). ``thinking`` (the model's
    thinking text) and ``reasoning_tokens`` are kept in the line when there are any; parsers read ``text`` only.
    ``provenance``: :func:`line_provenance` of the task's stage and model."""
    result: dict[str, Any] = {
        "id": req.row_id,
        "stage": req.stage,
        "model": req.model,
        "variant": req.variant,
        "seed": req.variant.get("seed"),
        "permutation": req.perm,
        "inverse": inverse_partial(req.perm, req.n_options) if req.perm is not None else None,
        "response": text,
    }
    if thinking:
        result["thinking"] = thinking
    if reasoning_tokens > 0:
        result["reasoning_tokens"] = reasoning_tokens
    result.update(parsed=None, gold=req.gold, score=None, status=status, cache_hit=cache_hit, cache_key=req.key)
    if provenance is not None:
        result["provenance"] = provenance
    if req.fields is not None:  # row fields the stage records for its reports
        result["fields"] = req.fields
    if stage.review:  # what a person (or a judge job) judging the answer needs
        # the task's identity in the stage (row id | model | variant): unique per line, so a judge job can
        # use it as its dataset id and `runner report --judged` can match verdicts to answers
        result["item"] = req.item
        result["options_shown"] = req.options
        result["prompt"] = req.messages[-1]["content"]
        if req.gold_text is not None:  # the removed gold option (Know-No's no-hint prompts)
            result["gold_text"] = req.gold_text
    if text is None:
        return result
    _answer(stage, req, text, result, notes)
    if stage.scorer is not None and not stage.review:
        _own_score(stage, req, result, notes)
    return result


def _answer(stage: Stage, req: Task, text: str, result: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """``result`` with the answer read by the stage's parser and scored by its kind's scorer."""
    kind = stage.parse
    if kind == "text":
        result["parsed"] = text.strip()
        return result
    if kind == "loglikelihood":
        return _loglikelihood(req, text, result)
    if kind == "json":
        return _structured(stage, req, text, result)
    if stage.parse_plugin:
        return _own_parser(stage, req, text, result, notes)
    if stage.parses_list:  # a list of items (pipelines), never scored
        return _items(req, stage, text, result, notes)
    _read(stage, req, text, kind, result, "parsed")
    return result if stage.review else _scored(req, kind, result)


def _tell_once(notes: list[str], message: str) -> None:
    if message not in notes:
        notes.append(message)


def _own_parser(stage: Stage, req: Task, text: str, result: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """An answer read by one's own parser (:mod:`runner.evaluate.plugins`): with choices, the index it returns
    is of the shown order and is mapped back to the original one."""
    fn = plugins.load(stage.parse, plugins.PARSER_GROUP)
    options = [str(option) for option in req.options or ()]
    try:
        value, why = plugins.call_parser(fn, text, options, req.extra.get("row") or {})
    except Exception as exc:  # the parser's bug: the paid answer is kept, marked (not scored), the run told once
        reason = f"parser {stage.parse} failed: {type(exc).__name__}: {exc}"
        _tell_once(notes, reason)
        result.update(valid=False, invalid_reason=reason)
        return result
    if why is None and req.options is not None:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < len(req.options):
            # the parser broke its contract: not the model's fault, so not scored, and the run told once
            reason = f"the parser {stage.parse} returned {value!r}, not the index of one of the " \
                     f"{len(req.options)} options shown"
            _tell_once(notes, reason)
            result.update(valid=False, invalid_reason=reason)
            return result
        if value < len(LETTERS):
            result["answer_letter"] = LETTERS[value]
        value = req.perm[value] if req.perm is not None else value
    result["valid"] = why is None
    if why is None:
        result["parsed"] = value
    else:
        result["invalid_reason"] = why
    return result if stage.review else _scored(req, "exact", result)


def _own_score(stage: Stage, req: Task, result: dict[str, Any], notes: list[str]) -> None:
    """The score under one's own scorer, for a valid answer of a task with a gold (an invalid one scores 0)."""
    if req.gold is None:
        return
    field = "answer" if stage.parse == "json" and stage.answer_field is not None else "parsed"
    if result.get("valid") is False:
        result["score"] = 0.0
        return
    fn = plugins.load(stage.scorer, plugins.SCORER_GROUP)
    try:
        result["score"] = plugins.call_scorer(fn, result.get(field), req.gold)
    except Exception as exc:  # the scorer's bug: the answer is kept unscored, and the run told once
        result["score"] = None
        _tell_once(notes, f"scorer {stage.scorer} failed: {type(exc).__name__}: {exc}")


def _read(stage: Stage, req: Task, text: str, kind: str, result: dict[str, Any], into: str) -> None:
    """Parse ``text`` as ``kind`` into ``result[into]`` (an option mapped back through the shown order), with
    ``valid``, ``invalid_reason`` (the reason class, and why where the parser says: "not_found: options echoed")
    and ``answer_letter``."""
    if stage.scoring == "default" and kind == "letter" and req.options is not None:
        parsed = parse_letter(text, req.options, LETTERS, mode=stage.parse_mode)  # the common case, direct
    else:
        parsed = parse_answer(text, kind, options=req.options or (), mode=stage.parse_mode, family=stage.answers,
                              scoring=stage.scoring)
    result["valid"] = parsed.valid
    if not parsed.valid:
        result["invalid_reason"] = parsed.why
    elif kind in ("letter", "label"):
        if kind == "letter" and parsed.value < len(LETTERS):
            result["answer_letter"] = LETTERS[parsed.value]
        result[into] = req.perm[parsed.value] if req.perm is not None else parsed.value
    elif kind == "letters":
        result[into] = sorted(req.perm[i] for i in parsed.value) if req.perm is not None else list(parsed.value)
    elif kind == "none_of_them":
        result[into] = NONE_OF_THEM if parsed.value else None
    else:
        result[into] = parsed.value


def _structured(stage: Stage, req: Task, text: str, result: dict[str, Any]) -> dict[str, Any]:
    """A ``parse: json`` answer: the JSON value (checked against the stage's schema) in ``parsed``; with
    ``answer_field:``, that field read by the ``score_as`` parser into ``answer`` and scored (module docstring)."""
    schema = stage.schema_ if isinstance(stage.schema_, dict) else None
    parsed = parse_json(text, schema)
    result["valid"] = parsed.valid
    result["parsed"] = parsed.value
    field = stage.answer_field
    if field is None:
        if not parsed.valid:
            result["invalid_reason"] = parsed.reason
        return result if stage.review else _scored(req, "json", result)
    result["answer"] = None
    kind = stage.score_as or "json"
    got = field_text(parsed.value, field) if parsed.valid else parsed
    if not got.valid:
        result.update(valid=False, invalid_reason=got.reason)
    elif kind in ("json", "text"):  # the field's value itself
        value = parsed.value[field]
        result["answer"] = value.strip() if isinstance(value, str) else value
    else:
        _read(stage, req, got.value, kind, result, "answer")
    return result if stage.review else _scored(req, kind, result, "answer")

def _items(req: Task, stage: Stage, text: str, result: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """A list answer (``lines`` or a recipe parser): its items, and the pieces rejected by rule."""
    try:
        found = parse_items(stage.parse, text, req.extra.get("row") or {}, stage.parse_args)
    except Exception as exc:  # a recipe's bug: the paid answer is kept, the item marked and the run told
        reason = f"parser {stage.parse} failed: {type(exc).__name__}: {exc}"
        if reason not in notes:
            notes.append(reason)
        result.update(valid=False, invalid_reason=reason, parsed=[])
        return result
    result.update(parsed=found.items, valid=len(found.items) >= stage.min_items)
    if found.rejected:
        result["rejected"] = dict(found.rejected)
    return result


def _loglikelihood(req: Task, text: str, result: dict[str, Any]) -> dict[str, Any]:
    """A log-likelihood answer: the option whose continuation is the likeliest (the first one on a tie), as the
    WinoDict and Winograd evaluations compare the summed log-probabilities of the same continuation."""
    try:
        scores = parse_loglikelihoods(text)
    except ValueError as exc:
        result.update(valid=False, invalid_reason=f"unreadable log-likelihoods: {exc}")
        return _scored(req, "loglikelihood", result)
    result["logprobs"] = [score.logprob for score in scores]
    if not scores or (req.options is not None and len(scores) != len(req.options)):
        result.update(valid=False, invalid_reason=f"{len(scores)} log-likelihoods for {len(req.options or ())} "
                                                  "options")
        return _scored(req, "loglikelihood", result)
    best = max(range(len(scores)), key=lambda i: (scores[i].logprob, -i))
    result["valid"] = True
    result["parsed"] = req.perm[best] if req.perm is not None else best
    return _scored(req, "loglikelihood", result)


def _scored(req: Task, kind: str, result: dict[str, Any], field: str = "parsed") -> dict[str, Any]:
    """The result with its score under the parse kind's scorer (of ``result[field]``), when the task has a gold
    answer."""
    if req.gold is not None:
        result["score"] = score(kind, result[field], req.gold)
    return result

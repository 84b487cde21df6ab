"""Prompt templates: ``prompts/**.yaml`` files or inline ones, rendered by a sandboxed Jinja2 environment.

A template file holds ``source`` (the paper and table it reproduces), an optional ``system``, optional
earlier ``messages`` (``{role, content}`` turns: few-shot examples, a previous answer) and a ``user``
template; or, for log-likelihood scoring, a ``context`` and a ``continuation`` template, rendered once per
option (``option``, ``option_index``). Templates see the dataset row's fields, ``row``, the variant values
(``seed``, ``sample``, ...) and, for multiple choice, ``options`` (in shown order), ``letters`` and
``options_block`` ("A. ...\\nB. ...").
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from jinja2 import meta
from jinja2.sandbox import SandboxedEnvironment, SecurityError
from pydantic import ValidationError

from runner.spec.inputs import InlinePrompt
from runner.spec.yamlfile import load_yaml_bounded

if TYPE_CHECKING:
    from runner.spec.schema import Job

_env = SandboxedEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False)


def _replace_term(text: str, old: str, new: str) -> str:
    """``{{ question | replace_term(term, other) }}``: a term swapped for another, whole words, any case."""
    from runner.recipes.newterm import replace_term

    return replace_term(text, old, new)


_env.filters["replace_term"] = _replace_term
_GLOBALS = dict(_env.globals)


class PromptError(ValueError):
    """A template cannot be found, read or compiled."""


class Part:
    """One compiled template. A template that uses no variable (a fixed system prompt, say) is rendered
    once: rendering is the costliest step of planning a request, and a re-run plans every request again."""

    __slots__ = ("template", "constant", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.template = _env.from_string(source)
        self.constant: str | None = None
        if not meta.find_undeclared_variables(_env.parse(source)):
            try:
                self.constant = self.template.render()
            except SecurityError as exc:
                raise BlockedExpression(_blocked(source, exc)) from None

    def __call__(self, context: dict[str, Any]) -> str:
        if self.constant is not None:
            return self.constant
        # Template.render merges the environment's globals (a ChainMap) into a new dict and scans them again
        # for the context on every call: most of the render's cost. A context built from a plain snapshot of
        # the same globals renders the same text in a fraction of the time.
        template = self.template
        ctx = _env.context_class(_env, {**_GLOBALS, **context}, template.name, template.blocks)
        try:
            return "".join(template.root_render_func(ctx))
        except SecurityError as exc:
            raise BlockedExpression(_blocked(self.source, exc)) from None


class BlockedExpression(PromptError):
    """A template asks for something the sandbox refuses (``{{ ''.__class__ }}``); names the expression."""


def _blocked(source: str, exc: SecurityError) -> str:
    """What the sandbox refused, naming the template expression that asked for it."""
    reason = str(exc).rstrip(".")
    names = re.findall(r"'([^']+)'", reason)
    expressions = re.findall(r"\{\{.*?\}\}|\{%.*?%\}", source, re.S)
    found = next((e for e in expressions if any(n in e for n in names)), None) \
        or next((e for e in expressions if "__" in e), None)
    return f"{'the expression ' + found if found else 'an expression'} is blocked by the template sandbox ({reason})"


@dataclass(frozen=True)
class Prompt:
    name: str
    system: Part | None
    user: Part | None
    source: str | None = None
    #: earlier turns, (role, template), between the system prompt and the user's
    turns: tuple[tuple[str, Part], ...] = ()
    #: the template's text (system, turns, user): part of a pipeline stage's content address
    text: str = ""
    #: a log-likelihood prompt's parts: the context, and the continuation scored after it
    context: Part | None = None
    continuation: Part | None = None
    #: the template file's absolute path, and the SHA-256 of its bytes (None for an inline prompt)
    path: str | None = None
    file_sha256: str | None = None

    @property
    def sha256(self) -> str:
        """What identifies the template's text in a result line's provenance: the SHA-256 of the template file, or
        of an inline prompt's ``text``."""
        return self.file_sha256 or hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def scores_loglikelihood(self) -> bool:
        return self.context is not None

    def render_pair(self, context: dict[str, Any]) -> tuple[str, str]:
        """A log-likelihood prompt's (context, continuation) for one option."""
        assert self.context is not None and self.continuation is not None
        return self.context(context), self.continuation(context)

    def render(self, context: dict[str, Any]) -> list[dict[str, str]]:
        assert self.user is not None, "a log-likelihood prompt renders pairs (render_pair), not messages"
        user = {"role": "user", "content": self.user(context)}
        if self.system is None and not self.turns:
            return [user]
        messages = [] if self.system is None else [{"role": "system", "content": self.system(context)}]
        messages.extend({"role": role, "content": part(context)} for role, part in self.turns)
        messages.append(user)
        return messages



def compile_expression(text: str) -> Any:
    """A Jinja expression (``rating >= 8 if gold else rating <= 3``) as a function of a row's fields."""
    return _env.compile_expression(text, undefined_to_none=False)


def expression_error(text: str) -> str | None:
    try:
        compile_expression(text)
    except jinja2.TemplateSyntaxError as exc:
        return exc.message or "syntax error"
    return None


def prompt_dirs(job: Job) -> list[Path]:
    """Where ``prompts/<name>.yaml`` is looked for: the working directory, the job file's folder and its parent,
    then the templates bundled with the package (a local template always wins)."""
    from runner.bundled import ROOT as BUNDLED

    job_dir = Path(job.base_dir)
    return [Path.cwd() / "prompts", job_dir / "prompts", job_dir.parent / "prompts", BUNDLED / "prompts"]


def load_prompt(job: Job, prompt: str | InlinePrompt) -> Prompt:
    if not isinstance(prompt, str):
        return _compile_spec("inline", prompt)
    for folder in prompt_dirs(job):
        candidate = folder / f"{prompt}.yaml"
        if candidate.is_file():
            # keyed by modification time too: a process that runs a job again sees an edited template
            return _load_file(str(candidate.resolve()), prompt, candidate.stat().st_mtime_ns)
    raise PromptError(f"no prompt template {prompt!r} (looked for prompts/{prompt}.yaml)")


@lru_cache(maxsize=64)
def _load_file(path: str, name: str, mtime_ns: int = 0) -> Prompt:
    from runner.errors import JobFileError

    try:
        data = load_yaml_bounded(Path(path), "prompt template")  # within the job file's bounds (no alias bomb)
        spec = InlinePrompt.model_validate(data)
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except JobFileError as exc:
        raise PromptError(f"prompt template {exc}") from None
    except OSError as exc:
        raise PromptError(f"prompt template {path} cannot be read ({exc.strerror or exc})") from None
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise PromptError(f"prompt template {path}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return replace(_compile_spec(name, spec), path=path, file_sha256=digest)


def _compile_spec(name: str, spec: InlinePrompt) -> Prompt:
    if spec.context is not None and spec.continuation is not None:
        try:
            return Prompt(name=name, system=None, user=None, source=spec.source, context=Part(spec.context),
                          continuation=Part(spec.continuation),
                          text=f"context: {spec.context}\ncontinuation: {spec.continuation}")
        except jinja2.TemplateSyntaxError as exc:
            raise PromptError(f"prompt {name!r} line {exc.lineno}: {exc.message}") from None
        except BlockedExpression as exc:
            raise PromptError(f"prompt {name!r}: {exc}") from None
    assert spec.user is not None
    return _compile(name, spec.system, spec.user, spec.source, [(t.role, t.content) for t in spec.messages])


def _compile(name: str, system: str | None, user: str, source: str | None,
             turns: list[tuple[str, str]] | None = None) -> Prompt:
    turns = turns or []
    text = "\n".join([f"system: {system}" if system is not None else "",
                      *(f"{role}: {content}" for role, content in turns), f"user: {user}"])
    try:
        return Prompt(
            name=name,
            system=Part(system) if system is not None else None,
            user=Part(user),
            source=source,
            turns=tuple((role, Part(content)) for role, content in turns),
            text=text,
        )
    except jinja2.TemplateSyntaxError as exc:
        raise PromptError(f"prompt {name!r} line {exc.lineno}: {exc.message}") from None
    except BlockedExpression as exc:
        raise PromptError(f"prompt {name!r}: {exc}") from None

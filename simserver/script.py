"""Response scripts: a YAML file that decides what the simulated server answers, keyed by prompt template and
term, so a test (or a dry run of a multi-stage pipeline) controls what each stage's "model" says.

The file (``python -m simserver --script FILE``, ``SimConfig(script=FILE)`` or ``/sim/config``
``{"script": FILE}``)::

    # optional: folder of prompt templates, relative to this script file (default: ../prompts, then ./prompts,
    # i.e. try both and use the first that exists)
    prompts: ../prompts
    # optional: when true, a request no entry matches is answered with an HTTP 400 error in the wire format
    # ("no scripted response matches this request") instead of the normal simulated answer
    strict: false
    responses:
      - template: newterm/build/deduce     # a prompt template file prompts/newterm/build/deduce.yaml (optional)
        term: wokely                       # optional: the request's text must contain this string
        contains: ["As an effect"]         # optional: more strings the request's text must all contain
        model: gpt-4o-mini                 # optional: only for this model name
        response: "one answer"             # either response: (always this text)
        responses: ["first", "second"]     # or responses: served in turn to successive matching requests;
                                           # the last repeats

The request's text is every message's text (system prompt, then each user and assistant turn, in order),
joined with newlines, after the request is mapped to OpenAI messages (:mod:`simserver.answers`), so one
entry matches the same conversation in all three wire formats. The first entry, in file order, whose
conditions all hold answers; an entry without conditions matches every request.

A ``template:`` entry names ``<prompts>/<template>.yaml``: ``system`` (optional), ``messages`` (optional
``{role, content}`` turns) and ``user``, Jinja2 templates (other keys, such as ``source``, are ignored). It
matches a request when, for each of those strings, its longest literal piece (text outside ``{{ }}``,
``{% %}`` and ``{# #}`` tags, stripped of surrounding whitespace) is in the request's text; strings whose
longest piece is shorter than 8 characters are skipped, and a template left with none is an error (it would
match every request). A piece inside an ``{% if %}`` branch that was not rendered does not match, so put
the wording a stage always sends outside conditionals, or match on ``contains:``. Templates are read once,
when the script is loaded.

Only the text is scripted: the answer is then cut by stop strings and max tokens, counted, rate limited,
faulted and written in the wire format like a simulated one. A ``responses:`` entry moves to its next text
only when an answer is delivered (a 200 the client can read, not filtered or malformed), so a retried
request gets the text it missed; ``/sim/reset`` rewinds every entry. The server runs on one asyncio event
loop and takes a text and moves the counter without awaiting in between, so concurrent requests each get
their own turn.

Every problem in the file (unreadable, not YAML, a wrong type, an unknown key, both ``response`` and
``responses`` or neither, a missing template) raises :class:`ScriptError`, a ``ValueError`` naming the file
and the entry (``responses[2] (line 9)``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .answers import request_text

__all__ = ["Entry", "Script", "ScriptError", "load_script", "longest_piece"]

_TAG = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.S)
_MIN_PIECE = 8
_TOP_KEYS = ("prompts", "strict", "responses")
_ENTRY_KEYS = ("template", "term", "contains", "model", "response", "responses")


class ScriptError(ValueError):
    """A response script that cannot be read or does not follow the format; the message names the file and
    the entry."""


def longest_piece(template: str) -> str:
    """The longest text of a Jinja2 template outside its tags, stripped of surrounding whitespace."""
    return max((piece.strip() for piece in _TAG.split(template)), key=len)


@dataclass(slots=True)
class Entry:
    """One scripted response: its conditions and its texts."""

    where: str  #: ``responses[2] (line 9)``, for messages
    needles: tuple[str, ...]  #: strings the request's text must all contain (template pieces, term, contains)
    model: str | None  #: the only model name it answers, or None for any
    texts: tuple[str, ...]  #: served in turn, the last one repeating
    served: int = 0  #: answers delivered so far

    def matches(self, model: str, text: str) -> bool:
        return (self.model is None or self.model == model) and all(needle in text for needle in self.needles)

    def text(self) -> str:
        """The text the next delivered answer carries."""
        return self.texts[min(self.served, len(self.texts) - 1)]


@dataclass(slots=True)
class Script:
    """A loaded response script."""

    path: Path
    strict: bool
    entries: list[Entry] = field(default_factory=list)

    def match(self, model: str, messages: list[Any]) -> Entry | None:
        """The first entry that answers this request, or None."""
        text = request_text(messages)
        return next((entry for entry in self.entries if entry.matches(model, text)), None)

    def rewind(self) -> None:
        for entry in self.entries:
            entry.served = 0


def load_script(path: str | Path) -> Script:
    """Read and check a response script and the templates it names; raise :class:`ScriptError`."""
    path = Path(path)
    where = f"response script {path}"
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptError(f"{where}: cannot read it ({_reason(exc)})") from exc
    data = _yaml(source, where)
    if not isinstance(data, dict):
        raise ScriptError(f"{where}: expected a mapping with a responses: list at the top")
    _known_keys(data, _TOP_KEYS, where)
    strict = data.get("strict", False)
    if not isinstance(strict, bool):
        raise ScriptError(f"{where}: strict must be true or false")
    items = data.get("responses")
    if not isinstance(items, list):
        raise ScriptError(f"{where}: responses must be a list of entries")
    prompts = data.get("prompts")
    if prompts is not None and (not isinstance(prompts, str) or not prompts):
        raise ScriptError(f"{where}: prompts must be a folder name")
    templates = _Templates(path.parent, prompts, where)
    lines = _entry_lines(source)
    script = Script(path, strict)
    for i, item in enumerate(items):
        label = f"responses[{i}]" + (f" (line {lines[i]})" if i < len(lines) else "")
        script.entries.append(_entry(item, label, f"{where}, {label}", templates))
    return script


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or str(exc)


def _yaml(source: str, where: str) -> Any:
    try:
        return yaml.safe_load(source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or "syntax error"
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise ScriptError(f"{where}: not valid YAML{line}: {problem}") from exc


def _entry_lines(source: str) -> list[int]:
    """The line number of each item of the top-level ``responses:`` list (the file is known to be YAML)."""
    node = yaml.compose(source, Loader=yaml.SafeLoader)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == "responses" and isinstance(value, yaml.SequenceNode):
                return [item.start_mark.line + 1 for item in value.value]
    return []


def _known_keys(data: dict[Any, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = [key for key in data if key not in allowed]
    if unknown:
        raise ScriptError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(allowed)})")


def _string(value: Any, name: str, where: str) -> str:
    if not isinstance(value, str):
        if isinstance(value, bool):
            hint = " (quote it: unquoted, YAML reads yes, no, true and false as true or false)"
        else:
            hint = f' (quote it: "{value}")' if isinstance(value, (int, float)) else ""
        raise ScriptError(f"{where}: {name} must be a string{hint}")
    return value


def _entry(item: Any, label: str, where: str, templates: _Templates) -> Entry:
    if not isinstance(item, dict):
        raise ScriptError(f"{where}: expected a mapping (template:, term:, ..., response:)")
    _known_keys(item, _ENTRY_KEYS, where)
    needles: list[str] = []
    if "template" in item:
        needles.extend(templates.needles(_string(item["template"], "template", where), where))
    if "term" in item:
        needles.append(_string(item["term"], "term", where))
    contains = item.get("contains", [])
    if not isinstance(contains, list):
        raise ScriptError(f"{where}: contains must be a list of strings")
    needles.extend(_string(s, "each contains: item", where) for s in contains)
    if "" in needles:
        raise ScriptError(f"{where}: term and contains: strings must not be empty")
    model = _string(item["model"], "model", where) if "model" in item else None
    if ("response" in item) == ("responses" in item):
        raise ScriptError(f"{where}: give either response: (one text) or responses: (a list), "
                          f"{'not both' if 'response' in item else 'one of them'}")
    if "response" in item:
        texts = [_string(item["response"], "response", where)]
    else:
        texts = item["responses"]
        if not isinstance(texts, list) or not texts:
            raise ScriptError(f"{where}: responses must be a non-empty list of strings")
        texts = [_string(text, "each responses: item", where) for text in texts]
    return Entry(label, tuple(needles), model, tuple(texts))


class _Templates:
    """The prompt templates a script names, each read once."""

    def __init__(self, base: Path, prompts: str | None, where: str) -> None:
        self.tried = [base / prompts] if prompts is not None else [base.parent / "prompts", base / "prompts"]
        self.folder = next((folder for folder in self.tried if folder.is_dir()), None)
        if prompts is not None and self.folder is None:
            raise ScriptError(f"{where}: prompts folder {self.tried[0]} does not exist")
        self.loaded: dict[str, tuple[str, ...]] = {}

    def needles(self, name: str, where: str) -> tuple[str, ...]:
        if name not in self.loaded:
            if self.folder is None:
                looked = " or ".join(str(folder) for folder in self.tried)
                raise ScriptError(f"{where}: template {name!r} needs a prompts folder (looked for {looked})")
            self.loaded[name] = self._read(self.folder / f"{name}.yaml", name, where)
        return self.loaded[name]

    @staticmethod
    def _read(path: Path, name: str, where: str) -> tuple[str, ...]:
        where = f"{where}: template {name!r} ({path})"
        try:
            data = _yaml(path.read_text(encoding="utf-8"), where)
        except FileNotFoundError as exc:
            raise ScriptError(f"{where} does not exist") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ScriptError(f"{where} cannot be read ({_reason(exc)})") from exc
        if not isinstance(data, dict):
            raise ScriptError(f"{where}: expected a mapping with user: (and optional system:, messages:)")
        strings = []
        if data.get("system") is not None:
            strings.append(_string(data["system"], "system", where))
        turns = data.get("messages") or []
        if not isinstance(turns, list) or not all(
                isinstance(t, dict) and isinstance(t.get("role"), str) and isinstance(t.get("content"), str)
                for t in turns):
            raise ScriptError(f"{where}: messages must be a list of {{role, content}} mappings")
        strings.extend(turn["content"] for turn in turns)
        strings.append(_string(data.get("user"), "user", where))
        needles = tuple(piece for s in strings if len(piece := longest_piece(s)) >= _MIN_PIECE)
        if not needles:
            raise ScriptError(f"{where}: no literal text of {_MIN_PIECE} or more characters to recognise it by")
        return needles

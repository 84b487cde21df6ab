"""What the simulated server answers: deterministic text, token counts and the message digest.

Answers depend only on (model, messages, temperature, max tokens, top_p, stop, seed), hashed as canonical
JSON. Anthropic and Gemini requests are first mapped to the OpenAI message list they mean: the system prompt
(``system``; ``systemInstruction`` parts) becomes a leading ``{"role": "system", "content": text}``, every turn
``{"role": "user"|"assistant", "content": text}`` (Gemini's ``model`` is the assistant) with text blocks or
parts joined, and ``stop_sequences``/``stopSequences``, ``max_tokens``/``maxOutputTokens`` fill the OpenAI
fields. So a conversation whose OpenAI contents are plain strings gets the same text, and the same key in
``completed_by_digest`` (SHA-256 of that list as canonical JSON), in every format. Integral floats count as
integers (google-genai sends ``temperature=0`` as ``0.0``). If the last user message lists options on their
own lines ("A. ..." or "A) ..."), the answer is one of the offered letters (a model named ``...-accNN`` picks
the option marked ``(right)`` NN % of the time, by the digest); otherwise a sentence of 8-30 words.
The max tokens (one token per word) truncate it (finish ``length`` / ``max_tokens`` / ``MAX_TOKENS``); stop
strings cut it (Anthropic reports ``stop_sequence``). Completion tokens never exceed the max tokens. A
response script (:mod:`simserver.script`) replaces only the text: :func:`fit` cuts it the same way.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from runner.providers.sim_tokens import count_prompt_tokens, count_tokens, message_text

__all__ = ["REFUSAL", "THINKING_TOKENS", "canonical", "count_prompt_tokens", "count_tokens", "fit", "fraction",
           "message_digest", "offered_letters", "reply", "request_text", "schema_instance", "simulated_reply",
           "structured_text", "thinking_text", "thinking_tokens", "uncut_reply"]

_MC_OPTION = re.compile(r"(?m)^\s*([A-Z])[.)]\s")
#: options written "A: text" (Know-No's MC-Test prompt), looked for only when no "A." / "A)" options are found
_MC_OPTION_COLON = re.compile(r"(?m)^\s*([A-Z]):\s")
#: a model whose name ends in -accNN (``sim:gpt-sim-acc80``) is right NN % of the time on options where one is marked
#: with this text (tests with scripted accuracies: a dataset marks its gold option's text); other models ignore it
RIGHT_MARKER = "(right)"
_SKILL = re.compile(r"-acc(\d{1,3})$")
_MARKED = re.compile(r"(?m)^\s*([A-Z])[.):]\s.*" + re.escape(RIGHT_MARKER))
_WORDS = (
    "the", "a", "model", "answer", "result", "token", "quick", "careful", "simple", "clear", "short",
    "long", "data", "value", "test", "run", "paper", "term", "option", "question", "choice", "reason",
    "evidence", "context", "meaning", "sentence", "word", "number", "example", "likely", "plausible",
    "cause", "effect", "because", "therefore", "however", "indeed", "often", "rarely", "always", "never",
    "first", "second", "third", "final", "small", "large", "new", "old", "early", "late", "good", "fair",
    "exact", "rough", "useful", "system", "request", "server", "client", "cache", "budget", "limit",
    "retry", "window", "stream", "batch", "job", "stage", "seed",
)
# Built once: json.dumps() would build an encoder per call, and this is the hot path.
canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def request_text(messages: list[Any]) -> str:
    """Every message's text, in order (the system prompt first), joined with newlines."""
    return "\n".join(message_text(m.get("content")) for m in messages)


def _number(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def message_digest(messages: list[Any]) -> str:
    """The key of /sim/stats' completed_by_digest: SHA-256 of the messages list as canonical JSON."""
    return hashlib.sha256(canonical(messages).encode()).hexdigest()


def simulated_reply(model: str, messages: list[Any], temperature: Any = None, max_tokens: int | None = None,
                    top_p: Any = None, stop: Any = None, seed: Any = None) -> tuple[str, str]:
    """The (content, finish_reason) the server answers for these request fields; a pure function."""
    return reply(canonical(messages), model, messages, temperature, max_tokens, top_p, stop, seed)[:2]


def reply(messages_json: str, model: str, messages: list[Any], temperature: Any, max_tokens: int | None,
          top_p: Any, stop: Any, seed: Any) -> tuple[str, str, str | None]:
    """(text, "stop"|"length", the stop string that cut the text or None)."""
    return fit(uncut_reply(messages_json, model, messages, temperature, max_tokens, top_p, stop, seed), max_tokens,
               stop)


def _marked_letter(messages: list[Any]) -> str | None:
    """The letter of the option the last user message marks with :data:`RIGHT_MARKER`, if one is."""
    last = next((m for m in reversed(messages) if m.get("role") == "user"), messages[-1])
    found = _MARKED.search(message_text(last.get("content")))
    return found.group(1) if found else None


def offered_letters(messages: list[Any]) -> list[str]:
    """The option letters the last user message offers ("A. ..." or "A) ...", else "A: ..."), in order."""
    last = next((m for m in reversed(messages) if m.get("role") == "user"), messages[-1])
    content = message_text(last.get("content"))
    letters = list(dict.fromkeys(_MC_OPTION.findall(content)))
    if len(letters) < 2:
        letters = list(dict.fromkeys(_MC_OPTION_COLON.findall(content)))
    return letters if len(letters) >= 2 else []


def uncut_reply(messages_json: str, model: str, messages: list[Any], temperature: Any, max_tokens: int | None,
                top_p: Any, stop: Any, seed: Any) -> str:
    """The simulated text before the stop strings and the max tokens cut it (all the fields still pick it)."""
    # The messages' canonical JSON is passed in because the server also needs it for the digest.
    params = canonical([model, _number(temperature), max_tokens, _number(top_p), stop, seed])
    h = hashlib.sha256(f"{params}{messages_json}".encode()).digest()
    letters = offered_letters(messages)
    if letters:
        skilled = _SKILL.search(model)
        right = _marked_letter(messages) if skilled else None
        if skilled and right in letters:
            # a model named ...-accNN answers the option marked RIGHT_MARKER with probability NN %
            if int.from_bytes(h[1:9], "big") / 2**64 < int(skilled.group(1)) / 100:
                return right
            others = [letter for letter in letters if letter != right]
            return others[h[0] % len(others)]
        return letters[h[0] % len(letters)]
    # Byte 1 picks the length (8-30 words), bytes 2..31 pick the words.
    words = [_WORDS[b % len(_WORDS)] for b in h[2:2 + 8 + h[1] % 23]]
    return " ".join(words).capitalize() + "."


def fit(text: str, max_tokens: int | None, stop: Any) -> tuple[str, str, str | None]:
    """An answer's text cut by the stop strings and the max tokens (one per word): (text, "stop"|"length",
    the stop string that cut the text or None)."""
    hit = None
    if stop:
        cuts = [(i, s) for s in ([stop] if isinstance(stop, str) else stop) if s and (i := text.find(s)) >= 0]
        if cuts:
            cut, hit = min(cuts)
            text = text[:cut]
    if max_tokens is not None:
        words = text.split(" ")
        if len(words) > max_tokens:
            return " ".join(words[:max_tokens]), "length", None
    return text, "stop", hit


# -- thinking, structured answers and refusals -----------------------------------------------------------------

#: thinking tokens an answer spends per effort: (fewest, most); the medium range when no effort is given
THINKING_TOKENS = {"minimal": (8, 48), "low": (24, 96), "medium": (48, 192), "high": (96, 384),
                   "xhigh": (192, 768), "max": (192, 768)}
#: what a model that declines says (OpenAI's ``message.refusal``)
REFUSAL = "I can't help with that."


def fraction(salt: str, key: str) -> float:
    """A number in [0, 1) drawn from a hash: the first 8 bytes of SHA-256 of ``salt NUL key`` over 2**64."""
    return int.from_bytes(hashlib.sha256(f"{salt}\0{key}".encode()).digest()[:8], "big") / 2**64


def thinking_tokens(digest: str, effort: str | None, budget: int | None) -> int:
    """The thinking tokens of a thinking answer: ``low + int(fraction("thinking", digest) * (high - low + 1))``
    with the effort's (low, high) of :data:`THINKING_TOKENS` (medium when none is given) and the messages'
    digest, and no more than the budget."""
    low, high = THINKING_TOKENS.get(effort or "medium", THINKING_TOKENS["medium"])
    tokens = low + int(fraction("thinking", digest) * (high - low + 1))
    return max(1, min(tokens, budget)) if budget is not None else tokens


def thinking_text(messages: list[Any], answer: str) -> str:
    """The thinking of a thinking answer. It names a wrong option letter and the word "no" before settling, and
    never the chosen letter, so a parser that read the thinking instead of the answer gets a wrong letter: the
    option after the answered one (the answer's first offered letter, else the second option; "B" when the
    prompt offers none)."""
    letters = offered_letters(messages) or ["A", "B"]
    chosen = answer.strip().rstrip(".")
    wrong = letters[(letters.index(chosen) + 1) % len(letters)] if chosen in letters else letters[1]
    return (f"Option {wrong} looks tempting, but no: it does not fit what the question asks. Yes, on a second "
            "look the answer is another one, so I will settle on it.")


def structured_text(schema: Any, plain: str, digest: str, bare: bool = False) -> str:
    """A JSON answer: an instance of ``schema`` (None: an object ``{"answer": plain}``), compact as OpenAI writes
    it; ``bare``: a string instance as it is (Gemini's text/x.enum). See :func:`schema_instance`."""
    value = {"answer": plain} if schema is None else schema_instance(schema, plain, digest)
    if bare and isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def schema_instance(schema: Any, plain: str, seed: str) -> Any:
    """A small instance of a JSON Schema (or a Gemini ``responseSchema``, whose types are upper case).

    Objects get every property they declare (``propertyOrdering`` first), and a required one they do not declare
    gets the ``additionalProperties`` schema or a string; arrays ``max(minItems, 1)`` items (at most ``maxItems``);
    a ``const`` its value; an ``enum`` the member equal to ``plain`` (the simulator's plain text answer, without a
    final full stop, case ignored), else one drawn from ``seed`` and the path, so an option-letter field gets the
    letter an unstructured request gets; strings ``plain`` (a fixed value for ``date``, ``date-time``, ``time``,
    ``email``, ``uri`` and ``uuid`` formats), padded or cut to ``minLength``/``maxLength``; numbers a draw within
    ``minimum``/``maximum`` (0-9 when unbounded); booleans a draw; ``anyOf``/``oneOf`` their first branch that
    is not null; ``allOf`` merged; ``$ref`` to ``#/...`` followed. ``pattern`` and ``multipleOf`` of numbers are not
    honoured."""
    return _instance(schema, schema, plain, seed, "", 0)


_FORMATS = {"date": "2024-01-01", "date-time": "2024-01-01T00:00:00Z", "time": "00:00:00", "email": "sim@example.com",
            "uri": "https://example.com/", "uuid": "00000000-0000-4000-8000-000000000000"}


def _resolve(root: Any, ref: str) -> Any:
    node = root
    for part in ref.removeprefix("#").strip("/").split("/") if ref.strip("#/") else []:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node.get(part) if isinstance(node, dict) else None
    return node


def _merged(branches: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for branch in branches:
        if not isinstance(branch, dict):
            continue
        for key, value in branch.items():
            if key == "properties" and isinstance(out.get(key), dict):
                out[key] = {**out[key], **value}
            elif key == "required" and isinstance(out.get(key), list):
                out[key] = out[key] + [name for name in value if name not in out[key]]
            else:
                out.setdefault(key, value)
    return out


def _instance(node: Any, root: Any, plain: str, seed: str, path: str, depth: int) -> Any:
    if not isinstance(node, dict) or depth > 32:
        return plain
    if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _instance(_merged([rest, _resolve(root, node["$ref"])]), root, plain, seed, path, depth + 1)
    if "const" in node:
        return node["const"]
    draw = fraction(f"schema{path}", seed)
    if isinstance(node.get("enum"), list) and node["enum"]:
        values = node["enum"]
        wanted = plain.strip().rstrip(".").casefold()
        return next((v for v in values if isinstance(v, str) and v.casefold() == wanted),
                    values[int(draw * len(values))])
    if isinstance(node.get("allOf"), list) and node["allOf"]:
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return _instance(_merged([rest, *node["allOf"]]), root, plain, seed, path, depth + 1)
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and branches:
            branch = next((b for b in branches if not (isinstance(b, dict) and _kind(b) == "null")), branches[0])
            return _instance(branch, root, plain, seed, path, depth + 1)
    kind = _kind(node)
    if kind == "object":
        props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        order = [name for name in node.get("propertyOrdering") or [] if name in props]
        order += [name for name in props if name not in order]
        out = {name: _instance(props[name], root, plain, seed, f"{path}/{name}", depth + 1) for name in order}
        extra = node.get("additionalProperties")
        for name in node.get("required") or []:
            if name not in out:
                out[name] = _instance(extra if isinstance(extra, dict) else {"type": "string"}, root, plain, seed,
                                      f"{path}/{name}", depth + 1)
        return out
    if kind == "array":
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        count = max(len(prefix), int(node.get("minItems") or 0), 1)
        if isinstance(node.get("maxItems"), int):
            count = min(count, node["maxItems"])
        return [_instance(prefix[i] if i < len(prefix) else node.get("items", {}), root, plain, seed,
                          f"{path}/{i}", depth + 1) for i in range(count)]
    if kind in ("integer", "number"):
        return _number_in(node, kind, draw)
    if kind == "boolean":
        return draw < 0.5
    if kind == "null":
        return None
    text = _FORMATS.get(node.get("format"), plain)
    if isinstance(node.get("minLength"), int) and len(text) < node["minLength"]:
        text += "x" * (node["minLength"] - len(text))
    if isinstance(node.get("maxLength"), int):
        text = text[:node["maxLength"]]
    return text


def _kind(node: dict[str, Any]) -> str:
    """A schema's type, lower case (Gemini writes "OBJECT"); the first one not null of a list; guessed when
    absent."""
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if str(k).lower() != "null"), "null")
    if kind is None:
        if "properties" in node or "required" in node:
            return "object"
        return "array" if "items" in node or "prefixItems" in node else "string"
    return str(kind).lower()


def _number_in(node: dict[str, Any], kind: str, draw: float) -> int | float:
    def bound(name: str, exclusive: str, step: float) -> float | None:
        value = node.get(name)
        other = node.get(exclusive)
        if isinstance(other, (int, float)) and not isinstance(other, bool):  # draft 6 and later: a number
            return other + step
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value + step if other is True else value  # draft 4: a flag beside the bound
        return None

    integer = kind == "integer"
    low = bound("minimum", "exclusiveMinimum", 1 if integer else 0)
    high = bound("maximum", "exclusiveMaximum", -1 if integer else 0)
    if integer:
        low = math.ceil(low) if low is not None else None
        high = math.floor(high) if high is not None else None
    if low is None and high is None:
        low, high = 0, 9
    elif low is None:
        low = min(0, high - 9) if integer else min(0.0, high - 1)
    elif high is None:
        high = low + 9
    if integer:
        return int(low + int(draw * (high - low + 1)))
    value = low + (high - low) * (0.1 + 0.8 * draw)  # inside exclusive bounds too
    return round(value, 6) if low < round(value, 6) < high or low == high else value

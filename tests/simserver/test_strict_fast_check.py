"""The strict server's fast check of OpenAI chat requests (jsonschema-rs, simserver/strict_openai.py) may only pass
a body that jsonschema, whose errors the refusals are worded from, passes too: on valid bodies of many shapes and
on thousands of their mutations (every leaf replaced by values of other types and out of range, every key dropped,
unknown keys added), the two agree on every body."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from typing import Any

import jsonschema_rs

from simserver import strict_openai

USER = {"role": "user", "content": "Which is right?\nA. one\nB. two\nAnswer:"}
BODIES: list[dict[str, Any]] = [
    {"model": "gpt-4o", "messages": [USER], "temperature": 0, "max_tokens": 5},
    {"model": "gpt-4o", "messages": [{"role": "system", "content": "Answer with one letter."}, USER,
                                     {"role": "assistant", "content": "A"}, USER],
     "temperature": 0.7, "top_p": 0.9, "n": 3, "seed": 7, "stop": ["\n", "###"], "logprobs": True,
     "top_logprobs": 5, "presence_penalty": 0.5, "frequency_penalty": -0.5, "user": "u1"},
    {"model": "o3", "messages": [{"role": "developer", "content": "Be brief."}, USER],
     "max_completion_tokens": 400, "reasoning_effort": "low", "store": False},
    {"model": "gpt-4o", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is shown?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}]}]},
    {"model": "gpt-4o", "messages": [USER], "response_format": {
        "type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
            "type": "object", "properties": {"letter": {"type": "string"}}, "required": ["letter"]}}}},
    {"model": "gpt-4o", "messages": [USER], "response_format": {"type": "json_object"}},
    {"model": "gpt-4o", "messages": [USER], "tools": [{"type": "function", "function": {
        "name": "answer", "description": "say the letter", "parameters": {"type": "object"}}}],
     "tool_choice": "auto", "parallel_tool_calls": False},
    {"model": "gpt-4o", "messages": [USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "answer", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "B"}]},
    {"model": "gpt-4o", "messages": [USER], "stream": True, "stream_options": {"include_usage": True},
     "logit_bias": {"50256": -100}, "metadata": {"run": "r1"}, "service_tier": "auto"},
]
#: what a leaf is replaced by: other types, out of every range, empty, huge
REPLACEMENTS: list[Any] = [None, True, -1, 0, 3, 2.5, 1e9, 2 ** 70, -(2 ** 70), "", "x", "auto", [], ["x"], {},
                           {"type": "text"}]


def _paths(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*path, index))


def _set(body: dict[str, Any], path: tuple[Any, ...], value: Any, *, drop: bool = False) -> dict[str, Any]:
    out = copy.deepcopy(body)
    node: Any = out
    for part in path[:-1]:
        node = node[part]
    if drop:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def _mutations(rng: random.Random) -> Iterator[dict[str, Any]]:
    for body in BODIES:
        yield body
        for path in _paths(body):
            if not path:
                continue
            for value in REPLACEMENTS:
                yield _set(body, path, value)
            yield _set(body, path, None, drop=True)
            parent = path[:-1]
            target: Any = body
            for part in parent:
                target = target[part]
            if isinstance(target, dict):  # an unknown key beside it
                yield _set(body, (*parent, f"unknown_{rng.randrange(1000)}"), rng.choice(REPLACEMENTS))


def test_the_fast_check_passes_exactly_what_jsonschema_passes():
    seed = 20261129
    rng = random.Random(seed)
    fast = strict_openai._openai_fast_check()
    assert isinstance(fast, jsonschema_rs.Draft202012Validator), "jsonschema-rs is in the test extra"
    slow = strict_openai._openai_validator()
    checked = passed = 0
    for body in _mutations(rng):
        expected = next(iter(slow.iter_errors(body)), None) is None
        assert strict_openai._valid_at_once(body) is expected, (seed, json.dumps(body)[:400])
        checked += 1
        passed += expected
    assert all(next(iter(slow.iter_errors(body)), None) is None for body in BODIES), "the bases are valid"
    # both kinds are well represented: what passes and what jsonschema refuses
    assert checked > 2000 and 200 < passed < checked - 1000, (checked, passed)

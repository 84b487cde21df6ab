"""Read a YAML file and remember the line of every key, so errors can say ``file:line``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from runner.errors import JobFileError

Loc = tuple[str | int, ...]


def load_with_lines(path: Path) -> tuple[Any, dict[Loc, int]]:
    """Parse ``path``; return the data and a map from each key path to its 1-based line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobFileError(f"{path}: no such job file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JobFileError(f"{path}: cannot be read ({exc})") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise JobFileError(f"{path}:1: the job file is empty")
        lines: dict[Loc, int] = {}
        _walk(path, node, (), lines)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise JobFileError(f"{path}:{line}: not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise JobFileError(f"{path}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    return data, lines


def _walk(path: Path, node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                line = key_node.start_mark.line + 1
                raise JobFileError(f"{path}:{line}: {dotted(loc + (key,))}: key {key!r} appears twice")
            seen.add(key)
            lines[loc + (key,)] = key_node.start_mark.line + 1
            _walk(path, value_node, loc + (key,), lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[loc + (index,)] = item.start_mark.line + 1
            _walk(path, item, loc + (index,), lines)


def line_of(lines: dict[Loc, int], loc: Loc) -> int:
    """The line of the longest prefix of ``loc`` that the file has (a missing key points at its parent)."""
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1


def dotted(loc: Loc) -> str:
    """('stages', 0, 'dataset') -> 'stages[0].dataset'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out

"""Read a YAML file and remember the line of every key, so errors can say ``file:line``.

A job file is read within bounds, so a hostile or broken one is refused in one sentence rather than hanging or
exhausting memory: only a regular file (not a FIFO or a device), at most :data:`MAX_FILE_BYTES`, no NUL byte,
values nested at most :data:`MAX_DEPTH` deep, and at most :data:`MAX_VALUES` values once its aliases (``*name``)
are expanded (a "billion laughs" file of nested aliases is refused while it is parsed, before anything expands).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from runner.errors import JobFileError

Loc = tuple[str | int, ...]

#: a job (or prompt, or schema) file larger than this is refused before it is read
MAX_FILE_BYTES = 10 * 1024 * 1024
#: mappings and lists nested deeper than this are refused (the bundled jobs nest 6 deep)
MAX_DEPTH = 64
#: values (keys, scalars, lists, mappings) a file may hold with its aliases expanded (the bundled jobs hold < 1,000)
MAX_VALUES = 100_000


def load_with_lines(path: Path) -> tuple[Any, dict[Loc, int]]:
    """Parse ``path``; return the data and a map from each key path to its 1-based line."""
    text = read_text_bounded(path, "job file")
    node, loader = _compose(path, text, empty=f"{path}:1: the job file is empty")
    try:
        lines: dict[Loc, int] = {}
        _walk(path, node, (), lines)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    finally:
        loader.dispose()
    return data, lines


def load_yaml_bounded(path: Path, what: str = "file") -> Any:
    """A YAML (or JSON) file other than the job file (a prompt template, a schema) read within the same bounds;
    :class:`JobFileError` names the file, and the line when there is one. An empty file is None."""
    text = read_text_bounded(path, what)
    node, loader = _compose(path, text, empty=None)
    try:
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    finally:
        loader.dispose()


def read_text_bounded(path: Path, what: str = "job file") -> str:
    """The text of a regular file of at most :data:`MAX_FILE_BYTES`, UTF-8 and without NUL bytes."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise JobFileError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise JobFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a pipe" if stat.S_ISFIFO(info.st_mode) else \
            "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a special file"
        raise JobFileError(f"{path}: not a regular file ({kind}); a {what} must be a YAML file on disk")
    if info.st_size > MAX_FILE_BYTES:
        raise JobFileError(f"{path}: {info.st_size:,} bytes is more than a {what} may hold "
                           f"({MAX_FILE_BYTES:,} bytes)")
    try:
        # opened without blocking: the file may have been swapped for a pipe since the stat
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise JobFileError(f"{path}: not a regular file; a {what} must be a YAML file on disk")
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise JobFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise JobFileError(f"{path}: more than {MAX_FILE_BYTES:,} bytes is more than a {what} may hold")
    nul = raw.find(b"\x00")
    if nul >= 0:
        line = raw.count(b"\n", 0, nul) + 1
        raise JobFileError(f"{path}:{line}: a NUL byte (\\x00) in the {what}; it must be text (is it the right "
                           "file?)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise JobFileError(f"{path}:{line}: the {what} must be UTF-8, and this line is not "
                           f"(byte 0x{raw[exc.start]:02x})") from None


def _compose(path: Path, text: str, empty: str | None) -> tuple[yaml.Node | None, _Bounds]:
    """The document's node graph, refused beyond the bounds as it is composed.

    libyaml scans and parses (a seventh of the time: 1.5 ms for the Bank-77 job against 10.8) and this module's
    composer builds the graph, so the bounds are the same either way. A text libyaml might take differently (a
    character PyYAML's reader refuses) or a document it refuses is read again by PyYAML alone, so what is refused,
    and the sentence saying why, are PyYAML's as before."""
    if _FastLoader is not None and not _NOT_PRINTABLE.search(text):
        try:
            return _composed(path, text, empty, _FastLoader)
        except yaml.YAMLError:
            pass  # PyYAML says why, below
    return _composed(path, text, empty, _BoundedLoader)


def _composed(path: Path, text: str, empty: str | None, kind: type[_Bounds]) -> tuple[yaml.Node | None, _Bounds]:
    try:
        loader = kind(text, path)
    except yaml.YAMLError as exc:  # a character YAML does not allow, found by the reader up front
        if kind is not _BoundedLoader:
            raise
        raise _yaml_error(path, exc, text) from None
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as exc:
        loader.dispose()
        if kind is not _BoundedLoader:
            raise
        raise _yaml_error(path, exc, text) from None
    except RecursionError:  # not expected below MAX_DEPTH; still one sentence
        loader.dispose()
        raise JobFileError(f"{path}: values nested too deep to read") from None
    if node is None and empty is not None:
        loader.dispose()
        raise JobFileError(empty)
    return node, loader


def _yaml_error(path: Path, exc: yaml.YAMLError, text: str = "") -> JobFileError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        return JobFileError(f"{path}:{line}: not valid YAML: {exc.problem or exc}")
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, max(0, exc.position)) + 1
        character = chr(exc.character) if isinstance(exc.character, int) else exc.character
        return JobFileError(f"{path}:{line}: not valid YAML: character {character!r} is not allowed in YAML text")
    return JobFileError(f"{path}: not valid YAML: {exc}")


class _Bounds(Composer, SafeConstructor, Resolver):
    """PyYAML's composer bounded: nesting depth, and the values the document holds with its aliases expanded (each
    alias counts the whole value it repeats, so nested aliases are refused while the graph is small, before anything
    is expanded); with the safe constructor. A loader adds the scanner and parser (:class:`_BoundedLoader`,
    :data:`_FastLoader`) and calls :meth:`_bound`."""

    def _bound(self, path: Path) -> None:
        self._path = path
        self._depth = 0
        self._values = 0
        #: anchor -> the values its node holds, expanded; absent while the anchored node is still being composed
        self._sizes: dict[str, int] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.anchors:  # an undefined one is the composer's error
                size = self._sizes.get(event.anchor)
                if size is None:
                    raise JobFileError(f"{self._path}:{line}: alias *{event.anchor} repeats a value it is inside "
                                       "of, which never ends")
                self._count(size, line)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise JobFileError(f"{self._path}:{line}: values nested more than {MAX_DEPTH} deep; a job file needs "
                               "far fewer levels")
        before = self._values
        self._count(1, line)
        node = super().compose_node(parent, index)
        self._depth -= 1
        if event.anchor is not None:
            self._sizes[event.anchor] = self._values - before
        return node

    def _count(self, values: int, line: int) -> None:
        self._values += values
        if self._values > MAX_VALUES:
            raise JobFileError(f"{self._path}:{line}: more than {MAX_VALUES:,} values with the aliases (*name) "
                               "expanded; write the values out or use fewer aliases")

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # more digits than Python converts (4,300)
            raise yaml.constructor.ConstructorError(None, None, f"the number {node.value[:20]}... has too many digits",
                                                    node.start_mark) from None


_Bounds.add_constructor("tag:yaml.org,2002:int", _Bounds.construct_yaml_int)


class _BoundedLoader(Reader, Scanner, Parser, _Bounds):
    """PyYAML's own safe loader, bounded."""

    def __init__(self, text: str, path: Path) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._bound(path)


def _fast_loader() -> type[_Bounds] | None:
    """The bounded loader over libyaml's scanner and parser, when PyYAML was built with it."""
    try:
        from yaml.cyaml import CParser
    except ImportError:
        return None

    class FastLoader(_Bounds, CParser):
        def __init__(self, text: str, path: Path) -> None:
            CParser.__init__(self, text)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._bound(path)

    return FastLoader


_FastLoader = _fast_loader()
#: what PyYAML's reader refuses (its ``Reader.NON_PRINTABLE``): such a text is left to PyYAML, which says so
_NOT_PRINTABLE = Reader.NON_PRINTABLE


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

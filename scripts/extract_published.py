"""Regenerate the extracts in ``simserver/published/`` from the upstream documents they were taken from.

    python scripts/extract_published.py --openai PATH[@REV] --googleapis PATH[@REV]

``PATH`` is a git repository (bare or not; the file is read with ``git show REV:path``, REV defaulting to HEAD)
or a plain folder holding the upstream files at their upstream paths. What is written:

``openai_chat_request.json``
    OpenAI's published OpenAPI document (github.com/openai/openai-openapi, ``openapi.json``):
    ``CreateChatCompletionRequest`` and every schema its ``$ref``s reach, as published, with only the
    human-readable keys (``description``, examples, ``x-oai*`` and ``x-stainless*`` annotations) left out.
    ``simserver.strict`` translates OpenAPI's ``nullable`` when it loads the file, not here.
``gemini_fields.json``
    The request messages of the Gemini API's published protos (github.com/googleapis/googleapis,
    ``google/ai/generativelanguage/{v1,v1beta}/{generative_service,content,safety}.proto``): per API version,
    message -> JSON field name (proto3 JSON mapping: lowerCamelCase, or the field's ``json_name``) ->
    ``{"name": proto field name, "type": proto type, "repeated": bool}``; enums as name -> values.

Each file records where it came from (repository, path, commit, commit date, licence). SOURCES.md says the same
for a reader.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "simserver" / "published"
OPENAI_PATH = "openapi.json"
GEMINI_FILES = ("generative_service.proto", "content.proto", "safety.proto")
GEMINI_VERSIONS = ("v1", "v1beta")
#: keys of a schema object that only explain (they do not constrain), left out of the extract
_PROSE = {"description", "example", "examples", "deprecated", "externalDocs"}


class Source:
    """An upstream repository: a git repository read at one revision, or a plain folder."""

    def __init__(self, spec: str, repository: str, licence: str) -> None:
        path, _, rev = spec.partition("@")
        self.root, self.rev, self.repository, self.licence = Path(path), rev or "HEAD", repository, licence
        self.git = subprocess.run(["git", "-C", path, "rev-parse", "--git-dir"], capture_output=True).returncode == 0

    def read(self, path: str) -> str:
        if self.git:
            return subprocess.run(["git", "-C", str(self.root), "show", f"{self.rev}:{path}"], check=True,
                                  capture_output=True, text=True).stdout
        return (self.root / path).read_text()

    def origin(self, paths: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"repository": self.repository, "paths": paths, "licence": self.licence}
        if self.git:
            log = subprocess.run(["git", "-C", str(self.root), "log", "-1", "--format=%H %cI", self.rev, "--", *paths],
                                 check=True, capture_output=True, text=True).stdout.split()
            head = subprocess.run(["git", "-C", str(self.root), "rev-parse", self.rev], check=True,
                                  capture_output=True, text=True).stdout.strip()
            out.update(commit=head, last_changed_by=log[0], last_changed=log[1])
        return out


# -- OpenAI ------------------------------------------------------------------------------------------------

def _plain(node: Any, in_properties: bool = False) -> Any:
    """A schema without its prose; ``in_properties``: ``node`` maps property names to schemas."""
    if isinstance(node, list):
        return [_plain(item) for item in node]
    if not isinstance(node, dict):
        return node
    if in_properties:
        return {name: _plain(schema) for name, schema in node.items()}
    return {key: _plain(value, key in ("properties", "patternProperties", "$defs", "definitions"))
            for key, value in node.items() if key not in _PROSE and not key.startswith("x-")}


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            found |= _refs(value)
        return found
    if isinstance(node, list):
        return set().union(*map(_refs, node)) if node else set()
    return set()


def extract_openai(source: Source, root: str = "CreateChatCompletionRequest") -> dict[str, Any]:
    document = json.loads(source.read(OPENAI_PATH))
    schemas = document["components"]["schemas"]
    kept: dict[str, Any] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept[name] = _plain(schemas[name])
        for ref in _refs(kept[name]):
            prefix = "#/components/schemas/"
            if not ref.startswith(prefix):
                raise ValueError(f"{name}: a $ref outside components/schemas: {ref}")
            todo.append(ref[len(prefix):])
    origin = source.origin([OPENAI_PATH])
    origin.update(openapi=document.get("openapi"), info_version=document["info"].get("version"))
    return {"source": origin, "root": root, "schemas": dict(sorted(kept.items()))}


# -- Gemini ------------------------------------------------------------------------------------------------

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[A-Za-z_][\w.]*|-?\d+|[{}\[\]();=<>,]')


def _tokens(text: str) -> list[str]:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return _TOKEN.findall(text)


def json_name(name: str) -> str:
    """proto3's JSON name of a field: lowerCamelCase of its snake_case name."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class _ProtoParser:
    """Just enough of the proto3 grammar for message fields, oneofs, maps and enums."""

    def __init__(self, text: str) -> None:
        self.toks, self.i = _tokens(text), 0
        self.messages: dict[str, dict[str, Any]] = {}
        self.enums: dict[str, list[str]] = {}

    def next(self) -> str:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def skip_statement(self) -> None:
        depth = 0
        while True:
            tok = self.next()
            if tok in "{[(":
                depth += 1
            elif tok in "}])":
                depth -= 1
                if depth == 0 and tok == "}":
                    return
            elif tok == ";" and depth == 0:
                return

    def parse(self) -> _ProtoParser:
        while self.i < len(self.toks):
            tok = self.toks[self.i]
            if tok == "message":
                self.i += 1
                self.message(self.next())
            elif tok == "enum":
                self.i += 1
                self.enum(self.next())
            else:
                self.skip_statement()
        return self

    def enum(self, name: str) -> None:
        assert self.next() == "{"
        values: list[str] = []
        while self.toks[self.i] != "}":
            if self.toks[self.i] in ("option", "reserved"):
                self.skip_statement()
                continue
            values.append(self.next())
            self.skip_statement()
        self.i += 1
        self.enums[name] = values

    def message(self, name: str) -> None:
        assert self.next() == "{"
        fields: dict[str, Any] = {}
        self.messages[name] = fields
        while True:
            tok = self.toks[self.i]
            if tok == "}":
                self.i += 1
                return
            if tok == "message":
                self.i += 1
                self.message(self.next())  # nested messages are named by their own name (none clash here)
            elif tok == "enum":
                self.i += 1
                self.enum(self.next())
            elif tok in ("option", "reserved", "extensions"):
                self.skip_statement()
            elif tok == "oneof":
                self.i += 2
                assert self.next() == "{"
                while self.toks[self.i] != "}":
                    if self.toks[self.i] == "option":
                        self.skip_statement()
                    else:
                        self.field(fields, oneof=True)
                self.i += 1
            else:
                self.field(fields)

    def field(self, fields: dict[str, Any], oneof: bool = False) -> None:
        repeated = False
        if self.toks[self.i] in ("optional", "repeated", "required"):
            repeated = self.next() == "repeated"
        if self.toks[self.i] == "map":
            self.i += 2
            key = self.next()
            assert self.next() == ","
            value = self.next()
            assert self.next() == ">"
            type_ = f"map<{key},{value}>"
        else:
            type_ = self.next()
        name = self.next()
        assert self.next() == "=", name
        self.next()
        json = json_name(name)
        if self.toks[self.i] == "[":
            while (tok := self.next()) != "]":
                if tok == "json_name":
                    self.next()
                    json = self.next().strip('"')
        assert self.next() == ";", name
        fields[json] = {"name": name, "type": type_.rsplit(".", 1)[-1] if "." in type_ and
                        not type_.startswith("google.protobuf") else type_, "repeated": repeated}
        if oneof:
            fields[json]["oneof"] = True


def extract_gemini(source: Source) -> dict[str, Any]:
    out: dict[str, Any] = {}
    paths: list[str] = []
    for version in GEMINI_VERSIONS:
        messages: dict[str, Any] = {}
        enums: dict[str, Any] = {}
        for file in GEMINI_FILES:
            path = f"google/ai/generativelanguage/{version}/{file}"
            paths.append(path)
            parsed = _ProtoParser(source.read(path)).parse()
            messages.update(parsed.messages)
            enums.update(parsed.enums)
        out[version] = {"messages": dict(sorted(messages.items())), "enums": dict(sorted(enums.items()))}
    return {"source": source.origin(paths), **out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--openai", required=True, help="openai/openai-openapi: a git repository[@rev] or folder")
    parser.add_argument("--googleapis", required=True, help="googleapis/googleapis: a git repository[@rev] or folder")
    args = parser.parse_args()
    openai = extract_openai(Source(args.openai, "github.com/openai/openai-openapi", "MIT"))
    gemini = extract_gemini(Source(args.googleapis, "github.com/googleapis/googleapis", "Apache-2.0"))
    OUT.mkdir(exist_ok=True)
    for name, data in (("openai_chat_request.json", openai), ("gemini_fields.json", gemini)):
        (OUT / name).write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
        print(f"{OUT / name}: {(OUT / name).stat().st_size} bytes")


if __name__ == "__main__":
    main()

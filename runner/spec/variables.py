"""``${name}`` in any string of a job file, replaced by the job's ``vars:`` (or ``--var name=value``) before the
job is validated."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import JobFileError
from runner.spec.problems import fail
from runner.spec.yamlfile import Loc

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: characters ``${name}`` substitution may add to a job (a var used many times, vars built from vars): beyond,
#: the file is refused rather than expanded without end
MAX_SUBSTITUTED_CHARS = 10_000_000


@dataclass
class Substituted:
    """A job file's data with its ``${name}``s replaced, and what could not be."""

    data: dict[str, Any]
    #: each problem, ``file:line: key: what``, in the order found (a var's own problems first)
    problems: list[str] = field(default_factory=list)
    #: the keys whose strings were left as written, as they use a var that is undefined or has a problem
    broken: set[Loc] = field(default_factory=set)


class _Unresolved(Exception):
    """A string uses a var that has a problem of its own, already said."""


def substitute_vars(path: Path, lines: dict[Loc, int], data: dict[str, Any], overrides: dict[str, str]
                    ) -> Substituted:
    """Replace ``${name}`` in every string of the file by the job's ``vars:``, overridden by ``--var``. A var may
    use others (``out: "${root}/out"``); one that refers to itself, directly or through others, is refused. Every
    problem is gathered, not only the first: a string with a var that cannot be filled in is left as written, and
    its key is in ``broken``. A substitution beyond :data:`MAX_SUBSTITUTED_CHARS` is raised at once."""
    declared = data.get("vars") or {}
    if not isinstance(declared, dict) or not all(isinstance(v, str | int | float) for v in declared.values()):
        fail(path, lines, ("vars",), "vars: must map names to strings")
    values = {str(k): str(v) for k, v in declared.items()}
    out = Substituted(data)

    def said(problem: str) -> None:
        if problem not in out.problems:  # a var used by others is said once
            out.problems.append(problem)

    for name in sorted(set(overrides) - set(values)):
        hint = f" (the job's vars: {', '.join(sorted(values))})" if values else " (the job declares no vars:)"
        said(f"{path}: --var {name}: the job has no variable {name!r}{hint}")
    values.update((k, v) for k, v in overrides.items() if k in values)
    added = [0]  # characters substitution has added so far, against MAX_SUBSTITUTED_CHARS

    def substitute(text: str, loc: Loc, lookup: Any) -> str:
        def one(match: re.Match[str]) -> str:
            if match[1] not in values:
                fail(path, lines, loc, f"${{{match[1]}}} is not defined: add it to vars: or pass --var "
                                       f"{match[1]}=VALUE")
            value = lookup(match[1])
            added[0] += len(value)
            if added[0] > MAX_SUBSTITUTED_CHARS:
                raise _TooLarge(f"${{{match[1]}}}", loc)
            return value
        return _VAR.sub(one, text)

    resolved: dict[str, str] = {}
    failed: set[str] = set()

    def resolve(name: str, chain: list[str]) -> str:
        """A var's value with the vars it uses filled in; ``chain``: the vars being resolved, outermost first."""
        if name in resolved:
            return resolved[name]
        if name in failed:
            raise _Unresolved(name)
        if name in chain:
            cycle = chain[chain.index(name):]
            where = ("vars", cycle[0]) if cycle[0] in declared and cycle[0] not in overrides else ("vars",)
            if len(cycle) == 1:
                fail(path, lines, where, f"${{{name}}} refers to itself: give {name!r} a value that does not "
                                         "use it")
            loop = " -> ".join(f"${{{n}}}" for n in [*cycle, name])
            fail(path, lines, where, f"vars {', '.join(repr(n) for n in cycle)} refer to each other in a circle "
                                     f"({loop}): give one of them a value of its own")
        loc: Loc = ("vars", name) if name in declared and name not in overrides else ("vars",)
        resolved[name] = substitute(values[name], loc, lambda other: resolve(other, [*chain, name]))
        return resolved[name]

    try:
        for name in values:
            try:
                resolve(name, [])
            except JobFileError as exc:
                said(str(exc))
                failed.add(name)
            except _Unresolved:
                failed.add(name)

        def walk(value: Any, loc: Loc) -> Any:
            if isinstance(value, str):
                try:
                    return substitute(value, loc, lambda name: resolve(name, []))
                except JobFileError as exc:
                    said(str(exc))
                except _Unresolved:
                    pass
                out.broken.add(loc)
                return value
            if isinstance(value, dict):
                return {k: (v if loc == () and k == "vars" else walk(v, loc + (k,))) for k, v in value.items()}
            if isinstance(value, list):
                return [walk(v, loc + (i,)) for i, v in enumerate(value)]
            return value

        out.data = walk(data, ())
    except _TooLarge as exc:
        fail(path, lines, exc.loc, f"{exc.var}: the vars substituted add more than {MAX_SUBSTITUTED_CHARS:,} "
                                   "characters to the job")
    if "vars" in out.data or overrides:
        out.data["vars"] = {name: resolved.get(name, values[name]) for name in values}
    return out


class _TooLarge(Exception):
    """Substitution went past :data:`MAX_SUBSTITUTED_CHARS`: the file is refused whole, at once."""

    def __init__(self, var: str, loc: Loc) -> None:
        self.var, self.loc = var, loc

"""Classes named by the entry points of one group, each imported the first time its name is asked for: the
mechanism of the provider registry. runner/providers/base.py makes the one registry the runner has,
``PROVIDERS = EntryPointRegistry(Provider, "runner.providers", ...)``, and names its methods ``register``,
``unregister``, ``provider_names`` and ``provider_class``.

The names are the entry points' names, read once from the installed distributions' metadata without importing
anything (:meth:`EntryPointRegistry.names`); a class is imported the first time it is asked for
(:meth:`EntryPointRegistry.load`), so a plug-in that fails to import, is not a subclass of the registry's kind, or
whose name two packages claim is one sentence (``ModelSetupError``) when it is named and harmless when it is not.
:meth:`EntryPointRegistry.register` adds a class directly (tests' fakes; ``@register`` on a bundled class is
harmless). A source tree without installed metadata scans its own package for the classes instead.

The registry is handed the class its entries must subclass (``kind``) and imports nothing of runner/providers, so
the module that defines that class can make the registry without an import cycle.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint
from typing import Any, Generic, TypeVar, overload

from runner.errors import ModelSetupError

KindT = TypeVar("KindT", bound=type)
ClassT = TypeVar("ClassT", bound=type)


def qualified(cls: type) -> str:
    """``module.Class``, as messages name a class."""
    return f"{cls.__module__}.{cls.__qualname__}"


def origin(entry: EntryPoint) -> str:
    """Where an entry point comes from, for messages: its distribution and its line."""
    dist = entry.dist.name if entry.dist is not None else "an unnamed package"
    return f"the {dist} package's entry point {entry.name} = {entry.value!r}"


class EntryPointRegistry(Generic[KindT]):
    """The subclasses of ``kind`` named by the entry points of ``group`` (``name = "module:Class"``), each class
    with a ``name`` attribute equal to its entry point's name. ``package`` is the package whose own modules stand
    in for the entry points when no installed metadata names them (a source tree put on the path), less the
    modules in ``skip`` and those starting with ``_``. ``noun`` names an entry in messages ("provider")."""

    def __init__(self, kind: KindT, group: str, *, package: str, skip: Iterable[str] = (),
                 noun: str = "entry") -> None:
        self.kind = kind
        self.group = group
        self.package = package
        self.skip = frozenset(skip)
        self.noun = noun
        #: name -> class: the classes loaded so far, and those :meth:`register` was handed directly
        self.classes: dict[str, KindT] = {}
        #: alias -> name
        self.aliases: dict[str, str] = {}
        #: name -> the entry points claiming it (one per distinct ``module:Class``), read once
        self._entry_points: dict[str, list[EntryPoint]] | None = None
        self._loading = threading.RLock()

    # -- classes handed over directly ----------------------------------------------------------------------
    @overload
    def register(self, cls: ClassT, aliases: Iterable[str] = ()) -> ClassT: ...
    @overload
    def register(self, cls: None = None, aliases: Iterable[str] = ()) -> Callable[[ClassT], ClassT]: ...
    def register(self, cls: ClassT | None = None, aliases: Iterable[str] = ()) -> Any:
        """Make a class known under its ``name`` (and ``aliases``): ``register(FooProvider)``, or as a class
        decorator, ``@register`` or ``@register(aliases=("f",))``. Registering the same class again (a module
        imported twice) replaces it; another class under a taken name is a ``ValueError``."""
        names = tuple(aliases)

        def add(cls: ClassT) -> ClassT:
            name = getattr(cls, "name", None)
            if not (isinstance(cls, type) and issubclass(cls, self.kind)) or not isinstance(name, str) or not name:
                raise TypeError(f"register() takes a {self.kind.__name__} subclass with a name, not {cls!r}")
            for key in (name, *names):
                if ":" in key or not key:
                    raise ValueError(f"{self.noun} name {key!r} must be non-empty and without ':'")
                holder = self.classes.get(self.aliases.get(key, key))
                if holder is not None and qualified(holder) != qualified(cls):
                    raise ValueError(f"{self.noun} name {key!r} is taken by {qualified(holder)}")
            self.classes[name] = cls  # type: ignore[assignment]
            for alias in names:
                self.aliases[alias] = name
            return cls

        return add if cls is None else add(cls)

    def unregister(self, name: str) -> KindT | None:
        """Forget the class ``name`` and its aliases (tests register fakes for one test); returns the class."""
        for alias in [alias for alias, target in self.aliases.items() if target == name]:
            del self.aliases[alias]
        return self.classes.pop(name, None)

    # -- classes named by entry points ---------------------------------------------------------------------
    def names(self, *, aliases: bool = False) -> list[str]:
        """The known names, sorted (with the aliases too when ``aliases``): the entry points' and the registered
        classes'. Nothing is imported to list them."""
        names = {*self._read_entry_points(), *self.classes}
        return sorted([*names, *self.aliases] if aliases else names)

    def load(self, name: str) -> KindT:
        """The class named ``name`` (or one of its aliases), loaded from its entry point the first time it is asked
        for; ``KeyError`` when nothing has that name, ``ModelSetupError`` (one sentence) when its entry point does
        not load or is claimed by two packages."""
        found = self.classes.get(self.aliases.get(name, name))  # the hot path (token counts, prices): no lock
        if found is not None:
            return found
        with self._loading:
            found = self.classes.get(self.aliases.get(name, name))
            if found is not None:
                return found
            claims = self._read_entry_points().get(name)
            if not claims:
                raise KeyError(f"unknown {self.noun} {name!r} (known: {', '.join(self.names())})")
            return self._load(name, claims)

    def _read_entry_points(self) -> dict[str, list[EntryPoint]]:
        """The group's entry points of every installed distribution, by name, read once without importing
        anything. Two entries with the same target (a package installed twice on the path) count once."""
        if self._entry_points is None:
            found: dict[str, list[EntryPoint]] = {}
            for entry in self._installed_entry_points():
                claims = found.setdefault(entry.name, [])
                if all(other.value != entry.value for other in claims):
                    claims.append(entry)
            self._entry_points = found
        return self._entry_points

    def _installed_entry_points(self) -> list[EntryPoint]:
        entries = list(importlib.metadata.entry_points(group=self.group))
        if not any(entry.value.startswith(f"{self.package}.") for entry in entries):
            # the package run from a source tree without its installed metadata: its own modules stand in
            entries += self._bundled_without_metadata()
        return entries

    def _bundled_without_metadata(self) -> list[EntryPoint]:
        """The classes the package's own modules define, as entry points (only when no installed metadata names
        them, e.g. a source tree put on the path); the modules must import nothing heavy at their top."""
        import pkgutil  # a source tree without installed metadata only

        package = importlib.import_module(self.package)
        entries = []
        for info in pkgutil.iter_modules(package.__path__):
            if info.name in self.skip or info.name.startswith("_"):
                continue
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for attribute, value in vars(module).items():
                if (isinstance(value, type) and issubclass(value, self.kind) and value.__module__ == module.__name__
                        and not attribute.startswith("_") and isinstance(value.__dict__.get("name"), str)):
                    entries.append(EntryPoint(value.name, f"{module.__name__}:{attribute}", self.group))
        return entries

    def _load(self, name: str, claims: list[EntryPoint]) -> KindT:
        """Import the class an entry point names and register it; each way this fails is one sentence."""
        noun = self.noun
        if len(claims) > 1:
            raise ModelSetupError(f"{noun} {name!r} is claimed twice, by {origin(claims[0])} and by "
                                  f"{origin(claims[1])}: uninstall one of them")
        entry = claims[0]
        try:
            loaded = entry.load()
        except Exception as exc:  # noqa: BLE001 - a plug-in's import may raise anything; said in one sentence
            raise ModelSetupError(f"{noun} {name!r} cannot be loaded from {origin(entry)}: "
                                  f"{type(exc).__name__}: {exc}") from None
        if not (isinstance(loaded, type) and issubclass(loaded, self.kind)):
            raise ModelSetupError(f"{noun} {name!r} cannot be loaded from {origin(entry)}: {loaded!r} is not a "
                                  f"subclass of {qualified(self.kind)}")
        if getattr(loaded, "name", None) != name:
            raise ModelSetupError(f"{noun} {name!r} cannot be loaded from {origin(entry)}: its class is named "
                                  f"{getattr(loaded, 'name', None)!r}; the entry point's name and the class's name "
                                  "must be the same")
        try:
            return self.register(loaded)  # type: ignore[no-any-return]
        except ValueError as exc:  # an alias of the class taken by another entry
            raise ModelSetupError(f"{noun} {name!r} cannot be loaded from {origin(entry)}: {exc}") from None

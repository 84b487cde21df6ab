"""Which providers bill, and under which provider id genai-prices lists their models: our provider names ->
genai-prices' provider ids, read from the registered provider classes' ``price_id`` (runner/providers/pricing.py
prices a model of a provider named here from genai-prices; any other provider's models are free unless the job
prices them)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class _ProviderIds(Mapping[str, str]):
    """Our provider names -> genai-prices' provider ids, read from the registered provider classes'
    ``price_id`` whenever it is asked (a provider registered later is seen; an alias resolves to its provider)."""

    def __getitem__(self, name: str) -> str:
        from .base import provider_class

        price_id = provider_class(name).price_id
        if price_id is None:
            raise KeyError(name)
        return price_id

    def _ids(self) -> dict[str, str]:
        from .base import provider_class, provider_names

        return {name: cls.price_id for name in provider_names() if (cls := provider_class(name)).price_id}

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids())

    def __len__(self) -> int:
        return len(self._ids())

    def __repr__(self) -> str:
        return f"PROVIDER_IDS({self._ids()!r})"


#: the paid providers: our provider names -> genai-prices' provider ids. Every other provider is free unless the
#: job prices its models, so a provider that bills must set ``price_id`` (or its models be priced in the job).
PROVIDER_IDS: Mapping[str, str] = _ProviderIds()

"""The simulated server's own log of what it answered and billed, one entry per model request, batch and batch
line, kept only while ``log_requests`` is on (``POST /sim/config {"log_requests": true}``) and read with
``GET /sim/log?after=N`` (the entries whose ``n`` is above N, oldest first). ``/sim/reset`` empties it.

It is what a seeded fault simulation (``scripts/chaos.py``) checks the runner's guarantees against: which request
the server answered how many times, identified as the answers identify it, by the model it was asked and the
SHA-256 of its messages as canonical JSON (:func:`simserver.answers.message_digest`), the same in every format.

Entries (every one has ``n``, from 1, and ``kind``):
    ``request``  a model request on any route: ``route`` (the wire format), ``model``, ``digest`` (None when the
                 body could not be read), ``status`` (the HTTP status; 499 when the client had gone), ``outcome``
                 and ``billed``.
    ``batch``    a batch created: ``provider``, ``batch`` (its id), ``lines``.
    ``line``     a batch line once its batch ended: ``provider``, ``batch``, ``custom_id``, ``model``, ``digest``
                 (None unless answered), ``outcome`` (succeeded, errored, expired, canceled) and ``billed``.

Outcomes of a request: ``answered`` (a 200 the client could read), ``filtered`` (a 200 with a content-filtered
answer), ``malformed`` (a 200 whose body was cut: nothing a client can use), ``hung`` (a ``fault_timeout`` the client
may have left), ``abandoned`` (the client left while the answer was being made: a process killed mid-request),
``refused`` (any error answer: the key, a 400, a 429, a 5xx). Billed, as a provider bills: what it made an answer
for, read or not (``answered``, ``filtered``, ``abandoned``) and a batch line it answered (``succeeded``). A
malformed body and a hang are the server's own faults, billed by no provider we know of for a body its client
cannot read; a client is right to send those again.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BILLED", "RequestLog"]

#: the outcomes a provider bills
BILLED = frozenset({"answered", "filtered", "abandoned", "succeeded"})


class RequestLog:
    """The entries, in order; ``on`` says whether anything is recorded."""

    def __init__(self) -> None:
        self.on = False
        self.entries: list[dict[str, Any]] = []

    def clear(self) -> None:
        self.entries = []

    def _add(self, kind: str, **fields: Any) -> None:
        if self.on:
            self.entries.append({"n": len(self.entries) + 1, "kind": kind, **fields})

    def request(self, route: str, model: str | None, digest: str | None, status: int, outcome: str) -> None:
        self._add("request", route=route, model=model, digest=digest, status=status, outcome=outcome,
                  billed=outcome in BILLED)

    def batch(self, provider: str, batch_id: str, lines: int) -> None:
        self._add("batch", provider=provider, batch=batch_id, lines=lines)

    def line(self, provider: str, batch_id: str, custom_id: str, model: str | None, digest: str | None,
             outcome: str) -> None:
        self._add("line", provider=provider, batch=batch_id, custom_id=custom_id, model=model, digest=digest,
                  outcome=outcome, billed=outcome in BILLED)

    def after(self, n: int) -> list[dict[str, Any]]:
        """The entries whose ``n`` is above ``n``."""
        return self.entries[max(0, n):]

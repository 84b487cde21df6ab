"""How much of an answer the runner reads: every answer from a server is bounded in size (as sent and as
decompressed) and in total time, besides the provider's ``timeout`` between bytes (issue 41: a server sending an
endless body filled 4 GB in 48 s, a 1 MiB gzip answer grew to 2.15 GB, and one byte every 2 s held a request for
ever). Past a bound the request fails with :class:`OutOfBounds`, which each provider turns into a retryable
:class:`~runner.errors.TransientError` of its own class (``answer_too_large``, ``answer_inflated_too_large``,
``answer_too_slow``): the retry policy counts it as one attempt, as any failed send.

The lean wire (``lean_http.py``) applies the bounds itself; the SDKs' clients through a transport that wraps
theirs (``bounded_httpx.py``). This module imports no HTTP library: the lean path stays light."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from runner.errors import TransientError

__all__ = ["AnswerBounds", "Bound", "Inflater", "OutOfBounds", "bounds_of", "default_bounds", "is_download",
           "out_of_bounds", "surfaced"]

MIB = 1 << 20
#: the bounds' defaults (the provider settings max_answer_mb, max_download_mb, and total_timeout's floor)
ANSWER_MB = 64.0
DOWNLOAD_MB = 4096.0
TOTAL_SECONDS = 600.0
#: how many times an answer's total time a Batch API's results download is given (an hour by default)
DOWNLOAD_TIMES = 6
#: the content codings the runner asks for and reads; any other a server sends is refused, unread
READABLE_CODINGS = ("identity", "gzip", "deflate")


@dataclass(frozen=True, slots=True)
class Bound:
    """What one answer may take: ``bytes`` (as received and decompressed), ``seconds`` in all, and the setting
    that sets its size (named when it is passed)."""

    bytes: int
    seconds: float
    setting: str = "max_answer_mb"


@dataclass(frozen=True)
class AnswerBounds:
    #: bytes of one answer, as received and once decompressed
    answer_bytes: int
    #: the same for a download of a Batch API's results file (:func:`is_download`)
    download_bytes: int
    #: seconds from sending a request to the last byte of its answer
    total_seconds: float

    @property
    def answer(self) -> Bound:
        return Bound(self.answer_bytes, self.total_seconds)

    @property
    def download(self) -> Bound:
        """A results download, which may be gigabytes: :data:`DOWNLOAD_TIMES` the answers' total time."""
        return Bound(self.download_bytes, self.total_seconds * DOWNLOAD_TIMES, "max_download_mb")

    def of(self, path: str) -> Bound:
        """The bound of the answer to a request of this URL path."""
        return self.download if is_download(path) else self.answer


def default_bounds(timeout: float) -> AnswerBounds:
    """The bounds of a provider whose settings leave them unset, ``timeout`` its time between reads."""
    return AnswerBounds(answer_bytes=int(ANSWER_MB * MIB), download_bytes=int(DOWNLOAD_MB * MIB),
                        total_seconds=max(TOTAL_SECONDS, timeout))


class BoundSettings(Protocol):
    """What :func:`bounds_of` reads of a provider's settings (``ProviderSettings``, which imports this module)."""

    max_answer_mb: float
    max_download_mb: float

    def answer_seconds(self) -> float: ...


def bounds_of(settings: BoundSettings) -> AnswerBounds:
    return AnswerBounds(answer_bytes=int(settings.max_answer_mb * MIB),
                        download_bytes=int(settings.max_download_mb * MIB),
                        total_seconds=settings.answer_seconds())


def is_download(path: str) -> bool:
    """Whether a request's URL path fetches a Batch API's results, which may be far larger than one answer:
    OpenAI's and Azure's ``GET /files/{id}/content``, Anthropic's ``GET /v1/messages/batches/{id}/results``,
    Gemini's ``GET /download/v1beta/files/{id}:download``."""
    return (path.endswith("/content") and "/files/" in path) or path.endswith("/results") or path.endswith(":download")


class OutOfBounds(Exception):
    """An answer past one of its bounds; ``error_class`` names which."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


def too_large(bound: Bound) -> OutOfBounds:
    return OutOfBounds("answer_too_large", f"the answer was larger than {_size(bound.bytes)} ({bound.setting})")


def too_slow(bound: Bound) -> OutOfBounds:
    return OutOfBounds("answer_too_slow", f"the answer took longer than {bound.seconds:g} s in all (total_timeout)")


def coding_refused(coding: str) -> OutOfBounds:
    return OutOfBounds("malformed_response", f"the answer came in content coding {coding!r}, which was not asked for")


class Inflater:
    """A gzip or zlib body decompressed as it arrives, never to more than ``bound.bytes``: a small compressed
    answer that would grow past it fails without growing (zlib's ``max_length``)."""

    def __init__(self, bound: Bound) -> None:
        self.bound = bound
        self.size = 0
        self._inflate = zlib.decompressobj(47)  # 47: a gzip or a zlib header, told apart by zlib

    def feed(self, data: bytes) -> bytes:
        out = self._inflate.decompress(data, self.bound.bytes - self.size + 1)
        self.size += len(out)
        if self.size > self.bound.bytes or self._inflate.unconsumed_tail:
            raise self._grown()
        return out

    def end(self) -> bytes:
        """What the decompressor still holds; a body cut short of its end raises ``zlib.error``."""
        rest = self._inflate.flush()
        if not self._inflate.eof:
            raise zlib.error("the compressed answer ended before its end")
        self.size += len(rest)
        if self.size > self.bound.bytes:
            raise self._grown()
        return rest

    def _grown(self) -> OutOfBounds:
        return OutOfBounds("answer_inflated_too_large", f"the answer grew past {_size(self.bound.bytes)} once "
                                                        f"decompressed ({self.bound.setting})")


def out_of_bounds(exc: BaseException | None) -> OutOfBounds | None:
    """The :class:`OutOfBounds` behind ``exc`` (itself, or in its chain of causes: an SDK wraps a transport's
    failure in its own connection error), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OutOfBounds):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@contextlib.contextmanager
def surfaced(where: str) -> Iterator[None]:
    """Around a provider's mapping of its SDK's errors: an answer out of bounds, however the SDK wrapped it, is
    the retryable error of its own class, not a connection error."""
    try:
        yield
    except Exception as exc:
        if (bound := out_of_bounds(exc)) is None:
            raise
        raise TransientError(f"{where}: {bound}", error_class=bound.error_class) from exc


def _size(limit: int) -> str:
    return f"{limit / MIB:g} MiB" if limit >= MIB else f"{limit:,} bytes"

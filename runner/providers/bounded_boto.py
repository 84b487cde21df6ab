"""boto3's clients with every answer bounded (``answer_bounds.py``): botocore reads an answer whole, through
urllib3, with no bound on its size and none on its total time (``read_timeout`` bounds each read). A
``before-send`` handler (botocore's documented hook for sending a request in its own way) sends the request through
the client's own HTTP session, asking it to leave the body unread, and reads the body within the bounds; botocore
then parses it as it would have. Answers botocore streams to its caller (S3's GetObject) are read by
:func:`read_bounded` where the caller reads them. botocore asks urllib3 not to decompress (``decode_content=False``),
so a size as received is a size in memory. Imported where a boto3 client is made."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from .answer_bounds import AnswerBounds, Bound, OutOfBounds, coding_refused, too_large, too_slow

__all__ = ["bound_client", "read_bounded"]

_CHUNK = 1 << 16
#: the read of a urllib3 response without ``read1``, which waits for all of it: a trickle is cut within this many
#: bytes past its deadline
_OLD_CHUNK = 1 << 10


def read_bounded(raw: Any, bound: Bound, began: float) -> bytes:
    """The body of urllib3's response ``raw``, as received, read as it arrives (``read1``): at most ``bound.bytes``
    and until ``bound.seconds`` after ``began`` (the monotonic time it was sent), else
    :class:`~runner.providers.answer_bounds.OutOfBounds`. A urllib3 without ``read1`` (before 2.3) is read in
    blocking reads of at most :data:`_OLD_CHUNK` bytes, its total time checked after each."""
    deadline = began + bound.seconds
    chunks: list[bytes] = []
    size = 0
    read1 = getattr(raw, "read1", None)
    try:
        while chunk := (read1(_CHUNK, decode_content=False) if read1 is not None
                        else raw.read(_OLD_CHUNK, decode_content=False)):
            size += len(chunk)
            if size > bound.bytes:
                raise too_large(bound)
            if time.monotonic() > deadline:
                raise too_slow(bound)
            chunks.append(chunk)
    except BaseException:
        raw.close()  # the connection is not handed back with an answer half read
        raise
    return b"".join(chunks)


@contextlib.contextmanager
def _as_botocore(request: Any) -> Iterator[None]:
    """urllib3's failures while the body is read, raised as botocore raises them when it reads the body itself
    (``URLLib3Session.send``)."""
    from botocore.exceptions import ConnectionClosedError, HTTPClientError, ReadTimeoutError
    from urllib3.exceptions import ProtocolError
    from urllib3.exceptions import ReadTimeoutError as URLLib3ReadTimeout

    try:
        yield
    except URLLib3ReadTimeout as exc:
        raise ReadTimeoutError(endpoint_url=request.url, error=exc) from exc
    except ProtocolError as exc:
        raise ConnectionClosedError(error=exc, request=request, endpoint_url=request.url) from exc
    except (OutOfBounds, HTTPClientError):
        raise
    except Exception as exc:
        raise HTTPClientError(error=exc) from exc


def bound_client(client: Any, bounds: AnswerBounds) -> Any:
    """``client`` (a boto3 client), each answer it reads whole bounded by ``bounds``; returned for chaining."""
    session = client._endpoint.http_session  # the client's own: its pool, TLS and proxies (no public name)

    def send(request: Any, **_: Any) -> Any:
        if request.stream_output:  # read by its caller (read_bounded)
            return None
        began = time.monotonic()
        request.stream_output = True  # botocore leaves the body unread
        try:
            response = session.send(request)
        finally:
            request.stream_output = False
        coding = (response.headers.get("content-encoding") or "identity").strip().lower()
        if coding != "identity":  # botocore reads JSON and XML answers as sent: a coded one is no answer to parse
            response.raw.close()
            raise coding_refused(coding)
        path = request.url.split("?", 1)[0]
        with _as_botocore(request):
            # what AWSResponse.content returns from now on
            response._content = read_bounded(response.raw, bounds.of(path), began)
        return response

    client.meta.events.register("before-send", send)
    return client

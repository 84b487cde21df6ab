"""The part of Amazon S3 that Bedrock batch inference needs, as the simulated server speaks it, under ``/s3`` with
path-style addressing (``/s3/{bucket}/{key}``), objects in memory:

    ``PUT    /s3/{bucket}/{key}``          PutObject: the body is the object; answers an ``ETag``.
    ``GET    /s3/{bucket}/{key}``          GetObject; ``HEAD`` HeadObject (its size and ETag, no body).
    ``DELETE /s3/{bucket}/{key}``          DeleteObject: 204 whether or not it was there (as S3 answers).
    ``GET    /s3/{bucket}?list-type=2``    ListObjectsV2: ``prefix``, ``max-keys`` (1000 at most),
                                           ``continuation-token``, ``start-after``, ``encoding-type=url``.

Shapes and words are the S3 API reference's (docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html, the
``ListBucketResult`` document; errors as ``<Error><Code>`` documents with S3's codes ``NoSuchKey``, ``AccessDenied``,
``InvalidAccessKeyId``), read by botocore's own parser. Every bucket exists. Each request needs a SigV4
``Authorization`` header scoped to ``s3`` (the signature is not verified); its access key id is compared with
``SimConfig.api_key`` as on the Bedrock routes. A body sent ``aws-chunked`` (botocore's flexible checksums over
https) is decoded. Objects are forgotten with the batch store's files (``/sim/reset``).

Bedrock batch jobs (:mod:`simserver.batch_bedrock`) read their input here and write their output here.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from email.utils import formatdate
from typing import TYPE_CHECKING
from urllib.parse import quote
from xml.sax.saxutils import escape

from aiohttp import web

from .batches import rfc3339

if TYPE_CHECKING:
    from .server import SimServer

__all__ = ["S3Object", "add_routes", "objects"]

PREFIX = "/s3"
_SIGV4 = re.compile(r"AWS4-HMAC-SHA256 Credential=([A-Za-z0-9]+)/\d{8}/[a-z0-9-]+/s3/aws4_request,\s*"
                    r"SignedHeaders=[a-z0-9;-]+,\s*Signature=[0-9a-f]{64}")
_XMLNS = "http://s3.amazonaws.com/doc/2006-03-01/"
_CHUNK = re.compile(rb"([0-9a-fA-F]+)(?:;[^\r\n]*)?\r\n")


@dataclass(slots=True)
class S3Object:
    data: bytes
    modified: float  #: wall-clock seconds
    etag: str


def objects(server: SimServer) -> dict[tuple[str, str], S3Object]:
    """The server's objects by (bucket, key) (``SimServer.stored_objects``, emptied by a reset)."""
    return server.stored_objects.setdefault("s3", {})


def put(server: SimServer, bucket: str, key: str, data: bytes) -> S3Object:
    import time

    stored = S3Object(data, time.time(), '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"')
    objects(server)[(bucket, key)] = stored
    return stored


def _error(status: int, code: str, message: str, resource: str = "") -> web.Response:
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{escape(message)}</Message>'
            f"<Resource>{escape(resource)}</Resource><RequestId>{os.urandom(8).hex().upper()}</RequestId></Error>")
    return web.Response(status=status, body=body.encode(), content_type="application/xml")


def _refused(server: SimServer, request: web.Request) -> web.Response | None:
    cfg = server.config
    if not (cfg.require_key or cfg.api_key is not None):
        return None
    found = _SIGV4.fullmatch(request.headers.get("Authorization", "").strip())
    if found is None:
        return _error(403, "AccessDenied", "Access Denied")
    if cfg.api_key is not None and found.group(1) != cfg.api_key:
        return _error(403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")
    return None


def _unchunked(data: bytes) -> bytes:
    """An ``aws-chunked`` body's payload: ``{size hex}[;chunk-signature=...]\\r\\n{bytes}\\r\\n`` ... ``0\\r\\n``."""
    out, at = bytearray(), 0
    while (found := _CHUNK.match(data, at)) is not None:
        size = int(found.group(1), 16)
        if size == 0:
            break
        start = found.end()
        out += data[start:start + size]
        at = start + size + 2
    return bytes(out)


def _listing(server: SimServer, request: web.Request, bucket: str) -> web.Response:
    query = request.query
    prefix = query.get("prefix", "")
    after = query.get("continuation-token") or query.get("start-after") or ""
    try:
        limit = max(0, min(int(query.get("max-keys", "1000")), 1000))
    except ValueError:
        return _error(400, "InvalidArgument", "max-keys must be an integer")
    keys = sorted(key for (b, key) in objects(server) if b == bucket and key.startswith(prefix) and key > after)
    chosen, more = keys[:limit], len(keys) > limit
    encode = (lambda text: quote(text, safe="/")) if query.get("encoding-type") == "url" else escape
    parts = [f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{_XMLNS}">',
             f"<Name>{escape(bucket)}</Name><Prefix>{encode(prefix)}</Prefix><KeyCount>{len(chosen)}</KeyCount>",
             f"<MaxKeys>{limit}</MaxKeys><IsTruncated>{'true' if more else 'false'}</IsTruncated>"]
    if query.get("encoding-type") == "url":
        parts.append("<EncodingType>url</EncodingType>")
    if query.get("continuation-token"):
        parts.append(f"<ContinuationToken>{escape(query['continuation-token'])}</ContinuationToken>")
    if more:
        parts.append(f"<NextContinuationToken>{escape(chosen[-1])}</NextContinuationToken>")
    for key in chosen:
        stored = objects(server)[(bucket, key)]
        parts.append(f"<Contents><Key>{encode(key)}</Key><LastModified>{rfc3339(stored.modified)}</LastModified>"
                     f"<ETag>{escape(stored.etag)}</ETag><Size>{len(stored.data)}</Size>"
                     "<StorageClass>STANDARD</StorageClass></Contents>")
    parts.append("</ListBucketResult>")
    return web.Response(body="".join(parts).encode(), content_type="application/xml")


def add_routes(server: SimServer, app: web.Application) -> None:
    """Add the S3 routes under ``/s3``."""

    async def bucket_route(request: web.Request) -> web.StreamResponse:
        if (refused := _refused(server, request)) is not None:
            return refused
        bucket = request.match_info["bucket"]
        if request.query.get("list-type") != "2":
            return _error(501, "NotImplemented", "The simulated server lists objects with ListObjectsV2 only")
        return _listing(server, request, bucket)

    async def object_route(request: web.Request) -> web.StreamResponse:
        if (refused := _refused(server, request)) is not None:
            return refused
        bucket, key = request.match_info["bucket"], request.match_info["key"]
        resource = f"/{bucket}/{key}"
        if request.method == "PUT":
            data = await request.read()
            if "aws-chunked" in request.headers.get("Content-Encoding", ""):
                data = _unchunked(data)
            stored = put(server, bucket, key, data)
            return web.Response(status=200, headers={"ETag": stored.etag})
        if request.method == "DELETE":
            objects(server).pop((bucket, key), None)
            return web.Response(status=204)
        stored = objects(server).get((bucket, key))
        if stored is None:
            if request.method == "HEAD":
                return web.Response(status=404)
            return _error(404, "NoSuchKey", "The specified key does not exist.", resource)
        headers = {"ETag": stored.etag, "Last-Modified": formatdate(stored.modified, usegmt=True),
                   "Content-Type": "application/octet-stream"}
        if request.method == "HEAD":
            return web.Response(status=200, headers={**headers, "Content-Length": str(len(stored.data))})
        return web.Response(status=200, body=stored.data, headers=headers)

    app.router.add_get(PREFIX + "/{bucket}", bucket_route)
    app.router.add_get(PREFIX + "/{bucket}/{key:.+}", object_route)  # and HEAD (aiohttp's allow_head)
    app.router.add_put(PREFIX + "/{bucket}/{key:.+}", object_route)
    app.router.add_delete(PREFIX + "/{bucket}/{key:.+}", object_route)

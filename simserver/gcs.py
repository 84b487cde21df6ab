"""The subset of Google Cloud Storage's JSON API that ``google-cloud-storage`` uses to stage Vertex AI batch files,
objects kept in memory per server (and shared with :mod:`simserver.batch_vertex`, which reads a job's input and
writes its output here). Every route takes only an access token the simulated server issued (``Authorization:
Bearer``, :func:`simserver.vertex.token_valid`); none, or another, is a 401. Every bucket exists and is empty until
written. Source of the wire: cloud.google.com/storage/docs/json_api/v1/objects (insert, get, list, delete) and
cloud.google.com/storage/docs/uploads-downloads, as google-cloud-storage 3.x sends them:

    ``POST   /upload/storage/v1/b/{bucket}/o?uploadType=multipart``  a ``multipart/related`` body: the object's
             JSON metadata (``name``, ``contentType``), then its bytes; ``uploadType=media&name=...``: the bytes
             alone; ``uploadType=resumable``: a session (``Location``) that ``PUT`` requests with ``Content-Range``
             fill (308 with ``Range`` until the last byte, then the object).
    ``GET    /download/storage/v1/b/{bucket}/o/{name}?alt=media``  the bytes (also ``/storage/v1/...?alt=media``).
    ``GET    /storage/v1/b/{bucket}/o/{name}``   the object's metadata (``storage#object``).
    ``GET    /storage/v1/b/{bucket}/o?prefix=&maxResults=&pageToken=``  ``{"kind": "storage#objects", "items",
             "nextPageToken"?}``, by name.
    ``DELETE /storage/v1/b/{bucket}/o/{name}``   204.

Errors are the JSON API's: ``{"error": {"code", "message", "errors": [{"message", "domain", "reason"}]}}``.
"""

from __future__ import annotations

import base64
import email
import email.policy
import hashlib
import json
import os
import time
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from aiohttp import web

from .batches import rfc3339
from .vertex import token_valid

__all__ = ["GcsObject", "Objects", "add_routes", "objects_of"]

_LIST_PAGE = 1000


@dataclass(slots=True)
class GcsObject:
    bucket: str
    name: str
    data: bytes
    content_type: str
    generation: int
    created: float

    def resource(self) -> dict[str, Any]:
        md5 = base64.b64encode(hashlib.md5(self.data).digest()).decode()  # noqa: S324 - GCS's own checksum field
        resource = {"kind": "storage#object", "id": f"{self.bucket}/{self.name}/{self.generation}", "name": self.name,
                "bucket": self.bucket, "generation": str(self.generation), "metageneration": "1",
                "contentType": self.content_type, "size": str(len(self.data)), "md5Hash": md5,
                "storageClass": "STANDARD", "timeCreated": rfc3339(self.created), "updated": rfc3339(self.created),
                "selfLink": f"/storage/v1/b/{self.bucket}/o/{quote(self.name, safe='')}",
                "mediaLink": f"/download/storage/v1/b/{self.bucket}/o/{quote(self.name, safe='')}?alt=media"}
        crc = _crc32c(self.data)
        if crc is not None:  # google-cloud-storage checks a resumable upload's crc32c when it has google-crc32c
            resource["crc32c"] = crc
        return resource


def _crc32c(data: bytes) -> str | None:
    """The object's CRC32C (big-endian, base64) as Cloud Storage reports it, where google-crc32c is installed."""
    try:
        import google_crc32c
    except ImportError:
        return None
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


class Objects:
    """The objects of one server's buckets: (bucket, name) -> :class:`GcsObject`."""

    def __init__(self, objects: dict[tuple[str, str], GcsObject]) -> None:
        self.objects = objects  #: the server's (``SimServer.stored_objects["gcs"]``, emptied by a reset)
        self.sessions: dict[str, tuple[str, str, str, bytearray]] = {}  #: resumable uploads in progress

    def put(self, bucket: str, name: str, data: bytes, content_type: str = "application/octet-stream") -> GcsObject:
        stored = GcsObject(bucket, name, bytes(data), content_type, time.time_ns() // 1000, time.time())
        self.objects[(bucket, name)] = stored
        return stored

    def get(self, bucket: str, name: str) -> GcsObject | None:
        return self.objects.get((bucket, name))

    def listed(self, bucket: str, prefix: str = "") -> list[GcsObject]:
        return sorted((o for (b, n), o in self.objects.items() if b == bucket and n.startswith(prefix)),
                      key=lambda o: o.name)


_STORES: weakref.WeakKeyDictionary[Any, Objects] = weakref.WeakKeyDictionary()


def objects_of(server: Any) -> Objects:
    """The Cloud Storage objects of ``server`` (made on first use)."""
    store = _STORES.get(server)
    if store is None:
        store = _STORES[server] = Objects(server.stored_objects.setdefault("gcs", {}))
    return store


def gcs_error(status: int, message: str, reason: str) -> web.Response:
    return web.json_response({"error": {"code": status, "message": message,
                                        "errors": [{"message": message, "domain": "global", "reason": reason}]}},
                             status=status)


def _not_found(bucket: str, name: str) -> web.Response:
    return gcs_error(404, f"No such object: {bucket}/{name}", "notFound")


def _name(request: web.Request) -> str:
    return unquote(request.match_info["name"])


def add_routes(server: Any, app: web.Application) -> None:
    """The Cloud Storage routes of ``server`` (see the module docstring)."""
    store = objects_of(server)

    def authorized(handler: Any) -> Any:
        async def run(request: web.Request) -> web.StreamResponse:
            auth = request.headers.get("Authorization", "")
            if not (auth.startswith("Bearer ") and token_valid(auth[7:].strip())):
                return gcs_error(401, "Anonymous caller does not have storage.objects access to the Google Cloud "
                                 "Storage object. Permission 'storage.objects.get' denied on resource (or it may "
                                 "not exist).", "required")
            return await handler(request)
        return run

    async def upload(request: web.Request) -> web.Response:
        bucket, kind = request.match_info["bucket"], request.query.get("uploadType", "")
        body = await request.read()
        if kind == "media":
            name = request.query.get("name", "")
            if not name:
                return gcs_error(400, "Required parameter: name", "required")
            return web.json_response(store.put(bucket, name, body, request.content_type).resource())
        if kind == "multipart":
            return _multipart(bucket, request.headers.get("Content-Type", ""), body)
        if kind == "resumable":
            metadata = json.loads(body or b"{}")
            name = request.query.get("name") or metadata.get("name", "")
            if not name:
                return gcs_error(400, "Required parameter: name", "required")
            session = os.urandom(12).hex()
            store.sessions[session] = (bucket, name, metadata.get("contentType") or "application/octet-stream",
                                       bytearray())
            location = f"{request.url.origin()}/upload/storage/v1/b/{bucket}/o?uploadType=resumable" \
                       f"&upload_id={session}"
            return web.Response(status=200, headers={"Location": location})
        return gcs_error(400, f"Invalid upload type: {kind!r}", "invalid")

    def _multipart(bucket: str, content_type: str, body: bytes) -> web.Response:
        message = email.message_from_bytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body,
                                           policy=email.policy.HTTP)
        parts = list(message.iter_parts()) if message.is_multipart() else []  # type: ignore[attr-defined]
        if len(parts) != 2:
            return gcs_error(400, "A multipart upload has two parts: the metadata, then the media.", "invalid")
        metadata = json.loads(parts[0].get_payload(decode=True) or b"{}")
        name = metadata.get("name", "")
        if not name:
            return gcs_error(400, "Required parameter: name", "required")
        data = parts[1].get_payload(decode=True) or b""
        stored = store.put(bucket, name, data, metadata.get("contentType") or parts[1].get_content_type())
        return web.json_response(stored.resource())

    async def resume(request: web.Request) -> web.Response:
        session = store.sessions.get(request.query.get("upload_id", ""))
        if session is None:
            return gcs_error(404, "No such upload session.", "notFound")
        bucket, name, content_type, data = session
        data += await request.read()
        total = request.headers.get("Content-Range", "").rpartition("/")[2]
        if total.isdigit() and len(data) >= int(total):
            del store.sessions[request.query["upload_id"]]
            return web.json_response(store.put(bucket, name, bytes(data), content_type).resource())
        headers = {"Range": f"bytes=0-{len(data) - 1}"} if data else {}
        return web.Response(status=308, headers=headers)

    async def download(request: web.Request) -> web.Response:
        bucket, name = request.match_info["bucket"], _name(request)
        stored = store.get(bucket, name)
        if stored is None:
            return _not_found(bucket, name)
        return web.Response(body=stored.data, content_type=stored.content_type.split(";")[0],
                            headers={"x-goog-generation": str(stored.generation)})

    async def metadata(request: web.Request) -> web.Response:
        if request.query.get("alt") == "media":
            return await download(request)
        bucket, name = request.match_info["bucket"], _name(request)
        stored = store.get(bucket, name)
        return web.json_response(stored.resource()) if stored is not None else _not_found(bucket, name)

    async def listing(request: web.Request) -> web.Response:
        bucket, query = request.match_info["bucket"], request.query
        found = store.listed(bucket, query.get("prefix", ""))
        token = query.get("pageToken")
        if token:
            found = [o for o in found if o.name > token]
        try:
            size = max(1, min(int(query.get("maxResults", _LIST_PAGE)), _LIST_PAGE))
        except ValueError:
            size = _LIST_PAGE
        answer: dict[str, Any] = {"kind": "storage#objects", "items": [o.resource() for o in found[:size]]}
        if len(found) > size:
            answer["nextPageToken"] = found[size - 1].name
        return web.json_response(answer)

    async def delete(request: web.Request) -> web.Response:
        bucket, name = request.match_info["bucket"], _name(request)
        if store.objects.pop((bucket, name), None) is None:
            return _not_found(bucket, name)
        return web.Response(status=204)

    add = app.router.add_route
    add("POST", "/upload/storage/v1/b/{bucket}/o", authorized(upload))
    add("PUT", "/upload/storage/v1/b/{bucket}/o", authorized(resume))
    add("GET", "/download/storage/v1/b/{bucket}/o/{name:.+}", authorized(download))
    add("GET", "/storage/v1/b/{bucket}/o", authorized(listing))
    add("GET", "/storage/v1/b/{bucket}/o/{name:.+}", authorized(metadata))
    add("DELETE", "/storage/v1/b/{bucket}/o/{name:.+}", authorized(delete))

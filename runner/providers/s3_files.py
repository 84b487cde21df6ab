"""Staging files in Amazon S3 through boto3's ``s3`` client, for Bedrock batch inference (which reads its records from
S3 and writes its answers there): put, list, get and delete objects, each call in the caller's thread pool (boto3 is
synchronous) with the caller's error mapping.

A folder is written ``s3://BUCKET/PREFIX``; its form is the ``s3Uri`` pattern of botocore's ``bedrock`` service model
(``S3InputDataConfig.s3Uri``, ``botocore/data/bedrock/2023-04-20/service-2.json``), since Bedrock is handed URIs
under it. The client is made from the provider's boto3 session with its retries off (the runner retries). Against a
simulated or self-hosted endpoint (a ``base_url``) it addresses buckets by path (``{endpoint}/{bucket}/{key}``):
botocore keeps the endpoint's own path, so the simulated server serves S3 under ``/s3``.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .answer_bounds import AnswerBounds

#: ``S3InputDataConfig.s3Uri`` of botocore's bedrock service model (a bucket name, then keys of these characters)
S3_URI = re.compile(r"s3://[a-z0-9][-.a-z0-9]{1,61}[a-z0-9](?:/[-!_*'().a-z0-9A-Z]+(?:/[-!_*'().a-z0-9A-Z]+)*)?/?")
#: the path under a ``base_url`` where the simulated server speaks S3
SIMULATED_S3_PATH = "/s3"


@dataclass(frozen=True, slots=True)
class Folder:
    """An S3 folder: a bucket and a key prefix (no leading or trailing slash; '' for the bucket's root)."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str) -> Folder:
        """``s3://BUCKET/PREFIX`` as a folder; ValueError when Bedrock would not take it."""
        if not S3_URI.fullmatch(uri):
            raise ValueError(f"{uri!r} is not an S3 folder Bedrock takes (s3://BUCKET/PREFIX: a lowercase bucket "
                             "name, then letters, digits and -!_*'(). in the path)")
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        return cls(bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(part for part in (self.prefix, *parts) if part)

    def uri(self, *parts: str) -> str:
        return f"s3://{self.bucket}/{self.key(*parts)}"


def split_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` as (bucket, key)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def s3_client(session: Any, region: str | None, base_url: str | None, timeout: float, width: int,
              bounds: AnswerBounds) -> Any:
    """boto3's ``s3`` client from ``session``: retries off, ``width`` connections, path-style under ``base_url``'s
    ``/s3`` when one is given (the simulated server), the real S3 otherwise; its answers within ``bounds``
    (an object's body where :meth:`S3Files.get` reads it)."""
    from botocore.config import Config

    from .bounded_boto import bound_client

    config = Config(retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=timeout,
                    read_timeout=timeout, max_pool_connections=width,
                    s3={"addressing_style": "path"} if base_url else None)
    endpoint = base_url.rstrip("/") + SIMULATED_S3_PATH if base_url else None
    return bound_client(session.client("s3", region_name=region, endpoint_url=endpoint, config=config), bounds)


class S3Files:
    """Objects of S3 through one boto3 client; every call runs in ``pool`` inside ``errors()``, every object read
    within ``bounds``' download bound."""

    def __init__(self, client: Any, pool: ThreadPoolExecutor | None,
                 errors: Callable[[], AbstractContextManager[None]], bounds: AnswerBounds) -> None:
        self.client = client
        self.pool = pool
        self.errors = errors
        self.bounds = bounds

    async def _run(self, method: Callable[..., Any], **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        with self.errors():
            return await loop.run_in_executor(self.pool, functools.partial(method, **kwargs))

    async def put(self, bucket: str, key: str, data: bytes) -> None:
        await self._run(self.client.put_object, Bucket=bucket, Key=key, Body=data,
                        ContentType="application/jsonl")

    async def get(self, bucket: str, key: str) -> bytes:
        """An object's body, read within the download bound of the client's answers."""
        from .bounded_boto import read_bounded

        bounds = self.bounds

        def read(**kwargs: Any) -> bytes:
            began = time.monotonic()
            body = self.client.get_object(**kwargs)["Body"]
            return read_bounded(body._raw_stream, bounds.download, began)  # urllib3's under botocore's StreamingBody

        return await self._run(read, Bucket=bucket, Key=key)  # type: ignore[no-any-return]

    async def keys(self, bucket: str, prefix: str) -> list[str]:
        """Every key under ``prefix``, page after page (ListObjectsV2's continuation tokens)."""
        def every(**kwargs: Any) -> list[str]:
            found: list[str] = []
            for page in self.client.get_paginator("list_objects_v2").paginate(**kwargs):
                found.extend(item["Key"] for item in page.get("Contents") or ())
            return found

        return await self._run(every, Bucket=bucket, Prefix=prefix)  # type: ignore[no-any-return]

    async def delete(self, bucket: str, key: str) -> None:
        await self._run(self.client.delete_object, Bucket=bucket, Key=key)

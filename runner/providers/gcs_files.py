"""Cloud Storage staging for Vertex AI batch prediction, through the official ``google-cloud-storage`` SDK.

Vertex batch prediction reads its input from a JSONL object in Cloud Storage and writes its output under a
``gs://`` prefix; the job names the folder both go under (``providers: {vertex: {batch_folder: gs://BUCKET/PREFIX}}``).
:class:`Staging` writes, lists, reads and deletes objects under it. The SDK is synchronous: every call here is made
in a worker thread (``asyncio.to_thread``), so the event loop keeps serving the run's other requests. Credentials are
the ones the provider loaded (Application Default Credentials), handed over, never read or kept elsewhere. The SDK's
own retries are off (``retry=None``): the runner retries (invariant 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from runner.errors import AuthError, BadRequest, ModelSetupError, RateLimited, RunnerError, TransientError

from .answer_bounds import AnswerBounds, default_bounds, surfaced, too_large, too_slow

#: the real Cloud Storage JSON API (the SDK's default)
STORAGE_API = "https://storage.googleapis.com"
SETTING = "providers.vertex.batch_folder"


@dataclass(frozen=True, slots=True)
class Folder:
    """A ``gs://BUCKET/PREFIX`` location: the bucket and the object name prefix (no leading or trailing slash)."""

    bucket: str
    prefix: str

    def name(self, *parts: str) -> str:
        """The object name of ``parts`` under this folder."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def uri(self, *parts: str) -> str:
        return f"gs://{self.bucket}/{self.name(*parts)}"


def parse_folder(value: str) -> Folder:
    """``gs://BUCKET[/PREFIX]`` as a :class:`Folder`, or one sentence naming the setting."""
    bucket, _, prefix = value.removeprefix("gs://").partition("/")
    if not value.startswith("gs://") or not bucket or "/" in bucket.strip() or " " in value:
        raise ModelSetupError(f"{SETTING} must be a Cloud Storage folder written gs://BUCKET/PREFIX, not "
                              f"{value!r}")
    return Folder(bucket, prefix.strip("/"))


def parse_uri(uri: str) -> tuple[str, str]:
    """``gs://BUCKET/NAME`` as (bucket, name)."""
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    if not uri.startswith("gs://") or not bucket:
        raise ValueError(f"not a gs:// URI: {uri!r}")
    return bucket, name


class _BoundedSink:
    """The file an object is downloaded into (the SDK writes it chunk by chunk, decompressed where the object is
    stored gzipped): within the download bound of ``bounds``, else
    :class:`~runner.providers.answer_bounds.OutOfBounds`."""

    def __init__(self, bounds: AnswerBounds) -> None:
        self.bound = bounds.download
        self.deadline = time.monotonic() + self.bound.seconds
        self.chunks: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self.bound.bytes:
            raise too_large(self.bound)
        if time.monotonic() > self.deadline:
            raise too_slow(self.bound)
        self.chunks.append(bytes(data))
        return len(data)


class Staging:
    """Objects in one Cloud Storage bucket, through a ``google.cloud.storage.Client`` built on first use."""

    def __init__(self, folder: Folder, *, project: str | None, credentials: Any, endpoint: str | None,
                 timeout: float, where: str, bounds: AnswerBounds | None = None) -> None:
        self.folder = folder
        self.project = project
        self.credentials = credentials
        #: the JSON API's root: the simulated server or an emulator in tests, Google's otherwise
        self.endpoint = endpoint or STORAGE_API
        self.timeout = timeout
        self.where = where
        #: how large and how long an object's download may be (its ``download_bytes``)
        self.bounds = bounds or default_bounds(timeout)
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            from google.cloud import storage

            self._client = storage.Client(project=self.project, credentials=self.credentials,
                                          client_options={"api_endpoint": self.endpoint})
        return self._client

    def _bucket(self, bucket: str | None = None) -> Any:
        return self.client().bucket(bucket or self.folder.bucket)

    # -- the synchronous calls, each made in a worker thread by the async ones below ---------------------------
    def _upload(self, name: str, data: bytes) -> None:
        blob = self._bucket().blob(name)
        blob.upload_from_string(data, content_type="application/jsonl", timeout=self.timeout, retry=None)

    def _download(self, bucket: str, name: str) -> bytes:
        sink = _BoundedSink(self.bounds)
        self._bucket(bucket).blob(name).download_to_file(sink, timeout=self.timeout, retry=None)
        return b"".join(sink.chunks)

    def _list(self, bucket: str, prefix: str) -> list[str]:
        blobs = self.client().list_blobs(bucket, prefix=prefix, timeout=self.timeout, retry=None)
        return sorted(blob.name for blob in blobs)

    def _peek(self) -> None:
        blobs = self.client().list_blobs(self.folder.bucket, prefix=self.folder.name(), max_results=1,
                                         timeout=self.timeout, retry=None)
        list(blobs)

    def _delete(self, bucket: str, name: str) -> None:
        from google.api_core import exceptions

        with contextlib.suppress(exceptions.NotFound):  # gone already: what was asked
            self._bucket(bucket).blob(name).delete(timeout=self.timeout, retry=None)

    # -- the async face ---------------------------------------------------------------------------------
    async def upload(self, name: str, data: bytes) -> str:
        """Write ``data`` to the object ``name`` of the folder's bucket; its ``gs://`` URI."""
        await self._call(self._upload, name, data)
        return f"gs://{self.folder.bucket}/{name}"

    async def download(self, uri: str) -> bytes:
        return await self._call(self._download, *parse_uri(uri))  # type: ignore[no-any-return]

    async def list(self, uri: str) -> list[str]:
        """The ``gs://`` URIs of the objects whose names start with ``uri``'s, sorted."""
        bucket, prefix = parse_uri(uri)
        names = await self._call(self._list, bucket, prefix)
        return [f"gs://{bucket}/{name}" for name in names]

    async def check(self) -> None:
        """One free list call of at most one object: the bucket exists and the credentials may list it."""
        await self._call(self._peek)

    async def delete(self, uri: str) -> None:
        await self._call(self._delete, *parse_uri(uri))

    def close(self) -> None:
        """Close the SDK's HTTP session, if one was opened."""
        if self._client is not None:
            self._client.close()
            self._client = None

    async def _call(self, function: Any, *args: Any) -> Any:
        with self.errors():
            return await asyncio.to_thread(function, *args)

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Cloud Storage's answers as the runner's errors, naming the folder setting where the user can fix it."""
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        folder = f"gs://{self.folder.bucket}/{self.folder.prefix}".rstrip("/")
        try:
            with surfaced(self.where):
                yield
        except RunnerError:
            raise
        except (auth.TransportError, OSError) as exc:
            raise TransientError(f"{self.where}: Cloud Storage could not be reached ({type(exc).__name__})",
                                 error_class="connection") from exc
        except (api.Unauthorized, auth.GoogleAuthError) as exc:
            raise AuthError(f"{self.where}: Cloud Storage refused the credentials for {folder}; export "
                            "GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth application-default login` with an "
                            "account that may write to it", status=401) from exc
        except api.Forbidden as exc:
            raise AuthError(f"{self.where}: the credentials may not read and write {folder} (403); grant the account "
                            f"Storage Object Admin on the bucket, or set {SETTING} to a folder it may use",
                            status=403) from exc
        except api.NotFound as exc:
            raise BadRequest(f"{self.where}: Cloud Storage has no {folder} (404: {exc.message}); set {SETTING} to "
                             "a folder of an existing bucket", status=404) from exc
        except api.TooManyRequests as exc:
            raise RateLimited(f"{self.where}: Cloud Storage answered 429 (too many requests)") from exc
        except api.ServerError as exc:
            raise TransientError(f"{self.where}: Cloud Storage answered {exc.code}", status=exc.code) from exc
        except api.GoogleAPICallError as exc:
            raise BadRequest(f"{self.where}: Cloud Storage refused a call on {folder} ({exc.code}: {exc.message})",
                             status=exc.code) from exc
        except Exception as exc:
            import requests

            if isinstance(exc, requests.RequestException):
                raise TransientError(f"{self.where}: Cloud Storage could not be reached ({type(exc).__name__})",
                                     error_class="connection") from exc
            raise

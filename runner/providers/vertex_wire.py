"""Vertex AI's hosts and REST paths for the lean wire (``runner/providers/lean_http.py``), as google-genai (in Vertex
mode) and the anthropic SDK's ``AsyncAnthropicVertex`` build them for a project and location: plain functions of the
project and location, so the provider in ``runner/providers/vertex.py`` only calls them. Nothing here imports an SDK.

Hosts (:func:`default_root`, both SDKs' rule when no base URL is given): ``global`` at aiplatform.googleapis.com, the
multi-regions ``us`` and ``eu`` at ``aiplatform.{location}.rep.googleapis.com``, a region at
``{location}-aiplatform.googleapis.com``. Bases (:func:`gemini_base`, :func:`claude_base`): the job's ``base_url``,
else the SDKs' variables (GOOGLE_VERTEX_BASE_URL, ANTHROPIC_VERTEX_BASE_URL), else the host; then ``/v1``.

Paths after the base: Gemini's ``/projects/{project}/locations/{location}/publishers/google/models/{model}
:generateContent`` (google-genai's ``t_model`` and ``_build_request``: :func:`gemini_path`), a cached content named in
full in its body (google-genai's ``_resource_name``: :func:`cached_content_name`), Claude's ``.../publishers/anthropic/
models/{model}:rawPredict`` (as ``AsyncAnthropicVertex`` builds it: :func:`claude_path`), and the probe's
publisher-model lookup ``/publishers/{publisher}/models/{model}`` (google-genai's ``models.get``: :func:`lookup_path`).
tests/providers/test_lean_vertex.py checks each host and request against the one the SDKs send.
"""

from __future__ import annotations

import os
from urllib.parse import quote

__all__ = ["MULTI_REGIONS", "VERTEX_API_VERSION", "cached_content_name", "claude_base", "claude_path",
           "default_root", "gemini_base", "gemini_path", "lookup_path", "publisher_model", "resource_path"]

#: Vertex's API version for Gemini: v1 (GA) has systemInstruction, responseMimeType, responseJsonSchema and
#: thinkingConfig (cloud.google.com/vertex-ai/docs/reference/rest/v1/GenerationConfig)
VERTEX_API_VERSION = "v1"
#: the multi-regions served at ``aiplatform.{location}.rep.googleapis.com`` (both SDKs' rule)
MULTI_REGIONS = ("us", "eu")
#: the characters a path keeps unescaped: a path segment's (as both SDKs quote a model id) and the slashes between
_PATH_SAFE = "!$&'()*+,;=:@-._~/"


def default_root(location: str | None) -> str:
    """Vertex's origin for ``location`` as google-genai and ``AsyncAnthropicVertex`` pick it when no base URL is
    given: ``global`` (google-genai's default location) at aiplatform.googleapis.com, a multi-region at its ``rep``
    host, a region at its own."""
    if location in (None, "", "global"):
        return "https://aiplatform.googleapis.com"
    if location in MULTI_REGIONS:
        return f"https://aiplatform.{location}.rep.googleapis.com"
    return f"https://{location}-aiplatform.googleapis.com"


def gemini_base(root: str | None, location: str | None) -> str:
    """google-genai's base in Vertex mode, with its API version: ``root`` (the job's ``base_url``), else
    GOOGLE_VERTEX_BASE_URL, else the location's host."""
    root = root or os.environ.get("GOOGLE_VERTEX_BASE_URL") or default_root(location)
    return f"{root.rstrip('/')}/{VERTEX_API_VERSION}"


def claude_base(root: str | None, location: str | None) -> str:
    """``AsyncAnthropicVertex``'s base: ``root`` (the job's ``base_url``) and ``/v1``, else ANTHROPIC_VERTEX_BASE_URL
    (as it is), else the location's host and ``/v1``."""
    if root:
        return f"{root}/v1"
    return os.environ.get("ANTHROPIC_VERTEX_BASE_URL") or f"{default_root(location)}/v1"


def publisher_model(model: str) -> str:
    """A model as google-genai names it in Vertex mode (its ``t_model``): a name under ``projects/``, ``models/`` or
    ``publishers/`` as it is, ``PUBLISHER/ID`` as ``publishers/PUBLISHER/models/ID``, else Google's model."""
    if model.startswith(("projects/", "models/", "publishers/")):
        return model
    if "/" in model:
        publisher, _, name = model.partition("/")
        return f"publishers/{publisher}/models/{name}"
    return f"publishers/google/models/{model}"


def resource_path(name: str, project: str | None, location: str | None) -> str:
    """A resource's path after the wire's base: under the project and location unless it names its own
    (google-genai's ``_build_request``)."""
    if not name.startswith("projects/"):
        name = f"projects/{project}/locations/{location}/{name}"
    return "/" + quote(name, safe=_PATH_SAFE)


def gemini_path(model: str, project: str | None, location: str | None) -> str:
    """``/projects/{project}/locations/{location}/publishers/google/models/{model}:generateContent`` (google-genai
    puts a model not under ``projects/`` under the client's project and location)."""
    return resource_path(publisher_model(model), project, location) + ":generateContent"


def lookup_path(name: str) -> str:
    """The publisher-model lookup's path after the wire's base (google-genai's ``models.get``, not under a
    project)."""
    return "/" + quote(publisher_model(name), safe=_PATH_SAFE)


def cached_content_name(name: str, project: str | None, location: str | None) -> str:
    """A cached content's full name in Vertex mode (google-genai's ``_resource_name``)."""
    if name.startswith("projects/"):
        return name
    if name.startswith("locations/"):
        return f"projects/{project}/{name}"
    if name.startswith("cachedContents/") or "/" not in name:
        return f"projects/{project}/locations/{location}/" + (
            name if name.startswith("cachedContents/") else f"cachedContents/{name}")
    return name


def claude_path(model: str, project: str | None, location: str | None) -> str:
    """``/projects/{project}/locations/{location}/publishers/anthropic/models/{model}:rawPredict``, each value
    quoted as a path segment and a ``;`` in the model escaped, as ``AsyncAnthropicVertex`` builds it."""
    from .lean_http import path_segment  # h11 with it: imported once a wire is built

    return (f"/projects/{path_segment(str(project))}/locations/{path_segment(str(location))}"
            f"/publishers/anthropic/models/{path_segment(model).replace(';', '%3B')}:rawPredict")

"""One TLS context for every SDK client of the process.

Each SDK client otherwise builds its own (the openai and anthropic SDKs' aiohttp transport one, google-genai three:
for httpx, aiohttp and websockets), each loading the CA bundle again: about 20 ms of CPU apiece, at every start of a
provider. The context is the one they would build: the file SSL_CERT_FILE names or certifi's bundle, and the folder
SSL_CERT_DIR names (httpx's ``create_ssl_context`` with ``trust_env``; google/genai/_api_client.py's
``_ensure_*_ssl_ctx``). Vertex's google-genai client keeps its own: it may present a client certificate.
"""

from __future__ import annotations

import functools
import os
import ssl


@functools.cache
def shared_context() -> ssl.SSLContext:
    import certifi

    return ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or certifi.where(),
                                      capath=os.environ.get("SSL_CERT_DIR") or None)

"""What a Bedrock model id says: whether it is Claude (sent through the Messages format), the Claude name the
capability table knows, and whether it is a cross-region inference profile. Shared by the provider and the
simulated server; imports nothing heavy.

Bedrock's ids (docs.aws.amazon.com/bedrock/latest/userguide/models-supported.html and
.../inference-profiles-support.html): ``PROVIDER.MODEL-vN:M`` for a foundation model
(``anthropic.claude-sonnet-4-5-20250929-v1:0``, ``amazon.nova-pro-v1:0``), the same behind a geography prefix for a
system-defined cross-region inference profile (``us.``, ``eu.``, ``apac.``, ``jp.``, ``au.``, ``ca.``, ``us-gov.``,
``global.``).
"""

from __future__ import annotations

import re

#: the geography prefixes of system-defined cross-region inference profiles
_PROFILE = re.compile(r"(?:us|eu|apac|jp|au|ca|us-gov|global)\.(?=[a-z0-9-]+\.)")
_CLAUDE = re.compile(r"(?:[a-z-]+\.)?anthropic\.(claude-.+)")
#: Bedrock's version suffix: ``-v1:0``, ``-v2:0``, ``-v1``
_VERSION = re.compile(r"-v\d+(?::\d+)?$")


def is_profile(model: str) -> bool:
    """Whether ``model`` names a cross-region inference profile (``us.anthropic.claude-...``)."""
    return _PROFILE.match(model) is not None


def claude_name(model: str) -> str | None:
    """The Anthropic name of a Claude model on Bedrock (``us.anthropic.claude-sonnet-4-5-20250929-v1:0`` ->
    ``claude-sonnet-4-5-20250929``), None for any other model."""
    found = _CLAUDE.fullmatch(model)
    return _VERSION.sub("", found.group(1)) if found else None


def foundation_model(model: str) -> str:
    """The foundation model behind an id: a cross-region profile's id without its geography prefix
    (``us.anthropic.claude-...`` -> ``anthropic.claude-...``), any other id as it is. CountTokens takes "the
    foundation model to use for token counting" (botocore's bedrock-runtime service model, ``modelId``)."""
    found = _PROFILE.match(model)
    return model[found.end():] if found else model

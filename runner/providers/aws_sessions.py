"""botocore's session of an AWS profile (the standard credential chain, the profile's settings) and boto3's session
around it, made once per process while the environment and the shared AWS files stay the same (``env_memo.py``):
``runner submit`` builds the bedrock provider three times before its first request (the checks before sending, the
pre-flight probe, the run), and each would make its session and resolve the chain again. The chain's credentials
(botocore's object, which refreshes itself) are then shared by all three, as boto3's clients of one session share
them. A changed variable makes a new session: a process whose AWS_ACCESS_KEY_ID changed between two runs signs the
second with the new keys.

Where the chain's answer is the environment's keys, they are read without botocore
(:func:`environment_credentials`): importing ``botocore.session`` costs 0.13-0.2 s of CPU before a Bedrock run's
first request, more than the rest of the provider's start.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .env_memo import EnvironmentMemo

__all__ = ["AwsSessions", "EnvironmentCredentials", "environment_credentials", "sessions"]


class AwsSessions:
    """botocore's session of ``profile`` (None: the default chain) and, on first need, boto3's around it (boto3's
    registers its handlers on botocore's, so there is one of it per botocore session)."""

    def __init__(self, profile: str | None) -> None:
        import botocore.session

        self.core: Any = botocore.session.Session(profile=profile)
        self._boto3: Any = None
        self._lock = threading.Lock()

    def boto3(self) -> Any:
        with self._lock:
            if self._boto3 is None:
                import boto3

                self._boto3 = boto3.Session(botocore_session=self.core)
            return self._boto3


_MADE: EnvironmentMemo[AwsSessions] = EnvironmentMemo()


def sessions(profile: str | None) -> AwsSessions:
    """The sessions of ``profile``, made once while the environment, the shared config file and the shared
    credentials file (AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/config and ~/.aws/credentials) stay
    the same."""
    files = (os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config",
             os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials")
    return _MADE.get(profile, files, lambda: AwsSessions(profile))


class EnvironmentCredentials:
    """Keys from the environment, as botocore's ``EnvProvider`` hands them over frozen (``access_key``,
    ``secret_key``, ``token``); never shown (its repr names none of them)."""

    __slots__ = ("access_key", "secret_key", "token")

    def __init__(self, access_key: str, secret_key: str, token: str | None) -> None:
        self.access_key = access_key
        self.secret_key = secret_key
        self.token = token

    def get_frozen_credentials(self) -> EnvironmentCredentials:
        return self

    def __repr__(self) -> str:
        return "EnvironmentCredentials(from the environment)"


def environment_credentials(profile: str | None) -> EnvironmentCredentials | None:
    """The environment's keys where botocore's chain would answer with them and nothing else, else None (the
    caller then asks botocore's session). Read as botocore's first provider, ``EnvProvider``, reads them
    (botocore/credentials.py, ``create_credential_resolver`` and ``EnvProvider.load``): the chain asks it first
    unless a profile is named (the job's or AWS_PROFILE, which this provider hands botocore's session as its
    profile, and a named profile takes the environment out of the chain); it answers where AWS_ACCESS_KEY_ID is not
    empty; the token is AWS_SECURITY_TOKEN, else AWS_SESSION_TOKEN. Left to botocore: an empty
    AWS_SECRET_ACCESS_KEY (botocore's error says which variable), and AWS_CREDENTIAL_EXPIRATION (botocore then
    re-reads the variables as they expire)."""
    environ = os.environ
    access_key = environ.get("AWS_ACCESS_KEY_ID", "")
    secret_key = environ.get("AWS_SECRET_ACCESS_KEY", "")
    if profile or not access_key or not secret_key or environ.get("AWS_CREDENTIAL_EXPIRATION"):
        return None
    token = environ.get("AWS_SECURITY_TOKEN") or environ.get("AWS_SESSION_TOKEN") or None
    return EnvironmentCredentials(access_key, secret_key, token)

"""botocore's session of an AWS profile (the standard credential chain, the profile's settings) and boto3's session
around it, made once per process while the environment and the shared AWS files stay the same (``env_memo.py``):
``runner submit`` builds the bedrock provider three times before its first request (the checks before sending, the
pre-flight probe, the run), and each would make its session and resolve the chain again. The chain's credentials
(botocore's object, which refreshes itself) are then shared by all three, as boto3's clients of one session share
them. A changed variable makes a new session: a process whose AWS_ACCESS_KEY_ID changed between two runs signs the
second with the new keys."""

from __future__ import annotations

import os
import threading
from typing import Any

from .env_memo import EnvironmentMemo

__all__ = ["AwsSessions", "sessions"]


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

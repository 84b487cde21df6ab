"""Whether a proxy applies (runner/providers/lean_or_sdk.py ``proxied``): the standard library's answer, read
without importing urllib.request where no proxy variable is set."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest

from runner.providers.lean_or_sdk import proxied

CASES = [
    {},
    {"HTTPS_PROXY": "http://127.0.0.1:9"},
    {"https_proxy": "http://127.0.0.1:9", "NO_PROXY": "api.example.org"},
    {"ALL_PROXY": "http://127.0.0.1:9"},
    {"HTTP_PROXY": "http://127.0.0.1:9"},
    {"HTTPS_PROXY": ""},
]


@pytest.mark.parametrize("variables", CASES)
def test_proxied_is_the_standard_librarys_reading(monkeypatch: pytest.MonkeyPatch, variables: dict[str, str]) -> None:
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    for url in ("https://api.example.org/v1", "http://127.0.0.1:8000/v1"):
        proxies = urllib.request.getproxies()
        parts = urllib.parse.urlsplit(url)
        expected = bool(proxies.get(parts.scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(
            parts.netloc)
        assert proxied(url) is expected, (variables, url)


def test_with_no_proxy_variable_urllib_request_is_not_imported() -> None:
    env = {name: value for name, value in os.environ.items() if not name.lower().endswith("_proxy")}
    probe = ("import sys\nfrom runner.providers.lean_or_sdk import proxied\n"
             "print(proxied('https://api.anthropic.com'), 'urllib.request' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env,
                          check=True)
    assert done.stdout.split() == ["False", "False"]

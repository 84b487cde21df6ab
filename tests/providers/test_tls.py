"""The one TLS context the SDK clients share (runner/providers/tls.py) is the one they would build: the bundle
SSL_CERT_FILE names, else certifi's."""

from __future__ import annotations

import certifi

from runner.providers import tls


def test_the_shared_context_loads_ssl_cert_file_when_set_and_certifis_bundle_otherwise(tmp_path, monkeypatch):
    bundle = certifi.contents()
    first = bundle[:bundle.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")] + "\n"
    one = tmp_path / "one.pem"
    one.write_text(first, encoding="ascii")
    try:
        monkeypatch.setenv("SSL_CERT_FILE", str(one))
        tls.shared_context.cache_clear()
        assert tls.shared_context().cert_store_stats()["x509_ca"] == 1
        monkeypatch.delenv("SSL_CERT_FILE")
        tls.shared_context.cache_clear()
        shared = tls.shared_context()
        assert shared.cert_store_stats()["x509_ca"] == bundle.count("-----BEGIN CERTIFICATE-----")
        assert tls.shared_context() is shared  # built once per process
    finally:
        tls.shared_context.cache_clear()

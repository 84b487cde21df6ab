"""Made-up cloud credentials for the benchmarks' runs against the simulated server, as a user's would come: AWS keys
and a region in the environment, and a Google service-account key file whose token endpoint is the server's; nothing
of this machine's clouds (bench/startup_providers.py, bench/throughput_common.py's ``child_env``)."""

from __future__ import annotations

import json
from pathlib import Path


def aws_environment(folder: Path) -> dict[str, str]:
    """Made-up AWS keys and a region, and nothing of this machine's AWS files or instance metadata (``folder`` holds
    no files of those names)."""
    return {"AWS_ACCESS_KEY_ID": "AKIDSIMULATED", "AWS_SECRET_ACCESS_KEY": "simulated-secret",
            "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": str(folder / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-aws-creds")}


def service_account(folder: Path, token_uri: str) -> Path:
    """A service-account key file as the Google Cloud console writes one, its token endpoint the simulated
    server's."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path = folder / "service-account.json"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "sim-project", "private_key_id": "0123456789abcdef",
        "private_key": pem, "client_email": "runner@sim-project.iam.gserviceaccount.com",
        "client_id": "100000000000000000001", "token_uri": token_uri}), encoding="utf-8")
    return path

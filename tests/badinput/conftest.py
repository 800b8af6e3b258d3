"""A real gateway process with auth on (tenant keys stored as sha256, an admin token) and
small limits in front of two simulated replicas, for the bad-input tests."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskplane.dev.local import LocalCluster

KEYS = {"acme": "acme-secret-key-0001", "globex": "globex-secret-key-0002"}
ADMIN_TOKEN = "admin-secret-token-0003"
MAX_BODY = 65536


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def auth_config(**limits: object) -> dict[str, object]:
    return {
        "auth": True,
        "admin_token_sha256": sha(ADMIN_TOKEN),
        "tenants": [
            {"id": "acme", "api_key_sha256": sha(KEYS["acme"]), "max_priority": "critical"},
            {"id": "globex", "api_key_sha256": sha(KEYS["globex"]), "max_priority": "standard", "max_concurrent": 2},
        ],
        "limits": {"max_body_bytes": MAX_BODY, "max_tokens": 8192, "body_timeout_s": 3.0, "header_timeout_s": 3.0,
                   **limits},
    }


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(Path(tmp_path_factory.mktemp("badinput")), replicas=2, config_overrides=auth_config())
    with c:
        yield c

"""Tenant keys and the secured gateway config of the bad-input tests (imported by name:
a test module must not import ``conftest``, which another folder may shadow)."""

from __future__ import annotations

import hashlib

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

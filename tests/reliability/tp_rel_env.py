"""Tenant keys of the reliability suite (the gateway config holds only their sha256) and the
secured gateway config."""

from __future__ import annotations

import hashlib
from typing import Any

KEYS = {"acme": "tp-acme-7f3a9c-SECRETKEY", "globex": "tp-globex-41b2e8-SECRETKEY"}
ADMIN_TOKEN = "tp-admin-90d1c4-SECRETTOKEN"


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def secured_config(**extra: Any) -> dict[str, Any]:
    """Auth on (the default, left implicit on purpose), keys as digests, small limits."""
    cfg: dict[str, Any] = {
        "admin_token_sha256": sha(ADMIN_TOKEN),
        "tenants": [
            {"id": "acme", "api_key_sha256": sha(KEYS["acme"]), "max_priority": "critical", "max_concurrent": 64},
            {"id": "globex", "api_key_sha256": sha(KEYS["globex"]), "max_priority": "standard", "max_concurrent": 2},
        ],
        "limits": {"max_body_bytes": 65536, "max_tokens": 1024},
    }
    cfg.update(extra)
    return cfg


def bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN if who == 'admin' else KEYS[who]}"}

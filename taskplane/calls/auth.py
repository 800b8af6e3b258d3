"""Tenant authentication and the priority cap.

API keys are stored only as sha256 digests and compared in constant time. With auth off
(``taskplane dev``) the tenant comes from ``X-Taskplane-Tenant``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from taskplane.config import GatewayConfig, TenantConfig
from taskplane.context import Priority
from taskplane.errors import ErrorType, TaskplaneError


def sha256_hex(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _bearer(headers: Mapping[str, str]) -> str | None:
    raw = headers.get("authorization")
    if not raw:
        return None
    scheme, _, token = raw.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise TaskplaneError(ErrorType.UNAUTHORIZED, "Authorization header must be 'Bearer <api key>'")
    return token.strip()


def authenticate(config: GatewayConfig, headers: Mapping[str, str]) -> str | None:
    """Return the tenant id proven by the API key, or None when auth is off."""
    token = _bearer(headers)
    if not config.auth:
        return None
    if token is None:
        raise TaskplaneError(ErrorType.UNAUTHORIZED, "missing API key: send 'Authorization: Bearer <key>'")
    digest = sha256_hex(token)
    found: str | None = None
    for tenant in config.tenants:
        if tenant.api_key_sha256 and hmac.compare_digest(tenant.api_key_sha256.lower(), digest):
            found = tenant.id  # keep looping: constant time over tenants
    if found is None:
        raise TaskplaneError(ErrorType.UNAUTHORIZED, "unknown API key")
    return found


def check_admin(config: GatewayConfig, headers: Mapping[str, str]) -> None:
    """Admin endpoints need the admin token when auth is on."""
    if not config.auth:
        return
    token = _bearer(headers)
    if not token or not config.admin_token_sha256:
        raise TaskplaneError(ErrorType.UNAUTHORIZED, "admin endpoints need 'Authorization: Bearer <admin token>'")
    if not hmac.compare_digest(config.admin_token_sha256.lower(), sha256_hex(token)):
        raise TaskplaneError(ErrorType.FORBIDDEN, "not the admin token")


def enforce_priority_cap(tenant: TenantConfig | None, priority: Priority) -> None:
    """A priority above the tenant's cap is refused (403), never silently lowered."""
    cap = tenant.max_priority if tenant else Priority.STANDARD
    if priority.rank < cap.rank:
        raise TaskplaneError(
            ErrorType.FORBIDDEN,
            f"priority {priority.value} is above tenant {tenant.id if tenant else 'default'}'s cap {cap.value}",
        )

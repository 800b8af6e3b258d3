"""Where the services are: explicit arguments, else ``TASKPLANE_*`` variables, else the dev stack.

The dev stack (``taskplane dev up``) is only consulted - and only imported - when an
address is still missing, so a production worker with its variables set never touches it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskplane.errors import UserError

ENV = {
    "temporal_address": "TASKPLANE_TEMPORAL_ADDRESS",
    "gateway_url": "TASKPLANE_GATEWAY_URL",
    "database_url": "TASKPLANE_DATABASE_URL",
}


@dataclass(frozen=True)
class Addresses:
    temporal_address: str
    gateway_url: str | None
    database_url: str | None


def resolve(
    *,
    temporal_address: str | None = None,
    gateway_url: str | None = None,
    database_url: str | None = None,
    state_dir: Path | str | None = None,
    need_gateway: bool = False,
) -> Addresses:
    """Fill each missing address from the environment, then from the running dev stack."""
    found: dict[str, str | None] = {
        "temporal_address": temporal_address or os.environ.get(ENV["temporal_address"]) or None,
        "gateway_url": gateway_url or os.environ.get(ENV["gateway_url"]) or None,
        "database_url": database_url or os.environ.get(ENV["database_url"]) or None,
    }
    missing = [k for k in ("temporal_address", "gateway_url", "database_url") if not found[k]]
    if missing:
        stack = _dev_stack(state_dir)
        for key in missing:
            found[key] = stack.get(key) or None
    if not found["temporal_address"]:
        raise UserError(
            "no Temporal address: pass --temporal-address, set TASKPLANE_TEMPORAL_ADDRESS, "
            "or start the embedded stack with `taskplane dev up`"
        )
    if need_gateway and not found["gateway_url"]:
        raise UserError(
            "no gateway URL: pass --gateway-url, set TASKPLANE_GATEWAY_URL, "
            "or start the embedded stack with `taskplane dev up`"
        )
    return Addresses(
        temporal_address=str(found["temporal_address"]),
        gateway_url=found["gateway_url"],
        database_url=found["database_url"],
    )


def _dev_stack(state_dir: Path | str | None) -> dict[str, Any]:
    """The dev stack's addresses, or {} when it is not running (or not installed)."""
    directory = Path(state_dir or os.environ.get("TASKPLANE_STATE_DIR") or ".taskplane")
    try:
        from taskplane.dev import stack  # lazy: only when an address is missing
    except ImportError:
        return {}
    resolver = getattr(stack, "resolve", None)
    if resolver is None:
        return {}
    try:
        info = resolver(directory)
    except (UserError, OSError):
        return {}
    return dict(info or {})


def find_database_url(state_dir: Path | str | None = None) -> str | None:
    """``TASKPLANE_DATABASE_URL``, else the running dev stack's database, else None."""
    return os.environ.get(ENV["database_url"]) or _dev_stack(state_dir).get("database_url") or None

"""Render the gateway's config file from a ConfigMap part and a Secret part.

Kubernetes keeps the gateway YAML (pools, scheduler, limits) in a ConfigMap and the
tenants' API-key digests and the admin token digest in a Secret. The gateway reads one
file, so the init container of the gateway Deployment runs this script: it merges the
two, validates the result with taskplane's own loader and writes it where
``taskplane gateway --config`` reads it. A broken config therefore fails here with one
line naming the field, instead of crash-looping the gateway.

Usage: python render_gateway_config.py --base FILE [--secret FILE] --out FILE
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from taskplane.config import parse_gateway_config
from taskplane.errors import ConfigError

#: The only top-level keys the Secret may set: everything else belongs in the ConfigMap.
SECRET_KEYS = frozenset({"tenants", "admin_token_sha256", "database_url"})


def _load(path: Path, what: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path}: expected a mapping at the top")
    return data


def merge(base: dict[str, Any], secret: dict[str, Any], *, secret_source: str = "secret") -> dict[str, Any]:
    """The base config with the Secret's keys laid over it (the Secret wins)."""
    extra = sorted(set(secret) - SECRET_KEYS)
    if extra:
        raise ConfigError(
            f"{secret_source}: keys {extra} do not belong in the Secret; "
            f"it may only set {sorted(SECRET_KEYS)} (put the rest in the ConfigMap)"
        )
    return {**base, **secret}


def render(base_path: Path, secret_path: Path | None) -> str:
    """Merged, validated YAML text."""
    base = _load(base_path, "gateway config")
    secret: dict[str, Any] = {}
    if secret_path is not None and secret_path.exists():
        secret = _load(secret_path, "gateway secrets")
    merged = merge(base, secret, secret_source=str(secret_path))
    parse_gateway_config(merged, source=f"{base_path} + {secret_path}")
    return yaml.safe_dump(merged, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base", type=Path, required=True, help="gateway YAML from the ConfigMap")
    parser.add_argument("--secret", type=Path, help="tenants/admin token YAML from the Secret (optional)")
    parser.add_argument("--out", type=Path, required=True, help="where the gateway reads its config")
    args = parser.parse_args(argv)
    try:
        text = render(args.base, args.secret)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

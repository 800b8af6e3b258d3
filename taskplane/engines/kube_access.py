"""How to reach the Kubernetes API server from a pod: base URL, namespace, credentials.

Explicit ``discovery:`` fields first, then what Kubernetes gives every pod: the
``KUBERNETES_SERVICE_HOST``/``_PORT`` environment and the service account's mounted
namespace, token (re-read on every request, since bound tokens rotate) and cluster CA.
Shared by the gateway's replica discovery and the autoscaler's Kubernetes loop.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from taskplane.config import DiscoveryConfig
from taskplane.errors import ConfigError

#: Where Kubernetes mounts a pod's service account credentials.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class KubeAccess:
    """How to reach the API server: base URL, namespace, credentials."""

    base_url: str
    namespace: str
    token_file: Path | None = None
    verify: ssl.SSLContext | bool = True

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token_file is not None:
            token = self.token_file.read_text(encoding="utf-8").strip()
            if token:
                headers["Authorization"] = f"Bearer {token}"
        return headers


def resolve_access(
    cfg: DiscoveryConfig,
    *,
    environ: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> KubeAccess:
    """The API endpoint and credentials for ``cfg``: explicit fields first, then in-cluster."""
    env = os.environ if environ is None else environ
    base_url = cfg.api_url
    if base_url is None:
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ConfigError(
                "discovery: not running in a Kubernetes pod (KUBERNETES_SERVICE_HOST is unset); "
                "set discovery.api_url, e.g. http://127.0.0.1:8001 behind `kubectl proxy`"
            )
        host = f"[{host}]" if ":" in host else host
        base_url = f"https://{host}:{port}"
    base_url = base_url.rstrip("/")

    namespace = cfg.namespace
    if namespace is None:
        ns_file = service_account_dir / "namespace"
        if not ns_file.is_file():
            raise ConfigError(
                f"discovery: no namespace given and {ns_file} does not exist; set discovery.namespace"
            )
        namespace = ns_file.read_text(encoding="utf-8").strip()

    token_file: Path | None
    if cfg.token_file is not None:
        token_file = Path(cfg.token_file)
        if not token_file.is_file():
            raise ConfigError(f"discovery.token_file {token_file}: no such file")
    else:
        default_token = service_account_dir / "token"
        token_file = default_token if default_token.is_file() else None

    verify: ssl.SSLContext | bool = True
    ca_file = Path(cfg.ca_file) if cfg.ca_file else service_account_dir / "ca.crt"
    if base_url.startswith("https://"):
        if cfg.ca_file is not None and not ca_file.is_file():
            raise ConfigError(f"discovery.ca_file {ca_file}: no such file")
        if ca_file.is_file():
            verify = ssl.create_default_context(cafile=str(ca_file))
    return KubeAccess(base_url=base_url, namespace=namespace, token_file=token_file, verify=verify)

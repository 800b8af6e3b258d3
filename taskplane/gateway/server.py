"""``taskplane gateway --data-plane python``: load the config, then serve the proxy's app with uvicorn."""

from __future__ import annotations

from pathlib import Path

import uvicorn
from fastapi import FastAPI

from taskplane.api.app import build_api
from taskplane.api.http11 import server_options
from taskplane.config import GatewayConfig, load_gateway_config, state_dir
from taskplane.gateway.proxy import Proxy
from taskplane.logs import configure_logging


def build_app(config: GatewayConfig, *, database_url: str | None = None, outbox_dir: Path | None = None) -> FastAPI:
    """The Python proxy's app: the HTTP API, its OpenAI routes relayed to replicas by ``Proxy``."""
    return build_api(config, Proxy, database_url=database_url, outbox_dir=outbox_dir)


def serve(config_path: Path, *, host: str, port: int, database_url: str | None) -> None:
    """Run one gateway until interrupted. Config errors surface before any port opens."""
    config = load_gateway_config(config_path)
    configure_logging()
    db = database_url or config.database_url
    outbox = Path(config.outbox_dir) if config.outbox_dir else state_dir() / f"outbox-gateway-{port}"
    app = build_app(config, database_url=db, outbox_dir=outbox)
    uvicorn.run(app, host=host, port=port, **server_options(config.limits.header_timeout_s))

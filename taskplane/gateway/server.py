"""``taskplane gateway``: load the config, then serve the app with uvicorn."""

from __future__ import annotations

from pathlib import Path

import uvicorn

from taskplane.config import load_gateway_config, state_dir
from taskplane.gateway.app import build_app
from taskplane.gateway.http11 import MAX_HEADER_BYTES, protocol_class
from taskplane.logs import configure_logging


def serve(config_path: Path, *, host: str, port: int, database_url: str | None) -> None:
    """Run one gateway until interrupted. Config errors surface before any port opens."""
    config = load_gateway_config(config_path)
    configure_logging()
    db = database_url or config.database_url
    outbox = Path(config.outbox_dir) if config.outbox_dir else state_dir() / f"outbox-gateway-{port}"
    app = build_app(config, database_url=db, outbox_dir=outbox)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_keep_alive=30,
                h11_max_incomplete_event_size=MAX_HEADER_BYTES, http=protocol_class(config.limits.header_timeout_s))

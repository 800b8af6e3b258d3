"""The ``taskplane pd-sidecar`` command (registered on the CLI by ``taskplane/cli.py``)."""

from __future__ import annotations

from typing import Annotated

import typer


def pd_sidecar(
    decoder_url: Annotated[str, typer.Option(help="the decode engine behind the sidecar, e.g. http://127.0.0.1:8001")],
    port: Annotated[int, typer.Option(help="where the sidecar listens (the picker routes to it)")],
    host: Annotated[str, typer.Option(help="listen address")] = "127.0.0.1",
    prefill_timeout_s: Annotated[float, typer.Option(min=0.1, help="a prefill taking longer fails over to local prefill")] = 300.0,
) -> None:
    """A prefill/decode sidecar in front of a decode replica (llm-d's routing sidecar): a call
    with x-prefiller-host-port is prefilled there first (vLLM NixlConnector kv_transfer_params)."""
    import uvicorn

    from taskplane.engines.keepalive import REPLICA_KEEP_ALIVE_S
    from taskplane.logs import configure_logging
    from taskplane.sidecar.pd import PdSidecar, create_app

    if not decoder_url.startswith(("http://", "https://")):
        raise typer.BadParameter("--decoder-url must start with http:// or https://")
    configure_logging()
    app = create_app(PdSidecar(decoder_url.rstrip("/"), prefill_timeout_s=prefill_timeout_s))
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False,
                timeout_keep_alive=REPLICA_KEEP_ALIVE_S)

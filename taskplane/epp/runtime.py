"""Running the picker: ``taskplane epp`` (the picker alone, for an Envoy configured the
GIE way by someone else) and ``taskplane gateway`` (Envoy on the client port, the picker
and the Python HTTP app beside it, Envoy as a child process).

The picker drives the very ``CallService`` the HTTP API's app builds (its registry, placer,
ledger, response cache, KV subscriptions and discovery): the app's lifespan builds it,
and the gRPC server (ext_proc, access log, health) is served in the same event loop. The
app serves the API's own routes behind Envoy (``envoy_routes``: everything but the calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog
import uvicorn
from envoy.service.accesslog.v3 import als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from fastapi import FastAPI
from grpc_health.v1 import health_pb2_grpc

from taskplane.api.app import build_api
from taskplane.api.errors import plain_error
from taskplane.api.http11 import server_options
from taskplane.api.state import call_service
from taskplane.calls.service import CallService
from taskplane.config import GatewayConfig, load_gateway_config, state_dir
from taskplane.epp import health
from taskplane.epp.accesslog import AccessLogs
from taskplane.epp.book import StreamBook
from taskplane.epp.endpoints import EndpointBook
from taskplane.epp.envoy_config import FrontDoor, bootstrap
from taskplane.epp.envoy_process import EnvoyProcess
from taskplane.epp.gcfreeze import freeze_startup_objects
from taskplane.epp.server import Picker
from taskplane.epp.timing import BurstTiming, loop_probe, probe_period
from taskplane.logs import configure_logging
from taskplane.ports import free_port

log = structlog.get_logger(__name__)

#: How long a stopping front door waits for the access-log entries of streams that have
#: ended (Envoy flushes its log every 50 ms) before it stops Envoy and settles the rest as
#: cancelled: without it, streams served whole just before a stop got cancelled rows.
LOG_GRACE_S = 0.5

#: How long a stopping front door lets the calls in flight end (Envoy drained: no new
#: connection) before it stops Envoy: below the 8 s after which ``dev``'s ``stop_pid`` and
#: most supervisors' grace periods (Kubernetes: 30 s) send SIGKILL.
STOP_DRAIN_S = 5.0


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: on SIGTERM the front door stops Envoy and
    settles the picker's calls first, while the app (and its cost writer) still runs;
    uvicorn would re-raise the signal and end the process mid-cleanup."""

    stopping: asyncio.Event

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        self.stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stopping.set)
        yield


class EnvoyCarriesCalls:
    """The HTTP app's OpenAI routes on the front door: Envoy sends every POST on them to the
    replicas through the picker, so only a request sent to the app's own port gets here."""

    def __init__(self, calls: CallService) -> None:
        self.calls = calls

    async def answer(self, kind: str, raw: bytes, headers: Mapping[str, str]) -> Any:
        return plain_error(404, "calls go through the front door's port, not the HTTP app's")

    async def close(self) -> None:
        pass


def _front_door_app(config: GatewayConfig, database_url: str | None, outbox_dir: Path) -> FastAPI:
    return build_api(config, EnvoyCarriesCalls, database_url=database_url or config.database_url, outbox_dir=outbox_dir)


@dataclass
class PickerServer:
    """The picker's gRPC server over one gateway: ext_proc, access log, health."""

    picker: Picker
    access_logs: AccessLogs
    server: grpc.aio.Server
    health: health.health.aio.HealthServicer
    port: int


async def start_picker(calls: CallService, *, host: str, port: int, eds_file: Path | None) -> tuple[PickerServer, EndpointBook]:
    """Bind the picker on ``host:port`` (0: any free port) and start following the replicas."""
    book = EndpointBook(calls.registry, eds_file)
    book.refresh()
    streams = StreamBook()
    timing = BurstTiming(calls.metrics.registry)
    picker = Picker(calls, book, streams, timing)
    logs = AccessLogs(streams, picker.replica_at, timing)
    hs = health.new_health()
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 100_000), ("grpc.max_receive_message_length", 64 << 20),
                                      ("grpc.max_send_message_length", 64 << 20)])
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(logs, server)
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await health.set_ready(hs, True)
    log.info("picker_listening", address=f"{host}:{bound}")
    return PickerServer(picker, logs, server, hs, bound), book


async def expire_streams(streams: StreamBook, max_age_s: float, every_s: float = 5.0) -> None:
    """Until cancelled: settle streams that waited too long for their access-log entry."""
    while True:
        await asyncio.sleep(every_s)
        if await streams.expire(max_age_s):
            log.warning("streams_expired_without_log")


@contextlib.asynccontextmanager
async def calls_of(app: FastAPI) -> AsyncIterator[CallService]:
    """The app's ``CallService``, live for as long as the context (the app's own lifespan)."""
    async with app.router.lifespan_context(app):
        yield call_service(app)


def _keep_in_step(book: EndpointBook, ps: PickerServer, config: GatewayConfig) -> asyncio.Future[Any]:
    """The picker's background work: Envoy's endpoints follow the registry; streams whose
    access-log entry never came are settled; the event loop's lag is sampled (if asked)."""
    work = [book.follow(), expire_streams(ps.picker.streams, 10 * config.limits.request_timeout_s)]
    period = probe_period()
    if period is not None and ps.picker.timing is not None:
        ps.picker.timing.watch_gc()
        work.append(loop_probe(ps.picker.timing.loop_lag, period))
    return asyncio.gather(*work)


def _freeze(ps: PickerServer) -> None:
    """Start-up is over: its objects out of the full collections' walk (``taskplane.epp.gcfreeze``)."""
    frozen = freeze_startup_objects()
    if ps.picker.timing is not None:
        ps.picker.timing.gc_frozen.set(frozen)


async def _cancel(work: asyncio.Future[Any]) -> None:
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work


def _outbox(config: GatewayConfig, port: int, kind: str) -> Path:
    return Path(config.outbox_dir) if config.outbox_dir else state_dir() / f"outbox-{kind}-{port}"


async def run_epp(config_path: Path, *, host: str, port: int, database_url: str | None, eds_file: Path | None) -> None:
    """``taskplane epp``: the picker alone, until interrupted."""
    config = load_gateway_config(config_path)
    configure_logging()
    app = _front_door_app(config, database_url, _outbox(config, port, "epp"))
    async with calls_of(app) as calls:
        ps, book = await start_picker(calls, host=host, port=port, eds_file=eds_file)
        follow = _keep_in_step(book, ps, config)
        _freeze(ps)
        stopping = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stopping.set)
        try:
            await stopping.wait()
        finally:
            await _cancel(follow)
            await health.set_ready(ps.health, False)  # the data plane's health check takes the picker out
            # no new RPC; those in flight go on, at most the drain: ext_proc streams end, and
            # an Envoy's access-log stream still brings the entries of calls that just ended
            await ps.server.stop(grace=STOP_DRAIN_S)
            await ps.picker.streams.abandon()


async def run_front_door(config_path: Path, *, host: str, port: int, database_url: str | None,
                         epp_port: int | None = None, envoy_concurrency: int = 2) -> None:
    """``taskplane gateway``: Envoy on ``host:port`` with the picker and the HTTP app beside it."""
    config = load_gateway_config(config_path)
    configure_logging()
    app = _front_door_app(config, database_url, _outbox(config, port, "gateway"))
    app_port, admin_port = free_port(), free_port()
    workdir = state_dir() / f"envoy-{port}"
    server = _Server(uvicorn.Config(app, host="127.0.0.1", port=app_port, **server_options(config.limits.header_timeout_s)))
    serving = asyncio.create_task(server.serve(), name="http-app")
    while not server.started:
        if serving.done():
            serving.result()
            return
        await asyncio.sleep(0.05)
    ps, book = await start_picker(call_service(app), host="127.0.0.1", port=epp_port or 0, eds_file=workdir / "eds" / "replicas.json")
    follow = _keep_in_step(book, ps, config)
    door = FrontDoor(host=host, port=port, epp_port=ps.port, app_port=app_port, admin_port=admin_port,
                     endpoints_file=book.eds_file or workdir / "eds" / "replicas.json")
    envoy = EnvoyProcess(bootstrap(config, door), workdir, admin_port, concurrency=envoy_concurrency)
    envoy_alive = False
    try:
        await envoy.start()
        envoy_alive = True
        _freeze(ps)
        envoy_exit = asyncio.create_task(envoy.wait(), name="envoy")
        stop = asyncio.create_task(server.stopping.wait(), name="signal")
        done, _ = await asyncio.wait({serving, envoy_exit, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if envoy_exit in done:
            envoy_alive = False
            log.error("envoy_exited", code=envoy_exit.result(), log=str(envoy.log_file))
    finally:
        await _cancel(follow)
        await health.set_ready(ps.health, False)
        if envoy_alive:  # no new call; those in flight end; their access-log entries are one Envoy flush away
            await envoy.drain(STOP_DRAIN_S)
            await ps.picker.streams.drained(LOG_GRACE_S)
        await envoy.stop()
        await ps.server.stop(grace=1)
        left = await ps.picker.streams.abandon()  # Envoy is gone: no access-log entry will come
        if left:
            log.warning("streams_settled_without_log", streams=left)
        if not serving.done():
            server.should_exit = True
            await serving

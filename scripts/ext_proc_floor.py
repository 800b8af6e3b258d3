"""The floor of the Envoy + ext_proc transport (docs/benchmarks.md, issue 19): a trivial
picker (a fixed endpoint per call: no intake, no placement, no rows) in its own process
behind taskplane's own Envoy bootstrap, the same streamed load as ``gateway_load``; prints
the CPU per call of the picker process and of Envoy.

    .venv/bin/python scripts/ext_proc_floor.py --messages 3    # request headers, body, response headers (lua-3msg)
    .venv/bin/python scripts/ext_proc_floor.py --messages 2    # no response headers (lua-2msg)
    .venv/bin/python scripts/ext_proc_floor.py --messages 1    # the body only, headers as CEL attributes (lua-1msg)
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import psutil
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from taskplane.bench import gateway_load as load
from taskplane.config import GatewayConfig
from taskplane.dev.local import LocalCluster
from taskplane.epp import protocol as P
from taskplane.epp.envoy_config import (
    DEST_HEADER,
    LB_NAMESPACE,
    REQUEST_NAMESPACE,
    TP_NAMESPACE,
    FrontDoor,
    bootstrap,
    write_endpoints,
)
from taskplane.epp.envoy_process import EnvoyProcess
from taskplane.ports import free_port


class Trivial(pb_grpc.ExternalProcessorServicer):
    """Answers every message at once; marks the call streamed so the Lua scan and the access log run."""

    def __init__(self, endpoints: list[str]) -> None:
        self.next_endpoint = itertools.cycle(endpoints)
        self.calls = 0

    async def Process(self, it: AsyncIterator[pb.ProcessingRequest], context: Any) -> AsyncIterator[pb.ProcessingResponse]:
        async for req in it:
            which = req.WhichOneof("request")
            if which == "request_headers":
                yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
            elif which == "request_body":
                self.calls += 1
                endpoint = next(self.next_endpoint)
                # the destination three ways, as the picker gives it: the header, ``envoy.lb`` and
                # (the one-message exchange's request guard sets it) ``taskplane.request``
                md = P.struct({TP_NAMESPACE: {"call": f"c{self.calls}", "stream": True, "hide_usage": True},
                               LB_NAMESPACE: {DEST_HEADER: endpoint}, REQUEST_NAMESPACE: {DEST_HEADER: endpoint}})
                mutation = P.header_mutation({DEST_HEADER: endpoint})
                yield pb.ProcessingResponse(request_body=pb.BodyResponse(response=P.common(headers=mutation)), dynamic_metadata=md)
            elif which == "response_headers":
                mutation = P.header_mutation({"x-taskplane-replica": "r"})
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse(response=P.common(headers=mutation)))


class Logs(als_pb2_grpc.AccessLogServiceServicer):
    async def StreamAccessLogs(self, it: AsyncIterator[als_pb2.StreamAccessLogsMessage], context: Any) -> als_pb2.StreamAccessLogsResponse:
        async for _ in it:
            pass
        return als_pb2.StreamAccessLogsResponse()


async def serve(port: int, endpoints: list[str]) -> None:
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 100_000)])
    pb_grpc.add_ExternalProcessorServicer_to_server(Trivial(endpoints), server)
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(Logs(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


#: The bootstrap each message count runs (``envoy_config``): the front door's own, as the gateway runs it.
_BOOTSTRAPS = {1: "lua-1msg", 2: "lua-2msg", 3: "lua-3msg"}


def _bootstrap(cluster: LocalCluster, door: FrontDoor, messages: int) -> dict[str, Any]:
    cfg = GatewayConfig.model_validate({"pools": [{"model": load.MODEL, "replicas": [{"url": r.url, "gpu": r.gpu}
                                                                                     for r in cluster.replicas]}]})
    return bootstrap(cfg, door, stream_usage=_BOOTSTRAPS[messages])


async def _listening(port: int, within_s: float = 30.0) -> None:
    for _ in range(int(within_s / 0.1)):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        return
    raise RuntimeError(f"the trivial picker did not listen on {port}")


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


async def measure(cluster: LocalCluster, workdir: Path, messages: int, calls: int, rounds: int) -> dict[str, Any]:
    endpoints = [r.url.split("://", 1)[1] for r in cluster.replicas]
    epp_port, port = free_port(), load.stable_port()
    picker = await asyncio.create_subprocess_exec(sys.executable, __file__, "--serve", str(epp_port), ",".join(endpoints))
    envoy = None
    try:
        await _listening(epp_port)
        door = FrontDoor(host="127.0.0.1", port=port, epp_port=epp_port, app_port=free_port(), admin_port=free_port(),
                         endpoints_file=workdir / "eds" / "replicas.json")
        write_endpoints(door.endpoints_file, endpoints)
        envoy = EnvoyProcess(_bootstrap(cluster, door, messages), workdir / "envoy", door.admin_port)
        await envoy.start()
        urls, headers = [f"http://127.0.0.1:{port}/v1/chat/completions"], {"X-Taskplane-Tenant": "load"}
        await load.run_phase("warmup", urls, 50, 32, 300, headers)
        me = psutil.Process()
        envoy_proc = next(c for c in me.children(recursive=True) if "envoy" in c.name())
        picker_proc = psutil.Process(picker.pid)
        e0, p0 = _cpu(envoy_proc), _cpu(picker_proc)
        errors, samples = 0, set[str]()
        for _ in range(rounds):
            stats, _ = await load.run_phase("floor", urls, calls, 32, 300, headers)
            errors += stats.errors
            samples |= set(stats.error_samples)
        n = calls * rounds
        return {"messages": messages, "picker_ms_per_call": round((_cpu(picker_proc) - p0) * 1000 / n, 3),
                "envoy_ms_per_call": round((_cpu(envoy_proc) - e0) * 1000 / n, 3), "errors": errors,
                "error_samples": sorted(samples)[:3],
                "load_average_1m": round(os.getloadavg()[0], 2)}
    finally:
        if envoy is not None:
            await envoy.stop()
        picker.terminate()
        await picker.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, choices=(1, 2, 3), default=3, help="ext_proc messages per call")
    p.add_argument("--calls", type=int, default=200, help="concurrent streamed calls per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--serve", nargs=2, metavar=("PORT", "ENDPOINTS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        asyncio.run(serve(int(args.serve[0]), args.serve[1].split(",")))
        return 0
    load._raise_fd_limit(4 * args.calls + 1024)
    with tempfile.TemporaryDirectory(prefix="tp-floor-") as tmp:
        cluster = load.pin_ports(LocalCluster(Path(tmp), replicas=args.replicas, speed=20.0, kv_blocks=8192))
        cluster.start_gateway = lambda: None  # type: ignore[method-assign]  # replicas only: the picker is the trivial one
        with cluster:
            print(asyncio.run(measure(cluster, Path(tmp), args.messages, args.calls, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

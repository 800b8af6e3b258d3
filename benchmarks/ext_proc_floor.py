"""The floors under taskplane's data plane (docs/benchmarks.md), beside it in one
run: the same streamed burst as ``gateway_load`` straight to the replicas, through Envoy
alone (round robin: no picker, no Lua, no access log), through taskplane's own Envoy
bootstrap in front of a trivial picker (a fixed endpoint per call: no intake, no
placement, no rows; in its own process, or several), and through taskplane's front door
as it runs. Every round runs the direct phase, then each plane; each round's TTFT ratio
to its own direct phase, the medians, and the CPU per call of each plane's processes.

    .venv/bin/python -m benchmarks.ext_proc_floor --calls 200 --rounds 6                 # bare, trivial, taskplane
    .venv/bin/python -m benchmarks.ext_proc_floor --planes trivial --pickers 2              # two trivial pickers
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from taskplane.bench import gateway_load as load
from taskplane.bench import live_stack, load_client
from taskplane.config import GatewayConfig
from taskplane.dev.local import LocalCluster
from taskplane.epp import protocol as P
from taskplane.epp.envoy_config import FrontDoor, bootstrap, write_endpoints
from taskplane.epp.envoy_names import (
    DEST_HEADER,
    EPP_CLUSTER,
    LB_NAMESPACE,
    REQUEST_NAMESPACE,
    TP_NAMESPACE,
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


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _bare(door: FrontDoor, endpoints: list[str]) -> dict[str, Any]:
    """Envoy alone (the ``bare`` plane): the listener, the router and the replicas round
    robin, no picker, no Lua, no access log: what the proxy itself costs."""
    t = "type.googleapis.com/"
    hosts = [{"endpoint": {"address": _address(host, int(port))}} for host, port in (e.rsplit(":", 1) for e in endpoints)]
    hcm = {"@type": t + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": "bare", "codec_type": "AUTO",
           "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"],
                                               "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "replicas", "timeout": "0s"}}]}]},
           "http_filters": [{"name": "envoy.filters.http.router",
                             "typed_config": {"@type": t + "envoy.extensions.filters.http.router.v3.Router"}}]}
    big = 1_000_000
    return {"admin": {"address": _address("127.0.0.1", door.admin_port)},
            "static_resources": {
                "listeners": [{"name": "bare", "address": _address(door.host, door.port),
                               "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                               "typed_config": hcm}]}]}],
                "clusters": [{"name": "replicas", "type": "STATIC", "connect_timeout": "2s", "lb_policy": "ROUND_ROBIN",
                              "load_assignment": {"cluster_name": "replicas", "endpoints": [{"lb_endpoints": hosts}]},
                              "circuit_breakers": {"thresholds": [{"max_connections": big, "max_pending_requests": big,
                                                                   "max_requests": big}]}}]}}


def _bootstrap(cluster: LocalCluster, door: FrontDoor) -> dict[str, Any]:
    cfg = GatewayConfig.model_validate({"pools": [{"model": load_client.MODEL, "replicas": [{"url": r.url, "gpu": r.gpu}
                                                                                     for r in cluster.replicas]}]})
    return bootstrap(cfg, door)


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


def _spread(config: dict[str, Any], epp_ports: list[int]) -> dict[str, Any]:
    """The picker cluster with one endpoint per trivial picker process (Envoy balances the
    ext_proc streams over them)."""
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == EPP_CLUSTER:
            cluster["load_assignment"]["endpoints"] = [
                {"lb_endpoints": [{"endpoint": {"address": _address("127.0.0.1", p)}} for p in epp_ports]}]
    return config


@dataclass
class Plane:
    """One data plane under the load: where clients send, and the processes whose CPU it costs."""

    name: str
    url: str
    processes: dict[str, list[psutil.Process]]


async def _floor_plane(cluster: LocalCluster, workdir: Path, stack: contextlib.AsyncExitStack, with_picker: bool,
                       pickers: int) -> Plane:
    """Envoy alone, or (``with_picker``) taskplane's bootstrap in front of ``pickers`` trivial pickers."""
    endpoints = [r.url.split("://", 1)[1] for r in cluster.replicas]
    epp_ports, port = [free_port() for _ in range(pickers)], live_stack.stable_port()
    procs = []
    if with_picker:
        for p in epp_ports:
            proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--serve", str(p), ",".join(endpoints))
            stack.push_async_callback(_terminate, proc)
            procs.append(psutil.Process(proc.pid))
            await _listening(p)
    name = "trivial-picker" + (f"-x{pickers}" if pickers > 1 else "") if with_picker else "envoy-alone"
    door = FrontDoor(host="127.0.0.1", port=port, epp_port=epp_ports[0], app_port=free_port(), admin_port=free_port(),
                     endpoints_file=workdir / name / "eds" / "replicas.json")
    write_endpoints(door.endpoints_file, endpoints)
    config = _spread(_bootstrap(cluster, door), epp_ports) if with_picker else _bare(door, endpoints)
    envoy = EnvoyProcess(config, workdir / name / "envoy", door.admin_port,
                         concurrency=int(os.environ.get("FLOOR_ENVOY_CONCURRENCY", "2")))
    await envoy.start()
    stack.push_async_callback(envoy.stop)
    assert envoy.proc is not None
    return Plane(name, f"http://127.0.0.1:{port}", {"envoy": [psutil.Process(envoy.proc.pid)], "picker": procs})


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    proc.terminate()
    await proc.wait()


def _taskplane_plane(cluster: LocalCluster) -> Plane:
    """taskplane's own front door (Envoy + the endpoint picker), as ``taskplane gateway`` runs it."""
    assert cluster.gateway_pid is not None
    door = psutil.Process(cluster.gateway_pid)
    envoys = [c for c in door.children(recursive=True) if "envoy" in c.name()]
    return Plane("taskplane", cluster.gateway_url, {"envoy": envoys, "picker": [door]})


def _busy(before: Any, after: Any) -> float:
    """The share of the machine's CPU time (all cores) that was not idle between two readings."""
    total = sum(after) - sum(before)
    idle = (after.idle + after.iowait) - (before.idle + before.iowait)
    return round(1.0 - idle / total, 3) if total > 0 else 0.0


def _cpu_of(plane: Plane) -> dict[str, float]:
    return {k: sum(_cpu(p) for p in ps) for k, ps in plane.processes.items()}


async def measure(cluster: LocalCluster, workdir: Path, planes: list[str], calls: int, rounds: int,
                  pickers: int = 1) -> dict[str, Any]:
    """``rounds`` times: the direct phase, then each plane's (in reverse order every other
    round); each round's TTFT ratio to its own direct phase, their medians, CPU per call."""
    headers = {"X-Taskplane-Tenant": "load"}
    async with contextlib.AsyncExitStack() as stack:
        running: list[Plane] = []
        for name in planes:
            if name == "taskplane":
                running.append(_taskplane_plane(cluster))
            else:
                running.append(await _floor_plane(cluster, workdir, stack, name != "bare", pickers))
        direct_urls = [f"{r.url}/v1/chat/completions" for r in cluster.replicas]
        await load_client.run_phase("warmup-direct", direct_urls, 50, 32, 300, headers)
        for plane in running:
            await load_client.run_phase(f"warmup-{plane.name}", [f"{plane.url}/v1/chat/completions"], 50, 32, 300, headers)
        out: dict[str, Any] = {p.name: {"errors": 0, "rounds": [], "cpu_s": {}, "busy": []} for p in running}
        direct_p50: list[float] = []
        direct_busy: list[float] = []
        for i in range(rounds):
            machine0 = psutil.cpu_times()
            direct, _ = await load_client.run_phase("direct", direct_urls, calls, 32, 300, headers)
            direct_busy.append(_busy(machine0, psutil.cpu_times()))
            direct_p50.append(round(direct.ttft_ms["p50"], 1))
            for plane in running[::-1 if i % 2 else 1]:
                cpu0, machine0 = _cpu_of(plane), psutil.cpu_times()
                stats, _ = await load_client.run_phase(plane.name, [f"{plane.url}/v1/chat/completions"], calls, 32, 300, headers)
                fig = out[plane.name]
                fig["busy"].append(_busy(machine0, psutil.cpu_times()))
                for k, v in _cpu_of(plane).items():
                    fig["cpu_s"][k] = fig["cpu_s"].get(k, 0.0) + v - cpu0[k]
                fig["errors"] += stats.errors
                fig["rounds"].append({q: round(stats.ttft_ms[q] / direct.ttft_ms[q], 3) for q in ("p50", "p99")})
        n = calls * rounds
        return {"calls": calls, "rounds": rounds, "direct_ttft_p50_ms": direct_p50,
                "direct_machine_busy": statistics.median(direct_busy),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "planes": {name: {"ttft_ratio_median": {q: statistics.median(r[q] for r in fig["rounds"]) for q in ("p50", "p99")},
                                  "ttft_ratio_rounds": fig["rounds"], "errors": fig["errors"],
                                  "machine_busy": statistics.median(fig["busy"]),
                                  "cpu_ms_per_call": {k: round(v * 1000 / n, 3) for k, v in fig["cpu_s"].items()}}
                           for name, fig in out.items()}}


def render(res: dict[str, Any]) -> str:
    lines = [f"{res['calls']} concurrent streams, {res['rounds']} rounds; direct TTFT p50 by round "
             f"{res['direct_ttft_p50_ms']} ms; load average {res['load_average_1m']}",
             f"the machine's cores busy during the direct phases (median): {res['direct_machine_busy']:.0%}",
             "| plane | TTFT ratio to direct p50 / p99 (median of rounds) | rounds p50 | CPU ms per call | cores busy | errors |",
             "|---|---|---|---|---|---|"]
    for name, fig in res["planes"].items():
        med, cpu = fig["ttft_ratio_median"], fig["cpu_ms_per_call"]
        lines.append(f"| {name} | {med['p50']:.2f}x / {med['p99']:.2f}x | {', '.join(str(r['p50']) for r in fig['ttft_ratio_rounds'])} | "
                     + ", ".join(f"{k} {v}" for k, v in cpu.items() if v) + f" | {fig['machine_busy']:.0%} | {fig['errors']} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--planes", default="bare,trivial,taskplane",
                   help="comma-separated: bare (Envoy alone, round robin: no picker, no Lua, no access log), trivial "
                        "(taskplane's bootstrap in front of a trivial picker), taskplane (the front door as it runs)")
    p.add_argument("--calls", type=int, default=200, help="concurrent streamed calls per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--pickers", type=int, default=1, help="trivial picker processes Envoy balances its streams over")
    p.add_argument("--json", action="store_true", help="the figures as JSON")
    p.add_argument("--serve", nargs=2, metavar=("PORT", "ENDPOINTS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        asyncio.run(serve(int(args.serve[0]), args.serve[1].split(",")))
        return 0
    live_stack.raise_fd_limit(4 * args.calls + 1024)
    with tempfile.TemporaryDirectory(prefix="tp-floor-") as tmp:
        cluster = live_stack.pin_ports(LocalCluster(Path(tmp), replicas=args.replicas, speed=20.0, kv_blocks=8192,
                                                config_overrides=load.load_config(args.calls)))
        planes = args.planes.split(",")
        unknown = set(planes) - {"bare", "trivial", "taskplane"}
        if unknown:
            p.error(f"unknown plane(s) {sorted(unknown)}")
        if "taskplane" not in planes:
            cluster.start_gateway = lambda: None  # type: ignore[method-assign]  # replicas only
        with cluster:
            res = asyncio.run(measure(cluster, Path(tmp), planes, args.calls, args.rounds, args.pickers))
            print(json.dumps(res, indent=1) if args.json else render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

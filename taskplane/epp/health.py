"""The picker's gRPC health services, as the GIE protocol names them: ``liveness``
(the process answers), ``readiness`` and the ext_proc service itself (it can decide:
the registry has seen its replicas). Overall health ("") follows readiness."""

from __future__ import annotations

from grpc_health.v1 import health, health_pb2

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
READY_SERVICES = ("", "readiness", EXT_PROC_SERVICE)


def new_health() -> health.aio.HealthServicer:
    """Health servicer: live at once, ready when ``set_ready`` says so."""
    servicer = health.aio.HealthServicer()
    return servicer


async def set_ready(servicer: health.aio.HealthServicer, ready: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
    await servicer.set("liveness", health_pb2.HealthCheckResponse.SERVING)
    for name in READY_SERVICES:
        await servicer.set(name, status)

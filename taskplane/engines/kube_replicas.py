"""Kubernetes objects to replicas: EndpointSlices or pods in, ``ReplicaConfig`` out.

Pure functions, the same answer for the same API objects, so the watcher
(``discovery.py``) and the tests feed them whatever list they hold. Only ready
endpoints and pods become replicas; the autoscaler's annotations mark a pod draining
or cordoned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, cast, get_args

from taskplane.config import DiscoveryConfig, GpuName, ReplicaConfig

_GPU_NAMES = frozenset(get_args(GpuName))
#: a pod the autoscaler drains (``taskplane autoscale kube``): no new placements, calls in flight finish
DRAINING_ANNOTATION = "taskplane.io/draining"
#: a pod the autoscaler is about to give up: no new sessions, its own sessions keep coming
CORDONED_ANNOTATION = "taskplane.io/cordoned"
#: llm-d's pod label of a replica's disaggregation role (prefill, decode or both; absent: both)
ROLE_LABEL = "llm-d.ai/role"
_ROLES = frozenset({"prefill", "decode", "both"})


def _port_number(spec: int | str | None, named: Mapping[str, int]) -> int | None:
    """A port given by number, or looked up by name among ``named``."""
    if spec is None:
        return None
    if isinstance(spec, int):
        return spec
    if spec.isdigit():
        return int(spec)
    return named.get(spec)


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _replica(cfg: DiscoveryConfig, name: str, address: str, http_port: int, kv_port: int | None,
             gpu: str, *, draining: bool = False, cordoned: bool = False, role: str = "both") -> ReplicaConfig:
    host = _host(address)
    return ReplicaConfig(
        url=f"{cfg.scheme}://{host}:{http_port}",
        name=name,
        gpu=cast(GpuName, gpu),  # callers pass a member of GpuName
        kv_events=f"tcp://{host}:{kv_port}" if kv_port is not None else None,
        cost_per_hour_usd=cfg.cost_per_hour_usd,
        draining=draining,
        cordoned=cordoned,
        role=cast(Literal["prefill", "decode", "both"], role if role in _ROLES else "both"),
    )


def replicas_from_endpointslices(
    slices: Iterable[Mapping[str, Any]], cfg: DiscoveryConfig, *, warn: Callable[[str], None] | None = None
) -> list[ReplicaConfig]:
    """Ready endpoints of the given EndpointSlices (discovery.k8s.io/v1) as replicas.

    An endpoint whose ``ready`` condition is absent counts as ready, as the API
    documents; terminating endpoints never do. A pod listed in two slices (the
    controller moves endpoints between slices) appears once, under its pod name.
    """
    found: dict[str, ReplicaConfig] = {}
    for sl in sorted(slices, key=lambda s: str(s.get("metadata", {}).get("name", ""))):
        slice_name = sl.get("metadata", {}).get("name", "?")
        if sl.get("addressType") not in ("IPv4", "IPv6"):
            continue
        named = {p["name"]: int(p["port"]) for p in sl.get("ports") or [] if p.get("name") and p.get("port")}
        http_port = _port_number(cfg.port, named)
        if http_port is None:
            if sl.get("endpoints") and warn:
                warn(f"EndpointSlice {slice_name} has no port named {cfg.port!r}; name the Service port")
            continue
        kv_port = _port_number(cfg.kv_events_port, named)
        if cfg.kv_events_port is not None and kv_port is None and sl.get("endpoints") and warn:
            warn(f"EndpointSlice {slice_name} has no port named {cfg.kv_events_port!r}; "
                 "replicas run without KV events")
        for ep in sl.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            if cond.get("ready") is False or cond.get("terminating") is True:
                continue
            addresses = ep.get("addresses") or []
            if not addresses:
                continue
            target = ep.get("targetRef") or {}
            name = str(target.get("name") or addresses[0])
            found[name] = _replica(cfg, name, addresses[0], http_port, kv_port, cfg.gpu)
    return [found[n] for n in sorted(found)]


def _pod_ready(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def replicas_from_pods(
    pods: Iterable[Mapping[str, Any]], cfg: DiscoveryConfig, *, warn: Callable[[str], None] | None = None
) -> list[ReplicaConfig]:
    """Running, ready, not-deleting pods (core/v1) as replicas.

    Ports are looked up by name among the pods' container ports; the GPU generation
    comes from the pod label ``cfg.gpu_label`` when it names a known generation. A pod
    annotated ``taskplane.io/draining: "true"`` (the Kubernetes autoscaler loop's drain,
    and its sleeping pods) stays a replica marked draining: no new placements, its calls
    in flight are still counted. The label ``llm-d.ai/role`` (llm-d's) sets the replica's
    disaggregation role: ``prefill``, ``decode`` or ``both`` (absent or another value: both).
    """
    found: dict[str, ReplicaConfig] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        name = str(meta.get("name", ""))
        if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not _pod_ready(status):
            continue
        address = status.get("podIP")
        if not address:
            continue
        named = {
            p["name"]: int(p["containerPort"])
            for c in (pod.get("spec") or {}).get("containers") or []
            for p in c.get("ports") or []
            if p.get("name") and p.get("containerPort")
        }
        http_port = _port_number(cfg.port, named)
        if http_port is None:
            if warn:
                warn(f"pod {name} has no container port named {cfg.port!r}")
            continue
        kv_port = _port_number(cfg.kv_events_port, named)
        labels = meta.get("labels") or {}
        label_gpu = labels.get(cfg.gpu_label)
        gpu = label_gpu if isinstance(label_gpu, str) and label_gpu in _GPU_NAMES else cfg.gpu
        annotations = meta.get("annotations") or {}
        found[name] = _replica(cfg, name, str(address), http_port, kv_port, gpu,
                               draining=annotations.get(DRAINING_ANNOTATION) == "true",
                               cordoned=annotations.get(CORDONED_ANNOTATION) == "true",
                               role=str(labels.get(ROLE_LABEL, "both")))
    return [found[n] for n in sorted(found)]

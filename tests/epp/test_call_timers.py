"""The inference routes' Envoy timers nest: the stream's idle limit outlasts the picker's
longest hold and every try together, the picker's outlasts admission and a pool's wait for
a replica, and one try is the call's own limit. Read back from the generated bootstrap,
as Envoy would read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from taskplane.config import GatewayConfig
from taskplane.epp.envoy_config import FrontDoor, bootstrap
from taskplane.epp.envoy_names import NUM_RETRIES

_DOOR = FrontDoor(host="127.0.0.1", port=8080, epp_port=9001, app_port=9002, admin_port=9003, endpoints_file=Path("/tmp/eds.json"))


def _s(duration: str) -> float:
    assert duration.endswith("s"), duration
    return float(duration[:-1])


def _parts(boot: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    inference = next(r for r in routes if "retry_policy" in r.get("route", {}))
    ext_proc = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")
    return inference["route"], ext_proc["typed_config"]


@pytest.mark.parametrize(("limit_s", "empty_hold_s"), [(0.5, 0.0), (3.0, 0.0), (3.0, 60.0), (120.0, 0.0), (300.0, 3600.0)])
def test_timers_nest(limit_s: float, empty_hold_s: float) -> None:
    config = GatewayConfig.model_validate({
        "pools": [{"model": "m", "replicas": [{"url": "http://127.0.0.1:8000", "gpu": "h100"}]},
                  {"model": "z", "hold_when_empty_s": empty_hold_s}],
        "limits": {"request_timeout_s": limit_s}})
    route, ext_proc = _parts(bootstrap(config, _DOOR))
    per_try = _s(route["retry_policy"]["per_try_idle_timeout"])
    tries = route["retry_policy"]["num_retries"] + 1
    backoff = _s(route["retry_policy"]["retry_back_off"]["max_interval"])
    picker = _s(ext_proc["message_timeout"])
    assert per_try == limit_s
    assert tries == NUM_RETRIES + 1
    assert picker > empty_hold_s + limit_s  # admission may hold a call the call's limit, after the empty-pool wait
    assert _s(ext_proc["max_message_timeout"]) == picker
    assert _s(route["idle_timeout"]) > picker + tries * per_try + (tries - 1) * backoff
    assert ext_proc["mutation_rules"]["allow_envoy"] is True  # the picker's x-envoy-max-retries must reach the router


def test_envoy_drops_idle_replica_connections_before_the_replica_does() -> None:
    """A replica (vLLM, or the simulator, as uvicorn) closes a keep-alive connection idle for
    5 s; Envoy's default keeps it an hour. A burst that reused such a connection just as the
    replica closed it lost the request with it (issue 19: a failed try and its error row,
    then a retry). Envoy must give the connection up first."""
    from taskplane.engines.keepalive import REPLICA_KEEP_ALIVE_S
    from taskplane.epp.envoy_names import REPLICA_CLUSTER

    config = GatewayConfig.model_validate({"pools": [{"model": "m", "replicas": [{"url": "http://127.0.0.1:8000", "gpu": "h100"}]}]})
    clusters = bootstrap(config, _DOOR)["static_resources"]["clusters"]
    replicas = next(c for c in clusters if c["name"] == REPLICA_CLUSTER)
    options = replicas["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert "http_protocol_options" in options["explicit_http_config"]  # still HTTP/1.1 to the replicas
    assert _s(options["common_http_protocol_options"]["idle_timeout"]) < REPLICA_KEEP_ALIVE_S - 0.5

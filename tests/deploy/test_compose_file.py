"""Offline checks of deploy/compose.yaml: it parses and validates against the Compose
specification (the compose-spec package), and its services agree with each other and
with taskplane: dependencies, health checks, ports, environment, the mounted gateway
config (loaded with taskplane's own loader) and the vLLM replicas it names."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from k8s_render import DEPLOY, REPO, arg_value

from taskplane.config import GatewayConfig, load_gateway_config
from taskplane.temporal_names import SEARCH_ATTRIBUTES

COMPOSE = DEPLOY / "compose.yaml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def _command(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def _container_ports(svc: dict[str, Any]) -> set[int]:
    """Container sides of ``ports:`` (short syntax [[ip:]host:]container)."""
    return {int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in svc.get("ports") or []}


def _gateway_mount(svc: dict[str, Any]) -> tuple[Path, str]:
    for v in svc.get("volumes") or []:
        src, target, *_ = v.split(":")
        if target.endswith(".yaml"):
            return (COMPOSE.parent / src).resolve(), target
    raise AssertionError("the gateway mounts no config file")


@pytest.fixture(scope="module")
def gateway_config(services: dict[str, dict[str, Any]]) -> GatewayConfig:
    src, _ = _gateway_mount(services["gateway"])
    return load_gateway_config(src)


def test_valid_compose_specification() -> None:
    from compose_spec import PyCompose

    c = PyCompose.from_yaml(COMPOSE.read_text())
    c.validate()
    c.validate_volumes()
    assert set(c.service_names()) >= {"postgres", "temporal", "vllm-0", "vllm-1", "migrate", "gateway", "worker"}


def test_the_validator_rejects_unknown_keys() -> None:
    from compose_spec import PyCompose

    with pytest.raises(ValueError, match="healthchek"):
        PyCompose.from_yaml("services:\n  a:\n    image: x\n    healthchek: {}\n")


def test_dependencies_exist_and_their_conditions_can_be_met(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            cond = spec["condition"]
            if cond == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"
            elif cond == "service_completed_successfully":
                assert not services[dep].get("ports"), f"{dep} is a one-shot job, it serves nothing"
            else:
                assert cond == "service_started"


def test_images_are_pinned_and_taskplane_is_built_here(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        image = svc["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), f"{name}: {image}"
    ours = [s for s in services.values() if s["image"].startswith("taskplane:")]
    assert {s["image"] for s in ours} == {"taskplane:local"} and len(ours) == 3
    builders = [s for s in ours if "build" in s]
    assert len(builders) == 1
    build = builders[0]["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert context == REPO and (context / build["dockerfile"]).is_file()


def test_gateway_config_names_the_vllm_services(
    services: dict[str, dict[str, Any]], gateway_config: GatewayConfig
) -> None:
    [pool] = gateway_config.pools
    assert len(pool.replicas) == 2
    vllm_names = sorted(n for n, s in services.items() if s["image"].startswith("vllm/vllm-openai:"))
    assert [r.replica_name for r in pool.replicas] == vllm_names
    seeds = set()
    for replica in pool.replicas:
        host_port = urlsplit(replica.url)
        svc = services[host_port.hostname or ""]
        args = _command(svc)
        assert arg_value(args, "--served-model-name") == pool.model
        assert int(arg_value(args, "--port") or 0) == host_port.port
        assert "--enable-prefix-caching" in args
        assert arg_value(args, "--prefix-caching-hash-algo") == "sha256"
        assert int(arg_value(args, "--max-model-len") or 0) == pool.max_context_tokens
        kv = json.loads(arg_value(args, "--kv-events-config") or "{}")
        assert kv["enable_kv_cache_events"] is True and kv["publisher"] == "zmq"
        assert replica.kv_events == f"tcp://{host_port.hostname}:{kv['endpoint'].rsplit(':', 1)[1]}"
        assert "healthcheck" in svc and "/health" in " ".join(svc["healthcheck"]["test"])
        seeds.add(str(svc["environment"]["PYTHONHASHSEED"]))
    assert len(seeds) == 1, "PYTHONHASHSEED must be identical on every replica"
    gpus = [tuple(services[n]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]) for n in vllm_names]
    assert len(set(gpus)) == len(gpus), "each replica gets its own GPU"


def test_gateway_command_ports_and_health(services: dict[str, dict[str, Any]]) -> None:
    gw = services["gateway"]
    cmd = _command(gw)
    _, target = _gateway_mount(gw)
    assert cmd[0] == "gateway" and arg_value(cmd, "--config") == target
    assert arg_value(cmd, "--host") == "0.0.0.0"
    port = int(arg_value(cmd, "--port") or 0)
    assert port in _container_ports(gw)
    assert f"127.0.0.1:{port}/healthz" in " ".join(gw["healthcheck"]["test"])


def test_worker_and_database_environment(services: dict[str, dict[str, Any]]) -> None:
    from sqlalchemy.engine import make_url

    worker = services["worker"]
    assert _command(worker) == ["worker"]
    env = worker["environment"]
    gw_url = urlsplit(env["TASKPLANE_GATEWAY_URL"])
    assert gw_url.hostname == "gateway" and gw_url.port == int(arg_value(_command(services["gateway"]), "--port") or 0)
    host, port = env["TASKPLANE_TEMPORAL_ADDRESS"].rsplit(":", 1)
    assert host == "temporal" and int(port) in _container_ports(services["temporal"])
    pg = services["postgres"]["environment"]
    urls = {n: s["environment"]["TASKPLANE_DATABASE_URL"] for n, s in services.items()
            if "TASKPLANE_DATABASE_URL" in (s.get("environment") or {})}
    assert set(urls) == {"migrate", "gateway", "worker"} and len(set(urls.values())) == 1
    url = make_url(next(iter(urls.values())))
    assert url.drivername == "postgresql+asyncpg"
    assert (url.host, url.port, url.username, url.password, url.database) == (
        "postgres", 5432, pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"])
    assert _command(services["migrate"]) == ["db", "upgrade"]
    temporal = services["temporal"]["environment"]
    assert temporal["POSTGRES_SEEDS"] == "postgres"
    assert (temporal["POSTGRES_USER"], temporal["POSTGRES_PWD"]) == (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"])


def test_search_attributes_match_taskplane(services: dict[str, dict[str, Any]]) -> None:
    script = _command(services["temporal-setup"])[-1]
    cli = {"KEYWORD": "Keyword", "DOUBLE": "Double", "INT": "Int", "DATETIME": "Datetime"}
    expected = {(k.name, cli[k.indexed_value_type.name.removeprefix("INDEXED_VALUE_TYPE_")]) for k in SEARCH_ATTRIBUTES}
    words = script.replace("\\", " ").replace(";", " ").split()
    found = {tuple(w.split(":", 1)) for w in words if w.startswith("Taskplane")}
    assert found == expected
    # Compose interpolates $VAR itself: every shell variable is escaped as $$.
    assert "$" not in script.replace("$$", "")


def test_host_ports_bind_to_loopback_only(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for p in svc.get("ports") or []:
            assert str(p).startswith("127.0.0.1:"), f"{name} publishes {p} on every interface"

"""Offline checks of the Gateway API Inference Extension pieces (deploy/k8s/inference-extension,
assembled by overlays/gie): built-in objects pass the Kubernetes schema, the InferencePool
has the GIE v1 shape, and the pieces agree with each other and with taskplane (the pool
selects the vLLM pods and their port, the picker Service is the one the pool names, the
picker runs `taskplane epp` with flags the CLI accepts, its probes are the gRPC health
services the GIE protocol names)."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
from k8s_render import K8S, Rendered, kubectl, kustomize
from typer.testing import CliRunner

from taskplane.cli import app

pytestmark = pytest.mark.skipif(kubectl() is None, reason="needs kubectl (kustomize) from the machine image")

GIE = "inference.networking.k8s.io/v1"


@pytest.fixture(scope="module")
def gie() -> Rendered:
    return Rendered("gie", kustomize(K8S / "overlays" / "gie"))


def _one(r: Rendered, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in r.objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} objects"
    return found[0]


def test_builtin_objects_pass_the_schema(gie: Rendered) -> None:
    for obj in gie.objects:
        if obj["apiVersion"] in (GIE, "keda.sh/v1alpha1"):
            continue
        kubernetes_validate.validate(obj, "1.29", strict=True)


def test_inference_pool_has_the_gie_v1_shape(gie: Rendered) -> None:
    pool = _one(gie, "InferencePool")
    assert pool["apiVersion"] == GIE
    spec = pool["spec"]
    assert set(spec) <= {"selector", "targetPorts", "endpointPickerRef"}
    labels = spec["selector"]["matchLabels"]
    assert 1 <= len(labels) <= 64 and set(spec["selector"]) == {"matchLabels"}
    for k, v in labels.items():
        assert re.fullmatch(r"([a-z0-9.-]+/)?[A-Za-z0-9][-A-Za-z0-9_.]{0,61}[A-Za-z0-9]?", k) and len(v) <= 63
    assert len(spec["targetPorts"]) == 1 and 1 <= spec["targetPorts"][0]["number"] <= 65535
    ref = spec["endpointPickerRef"]
    assert set(ref) <= {"group", "kind", "name", "port", "failureMode"}
    assert ref.get("kind", "Service") == "Service" and ref["failureMode"] in ("FailOpen", "FailClose")
    assert pool["metadata"]["namespace"] == "taskplane-dev"


def test_pool_selects_the_vllm_pods_on_their_port(gie: Rendered) -> None:
    spec = _one(gie, "InferencePool")["spec"]
    wanted = spec["selector"]["matchLabels"]
    engines = [o for o in gie.objects if o["kind"] == "Deployment"
               and all(o["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
    assert engines, "the InferencePool selects no pod template"
    for dep in engines:
        ports = [p["containerPort"] for c in dep["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
        assert spec["targetPorts"][0]["number"] in ports, dep["metadata"]["name"]


def test_picker_service_deployment_and_cli_agree(gie: Rendered) -> None:
    ref = _one(gie, "InferencePool")["spec"]["endpointPickerRef"]
    svc = _one(gie, "Service", ref["name"])
    port = next(p for p in svc["spec"]["ports"] if p["port"] == ref["port"]["number"])
    dep = _one(gie, "Deployment", "taskplane-epp")
    tmpl = dep["spec"]["template"]
    assert all(tmpl["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items())
    container = next(c for c in tmpl["spec"]["containers"] if c["name"] == "epp")
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[port["targetPort"]] == int(container["args"][container["args"].index("--port") + 1])
    for probe, service in (("readinessProbe", "readiness"), ("livenessProbe", "liveness")):
        assert container[probe]["grpc"] == {"port": named["grpc"], "service": service}
    assert container["args"][0] == "epp"
    # every flag the manifest passes is one `taskplane epp` takes
    help_text = CliRunner().invoke(app, ["epp", "--help"], terminal_width=200).output
    for flag in (a for a in container["args"] if a.startswith("--")):
        assert flag in help_text, flag
    mounts = {v["name"] for v in tmpl["spec"]["volumes"]}
    cms = {o["metadata"]["name"] for o in gie.objects if o["kind"] == "ConfigMap"}
    secrets_ok = {v["configMap"]["name"] for v in tmpl["spec"]["volumes"] if "configMap" in v} <= cms
    assert {"config-base", "config-secret", "config"} <= mounts and secrets_ok

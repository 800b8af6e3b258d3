"""Offline checks of deploy/k8s: every file parses, base and overlays assemble with
kustomize (built into kubectl), every object passes the Kubernetes OpenAPI schema
(kubernetes-validate, strict), and the pieces agree with each other and with
taskplane: images, ports, probes, references, the gateway config (loaded with
taskplane's own loader through the real init-container script) and discovery
(run against a fake API server fed the EndpointSlices these manifests would produce)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from fake_kube import FakeKubeApi, endpoint_slice, serve
from k8s_render import (
    DEPLOY,
    EXTERNAL_SECRETS,
    K8S,
    OVERLAYS,
    REPO,
    Rendered,
    arg_value,
    container,
    containers,
    kubectl,
    kustomize,
    named_ports,
    selects,
)

from taskplane.config import GatewayConfig, load_gateway_config
from taskplane.engines.discovery import discover_once
from taskplane.engines.kube_access import KubeAccess
from taskplane.temporal_names import SEARCH_ATTRIBUTES, TASK_QUEUE

pytestmark = pytest.mark.skipif(kubectl() is None, reason="needs kubectl (kustomize) from the machine image")

RENDER_SCRIPT = DEPLOY / "scripts" / "render_gateway_config.py"
K8S_VERSIONS = ("1.29", "1.37")


@pytest.fixture(scope="module", params=("base", *OVERLAYS))
def rendered(request: pytest.FixtureRequest) -> Rendered:
    path = K8S / "base" if request.param == "base" else K8S / "overlays" / request.param
    return Rendered(request.param, kustomize(path))


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> Rendered:
    return Rendered(request.param, kustomize(K8S / "overlays" / request.param))


def test_every_yaml_file_under_deploy_parses() -> None:
    files = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))
    assert len(files) >= 15
    for f in files:
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
        assert docs, f"{f} is empty"
        for d in docs:
            assert isinstance(d, dict), f"{f}: a document is not a mapping"


def test_objects_pass_the_kubernetes_schema(rendered: Rendered) -> None:
    builtin = [o for o in rendered.objects if o["apiVersion"] != "keda.sh/v1alpha1"]
    assert len(builtin) >= 15
    for obj in builtin:
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = "/".join(str(p) for p in exc.absolute_path)
                raise AssertionError(f"{rendered.name}: {obj['kind']}/{obj['metadata']['name']} "
                                     f"fails the {version} schema at {where}: {exc.message}") from None


def test_the_schema_check_has_teeth() -> None:
    """A misspelt field or a wrong type in a Deployment is rejected, so passing means something."""
    objs = Rendered("dev", kustomize(K8S / "overlays" / "dev"))
    dep = json.loads(json.dumps(objs.get("Deployment", "taskplane-gateway")))
    c = dep["spec"]["template"]["spec"]["containers"][0]
    c["readinesProbe"] = c.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, "1.37", strict=True)
    dep = json.loads(json.dumps(objs.get("Deployment", "taskplane-gateway")))
    dep["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, "1.37", strict=True)


def test_namespaces_and_no_latest_tags(overlay: Rendered) -> None:
    [ns] = overlay.of_kind("Namespace")
    for obj in overlay.objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == ns["metadata"]["name"], obj["metadata"]["name"]
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "taskplane"
        assert labels["taskplane.io/environment"] == overlay.name
    for _, tpl in overlay.workloads():
        for c in containers(tpl):
            image = c["image"]
            assert ":" in image.rsplit("/", 1)[-1], f"{image} has no tag"
            assert not image.endswith(":latest"), image


def test_one_taskplane_image_everywhere(overlay: Rendered) -> None:
    images = {c["image"] for _, tpl in overlay.workloads() for c in containers(tpl)
              if "vllm" not in c["image"] and "temporalio" not in c["image"]}
    assert len(images) == 1, images
    expected = {"dev": "taskplane:dev", "prod": "registry.example.com/taskplane:0.1.0"}[overlay.name]
    assert images == {expected}


def test_references_resolve(overlay: Rendered) -> None:
    """Every ConfigMap/Secret a pod uses is rendered (or documented as external) and
    has the key asked for; every ServiceAccount exists."""
    external = EXTERNAL_SECRETS[overlay.name]
    for obj, tpl in overlay.workloads():
        spec = tpl["spec"]
        sa = spec.get("serviceAccountName")
        if sa:
            assert overlay.get("ServiceAccount", sa), f"{obj['metadata']['name']}: no ServiceAccount {sa}"
        refs: list[tuple[str, str, str | None, bool]] = []
        for c in containers(tpl):
            for e in c.get("env") or []:
                src = e.get("valueFrom") or {}
                for key, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
                    if key in src:
                        r = src[key]
                        refs.append((kind, r["name"], r["key"], bool(r.get("optional"))))
        for v in spec.get("volumes") or []:
            if "configMap" in v:
                refs.append(("ConfigMap", v["configMap"]["name"], None, False))
            if "secret" in v:
                refs.append(("Secret", v["secret"]["secretName"], None, False))
        for kind, name, key, optional in refs:
            data = overlay.data(kind, name)
            if data is None:
                assert optional or (kind == "Secret" and name in external), (
                    f"{overlay.name}: {obj['metadata']['name']} uses {kind} {name}, which is not rendered")
                continue
            if key is not None:
                assert key in data, f"{kind} {name} has no key {key}"


def test_services_select_pods_and_target_their_ports(overlay: Rendered) -> None:
    deployments = overlay.of_kind("Deployment")
    for svc in overlay.of_kind("Service"):
        selector = svc["spec"]["selector"]
        backends = [d for d in deployments if selects(selector, d["spec"]["template"]["metadata"]["labels"])]
        assert len(backends) == 1, f"Service {svc['metadata']['name']} selects {len(backends)} Deployments"
        ports = {n: p for c in containers(backends[0]["spec"]["template"], init=False)
                 for n, p in named_ports(c).items()}
        for sp in svc["spec"]["ports"]:
            target = sp["targetPort"]
            assert (target in ports) if isinstance(target, str) else (target in ports.values()), (
                f"Service {svc['metadata']['name']} targets {target}, pods have {ports}")
    for d in deployments:
        sel = d["spec"]["selector"]["matchLabels"]
        assert selects(sel, d["spec"]["template"]["metadata"]["labels"])


def test_probes_and_prometheus_annotations_name_real_ports(overlay: Rendered) -> None:
    for obj, tpl in overlay.workloads():
        ports: dict[str, int] = {}
        for c in containers(tpl, init=False):
            ports.update(named_ports(c))
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                http = (c.get(probe) or {}).get("httpGet")
                if http:
                    port = http["port"]
                    assert port in ports or port in ports.values(), f"{obj['metadata']['name']} {probe}"
        ann = tpl["metadata"].get("annotations") or {}
        if ann.get("prometheus.io/scrape") == "true":
            assert int(ann["prometheus.io/port"]) in ports.values()
            assert ann["prometheus.io/path"] == "/metrics"


def test_gateway_deployment(overlay: Rendered) -> None:
    dep = overlay.get("Deployment", "taskplane-gateway")
    assert dep is not None
    tpl = dep["spec"]["template"]
    gw = container(tpl, "gateway")
    assert gw["args"] == ["gateway", "--config", "/etc/taskplane/gateway.yaml", "--host", "0.0.0.0", "--port", "8080"]
    assert named_ports(gw) == {"http": 8080}
    for probe in ("readinessProbe", "livenessProbe"):
        assert gw[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert overlay.env(gw, "TASKPLANE_DATABASE_URL") is not None or overlay.name == "prod"
    # The rendered config lands where --config reads it.
    mounts = {m["mountPath"]: m["name"] for m in gw["volumeMounts"]}
    assert mounts["/etc/taskplane"] == "config"
    render = container(tpl, "render-config")
    assert render["image"] == gw["image"]
    assert arg_value(render["command"], "--out") == "/etc/taskplane/gateway.yaml"
    # HPA, PDB and Service point at it.
    hpa = overlay.get("HorizontalPodAutoscaler", "taskplane-gateway")
    assert hpa is not None and hpa["spec"]["scaleTargetRef"]["name"] == "taskplane-gateway"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    pdb = overlay.get("PodDisruptionBudget", "taskplane-gateway")
    assert pdb is not None and selects(pdb["spec"]["selector"]["matchLabels"], tpl["metadata"]["labels"])
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"], "a PDB must not block every drain"
    # Discovery permissions for its service account.
    sa = tpl["spec"]["serviceAccountName"]
    [binding] = [b for b in overlay.of_kind("RoleBinding")
                 if any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in b["subjects"])]
    role = overlay.get("Role", binding["roleRef"]["name"])
    assert role is not None
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    for verb in ("list", "watch"):
        assert ("discovery.k8s.io", "endpointslices", verb) in granted
        assert ("", "pods", verb) in granted


def _gateway_config(overlay: Rendered, tmp_path: Path) -> GatewayConfig:
    """Run the init container's script on the ConfigMap and Secret the pod mounts."""
    dep = overlay.get("Deployment", "taskplane-gateway")
    assert dep is not None
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    base = overlay.data("ConfigMap", volumes["config-base"]["configMap"]["name"])
    assert base is not None
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "gateway.yaml").write_text(base["gateway.yaml"])
    secret = overlay.data("Secret", volumes["config-secret"]["secret"]["secretName"])
    secret_text = (secret or {}).get("tenants.yaml")
    if secret_text is None:  # prod: the Secret is created outside kustomize, in this format
        secret_text = (K8S / "overlays" / "prod" / "gateway-secrets.example.yaml").read_text()
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "tenants.yaml").write_text(secret_text)
    render = container(dep["spec"]["template"], "render-config")
    cmd = render["command"]
    assert cmd[:2] == ["python", "/opt/taskplane/render_gateway_config.py"]
    out = tmp_path / "etc" / "gateway.yaml"
    args = [a.replace("/etc/taskplane-base", str(tmp_path / "base"))
             .replace("/etc/taskplane-secret", str(tmp_path / "secret"))
             .replace("/etc/taskplane/gateway.yaml", str(out)) for a in cmd[2:]]
    proc = subprocess.run([sys.executable, str(RENDER_SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return load_gateway_config(out)


def test_gateway_config_loads_and_matches_the_vllm_pools(overlay: Rendered, tmp_path: Path) -> None:
    cfg = _gateway_config(overlay, tmp_path)
    assert cfg.auth and cfg.tenants, "tenants come from the Secret"
    assert cfg.admin_token_sha256
    models = {p.model for p in cfg.pools}
    seeds = set()
    for pool in cfg.pools:
        if pool.fallback:
            assert pool.fallback in models
        d = pool.discovery
        assert d is not None and d.service and not pool.replicas
        svc = overlay.get("Service", d.service)
        assert svc is not None, f"pool {pool.model}: no Service {d.service}"
        assert svc["spec"]["clusterIP"] == "None", "a headless Service for discovery"
        svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
        assert d.port in svc_ports and d.kv_events_port in svc_ports
        [dep] = [x for x in overlay.of_kind("Deployment")
                 if selects(svc["spec"]["selector"], x["spec"]["template"]["metadata"]["labels"])]
        tpl = dep["spec"]["template"]
        assert tpl["metadata"]["labels"]["taskplane.io/gpu"] == d.gpu
        vllm = container(tpl, "vllm")
        assert vllm["image"].startswith("vllm/vllm-openai:v")
        args = vllm["args"]
        assert arg_value(args, "--served-model-name") == pool.model
        assert "--enable-prefix-caching" in args
        assert arg_value(args, "--prefix-caching-hash-algo") == "sha256"
        assert int(arg_value(args, "--max-model-len") or 0) == pool.max_context_tokens
        ports = named_ports(vllm)
        assert int(arg_value(args, "--port") or 0) == ports[svc_ports[d.port]["targetPort"]]
        kv = json.loads(arg_value(args, "--kv-events-config") or "{}")
        assert kv["enable_kv_cache_events"] is True and kv["publisher"] == "zmq"
        assert kv["endpoint"].startswith("tcp://*:"), "bind on every interface; the gateways connect"
        assert int(kv["endpoint"].rsplit(":", 1)[1]) == ports[svc_ports[d.kv_events_port]["targetPort"]]
        res = vllm["resources"]
        assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "1"
        seeds.add(overlay.env(vllm, "PYTHONHASHSEED"))
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert vllm[probe]["httpGet"]["path"] == "/health"
    assert len(seeds) == 1 and None not in seeds, f"PYTHONHASHSEED differs between pools: {seeds}"


async def test_discovery_finds_the_pods_these_manifests_make(overlay: Rendered, tmp_path: Path) -> None:
    """Feed a fake API server the EndpointSlices the controller would write for each
    pool's Service and Deployment, and discover the pool with the rendered config."""
    cfg = _gateway_config(overlay, tmp_path)
    ns = overlay.of_kind("Namespace")[0]["metadata"]["name"]
    api = FakeKubeApi(token=None)
    expected: dict[str, list[tuple[str, str, str]]] = {}
    for i, pool in enumerate(cfg.pools):
        d = pool.discovery
        assert d is not None and d.service
        svc = overlay.get("Service", d.service)
        assert svc is not None
        [dep] = [x for x in overlay.of_kind("Deployment")
                 if selects(svc["spec"]["selector"], x["spec"]["template"]["metadata"]["labels"])]
        cports = named_ports(container(dep["spec"]["template"], "vllm"))
        # The controller publishes each Service port under its name with the target port.
        slice_ports = {p["name"]: cports[p["targetPort"]] for p in svc["spec"]["ports"]}
        pods = [(f"{dep['metadata']['name']}-{j}", f"10.{i}.0.{j + 1}", True)
                for j in range(dep["spec"]["replicas"])]
        await api.put("endpointslices", endpoint_slice(f"{d.service}-x1", ns, d.service, pods, slice_ports))
        expected[pool.model] = [(name, f"http://{ip}:{slice_ports['http']}", f"tcp://{ip}:{slice_ports['kv-events']}")
                                for name, ip, _ in pods]
    async with serve(api) as url:
        for pool in cfg.pools:
            replicas = await discover_once(pool, access=KubeAccess(base_url=url, namespace=ns))
            assert [(r.replica_name, r.url, r.kv_events) for r in replicas] == expected[pool.model]
            assert pool.discovery is not None
            assert all(r.gpu == pool.discovery.gpu for r in replicas)


def test_worker_and_its_scaledobject(overlay: Rendered) -> None:
    dep = overlay.get("Deployment", "taskplane-worker")
    assert dep is not None
    w = container(dep["spec"]["template"], "worker")
    assert w["args"] == ["worker"]
    services = overlay.data("ConfigMap", overlay.by_prefix("ConfigMap", "taskplane-services")["metadata"]["name"])
    assert services is not None
    assert overlay.env(w, "TASKPLANE_TEMPORAL_ADDRESS") == services["temporal-address"]
    assert services["temporal-address"].endswith(":7233")
    # The gateway URL names the gateway Service and its port.
    gw_url = overlay.env(w, "TASKPLANE_GATEWAY_URL")
    svc = overlay.get("Service", "taskplane-gateway")
    assert svc is not None
    assert gw_url == f"http://{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}"
    db_ref = next(e for e in w["env"] if e["name"] == "TASKPLANE_DATABASE_URL")["valueFrom"]["secretKeyRef"]
    assert db_ref["key"] == "database-url"
    db = overlay.env(w, "TASKPLANE_DATABASE_URL")
    assert (db is None and overlay.name == "prod") or str(db).startswith("postgresql+asyncpg://")

    [so] = overlay.of_kind("ScaledObject")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] == "taskplane-worker"
    assert spec["scaleTargetRef"]["envSourceContainerName"] == "worker"
    assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "temporal"
    meta = trigger["metadata"]
    # KEDA's temporal scaler: endpoint (or endpointFromEnv) and taskQueue are required;
    # every metadata value is a string.
    assert all(isinstance(v, str) for v in meta.values())
    assert overlay.env(w, meta["endpointFromEnv"]) == services["temporal-address"]
    assert meta["taskQueue"] == TASK_QUEUE
    assert meta["namespace"] == services["temporal-namespace"]
    assert set(meta["queueTypes"].split(",")) <= {"workflow", "activity"}
    assert int(meta["targetQueueSize"]) > 0 and int(meta["activationTargetQueueSize"]) >= 0
    assert set(meta) <= {"endpoint", "endpointFromEnv", "namespace", "taskQueue", "queueTypes", "targetQueueSize",
                         "activationTargetQueueSize", "buildId", "selectAllActive", "selectUnversioned",
                         "apiKeyFromEnv", "minConnectTimeout", "unsafeSsl", "tlsServerName"}
    assert not overlay.of_kind("HorizontalPodAutoscaler") or all(
        h["spec"]["scaleTargetRef"]["name"] != "taskplane-worker" for h in overlay.of_kind("HorizontalPodAutoscaler")
    ), "KEDA owns the worker's HPA"


def _search_attributes_in(script: str) -> set[tuple[str, str]]:
    found = set()
    for word in script.replace("\\", " ").replace(";", " ").split():
        if word.startswith("Taskplane") and ":" in word:
            name, kind = word.split(":", 1)
            found.add((name, kind))
    return found


def expected_search_attributes() -> set[tuple[str, str]]:
    cli = {"KEYWORD": "Keyword", "DOUBLE": "Double", "INT": "Int", "DATETIME": "Datetime"}
    return {(k.name, cli[k.indexed_value_type.name.removeprefix("INDEXED_VALUE_TYPE_")]) for k in SEARCH_ATTRIBUTES}


def test_jobs(overlay: Rendered) -> None:
    gw = overlay.get("Deployment", "taskplane-gateway")
    assert gw is not None
    image = container(gw["spec"]["template"], "gateway")["image"]
    job = overlay.get("Job", "taskplane-db-migrate")
    assert job is not None
    m = container(job["spec"]["template"], "migrate")
    assert m["args"] == ["db", "upgrade"] and m["image"] == image
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never")
    sa_job = overlay.get("Job", "taskplane-temporal-search-attributes")
    assert sa_job is not None
    c = container(sa_job["spec"]["template"], "search-attributes")
    assert _search_attributes_in(c["command"][-1]) == expected_search_attributes()
    services = overlay.data("ConfigMap", overlay.by_prefix("ConfigMap", "taskplane-services")["metadata"]["name"])
    assert services is not None
    assert overlay.env(c, "TEMPORAL_ADDRESS") == services["temporal-address"]


def test_render_script_rejects_misplaced_keys_and_bad_configs(tmp_path: Path) -> None:
    base = tmp_path / "gateway.yaml"
    base.write_text((K8S / "base" / "gateway" / "gateway.yaml").read_text())
    secret = tmp_path / "tenants.yaml"
    out = tmp_path / "out.yaml"

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(RENDER_SCRIPT), "--base", str(base), "--secret", str(secret),
                               "--out", str(out)], capture_output=True, text=True, timeout=60)

    secret.write_text("pools: []\n")
    proc = run()
    assert proc.returncode == 2 and "do not belong in the Secret" in proc.stderr and not out.exists()
    secret.write_text("tenants:\n  - id: a\n    max_priority: urgent\n")
    proc = run()
    assert proc.returncode == 2 and "tenants.0.max_priority" in proc.stderr
    secret.write_text("tenants:\n  - id: a\n    api_key_sha256: abc\n")
    proc = run()
    assert proc.returncode == 0, proc.stderr
    assert load_gateway_config(out).tenants[0].id == "a"


def test_dockerfile_matches_the_manifests() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    froms = [ln.split()[1] for ln in lines if ln.startswith("FROM")]
    assert froms and all(f == "python:3.11-slim" for f in froms)
    assert any(ln.startswith("RUN pip install") and ln.rstrip().endswith(" .") for ln in lines)
    for ln in lines:
        if ln.startswith("COPY") and "--from" not in ln:
            for src in ln.split()[1:-1]:
                assert (REPO / src).exists(), f"Dockerfile copies {src}, which is not in the repository"
    assert 'ENTRYPOINT ["taskplane"]' in lines
    assert "COPY deploy/scripts/render_gateway_config.py /opt/taskplane/render_gateway_config.py" in lines
    assert "USER 10001:10001" in lines
    # The pods run as the image's user.
    for name in ("dev",):
        objs = Rendered(name, kustomize(K8S / "overlays" / name))
        for obj, tpl in objs.workloads():
            if any(c["image"].startswith("taskplane") for c in containers(tpl)):
                assert tpl["spec"]["securityContext"]["runAsUser"] == 10001, obj["metadata"]["name"]


def test_overlays_differ_where_they_should() -> None:
    dev = Rendered("dev", kustomize(K8S / "overlays" / "dev"))
    prod = Rendered("prod", kustomize(K8S / "overlays" / "prod"))

    def replicas(r: Rendered, name: str) -> Any:
        d = r.get("Deployment", name)
        assert d is not None
        return d["spec"]["replicas"]

    assert replicas(dev, "taskplane-gateway") == 1 and replicas(prod, "taskplane-gateway") == 3
    assert replicas(dev, "vllm-llama-3-1-8b") == 1 and replicas(prod, "vllm-llama-3-1-8b") == 4
    assert prod.get("Deployment", "vllm-llama-3-2-1b") and not dev.get("Deployment", "vllm-llama-3-2-1b")
    assert not prod.of_kind("Secret"), "prod must not carry credentials in git"
    assert {s["metadata"]["name"].rsplit("-", 1)[0] for s in dev.of_kind("Secret")} == {
        "taskplane-database", "taskplane-gateway-secrets"}


def test_dev_credentials_are_the_documented_ones(tmp_path: Path) -> None:
    from taskplane.calls.auth import sha256_hex

    dev = Rendered("dev", kustomize(K8S / "overlays" / "dev"))
    cfg = _gateway_config(dev, tmp_path)
    assert cfg.tenants[0].api_key_sha256 == sha256_hex("tp-dev-key")
    assert cfg.admin_token_sha256 == sha256_hex("tp-dev-admin")

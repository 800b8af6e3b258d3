"""Replica discovery (taskplane.engines.discovery) against a fake Kubernetes API server
that speaks the real list/watch protocol (fake_kube.py): scale up and down, readiness,
pagination, expired resourceVersions, dropped watches, auth and RBAC errors, and the
in-cluster service-account path over real TLS."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_kube import FakeKubeApi, endpoint_slice, pod, serve

from taskplane.config import DiscoveryConfig, PoolConfig, ReplicaConfig, parse_gateway_config
from taskplane.engines.discovery import KubernetesDiscovery, discover_once, watch
from taskplane.engines.kube_access import KubeAccess, resolve_access
from taskplane.engines.kube_replicas import replicas_from_endpointslices
from taskplane.errors import ConfigError

NS = "taskplane"
SVC = "vllm-llama-3-1-8b"
TOKEN = "fake-service-account-token"


def pool(api_url: str, **discovery: Any) -> PoolConfig:
    cfg: dict[str, Any] = {"service": SVC, "gpu": "h100", "cost_per_hour_usd": 2.5, "namespace": NS,
                           "api_url": api_url, "poll_interval_s": 0.1, **discovery}
    return PoolConfig(model="llama-3.1-8b", discovery=DiscoveryConfig(**cfg))


class Recorder:
    """The on_change callback: keeps every list it was given, wakes waiters."""

    def __init__(self) -> None:
        self.calls: list[list[ReplicaConfig]] = []
        self._event = asyncio.Event()

    async def __call__(self, replicas: list[ReplicaConfig]) -> None:
        self.calls.append(replicas)
        self._event.set()

    @property
    def names(self) -> list[str]:
        return [r.replica_name for r in self.calls[-1]] if self.calls else []

    async def wait_for(self, names: list[str], timeout: float = 10.0) -> list[ReplicaConfig]:
        async def _wait() -> list[ReplicaConfig]:
            while not self.calls or self.names != names:
                self._event.clear()
                await self._event.wait()
            return self.calls[-1]

        try:
            return await asyncio.wait_for(_wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"expected {names}, last seen {self.names} after {len(self.calls)} calls") from None


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    yield FakeKubeApi(token=TOKEN, bookmark_interval_s=0.3)


@pytest.fixture
async def api_url(api: FakeKubeApi) -> AsyncIterator[str]:
    async with serve(api) as url:
        yield url


@pytest.fixture
def token_file(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


async def start(p: PoolConfig, rec: Recorder) -> asyncio.Task[None]:
    return asyncio.create_task(watch(p, rec))


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


async def test_replicas_join_and_leave_as_the_deployment_scales(
    api: FakeKubeApi, api_url: str, token_file: str
) -> None:
    await api.put("endpointslices", endpoint_slice(f"{SVC}-abcde", NS, SVC, [
        ("vllm-0", "10.1.0.10", True), ("vllm-1", "10.1.0.11", True)]))
    # Another Service's slice in the same namespace is not ours.
    await api.put("endpointslices", endpoint_slice("other-xyz", NS, "other", [("x-0", "10.9.0.1", True)]))
    rec = Recorder()
    task = await start(pool(api_url, token_file=token_file), rec)
    try:
        first = await rec.wait_for(["vllm-0", "vllm-1"])
        assert first[0] == ReplicaConfig(url="http://10.1.0.10:8000", name="vllm-0", gpu="h100",
                                         kv_events="tcp://10.1.0.10:5557", cost_per_hour_usd=2.5)

        # Scale up: a new pod starts not ready, then passes its readiness probe.
        await api.put("endpointslices", endpoint_slice(f"{SVC}-abcde", NS, SVC, [
            ("vllm-0", "10.1.0.10", True), ("vllm-1", "10.1.0.11", True), ("vllm-2", "10.1.0.12", False)]))
        await asyncio.sleep(0.3)
        assert rec.names == ["vllm-0", "vllm-1"], "a pod that is not ready is not a replica"
        await api.put("endpointslices", endpoint_slice(f"{SVC}-abcde", NS, SVC, [
            ("vllm-0", "10.1.0.10", True), ("vllm-1", "10.1.0.11", True), ("vllm-2", "10.1.0.12", True)]))
        await rec.wait_for(["vllm-0", "vllm-1", "vllm-2"])

        # More endpoints than one slice holds: the controller adds a second slice.
        await api.put("endpointslices", endpoint_slice(f"{SVC}-fghij", NS, SVC, [("vllm-3", "10.1.0.13", True)]))
        await rec.wait_for(["vllm-0", "vllm-1", "vllm-2", "vllm-3"])

        # Scale down: vllm-1 terminates, then the second slice goes away.
        await api.put("endpointslices", endpoint_slice(f"{SVC}-abcde", NS, SVC, [
            ("vllm-0", "10.1.0.10", True), ("vllm-1", "10.1.0.11", True), ("vllm-2", "10.1.0.12", True)],
            terminating=["vllm-1"]))
        await rec.wait_for(["vllm-0", "vllm-2", "vllm-3"])
        await api.delete("endpointslices", NS, f"{SVC}-fghij")
        await rec.wait_for(["vllm-0", "vllm-2"])
        # One list, then watches only: no polling.
        assert api.list_requests() == 1
        assert api.watch_requests() >= 1
        # A call per change, no call for a change that does not change the replicas.
        assert [len(c) for c in rec.calls] == [2, 3, 4, 3, 2]
    finally:
        await stop(task)


async def test_watch_requests_carry_the_protocol_fields(api: FakeKubeApi, api_url: str, token_file: str) -> None:
    await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [("vllm-0", "10.1.0.10", True)]))
    rec = Recorder()
    task = await start(pool(api_url, token_file=token_file, label_selector="taskplane.io/pool in (llama-3-1-8b)"), rec)
    try:
        await rec.wait_for([])
        assert rec.calls == [[]], "the extra label selector filters out slices without the pool label"
        await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [("vllm-0", "10.1.0.10", True)],
                                                       labels={"taskplane.io/pool": "llama-3-1-8b"}))
        await rec.wait_for(["vllm-0"])
    finally:
        await stop(task)
    path, list_query = api.requests[0]
    assert path == f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
    assert list_query["labelSelector"] == f"kubernetes.io/service-name={SVC},taskplane.io/pool in (llama-3-1-8b)"
    assert "watch" not in list_query
    _, watch_query = next((p, q) for p, q in api.requests if q.get("watch") == "1")
    assert watch_query["resourceVersion"] == "1001", "the watch starts at the list's resourceVersion"

    assert watch_query["allowWatchBookmarks"] == "true"
    assert watch_query["timeoutSeconds"] == "300"


async def test_renews_timed_out_watches_from_the_last_version(
    api: FakeKubeApi, api_url: str, token_file: str
) -> None:
    await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [("vllm-0", "10.1.0.10", True)]))
    rec = Recorder()
    task = await start(pool(api_url, token_file=token_file, watch_timeout_s=1), rec)
    try:
        await rec.wait_for(["vllm-0"])
        await asyncio.sleep(2.5)  # two watch timeouts pass
        await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [
            ("vllm-0", "10.1.0.10", True), ("vllm-1", "10.1.0.11", True)]))
        await rec.wait_for(["vllm-0", "vllm-1"])
        assert api.list_requests() == 1, "a timed-out watch is renewed, not re-listed"
        watches = [q for _, q in api.requests if q.get("watch") == "1"]
        assert len(watches) >= 3
        # Bookmarks moved the version forward: later watches start past the first one.
        assert int(watches[-1]["resourceVersion"]) >= int(watches[0]["resourceVersion"])
    finally:
        await stop(task)


async def test_expired_resource_version_relists(api: FakeKubeApi, api_url: str, token_file: str) -> None:
    await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [("vllm-0", "10.1.0.10", True)]))
    rec = Recorder()
    task = await start(pool(api_url, token_file=token_file), rec)
    try:
        await rec.wait_for(["vllm-0"])
        assert api.list_requests() == 1
        # The watch ends; before the watcher resumes, history moves on and etcd compacts
        # it: resuming from the old version gets a 410 Expired ERROR event.
        await api.drop_watches()
        await api.put("endpointslices", endpoint_slice("noise", NS, "other", []))
        api.compact()
        await api.put("endpointslices", endpoint_slice(f"{SVC}-c", NS, SVC, [("vllm-2", "10.1.0.12", True)]))
        await rec.wait_for(["vllm-0", "vllm-2"])
        assert api.expired_sent == 1
        assert api.list_requests() == 2, "a 410 is answered with one fresh list"
    finally:
        await stop(task)


async def test_compaction_during_a_cut_connection_forces_a_relist(
    api: FakeKubeApi, api_url: str, token_file: str
) -> None:
    await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [("vllm-0", "10.1.0.10", True)]))
    rec = Recorder()
    task = await start(pool(api_url, token_file=token_file), rec)
    try:
        await rec.wait_for(["vllm-0"])
        api.fail_next = 1  # the reconnect after the cut fails once: the watcher backs off
        await api.drop_watches(abrupt=True)
        await api.delete("endpointslices", NS, f"{SVC}-a")
        await api.put("endpointslices", endpoint_slice(f"{SVC}-b", NS, SVC, [("vllm-5", "10.1.0.15", True)]))
        api.compact()
        await rec.wait_for(["vllm-5"])
        assert api.list_requests() >= 2
    finally:
        await stop(task)


async def test_pagination_reads_every_page(api: FakeKubeApi, api_url: str, token_file: str) -> None:
    for i in range(7):
        await api.put("endpointslices", endpoint_slice(f"{SVC}-{i:02d}", NS, SVC, [
            (f"vllm-{i}-{j}", f"10.2.{i}.{j}", True) for j in range(3)]))
    p = pool(api_url, token_file=token_file)
    import taskplane.engines.discovery as discovery

    old = discovery._LIST_PAGE
    discovery._LIST_PAGE = 2
    try:
        replicas = await discover_once(p)
    finally:
        discovery._LIST_PAGE = old
    assert len(replicas) == 21
    assert sum(1 for _, q in api.requests if q.get("continue")) == 3


async def test_pods_source_uses_readiness_phase_labels_and_container_ports(
    api: FakeKubeApi, api_url: str, token_file: str
) -> None:
    labels = {"app.kubernetes.io/name": "vllm", "taskplane.io/pool": "llama-3-1-8b"}
    await api.put("pods", pod("vllm-a", NS, "10.3.0.1", labels={**labels, "taskplane.io/gpu": "l40s"}))
    await api.put("pods", pod("vllm-b", NS, "10.3.0.2", labels=labels, ready=False))
    await api.put("pods", pod("vllm-c", NS, None, labels=labels, phase="Pending", ready=False))
    await api.put("pods", pod("vllm-d", NS, "10.3.0.4", labels=labels, ports={"api": 9000}))
    await api.put("pods", pod("other", NS, "10.3.0.9", labels={"app.kubernetes.io/name": "postgres"}))
    rec = Recorder()
    p = pool(api_url, token_file=token_file, source="pods", service=None,
             label_selector="app.kubernetes.io/name=vllm,taskplane.io/pool=llama-3-1-8b", port="http")
    task = await start(p, rec)
    try:
        first = await rec.wait_for(["vllm-a"])
        assert first[0].gpu == "l40s" and first[0].kv_events == "tcp://10.3.0.1:5557"
        await api.put("pods", pod("vllm-b", NS, "10.3.0.2", labels=labels, ready=True))
        await rec.wait_for(["vllm-a", "vllm-b"])
        await api.put("pods", pod("vllm-a", NS, "10.3.0.1", labels=labels, deleting=True))
        await rec.wait_for(["vllm-b"])
        # A pod relabelled out of the pool leaves it (the watch sends DELETED).
        await api.put("pods", pod("vllm-b", NS, "10.3.0.2", labels={**labels, "taskplane.io/pool": "x"}))
        await rec.wait_for([])
    finally:
        await stop(task)
    assert api.requests[0][0] == f"/api/v1/namespaces/{NS}/pods"


async def test_poll_mode_lists_on_an_interval(api: FakeKubeApi, api_url: str, token_file: str) -> None:
    await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [("vllm-0", "10.1.0.10", True)]))
    rec = Recorder()
    task = await start(pool(api_url, token_file=token_file, watch=False), rec)
    try:
        await rec.wait_for(["vllm-0"])
        await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [("vllm-1", "10.1.0.11", True)]))
        await rec.wait_for(["vllm-1"])
        assert api.watch_requests() == 0
        assert api.list_requests() >= 2
    finally:
        await stop(task)


async def test_unauthorized_and_forbidden_keep_retrying_until_fixed(
    api: FakeKubeApi, api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [("vllm-0", "10.1.0.10", True)]))
    token = tmp_path / "token"
    token.write_text("wrong")
    api.forbidden_namespaces.add(NS)
    rec = Recorder()
    task = await start(pool(api_url, token_file=str(token)), rec)
    try:
        await asyncio.sleep(0.5)
        assert rec.calls == [], "no replicas are reported without a successful list"
        token.write_text(TOKEN)  # the kubelet rotates the token: re-read on every request
        await asyncio.sleep(0.5)
        assert rec.calls == []
        api.forbidden_namespaces.clear()  # RBAC fixed while the gateway runs
        await rec.wait_for(["vllm-0"], timeout=15)
    finally:
        await stop(task)
    out = "".join(capsys.readouterr())
    assert "401 Unauthorized" in out
    assert "403 Forbidden" in out and "rbac.yaml" in out


async def test_api_outage_keeps_the_last_replicas(api: FakeKubeApi, api_url: str, token_file: str) -> None:
    await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [("vllm-0", "10.1.0.10", True)]))
    rec = Recorder()
    task = await start(pool(api_url, token_file=token_file), rec)
    try:
        await rec.wait_for(["vllm-0"])
        api.fail_next = 3
        await api.drop_watches(abrupt=True)
        await asyncio.sleep(1.0)
        assert [len(c) for c in rec.calls] == [1], "an API outage does not empty the pool"
        await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [
            ("vllm-0", "10.1.0.10", True), ("vllm-1", "10.1.0.11", True)]))
        await rec.wait_for(["vllm-0", "vllm-1"], timeout=15)
    finally:
        await stop(task)


async def test_sync_callback_and_numeric_ports(api: FakeKubeApi, api_url: str, token_file: str) -> None:
    await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [("vllm-0", "fd00::10", True)],
                                                   ports={"": 8000}, address_type="IPv6"))
    seen: list[list[ReplicaConfig]] = []
    p = pool(api_url, token_file=token_file, port=8000, kv_events_port="5557")
    task = asyncio.create_task(watch(p, seen.append))
    try:
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.05)
    finally:
        await stop(task)
    assert seen[0][0].url == "http://[fd00::10]:8000"
    assert seen[0][0].kv_events == "tcp://[fd00::10]:5557"


async def test_callback_error_stops_the_watch(api: FakeKubeApi, api_url: str, token_file: str) -> None:
    await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [("vllm-0", "10.1.0.10", True)]))

    async def broken(_: list[ReplicaConfig]) -> None:
        raise RuntimeError("registry refused")

    with pytest.raises(RuntimeError, match="registry refused"):
        await asyncio.wait_for(watch(pool(api_url, token_file=token_file), broken), 10)


def test_misnamed_ports_are_reported_once() -> None:
    cfg = DiscoveryConfig(service=SVC)
    warnings: list[str] = []
    sl = endpoint_slice("s", NS, SVC, [("vllm-0", "10.0.0.1", True)], ports={"web": 8000})
    assert replicas_from_endpointslices([sl], cfg, warn=warnings.append) == []
    assert "no port named 'http'" in warnings[0]
    sl = endpoint_slice("s", NS, SVC, [("vllm-0", "10.0.0.1", True)], ports={"http": 8000})
    [replica] = replicas_from_endpointslices([sl], cfg, warn=warnings.append)
    assert replica.kv_events is None
    assert "no port named 'kv-events'" in warnings[1]


def test_discovery_config_fields_are_checked() -> None:
    with pytest.raises(ConfigError, match="discovery needs 'service'"):
        parse_gateway_config({"pools": [{"model": "m", "discovery": {"namespace": "x"}}]})
    with pytest.raises(ConfigError, match="source pods needs 'label_selector'"):
        parse_gateway_config({"pools": [{"model": "m", "discovery": {"source": "pods"}}]})
    with pytest.raises(ConfigError, match=r"discovery\.sevrice: Extra inputs"):
        parse_gateway_config({"pools": [{"model": "m", "discovery": {"service": "s", "sevrice": "t"}}]})
    cfg = parse_gateway_config({"pools": [{"model": "m", "discovery": {"service": "s"}}]})
    assert cfg.pools[0].discovery is not None
    assert cfg.pools[0].discovery.port == "http"


def test_outside_a_cluster_without_api_url_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"discovery\.api_url"):
        resolve_access(DiscoveryConfig(service=SVC), environ={}, service_account_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"discovery\.namespace"):
        resolve_access(DiscoveryConfig(service=SVC, api_url="http://127.0.0.1:1"), environ={},
                       service_account_dir=tmp_path)
    with pytest.raises(ConfigError, match="no 'discovery:'"):
        KubernetesDiscovery(PoolConfig(model="m"))


# --- the in-cluster path: service account token, namespace and CA over real TLS ----------


def _make_tls(tmp: Path) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate for 127.0.0.1 (the openssl CLI)."""
    ca_key, ca_crt = tmp / "ca.key", tmp / "ca.crt"
    key, csr, crt, ext = tmp / "server.key", tmp / "server.csr", tmp / "server.crt", tmp / "ext.cnf"
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca_crt),
        "-days", "1", "-subj", "/CN=fake-cluster-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=kubernetes")
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:kubernetes.default.svc\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(crt), "-days", "1", "-extfile", str(ext))
    return ca_crt, crt, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make a test CA")
async def test_in_cluster_service_account_over_tls(api: FakeKubeApi, tmp_path: Path) -> None:
    ca_crt, crt, key = _make_tls(tmp_path)
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(TOKEN)
    (sa / "namespace").write_text(NS)
    shutil.copy(ca_crt, sa / "ca.crt")
    await api.put("endpointslices", endpoint_slice(f"{SVC}-a", NS, SVC, [("vllm-0", "10.1.0.10", True)]))
    async with serve(api, certfile=str(crt), keyfile=str(key)) as url:
        port = url.rsplit(":", 1)[1]
        cfg = DiscoveryConfig(service=SVC)
        access = resolve_access(cfg, environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                                              "KUBERNETES_SERVICE_PORT": port}, service_account_dir=sa)
        assert access.base_url == f"https://127.0.0.1:{port}" and access.namespace == NS
        p = PoolConfig(model="llama-3.1-8b", discovery=cfg)
        [replica] = await discover_once(p, access=access)
        assert replica.url == "http://10.1.0.10:8000"

        # Without the cluster CA the server's certificate is refused.
        untrusted = KubeAccess(base_url=access.base_url, namespace=NS, token_file=sa / "token", verify=True)
        async with httpx.AsyncClient(verify=True) as client:
            with pytest.raises(httpx.ConnectError):
                await KubernetesDiscovery(p, access=untrusted, client=client).list_replicas()


def test_pods_annotated_draining_or_cordoned_stay_replicas_marked_so() -> None:
    """The Kubernetes autoscaler loop drains (and keeps asleep) a pod, and cordons or
    pre-drains one, by annotating it; the gateway's discovery reads the marks."""
    from taskplane.config import DiscoveryConfig
    from taskplane.engines.kube_replicas import (
        CORDONED_ANNOTATION,
        DRAINING_ANNOTATION,
        replicas_from_pods,
    )

    labels = {"app": "vllm"}
    drained = pod("vllm-a", NS, "10.3.0.1", labels=labels)
    drained["metadata"]["annotations"] = {DRAINING_ANNOTATION: "true"}
    cordoned = pod("vllm-c", NS, "10.3.0.3", labels=labels)
    cordoned["metadata"]["annotations"] = {CORDONED_ANNOTATION: "true"}
    serving = pod("vllm-b", NS, "10.3.0.2", labels=labels)
    cfg = DiscoveryConfig(source="pods", label_selector="app=vllm", namespace=NS)
    got = {r.replica_name: (r.draining, r.cordoned) for r in replicas_from_pods([drained, serving, cordoned], cfg)}
    assert got == {"vllm-a": (True, False), "vllm-b": (False, False), "vllm-c": (False, True)}


def test_pods_labelled_with_llm_d_roles_become_prefill_and_decode_replicas() -> None:
    """llm-d labels its prefill and decode pods ``llm-d.ai/role``; discovery gives each
    replica that role (no label, or a value it does not know: both)."""
    from taskplane.config import DiscoveryConfig
    from taskplane.engines.kube_replicas import ROLE_LABEL, replicas_from_pods

    pods = [pod(f"vllm-{role}", NS, f"10.4.0.{i}", labels={"app": "vllm", **({ROLE_LABEL: role} if role else {})})
            for i, role in enumerate(("prefill", "decode", "both", "", "encode"), start=1)]
    cfg = DiscoveryConfig(source="pods", label_selector="app=vllm", namespace=NS)
    got = {r.replica_name: r.role for r in replicas_from_pods(pods, cfg)}
    assert got == {"vllm-prefill": "prefill", "vllm-decode": "decode", "vllm-both": "both", "vllm-": "both",
                   "vllm-encode": "both"}

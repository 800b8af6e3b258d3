"""LoRA adapters through the gateway: the adapter a call names (``base:adapter`` or the
``X-Taskplane-Adapter`` header), its validation, the replica asked for it by name, a replica
lacking it, and the attempt rows naming it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest
from test_gateway_http import _headers, _rows, _rows_eventually

from taskplane.calls import failures
from taskplane.calls.adapters import MAX_ADAPTER_LEN, call_adapter
from taskplane.dev.local import LocalCluster
from taskplane.errors import ErrorType, TaskplaneError

MODEL = "llama-3.1-8b"
SERVED = {MODEL, "qwen:7b"}


@pytest.mark.parametrize(
    ("model", "headers", "expected"),
    [
        (MODEL, {}, (MODEL, None)),
        (f"{MODEL}:tenant-a", {}, (MODEL, "tenant-a")),
        (MODEL, {"x-taskplane-adapter": "tenant-a"}, (MODEL, "tenant-a")),
        (f"{MODEL}:tenant-a", {"x-taskplane-adapter": "tenant-a"}, (MODEL, "tenant-a")),
        ("qwen:7b", {}, ("qwen:7b", None)),  # a served name with a colon is a base model
        ("qwen:7b:sql", {}, ("qwen:7b", "sql")),
        ("nope:x", {}, ("nope:x", None)),  # left to the pool lookup (model_not_found)
    ],
)
def test_the_call_names_its_base_model_and_adapter(model: str, headers: dict[str, str],
                                                   expected: tuple[str, str | None]) -> None:
    assert call_adapter(model, SERVED, headers) == expected


@pytest.mark.parametrize(
    ("model", "headers", "words"),
    [
        (f"{MODEL}:", {}, "1 to"),
        (f"{MODEL}:" + "a" * (MAX_ADAPTER_LEN + 1), {}, "1 to"),
        (f"{MODEL}:bad\u00e9name", {}, "printable"),
        (MODEL, {"x-taskplane-adapter": "has space"}, "printable"),
        (MODEL, {"x-taskplane-adapter": ""}, "1 to"),
        (f"{MODEL}:a", {"x-taskplane-adapter": "b"}, "names adapter"),
    ],
)
def test_a_bad_adapter_is_a_clear_400(model: str, headers: dict[str, str], words: str) -> None:
    with pytest.raises(TaskplaneError) as err:
        call_adapter(model, SERVED, headers)
    assert err.value.error_type is ErrorType.INVALID_REQUEST and words in err.value.message


def test_a_404_for_an_adapter_is_not_served_here_not_a_replica_fault() -> None:
    lacking = failures.from_status("r1", 404, b'{"error": {"message": "The model `a` does not exist."}}', "a")
    assert lacking.retry and lacking.fault is failures.ReplicaFault.NONE
    assert lacking.error.error_type is ErrorType.MODEL_NOT_FOUND and "'a'" in lacking.error.message
    base = failures.from_status("r1", 404, b'{"error": {"message": "no such model"}}')
    assert not base.retry and base.error.error_type is ErrorType.MODEL_NOT_FOUND


@pytest.fixture(scope="module")
def lora_cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> LocalCluster:
    """Two replicas through the Python data plane: replica-0 serves adapter ``tenant-a``,
    replica-1 the base model only."""
    workdir = Path(tmp_path_factory.mktemp("gw-lora"))
    c = LocalCluster(workdir, replicas=2, database_url=pg_url, data_plane="python",
                     replica_args=["--enable-lora", "--lora-modules", f"tenant-a={workdir / 'tenant-a'}"])
    c.replicas[1].extra_args.clear()
    with c:
        yield c  # type: ignore[misc]


def _chat(model: str, text: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 4}


async def test_adapter_calls_reach_a_replica_holding_it_and_rows_name_it(lora_cluster: LocalCluster,
                                                                        pg_url: str) -> None:
    task = f"t-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=lora_cluster.gateway_url, timeout=30) as client:
        for step in range(6):
            # a new session each step, so placement is free to try the replica without the adapter
            body = _chat(f"{MODEL}:tenant-a", f"question {step} " + "words " * 20)
            extra = {"X-Taskplane-Session-Id": f"{task}-{step}"}
            r = await client.post("/v1/chat/completions", json=body, headers=_headers(task, step, **extra))
            assert r.status_code == 200, r.text
            assert r.json()["model"] == "tenant-a"  # the engine was asked for the adapter by its name
            assert r.headers["X-Taskplane-Replica"] == "replica-0"
        r = await client.post("/v1/chat/completions", json=_chat(MODEL, "base"), headers=_headers(task, 6))
        assert r.status_code == 200 and r.json()["model"] == MODEL
        assert (await client.get("/healthz")).json()["healthy_replicas"] == 2  # replica-1 was not benched
    for _ in range(100):  # the failed attempts' rows may land first
        rows = await _rows(pg_url, task)
        served = [r for r in rows if r["outcome"] == "success"]
        if len(served) >= 7:
            break
        await asyncio.sleep(0.1)
    assert len(served) == 7
    assert sorted(r["step"] for r in served if r["adapter"] == "tenant-a") == list(range(6))
    assert all(r["replica"] == "replica-0" and r["model_requested"] == MODEL for r in served if r["adapter"])
    assert [r["adapter"] for r in served if r["step"] == 6] == [None]
    for r in rows:
        if r["outcome"] != "success":  # an attempt on replica-1, which lacks the adapter (a 404, retried)
            assert (r["replica"], r["adapter"], r["error_type"]) == ("replica-1", "tenant-a", "model_not_found")


async def test_a_bad_adapter_is_refused_and_records_nothing(lora_cluster: LocalCluster, pg_url: str) -> None:
    task = f"t-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=lora_cluster.gateway_url, timeout=30) as client:
        r = await client.post("/v1/chat/completions", json=_chat(f"{MODEL}:bad name", "x"), headers=_headers(task, 0))
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request"
        assert "adapter name" in r.json()["error"]["message"]
        r = await client.post("/v1/chat/completions", json=_chat(MODEL, "x"),
                              headers=_headers(task, 1, **{"X-Taskplane-Adapter": "x" * 500}))
        assert r.status_code == 400 and "adapter name" in r.json()["error"]["message"]
        ok = await client.post("/v1/chat/completions", json=_chat(MODEL, "x"), headers=_headers(task, 2))
        assert ok.status_code == 200
    rows = await _rows_eventually(pg_url, task, 1)
    assert [(r["step"], r["adapter"]) for r in rows] == [(2, None)]
    assert await _rows(pg_url, task) == rows


async def test_through_envoy_a_replica_lacking_the_adapter_is_a_clear_retryable_error(pg_url: str, tmp_path: Path) -> None:
    """Envoy's data plane: replica-0 serves ``tenant-a``, replica-1 ``tenant-b``. A call landing
    on the wrong one is a 503 naming the adapter (the replica stays in), and the client's
    retry avoids it."""
    c = LocalCluster(tmp_path, replicas=2, database_url=pg_url,
                     replica_args=["--enable-lora", "--lora-modules", f"tenant-a={tmp_path / 'a'}"])
    c.replicas[1].extra_args[-1] = f"tenant-b={tmp_path / 'b'}"
    task = f"t-{uuid.uuid4().hex[:8]}"
    with c:
        async with httpx.AsyncClient(base_url=c.gateway_url, timeout=30) as client:
            for step in range(4):
                body = _chat(f"{MODEL}:tenant-a", f"envoy {step} " + "words " * 20)
                headers = _headers(task, step, **{"X-Taskplane-Session-Id": f"{task}-{step}"})
                r = await client.post("/v1/chat/completions", json=body, headers=headers)
                if r.status_code != 200:
                    err = r.json()["error"]
                    assert r.status_code == 503 and err["type"] == "no_replica", r.text
                    assert "'tenant-a' is not served on replica replica-1" in err["message"]
                    r = await client.post("/v1/chat/completions", json=body, headers={**headers, "X-Taskplane-Attempt": "2"})
                assert r.status_code == 200, r.text
                assert r.json()["model"] == "tenant-a" and r.headers["X-Taskplane-Replica"] == "replica-0"
            assert (await client.get("/healthz")).json()["healthy_replicas"] == 2
    rows = await _rows(pg_url, task)
    assert {r["adapter"] for r in rows} == {"tenant-a"}
    assert sorted(r["step"] for r in rows if r["outcome"] == "success") == list(range(4))

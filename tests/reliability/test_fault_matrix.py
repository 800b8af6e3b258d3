"""The fault matrix: agent tasks in flight through Temporal, the worker, the gateway,
simulated replicas and Postgres, while one part fails. For every fault: each task either
completes or ends with a clear, recorded failure (none lost); every cost row the gateway
handed to its writer is in Postgres exactly once; the gateway's KV view catches up with
every replica within seconds of the fault ending.

Postgres is stopped for 30 s, as the issue asks (the cost writer's retry backoff is capped
at 10 s, so the outage spans several failed deliveries with rows waiting in the outbox,
then the drain after the restart). The matrix is printed at the end of the run (conftest.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio
import tp_rel_agents as agents
from temporalio.client import Client
from temporalio.service import RPCError
from tp_rel_stack import MATRIX, RelStack

import taskplane
from taskplane.dev import processes as proc
from taskplane.sdk import TaskFailed, TaskHandle, connect
from taskplane.store.records import GATEWAY_LOST

pytestmark = pytest.mark.stack

TASKS = 8
STEPS = 5
TERMINAL = {"succeeded", "failed", "failed-deadline", "cancelled"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelStack]:
    s = RelStack(Path(tmp_path_factory.mktemp("faults"))).start()
    try:
        yield s
    finally:
        s.stop()


@pytest_asyncio.fixture(scope="module")
async def client(stack: RelStack) -> AsyncIterator[Client]:
    yield await connect(stack.temporal_address)


async def _outcome(handle: TaskHandle, bound_s: float) -> str:
    """ok, failed (the task ended with a failure) or lost (no end within the bound)."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            await asyncio.wait_for(handle.result(), timeout=max(1.0, deadline - time.monotonic()))
            return "ok"
        except TaskFailed:
            return "failed"
        except (RPCError, ConnectionError):
            await asyncio.sleep(0.5)  # Temporal itself restarting: ask again
        except TimeoutError:
            break
    return "lost"


async def _pg(stack: RelStack, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(stack.database_url.replace("+asyncpg", ""), timeout=5)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def _drained(stack: RelStack, prefix: str, bound_s: float = 60) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
    """Wait until Postgres holds every cost row the gateway logged and a terminal task row
    per task (the outboxes drain after outages); return (llm_calls rows, tasks rows)."""
    deadline = time.monotonic() + bound_s
    while True:
        want = {r["attempt_key"] for r in stack.gateway_rows(prefix)}
        try:
            calls = await _pg(stack, "SELECT attempt_key, outcome, error_type, replica, gpu_seconds FROM llm_calls "
                              "WHERE task_id LIKE $1", prefix + "%")
            tasks = await _pg(stack, "SELECT task_id, status, error FROM tasks WHERE task_id LIKE $1", prefix + "%")
        except (OSError, asyncpg.PostgresError):
            calls, tasks = [], []
        have = {r["attempt_key"] for r in calls}
        if (want <= have and len(tasks) == TASKS and all(t["status"] in TERMINAL for t in tasks)) or time.monotonic() > deadline:
            return calls, tasks
        await asyncio.sleep(0.5)


async def _kv_recovered(stack: RelStack, bound_s: float = 60) -> float | None:
    """Seconds until, for every replica, the gateway's KV event position equals the
    replica's last published sequence. Traffic goes on meanwhile (a direct call to each
    lagging replica every second makes it publish), as it does in production: a subscriber
    learns of a gap, or of a restarted publisher, from the next event it receives."""
    t0 = time.monotonic()
    last_poke = 0.0
    async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
        while time.monotonic() - t0 < bound_s:
            views = await stack.kv_views()
            lagging = [name for name, v in views.items()
                       if not v["replica"] or v["gateway"].get("kv_events_last_seq") != v["replica"]["kv_events"]["next_seq"] - 1]
            if not lagging:
                return time.monotonic() - t0
            if time.monotonic() - last_poke >= 1.0:
                last_poke = time.monotonic()
                for r in stack.cluster.replicas:
                    if r.name in lagging:
                        body = {"model": agents.MODEL, "max_tokens": 2,
                                "messages": [{"role": "user", "content": f"kv probe {uuid.uuid4().hex}"}]}
                        try:
                            await http.post(f"{r.url}/v1/chat/completions", json=body)
                        except httpx.HTTPError:
                            pass
            await asyncio.sleep(0.2)
    return None


async def wait_for_calls_in_flight(stack: RelStack, bound_s: float = 5.0) -> int:
    """Strike while the gateway has calls in flight (not in a tool gap): the harder case."""
    deadline = time.monotonic() + bound_s
    async with httpx.AsyncClient(timeout=2, trust_env=False) as http:
        while time.monotonic() < deadline:
            reps = (await http.get(f"{stack.cluster.gateway_url}/admin/replicas")).json()["replicas"]
            n = sum(r["inflight"] for r in reps)
            if n:
                return int(n)
            await asyncio.sleep(0.01)
    return 0


async def replica_with_calls_in_flight(stack: RelStack, prefix: str, bound_s: float = 5.0) -> Any:
    """A replica that is serving one of this case's calls right now (else the busiest one)."""
    deadline = time.monotonic() + bound_s
    async with httpx.AsyncClient(timeout=2, trust_env=False) as http:
        while time.monotonic() < deadline:
            reps = (await http.get(f"{stack.cluster.gateway_url}/admin/replicas")).json()["replicas"]
            busy = [r["name"] for r in reps if r["inflight"] > 0]
            if busy:
                return next(r for r in stack.cluster.replicas if r.name == busy[0])
            await asyncio.sleep(0.01)
    return busiest_replica(stack, prefix)


async def _faults(url: str, **body: Any) -> None:
    async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
        (await http.post(f"{url}/admin/faults", json=body)).raise_for_status()


def _sigkill(pid: int | None) -> None:
    if pid and proc.alive(pid):
        import os

        os.killpg(pid, signal.SIGKILL)
        proc.stop_pid(pid, timeout_s=2)


def busiest_replica(stack: RelStack, prefix: str) -> Any:
    """The replica that served most of this case's calls so far: the one whose failure hurts."""
    counts: dict[str, int] = {}
    for r in stack.gateway_rows(prefix):
        if r.get("replica"):
            counts[r["replica"]] = counts.get(r["replica"], 0) + 1
    name = max(counts, key=lambda k: counts[k]) if counts else stack.cluster.replicas[0].name
    return next(r for r in stack.cluster.replicas if r.name == name)


async def run_case(stack: RelStack, client: Client, fault: str, inject: Callable[[str], Awaitable[None]],
                   clear: Callable[[], Awaitable[None]], hold_s: float) -> dict[str, Any]:
    prefix = f"rel-{fault}-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    handles = [await taskplane.submit(agents.rel_session, STEPS, f"{fault}-{i}", client=client, task_id=f"{prefix}-{i}")
               for i in range(TASKS)]
    await asyncio.sleep(1.5)  # tasks are mid-session now
    try:
        await inject(prefix)
        await asyncio.sleep(hold_s)
    finally:
        await clear()  # a fault that failed half-way must not outlive its case
    kv_s = await _kv_recovered(stack)
    outcomes = await asyncio.gather(*(_outcome(h, 150) for h in handles))
    calls, tasks = await _drained(stack, prefix)
    gw_keys = [r["attempt_key"] for r in stack.gateway_rows(prefix)]
    db_keys = [r["attempt_key"] for r in calls]
    row = {
        "fault": fault, "tasks": TASKS,
        "ok": outcomes.count("ok"), "failed": outcomes.count("failed"), "lost": outcomes.count("lost"),
        "rows_gateway": len(set(gw_keys)), "rows_db": len(db_keys),  # lost attempts: logged by the next gateway
        "rows_lost": len(set(gw_keys) - set(db_keys)),
        "lost_keys": sorted(set(gw_keys) - set(db_keys))[:5],
        "rows_doubled": (len(db_keys) - len(set(db_keys))) + len(set(db_keys) - set(gw_keys)),
        "rows_not_success": sum(1 for r in calls if r["outcome"] != "success"),
        "rows_gateway_lost": sum(1 for r in calls if r["error_type"] == GATEWAY_LOST),
        "gpu_s_max": max((float(r["gpu_seconds"]) for r in calls), default=0.0),
        "kv_recovery_s": kv_s, "wall_s": time.monotonic() - t0,
        "task_rows": {t["task_id"]: t["status"] for t in tasks},
        "failed_errors": [t["error"] for t in tasks if t["status"] != "succeeded"],
    }
    MATRIX.append(row)
    return row


def _check(row: dict[str, Any], *, may_fail: bool = False) -> None:
    assert row["lost"] == 0, row
    assert row["rows_lost"] == 0 and row["rows_doubled"] == 0, row
    assert row["rows_db"] >= row["tasks"] * STEPS, row  # at least one row per LLM call
    assert len(row["task_rows"]) == row["tasks"] and set(row["task_rows"].values()) <= TERMINAL, row
    assert sum(1 for s in row["task_rows"].values() if s == "succeeded") == row["ok"], row
    assert all(row["failed_errors"]), "a failed task records why"
    if not may_fail:
        assert row["failed"] == 0, row
    assert row["kv_recovery_s"] is not None, "the gateway's KV view did not catch up"


async def _noop(*_: Any) -> None:
    return None


async def test_baseline(stack: RelStack, client: Client) -> None:
    _check(await run_case(stack, client, "none (baseline)", _noop, _noop, 0.5))


async def test_kill_a_replica(stack: RelStack, client: Client) -> None:
    victim: list[Any] = []

    async def inject(prefix: str) -> None:
        victim.append(await replica_with_calls_in_flight(stack, prefix))
        try:
            await _faults(victim[0].url, crash=True)  # os._exit in the replica: a real crash
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.3)
        _sigkill(victim[0].pid)

    async def clear() -> None:
        await asyncio.to_thread(stack.cluster.start_replica, victim[0])

    _check(await run_case(stack, client, "kill a replica", inject, clear, 3.0))


async def test_hang_a_replica(stack: RelStack, client: Client) -> None:
    victim: list[Any] = []

    async def inject(prefix: str) -> None:
        victim.append(await replica_with_calls_in_flight(stack, prefix))
        await _faults(victim[0].url, hang=True)

    row = await run_case(stack, client, "hang a replica", inject, lambda: _faults(victim[0].url, clear=True), 10.0)
    _check(row)
    assert row["rows_not_success"] >= 1, "calls waiting on the hung replica were abandoned and retried"


async def test_slow_a_replica_tenfold(stack: RelStack, client: Client) -> None:
    victim: list[Any] = []

    async def inject(prefix: str) -> None:
        victim.append(busiest_replica(stack, prefix))
        await _faults(victim[0].url, slow=10)

    _check(await run_case(stack, client, "slow a replica x10", inject, lambda: _faults(victim[0].url, clear=True), 6.0))


async def test_drop_kv_events_then_restore(stack: RelStack, client: Client) -> None:
    urls = [r.url for r in stack.cluster.replicas]

    async def inject(_: str) -> None:
        for u in urls:
            await _faults(u, drop_events=True)

    async def clear() -> None:
        for u in urls:
            await _faults(u, drop_events=False)

    _check(await run_case(stack, client, "drop KV events", inject, clear, 4.0))


async def test_kill_the_worker(stack: RelStack, client: Client) -> None:
    async def inject(_: str) -> None:
        await wait_for_calls_in_flight(stack)
        stack.kill_worker()

    async def clear() -> None:
        await asyncio.to_thread(stack.start_worker)

    _check(await run_case(stack, client, "kill the worker", inject, clear, 2.0))


async def test_kill_and_restart_the_gateway(stack: RelStack, client: Client) -> None:
    async def inject(_: str) -> None:
        # the replicas hold the calls they get, so the strike surely cuts calls off at a
        # replica (sent, journalled) rather than between two calls
        for rep in stack.cluster.replicas:
            await _faults(rep.url, hang=True)
        await wait_for_calls_in_flight(stack)
        await asyncio.sleep(0.5)
        _sigkill(stack.cluster.gateway_pid)
        stack.cluster.gateway_pid = None

    async def clear() -> None:
        for rep in stack.cluster.replicas:
            await _faults(rep.url, clear=True)
        await asyncio.to_thread(stack.cluster.start_gateway)

    row = await run_case(stack, client, "kill -9 the gateway", inject, clear, 2.0)
    _check(row)
    # the strike waits for calls in flight: the attempts it cut off are rows too, written
    # by the restarted gateway from the dead one's in-flight journal (calls/lost.py)
    assert row["rows_gateway_lost"] >= 1, row


async def test_stop_postgres(stack: RelStack, client: Client) -> None:
    async def inject(_: str) -> None:
        await asyncio.to_thread(stack.stop_postgres)

    async def clear() -> None:
        await asyncio.to_thread(stack.start_postgres)

    _check(await run_case(stack, client, "stop Postgres 30 s", inject, clear, 30.0))


async def test_restart_temporal_keeping_its_database(stack: RelStack, client: Client) -> None:
    async def inject(_: str) -> None:
        await asyncio.to_thread(stack.stop_temporal)

    async def clear() -> None:
        await asyncio.to_thread(stack.start_temporal)

    _check(await run_case(stack, client, "restart Temporal", inject, clear, 2.0))


async def test_pause_the_gateway_20s(stack: RelStack, client: Client) -> None:
    """SIGSTOP the gateway for 20 s with calls in flight: nobody is charged for the pause."""
    assert stack.cluster.gateway_pid is not None
    pid = stack.cluster.gateway_pid

    async def inject(_: str) -> None:
        await wait_for_calls_in_flight(stack)
        os.kill(pid, signal.SIGSTOP)

    async def clear() -> None:
        os.kill(pid, signal.SIGCONT)

    row = await run_case(stack, client, "pause the gateway 20 s", inject, clear, 20.0)
    _check(row, may_fail=True)
    baseline = next((r for r in MATRIX if r["fault"] == "none (baseline)"), None)
    # a charge for the pause would be >= 20 s / batch; the sim's calls take well under 5 s
    assert row["gpu_s_max"] < 5.0, (row["gpu_s_max"], baseline and baseline["gpu_s_max"])


# the disk-full window is 8 s of wall time: under load the gateway may write no row inside it
@pytest.mark.flaky(reruns=2)
async def test_outbox_disk_full(stack: RelStack, client: Client) -> None:
    """The gateway's outbox filesystem full for 8 s: calls go on, rows go straight to Postgres."""
    if stack.outbox_fs is None:
        pytest.skip("no rights to mount a small filesystem for the outbox")

    async def inject(_: str) -> None:
        await asyncio.to_thread(stack.fill_outbox_fs)

    async def clear() -> None:
        await asyncio.to_thread(stack.free_outbox_fs)

    before = await _gateway_metric(stack, "taskplane_gateway_rows_direct_total")
    row = await run_case(stack, client, "outbox disk full 8 s", inject, clear, 8.0)
    row["rows_direct"] = await _gateway_metric(stack, "taskplane_gateway_rows_direct_total") - before
    _check(row)
    assert row["rows_direct"] > 0, "no row took the direct path: the outbox was not full?"


async def test_kill_9_postgres(stack: RelStack, client: Client) -> None:
    """SIGKILL the postmaster mid-run (crash recovery at restart), down 10 s."""

    async def inject(_: str) -> None:
        await wait_for_calls_in_flight(stack)
        stack.kill_postgres()

    async def clear() -> None:
        await asyncio.to_thread(stack.restart_killed_postgres)

    _check(await run_case(stack, client, "kill -9 Postgres", inject, clear, 10.0))


async def _gateway_metric(stack: RelStack, name: str) -> float:
    async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
        text = (await http.get(f"{stack.cluster.gateway_url}/metrics")).text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name + " ") or ln.startswith(name + "{"))

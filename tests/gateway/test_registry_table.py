"""The registry keeps the scheduler's table instead of rebuilding every view per
decision: each test changes one replica's state the way the gateway does (a lease, a
scrape of a real simulated replica, a failure mark, discovery) and checks that the
table the scheduler reads shows the change, and that the other replicas' rows were
kept (so the table is really incremental, and a stale row would be caught)."""

from __future__ import annotations

from tp_sim_replica import sim_replica

from taskplane.config import GatewayConfig, ReplicaConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.epp.endpoints import EndpointBook
from taskplane.scheduler.types import ReplicaView


def _config(*urls: str) -> GatewayConfig:
    return GatewayConfig.model_validate({
        "auth": False,
        "pools": [{"model": "llama-3.1-8b", "replicas": [{"url": u, "name": f"r{i}", "max_num_seqs": 4}
                                                          for i, u in enumerate(urls)]}],
    })


def _row(registry: ReplicaRegistry, name: str) -> ReplicaView:
    view = registry.table().get(name)
    assert view is not None
    return view


def test_a_lease_changes_its_replicas_row_and_keeps_the_others() -> None:
    registry = ReplicaRegistry(_config("http://127.0.0.1:1", "http://127.0.0.1:2"))
    r0 = registry.replicas["r0"]
    before = list(registry.table().views)
    lease = registry.acquire(r0, prefill_tokens=120, decode_tokens=30)
    view = _row(registry, "r0")
    assert (view.num_running, view.inflight_prefill_tokens, view.inflight_decode_tokens) == (1, 120, 30)
    assert view == r0.view()  # the kept row is what a fresh view would say
    assert _row(registry, "r1") is before[1]  # untouched: not rebuilt
    lease.prefilled()
    assert _row(registry, "r0").inflight_prefill_tokens == 0
    for _ in range(5):  # beyond max_num_seqs: the rest wait
        registry.acquire(r0, prefill_tokens=0, decode_tokens=1)
    assert (_row(registry, "r0").num_running, _row(registry, "r0").num_waiting) == (4, 2)
    lease.release()
    assert _row(registry, "r0").num_running + _row(registry, "r0").num_waiting == 5
    assert registry.views() == [s.view() for s in registry.replicas.values()]


def test_a_failure_mark_takes_the_replica_out_of_the_table_until_a_scrape_sees_it() -> None:
    registry = ReplicaRegistry(_config("http://127.0.0.1:1", "http://127.0.0.1:2"))
    assert _row(registry, "r1").healthy
    registry.mark_failure("r1", hard=True)
    assert not _row(registry, "r1").healthy
    assert [s.name for s in registry.least_loaded("llama-3.1-8b", 2)] == ["r0"]


def test_a_row_held_down_for_a_while_comes_back_when_the_time_is_up() -> None:
    registry = ReplicaRegistry(_config("http://127.0.0.1:1"))
    r0 = registry.replicas["r0"]
    r0.down_until = 10**12  # healthy, yet held out (the view depends on the clock)
    assert not _row(registry, "r0").healthy
    r0.down_until = 0.0
    assert _row(registry, "r0").healthy


def test_the_fallback_order_follows_the_load_the_table_shows() -> None:
    registry = ReplicaRegistry(_config(*(f"http://127.0.0.1:{p}" for p in (1, 2, 3, 4))))
    r = registry.replicas
    for name, calls in (("r0", 3), ("r1", 1), ("r2", 2), ("r3", 0)):
        for _ in range(calls):
            registry.acquire(r[name], prefill_tokens=1, decode_tokens=1)
    assert [s.name for s in registry.least_loaded("llama-3.1-8b", 2, skip={"r3"})] == ["r1", "r2"]
    assert [s.name for s in registry.least_loaded("llama-3.1-8b", 9)] == ["r3", "r1", "r2", "r0"]
    assert registry.least_loaded("another-model", 2) == []


async def test_a_scrape_of_a_real_replica_reaches_the_table() -> None:
    async with sim_replica(kv_blocks=1234, block_size=32) as url:
        registry = ReplicaRegistry(_config(url, "http://127.0.0.1:2"))
        assert _row(registry, "r0").kv_blocks_total == 4096  # nothing scraped yet: the default
        await registry.start()
        try:
            view = _row(registry, "r0")
            assert (view.kv_blocks_total, view.kv_blocks_free, view.block_size) == (1234, 1234, 32)
            assert view.healthy
        finally:
            await registry.close()
    await registry.start()  # the replica is gone now: refused
    try:
        assert not _row(registry, "r0").healthy
    finally:
        await registry.close()


def test_discovery_changes_reach_the_table_and_the_endpoint_book_at_once() -> None:
    config = _config("http://127.0.0.1:1")
    registry = ReplicaRegistry(config)
    book = EndpointBook(registry)
    book.refresh()
    pool = config.pools[0]
    registry.set_pool_replicas(pool, [ReplicaConfig(url="http://127.0.0.1:7", name="r7"),
                                      ReplicaConfig(url="http://127.0.0.1:1", name="r0", draining=True)])
    assert [v.name for v in registry.table().views] == ["r0", "r7"]
    assert not _row(registry, "r0").healthy  # draining: no new placements
    assert book.endpoint("r7") == "127.0.0.1:7"  # no poll: the membership callback told the book
    registry.set_pool_replicas(pool, [ReplicaConfig(url="http://127.0.0.1:7", name="r7")])
    assert [v.name for v in registry.table().views] == ["r7"]
    assert book.endpoint("r0") is None and book.replica("127.0.0.1:1") is None
    registry.remove("r7")
    assert len(registry.table()) == 0 and book.by_replica == {}


async def test_a_sleeping_replica_answers_health_yet_leaves_placement_until_it_wakes() -> None:
    """vLLM sleep mode: /health stays 200, the sleep-state gauge is what the scrape reads."""
    import httpx

    async with sim_replica(kv_blocks=256, block_size=32, speed=100.0, enable_sleep_mode=True) as url:
        registry = ReplicaRegistry(_config(url, "http://127.0.0.1:2"))
        await registry.start()
        try:
            assert _row(registry, "r0").healthy
            async with httpx.AsyncClient() as c:
                assert (await c.post(f"{url}/sleep", params={"level": 1})).status_code == 200
                assert (await c.get(f"{url}/health")).status_code == 200
                await registry.scrape(registry.replicas["r0"])
                assert not _row(registry, "r0").healthy and registry.replicas["r0"].sleeping
                assert registry.least_loaded("llama-3.1-8b", 2) == []
                assert (await c.post(f"{url}/wake_up")).json()["status"] == "awake"
            await registry.scrape(registry.replicas["r0"])
            assert _row(registry, "r0").healthy and not registry.replicas["r0"].sleeping
        finally:
            await registry.close()


def test_a_stored_last_block_begins_a_leases_prefill_and_only_its_own() -> None:
    """taskplane's Envoy reports a stream's first token only when the stream is over, so the
    replica's KV event storing the last prompt block a lease must compute tells the prefill
    gate that the prompt is no longer waiting for its step; it stays in flight until then."""
    registry = ReplicaRegistry(_config("http://127.0.0.1:1", "http://127.0.0.1:2"))
    r0 = registry.replicas["r0"]
    r0.kv_events_live = True
    a = registry.acquire(r0, prefill_tokens=120, decode_tokens=30, last_block=111)
    b = registry.acquire(r0, prefill_tokens=80, decode_tokens=30, last_block=222)
    same = registry.acquire(r0, prefill_tokens=40, decode_tokens=30, last_block=111)  # the same prompt twice
    tail = registry.acquire(r0, prefill_tokens=10, decode_tokens=30)  # no full block to compute
    assert registry.prefilling("r0") and not registry.prefilling("r1")
    assert registry.blocks_stored("r1", [111]) == 0  # another replica's block: not these leases
    view = _row(registry, "r0")
    assert (view.inflight_prefill_tokens, view.unstarted_prefill_tokens) == (250, 240)
    assert registry.blocks_stored("r0", [5, 111]) == 2
    view = _row(registry, "r0")
    assert (view.inflight_prefill_tokens, view.unstarted_prefill_tokens) == (250, 80)  # begun, not done
    assert registry.blocks_stored("r0", [111]) == 0  # once
    a.prefilled()
    assert _row(registry, "r0").inflight_prefill_tokens == 130
    b.release()  # a lease that ends before its block is reported leaves nothing behind
    assert not registry.prefilling("r0") and r0.unstarted_prompt_tokens == 0
    assert registry.blocks_stored("r0", [222]) == 0
    for lease in (a, same, tail):
        lease.release()
    assert (r0.inflight, r0.inflight_prompt_tokens, r0.unstarted_prompt_tokens) == (0, 0, 0)


def test_without_kv_events_the_view_does_not_say_what_has_begun() -> None:
    registry = ReplicaRegistry(_config("http://127.0.0.1:1"))
    r0 = registry.replicas["r0"]
    lease = registry.acquire(r0, prefill_tokens=0, decode_tokens=3, last_block=7)
    assert not registry.prefilling("r0")  # nothing to prefill: nothing to wait for
    registry.acquire(r0, prefill_tokens=64, decode_tokens=3, last_block=8)
    assert _row(registry, "r0").unstarted_prefill_tokens is None  # the gate then goes by the in-flight count
    lease.release()

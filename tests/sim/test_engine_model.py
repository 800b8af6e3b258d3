"""The pure engine model: batching, prefix cache, eviction, timing shape, determinism."""

from __future__ import annotations

import math
import random

import pytest

from taskplane.scheduler.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from taskplane.sim.engine import EngineConfig, Finished, FirstToken, KVEvents, SimEngine, SimRequest
from taskplane.sim.gpus import GPUS, default_kv_blocks


def drive(engine: SimEngine, arrivals: list[tuple[float, SimRequest]]) -> list[object]:
    """Run arrivals through the engine the way the cluster simulator does."""
    arrivals = sorted(arrivals, key=lambda a: a[0])
    i, out = 0, []
    while True:
        nt = engine.next_event_time()
        ta = arrivals[i][0] if i < len(arrivals) else math.inf
        if nt == math.inf and ta == math.inf:
            return out
        if ta <= nt:
            engine.submit(arrivals[i][1], ta)
            i += 1
        else:
            out += engine.advance(nt)


def finished(events: list[object]) -> dict[object, Finished]:
    return {e.req_id: e for e in events if isinstance(e, Finished)}


def test_single_request_timing_is_plausible_for_h100() -> None:
    e = SimEngine(EngineConfig(gpu="h100", kv_blocks=2000))
    ev = drive(e, [(0.0, SimRequest("a", 2048, 101, list(range(1, 129))))])
    f = finished(ev)["a"]
    assert f.error is None and f.output_tokens == 101
    assert 0.04 < f.first_token < 0.15  # ~30k prompt tokens/s
    tpot = (f.time - f.first_token) / 100
    assert 0.005 < tpot < 0.012  # ~7 ms per token for an 8B model
    assert [type(x) for x in ev if not isinstance(x, KVEvents)] == [FirstToken, Finished]


def test_gpu_generations_are_ordered_by_speed() -> None:
    ttft = {}
    for gpu in ("b200", "h200", "h100", "a100", "l40s", "cpu"):
        e = SimEngine(EngineConfig(gpu=gpu, kv_blocks=2000))
        ttft[gpu] = finished(drive(e, [(0.0, SimRequest("a", 4096, 64, list(range(1, 257))))]))["a"].time
    assert ttft["b200"] < ttft["h200"] < ttft["h100"] < ttft["a100"] < ttft["l40s"] < ttft["cpu"]
    assert default_kv_blocks("h200", "llama-3.1-8b", 16) > default_kv_blocks("h100", "llama-3.1-8b", 16)
    assert set(GPUS) >= {"h100", "h200", "b200", "l40s", "a100", "cpu"}


def test_prefix_hit_counts_tokens_and_recomputes_last_block() -> None:
    e = SimEngine(EngineConfig(gpu="h100", kv_blocks=1000, block_size=16))
    hs = list(range(1, 65))
    ev = drive(e, [(0.0, SimRequest("a", 1024, 10, hs)), (5.0, SimRequest("b", 1024, 10, hs)),
                   (9.0, SimRequest("c", 1024 + 40, 10, [*hs, 99, 98]))])
    f = finished(ev)
    assert f["a"].cached_tokens == 0
    assert f["b"].cached_tokens == 1024 - 16  # a full hit still recomputes its last block
    assert f["c"].cached_tokens == 1024  # shares 64 blocks; its own 2 blocks are new
    assert e.stats.prefix_queries == 1024 * 2 + 1064 and e.stats.prefix_hits == 1008 + 1024
    assert f["b"].first_token - 5.0 < f["a"].first_token  # the hit makes prefill short


def test_lru_eviction_emits_block_removed_tail_first() -> None:
    e = SimEngine(EngineConfig(gpu="h100", kv_blocks=10, block_size=16))
    a = SimRequest("a", 16 * 6, 1, [1, 2, 3, 4, 5, 6])
    b = SimRequest("b", 16 * 6, 1, [11, 12, 13, 14, 15, 16])
    ev = drive(e, [(0.0, a), (1.0, b)])
    kv = [k for x in ev if isinstance(x, KVEvents) for k in x.events]
    removed = [h for k in kv if isinstance(k, BlockRemoved) for h in k.block_hashes]
    # a held 7 blocks (6 cached + 1 for its output); b needs 7: the 4 free ones, then 3 of
    # a's cached blocks, its tail first
    assert removed == [6, 5, 4]
    stored = [k for k in kv if isinstance(k, BlockStored)]
    assert stored[0].block_hashes == [1, 2, 3, 4, 5, 6] and stored[0].parent_block_hash is None
    assert e.kv.match([1, 2, 3, 4], 4) == 3


def test_decode_jumps_match_step_by_step() -> None:
    rng = random.Random(7)
    arrivals = []
    t = 0.0
    for k in range(150):
        t += rng.expovariate(4)
        n = rng.randrange(1, 120)
        sess = rng.randrange(12)
        arrivals.append((t, SimRequest(k, n * 16 + rng.randrange(16), rng.randrange(1, 200),
                                       [sess * 1000 + j for j in range(n)])))
    fast = SimEngine(EngineConfig(gpu="h100", kv_blocks=2500))
    slow = SimEngine(EngineConfig(gpu="h100", kv_blocks=2500))
    slow.batcher.decode_only = lambda: False  # type: ignore[method-assign]
    a, b = finished(drive(fast, arrivals)), finished(drive(slow, arrivals))
    assert a.keys() == b.keys() and len(a) == 150
    for k in a:
        assert a[k].time == pytest.approx(b[k].time, abs=1e-9)
        assert a[k].cached_tokens == b[k].cached_tokens
    assert fast.stats.steps == slow.stats.steps


def test_batching_shares_steps_and_queue_waits_for_blocks() -> None:
    e = SimEngine(EngineConfig(gpu="h100", kv_blocks=40, block_size=16, max_num_seqs=4))
    reqs = [(0.0, SimRequest(i, 160, 100, [i * 100 + j for j in range(10)])) for i in range(8)]
    f = finished(drive(e, reqs))
    assert all(x.error is None for x in f.values())
    # 40 blocks hold 2 requests of 17 blocks at a time: later ones wait for admission
    admitted = sorted(x.admitted or 0.0 for x in f.values())
    assert admitted[0] == admitted[1] == 0.0 and admitted[2] > 0.0


def test_abort_reset_and_reject() -> None:
    e = SimEngine(EngineConfig(gpu="h100", kv_blocks=20, block_size=16))
    e.submit(SimRequest("big", 16 * 30, 10, list(range(30))), 0.0)
    e.submit(SimRequest("a", 64, 100, [1, 2, 3, 4]), 0.0)
    e.submit(SimRequest("b", 64, 100, [5, 6, 7, 8]), 0.0)  # waits: 11 + 11 blocks > 20
    out = e.advance(0.5)
    assert finished(out)["big"].error and "does not fit" in (finished(out)["big"].error or "")
    assert e.abort("a", 0.5)
    e.reset(0.6)
    out += e.advance(0.6)
    f = finished(out)
    assert f["a"].error == "aborted" and "restarted" in (f["b"].error or "")
    assert any(isinstance(k, AllBlocksCleared) for x in out if isinstance(x, KVEvents) for k in x.events)
    assert e.free_blocks() == 20 and not e.busy


def test_cold_start_delays_first_request() -> None:
    e = SimEngine(EngineConfig(gpu="h100", kv_blocks=100, model_loaded=False, cold_start_s=30.0))
    f = finished(drive(e, [(1.0, SimRequest("a", 64, 2, [1, 2, 3, 4])), (40.0, SimRequest("b", 64, 2, [9]))]))
    assert f["a"].first_token > 31.0 and f["b"].first_token < 40.1

"""The KV index: precise (vLLM events), approximate (routing history), one match call."""

from __future__ import annotations

import pytest
from _sched_util import BS, engine_store_events, removed, stored, tokens

from taskplane.scheduler.hashing import ROOT, adapter_root, chain_hashes
from taskplane.scheduler.kv import events as wire
from taskplane.scheduler.kv.events import normalize_event
from taskplane.scheduler.kvindex import BatchStatus, KVIndex


def test_stored_then_match_uses_our_hashes() -> None:
    idx = KVIndex()
    toks = tokens(1, 6)
    events, _ = engine_store_events(toks)
    idx.apply_events("a", events)
    prompt = chain_hashes(toks[: 4 * BS] + tokens(9, 2), BS)
    assert idx.match(prompt, ["a", "b"]) == {"a": 4}
    assert idx.match(chain_hashes(tokens(2, 3), BS), ["a"]) == {}


def test_child_event_chains_from_parent_engine_hash() -> None:
    idx = KVIndex()
    toks = tokens(1, 4)
    first, eng = engine_store_events(toks[: 2 * BS])
    idx.apply_events("a", first)
    # the second event carries only blocks 3-4 and names block 2's engine hash as parent
    idx.apply_events("a", [stored([111, 222], eng[-1], toks[2 * BS :])])
    assert idx.match(chain_hashes(toks, BS), ["a"]) == {"a": 4}


def test_removed_and_cleared() -> None:
    idx = KVIndex()
    toks = tokens(1, 4)
    events, eng = engine_store_events(toks)
    idx.apply_events("a", events)
    idx.apply_events("b", events)
    idx.apply_events("a", [removed([eng[2]])])  # a middle block: the prefix stops there
    h = chain_hashes(toks, BS)
    assert idx.match(h, ["a", "b"]) == {"a": 2, "b": 4}
    idx.apply_events("b", [{"type": "AllBlocksCleared"}])
    assert idx.match(h, ["a", "b"]) == {"a": 2}
    assert len(idx.precise) == 3  # a still holds blocks 0, 1 and 3


def test_unknown_parent_is_skipped_not_guessed() -> None:
    idx = KVIndex()
    toks = tokens(1, 2)
    idx.apply_events("a", [stored([5, 6], 999, toks)])  # parent never seen
    assert len(idx.precise) == 0
    assert idx.precise.unchained_blocks == 2


def test_unnamed_lora_and_cpu_tier_blocks_are_not_indexed() -> None:
    idx = KVIndex()
    toks = tokens(1, 1)
    ev = stored([5], None, toks)
    idx.apply_events("a", [{**ev, "lora_id": 3}, {**ev, "medium": "CPU"}])
    assert len(idx.precise) == 0


def test_replayed_batches_are_idempotent_and_gaps_wait_for_replay() -> None:
    idx = KVIndex()
    t1, t2 = tokens(1, 2), tokens(2, 2)
    b0, e1 = engine_store_events(t1)
    b1, _ = engine_store_events(t2)
    b2 = [removed([e1[1]])]
    assert idx.apply_batch("a", 0, b0).status is BatchStatus.APPLIED
    gap = idx.apply_batch("a", 2, b2)  # batch 1 was missed
    assert gap.status is BatchStatus.GAP and gap.replay_from == 1
    assert idx.match(chain_hashes(t1, BS), ["a"]) == {"a": 2}  # batch 2 not applied yet
    assert idx.apply_batch("a", 1, b1).status is BatchStatus.APPLIED  # the replay
    assert idx.match(chain_hashes(t1, BS), ["a"]) == {"a": 1}  # parked batch 2 drained
    assert idx.match(chain_hashes(t2, BS), ["a"]) == {"a": 2}
    for seq, b in ((0, b0), (1, b1), (2, b2)):  # a full replay changes nothing
        assert idx.apply_batch("a", seq, b).status is BatchStatus.DUPLICATE
    assert idx.precise.expected_seq("a") == 3


def test_clear_replica_resyncs_and_falls_back_to_approximate() -> None:
    idx = KVIndex()
    toks = tokens(1, 3)
    events, _ = engine_store_events(toks)
    idx.apply_batch("a", 0, events)
    h = chain_hashes(toks, BS)
    idx.record_routing("a", h, capacity_blocks=100)
    assert idx.precise.in_sync("a")
    idx.apply_batch("a", 5, [])  # a gap nobody can replay
    idx.clear_replica("a")
    assert not idx.precise.in_sync("a")
    assert idx.precise.blocks_of("a") == set()
    # out of sync: the routing history stands in
    assert idx.match(h, ["a"]) == {"a": 3}
    assert idx.match(h, ["a"], source="precise") == {}
    # the parked batch was applied and sequence tracking continues after it
    assert idx.precise.expected_seq("a") == 6
    # an engine reset makes the precise view exact again
    idx.apply_batch("a", 6, [{"type": "AllBlocksCleared"}])
    assert idx.precise.in_sync("a")
    assert idx.match(h, ["a"]) == {}


def test_late_join_is_a_gap_until_replay_or_resync() -> None:
    idx = KVIndex()
    toks = tokens(1, 1)
    events, _ = engine_store_events(toks)
    res = idx.apply_batch("a", 42, events)
    assert res.status is BatchStatus.GAP and res.replay_from == 0
    assert idx.match(chain_hashes(toks, BS), ["a"]) == {}
    idx.clear_replica("a")  # no replay that far back: adopt the stream from 42
    assert not idx.precise.in_sync("a")
    assert idx.match(chain_hashes(toks, BS), ["a"]) == {"a": 1}
    assert idx.apply_batch("a", 43, []).status is BatchStatus.APPLIED


def test_publisher_restart_after_clear() -> None:
    idx = KVIndex()
    idx.apply_batch("a", 0, [])
    idx.apply_batch("a", 1, [])
    idx.clear_replica("a")  # the subscriber saw the sequence go back
    assert idx.apply_batch("a", 0, [{"type": "AllBlocksCleared"}]).status is BatchStatus.APPLIED
    assert idx.precise.in_sync("a")


def test_remove_replica_frees_id_without_leaking_blocks() -> None:
    idx = KVIndex()
    toks = tokens(1, 2)
    events, _ = engine_store_events(toks)
    idx.apply_events("a", events)
    idx.record_routing("a", chain_hashes(toks, BS), 10)
    idx.remove_replica("a")
    assert len(idx.precise) == 0 and len(idx.approx) == 0
    idx.apply_events("c", engine_store_events(tokens(3, 1))[0])  # reuses a's bit
    assert idx.match(chain_hashes(toks, BS), ["a", "c"]) == {}


def test_approximate_lru_capacity() -> None:
    idx = KVIndex()
    old = chain_hashes(tokens(1, 8), BS)
    idx.record_routing("a", old, capacity_blocks=8)
    for fam in range(2, 5):
        idx.record_routing("a", chain_hashes(tokens(fam, 8), BS), capacity_blocks=8)
    assert idx.match(old, ["a"], source="approximate") == {}
    assert idx.approx.size_of("a") <= 9
    assert idx.match(chain_hashes(tokens(4, 8), BS), ["a"], source="approximate") == {"a": 8}


def test_many_replicas_wide_masks() -> None:
    idx = KVIndex()
    toks = tokens(1, 5)
    events, _ = engine_store_events(toks)
    names = [f"r{i}" for i in range(1100)]
    for i, n in enumerate(names):
        # replica i holds the first 1 + i % 5 blocks
        k = 1 + i % 5
        idx.apply_events(n, [{**events[0], "block_hashes": events[0]["block_hashes"][:k], "token_ids": toks[: k * BS]}])
    got = idx.match(chain_hashes(toks, BS), names)
    assert got == {n: 1 + i % 5 for i, n in enumerate(names)}


def test_block_size_mismatch_never_matches() -> None:
    idx = KVIndex()
    toks = tokens(1, 2)
    idx.apply_events("a", engine_store_events(toks, bs=8)[0])
    assert idx.match(chain_hashes(toks, BS), ["a"], block_size=BS) == {}
    assert idx.match(chain_hashes(toks, 8), ["a"], block_size=8) == {"a": 4}


def test_event_shapes_from_the_wire_module() -> None:
    """The engines' typed events (msgspec structs) and their codec round-trip into the index."""
    toks = tokens(1, 2)
    ev = wire.BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=toks, block_size=BS)
    payload = wire.encode_batch(0.0, [ev, wire.BlockRemoved(block_hashes=[2]), wire.AllBlocksCleared()])
    decoded = wire.decode_batch(payload).events
    kinds = [type(normalize_event(e)).__name__ for e in decoded]
    assert kinds == ["Stored", "Removed", "Cleared"]
    idx = KVIndex()
    idx.apply_events("a", decoded[:2])
    assert idx.match(chain_hashes(toks, BS), ["a"]) == {"a": 1}
    # array-like (older vLLM) encoding
    arr = normalize_event(["BlockStored", [1], None, toks[:BS], BS, None, "GPU"])
    assert arr.block_hashes == (1,)  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        normalize_event({"type": "Bogus"})


def test_without_metrics_the_counters_stay_put() -> None:
    from prometheus_client import REGISTRY

    def stored_total() -> float:
        return REGISTRY.get_sample_value("taskplane_kvindex_events_total", {"type": "BlockStored"}) or 0.0

    before = stored_total()
    idx = KVIndex(metrics=False)
    toks = tokens(1, 4)
    idx.apply_events("a", engine_store_events(toks)[0])
    assert stored_total() == before
    assert idx.match(chain_hashes(toks, BS), ["a"]) == {"a": 4}
    KVIndex().apply_events("a", engine_store_events(toks)[0])
    assert stored_total() > before


def test_stored_blocks_names_an_events_blocks_with_our_hashes() -> None:
    """What the gateway matches a call's last prompt block against (its prefill is done)."""
    idx = KVIndex()
    toks = tokens(1, 4)
    first, eng = engine_store_events(toks[: 2 * BS])
    idx.apply_events("a", first)
    child = [stored([111, 222], eng[-1], toks[2 * BS :])]
    idx.apply_events("a", child)
    ours = chain_hashes(toks, BS)
    assert idx.stored_blocks("a", first) == ours[:2]
    assert idx.stored_blocks("a", child) == ours[2:]
    assert idx.stored_blocks("b", child) == []  # a replica the index never heard of
    orphan = [stored([333], 999, tokens(5, 1))]  # its parent was never stored: not indexed
    idx.apply_events("a", orphan)
    assert idx.stored_blocks("a", orphan) == []


@pytest.mark.parametrize("typed", [False, True])
def test_an_adapters_blocks_match_only_its_own_calls(typed: bool) -> None:
    idx = KVIndex()
    toks = tokens(1, 4)
    first = {**stored([11, 12], None, toks[: 2 * BS]), "lora_id": 1, "lora_name": "sql"}
    child = {**stored([13, 14], 12, toks[2 * BS :]), "lora_id": 1, "lora_name": "sql"}
    base = stored([21, 22, 23, 24], None, toks)
    events = [first, child, base]
    if typed:  # vLLM's structs, as the subscriber decodes them and the simulator emits them
        events = [wire.BlockStored(**{k: v for k, v in e.items() if k != "type"}) for e in events]
    idx.apply_events("a", events[:2])
    idx.apply_events("b", events[2:])
    sql, chat, plain = (chain_hashes(toks, BS, adapter_root(a)) for a in ("sql", "chat", None))
    assert idx.match(sql, ["a", "b"]) == {"a": 4}
    assert idx.match(chat, ["a", "b"]) == {}
    assert idx.match(plain, ["a", "b"]) == {"b": 4}  # base-model calls: as before
    assert adapter_root(None) == ROOT and adapter_root("sql") != ROOT

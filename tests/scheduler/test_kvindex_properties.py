"""Property tests: the KV index against brute-force models under random event streams.

A toy engine per replica caches prefixes (LRU, tail blocks evicted first, as vLLM) and
publishes vLLM-shaped batches with content-defined engine hashes that differ from ours.
Delivery then drops, duplicates, delays and reorders batches. Two references:

* ``truth``: the prefixes each engine really holds;
* ``Model``: a brute-force index over token-prefix tuples that applies exactly the events
  the index was given (what an index *can* know), without hashes or bitmasks.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskplane.scheduler.hashing import chain_hashes
from taskplane.scheduler.kvindex import KVIndex

BS = 2
REPLICAS = ("r0", "r1", "r2")
Prefix = tuple[int, ...]


def eng_hash(salt: str, prefix: Prefix) -> Any:
    digest = hashlib.blake2b(repr((salt, prefix)).encode(), digest_size=8).digest()
    return digest if salt.endswith("1") else int.from_bytes(digest, "big")  # bytes or ints


class ToyEngine:
    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.cache: OrderedDict[Prefix, Any] = OrderedDict()  # prefix -> engine hash, LRU first
        self.batches: list[list[dict[str, Any]]] = []
        self.snapshots: list[frozenset[Prefix]] = []  # state after each batch

    def _publish(self, events: list[dict[str, Any]]) -> None:
        self.batches.append(events)
        self.snapshots.append(frozenset(self.cache))

    def serve(self, toks: list[int]) -> None:
        n = len(toks) // BS
        events: list[dict[str, Any]] = []
        new: list[Any] = []
        new_tokens: list[int] = []
        parent: Any = None
        prefixes = [tuple(toks[: (i + 1) * BS]) for i in range(n)]
        for i, p in enumerate(prefixes):
            if p in self.cache:
                if new:
                    events.append(self._stored(new, parent, new_tokens))
                    new, new_tokens = [], []
                parent = self.cache[p]
                continue
            h = eng_hash(self.name, p)
            if not new:
                parent = self.cache[prefixes[i - 1]] if i else None
            self.cache[p] = h
            new.append(h)
            new_tokens.extend(toks[i * BS : (i + 1) * BS])
        if new:
            events.append(self._stored(new, parent, new_tokens))
        for p in reversed(prefixes):  # the shared beginning is the most recently used
            self.cache.move_to_end(p)
        gone = []
        while len(self.cache) > self.capacity:
            _p, h = self.cache.popitem(last=False)
            gone.append(h)
        if gone:
            events.append({"type": "BlockRemoved", "block_hashes": gone, "medium": "GPU"})
        self._publish(events)

    @staticmethod
    def _stored(hashes: list[Any], parent: Any, toks: list[int]) -> dict[str, Any]:
        return {
            "type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": list(toks), "block_size": BS, "lora_id": None, "medium": "GPU",
        }

    def reset(self) -> None:
        self.cache.clear()
        self._publish([{"type": "AllBlocksCleared"}])


class Model:
    """Brute-force index: engine hash -> token prefix, per replica."""

    def __init__(self) -> None:
        self.learned: dict[str, dict[Any, Prefix]] = {r: {} for r in REPLICAS}

    def apply(self, replica: str, events: list[dict[str, Any]]) -> None:
        mine = self.learned[replica]
        for ev in events:
            if ev["type"] == "BlockStored":
                parent = ev["parent_block_hash"]
                prefix: Prefix | None = () if parent is None else mine.get(parent)
                if prefix is None:
                    continue
                for i, h in enumerate(ev["block_hashes"]):
                    prefix = prefix + tuple(ev["token_ids"][i * BS : (i + 1) * BS])
                    mine[h] = prefix
            elif ev["type"] == "BlockRemoved":
                for h in ev["block_hashes"]:
                    mine.pop(h, None)
            else:
                mine.clear()

    def clear(self, replica: str) -> None:
        self.learned[replica] = {}

    def held(self, replica: str) -> set[Prefix]:
        return set(self.learned[replica].values())


def leading(held: set[Prefix] | frozenset[Prefix], toks: list[int]) -> int:
    k = 0
    while (k + 1) * BS <= len(toks) and tuple(toks[: (k + 1) * BS]) in held:
        k += 1
    return k


def assert_held_mirrors_owners(idx: KVIndex) -> None:
    """Each replica's ``held`` set (what one-replica walks probe) is its bit in ``owners``."""
    for r in REPLICAS:
        rid = idx.slots.get(r)
        bit = 0 if rid is None else 1 << rid
        assert idx.precise.blocks_of(r) == {h for h, m in idx.precise.owners.items() if m & bit}


def index_matches(idx: KVIndex, toks: list[int], source: str = "precise") -> dict[str, int]:
    got = idx.match(chain_hashes(toks, BS), list(REPLICAS), source=source)
    return {r: got.get(r, 0) for r in REPLICAS}


# prompts: a few shared stems + random tails over a tiny alphabet, so prefixes overlap a lot
stems = st.sampled_from([[], [1, 1], [1, 1, 2, 2], [3, 0, 1, 2]])
tails = st.lists(st.integers(0, 3), max_size=8)
prompts = st.builds(lambda s, t: s + t, stems, tails)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("serve"), st.sampled_from(REPLICAS), prompts),
        st.tuples(st.just("reset"), st.sampled_from(REPLICAS), st.just([])),
    ),
    min_size=1,
    max_size=40,
)
probe_prompts = st.lists(prompts, min_size=1, max_size=6)
fault = st.sampled_from(["ok", "ok", "ok", "drop", "dup", "delay"])

# TASKPLANE_HYPOTHESIS_EXAMPLES=2000 for a longer soak
SETTINGS = settings(
    max_examples=int(os.environ.get("TASKPLANE_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def run_engines(operations: list[tuple[str, str, list[int]]], capacity: int) -> dict[str, ToyEngine]:
    engines = {r: ToyEngine(r, capacity) for r in REPLICAS}
    for op, r, toks in operations:
        if op == "serve":
            engines[r].serve(toks)
        else:
            engines[r].reset()
    return engines


@SETTINGS
@given(operations=ops, capacity=st.integers(4, 12), faults=st.lists(fault, min_size=80, max_size=80), probes=probe_prompts)
def test_unsequenced_delivery_matches_model(
    operations: list[tuple[str, str, list[int]]], capacity: int, faults: list[str], probes: list[list[int]]
) -> None:
    """Events applied as they come (dropped, duplicated, delayed): index == brute-force model."""
    engines = run_engines(operations, capacity)
    idx, model = KVIndex(), Model()
    k = 0
    for r, eng in engines.items():
        delayed: list[list[dict[str, Any]]] = []
        for batch in eng.batches:
            f = faults[k % len(faults)]
            k += 1
            if f == "drop":
                continue
            if f == "delay":
                delayed.append(batch)
                continue
            reps = 2 if f == "dup" else 1
            for _ in range(reps):
                idx.apply_events(r, batch)
                model.apply(r, batch)
        for batch in delayed:  # arrives late, out of order
            idx.apply_events(r, batch)
            model.apply(r, batch)
    assert_held_mirrors_owners(idx)
    for toks in probes:
        want = {r: leading(model.held(r), toks) for r in REPLICAS}
        assert index_matches(idx, toks) == want


@SETTINGS
@given(operations=ops, capacity=st.integers(4, 12), faults=st.lists(fault, min_size=80, max_size=80), probes=probe_prompts)
def test_sequenced_delivery_with_replay_converges_to_truth(
    operations: list[tuple[str, str, list[int]]], capacity: int, faults: list[str], probes: list[list[int]]
) -> None:
    """Batches with sequence numbers, missed then replayed, duplicated, reordered.

    At every step the index equals the engine's state after the last in-order batch; once
    every batch has arrived at least once it equals the engine's true state.
    """
    engines = run_engines(operations, capacity)
    idx = KVIndex()
    k = 0
    for r, eng in engines.items():
        missed: list[int] = []
        for seq, batch in enumerate(eng.batches):
            f = faults[k % len(faults)]
            k += 1
            if f in ("drop", "delay"):
                missed.append(seq)
                continue
            idx.apply_batch(r, seq, batch)
            if f == "dup" and seq > 0:
                idx.apply_batch(r, seq - 1, eng.batches[seq - 1])  # a stale replay
            applied = (idx.precise.expected_seq(r) or 0) - 1
            state = eng.snapshots[applied] if applied >= 0 else frozenset()
            for toks in probes:
                assert index_matches(idx, toks)[r] == leading(state, toks)
        for seq in missed:  # the replay
            idx.apply_batch(r, seq, eng.batches[seq])
        assert idx.precise.expected_seq(r) == len(eng.batches) or not eng.batches
    for toks in probes:
        want = {r: leading(frozenset(engines[r].cache), toks) for r in REPLICAS}
        assert index_matches(idx, toks) == want


@SETTINGS
@given(operations=ops, capacity=st.integers(4, 12), faults=st.lists(fault, min_size=80, max_size=80), probes=probe_prompts)
def test_missed_events_then_resync_never_overclaims(
    operations: list[tuple[str, str, list[int]]], capacity: int, faults: list[str], probes: list[list[int]]
) -> None:
    """Batches lost for good: the subscriber sees the gap and calls ``clear_replica``.

    The index then equals the model (which forgets at the same moments) and never claims a
    block the engine does not hold.
    """
    engines = run_engines(operations, capacity)
    idx, model = KVIndex(), Model()
    k = 0
    for r, eng in engines.items():
        gap = False
        for batch in eng.batches:
            f = faults[k % len(faults)]
            k += 1
            if f in ("drop", "delay"):
                gap = True
                continue
            if gap:  # the next batch after a loss reveals the gap: resync
                idx.clear_replica(r)
                model.clear(r)
                gap = False
            idx.apply_events(r, batch)
            model.apply(r, batch)
        if gap:
            idx.clear_replica(r)
            model.clear(r)
    assert_held_mirrors_owners(idx)
    for toks in probes:
        got = index_matches(idx, toks)
        for r in REPLICAS:
            assert got[r] == leading(model.held(r), toks)
            assert got[r] <= leading(frozenset(engines[r].cache), toks)


@SETTINGS
@given(operations=ops, capacity=st.integers(4, 12), probes=probe_prompts, leave=st.sampled_from(REPLICAS))
def test_replica_leaving_and_rejoining(
    operations: list[tuple[str, str, list[int]]], capacity: int, probes: list[list[int]], leave: str
) -> None:
    engines = run_engines(operations, capacity)
    idx = KVIndex()
    for r, eng in engines.items():
        for seq, batch in enumerate(eng.batches):
            idx.apply_batch(r, seq, batch)
    idx.remove_replica(leave)
    fresh = ToyEngine(leave, capacity)  # a new replica under the same name
    for toks in probes[:2]:
        fresh.serve(toks)
    for seq, batch in enumerate(fresh.batches):
        idx.apply_batch(leave, seq, batch)
    for toks in probes:
        got = index_matches(idx, toks)
        for r in REPLICAS:
            cache = fresh.cache if r == leave else engines[r].cache
            assert got[r] == leading(frozenset(cache), toks)

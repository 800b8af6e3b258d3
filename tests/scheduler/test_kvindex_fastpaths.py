"""The KV index's fast paths give the same answers as the general ones.

* ``apply_events`` reads ``kv_events`` structs directly: same index as the same events as
  msgpack-shaped dicts (through ``normalize_event``);
* ``match_ids`` walks a few ids one by one (one id alone too): same counts as the
  walk over the whole pool;
* single-owner blocks share one mask object per replica (``ReplicaSlots.bit``).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskplane.scheduler.hashing import chain_hashes
from taskplane.scheduler.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from taskplane.scheduler.kvindex import KVIndex, Source

# --------------------------------------------------------------------------- apply_events


def as_dict(ev: Any) -> dict[str, Any]:
    """The same event as the msgpack-shaped mapping ``normalize_event`` reads."""
    if isinstance(ev, BlockStored):
        return {"type": "BlockStored", "block_hashes": list(ev.block_hashes), "parent_block_hash": ev.parent_block_hash,
                "token_ids": list(ev.token_ids), "block_size": ev.block_size, "lora_id": ev.lora_id,
                "medium": ev.medium, "lora_name": ev.lora_name}
    if isinstance(ev, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(ev.block_hashes), "medium": ev.medium}
    return {"type": "AllBlocksCleared"}


def random_stream(rng: random.Random, names: list[str], bs: int, steps: int) -> list[tuple[str, list[Any]]]:
    """Batches of vLLM-like events: chains of shared and private prefixes, evictions, clears."""
    held: dict[str, list[list[int]]] = {n: [] for n in names}  # per replica: stored chains of engine hashes
    out: list[tuple[str, list[Any]]] = []
    for _ in range(steps):
        name = rng.choice(names)
        events: list[Any] = []
        r = rng.random()
        if r < 0.6:
            shared = rng.random() < 0.5
            n = rng.randint(1, 6)
            contents = [rng.randrange(4) if shared else rng.getrandbits(62) for _ in range(n)]
            toks = [c for c in contents for _ in range(bs)]
            if rng.random() < 0.3:
                toks = [rng.randrange(1000) for _ in toks]
            eng = [rng.getrandbits(63) for _ in range(n)]
            parent = None
            chains = held[name]
            if chains and rng.random() < 0.5:
                parent = rng.choice(chains)[-1]
            lora = 3 if rng.random() < 0.05 else None
            lora_name = "adapter" if rng.random() < 0.05 else None
            medium = rng.choice(["CPU", "gpu", None]) if rng.random() < 0.1 else "GPU"
            events.append(BlockStored(block_hashes=eng, parent_block_hash=parent, token_ids=toks, block_size=bs,
                                      lora_id=lora, medium=medium, lora_name=lora_name))
            chains.append(eng)
        elif r < 0.95 and held[name]:
            chain = rng.choice(held[name])
            k = rng.randint(1, len(chain))
            events.append(BlockRemoved(block_hashes=chain[-k:], medium="GPU" if rng.random() < 0.95 else "CPU"))
            del chain[-k:]
            held[name] = [c for c in held[name] if c]
        elif r >= 0.95:
            events.append(AllBlocksCleared())
            held[name] = []
        out.append((name, events))
    return out


def index_state(idx: KVIndex) -> tuple[Any, ...]:
    p = idx.precise
    return (dict(p.owners), {n: (dict(r.eng2ours), dict(r.extra)) for n, r in p._replicas.items()},
            p.unchained_blocks, set(p.publishers.block_sizes))


@pytest.mark.parametrize("seed", range(8))
def test_struct_events_build_the_same_index_as_dict_events(seed: int) -> None:
    rng = random.Random(seed)
    names = [f"r{i}" for i in range(rng.choice([3, 40, 200]))]
    stream = random_stream(rng, names, 4, 400)
    fast, slow = KVIndex(), KVIndex()
    for name, events in stream:
        fast.apply_events(name, events)
        slow.apply_events(name, [as_dict(e) for e in events])
    assert index_state(fast) == index_state(slow)
    assert fast.slots._ids == slow.slots._ids


def test_single_owner_masks_are_the_shared_bit_object() -> None:
    rng = random.Random(5)
    names = [f"r{i}" for i in range(70)]
    idx = KVIndex()
    for name, events in random_stream(rng, names, 2, 600):
        idx.apply_events(name, events)
    singles = 0
    for mask in idx.precise.owners.values():
        assert mask > 0
        if mask.bit_count() == 1:
            singles += 1
            assert mask is idx.slots.bit(mask.bit_length() - 1)
    assert singles > 0
    # the masks are exactly who holds what
    want: dict[int, int] = {}
    for name in names:
        for our in idx.precise.blocks_of(name):
            want[our] = want.get(our, 0) | (1 << idx.slots.ensure(name))
    assert idx.precise.owners == want


# --------------------------------------------------------------------------- match


def build_index(seed: int) -> tuple[KVIndex, list[str], list[list[int]]]:
    """An index over shared and private prefixes, some replicas out of sync or approximate."""
    rng = random.Random(seed)
    bs = 2
    names = [f"r{i}" for i in range(rng.choice([5, 70, 300]))]
    idx = KVIndex()
    prompts: list[list[int]] = []
    for _ in range(150):
        name = rng.choice(names)
        base = [rng.randrange(3) for _ in range(rng.randint(0, 4) * bs)]
        toks = base + [rng.randrange(50) for _ in range(rng.randint(0, 8) * bs)]
        hashes = chain_hashes(toks, bs)
        prompts.append(hashes)
        if rng.random() < 0.8:
            keep = rng.randint(0, len(toks) // bs) * bs  # the engine holds a prefix of it
            eng = [h ^ 0x5A5A for h in hashes[: keep // bs]]
            if eng:
                idx.apply_events(name, [BlockStored(block_hashes=eng, parent_block_hash=None,
                                                    token_ids=toks[:keep], block_size=bs)])
        else:
            idx.record_routing(name, hashes, rng.randint(1, 20))
    for name in rng.sample(names, max(1, len(names) // 10)):
        idx.clear_replica(name)  # out of sync: the approximate view counts too
    if rng.random() < 0.5:  # a replica whose events use another block size
        idx.apply_events(names[0], [BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[1, 2, 3, 4],
                                                block_size=4)])
    prompts.append([rng.getrandbits(64) for _ in range(3)])  # held by nobody
    return idx, names, prompts


@pytest.mark.parametrize("seed", range(6))
def test_few_ids_and_one_id_equal_the_pool_walk(seed: int) -> None:
    idx, names, prompts = build_index(seed)
    rng = random.Random(seed)
    pool = idx.slots.ids_of([*names, "unknown"])
    for hashes in prompts:
        for source in (Source.AUTO, "precise", "approximate"):
            for block_size, tokenized in ((2, True), (None, True), (4, True), (2, False)):
                kw = {"source": source, "block_size": block_size, "tokenized": tokenized}
                full = idx.match_ids(hashes, pool, **kw)
                for _ in range(3):
                    pick = rng.sample(range(len(pool)), rng.randint(1, 4))
                    few = idx.match_ids(hashes, pool[pick], **kw)
                    assert few.dtype == np.int64
                    assert few.tolist() == full[pick].tolist()
                for i in rng.sample(range(len(pool)), 3):  # one id: the single-replica walk
                    assert idx.match_ids(hashes, pool[[i]], **kw).tolist() == [full[i]]


@given(st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_pool_walk_equals_brute_force(data: st.DataObject) -> None:
    """The pool walk (AND masks, then one replica by identity) against per-replica sets."""
    n_rep = data.draw(st.sampled_from([2, 5, 90]))
    names = [f"r{i}" for i in range(n_rep)]
    idx = KVIndex()
    universe = list(range(1, 13))
    held: dict[str, set[int]] = {}
    for name in names:
        blocks = data.draw(st.sets(st.sampled_from(universe), max_size=12))
        held[name] = blocks
        if blocks:
            idx.record_routing(name, sorted(blocks), 100)
    hashes = data.draw(st.lists(st.sampled_from(universe), min_size=1, max_size=12))
    ids = idx.slots.ids_of(names)
    got = idx.match_ids(hashes, ids, source="approximate")
    for name, count in zip(names, got.tolist(), strict=True):
        want = 0
        while want < len(hashes) and hashes[want] in held[name]:
            want += 1
        assert count == want


@pytest.mark.parametrize("seed", range(4))
def test_auth_mask_mirrors_the_authoritative_array(seed: int) -> None:
    """``auth_mask`` (used to skip the approximate view) agrees with ``authoritative``."""
    rng = random.Random(seed)
    names = [f"r{i}" for i in range(30)]
    idx = KVIndex()
    stream = random_stream(rng, names, 2, 300)
    for step, (name, events) in enumerate(stream):
        r = rng.random()
        if r < 0.05:
            idx.clear_replica(name)
        elif r < 0.08:
            idx.remove_replica(name)
        elif r < 0.1:
            idx.record_routing(name, [step], 5)
        else:
            idx.apply_batch(name, idx.precise.expected_seq(name) or 0, events)
        ids = np.arange(idx.slots.capacity + 1)
        auth = idx.precise.publishers.authoritative(ids)
        mask = idx.precise.publishers.auth_mask
        assert [bool(mask >> int(i) & 1) for i in ids] == auth.tolist()

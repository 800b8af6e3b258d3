"""KVCache's lazy LRU queue against a plain reference model (an ordered dict of evictable
blocks), over random admissions and releases that fill the cache and force evictions and
queue compactions."""

from __future__ import annotations

import random
from collections import OrderedDict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskplane.scheduler.kv.events import BlockRemoved
from taskplane.sim.kvcache import Holding, KVCache


class _RefCache:
    """The textbook model: reference counts and an LRU ordered dict of unreferenced blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.free_uncached = num_blocks
        self.ref: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.removed: list[int] = []

    def match(self, hashes: list[int]) -> int:
        n = 0
        while n < len(hashes) and hashes[n] in self.ref:
            n += 1
        return n

    def acquire(self, hashes: list[int], hits: int) -> None:
        for h in hashes[:hits]:
            if self.ref[h] == 0:
                del self.evictable[h]
            self.ref[h] += 1

    def allocate(self, n: int) -> None:
        take = min(n, self.free_uncached)
        self.free_uncached -= take
        for _ in range(n - take):
            h, _none = self.evictable.popitem(last=False)
            del self.ref[h]
            self.removed.append(h)

    def store(self, hashes: list[int], out: list[int]) -> int:
        stored = 0
        for h in hashes:
            if h not in self.ref:
                self.ref[h] = 1
                out.append(h)
                stored += 1
        return stored

    def release(self, held: list[int], unhashed: int) -> None:
        for h in reversed(held):
            self.ref[h] -= 1
            if self.ref[h] == 0:
                self.evictable[h] = None
        self.free_uncached += unhashed


def test_lazy_lru_matches_reference_model() -> None:
    rng = random.Random(7)
    num_blocks = 600
    kv = KVCache(num_blocks, 16, removed_per_block=False)
    ref = _RefCache(num_blocks)
    prefixes = [[rng.getrandbits(60) for _ in range(rng.randrange(5, 60))] for _ in range(40)]
    running: list[tuple[Holding, int, list[int], list[int], int]] = []
    for _ in range(20_000):
        if running and (rng.random() < 0.5 or len(running) > 12):
            held, n_alloc, held_ref, _, n_stored = running.pop(rng.randrange(len(running)))
            kv.release(held, n_alloc - n_stored)
            ref.release(held_ref, n_alloc - n_stored)
        else:
            hashes = [*rng.choice(prefixes), *(rng.getrandbits(60) for _ in range(rng.randrange(0, 20)))]
            hits = kv.match(hashes, len(hashes))
            assert hits == ref.match(hashes)
            need = len(hashes) - hits
            if not kv.can_allocate(hashes, hits, need):
                continue
            held = kv.acquire(hashes[:hits])
            ref.acquire(hashes, hits)
            kv.allocate(need)
            ref.allocate(need)
            held_ref = list(hashes[:hits])
            n_stored = kv.store(hashes, hits, len(hashes), None, held)
            assert n_stored == ref.store(hashes[hits:], held_ref)
            running.append((held, need, held_ref, hashes, n_stored))
        assert kv.free_blocks() == ref.free_uncached + len(ref.evictable)
        assert kv.ref.keys() == ref.ref.keys()
    removed = [h for ev in kv.take_events() if isinstance(ev, BlockRemoved) for h in ev.block_hashes]
    assert removed == ref.removed and len(removed) > 1000


class _Model:
    """A KVCache and the reference model driven side by side; every query must agree."""

    def __init__(self, num_blocks: int, per_block: bool) -> None:
        self.kv = KVCache(num_blocks, 2, removed_per_block=per_block)
        self.ref = _RefCache(num_blocks)
        self.running: list[tuple[list[int], int, Holding, list[int], int, int]] = []
        self.admitted: list[list[int]] = []  # every request's blocks, for next turns

    def admit(self, hashes: list[int]) -> Holding | None:
        self.admitted.append(hashes)
        hits = self.kv.match(hashes, len(hashes))
        assert hits == self.ref.match(hashes)
        need = len(hashes) - hits + 1
        fits = self.kv.can_allocate(hashes, hits, need)
        pinned = sum(1 for h in hashes[:hits] if self.ref.ref[h] == 0)
        assert fits == (self.ref.free_uncached + len(self.ref.evictable) - pinned >= need)
        if fits:
            held = self.kv.acquire(hashes[:hits])
            self.ref.acquire(hashes, hits)
            self.kv.allocate(need)
            self.ref.allocate(need)
            self.running.append((hashes, hits, held, list(hashes[:hits]), need, 0))
            return held
        return None

    def store(self, i: int, n: int) -> None:
        hashes, done, held, held_ref, need, n_stored = self.running[i]
        end = min(len(hashes), done + n)
        got = self.kv.store(hashes, done, end, None, held)
        assert got == self.ref.store(hashes[done:end], held_ref)
        self.running[i] = (hashes, end, held, held_ref, need, n_stored + got)

    def release(self, i: int) -> None:
        _, _, held, held_ref, need, n_stored = self.running.pop(i)
        self.kv.release(held, need - n_stored)
        self.ref.release(held_ref, need - n_stored)

    def check(self) -> None:
        assert self.kv.free_blocks() == self.ref.free_uncached + len(self.ref.evictable)
        assert self.kv.ref.keys() == self.ref.ref.keys()
        removed = [h for ev in self.kv.take_events() if isinstance(ev, BlockRemoved) for h in ev.block_hashes]
        assert removed == self.ref.removed
        self.ref.removed = []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(4, 40), st.booleans())
def test_kvcache_matches_reference_model_on_random_sequences(data: st.DataObject, num_blocks: int,
                                                             per_block: bool) -> None:
    """Random admissions (shared prefixes, next turns of earlier requests, repeated hashes),
    chunked stores and releases in any order on a small cache: hits, free blocks, cached
    set and eviction order agree."""
    m = _Model(num_blocks, per_block)
    prefixes = data.draw(st.lists(st.lists(st.integers(0, 60), max_size=8), min_size=1, max_size=4))
    for _ in range(data.draw(st.integers(1, 80))):
        ops = ["admit", "next", "turn", "store", "release"] if m.running else ["admit"]
        op = data.draw(st.sampled_from(ops))
        if op == "turn":  # a request computes all its blocks and ends, then its next turn comes
            i = data.draw(st.integers(0, len(m.running) - 1))
            hashes = m.running[i][0]
            m.store(i, len(hashes))
            m.release(i)
            m.check()
            m.admit([*hashes, *data.draw(st.lists(st.integers(0, 60), max_size=3))])
        elif op in ("admit", "next"):
            tail = data.draw(st.lists(st.integers(0, 60), max_size=6))
            head = m.admitted if op == "next" else prefixes
            m.admit([*data.draw(st.sampled_from(head)), *tail])
        else:
            i = data.draw(st.integers(0, len(m.running) - 1))
            if op == "store":
                m.store(i, data.draw(st.integers(1, 4)))
            else:
                m.release(i)
        m.check()
    while m.running:
        m.release(0)
        m.check()


def test_next_turn_adopts_the_previous_turns_run() -> None:
    """A conversation's next turn takes over its previous turn's run (the blocks after the
    prefix another request holds) without looking them up; outcomes as the model's."""
    m = _Model(64, True)
    m.admit([1, 2, 3, 10, 11, 12, 13])  # holds the shared prefix 1, 2, 3 throughout
    m.store(0, 7)
    first = m.admit([1, 2, 3, 20, 21, 22, 23, 24])
    m.store(1, 8)
    m.release(1)
    m.check()
    second = m.admit([1, 2, 3, 20, 21, 22, 23, 24, 30, 31])
    assert first is not None and second is not None and second.stamp == first.stamp
    assert second.owned == 5 and second.counted == [1, 2, 3]
    m.store(1, 2)
    m.check()
    m.release(1)
    third = m.admit([1, 2, 3, 20, 21, 22, 23, 24, 30, 31, 40])  # the grown run, adopted again
    assert third is not None and third.stamp == first.stamp and third.owned == 7
    m.check()
    while m.running:
        m.release(0)
        m.check()

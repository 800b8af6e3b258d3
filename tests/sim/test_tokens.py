"""The cluster simulator's lazy token ids: slices equal the materialised list and hash
exactly as it does (BlockStored events)."""

from __future__ import annotations

import random

from taskplane.scheduler.hashing import RepeatedBlocks, chain_hashes


def test_slices_equal_the_list_and_hash_the_same() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        nb, bs = rng.randrange(0, 40), rng.choice([1, 2, 16])
        contents = [rng.getrandbits(63) - (1 << 62) for _ in range(nb)]
        n = nb * bs - rng.randrange(0, bs) if nb else 0
        toks, full = RepeatedBlocks(contents, bs, n), [c for c in contents for _ in range(bs)][:n]
        a, b = rng.randrange(0, n + 2), rng.randrange(0, n + 2)
        assert list(toks[a:b]) == full[a:b] and list(toks[a:b:2]) == full[a:b:2]
        assert [toks[i] for i in range(-n, n)] == full[-n:] + full
        a, b = rng.randrange(0, nb + 1) * bs, rng.randrange(0, nb + 1) * bs
        sl = toks[a:b]
        assert list(sl) == full[a:b] and bool(sl) == bool(full[a:b])
        assert chain_hashes(sl, bs) == chain_hashes(full[a:b], bs)


def test_index_past_the_end_raises_although_contents_run_on() -> None:
    toks = RepeatedBlocks([1, 2, 3], 2, 3)
    assert list(toks) == [1, 1, 2] and toks[-1] == 2
    for i in (3, -4):
        try:
            toks[i]
        except IndexError:
            continue
        raise AssertionError(i)

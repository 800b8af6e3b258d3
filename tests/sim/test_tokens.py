"""The cluster simulator's lazy token ids: slices equal the materialised list and hash
exactly as it does (BlockStored events)."""

from __future__ import annotations

import random

from taskplane.scheduler.hashing import chain_hashes
from taskplane.sim.cluster import _Tokens


def test_slices_equal_the_list_and_hash_the_same() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        nb, bs = rng.randrange(0, 40), rng.choice([1, 2, 16])
        contents = [rng.getrandbits(63) - (1 << 62) for _ in range(nb)]
        n = nb * bs - rng.randrange(0, bs) if nb else 0
        toks, full = _Tokens(contents, bs, n), [c for c in contents for _ in range(bs)][:n]
        a, b = rng.randrange(0, n + 2), rng.randrange(0, n + 2)
        assert list(toks[a:b]) == full[a:b]
        a, b = rng.randrange(0, nb + 1) * bs, rng.randrange(0, nb + 1) * bs
        sl = toks[a:b]
        assert list(sl) == full[a:b] and bool(sl) == bool(full[a:b])
        assert chain_hashes(sl, bs) == chain_hashes(full[a:b], bs)

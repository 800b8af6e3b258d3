"""The simulator's lazily repeated blocks hash (through the scheduler's ``BlockContents``
protocol) exactly as their tokens packed one by one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tp_block_hashes import reference_chain

from taskplane.scheduler.hashing import MASK64, ROOT, chain_hashes
from taskplane.sim import tokens as sim_tokens
from taskplane.sim.tokens import RepeatedBlocks


def test_repeated_block_hash_is_shared_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    hashing = sim_tokens
    monkeypatch.setattr(hashing, "_MEMOS", {})
    monkeypatch.setattr(hashing, "MEMO_GENERATION", 2)
    h = hashing.repeated_block_hash(ROOT, 5, 4)
    assert h == reference_chain([5] * 4, 4)[0]
    assert chain_hashes(RepeatedBlocks([5], 4, 4), 4)[0] is h  # the index's re-hash is the simulator's object
    assert chain_hashes([5] * 4, 4)[0] == h  # a real token list: packed and hashed, equal
    for token in range(6):  # two generations of 2: 5 drops out, then is recomputed equal
        hashing.repeated_block_hash(ROOT, 100 + token, 4)
    assert hashing.repeated_block_hash(ROOT, 5, 4) == h
    assert len(hashing._MEMOS[4].young) + len(hashing._MEMOS[4].old) <= 4


@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6),
    st.sampled_from([1, 2, 3, 4, 16]),
    st.integers(0, 15),
    st.integers(0, MASK64),
    st.sampled_from([0, 1, 2]),
)
@settings(max_examples=300, deadline=None)
def test_repeated_blocks_hash_as_their_tokens(
    contents: list[int], bs: int, cut: int, parent: int, extra: int
) -> None:
    # mixed ids (some equal), a partial last block, ids past its length, any parent; also
    # hashed at other block sizes (materialised)
    ids = contents + contents[:1]
    n = max(0, len(ids) * bs - cut % bs)
    seq = RepeatedBlocks(ids + [1] * extra, bs, n)
    toks = list(seq)
    assert toks == [c for c in ids for _ in range(bs)][:n] and len(seq) == n
    for size in {bs, 1, 2, 5}:
        assert chain_hashes(seq, size, parent) == chain_hashes(toks, size, parent) == reference_chain(toks, size, parent)

"""``chain_hashes`` gives the same hashes for any shape of the same tokens — lists, tuples,
arrays — as packing every token (real replicas and the gateway depend on these values)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tp_block_hashes import reference_chain

from taskplane.scheduler.hashing import MASK64, chain_hashes


@st.composite
def token_lists(draw: Any) -> tuple[list[int], int]:
    bs = draw(st.sampled_from([1, 2, 3, 4, 16]))
    toks: list[int] = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["repeated", "almost", "mixed"]))
        value = draw(st.integers(-(2**63), 2**63 - 1))
        if kind == "repeated":
            toks += [value] * bs
        elif kind == "almost":  # one token differs: must not be taken for a repeated block
            block = [value] * bs
            block[draw(st.integers(0, bs - 1))] = draw(st.integers(0, 1000))
            toks += block
        else:
            toks += draw(st.lists(st.integers(0, 200_000), min_size=bs, max_size=bs))
    toks += draw(st.lists(st.integers(0, 9), max_size=bs - 1))  # a trailing partial block
    return toks, bs


@given(token_lists(), st.integers(0, MASK64))
@settings(max_examples=300, deadline=None)
def test_chain_hashes_equal_packing_every_token(case: tuple[list[int], int], parent: int) -> None:
    toks, bs = case
    want = reference_chain(toks, bs, parent)
    assert chain_hashes(toks, bs, parent) == want
    assert chain_hashes(tuple(toks), bs, parent) == want
    assert chain_hashes(np.array(toks, dtype=np.int64), bs, parent) == want


def test_chain_hashes_pinned_values() -> None:
    # values computed by the original implementation: real replicas depend on them
    assert chain_hashes([7] * 4 + [1, 2, 3, 4], 4) == reference_chain([7] * 4 + [1, 2, 3, 4], 4)
    assert chain_hashes(list(range(32)), 16)[-1] == reference_chain(list(range(32)), 16)[-1]


def test_chain_hashes_out_of_range_token_still_raises() -> None:
    with pytest.raises(struct.error):
        chain_hashes([2**64] * 4, 4)
    with pytest.raises(struct.error):
        chain_hashes([1, 2, 3, 2**64], 4)

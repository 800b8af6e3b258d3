"""Chained block hashes: deterministic, prefix-sensitive, full blocks only."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from taskplane.scheduler.hashing import ROOT, chain_hashes, text_chain_hashes


def test_full_blocks_only_and_chaining() -> None:
    toks = list(range(50))
    h = chain_hashes(toks, 16)
    assert len(h) == 3  # the trailing 2 tokens are not a full block
    assert chain_hashes(toks[:48], 16) == h
    # continuing a chain from a parent equals hashing the whole sequence
    assert chain_hashes(toks[16:48], 16, parent=h[0]) == h[1:]
    assert all(0 <= x < 2**64 for x in h)


def test_equal_block_different_prefix_differs() -> None:
    a = chain_hashes([1] * 16 + [2] * 16, 16)
    b = chain_hashes([3] * 16 + [2] * 16, 16)
    assert a[1] != b[1]  # same second block, different parent
    assert chain_hashes([2] * 16, 16)[0] != a[1]


def test_inputs_and_parent_default() -> None:
    toks = list(range(64))
    assert chain_hashes(toks, 16) == chain_hashes(np.array(toks), 16) == chain_hashes(tuple(toks), 16)
    assert chain_hashes(toks, 16, parent=ROOT) == chain_hashes(toks, 16)
    assert chain_hashes([], 16) == []
    with pytest.raises(ValueError):
        chain_hashes(toks, 0)


def test_deterministic_across_processes() -> None:
    code = "from taskplane.scheduler.hashing import chain_hashes; print(chain_hashes(list(range(64)), 16))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={"PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1
    assert outs.pop().strip() == str(chain_hashes(list(range(64)), 16))


def test_text_hashes_are_chained_and_separate_space() -> None:
    h = text_chain_hashes("a" * 130, 64)
    assert len(h) == 2
    assert text_chain_hashes("b" * 64 + "a" * 64, 64)[1] != h[1]

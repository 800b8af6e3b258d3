"""Builders shared by the scheduler tests."""

from __future__ import annotations

from typing import Any

from taskplane.scheduler.hashing import chain_hashes
from taskplane.scheduler.types import CallRequest, ReplicaView

BS = 16


def replica(name: str, **kw: Any) -> ReplicaView:
    base: dict[str, Any] = {
        "model": "m",
        "gpu": "h100",
        "cost_per_hour_usd": 2.5,
        "kv_blocks_total": 1000,
        "kv_blocks_free": 1000,
        "block_size": BS,
        "has_kv_events": True,
    }
    base.update(kw)
    return ReplicaView(name=name, **base)


def fleet(n: int, **kw: Any) -> list[ReplicaView]:
    return [replica(f"r{i}", **kw) for i in range(n)]


def tokens(prefix: int, n_blocks: int, start: int = 0) -> list[int]:
    """Deterministic tokens: ``prefix`` selects a family; equal families share prefixes."""
    return [prefix * 100_000 + start + i for i in range(n_blocks * BS)]


def request(toks: list[int] | None = None, **kw: Any) -> CallRequest:
    toks = toks if toks is not None else tokens(0, 4)
    base: dict[str, Any] = {
        "model": "m",
        "prompt_tokens": len(toks),
        "max_tokens": 64,
        "block_hashes": chain_hashes(toks, BS),
        "block_size": BS,
    }
    base.update(kw)
    return CallRequest(**base)


def stored(block_hashes: list[Any], parent: Any, toks: list[int], bs: int = BS) -> dict[str, Any]:
    """A BlockStored event as vLLM's msgpack map."""
    return {
        "type": "BlockStored",
        "block_hashes": block_hashes,
        "parent_block_hash": parent,
        "token_ids": toks,
        "block_size": bs,
        "lora_id": None,
        "medium": "GPU",
    }


def removed(block_hashes: list[Any]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": block_hashes, "medium": "GPU"}


def engine_store_events(toks: list[int], *, salt: int = 7, bs: int = BS) -> tuple[list[dict[str, Any]], list[int]]:
    """One BlockStored for the full blocks of ``toks`` with engine hashes unlike ours."""
    n = len(toks) // bs
    eng = [hash((salt, tuple(toks[: (i + 1) * bs]))) & ((1 << 63) - 1) for i in range(n)]
    return [stored(eng, None, toks[: n * bs], bs)], eng

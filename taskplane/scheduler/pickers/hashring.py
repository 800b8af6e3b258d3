"""Consistent hashing of sessions onto replicas (a hash ring with virtual nodes)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework import CycleState, Picker, param, register


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(slots=True)
class ConsistentHashParams:
    virtual_nodes: int = param(100, "points per replica on the ring (more = more even spread)")

    def validate(self) -> None:
        if self.virtual_nodes < 1:
            raise ValueError("virtual_nodes must be >= 1")


@register("consistent-hash")
class ConsistentHashPicker(Picker):
    """Maps the session id (else the task id) to the first replica clockwise on a hash ring.

    Only the sessions of a departed replica move; filtered-out replicas are skipped by
    walking further round the ring. Calls without a session are spread by the seeded
    generator.
    """

    Params = ConsistentHashParams

    def __init__(self, params: ConsistentHashParams, **kw: object) -> None:
        super().__init__(params, **kw)  # type: ignore[arg-type]
        self._points: dict[str, np.ndarray] = {}  # replica -> its ring points
        self._members: frozenset[str] = frozenset()
        self._ring = np.zeros(0, dtype=np.uint64)
        self._owner: list[str] = []

    def _points_of(self, name: str) -> np.ndarray:
        pts = self._points.get(name)
        if pts is None:
            pts = np.array(
                [_h64(f"{name}#{i}".encode()) for i in range(self.params.virtual_nodes)], dtype=np.uint64
            )
            self._points[name] = pts
        return pts

    def _sync(self, names: list[str]) -> None:
        members = frozenset(names)
        if members == self._members:
            return
        for gone in self._members - members:
            self._points.pop(gone, None)
        ordered = sorted(members)
        pts = np.concatenate([self._points_of(n) for n in ordered]) if ordered else np.zeros(0, np.uint64)
        owners = np.repeat(np.arange(len(ordered)), self.params.virtual_nodes)
        order = np.argsort(pts, kind="stable")
        self._ring = pts[order]
        self._owner = [ordered[i] for i in owners[order]]
        self._members = members

    def pick(self, state: CycleState, totals: np.ndarray) -> int:
        req = state.request
        key = req.session_id or req.task_id
        if key is None:
            return int(state.rng.integers(len(state.sel)))
        names = state.names
        self._sync(names)
        cand = {names[i]: pos for pos, i in enumerate(state.sel)}
        start = int(np.searchsorted(self._ring, np.uint64(_h64(key.encode())), side="left"))
        n = len(self._owner)
        for step in range(n):
            owner = self._owner[(start + step) % n]
            pos = cand.get(owner)
            if pos is not None:
                return pos
        return int(state.rng.integers(len(state.sel)))

"""Consistent hashing of sessions onto replicas (a hash ring with virtual nodes)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from taskplane.scheduler.framework.plugin import Picker, param
from taskplane.scheduler.framework.registry import register
from taskplane.scheduler.framework.state import CycleState


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
        self._members: list[str] = []  # sorted replica names on the ring
        self._member_set: frozenset[str] = frozenset()
        self._ring = np.zeros(0, dtype=np.uint64)
        self._ring_member = np.zeros(0, dtype=np.intp)  # ring point -> index into _members
        self._table_key: object = None
        self._member_pos = np.zeros(0, dtype=np.intp)  # member -> pool position

    def _points_of(self, name: str) -> np.ndarray:
        pts = self._points.get(name)
        if pts is None:
            pts = np.array(
                [_h64(f"{name}#{i}".encode()) for i in range(self.params.virtual_nodes)], dtype=np.uint64
            )
            self._points[name] = pts
        return pts

    def _sync(self, state: CycleState) -> None:
        key = (state.table.key, state.model)
        if key == self._table_key:
            return
        names = state.names
        members = frozenset(names)
        if members != self._member_set:
            for gone in self._member_set - members:
                self._points.pop(gone, None)
            ordered = sorted(members)
            pts = np.concatenate([self._points_of(n) for n in ordered]) if ordered else np.zeros(0, np.uint64)
            owners = np.repeat(np.arange(len(ordered)), self.params.virtual_nodes)
            order = np.argsort(pts, kind="stable")
            self._ring = pts[order]
            self._ring_member = owners[order]
            self._members = ordered
            self._member_set = members
        pos = {n: p for p, n in enumerate(names)}
        self._member_pos = np.array([pos[m] for m in self._members], dtype=np.intp)
        self._table_key = key

    def pick(self, state: CycleState, totals: np.ndarray) -> int:
        req = state.request
        key = req.session_id or req.task_id
        if key is None:
            return int(state.rng.integers(len(state.sel)))
        self._sync(state)
        sel_pos = np.full(state.n, -1, dtype=np.intp)
        sel_pos[state.sel] = np.arange(len(state.sel))
        start = int(np.searchsorted(self._ring, np.uint64(_h64(key.encode())), side="left"))
        n = len(self._ring)
        ring_member = self._ring_member
        member_pos = self._member_pos
        for step in range(n):
            p = sel_pos[member_pos[ring_member[(start + step) % n]]]
            if p >= 0:
                return int(p)
        return int(state.rng.integers(len(state.sel)))

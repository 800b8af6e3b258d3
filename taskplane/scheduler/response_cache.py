"""Exact response cache for deterministic calls ("avoid the work").

A call with temperature 0 (greedy decoding) against the same model with the same messages
and sampling parameters produces the same completion, so a repeat can be answered without
touching a replica. Anything else (temperature unset — OpenAI's default is 1 — or above 0,
``n`` > 1, a seed-less sampler, logprobs) is never cached. Bounded LRU, keyed by a digest of
the canonical JSON of the fields that influence the output.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge

CACHE_LOOKUPS = Counter(
    "taskplane_response_cache_lookups_total", "exact response cache lookups", ["result"]
)
CACHE_SIZE = Gauge("taskplane_response_cache_entries", "entries in the exact response cache")

#: Body fields that do not change what the model generates.
_IGNORED = frozenset({"stream", "stream_options", "user", "metadata", "store", "service_tier"})


def is_deterministic(body: Mapping[str, Any]) -> bool:
    """Whether the request body asks for greedy, single-choice decoding."""
    temp = body.get("temperature")
    if temp is None or not isinstance(temp, int | float) or temp != 0:
        return False
    if body.get("n", 1) not in (1, None):
        return False
    return not (body.get("logprobs") or body.get("top_logprobs"))


def cache_key(model: str, body: Mapping[str, Any]) -> str | None:
    """Digest of everything that determines the output; None when the call is not cacheable."""
    if not is_deterministic(body):
        return None
    material = {k: v for k, v in body.items() if k not in _IGNORED}
    material["model"] = model
    try:
        canonical = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return None
    return hashlib.blake2b(canonical.encode("utf-8"), digest_size=16).hexdigest()


class ResponseCache:
    """Bounded LRU of response payloads by :func:`cache_key` digest."""

    def __init__(self, max_entries: int = 1024) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        self.max_entries = max_entries
        self._data: OrderedDict[str, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def key(self, model: str, body: Mapping[str, Any]) -> str | None:
        return cache_key(model, body) if self.enabled else None

    def get(self, key: str | None) -> Any | None:
        if key is None or not self.enabled:
            return None
        value = self._data.get(key)
        if value is None:
            self.misses += 1
            CACHE_LOOKUPS.labels("miss").inc()
            return None
        self._data.move_to_end(key)
        self.hits += 1
        CACHE_LOOKUPS.labels("hit").inc()
        return value

    def put(self, key: str | None, value: Any) -> None:
        """Store a *successful, complete* response (the caller never stores errors)."""
        if key is None or not self.enabled or value is None:
            return
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)
        CACHE_SIZE.set(len(self._data))

    def clear(self) -> None:
        self._data.clear()
        CACHE_SIZE.set(0)

"""Recent demand per base model: the calls of each model the scheduler saw lately.

Deciding whether a replica should swap from one base model to another needs each model's
demand now, which a live control plane knows from the calls it decides: this counts the
distinct calls (by call id; a call decided again after a wait counts once) of each model
in a sliding window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class ModelDemand:
    """Distinct calls per model in the last ``window_s`` seconds, and when each model was last called."""

    window_s: float = 60.0
    _calls: deque[tuple[float, str, str]] = field(default_factory=deque)  # (time, model, call id)
    _ids: set[str] = field(default_factory=set)
    _count: dict[str, int] = field(default_factory=dict)
    last_call: dict[str, float] = field(default_factory=dict)

    def saw(self, model: str, call_id: str | None, now_s: float) -> None:
        """A call of ``model`` is being decided at ``now_s``."""
        self.last_call[model] = now_s
        self._expire(now_s)
        if call_id is not None and call_id in self._ids:
            return
        key = call_id if call_id is not None else f"\0{len(self._calls)}:{now_s}"
        self._ids.add(key)
        self._calls.append((now_s, model, key))
        self._count[model] = self._count.get(model, 0) + 1

    def calls(self, model: str, now_s: float) -> int:
        """Distinct calls of ``model`` in the window ending at ``now_s``."""
        self._expire(now_s)
        return self._count.get(model, 0)

    def _expire(self, now_s: float) -> None:
        calls, since = self._calls, now_s - self.window_s
        while calls and calls[0][0] < since:
            _, model, key = calls.popleft()
            self._ids.discard(key)
            self._count[model] -= 1

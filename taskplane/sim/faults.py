"""Fault injection for the simulated replica, set at start (``--fault``) or at run time
(``POST /admin/faults``).

- ``crash``: the process exits at once (at start: on the first inference request);
  ``crash_after=N``: on the N-th inference request from now.
- ``hang``: inference requests and ``/health`` are accepted but never answered.
- ``stall``: inference requests are accepted but never answered while ``/health`` still
  answers (an engine stuck on its work behind a live HTTP server): only the calls show it.
- ``slow=F``: every engine step takes F times longer.
- ``error_rate=P``: a fraction P of inference requests fail with HTTP 500.
- ``drop_events`` / ``drop_events=P``: KV-event batches are not sent on the PUB socket
  (with probability P, default 1) but stay in the replay buffer, so subscribers see a
  sequence gap and must replay.
- ``restart_empty``: an engine restart: in-flight requests fail, the cache is emptied,
  the event sequence starts again at 0 with ``AllBlocksCleared``.
- ``clear``: remove every fault.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(slots=True)
class Faults:
    hang: bool = False
    stall: bool = False
    slow: float = 1.0
    error_rate: float = 0.0
    drop_events: float = 0.0
    crash_after: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


ACTIONS = ("crash", "restart_empty", "clear")


def parse_fault_spec(spec: str) -> dict[str, Any]:
    """``"slow=10"`` -> ``{"slow": 10.0}``; ``"hang"`` -> ``{"hang": True}``."""
    key, sep, raw = spec.strip().partition("=")
    key = key.strip().replace("-", "_")
    if not sep:
        return {key: True}
    raw = raw.strip()
    if raw.lower() in ("true", "on", "yes"):
        return {key: True}
    if raw.lower() in ("false", "off", "no"):
        return {key: False}
    try:
        return {key: float(raw) if "." in raw or "e" in raw.lower() else int(raw)}
    except ValueError:
        raise ValueError(f"bad fault {spec!r}: value must be a number or true/false") from None


def apply_updates(faults: Faults, updates: dict[str, Any]) -> list[str]:
    """Apply fault settings; return the one-shot actions requested (crash, restart_empty).

    Raises ValueError naming the bad key or value.
    """
    actions: list[str] = []
    if updates.get("clear"):
        fresh = Faults()
        for name in Faults.__slots__:
            setattr(faults, name, getattr(fresh, name))
    for key, value in updates.items():
        if key in ACTIONS:
            if value:
                actions.append(key)
            continue
        if key in ("hang", "stall"):
            setattr(faults, key, bool(value))
        elif key == "slow":
            v = 1.0 if value is None or value is False else (1.0 if value is True else float(value))
            if v <= 0:
                raise ValueError("slow must be a positive factor")
            faults.slow = v
        elif key == "error_rate":
            v = 0.0 if value is None or value is False else float(value)
            if not 0.0 <= v <= 1.0:
                raise ValueError("error_rate must be within 0..1")
            faults.error_rate = v
        elif key == "drop_events":
            v = 1.0 if value is True else (0.0 if value is None or value is False else float(value))
            if not 0.0 <= v <= 1.0:
                raise ValueError("drop_events must be true/false or a probability 0..1")
            faults.drop_events = v
        elif key == "crash_after":
            if value is None or value is False:
                faults.crash_after = None
            else:
                n = int(value)
                if n < 1:
                    raise ValueError("crash_after must be >= 1")
                faults.crash_after = n
        else:
            raise ValueError(
                f"unknown fault {key!r}; known: hang, stall, slow, error_rate, drop_events, crash_after, "
                "crash, restart_empty, clear"
            )
    return actions

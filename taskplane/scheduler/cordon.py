"""Replicas that take no new session, and the sessions that still go there.

On scale-in the autoscaler cordons its victim (and, a little earlier, pre-drains the
replica it expects to pick next): the replica keeps serving the sessions whose KV it
holds, so none of them re-prefills, but it takes no new session, so it empties. A call
may go to a cordoned replica only when that replica is its session's home, the one it was
last placed on. The simulator's fleet and the live gateway keep the same rule here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from taskplane.scheduler.types import CallRequest


def session_key(req: CallRequest) -> str:
    """What a call's KV belongs to: its session, else its task (plain calls have neither)."""
    return req.session_id or req.task_id or ""


class SessionHomes:
    """The replica each recent session was last placed on (bounded: the oldest go first)."""

    def __init__(self, max_sessions: int = 100_000) -> None:
        self.max_sessions = max_sessions
        self._home: OrderedDict[str, str] = OrderedDict()

    def home(self, req: CallRequest) -> str | None:
        return self.of(session_key(req))

    def of(self, session: str) -> str | None:
        """The replica ``session`` (a session id, else a task id) was last placed on."""
        return self._home.get(session) if session else None

    def forget_replica(self, replica: str) -> None:
        """The replica is gone (stopped, failed): its sessions have no home until placed again."""
        for key in [k for k, r in self._home.items() if r == replica]:
            del self._home[key]

    def closed_to(self, req: CallRequest, cordoned: Collection[str]) -> tuple[str, ...]:
        """The cordoned replicas this call may not go to: all but its session's home."""
        if not cordoned:
            return ()
        mine = self.home(req)
        return tuple(sorted(n for n in cordoned if n != mine))

    def avoid(self, req: CallRequest, cordoned: Collection[str]) -> None:
        """Add the replicas closed to this call to its ``avoid_replicas``."""
        closed = self.closed_to(req, cordoned)
        if closed:
            req.avoid_replicas = (*req.avoid_replicas, *(n for n in closed if n not in req.avoid_replicas))

    def placed(self, req: CallRequest, replica: str) -> None:
        key = session_key(req)
        if not key:
            return
        self._home[key] = replica
        self._home.move_to_end(key)
        while len(self._home) > self.max_sessions:
            self._home.popitem(last=False)

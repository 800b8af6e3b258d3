"""Envoy's timers for one inference call, nested so that they never race.

Three timers guard a call on Envoy, and each has one job:

- the per-try idle timeout (the retry policy's ``per_try_idle_timeout``): a replica that
  sends nothing for ``limits.request_timeout_s`` on one try is given up, and Envoy moves
  to the next endpoint of the picker's list (the Python proxy's read timeout);
- the picker's message timeout (ext_proc ``message_timeout``): how long one exchange with
  the picker may take; the request body's includes the admission hold (a queued call waits
  up to the request timeout) and a pool's ``hold_when_empty_s``;
- the stream idle timeout (the route's ``idle_timeout``): a backstop only, so it must be
  longer than everything the other two allow together: the picker's hold, then every
  try with the back-off between tries. Were it shorter (it used to equal the per-try
  limit), it could answer the client while a retry was already on its way to a replica:
  the answer named one try less than the replicas saw, and the client never got the
  fallback's answer.

While bytes flow none of them fires: both idle timers restart on every chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskplane.config import GatewayConfig

#: Room the picker gets beyond its longest hold (its own work, the journal's fsync).
PICKER_GRACE_S = 5.0
#: Room the stream timer leaves beyond every other timer (scheduling jitter on a loaded host).
STREAM_MARGIN_S = 1.0
#: Envoy's retry back-off between tries (its defaults, written out so the sum below is exact).
BACKOFF_BASE_S = 0.025
BACKOFF_MAX_S = 0.25


@dataclass(frozen=True, slots=True)
class CallTimers:
    """The three limits of an inference call on Envoy, from the gateway config."""

    per_try_idle_s: float  # one try may stay silent this long
    tries: int  # the most tries Envoy makes (the choice and its fallbacks)
    picker_s: float  # one exchange with the picker, admission hold included

    @classmethod
    def of(cls, config: GatewayConfig, tries: int) -> CallTimers:
        """The timers of ``config``: ``tries`` is the retry policy's ``num_retries`` + 1."""
        limit = config.limits.request_timeout_s
        empty_hold = max((p.hold_when_empty_s for p in config.pools), default=0.0)
        return cls(per_try_idle_s=limit, tries=tries, picker_s=empty_hold + limit + PICKER_GRACE_S)

    @property
    def tries_s(self) -> float:
        """Every try silent to its limit, with the longest back-off between them."""
        return self.tries * self.per_try_idle_s + (self.tries - 1) * BACKOFF_MAX_S

    @property
    def stream_idle_s(self) -> float:
        """Longer than the picker's hold and every try together: the stream timer never
        cuts in while a try or the picker may still answer."""
        return self.picker_s + self.tries_s + STREAM_MARGIN_S

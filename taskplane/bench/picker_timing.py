"""The picker's burst timing (``taskplane.epp.timing``) for one load phase, from ``/metrics``.

A phase's figures are the difference of two readings of each histogram (before and after
the phase), with p50 / p99 interpolated inside the buckets: good to a bucket's width
(x1.6), which is enough to tell where tens of milliseconds go.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from taskplane.epp.timing import PHASES

DECISION = "taskplane_epp_decision_seconds"
PHASE = "taskplane_epp_call_phase_seconds"
LOOP_LAG = "taskplane_epp_loop_lag_seconds"
REPLY_WAIT = "taskplane_epp_reply_wait_seconds"
ROUTE = "taskplane_epp_route_seconds"
GC = "taskplane_epp_gc_seconds"


@dataclass
class Reading:
    """One histogram's count, sum and cumulative buckets (upper bound -> count)."""

    count: float = 0.0
    sum: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)

    def minus(self, earlier: Reading) -> Reading:
        return Reading(self.count - earlier.count, self.sum - earlier.sum,
                       {le: n - earlier.buckets.get(le, 0.0) for le, n in self.buckets.items()})

    def quantile(self, q: float) -> float | None:
        """The q-quantile in seconds, linear inside its bucket (None: no observation)."""
        if self.count <= 0:
            return None
        rank, low, below = q * self.count, 0.0, 0.0
        for le in sorted(self.buckets):
            n = self.buckets[le]
            if n >= rank:
                if le == float("inf"):
                    return low
                return low + (le - low) * ((rank - below) / (n - below) if n > below else 1.0)
            low, below = le, n
        return low


def parse(text: str) -> dict[str, Reading]:
    """The timing histograms of a ``/metrics`` page: ``decision``, ``route``, ``reply_wait``,
    ``loop_lag``, each call phase by its name, and ``gc0``..``gc2`` (Python's collections
    by generation; absent ones are left out)."""
    out: dict[str, Reading] = {}
    names = {DECISION: "decision", ROUTE: "route", REPLY_WAIT: "reply_wait", LOOP_LAG: "loop_lag"}
    for fam in text_string_to_metric_families(text):
        if fam.name not in names and fam.name not in (PHASE, GC):
            continue
        for s in fam.samples:
            if fam.name == GC:
                key = f"gc{s.labels.get('generation', '')}"
            else:
                key = s.labels.get("phase", "") if fam.name == PHASE else names[fam.name]
                if key not in PHASES and key not in names.values():
                    continue
            r = out.setdefault(key, Reading())
            if s.name.endswith("_count"):
                r.count = s.value
            elif s.name.endswith("_sum"):
                r.sum = s.value
            elif s.name.endswith("_bucket"):
                r.buckets[float(s.labels["le"])] = s.value
    return out


async def read(gateway_url: str) -> dict[str, Reading]:
    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
        return parse((await client.get(f"{gateway_url}/metrics")).text)


def phase_figures(before: dict[str, Reading], after: dict[str, Reading]) -> dict[str, dict[str, float]]:
    """Per histogram, the phase's count and its p50 / p99 / mean in milliseconds."""
    out: dict[str, dict[str, float]] = {}
    for key, r in after.items():
        d = r.minus(before.get(key, Reading()))
        if d.count <= 0:
            continue
        fig = {"n": d.count, "mean": round(d.sum / d.count * 1000.0, 2)}
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            v = d.quantile(q)
            if v is not None:
                fig[name] = round(v * 1000.0, 2)
        out[key] = fig
    return out

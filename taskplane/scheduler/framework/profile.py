"""The two steps every scheduling profile runs (the decode pipeline and the prefill
profile alike): narrow the candidates by the filters, then sum the weighted scorers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from taskplane.scheduler.framework.plugin import Filter, Scorer
from taskplane.scheduler.framework.state import CycleState


def run_filters(filters: Sequence[Filter], state: CycleState, *, metrics: bool) -> str | None:
    """Narrow ``state`` by each filter in turn; the name of the one that left no candidate, else None."""
    for f in filters:
        keep = f.filter(state)
        if keep is None:
            continue
        dropped = state.narrow(keep)
        if dropped:
            if metrics:
                f.filtered.inc(dropped)
            if len(state.sel) == 0:
                return f.name
    return None


def weighted_scores(scorers: Sequence[Scorer], state: CycleState) -> tuple[np.ndarray, list[tuple[Scorer, np.ndarray]]]:
    """Each candidate's weighted total, and every scorer's own scores (for explanations and metrics)."""
    totals: np.ndarray | None = None
    scored: list[tuple[Scorer, np.ndarray]] = []
    for scorer in scorers:
        s = scorer.score(state)
        weight = scorer.weight
        if weight:
            term = s if weight == 1.0 else weight * s  # 1.0 * s is s: skip the product
            if totals is None:
                totals = term + 0.0  # a copy (``term`` may be shared), as adding it to zeros gives
            else:
                totals += term
        scored.append((scorer, s))
    return (np.zeros(len(state.sel)) if totals is None else totals), scored

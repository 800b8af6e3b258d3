"""Workflow context (axis 7): how much a call matters to the task it belongs to.

A call late in an expensive task carries the money already spent: losing it (shed, timed
out, sent to a cold replica) throws that away, while a fresh cheap call loses little. The
value and the protection level derived here order the admission queue's tie-breaks and
victims, and steer the ``workflow-context`` scorer.
"""

from __future__ import annotations

from taskplane.scheduler.types import CallRequest


def progress(req: CallRequest) -> float:
    """Fraction of the task done, 0..1, from step and steps remaining (0 when unknown)."""
    if req.step is None or req.steps_remaining is None:
        return 0.0
    done = req.step
    total = req.step + req.steps_remaining
    return done / total if total > 0 else 0.0


def task_value(req: CallRequest) -> float:
    """Money at risk if this call fails: sunk cost, weighted up as the task nears its end."""
    return max(req.sunk_cost_usd, 0.0) * (1.0 + progress(req))


def protection(req: CallRequest, reference_sunk_usd: float = 0.10) -> float:
    """0..1: how strongly to protect this call (1 = late step of an expensive task)."""
    sunk = max(req.sunk_cost_usd, 0.0)
    if sunk <= 0.0:
        return 0.0
    cost_factor = sunk / (sunk + max(reference_sunk_usd, 1e-12))
    return cost_factor * (0.5 + 0.5 * progress(req))


def call_budget_ms(req: CallRequest) -> float | None:
    """This call's share of the task's remaining deadline budget.

    ``budget_ms`` is the time left for the whole task, which must also cover the steps
    still to come; spreading it evenly over this step and the ``steps_remaining`` after it
    gives the time this call may take without starving its successors. None without a
    budget. (Admission's "unmeetable" test uses the whole budget: a call that cannot make
    the task's deadline even alone is hopeless, one that eats more than its share is not.)
    """
    if req.budget_ms is None:
        return None
    if req.steps_remaining is None or req.steps_remaining <= 0:
        return req.budget_ms
    return req.budget_ms / (req.steps_remaining + 1)

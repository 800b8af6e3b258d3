"""What a live autoscaler loop reads, shared by the dev stack's and the Kubernetes one:
the gateway's view of its replicas (``/admin/replicas``), the demand only the gateway sees
(calls it shed or holds, from its ``/metrics``), the workflows in flight and their agents'
history (Postgres), and where the fleet-hours rows go."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import structlog

from taskplane.autoscale.fleet import FleetBook
from taskplane.autoscale.types import PREFILL_WEIGHT, AgentProfile, Phase, WorkflowSignal

log = structlog.get_logger("taskplane.autoscale")


async def gateway_replicas(client: httpx.AsyncClient, gateway_url: str) -> dict[str, dict[str, Any]]:
    """The gateway's replicas by name (healthy, calls in flight, queue, KV usage); {} if it is away."""
    try:
        resp = await client.get(f"{gateway_url}/admin/replicas", timeout=2.0)
        return {r["name"]: r for r in resp.json().get("replicas", [])}
    except (httpx.HTTPError, ValueError):
        return {}


@dataclass(slots=True)
class GatewayDemand:
    shed_total: float  # calls shed (429 overloaded) so far: demand it had no room for
    queued: int  # calls held by admission control now


async def gateway_demand(client: httpx.AsyncClient, gateway_url: str, model: str) -> GatewayDemand | None:
    """What the gateway's metrics say about demand the replicas do not see: sheds and held calls."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = (await client.get(f"{gateway_url}/metrics", timeout=2.0)).text
    except httpx.HTTPError:
        return None
    out = GatewayDemand(shed_total=0.0, queued=0)
    for fam in text_string_to_metric_families(text):
        if fam.name == "taskplane_gateway_requests":
            out.shed_total += sum(s.value for s in fam.samples
                                  if s.name.endswith("_total") and s.labels.get("outcome") == "overloaded")
        elif fam.name == "taskplane_gateway_queued_calls" and fam.samples:
            out.queued += int(sum(s.value for s in fam.samples if s.labels.get("model") == model))
    return out


class ShedWindow:
    """Calls shed over the last ``window_s`` (the counter's rise): demand with no room, counted as queued."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._hist: list[tuple[float, float]] = []

    def recent(self, now: float, demand: GatewayDemand | None) -> int:
        if demand is not None:
            self._hist.append((now, demand.shed_total))
            self._hist[:] = [(t, v) for t, v in self._hist if t >= now - self.window_s]
        return int(self._hist[-1][1] - self._hist[0][1]) if self._hist else 0


def history_signals(hist: list[dict[str, Any]], live: list[dict[str, Any]]
                    ) -> tuple[list[WorkflowSignal], dict[str, AgentProfile]]:
    """Workflow signals and agent profiles from Postgres rows (store.fleet_hours.task_history):
    an agent's steps per task, work per step and seconds per step from its finished tasks;
    a live workflow's steps remaining = its agent's mean steps - the calls it has done."""
    profiles: dict[str, AgentProfile] = {}
    steps: dict[str, float] = {}
    for h in hist:
        calls = float(h["calls"] or 0)
        if calls <= 0:
            continue
        steps[h["agent"]] = calls / max(float(h["tasks"]), 1.0)
        profiles[h["agent"]] = AgentProfile(work_per_step=float(h["work"]) / calls,
                                            seconds_per_step=max(0.1, float(h["seconds"]) / calls),
                                            steps_per_task=steps[h["agent"]])
    mean_steps = sum(steps.values()) / len(steps) if steps else 5.0
    workflows = [WorkflowSignal(
        task_id=w["task_id"], agent=w["agent"] or "agent",
        steps_remaining=max(1, round(steps.get(w["agent"], mean_steps) - int(w["calls_done"] or 0))),
        budget_s=None if w["budget_s"] is None else float(w["budget_s"]), replica=w["replica"],
        context_tokens=int(w["context_tokens"] or 0)) for w in live]
    return workflows, profiles



async def workflows_in_flight(engine: Any) -> tuple[list[WorkflowSignal], dict[str, AgentProfile]]:
    from taskplane.store.fleet_hours import task_history

    try:
        return history_signals(*await task_history(engine, prefill_weight=PREFILL_WEIGHT))
    except Exception as exc:  # Postgres away: plan on live load alone this tick
        log.warning("task_history_failed", error=str(exc))
        return [], {}


def attach_live_sessions(book: FleetBook, workflows: list[WorkflowSignal]) -> None:
    """Give each replica of ``book`` the sessions still alive on it and their context tokens
    (what a scale-in there would re-prefill). A sleeping replica holds no KV: none count."""
    tokens: dict[str, int] = {}
    sessions: dict[str, int] = {}
    for w in workflows:
        if w.replica is not None:
            tokens[w.replica] = tokens.get(w.replica, 0) + w.context_tokens
            sessions[w.replica] = sessions.get(w.replica, 0) + 1
    for name, r in book.replicas.items():
        if r.phase is Phase.SLEEPING:
            r.live_session_tokens, r.live_sessions = 0, 0
        else:
            r.live_session_tokens, r.live_sessions = tokens.get(name, 0), sessions.get(name, 0)


async def write_fleet_hours(engine: Any, book: FleetBook, epoch: datetime) -> None:
    from taskplane.store.fleet_hours import write_intervals

    try:
        await write_intervals(engine, book.all_intervals(), epoch)
    except Exception as exc:  # Postgres away for a moment: the next tick writes them again
        log.warning("fleet_hours_write_failed", error=str(exc))

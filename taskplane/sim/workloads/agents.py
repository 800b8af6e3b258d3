"""Synthetic agent tasks: multi-step sessions with growing context and tool-call gaps.

Each task belongs to an agent type (its shared system prompt, its step count range,
its tools, its deadline) and a tenant (its priority). Step ``i`` sends the whole context
so far (system prompt, user goal, every earlier reply and tool result) and waits for a
tool before the next step; tool gaps and tool-result sizes are lognormal per tool.
Arrivals are Poisson, optionally in phases of different rates (``phases``: pairs of
duration in seconds and rate multiplier) to create overload. Seeded: the same
configuration and seed give the same tasks.

The default constants are illustrative, chosen to look like coding / triage / research
agents (SWE-agent style loops of 10-60 steps with test runs of seconds; short triage
chains; research with slow web tools), not measured from a production trace.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from taskplane.sim.workloads.base import CallSpec, TaskSpec, Workload


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    gap_median_s: float  # median wall time of the tool call
    gap_sigma: float = 0.8  # lognormal shape of the gap
    result_median_tokens: int = 300  # median size of what the tool returns into the context
    result_sigma: float = 0.9


@dataclass(frozen=True, slots=True)
class AgentType:
    name: str
    system_tokens: int
    steps_min: int
    steps_max: int
    tools: tuple[ToolSpec, ...]
    output_median_tokens: int = 150
    goal_median_tokens: int = 200
    deadline_s: float | None = None
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    priority: str = "standard"
    weight: float = 1.0


DEFAULT_AGENTS: tuple[AgentType, ...] = (
    AgentType("coder", system_tokens=2400, steps_min=8, steps_max=60, output_median_tokens=180,
              deadline_s=900.0, weight=2.0, tools=(
                  ToolSpec("read_file", 0.3, 0.6, 600, 0.8), ToolSpec("grep", 0.5, 0.6, 250, 0.9),
                  ToolSpec("edit_file", 0.2, 0.5, 80, 0.5), ToolSpec("run_tests", 8.0, 0.7, 500, 1.0))),
    AgentType("triage", system_tokens=1200, steps_min=3, steps_max=12, output_median_tokens=120,
              deadline_s=120.0, weight=2.0, tools=(
                  ToolSpec("fetch_ticket", 0.8, 0.5, 400, 0.7), ToolSpec("search_kb", 1.5, 0.6, 700, 0.8))),
    AgentType("research", system_tokens=900, steps_min=5, steps_max=30, output_median_tokens=250,
              deadline_s=600.0, weight=1.0, tools=(
                  ToolSpec("web_search", 2.0, 0.6, 800, 0.7), ToolSpec("browse", 3.5, 0.8, 1500, 0.9))),
)

DEFAULT_TENANTS: tuple[TenantSpec, ...] = (
    TenantSpec("acme", "interactive", 2.0),
    TenantSpec("globex", "standard", 2.0),
    TenantSpec("initech", "batch", 1.0),
)


@dataclass(slots=True)
class AgentWorkloadConfig:
    n_tasks: int = 200
    arrival_rate_per_s: float = 0.5
    seed: int = 1
    model: str = "llama-3.1-8b"
    agents: tuple[AgentType, ...] = DEFAULT_AGENTS
    tenants: tuple[TenantSpec, ...] = DEFAULT_TENANTS
    phases: list[tuple[float, float]] = field(default_factory=list)  # (duration_s, rate multiplier)
    max_context_tokens: int = 32_000  # a task stops growing its context here (the model's window)
    deadline_scale: float = 1.0  # multiplies every agent's deadline
    block_size: int = 256  # KV block of the simulation (coarser than vLLM's 16 for speed; see docs/sim.md)


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def _pick(rng: random.Random, items: tuple, weights: list[float]):  # type: ignore[no-untyped-def]
    return rng.choices(items, weights=weights, k=1)[0]


def _rate_at(cfg: AgentWorkloadConfig, t: float) -> float:
    if not cfg.phases:
        return cfg.arrival_rate_per_s
    span = sum(d for d, _ in cfg.phases)
    x = t % span if span > 0 else 0.0
    for d, mult in cfg.phases:
        if x < d:
            return cfg.arrival_rate_per_s * mult
        x -= d
    return cfg.arrival_rate_per_s


def generate_agent_tasks(cfg: AgentWorkloadConfig | None = None) -> Workload:
    """The tasks of an agent workload (closed loop)."""
    cfg = cfg or AgentWorkloadConfig()
    rng = random.Random(cfg.seed)
    aw = [a.weight for a in cfg.agents]
    tw = [t.weight for t in cfg.tenants]
    keys = {a.name: 1_000_003 * (i + 1) for i, a in enumerate(cfg.agents)}
    tasks: list[TaskSpec] = []
    t = 0.0
    for i in range(cfg.n_tasks):
        t += rng.expovariate(max(_rate_at(cfg, t), 1e-9))
        agent: AgentType = _pick(rng, cfg.agents, aw)
        tenant: TenantSpec = _pick(rng, cfg.tenants, tw)
        steps = rng.randint(agent.steps_min, agent.steps_max)
        ctx = agent.system_tokens
        calls: list[CallSpec] = []
        prev_tool: str | None = None
        gap = 0.0
        for s in range(steps):
            if s == 0:
                append = max(8, int(_lognormal(rng, agent.goal_median_tokens, 0.6)))
            else:
                tool = rng.choice(agent.tools)
                prev_tool = tool.name
                gap = _lognormal(rng, tool.gap_median_s, tool.gap_sigma)
                append = max(8, int(_lognormal(rng, tool.result_median_tokens, tool.result_sigma)))
            out = max(4, int(_lognormal(rng, agent.output_median_tokens, 0.7)))
            if ctx + append + out > cfg.max_context_tokens:
                break
            calls.append(CallSpec(output_tokens=out, append_tokens=append, gap_s=gap if s else 0.0,
                                  tool=prev_tool if s else None))
            ctx += append + out
        deadline = agent.deadline_s * cfg.deadline_scale if agent.deadline_s is not None else None
        tasks.append(TaskSpec(
            task_id=f"task-{cfg.seed}-{i}", arrival_s=t, calls=calls, agent=agent.name, tenant=tenant.name,
            priority=tenant.priority, deadline_s=deadline, model=cfg.model, prefix_key=keys[agent.name],
            prefix_tokens=agent.system_tokens, seed=rng.getrandbits(62),
        ))
    return Workload(name="agents", tasks=tasks, block_size=cfg.block_size,
                    meta={"n_tasks": cfg.n_tasks, "rate": cfg.arrival_rate_per_s, "seed": cfg.seed})

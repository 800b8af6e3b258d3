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
from bisect import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TypeVar

from taskplane.sim.workloads.base import CallSpec, TaskSpec, Workload

T = TypeVar("T")


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


def _picker(rng: random.Random, items: tuple[T, ...], weights: list[float]) -> Callable[[], T]:
    """``lambda: rng.choices(items, weights)[0]`` with the cumulative weights summed once.

    The same draw as ``choices`` (it bisects one ``random()`` into the cumulative weights),
    without rebuilding them on every call: workload generation is on the scale bench's
    serial path."""
    cum = list(accumulate(weights))
    total, hi, rand = cum[-1] + 0.0, len(cum) - 1, rng.random
    if len(cum) != len(items) or not 0.0 < total < math.inf:
        raise ValueError("weights must match the items and sum to a positive finite total")
    return lambda: items[bisect(cum, rand() * total, 0, hi)]


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
    pick_agent = _picker(rng, cfg.agents, [a.weight for a in cfg.agents])
    pick_tenant = _picker(rng, cfg.tenants, [t.weight for t in cfg.tenants])
    keys = {a.name: 1_000_003 * (i + 1) for i, a in enumerate(cfg.agents)}
    tasks: list[TaskSpec] = []
    t = 0.0
    for i in range(cfg.n_tasks):
        t += rng.expovariate(max(_rate_at(cfg, t), 1e-9))
        agent = pick_agent()
        tenant = pick_tenant()
        steps = rng.randint(agent.steps_min, agent.steps_max)
        deadline = agent.deadline_s * cfg.deadline_scale if agent.deadline_s is not None else None
        tasks.append(TaskSpec(
            task_id=f"task-{cfg.seed}-{i}", arrival_s=t, calls=_agent_calls(rng, cfg, agent, steps),
            agent=agent.name, tenant=tenant.name, priority=tenant.priority, deadline_s=deadline, model=cfg.model,
            prefix_key=keys[agent.name], prefix_tokens=agent.system_tokens, seed=rng.getrandbits(62),
            expected_steps=(agent.steps_min + agent.steps_max) // 2,  # the author's one figure per agent
        ))
    return Workload(name="agents", tasks=tasks, block_size=cfg.block_size,
                    meta={"n_tasks": cfg.n_tasks, "rate": cfg.arrival_rate_per_s, "seed": cfg.seed})


def _agent_calls(rng: random.Random, cfg: AgentWorkloadConfig, agent: AgentType, steps: int) -> list[CallSpec]:
    """Up to ``steps`` calls of one task, until its context would pass the model's window.

    Lognormal draws are ``median * exp(gauss(0, sigma))``, written inline with bound
    methods: this loop runs ~2M times for the scale bench's 100k tasks."""
    gauss, choice, exp = rng.gauss, rng.choice, math.exp
    tools, limit = agent.tools, cfg.max_context_tokens
    out_median = agent.output_median_tokens
    ctx = agent.system_tokens
    calls: list[CallSpec] = []
    for s in range(steps):
        if s == 0:
            append = max(8, int(agent.goal_median_tokens * exp(gauss(0.0, 0.6))))
            gap, tool_name = 0.0, None
        else:
            tool = choice(tools)
            tool_name = tool.name
            gap = tool.gap_median_s * exp(gauss(0.0, tool.gap_sigma))
            append = max(8, int(tool.result_median_tokens * exp(gauss(0.0, tool.result_sigma))))
        out = max(4, int(out_median * exp(gauss(0.0, 0.7))))
        if ctx + append + out > limit:
            break
        calls.append(CallSpec(out, append, gap, tool_name))
        ctx += append + out
    return calls

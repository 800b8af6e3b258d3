"""The "agents-vllm" workload: the agent-task generator of the simulator, scaled to a
tiny model on a few CPU cores, with every prompt written out as real text.

Why the same generator: the real-engine bench should test what the simulated bench
tests (multi-step sessions with a shared system prompt per agent type, growing context,
tool-call gaps, three tenants of different priorities, deadlines, bursts of arrivals),
only small enough that real vLLM on two cores serves it in about a minute.

Why scripted replies: the model has random weights, so its output is noise bytes that do
not survive a UTF-8 round trip. Each call's reply is therefore appended to the context as
a fixed text of the generated length, as an agent appends the model's reply. Every router
then receives byte-identical requests, and call ``i+1``'s prompt starts with call ``i``'s
whole prompt, as in a real agent loop.

Tokens are bytes (taskplane's tokenizer, which the replicas' tokenizer mirrors), so the
lengths below are prompt tokens as vLLM counts them.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from taskplane.engines.tokenize import render_chat
from taskplane.sim.workloads.agents import (
    AgentType,
    AgentWorkloadConfig,
    TenantSpec,
    ToolSpec,
    generate_agent_tasks,
)

WORKLOAD_NAME = "agents-vllm"

#: agent types scaled to the tiny model: about a tenth of the simulator's token counts and
#: steps, short replies (decode time does not depend on placement; prefill does), deadlines
#: that a fleet of two CPU replicas meets when calls stay short.
CPU_AGENTS: tuple[AgentType, ...] = (
    AgentType("coder", system_tokens=1536, steps_min=5, steps_max=12, output_median_tokens=10,
              goal_median_tokens=300, deadline_s=45.0, weight=2.0, tools=(
                  ToolSpec("read_file", 0.4, 0.5, 450, 0.6), ToolSpec("grep", 0.5, 0.5, 220, 0.6),
                  ToolSpec("run_tests", 2.5, 0.5, 380, 0.6))),
    AgentType("triage", system_tokens=1024, steps_min=3, steps_max=6, output_median_tokens=8,
              goal_median_tokens=250, deadline_s=15.0, weight=2.0, tools=(
                  ToolSpec("fetch_ticket", 0.6, 0.5, 300, 0.6), ToolSpec("search_kb", 1.0, 0.5, 450, 0.6))),
    AgentType("research", system_tokens=768, steps_min=4, steps_max=9, output_median_tokens=12,
              goal_median_tokens=200, deadline_s=35.0, weight=1.0, tools=(
                  ToolSpec("web_search", 1.2, 0.5, 500, 0.6), ToolSpec("browse", 2.0, 0.6, 900, 0.7))),
)

CPU_TENANTS: tuple[TenantSpec, ...] = (
    TenantSpec("acme", "interactive", 2.0),
    TenantSpec("globex", "standard", 2.0),
    TenantSpec("initech", "batch", 1.0),
)

DEFAULT_TASKS = 40
DEFAULT_RATE_PER_S = 0.7
#: arrival phases (seconds, rate multiplier): a calm start, a burst well above what two
#: replicas serve, then a lull in which the backlog drains
DEFAULT_PHASES: tuple[tuple[float, float], ...] = ((15.0, 0.6), (20.0, 2.0), (15.0, 0.5))


@dataclass(frozen=True, slots=True)
class RealCall:
    """One chat call: the messages sent, how many tokens to generate, and what precedes it."""

    step: int
    messages: tuple[dict[str, str], ...]
    max_tokens: int
    gap_s: float  # tool time after the previous call finished (0 for the first call)
    tool: str | None

    @property
    def prompt(self) -> str:
        return render_chat(self.messages)


@dataclass(frozen=True, slots=True)
class RealTask:
    task_id: str
    agent: str
    tenant: str
    priority: str
    arrival_s: float
    deadline_s: float | None
    calls: tuple[RealCall, ...]


@dataclass(slots=True)
class RealWorkload:
    name: str
    seed: int
    tasks: list[RealTask]
    meta: dict[str, object] = field(default_factory=dict)

    @property
    def num_calls(self) -> int:
        return sum(len(t.calls) for t in self.tasks)

    def calls(self) -> Iterator[tuple[RealTask, RealCall]]:
        for t in self.tasks:
            for c in t.calls:
                yield t, c

    def prompts(self) -> list[bytes]:
        """Every call's prompt as the replicas' tokens (bytes), in arrival order (the task's
        arrival, then its step): what :func:`taskplane.bench.ceiling.prompt_hit_ceiling` reads."""
        ordered = sorted(self.calls(), key=lambda tc: (tc[0].arrival_s, tc[1].step))
        return [call.prompt.encode("utf-8") for _, call in ordered]


_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789     .,;:-_()"


def text_of(key: str, n_tokens: int) -> str:
    """A deterministic ASCII text of exactly ``n_tokens`` bytes, unique to ``key``.

    Random characters (not repeated words) so that no two 128-token blocks of different
    keys are equal: a cache hit is always a real shared prefix.
    """
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    return "".join(rng.choices(_ALPHABET, k=n_tokens))


def agent_config(
    n_tasks: int, seed: int, *, rate_per_s: float, phases: tuple[tuple[float, float], ...],
    max_context_tokens: int,
) -> AgentWorkloadConfig:
    return AgentWorkloadConfig(
        n_tasks=n_tasks, arrival_rate_per_s=rate_per_s, seed=seed, model="tiny-llama",
        agents=CPU_AGENTS, tenants=CPU_TENANTS, phases=list(phases),
        max_context_tokens=max_context_tokens, block_size=128,
    )


def real_agent_workload(
    n_tasks: int = DEFAULT_TASKS,
    seed: int = 1,
    *,
    rate_per_s: float = DEFAULT_RATE_PER_S,
    time_scale: float = 1.0,
    phases: tuple[tuple[float, float], ...] = DEFAULT_PHASES,
    max_context_tokens: int = 4000,
) -> RealWorkload:
    """The tasks, each call's messages written out. ``time_scale`` stretches (>1) or
    compresses (<1) arrival times, as in the simulated bench; tool gaps are kept."""
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
    cfg = agent_config(n_tasks, seed, rate_per_s=rate_per_s, phases=phases,
                       max_context_tokens=max_context_tokens)
    spec = generate_agent_tasks(cfg)
    overhead = 32  # template bytes per message (role tags, newlines), so the cap holds
    tasks: list[RealTask] = []
    for t in spec.tasks:
        system = text_of(f"system:{t.agent}", t.prefix_tokens)
        messages: list[dict[str, str]] = [{"role": "system", "content": system}]
        calls: list[RealCall] = []
        for step, c in enumerate(t.calls):
            if step == 0:
                messages.append({"role": "user", "content": "Goal: " + text_of(f"{t.task_id}:goal", c.append_tokens)})
            else:
                body = text_of(f"{t.task_id}:tool:{step}", c.append_tokens)
                messages.append({"role": "user", "content": f"Result of {c.tool}: {body}"})
            if len(render_chat(messages)) + c.output_tokens + overhead > max_context_tokens:
                break
            calls.append(RealCall(step=step, messages=tuple(dict(m) for m in messages),
                                  max_tokens=c.output_tokens, gap_s=round(c.gap_s, 3), tool=c.tool))
            reply = text_of(f"{t.task_id}:reply:{step}", c.output_tokens)
            messages.append({"role": "assistant", "content": reply})
        if not calls:
            continue
        tasks.append(RealTask(
            task_id=t.task_id, agent=t.agent, tenant=t.tenant, priority=t.priority,
            arrival_s=round(t.arrival_s * time_scale, 3), deadline_s=t.deadline_s, calls=tuple(calls),
        ))
    return RealWorkload(
        name=WORKLOAD_NAME, seed=seed, tasks=tasks,
        meta={"tasks": len(tasks), "calls": sum(len(t.calls) for t in tasks), "rate_per_s": rate_per_s,
              "time_scale": time_scale, "phases": [list(p) for p in phases],
              "max_context_tokens": max_context_tokens,
              "agents": ", ".join(f"{a.name} ({a.steps_min}-{a.steps_max} steps, deadline {a.deadline_s:.0f} s)"
                                  for a in CPU_AGENTS),
              "tenants": ", ".join(f"{x.name} ({x.priority})" for x in CPU_TENANTS)},
    )

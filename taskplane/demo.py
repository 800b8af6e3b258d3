"""``taskplane demo``: bring the dev stack up, run a fleet of example agent tasks across
three tenants (some with deadlines too tight to meet, and one replica crashing mid-run),
then print the cost report of the run.
"""

from __future__ import annotations

import asyncio
import importlib
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from taskplane.dev import stack

console = Console()


@dataclass(frozen=True)
class FleetEntry:
    """One kind of task in the demo fleet."""

    target: str  # module:agent
    args: tuple[Any, ...]
    tenant: str
    priority: str
    deadline_s: float


FLEET: list[FleetEntry] = [
    FleetEntry("examples.research:research_agent", ("How do KV caches change LLM serving costs?",), "acme", "interactive", 90),
    FleetEntry("examples.coding:coding_agent", ("fix the off-by-one in paginate()", 6), "globex", "standard", 120),
    FleetEntry("examples.triage:triage_agent", ("Customer reports login loop after password reset",), "initech", "standard", 90),
    FleetEntry("examples.research:research_agent", ("Summarise the state of speculative decoding",), "acme", "critical", 60),
    FleetEntry("examples.coding:coding_agent", ("add retries to the HTTP client", 4), "initech", "batch", 120),
    FleetEntry("examples.triage:triage_agent", ("Invoice totals differ between PDF and dashboard",), "globex", "interactive", 90),
]
#: Every TIGHT_EVERY-th task gets a deadline too short to finish: it must end failed-deadline.
TIGHT_EVERY = 6
TIGHT_DEADLINE_S = 0.6


def _resolve(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _run_tag() -> str:
    """Marks this run's prompts, so that a second demo on a running stack does real work
    rather than being answered by the gateway's response cache (temperature-0 calls)."""
    return datetime.now(UTC).strftime("demo run %H:%M:%S")


def _tagged(args: tuple[Any, ...], tag: str) -> tuple[Any, ...]:
    """The task's first argument (its question, ticket or job) with the run's tag."""
    return (f"{args[0]} ({tag})", *args[1:]) if args and isinstance(args[0], str) else args


def _crashed(state_dir: Path, name: str) -> bool:
    """Whether the replica the fault was set on really went down (it only crashes once it
    has had enough inference requests)."""
    parts = stack.status(state_dir)["parts"]
    return any(p["name"] == name and not p["alive"] for p in parts)


async def _clear_faults(info: dict[str, Any], name: str) -> None:
    """Take back a crash that never fired, so the replica does not die later."""
    for replica in info.get("replicas") or []:
        if replica["name"] == name:
            async with httpx.AsyncClient(timeout=5) as client:
                (await client.post(f"{replica['url']}/admin/faults", json={"crash_after": None})).raise_for_status()


async def _inject_replica_crash(info: dict[str, Any]) -> str | None:
    """Make the first replica crash on its third inference request from now."""
    replicas = info.get("replicas") or []
    if info.get("engine") != "sim" or not replicas:
        return None
    target = replicas[0]
    async with httpx.AsyncClient(timeout=5) as client:
        r = await client.post(f"{target['url']}/admin/faults", json={"crash_after": 3})
        r.raise_for_status()
    return str(target["name"])


async def _fleet(info: dict[str, Any], n_tasks: int, seed: int = 7) -> tuple[int, int, str | None]:
    from taskplane.sdk import connect, submit

    rng = random.Random(seed)
    tag = _run_tag()
    client = await connect(info["temporal_address"])
    handles = []
    crashed: str | None = None
    ok = failed = 0
    with Progress(TextColumn("[bold]agent tasks"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[detail]}"),
                  TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task("tasks", total=n_tasks, detail="")
        for i in range(n_tasks):
            entry = FLEET[i % len(FLEET)]
            deadline = TIGHT_DEADLINE_S if (i % TIGHT_EVERY) == TIGHT_EVERY - 1 else entry.deadline_s
            handles.append(await submit(_resolve(entry.target), *_tagged(entry.args, tag), tenant=entry.tenant, priority=entry.priority,
                                        deadline=timedelta(seconds=deadline), client=client))
            if i == n_tasks // 3:
                crashed = await _inject_replica_crash(info)
            await asyncio.sleep(rng.uniform(0.02, 0.15))

        async def wait(h: Any) -> bool:
            return bool((await h.outcome()).status == "succeeded")

        for fut in asyncio.as_completed([wait(h) for h in handles]):
            if await fut:
                ok += 1
            else:
                failed += 1
            progress.update(bar, advance=1, detail=f"[green]{ok} ok[/] [red]{failed} failed[/]")
    return ok, failed, crashed


def run_demo(state_dir: Path, *, tasks: int = 24, engine: str = "sim", base_port: int = 18200) -> None:
    """The README's first command ends here, with the cost report."""
    info = stack.up(state_dir, engine=engine, base_port=base_port)
    stack.print_status(info)
    started = datetime.now(UTC) - timedelta(seconds=1)
    console.rule("[bold]running the agent fleet")
    ok, failed, crashed = asyncio.run(_fleet(info, tasks))
    if crashed and _crashed(state_dir, crashed):
        console.print(f"[yellow]injected fault:[/] {crashed} crashed mid-run; its calls were retried on other replicas")
        stack.restart_part(state_dir, crashed)
    elif crashed:
        asyncio.run(_clear_faults(info, crashed))
        console.print(f"[yellow]injected fault:[/] {crashed} was set to crash but got too few calls to do so")
    console.print(f"{ok} tasks succeeded, {failed} failed (tight deadlines fail on purpose)")
    console.rule("[bold]cost report for this run")
    from taskplane.reports.command import ReportOptions, run_report

    run_report(ReportOptions(since=started.isoformat(), fmt="table", database_url=info["database_url"],
                             state_dir=state_dir))
    console.print(f"Temporal UI: {info.get('temporal_ui_url')}  (try the filter: TaskplaneTenant = 'acme')")
    console.print(f"The stack stays up for the UI and `taskplane report`; stop it with "
                  f"`taskplane dev down --state-dir {state_dir}`.")

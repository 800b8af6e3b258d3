"""``taskplane run MODULE:AGENT --arg ...``: run one agent task and print its result and cost.

The command brings its own worker for the agent's module (in-process, on a private task
queue), so the code that runs is the code on disk now - no worker restart needed after
an edit - while Temporal, the gateway and Postgres are the shared ones (flags,
``TASKPLANE_*`` variables, else the dev stack).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console

from taskplane.errors import UserError
from taskplane.sdk.agent import Agent

err = Console(stderr=True)


def load_agent(target: str) -> Agent:
    """``package.module:agent_name`` -> the Agent, with a one-line error when it is not one."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UserError(f"{target!r}: expected MODULE:AGENT, e.g. examples.research:research_agent")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to you are importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"cannot import {module_name!r}: {exc}") from None
    found = getattr(module, attr, None)
    if not isinstance(found, Agent):
        kind = "nothing" if found is None else type(found).__name__
        raise UserError(f"{target}: is {kind}, not an @agent function")
    return found


def parse_arg(raw: str) -> Any:
    """A JSON value if the text parses as one (numbers, lists, objects, quoted strings), else the text."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def result_json(value: Any) -> str:
    """The result as JSON text: pydantic models, dataclasses, datetimes... as Temporal sends them."""
    from pydantic_core import to_jsonable_python

    return json.dumps(to_jsonable_python(value, fallback=str), indent=2, ensure_ascii=False)


async def run_agent(
    target: str,
    args: list[str],
    *,
    tenant: str | None = None,
    deadline_s: float | None = None,
    state_dir: Path | None = None,
) -> int:
    """Run the task with an in-process worker; print the outcome; return the exit status."""
    from taskplane.sdk.client import connect, submit
    from taskplane.sdk.resolve import resolve
    from workflows.worker import build_worker

    ag = load_agent(target)
    found = resolve(state_dir=state_dir, need_gateway=True)
    client = await connect(found.temporal_address)
    queue = f"taskplane-run-{uuid.uuid4().hex[:8]}"
    outbox = (state_dir or Path(".taskplane")) / "outbox" / f"run-{os.getpid()}"
    worker = await build_worker(client, found.gateway_url, found.database_url, [ag.__module__],
                                task_queue=queue, include_examples=False, outbox_dir=outbox)
    values = [parse_arg(a) for a in args]
    t0 = time.monotonic()
    async with worker:
        handle = await submit(ag, *values, tenant=tenant, deadline=deadline_s, client=client, task_queue=queue)
        err.print(f"task [bold]{handle.task_id}[/] ({ag.name}) started", highlight=False)
        try:
            outcome = await handle.outcome()
            if outcome.status != "succeeded":
                err.print(f"[bold red]task {handle.task_id} {outcome.status}[/] ({outcome.failure_type}): "
                          f"{outcome.error}", highlight=False, soft_wrap=True)
                err.print(f"spent ${outcome.cost_usd:.6f} in {time.monotonic() - t0:.1f} s · "
                          f"{outcome.llm_calls} LLM calls", highlight=False)
                return 1
            result = await handle.result()
        except asyncio.CancelledError:
            await handle.cancel()
            raise
    sys.stdout.write(result_json(result) + "\n")
    sys.stdout.flush()
    err.print(
        f"[green]succeeded[/] in {time.monotonic() - t0:.1f} s · cost ${outcome.cost_usd:.6f} · "
        f"{outcome.llm_calls} LLM calls ({outcome.attempts} attempts) · task id {handle.task_id}",
        highlight=False,
    )
    return 0


def run_agent_command(
    target: str,
    args: list[str],
    *,
    tenant: str | None = None,
    deadline_s: float | None = None,
    state_dir: Path | None = None,
) -> None:
    """The ``taskplane run`` command: exit 0 when the task succeeded, 1 when it did not."""
    import typer

    from taskplane.logs import configure_logging

    configure_logging(os.environ.get("TASKPLANE_LOG_LEVEL", "warning"))  # stdout is the result only
    code = asyncio.run(run_agent(target, args, tenant=tenant, deadline_s=deadline_s, state_dir=state_dir))
    if code:
        raise typer.Exit(code)

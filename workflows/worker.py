"""The Temporal worker for agent tasks: the built-in activities, the example agents and
any ``--module`` agents, on task queue ``taskplane``.

``build_worker`` gives tests and the dev stack a worker to run in-process;
``run_worker_blocking`` is ``taskplane worker``. Temporal's workflow sandbox stays on:
the SDK and its pure dependencies pass through (imported once), the agents' own modules
are re-imported per task so their determinism is checked.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import structlog
from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from taskplane.errors import UserError
from taskplane.integrations import worker_extras
from taskplane.sdk.agent import AGENTS, Agent
from taskplane.sdk.client import connect, taskplane_client
from taskplane.sdk.interceptors import TaskplaneClientInterceptor, TaskplaneInterceptor
from taskplane.sdk.resolve import resolve
from taskplane.sdk.step import STEPS, Step, clashing_steps
from taskplane.sdk.unserved import UnservedAgent
from taskplane.temporal_names import TASK_QUEUE
from workflows.activities import TaskplaneActivities
from workflows.task_rows import TaskRowStore

log = structlog.get_logger("taskplane.worker")

#: Modules imported once, outside the sandbox: deterministic SDK code and pure libraries.
PASSTHROUGH = (
    "taskplane", "pydantic", "pydantic_core", "annotated_types", "typing_extensions",
    "typing_inspection", "structlog", "msgspec", "httpx", "httpcore", "anyio", "sniffio",
    "h11", "idna", "certifi", "jsonschema", "jsonschema_specifications", "referencing", "rpds", "attrs",
)

EXAMPLE_MODULES = ("examples.research", "examples.coding", "examples.triage")


def import_agent_module(name: str) -> ModuleType:
    """Import ``pkg.module`` (or a ``path/to/file.py``) with a one-line error if it fails.

    The current directory is importable, as with ``python -m`` and ``taskplane run``.
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    if name.endswith(".py"):
        path = Path(name).resolve()
        if not path.exists():
            raise UserError(f"--module {name}: no such file")
        sys.path.insert(0, str(path.parent))
        name = path.stem
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise UserError(f"--module {name}: cannot import it ({exc}); check the name, the current directory "
                        "and PYTHONPATH") from None


def load_modules(modules: Sequence[str], include_examples: bool = True) -> list[ModuleType]:
    loaded = [import_agent_module(m) for m in modules]
    if include_examples:
        for name in EXAMPLE_MODULES:
            try:
                loaded.append(importlib.import_module(name))
            except ImportError as exc:
                log.warning("examples_unavailable", module=name, error=str(exc))
    return loaded


def agents_and_steps(modules: Sequence[ModuleType]) -> tuple[list[Agent], list[Step]]:
    """The agents ``modules`` define or import by name, and every step defined so far.

    Steps are harmless to register in bulk; agents are not (each is validated in the
    sandbox), so only the requested modules' agents are served.
    """
    names = {m.__name__ for m in modules}
    found = [a for a in AGENTS.values() if a.__module__ in names]
    found += [v for m in modules for v in vars(m).values() if isinstance(v, Agent)]
    agents: dict[str, Agent] = {}
    for ag in found:
        seen = agents.setdefault(ag.name, ag)
        if seen.spec.fn is not ag.spec.fn:
            raise UserError(
                f"two agents are named {ag.name!r} ({seen.__module__}.{seen.__name__} and "
                f"{ag.__module__}.{ag.__name__}); give one of them another @agent(name=...)"
            )
    return list(agents.values()), list(STEPS.values())


def activity_name(fn: Any) -> str:
    """The name Temporal registers an activity function under."""
    defn = getattr(fn, "__temporal_activity_definition", None)
    return str(getattr(defn, "name", None) or getattr(fn, "__name__", ""))


class OneLineActivityFailures(logging.Filter):
    """A failed step attempt is one log line (Temporal retries it), not a traceback.

    Temporal logs every failed activity attempt with ``exc_info``; for an agent author a
    flaky tool would fill the terminal with tracebacks. The traceback stays at
    ``TASKPLANE_LOG_LEVEL=debug``.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and str(record.msg).startswith("Completing activity as failed"):
            if os.environ.get("TASKPLANE_LOG_LEVEL", "").lower() == "debug":
                return True
            exc = record.exc_info[1]
            info = getattr(record, "temporal_activity", None) or {}
            record.msg = "step %s attempt %s failed: %s: %s"
            record.args = (info.get("activity_type", "?"), info.get("attempt", "?"), type(exc).__name__,
                           " ".join(str(exc).split())[:300])
            record.exc_info, record.exc_text = None, None
        return True


_ONE_LINE = OneLineActivityFailures()


def sandbox_runner(extra: Sequence[str] = ()) -> SandboxedWorkflowRunner:
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH, *extra))


class TaskplaneWorker(Worker):
    """A Temporal worker that also closes the activities' HTTP client and DB writer."""

    def __init__(self, *args: Any, resources: TaskplaneActivities, agents: list[Agent], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resources = resources
        self.agents = agents

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            await self.resources.aclose()


async def build_worker(
    client: Client,
    gateway_url: str | None,
    database_url: str | None,
    modules: Sequence[str] = (),
    *,
    task_queue: str = TASK_QUEUE,
    include_examples: bool = True,
    outbox_dir: Path | None = None,
    max_concurrent_activities: int = 200,
) -> TaskplaneWorker:
    """A worker serving the agents of ``modules`` (plus the examples) and the built-in activities."""
    loaded = load_modules(modules, include_examples)
    agents, steps = agents_and_steps(loaded)
    activity_log = logging.getLogger("temporalio.activity")
    if _ONE_LINE not in activity_log.filters:
        activity_log.addFilter(_ONE_LINE)
    resources = TaskplaneActivities(gateway_url, TaskRowStore(database_url, outbox_dir))
    extras = worker_extras(gateway_url, loaded)  # frameworks the agent modules use (integrations)
    built_in: list[Any] = [resources.llm_call, resources.task_record, *extras.activities]
    clashes = clashing_steps([activity_name(a) for a in built_in])
    if clashes:
        await resources.aclose()
        raise UserError(
            "two activities would have the same name, and Temporal registers activities by name (one "
            f"would silently run in place of the other): {'; '.join(clashes)}. Give one of each pair "
            "another name: @step(name=...)")
    activities: list[Any] = [*built_in[:2], *(s.activity for s in steps), *built_in[2:]]
    worker_client = taskplane_client(client)
    if extras.data_converter is not None:
        worker_client = Client(worker_client.service_client, namespace=worker_client.namespace,
                               data_converter=extras.data_converter, interceptors=[TaskplaneClientInterceptor()])
    try:
        return TaskplaneWorker(
            worker_client,
            task_queue=task_queue,
            # the catch-all: a task of an agent this worker lacks fails at once, with its row
            workflows=[*(a.workflow_cls for a in agents), UnservedAgent],
            activities=activities,
            interceptors=[TaskplaneInterceptor()],
            plugins=extras.plugins,
            workflow_runner=sandbox_runner(extras.passthrough),
            max_concurrent_activities=max_concurrent_activities,
            resources=resources,
            agents=agents,
        )
    except Exception as exc:
        await resources.aclose()
        reason = str(exc)
        if exc.__cause__ is not None:
            reason += f" ({str(exc.__cause__).split('. If this is code', 1)[0]})"
        raise UserError(
            f"an agent module cannot be loaded in Temporal's workflow sandbox: {reason}. Agent modules "
            "are re-imported for every task, so module-level code must not do I/O, read clocks or "
            "randomness, or start threads: move that into a @step function or into the agent body's tools"
        ) from exc


async def run_worker(
    temporal_address: str | None,
    gateway_url: str | None,
    database_url: str | None,
    modules: Sequence[str] = (),
    *,
    state_dir: Path | None = None,
    task_queue: str = TASK_QUEUE,
    stop: asyncio.Event | None = None,
) -> None:
    """Resolve the addresses, connect, serve until ``stop`` is set (or forever)."""
    found = resolve(temporal_address=temporal_address, gateway_url=gateway_url, database_url=database_url,
                    state_dir=state_dir, need_gateway=True)
    client = await connect(found.temporal_address)
    outbox = (state_dir or Path(".taskplane")) / "outbox" / "worker"
    worker = await build_worker(client, found.gateway_url, found.database_url, modules,
                                task_queue=task_queue, outbox_dir=outbox)
    async with worker:
        log.info("worker_started", task_queue=task_queue, temporal=found.temporal_address,
                 gateway=found.gateway_url, database=bool(found.database_url),
                 agents=sorted(a.name for a in worker.agents))
        if stop is None:
            stop = asyncio.Event()
        await stop.wait()
    log.info("worker_stopped")


def run_worker_blocking(
    temporal_address: str | None,
    gateway_url: str | None,
    database_url: str | None,
    modules: Sequence[str] = (),
    *,
    task_queue: str | None = None,
    state_dir: Path | None = None,
) -> None:
    """``taskplane worker``: run until SIGINT/SIGTERM, then finish in-flight work and exit.

    ``--task-queue`` / ``TASKPLANE_TASK_QUEUE`` set the task queue (default ``taskplane``),
    ``--state-dir`` / ``TASKPLANE_STATE_DIR`` the dev stack whose addresses are used.
    """
    from taskplane.logs import configure_logging

    configure_logging()
    if state_dir is None and os.environ.get("TASKPLANE_STATE_DIR"):
        state_dir = Path(os.environ["TASKPLANE_STATE_DIR"])
    task_queue = task_queue or os.environ.get("TASKPLANE_TASK_QUEUE") or TASK_QUEUE

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_worker(temporal_address, gateway_url, database_url, modules, state_dir=state_dir,
                         task_queue=task_queue, stop=stop)

    asyncio.run(main())

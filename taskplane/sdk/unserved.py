"""The worker's catch-all for agents it does not serve: fail the task at once, with its row.

Without it, a task whose agent no worker on the queue registers waits for ever (Temporal
retries the workflow task), and a client that does not wait on it never learns why. Every
taskplane worker registers this dynamic workflow: it runs for any workflow type the worker
lacks, goes through the same life cycle as an agent (task row, search attributes, failure
details) and ends the task ``failed`` with ``AgentNotServed`` and an error naming the
agent, the queue and the command that serves it - so "cost per successful task" counts
the failure like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue

from taskplane.sdk.agent_workflow import AgentWorkflow
from taskplane.sdk.errors import AgentNotServed
from taskplane.sdk.served import unregistered_message
from taskplane.sdk.spec import AgentSpec
from taskplane.sdk.start_attributes import MODULE_MEMO
from taskplane.sdk.state import TaskContext


async def _refuse(*_args: Any) -> Any:
    info = workflow.info()
    module = workflow.memo_value(MODULE_MEMO, None, type_hint=str)
    raise AgentNotServed(unregistered_message(info.task_queue, info.workflow_type, module))


@workflow.defn(dynamic=True)
class UnservedAgent(AgentWorkflow):
    """Any workflow type this worker does not register: recorded and failed, never left hanging."""

    _tp_spec = AgentSpec(name="(unserved)", fn=_refuse)

    @workflow.run
    async def run(self, args: Sequence[RawValue]) -> Any:
        return await self._tp_run(())

    def _tp_initial_context(self) -> TaskContext:
        ctx = super()._tp_initial_context()
        ctx.agent = workflow.info().workflow_type  # the agent the caller asked for
        return ctx

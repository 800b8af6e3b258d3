"""What a workload is, as the cluster simulator replays it.

A workload is a list of tasks; a task is a sequence of LLM calls. Calls are either
*closed loop* (an agent: call ``i+1`` is issued ``gap_s`` after call ``i`` finished, its
prompt being the whole context so far) or *open loop* (a trace: each call arrives at
``at_s`` whatever happened before).

Prompts are described by *block contents*, not tokens: ``contents[j]`` is an integer
naming what the ``j``-th KV block holds (two blocks with the same content and the same
predecessors have the same hash). A closed-loop task derives its contents from its
shared system prompt (``prefix_key``, ``prefix_tokens``) and its own seed, so every call
extends the previous call's prompt and output, as a real agent's context does.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CallSpec:
    output_tokens: int
    # closed loop: tokens added to the context before this call (user message, tool result)
    append_tokens: int = 0
    gap_s: float = 0.0  # closed loop: delay after the previous call finished (tool time)
    tool: str | None = None  # what the gap was spent on (for reports)
    # open loop: absolute arrival time and an explicit prompt
    at_s: float | None = None
    prompt_tokens: int | None = None
    contents: list[int] | None = None  # block contents of the prompt's full blocks


@dataclass(slots=True)
class TaskSpec:
    task_id: str
    arrival_s: float
    calls: list[CallSpec]
    agent: str = "agent"
    tenant: str = "default"
    priority: str = "standard"
    deadline_s: float | None = None  # budget from arrival; None: no deadline
    session_id: str | None = None  # defaults to the task id
    model: str = "llama-3.1-8b"
    prefix_key: int = 0  # identity of the shared system prompt (agent type)
    prefix_tokens: int = 0  # its length in tokens
    seed: int = 0  # identity of the task's own content
    allow_fallback: bool = False
    # False: a plain OpenAI client, without taskplane headers -- the scheduler sees no task,
    # session, step or deadline (the records still name the task, for the report)
    headers: bool = True
    # the author's estimate of the task's calls (``@agent(steps=N)``), what the SDK sends
    # as steps remaining in the simulator's ``author`` hints mode; None: the author gave none
    expected_steps: int | None = None
    adapter: str | None = None  # the LoRA adapter every call of the task runs with (None: the base model)

    @property
    def open_loop(self) -> bool:
        return bool(self.calls) and self.calls[0].at_s is not None


@dataclass(slots=True)
class Workload:
    name: str
    tasks: list[TaskSpec]
    block_size: int = 16  # the KV block size the contents are expressed in
    meta: dict[str, object] = field(default_factory=dict)

    @property
    def num_calls(self) -> int:
        return sum(len(t.calls) for t in self.tasks)

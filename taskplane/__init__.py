"""taskplane: an inference control plane for AI agents.

Agent tasks run as durable Temporal workflows; every LLM call carries the
task's context to a KV-aware scheduler; every attempt's cost lands in Postgres.
The public SDK names are re-exported lazily so that importing ``taskplane``
stays cheap and free of side effects (Temporal's workflow sandbox re-imports it).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_SDK_NAMES = {
    "agent", "step", "llm", "submit", "TaskHandle", "current_context", "approval", "continue_as_new",
    "should_continue_as_new", "Decision", "TaskFailed", "connect", "get_handle", "ToolCall",
    "StructuredOutputError", "LlmResponse",
}


def __getattr__(name: str) -> Any:
    if name in _SDK_NAMES:
        from taskplane import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'taskplane' has no attribute {name!r}")

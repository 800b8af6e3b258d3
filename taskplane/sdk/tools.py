"""Tool calling: @step functions as OpenAI tools, and running the calls a model asked for.

A step's JSON schema comes from its signature (pydantic builds it from the type hints)
and its docstring (the first paragraph describes the tool, an ``Args:`` section each
parameter). ``llm.run_tool_calls`` validates each call's arguments against the same
pydantic model, then runs every call as its step - durable, retried like any step -
all of them in parallel, and returns the ``tool`` messages to append to the
conversation. Arguments a model got wrong are answered with an error message to the
model (it can try again), not a failed task.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import to_jsonable_python

from taskplane.sdk.errors import AgentError
from taskplane.sdk.step import Step
from taskplane.sdk.types import ToolCall

#: What ``tools=`` accepts: @step functions or OpenAI tool dicts.
Tool = Step | dict[str, Any]

_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s+(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


def _doc_parts(fn: Any) -> tuple[str, dict[str, str]]:
    """The docstring's first paragraph and the per-argument lines of its ``Args:`` section."""
    doc = inspect.getdoc(fn) or ""
    summary = doc.split("\n\n", 1)[0].strip()
    args: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        if _ARGS_HEADER.match(line):
            in_args = True
            continue
        if in_args:
            m = _ARG_LINE.match("    " + line if not line.startswith(" ") else line)
            if m:
                args[m.group(1).lstrip("*")] = m.group(2).strip()
            elif line.strip() and not line.startswith(" "):
                in_args = False
    return summary, args


def args_model(s: Step) -> type[BaseModel]:
    """The pydantic model of a step's parameters (cached on the step)."""
    cached = getattr(s, "_tp_args_model", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    sig = inspect.signature(s.fn)
    try:
        hints = typing.get_type_hints(s.fn)
    except Exception:
        hints = {}
    _, arg_docs = _doc_parts(s.fn)
    fields: dict[str, Any] = {}
    for name, p in sig.parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise AgentError(f"tool {s.name!r}: *args/**kwargs cannot be described to a model; name each parameter")
        default = ... if p.default is p.empty else p.default
        fields[name] = (hints.get(name, Any), Field(default, description=arg_docs.get(name)))
    model = create_model(f"{s.name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    s._tp_args_model = model  # type: ignore[attr-defined]
    return model


def tool_schema(t: Tool) -> dict[str, Any]:
    """The OpenAI ``tools`` entry for a step (or the dict itself, checked)."""
    if isinstance(t, dict):
        fn = t.get("function")
        if t.get("type") != "function" or not isinstance(fn, dict) or not fn.get("name"):
            raise AgentError("an OpenAI tool dict is {'type': 'function', 'function': {'name': ..., 'parameters': {...}}}")
        return t
    if not isinstance(t, Step):
        raise AgentError(f"tools must be @step functions or OpenAI tool dicts, not {type(t).__name__}")
    summary, _ = _doc_parts(t.fn)
    schema = args_model(t).model_json_schema()
    schema.pop("title", None)
    for prop in (schema.get("properties") or {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    function: dict[str, Any] = {"name": t.name, "parameters": schema}
    if summary:
        function["description"] = summary
    return {"type": "function", "function": function}


def tool_choice_value(choice: Any) -> Any:
    """``"auto"``/``"none"``/``"required"``, a step or a tool name (that one function), or a dict."""
    if choice is None or isinstance(choice, dict) or choice in ("auto", "none", "required"):
        return choice
    name = choice.name if isinstance(choice, Step) else str(choice)
    return {"type": "function", "function": {"name": name}}


def _content(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(to_jsonable_python(value), ensure_ascii=False)


async def _run_one(call: ToolCall, steps: dict[str, Step], unrunnable: set[str]) -> dict[str, Any]:
    s = steps.get(call.name)
    if s is None:
        known = ", ".join(sorted(steps)) or "none"
        if call.name in unrunnable:
            raise AgentError(f"tool {call.name!r} is an OpenAI tool dict with no implementation: "
                             "pass a @step function to run_tool_calls, or answer this call yourself")
        return {"role": "tool", "tool_call_id": call.id, "content": f"error: no tool named {call.name!r} (tools: {known})"}
    model = args_model(s)
    try:
        args = model.model_validate(call.arguments)
    except ValidationError as exc:
        return {"role": "tool", "tool_call_id": call.id,
                "content": f"error: invalid arguments for {call.name}: {exc.errors(include_url=False)}"}
    values = [getattr(args, name) for name in model.model_fields]
    result = await s(*values)
    return {"role": "tool", "tool_call_id": call.id, "content": _content(result)}


async def run_tool_calls(response: Any, tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """Run each tool call of ``response`` as its step, in parallel; the ``tool`` messages, in order."""
    calls: list[ToolCall] = list(getattr(response, "tool_calls", response))
    steps = {t.name: t for t in tools if isinstance(t, Step)}
    unrunnable = {str((t.get("function") or {}).get("name")) for t in tools if isinstance(t, dict)}
    return list(await asyncio.gather(*(_run_one(c, steps, unrunnable) for c in calls)))

"""Small value helpers shared by the agent, step and client code.

Results cross Temporal as JSON; these turn them back into the author's declared types,
and summarise arguments for memos and activity summaries without dumping big payloads
into the history's metadata.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable, Sequence
from typing import Any

from temporalio import workflow

_SUMMARY_MAX = 200


def return_hint(fn: Callable[..., Any]) -> Any:
    """The function's return annotation, resolved; None when absent or unresolvable."""
    try:
        return typing.get_type_hints(fn).get("return")
    except Exception:
        return None


def convert_value(value: Any, hint: Any) -> Any:
    """Re-type a JSON value with the same converter Temporal uses for arguments."""
    if hint is None or hint is Any or value is None:
        return value
    if workflow.in_workflow():
        pc = workflow.payload_converter()
    else:
        from taskplane.sdk.payloads import data_converter

        pc = data_converter().payload_converter
    return pc.from_payload(pc.to_payload(value), hint)


def short(value: Any, limit: int = _SUMMARY_MAX) -> str:
    """A one-line, bounded rendering of a value."""
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, default=str, ensure_ascii=False)
        except (TypeError, ValueError):
            text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summarize_args(name: str, args: Sequence[Any], limit: int = _SUMMARY_MAX) -> str:
    """``name(arg1, arg2)`` bounded to ``limit`` characters."""
    per = max(limit // max(len(args), 1), 24)
    inner = ", ".join(short(a, per) for a in args)
    text = f"{name}({inner})"
    return text if len(text) <= limit else text[: limit - 1] + "…"

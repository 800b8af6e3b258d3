"""What a replica is sent for a call, and the usage event of its streamed answer: the two
edits of the OpenAI body every data plane makes, whoever carries the bytes."""

from __future__ import annotations

import json
from typing import Any

from taskplane.calls.intake import Call


def upstream_body(call: Call, model: str) -> dict[str, Any]:
    """The client's body for the replica: the model that serves it, and (when streaming)
    usage in the last event, which the attempt's row needs whether the client asked or not.
    A call with an adapter names the adapter on its base model's replicas (vLLM serves an
    adapter as a model of that name); a fallback model is sent as itself. A client's
    ``kv_transfer_params`` (vLLM's KV-connector instructions: pull a prompt's KV from a named
    host) are dropped: only the decode replica's sidecar sets them, from the prefill replica
    the picker chose."""
    body = dict(call.body)
    body.pop("kv_transfer_params", None)
    body["model"] = sent_adapter(call, model) or model
    if call.stream:
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        body["stream_options"] = opts
    return body


def sent_adapter(call: Call, model: str) -> str | None:
    """The adapter a replica of ``model`` is asked for: the call's, on its base model only."""
    return call.request.adapter if model == call.pool.model else None


def filter_usage_event(event: bytes, usage: dict[str, Any], client_wants_usage: bool) -> bytes | None:
    """Capture usage from the final SSE chunk into ``usage``; hide it if the client did not
    ask for it (``None``: drop the event)."""
    line = event.strip()
    if not line.startswith(b"data:") or line == b"data: [DONE]" or b'"usage"' not in line:
        return event  # most chunks: pass through without parsing (the proxy's hot path)
    try:
        data = json.loads(line[5:])
    except ValueError:
        return event
    u = data.get("usage") if isinstance(data, dict) else None
    if u:
        usage.update(u)
        if not client_wants_usage:
            if not data.get("choices"):
                return None
            data["usage"] = None
            return b"data: " + json.dumps(data).encode()
    return event

"""A streamed answer that passes through the picker (a GIE full-duplex Envoy, which sends
the response body to ext_proc): its usage, first token and end read from the events as the
Python proxy's relay reads them, and its attempt settled when it ends."""

from __future__ import annotations

import json

from taskplane.calls import failures
from taskplane.calls.bodies import filter_usage_event
from taskplane.epp.calls import PickedCall
from taskplane.epp.exchange import Exchange


def scan_stream(ex: Exchange, chunk: bytes) -> bytes:
    """A streamed answer the data plane sends through the picker (a GIE full-duplex
    Envoy): usage, first token and the end read from the events, as the Python relay does."""
    picked = ex.picked
    assert picked is not None and picked.served is not None
    buf = ex.sse_buf + chunk
    *events, ex.sse_buf = buf.split(b"\n\n")
    outs = []
    for event in events:
        out = filter_usage_event(event, ex.usage, picked.call.client_wants_usage)
        if b'"content"' in event or b'"text"' in event:
            ex.generated += 1
            picked.lc.first_token(picked.served)
        if event.strip() == b"data: [DONE]":
            ex.stream_done = True
        elif event.lstrip().startswith(b'data: {"error"'):
            ex.engine_reported = True
        if out is not None:
            outs.append(out + b"\n\n")
    return b"".join(outs)


async def settle_scanned(ex: Exchange, picked: PickedCall) -> bytes:
    """Settle a stream the picker relayed to its end; what still goes to the client: the
    Python relay's closing error event when the replica ended it early without one."""
    assert picked.served is not None
    if ex.stream_done:
        await picked.succeeded(ex.usage)
        return b""
    what = "reported an error" if ex.engine_reported else "ended the stream before it finished"
    failure = failures.broken_stream(picked.served.replica.name, what, transport=False)
    await picked.failed(failure)
    return b"" if ex.engine_reported else b"data: " + json.dumps(failure.error.body()).encode() + b"\n\n"

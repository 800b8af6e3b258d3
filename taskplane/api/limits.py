"""Refusing requests too big or too slow for the HTTP API: the body's size and upload
time (413, 408), and the header block's size (431)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from taskplane.api.errors import plain_error
from taskplane.errors import ErrorType, TaskplaneError


class BodyTimeout(Exception):
    """The client did not finish sending its body in time (a slow or stalled upload)."""


async def read_capped(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The request body, refused once it passes ``limit`` bytes or ``timeout_s`` seconds, so
    an oversized, endless or trickling upload cannot hold a request open for ever."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TaskplaneError(ErrorType.PAYLOAD_TOO_LARGE, f"request body of {declared} bytes exceeds the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise TaskplaneError(ErrorType.PAYLOAD_TOO_LARGE, f"request body exceeds the {limit}-byte limit")
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(f"request body not received within {timeout_s:g} s ({size} bytes arrived)") from None
    return b"".join(chunks)


class HeaderLimit:
    """Refuse a request whose header block is over ``limit`` bytes (431). The HTTP layer
    already refuses one that arrives in pieces; a block that arrives whole behind another
    request on a kept-alive connection reaches the app, and is refused here."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and sum(len(k) + len(v) + 4 for k, v in scope["headers"]) > self.limit:
            resp = plain_error(431, f"request header block exceeds the {self.limit}-byte limit",
                               headers={"Connection": "close"})
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)

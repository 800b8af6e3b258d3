"""Shared helpers of the data-plane tests: rows from Postgres, taskplane headers."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable

import asyncpg
import httpx

MODEL = "llama-3.1-8b"


def tp_headers(task: str, step: int, **extra: str) -> dict[str, str]:
    return {"X-Taskplane-Tenant": "acme", "X-Taskplane-Task-Id": task, "X-Taskplane-Step": str(step),
            "X-Taskplane-Call-Id": f"{task}:{step}", "X-Taskplane-Attempt": "1", **extra}


def chat(content: str, **kw: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "system", "content": "You are a careful agent. " * 20},
                                          {"role": "user", "content": content}], "max_tokens": 8, **kw}


async def rows(pg_url: str, task_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(pg_url.replace("+asyncpg", ""))
    try:
        return list(await conn.fetch("SELECT * FROM llm_calls WHERE task_id=$1 ORDER BY started_at, attempt_key", task_id))
    finally:
        await conn.close()


async def rows_eventually(pg_url: str, task_id: str, n: int, settle_s: float = 0.5) -> list[asyncpg.Record]:
    """The task's rows once there are ``n``, after a short wait for any extra row to show."""
    for _ in range(150):
        got = await rows(pg_url, task_id)
        if len(got) >= n:
            await asyncio.sleep(settle_s)
            return await rows(pg_url, task_id)
        await asyncio.sleep(0.1)
    return await rows(pg_url, task_id)


def sse_usage(text: str) -> dict[str, object] | None:
    """The usage object of a streamed answer (the client asked for it), or None."""
    import json

    for line in text.splitlines():
        if line.startswith("data: {") and '"usage"' in line:
            data = json.loads(line[6:])
            if data.get("usage"):
                return dict(data["usage"])
    return None


#: The ext_proc phases ``taskplane_epp_messages_total`` counts that a call may cost.
PHASES = ("request_headers", "request_body", "response_headers", "response_body")


async def epp_messages(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    found = {p: 0.0 for p in PHASES}
    for phase, value in re.findall(r'^taskplane_epp_messages_total\{phase="(\w*)"\} ([0-9.e+]+)$', text, re.M):
        found[phase] = float(value)
    for name, value in re.findall(r'^taskplane_epp_streams_total\{exchange="(\w*)"\} ([0-9.e+]+)$', text, re.M):
        found[f"{name or 'gie'}_streams"] = float(value)
    return found


async def messages_cost(client: httpx.AsyncClient, send: Awaitable[object]) -> dict[str, int]:
    """The messages the picker received while ``send`` (an awaitable) ran, by phase."""
    before = await epp_messages(client)
    await send
    after = await epp_messages(client)
    return {p: int(after.get(p, 0) - before.get(p, 0)) for p in (*PHASES, "answers_streams")}

"""Replay a trace in the Mooncake format (FAST'25 conversation trace and any file like it).

One JSON object per line: ``timestamp`` (ms from the start), ``input_length``,
``output_length``, ``hash_ids`` (one id per 512-token block of the prompt, chained: equal
leading ids mean equal prefixes). The trace has no sessions; they are derived from
shared prefixes: a request that shares at least ``min_shared_blocks`` leading blocks
with an earlier request (beyond the common system prompt, block 0) continues that
request's session (the next turn of a conversation), otherwise it starts a new one. A line
may carry an optional ``session_id`` (our generated tool-agent trace does: its episodes
share long tool prefixes, which the derivation would merge into one session per agent);
then the trace's own sessions are used.

Block granularity: the trace knows 512-token blocks. With the default ``block_size``
of 512 each trace id is one KV block (fast: a one-hour replay touches ~250k blocks).
A smaller ``block_size`` (dividing 512) splits each trace block into sub-blocks with
contents ``(id, k)``, closer to vLLM's 16-token blocks at a proportional cost. A
trailing partial block is never cached (vLLM caches full blocks only), so its id is
dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

from taskplane.sim.workloads.base import CallSpec, TaskSpec, Workload

TRACE_BLOCK = 512


def load_mooncake(
    path: str | Path,
    *,
    block_size: int = TRACE_BLOCK,
    time_scale: float = 1.0,
    duration_s: float | None = None,
    limit: int | None = None,
    model: str = "llama-3.1-8b",
    min_shared_blocks: int = 2,
    tenant: str = "default",
    priority: str = "standard",
) -> Workload:
    """Tasks (one per derived session) of open-loop calls at the trace's arrival times.

    ``time_scale`` multiplies arrival times (< 1 compresses the trace: more load);
    ``duration_s`` keeps the requests arriving in the first seconds of the trace (before
    scaling); ``limit`` the first N requests.
    """
    if block_size <= 0 or TRACE_BLOCK % block_size:
        raise ValueError(f"block_size must divide {TRACE_BLOCK}, got {block_size}")
    owner: dict[int, int] = {}  # hash id -> session index
    named: dict[object, int] = {}  # a trace's own session ids -> session index
    sessions: list[TaskSpec] = []
    n = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            ts = float(rec["timestamp"]) / 1000.0
            if duration_s is not None and ts > duration_s:
                break
            if limit is not None and n >= limit:
                break
            ids: list[int] = list(rec["hash_ids"])
            inp = int(rec["input_length"])
            out = max(1, int(rec["output_length"]))
            sess = _session_of(rec.get("session_id"), ids, owner, named, len(sessions), min_shared_blocks)
            if sess < 0 or sess == len(sessions):
                sess = len(sessions)
                sessions.append(TaskSpec(task_id=f"mc-{sess}", arrival_s=ts * time_scale, calls=[],
                                         agent="mooncake", tenant=tenant, priority=priority, model=model))
            for h in ids:
                owner.setdefault(h, sess)
            sessions[sess].calls.append(CallSpec(output_tokens=out, at_s=ts * time_scale, prompt_tokens=inp,
                                                 contents=_contents(ids, inp, block_size)))
            n += 1
    return Workload(name="mooncake", tasks=sessions, block_size=block_size,
                    meta={"trace": str(path), "requests": n, "time_scale": time_scale})


def _session_of(sid: object, ids: list[int], owner: dict[int, int], named: dict[object, int], n_sessions: int,
                min_shared_blocks: int) -> int:
    """The session of a request: the trace's own session id when it has one, else the
    session of its longest prefix (at least ``min_shared_blocks``) an earlier request
    introduced; -1 for a new one."""
    if sid is not None:  # the trace names its sessions: no derivation
        return named.setdefault(sid, n_sessions)
    for k in range(len(ids) - 1, min_shared_blocks - 2, -1):
        s = owner.get(ids[k])
        if s is not None:
            return s
    return -1


def _contents(ids: list[int], inp: int, block_size: int) -> list[int]:
    """The content ids of a prompt's full blocks of ``block_size`` tokens: each trace
    block of 512 split into sub-blocks, the last partial trace block's full sub-blocks too."""
    full = inp // TRACE_BLOCK
    sub = TRACE_BLOCK // block_size
    if sub == 1:
        return ids[:full]
    contents = [h * TRACE_BLOCK + k for h in ids[:full] for k in range(sub)]
    contents += [ids[full] * TRACE_BLOCK + k for k in range((inp % TRACE_BLOCK) // block_size)] \
        if full < len(ids) else []
    return contents

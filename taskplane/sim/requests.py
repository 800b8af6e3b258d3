"""What goes into the simulated engine and what comes out of it, and its per-request state.

A :class:`SimRequest` goes in; :class:`FirstToken`, :class:`Finished` and
:class:`KVEvents` come out (the HTTP replica and the cluster simulator read them the
same way). :class:`EngineRequest` is the engine's own bookkeeping for one request.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from taskplane.scheduler.kv.events import KVEvent
from taskplane.sim.kvcache import Holding


@dataclass(slots=True)
class SimRequest:
    """A request as the engine sees it: block hashes and token counts, not text.

    ``block_hashes`` are the chained hashes of the prompt's full blocks
    (``prompt_tokens // block_size`` of them, or fewer). ``output_block_hashes`` are those
    of the further full blocks of prompt + output (cached at completion, so the next
    turn of a conversation can hit them). ``token_ids`` (prompt + output) only feed the
    ``token_ids`` field of BlockStored events.
    """

    req_id: Hashable
    prompt_tokens: int
    output_tokens: int
    block_hashes: Sequence[int] = ()
    output_block_hashes: Sequence[int] = ()
    token_ids: Sequence[int] | None = None
    tag: Any = None  # opaque to the engine, returned in its events
    adapter: str | None = None  # the LoRA adapter it runs with (None: the base model)


@dataclass(slots=True)
class FirstToken:
    req_id: Hashable
    time: float
    cached_tokens: int
    tag: Any = None


@dataclass(slots=True)
class Finished:
    """A request left the engine: completed (``error is None``), aborted or rejected."""

    req_id: Hashable
    time: float
    arrival: float
    admitted: float | None
    first_token: float | None
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int  # generated
    gpu_seconds: float  # this request's share of the steps it took part in
    error: str | None = None
    tag: Any = None
    tier_load_s: float = 0.0  # KV it loaded from a host / remote tier, in transfer seconds


@dataclass(slots=True)
class KVEvents:
    """KV-cache events produced at ``time`` (vLLM publishes one batch per step)."""

    time: float
    events: list[KVEvent]


EngineEvent = FirstToken | Finished | KVEvents


class ReqState(enum.Enum):
    WAITING = "waiting"  # queued, not admitted (no blocks yet)
    PREFILL = "prefill"  # admitted, prompt chunks being computed
    DECODE = "decode"  # generating, one token a step
    DONE = "done"  # left the engine


@dataclass(slots=True, eq=False)
class EngineRequest:
    """One request inside the engine, from arrival to completion."""

    spec: SimRequest
    arrival: float
    state: ReqState = ReqState.WAITING
    admitted: float | None = None
    first_token: float | None = None
    hits: int = 0
    cached: int = 0
    computed: int = 0  # prompt tokens computed (or cached)
    stored_upto: int = 0  # prompt blocks cached so far
    held: Holding | None = None  # the cached blocks it references, once admitted
    n_alloc: int = 0  # blocks allocated to it
    n_stored: int = 0  # of those, blocks it turned into cached blocks
    join: int = 0  # decode step counter when it started decoding
    target: int = 0  # decode step counter at which it finishes
    acc0: float = 0.0  # gpu-second accumulator when it started decoding
    gpu_s: float = 0.0
    blocks: int = 0  # blocks of its whole sequence (prompt + output)
    tier_load_s: float = 0.0  # host / remote -> GPU transfer its admission added to a step


@dataclass(slots=True)
class EngineStats:
    prompt_tokens: int = 0  # prompt tokens of admitted requests (vLLM counts computed ones)
    generation_tokens: int = 0
    prefix_queries: int = 0  # tokens
    prefix_hits: int = 0  # tokens
    finished: int = 0
    aborted: int = 0
    steps: int = 0
    busy_s: float = 0.0

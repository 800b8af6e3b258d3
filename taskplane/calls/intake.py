"""An incoming call as the gateway understands it, before any replica is chosen.

Headers are checked, the tenant authenticated and held to its priority cap, the body
validated against the OpenAI schema, the prompt counted against the model's context and
hashed into KV blocks for the scheduler. Every refusal here is a clean 4xx that has cost
nothing upstream.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from taskplane.calls import auth
from taskplane.calls.adapters import H_ADAPTER, call_adapter
from taskplane.calls.openai_extra import REQUEST_MODELS, prompt_tokens
from taskplane.calls.requests import parse_body
from taskplane.config import GatewayConfig, PoolConfig
from taskplane.context import (
    H_AGENT,
    H_ALLOW_FALLBACK,
    H_ATTEMPT,
    H_BUDGET_MS,
    H_CALL_ID,
    H_PRIORITY,
    H_SESSION,
    H_STEP,
    H_STEPS_REMAINING,
    H_SUNK_COST,
    H_TASK,
    H_TENANT,
    CallContext,
    parse_headers,
)
from taskplane.engines.registry import ReplicaRegistry
from taskplane.errors import ErrorType, TaskplaneError
from taskplane.scheduler.hashing import SessionChains, adapter_root, chain_hashes
from taskplane.scheduler.types import CallRequest

DEFAULT_MAX_TOKENS = 256


@dataclass
class Call:
    """Everything known about one incoming call."""

    kind: str  # "chat" or "completions"
    body: dict[str, Any]
    ctx: CallContext
    pool: PoolConfig
    prompt_tokens: int
    max_tokens: int
    stream: bool
    client_wants_usage: bool
    deterministic: bool
    request: CallRequest
    call_id: str
    received: float = field(default_factory=time.monotonic)


_SINGLE_HEADERS = ("authorization", H_TENANT, H_TASK, H_SESSION, H_STEP, H_STEPS_REMAINING, H_PRIORITY, H_BUDGET_MS,
                   H_SUNK_COST, H_ALLOW_FALLBACK, H_AGENT, H_ATTEMPT, H_CALL_ID, H_ADAPTER)


def refuse_conflicting_headers(headers: Mapping[str, str]) -> None:
    """A taskplane header sent twice with different values is contradictory: 400, not a guess."""
    getlist = getattr(headers, "getlist", None)
    if getlist is None:
        return
    for name in _SINGLE_HEADERS:
        values = getlist(name)
        if len(values) > 1 and len({v.strip() for v in values}) > 1:
            raise TaskplaneError(ErrorType.INVALID_REQUEST, f"header {name} is sent {len(values)} times with different values")


#: The largest value of a Postgres ``integer`` column (step, attempt and token counts land in them).
INT32_MAX = 2**31 - 1
#: No budget beyond this is meaningful (24 days); larger ones overflowed the scheduler's arithmetic.
MAX_BUDGET_MS = float(INT32_MAX)
MAX_SUNK_COST_USD = 1e9


def check_ranges(ctx: CallContext) -> None:
    """Numbers from headers must fit where they land (int32 columns, the scheduler's floats):
    a step of 2**31 used to be served, priced and then refused by Postgres, unbilled."""
    for name, value in ((H_STEP, ctx.step), (H_STEPS_REMAINING, ctx.steps_remaining), (H_ATTEMPT, ctx.attempt)):
        if value is not None and value > INT32_MAX:
            raise TaskplaneError(ErrorType.INVALID_REQUEST, f"header {name}: {str(value)[:24]} is over {INT32_MAX}")
    if ctx.budget_ms is not None and ctx.budget_ms > MAX_BUDGET_MS:
        raise TaskplaneError(ErrorType.INVALID_REQUEST, f"header {H_BUDGET_MS}: over {MAX_BUDGET_MS:.0f} ms")
    if ctx.sunk_cost_usd > MAX_SUNK_COST_USD:
        raise TaskplaneError(ErrorType.INVALID_REQUEST, f"header {H_SUNK_COST}: over {MAX_SUNK_COST_USD:g} USD")


def caller_context(config: GatewayConfig, headers: Mapping[str, str]) -> CallContext:
    """Who calls and what for, from the headers: the tenant (the API key's, never another's
    claimed beside it), the task's context in range, the priority within the tenant's cap."""
    refuse_conflicting_headers(headers)
    tenant_from_key = auth.authenticate(config, headers)
    claimed = (headers.get(H_TENANT) or "").strip()
    if tenant_from_key is not None and claimed and claimed != tenant_from_key:
        # A key of one tenant with another tenant's name: refuse rather than guess which was meant.
        raise TaskplaneError(ErrorType.FORBIDDEN, f"{H_TENANT} {claimed[:64]!r} does not match the API key's tenant")
    ctx = parse_headers(headers, tenant=tenant_from_key)
    check_ranges(ctx)
    tenant_cfg = config.tenant(ctx.tenant)
    if config.auth or tenant_cfg is not None:
        auth.enforce_priority_cap(tenant_cfg, ctx.priority)
    return ctx


def served_pool(config: GatewayConfig, model: str) -> PoolConfig:
    """The pool that serves ``model``, or ``model_not_found``."""
    pool = config.pool_for(model)
    if pool is None:
        known = ", ".join(p.model for p in config.pools)
        raise TaskplaneError(ErrorType.MODEL_NOT_FOUND, f"model {model!r} is not served here (models: {known})")
    return pool


def check_length(config: GatewayConfig, pool: PoolConfig, prompt_tokens: int, max_tokens: int) -> None:
    """Refuse a call asking for more tokens than the gateway allows or the model's context holds."""
    if max_tokens > config.limits.max_tokens:
        raise TaskplaneError(ErrorType.INVALID_REQUEST, f"max_tokens {max_tokens} exceeds the gateway limit {config.limits.max_tokens}")
    if prompt_tokens + max_tokens > pool.max_context_tokens:
        raise TaskplaneError(
            ErrorType.INVALID_REQUEST,
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds {pool.model}'s context of {pool.max_context_tokens} tokens",
        )


def prepare_call(config: GatewayConfig, registry: ReplicaRegistry, kind: str, raw: bytes, headers: Mapping[str, str], *,
                 has_response_cache: bool, chains: SessionChains | None = None) -> Call:
    """The call behind one request, or the ``TaskplaneError`` that refuses it.
    ``has_response_cache``: a deterministic call may then be answered from the cache.
    ``chains``: the sessions' latest block hashes, so a session's next prompt hashes only
    what it does not share with the previous one."""
    ctx = caller_context(config, headers)
    typed, body = parse_body(raw, REQUEST_MODELS.get(kind, REQUEST_MODELS["chat"]))  # type: ignore[arg-type]
    base, adapter = call_adapter(typed.model, {p.model for p in config.pools}, headers)
    pool = served_pool(config, base)
    tokens = prompt_tokens(typed)
    max_tokens = typed.wanted_tokens or DEFAULT_MAX_TOKENS
    check_length(config, pool, len(tokens), max_tokens)
    block_size = pool_block_size(registry, pool)
    prompt = tokens[:-1]  # vLLM never serves the last prompt token from cache
    # an adapter's blocks chain from its own root, as the KV index keeps them (vLLM hashes them apart)
    root = adapter_root(adapter)
    session = (ctx.tenant, ctx.session_key, adapter) if ctx.session_key else None
    hashes = (chain_hashes(prompt, block_size, root) if chains is None
              else chains.hashes(session, prompt, block_size, root=root))
    request = CallRequest(
        model=pool.model,
        prompt_tokens=len(tokens),
        max_tokens=max_tokens,
        block_hashes=hashes,
        tenant=ctx.tenant,
        priority=ctx.priority.value,
        session_id=ctx.session_key,
        task_id=ctx.task_id,
        step=ctx.step,
        steps_remaining=ctx.steps_remaining,
        budget_ms=ctx.budget_ms,
        sunk_cost_usd=ctx.sunk_cost_usd,
        allow_fallback=ctx.allow_fallback,
        now_s=time.monotonic(),
        agent=ctx.agent,
        call_id=ctx.call_id,
        block_size=block_size,
        tool=ctx.tool,
        adapter=adapter,
    )
    stream_opts = body.get("stream_options") or {}
    return Call(
        kind=kind,
        body=body,
        ctx=ctx,
        pool=pool,
        prompt_tokens=len(tokens),
        max_tokens=max_tokens,
        stream=bool(typed.stream),
        client_wants_usage=bool(isinstance(stream_opts, dict) and stream_opts.get("include_usage")),
        deterministic=typed.temperature == 0 and not typed.stream and has_response_cache,
        request=request,
        call_id=ctx.call_id or adhoc_call_id(),
    )


#: Ad-hoc call ids: this process's random half, then a counter. As unique as a fresh
#: ``token_hex(16)`` per call (no two processes share the random half) without a system call
#: for 16 random bytes on every call that names no task.
_ADHOC_PREFIX = secrets.token_hex(8)
_adhoc_serial = itertools.count(1)


def adhoc_call_id() -> str:
    """The id of a call whose client named none (``adhoc-`` and 32 hex digits)."""
    return f"adhoc-{_ADHOC_PREFIX}{next(_adhoc_serial):016x}"


def pool_block_size(registry: ReplicaRegistry, pool: PoolConfig) -> int:
    """The KV block size the pool's replicas hash prompts with (16, vLLM's default, if none is known)."""
    for s in registry.for_model(pool.model):
        return s.config.block_size or s.block_size
    return 16

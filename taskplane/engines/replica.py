"""What the gateway knows about one replica (``ReplicaState``) and one call's place on it
(``Lease``), the pieces the registry's scheduler snapshot is built from.

Setting a field the replica's view reads (``VIEW_FIELDS``) tells the owning registry the
view is stale, so no writer (the scrape, a lease, a test) can forget to.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from taskplane.config import PoolConfig, ReplicaConfig
from taskplane.scheduler.types import ReplicaView

#: A replica with calls in flight that sent no byte back and whose token counters did not
#: move for this long, and whose /health does not answer, is hung (busy ones keep sending).
STALL_S = 5.0

#: Default prices per GPU-hour (USD) when a replica's config names none; the price
#: book in Postgres versions them.
DEFAULT_PRICE_PER_HOUR = {
    "b200": 6.00,
    "h200": 3.80,
    "h100": 2.50,
    "a100": 1.60,
    "l40s": 0.90,
    "cpu": 0.10,
}


#: The fields ``ReplicaState.view`` reads: setting one makes the replica's view stale.
VIEW_FIELDS = frozenset({
    "config", "pool", "healthy", "down_until", "kv_blocks_total", "kv_usage", "block_size", "num_running",
    "num_waiting", "inflight", "inflight_prompt_tokens", "unstarted_prompt_tokens", "inflight_decode_tokens", "kv_events_live",
    "max_loras", "lora_running", "lora_waiting", "lora_served",
})


@dataclass(eq=False)  # one object per replica: compared and hashed by identity
class ReplicaState:
    """Everything the gateway knows about one replica."""

    config: ReplicaConfig
    pool: PoolConfig
    healthy: bool = True
    consecutive_failures: int = 0
    down_until: float = 0.0
    kv_blocks_total: int = 0
    kv_usage: float = 0.0
    block_size: int = 16
    num_running: int = 0
    num_waiting: int = 0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    inflight: int = 0
    inflight_prompt_tokens: int = 0
    #: Of those, the tokens of prompts whose prefill the replica's KV events have not shown
    #: begun (``Lease.started``): what the prefill gate waits for.
    unstarted_prompt_tokens: int = 0
    inflight_decode_tokens: int = 0
    kv_events_live: bool = False
    #: LoRA, from ``vllm:lora_requests_info`` (max_loras 0: the replica reports none).
    max_loras: int = 0
    lora_running: frozenset[str] = frozenset()
    lora_waiting: frozenset[str] = frozenset()
    #: the adapters its ``/v1/models`` lists (read while it reports LoRA); None: not read
    lora_served: frozenset[str] | None = None
    lora_roots: dict[str, str] = field(default_factory=dict)  # adapter -> its path (/v1/models "root")
    sleeping: bool = False  # the engine reports vLLM sleep mode (healthy is then False)
    served_tokens: int = 0
    errors: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    down_signal: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    probe_failures: int = 0
    progress_tokens: float = -1.0
    progress_at: float = field(default_factory=time.monotonic)
    #: Leases whose prefill has not begun, by the hash of the last prompt block each must
    #: compute (``Lease``, ``ReplicaRegistry.blocks_stored``).
    prefilling: dict[int, list[Lease]] = field(default_factory=dict, repr=False)
    #: Called with the state after a field in ``VIEW_FIELDS`` was set (the registry's
    #: stale set); None while the state belongs to no registry.
    on_change: Callable[[ReplicaState], None] | None = field(default=None, repr=False)

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name in VIEW_FIELDS and self.on_change is not None:
            self.on_change(self)

    def saw_progress(self) -> None:
        """The replica sent something (headers, a stream chunk, a body): it is alive."""
        self.progress_at = time.monotonic()

    def stalled(self) -> bool:
        """Calls are in flight, yet nothing came back and no token counter moved for STALL_S."""
        return self.inflight > 0 and time.monotonic() - self.progress_at >= STALL_S

    def signal_down(self) -> None:
        """Wake calls waiting on this replica: it stopped answering its health probe."""
        self.down_signal.set()
        self.down_signal = asyncio.Event()  # later waiters wait for the next failure

    @property
    def name(self) -> str:
        return self.config.replica_name

    @property
    def price_per_hour(self) -> float:
        if self.config.cost_per_hour_usd is not None:
            return self.config.cost_per_hour_usd
        return DEFAULT_PRICE_PER_HOUR.get(self.config.gpu, 2.50)

    @property
    def metrics_url(self) -> str:
        return self.config.metrics_url or f"{self.config.url}/metrics"

    @property
    def health_url(self) -> str:
        return f"{self.config.url}/health"

    def view(self, now: float | None = None) -> ReplicaView:
        now = time.monotonic() if now is None else now
        total = self.kv_blocks_total or self.config.kv_blocks or 4096
        free = max(0, round(total * (1.0 - self.kv_usage)))
        # The engine's own counts lag by a scrape; the gateway's in-flight count is fresh.
        # Calls beyond the batch limit wait in the engine's queue.
        busy = max(self.num_running + self.num_waiting, self.inflight)
        running = min(busy, self.config.max_num_seqs)
        waiting = busy - running
        return ReplicaView(
            name=self.name,
            model=self.pool.model,
            gpu=self.config.gpu,
            cost_per_hour_usd=self.price_per_hour,
            healthy=self.healthy and not self.config.draining and now >= self.down_until,
            model_loaded=True,
            kv_blocks_total=total,
            kv_blocks_free=free,
            block_size=self.config.block_size or self.block_size,
            num_running=running,
            num_waiting=waiting,
            max_num_seqs=self.config.max_num_seqs,
            inflight_prefill_tokens=self.inflight_prompt_tokens,
            unstarted_prefill_tokens=self.unstarted_prompt_tokens if self.kv_events_live else None,
            inflight_decode_tokens=self.inflight_decode_tokens,
            has_kv_events=self.kv_events_live,
            max_loras=self.max_loras,
            lora_running=self.lora_running,
            lora_waiting=self.lora_waiting,
            lora_served=self.lora_served,
            role=self.config.role,
        )


class Lease:
    """One call's place on a replica: what it adds to the replica's in-flight counts,
    given back exactly once.

    The gateway's fresh load signal (``inflight``, the prefill tokens still queued, the
    decode tokens still to come) is the sum of the open leases, so a path that forgets to
    give one back leaves the replica looking busy for ever. ``release`` is idempotent and
    returns the same batch size every time, so every exit path (success, failure,
    cancellation, a bug) may call it; the lease is also a context manager that releases.
    Obtain one from ``ReplicaRegistry.acquire``.

    Its prefill ends at the first token. It has begun once the replica's KV events report
    ``last_block``, the last prompt block it must compute, stored (an engine publishes a
    block as it schedules its computation): taskplane's Envoy reports a stream's first
    token only in the call's access-log entry, when the stream is over, so the prefill
    gate, which only needs to know that a prompt is no longer waiting for its engine step,
    goes by ``started``. A lease with no such block (nothing but a partial block to compute,
    or hashes of text, not of the engine's tokens) counts as begun from the start.
    """

    __slots__ = ("_batch_end", "_last_block", "_prefilling", "batch_start", "decode_tokens", "prefill_tokens", "replica")

    def __init__(self, replica: ReplicaState, *, prefill_tokens: int, decode_tokens: int,
                 last_block: int | None = None) -> None:
        self.replica = replica
        self.prefill_tokens = max(prefill_tokens, 0)
        self.decode_tokens = max(decode_tokens, 0)
        replica.inflight += 1
        replica.inflight_prompt_tokens += self.prefill_tokens
        replica.inflight_decode_tokens += self.decode_tokens
        self.batch_start = replica.inflight  # calls in flight once this one was added
        self._prefilling = True
        self._batch_end: int | None = None
        self._last_block = last_block if self.prefill_tokens > 0 else None  # None once begun
        if self._last_block is not None:
            replica.unstarted_prompt_tokens += self.prefill_tokens
            replica.prefilling.setdefault(self._last_block, []).append(self)

    @property
    def released(self) -> bool:
        return self._batch_end is not None

    def started(self) -> None:
        """The replica stored the last prompt block this call must compute: its prefill has
        begun (the prefill gate's signal; the prompt still counts as in flight)."""
        block, self._last_block = self._last_block, None
        if block is None:
            return
        self.replica.unstarted_prompt_tokens -= self.prefill_tokens
        waiting = self.replica.prefilling.get(block, [])
        if self in waiting:
            waiting.remove(self)
        if not waiting:
            self.replica.prefilling.pop(block, None)

    def prefilled(self) -> None:
        """The first token came back: the replica no longer has this call's prompt to compute."""
        self.started()
        if self._prefilling:
            self._prefilling = False
            self.replica.inflight_prompt_tokens -= self.prefill_tokens

    def release(self) -> int:
        """Give the call's place back; the calls in flight just before (itself included)."""
        if self._batch_end is None:
            self.prefilled()
            self._batch_end = self.replica.inflight
            self.replica.inflight -= 1
            self.replica.inflight_decode_tokens -= self.decode_tokens
        return self._batch_end

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

"""The live registry of replicas: configuration, health, scraped metrics and the
gateway's own in-flight counts, turned into the plain ``ReplicaView`` snapshot the
scheduler decides on.

The snapshot is kept, not rebuilt per decision: a ``ReplicaTable`` (the scheduler's
struct of arrays) whose row for a replica is rebuilt only after one of the fields its
view reads changed (a scrape, a lease taken or given back, a failure mark, a new
config). At 256 replicas rebuilding every view per decision was most of the picker's
CPU. Setting such a field on a ``ReplicaState`` is what marks it stale, so no writer
(the scrape, a lease, a test) can forget to.

Health is learned two ways: a periodic probe of ``/metrics`` (which also gives vLLM's
queue and KV numbers) and passive failures seen while proxying, so a dead replica
stops receiving calls within one failed attempt rather than one scrape interval. A replica
whose engine sleeps (vLLM sleep mode: the autoscaler's scale-in victim kept for a hot
start) still answers ``/health``; its ``vllm:engine_sleep_state`` gauge takes it out of
placement until it is awake again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

import httpx
import numpy as np
import structlog

from taskplane.config import GatewayConfig, PoolConfig, ReplicaConfig
from taskplane.engines.probe import HttpProbe, Page, ProbeConnectError, plain
from taskplane.scheduler.table import COL, ReplicaTable
from taskplane.scheduler.types import ReplicaView

log = structlog.get_logger(__name__)

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
    last_scrape: float = 0.0
    kv_events_live: bool = False
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


#: Probe timeouts in a row before calls waiting on the replica give up on it.
PROBE_FAILURES_DOWN = 3
#: A replica with calls in flight that sent no byte back and whose token counters did not
#: move for this long, and whose /health does not answer, is hung (busy ones keep sending).
STALL_S = 5.0


def _notify(listeners: list[Callable[[], None]]) -> None:
    for listener in list(listeners):
        try:
            listener()
        except Exception as exc:  # a listener's failure must not undo the change
            log.warning("registry_listener_failed", error=str(exc))


class ReplicaRegistry:
    """Replicas by name; scrapes their metrics in the background and keeps the
    scheduler's table of their views up to date (see the module docstring)."""

    def __init__(self, config: GatewayConfig, *, scrape_interval_s: float = 1.0) -> None:
        self.config = config
        self.scrape_interval_s = scrape_interval_s
        self.replicas: dict[str, ReplicaState] = {}
        self._table = ReplicaTable()
        self._stale: set[ReplicaState] = set()  # rows to rebuild before the table is read
        self._held: dict[ReplicaState, float] = {}  # marked down until then: the row changes with time
        self._by_model: dict[str, list[ReplicaState]] = {}  # cache, cleared when membership changes
        self._listeners: list[Callable[[], None]] = []
        self._up_listeners: list[Callable[[], None]] = []
        for pool in config.pools:
            for rc in pool.replicas:
                self._add(pool, rc)
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self._probe = HttpProbe()

    # ---- membership ------------------------------------------------------
    def on_membership_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after replicas joined or left, or a replica's config changed
        (the picker's endpoint book rewrites Envoy's endpoints then, instead of polling)."""
        self._listeners.append(listener)

    def on_replica_up(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after a replica joined or came back healthy (calls held for an
        empty pool are placed at once then, instead of polling)."""
        self._up_listeners.append(listener)

    def _members_changed(self) -> None:
        self._by_model.clear()
        _notify(self._listeners)
        _notify(self._up_listeners)

    def add(self, pool: PoolConfig, rc: ReplicaConfig) -> ReplicaState:
        state = self._add(pool, rc)
        self._members_changed()
        return state

    def remove(self, name: str) -> None:
        if self._remove(name):
            self._members_changed()

    def _add(self, pool: PoolConfig, rc: ReplicaConfig) -> ReplicaState:
        state = ReplicaState(config=rc, pool=pool, block_size=rc.block_size or 16)
        self._remove(state.name)
        self.replicas[state.name] = state
        self._table.upsert(state.view())
        state.on_change = self._stale.add
        return state

    def _remove(self, name: str) -> bool:
        state = self.replicas.pop(name, None)
        if state is None:
            return False
        state.on_change = None
        self._stale.discard(state)
        self._held.pop(state, None)
        self._table.remove(name)
        return True

    def set_pool_replicas(self, pool: PoolConfig, configs: list[ReplicaConfig]) -> tuple[list[str], list[str]]:
        """Replace a pool's replica set (discovery); return (added, removed) names."""
        wanted = {rc.replica_name: rc for rc in configs}
        current = {n for n, s in self.replicas.items() if s.pool.model == pool.model}
        added = [n for n in wanted if n not in current]
        removed = [n for n in current if n not in wanted]
        for n in removed:
            self._remove(n)
        for n in added:
            self._add(pool, wanted[n])
        changed = bool(added or removed)
        for n in current - set(removed):  # a kept replica's settings may change (draining)
            if self.replicas[n].config != wanted[n]:
                self.replicas[n].config = wanted[n]
                changed = True
        if changed:
            self._members_changed()
        return added, removed

    def for_model(self, model: str) -> list[ReplicaState]:
        """The replicas serving ``model`` (a cached list: do not modify it)."""
        states = self._by_model.get(model)
        if states is None:
            states = self._by_model[model] = [s for s in self.replicas.values() if s.pool.model == model]
        return states

    def cordoned(self, model: str) -> list[str]:
        """Replicas of ``model`` that take no new session (autoscaler scale-in, pre-drain)."""
        return [s.name for s in self.for_model(model) if s.config.cordoned]

    # ---- the scheduler's snapshot ------------------------------------------
    def table(self) -> ReplicaTable:
        """Every replica's view as the scheduler reads it, with the rows of replicas whose
        state changed since the last read rebuilt (the others are kept). Valid until the
        next change; the scheduler copies it before accounting placements of its own."""
        now = time.monotonic()
        if self._held:
            for s in [s for s, until in self._held.items() if now >= until]:
                del self._held[s]
                self._stale.add(s)
        while self._stale:
            s = self._stale.pop()
            self._table.upsert(s.view(now))
            if s.healthy and s.down_until > now:
                self._held[s] = s.down_until
        return self._table

    def views(self, model: str | None = None) -> list[ReplicaView]:
        return [v for v in self.table().views if model is None or v.model == model]

    def least_loaded(self, model: str, count: int, *, skip: Collection[str] = ()) -> list[ReplicaState]:
        """Up to ``count`` replicas of ``model`` that the scheduler counts healthy, outside
        ``skip``, the least busy first (running plus waiting calls as their views count
        them; ties in registry order): where a call goes if its replica fails. Sorted
        over the table's columns; Python only looks at replicas until ``count`` are found."""
        table = self.table()
        rows = table.pool(model)
        cols = table.columns(rows)
        busy = cols[:, COL["num_running"]] + cols[:, COL["num_waiting"]]
        out: list[ReplicaState] = []
        for i in np.argsort(busy, kind="stable").tolist():
            if len(out) == count:
                break
            view = table.views[int(rows[i])]
            if view.healthy and view.name not in skip:
                out.append(self.replicas[view.name])
        return out

    def acquire(self, replica: ReplicaState, *, prefill_tokens: int, decode_tokens: int,
                last_block: int | None = None) -> Lease:
        """Count a call as in flight on ``replica`` until the returned lease is released.
        ``prefill_tokens``: the prompt tokens it must compute (not those in the prefix cache),
        queued until its first token, and not begun until the replica reports ``last_block``
        (the hash of the last full prompt block it must compute) stored; ``decode_tokens``:
        the most it may generate."""
        return Lease(replica, prefill_tokens=prefill_tokens, decode_tokens=decode_tokens, last_block=last_block)

    def blocks_stored(self, name: str, blocks: Iterable[int]) -> int:
        """The replica stored these prompt blocks in GPU memory (its KV events, the blocks
        named as the KV index names them): the leases whose last prompt block is among them
        have begun their prefill (``Lease.started``). How many."""
        replica = self.replicas.get(name)
        if replica is None or not replica.prefilling:
            return 0
        begun = 0
        for block in blocks:
            for lease in list(replica.prefilling.get(block, ())):
                lease.started()
                begun += 1
        return begun

    def prefilling(self, name: str) -> bool:
        """Some lease on the replica waits for its last prompt block to be stored (its prefill to begin)."""
        replica = self.replicas.get(name)
        return replica is not None and bool(replica.prefilling)

    def note_served(self, replica: ReplicaState, tokens: int) -> None:
        """A served attempt's prompt and completion tokens, for the replica's running total."""
        replica.served_tokens += max(tokens, 0)

    def inflight_total(self) -> int:
        """Calls in flight over every replica (0 when no lease is open: the leak check)."""
        return sum(s.inflight for s in self.replicas.values())

    def mark_failure(self, name: str, *, hard: bool) -> None:
        """A proxied call failed: a hard failure (connect refused, timeout) takes the
        replica out until a scrape sees it again; soft failures (5xx) count up."""
        s = self.replicas.get(name)
        if s is None:
            return
        s.errors += 1
        s.consecutive_failures += 1
        if hard or s.consecutive_failures >= 3:
            s.healthy = False
            s.down_until = time.monotonic() + 2.0
            log.warning("replica_marked_down", replica=name, hard=hard)

    def mark_success(self, name: str) -> None:
        s = self.replicas.get(name)
        if s is not None:
            s.consecutive_failures = 0

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(2.0, connect=1.0))
        self._probe = HttpProbe(timeout_s=2.0, connect_timeout_s=1.0)
        await self.scrape_all()
        self._task = asyncio.create_task(self._loop(), name="replica-scrape")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._client:
            await self._client.aclose()
        await self._probe.aclose()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.scrape_interval_s)
            try:
                await self.scrape_all()
            except Exception as exc:  # never let the loop die
                log.warning("scrape_loop_error", error=str(exc))

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(s) for s in list(self.replicas.values())))

    async def _get(self, url: str) -> Page | httpx.Response:
        """A scrape's GET: the lean probe for plain http (see ``probe``), httpx otherwise."""
        if plain(url):
            return await self._probe.get(url)
        assert self._client is not None
        return await self._client.get(url)

    async def scrape(self, s: ReplicaState) -> None:
        from taskplane.engines.metrics import parse_metrics

        metrics_call, health_call = await asyncio.gather(self._get(s.metrics_url), self._get(s.health_url),
                                                         return_exceptions=True)
        try:
            if isinstance(metrics_call, BaseException):
                raise metrics_call
            metrics_call.raise_for_status()
            m = parse_metrics(metrics_call.text)
        except Exception as exc:
            # Refused or reset: the replica is gone. A timeout may be overload: only after
            # a few in a row do the calls waiting on it give up.
            s.probe_failures += 1
            gone = isinstance(exc, httpx.ConnectError | ProbeConnectError) or (s.probe_failures >= PROBE_FAILURES_DOWN and s.stalled())
            if s.healthy:
                log.warning("replica_unreachable", replica=s.name, error=type(exc).__name__)
            s.healthy = False
            if gone:
                s.signal_down()
            return
        now = time.monotonic()
        progress = float(m.prompt_tokens) + float(m.generation_tokens)
        if progress != s.progress_tokens or s.inflight == 0:
            s.progress_tokens, s.progress_at = progress, now
        health_ok = not isinstance(health_call, BaseException) and health_call.status_code == 200
        if not health_ok:
            # /metrics answers but /health does not: hung, or just busy? A busy engine
            # still makes progress (its token counters move); a hung one does not.
            stalled = s.stalled()
            if s.inflight == 0 or stalled:
                if s.healthy:
                    log.warning("replica_unhealthy", replica=s.name, stalled=stalled,
                                error=type(health_call).__name__ if isinstance(health_call, BaseException)
                                else health_call.status_code)
                s.healthy = False
                if stalled:
                    s.signal_down()
                return
        s.probe_failures = 0
        if m.sleeping:  # answers /health, but takes no calls until woken: out of placement
            if not s.sleeping:
                log.info("replica_sleeping", replica=s.name)
            s.sleeping, s.healthy = True, False
            s.kv_usage, s.num_running, s.num_waiting = 0.0, 0, 0
            return
        s.sleeping = False
        was = s.healthy
        s.healthy = True
        s.consecutive_failures = 0
        s.down_until = 0.0
        s.num_running = int(m.num_running)
        s.num_waiting = int(m.num_waiting)
        s.kv_usage = float(m.kv_cache_usage)
        if m.num_gpu_blocks:
            s.kv_blocks_total = int(m.num_gpu_blocks)
        if m.block_size:
            s.block_size = int(m.block_size)
        s.prefix_queries = float(m.prefix_cache_queries)
        s.prefix_hits = float(m.prefix_cache_hits)
        s.last_scrape = time.monotonic()
        if not was:
            log.info("replica_up", replica=s.name)
            _notify(self._up_listeners)

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

import httpx
import numpy as np
import structlog

from taskplane.config import GatewayConfig, PoolConfig, ReplicaConfig
from taskplane.engines.probe import HttpProbe, Page, plain
from taskplane.engines.replica import Lease, ReplicaState
from taskplane.engines.scrape import apply_models, apply_scrape
from taskplane.scheduler.table import COL, ReplicaTable
from taskplane.scheduler.types import ReplicaView

log = structlog.get_logger(__name__)


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
        self._cordoned: dict[str, list[str]] = {}  # cache, cleared with it (a config changes only there)
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
        self._cordoned.clear()
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
        """Replicas of ``model`` that take no new session (autoscaler scale-in, pre-drain);
        a cached list (do not modify it): every call asks, the fleet changes seldom."""
        names = self._cordoned.get(model)
        if names is None:
            names = self._cordoned[model] = [s.name for s in self.for_model(model) if s.config.cordoned]
        return names

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
        """Probe one replica's ``/metrics`` and ``/health`` and update its state (``scrape.py``)."""
        metrics_call, health_call = await asyncio.gather(self._get(s.metrics_url), self._get(s.health_url),
                                                         return_exceptions=True)
        if apply_scrape(s, metrics_call, health_call):
            _notify(self._up_listeners)
        if s.max_loras and s.healthy:  # LoRA on: which adapters are registered there
            try:
                apply_models(s, await self._get(f"{s.config.url}/v1/models"))
            except Exception as exc:
                apply_models(s, exc)

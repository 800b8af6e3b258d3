"""The discrete-event cluster simulator: many simulated replicas in virtual time.

The same engine model as the HTTP replica (:class:`~taskplane.sim.engine.SimEngine`) and
the same scheduler core as the gateway run under one ``heapq`` event loop: no sockets,
no sleeping, no wall clock. The same inputs and seed give bit-identical records.

The placement policy is either a plain callable ``place(request, replicas) -> Decision``
or an object with the :class:`taskplane.scheduler.core.Scheduler` interface, whose
optional parts are used when present:

- ``decide(request, replicas, now_s)`` instead of calling the object;
- ``release(replicas, now_s) -> [(request, decision)]`` to hand out calls it queued
  (without it, the simulator keeps QUEUE'd calls itself, in priority then deadline order,
  and offers them again whenever capacity frees);
- ``pending``: False when ``release`` has nothing to hand out (nothing queued): the
  simulator then skips the call;
- ``observe_completion(request, outcome, now_s)`` after every placed call;
- ``on_kv_events(replica, events)``: the replicas' KV events, at the virtual time they
  happen (the engines only produce events when this exists);
- ``replica_failed(replica)`` when an outage begins.

Block hashes: a prompt's blocks are named by integer *contents* (see
:mod:`taskplane.sim.workloads.base`); block ``j`` with content ``c`` has the hash that
:func:`taskplane.scheduler.hashing.chain_hashes` gives a block of ``block_size`` tokens
all equal to ``c``, chained on block ``j-1``. BlockStored events carry those tokens, so
the scheduler's KV index, which re-hashes event tokens, meets the request's hashes.

Admission outcomes: QUEUE holds the call (see above); SHED is recorded as an attempt
with outcome ``shed`` and retried after ``retry_after_s`` while the task's deadline
allows and attempts remain; UNMEETABLE fails the task (``failed-deadline``);
NO_REPLICA is retried after a second. A replica outage aborts its calls (recorded as
``error`` / ``replica_error``), which are retried elsewhere.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from taskplane.scheduler.hashing import RepeatedBlocks, repeated_block_hash
from taskplane.scheduler.table import ReplicaTable
from taskplane.scheduler.types import Action, CallOutcome, CallRequest, Decision, ReplicaView
from taskplane.sim.engine import Finished, KVEvents, SimEngine, SimRequest
from taskplane.sim.gpus import gpu_profile
from taskplane.sim.workloads.base import TaskSpec, Workload
from taskplane.store.records import AttemptRecord, Outcome, TaskRecord, TaskStatus

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1
_PRIO = {"critical": 0, "interactive": 1, "standard": 2, "batch": 3}

# event kinds, in the order they are handled at equal times: arrivals first, so calls that
# arrive together start in the same engine step
_ARRIVAL, _OUTAGE, _WAKE, _TICK = 0, 1, 2, 3
_CONTROL = 4  # an extension's own event (taskplane.sim.fleet: autoscaler ticks, replicas ready)
_INF = math.inf
_heappush = heapq.heappush

# enum members as module constants: an Enum attribute lookup costs ~70 ns on Python 3.11,
# and the loop below compares actions and outcomes several times per call
_PLACE, _QUEUE, _SHED, _UNMEETABLE = Action.PLACE, Action.QUEUE, Action.SHED, Action.UNMEETABLE
_SUCCESS, _ERROR, _TIMEOUT = Outcome.SUCCESS, Outcome.ERROR, Outcome.TIMEOUT


def _require_field_order(cls: type, names: tuple[str, ...]) -> None:
    """Fail at import if ``cls`` no longer starts with ``names``, in that order.

    The simulator builds CallRequest, CallOutcome and SimRequest (one or more per call)
    with positional arguments: keywords cost ~2.5x as much for a dataclass of ~20 fields."""
    got = tuple(f.name for f in dataclasses.fields(cls))[: len(names)]
    if got != names:
        raise TypeError(f"{cls.__name__} fields changed: expected {names}, got {got}")


_require_field_order(CallRequest, (
    "model", "prompt_tokens", "max_tokens", "block_hashes", "tenant", "priority", "session_id", "task_id", "step",
    "steps_remaining", "budget_ms", "sunk_cost_usd", "allow_fallback", "now_s", "agent", "call_id", "block_size",
    "tokenized", "avoid_replicas"))
_require_field_order(CallOutcome, (
    "replica", "ok", "gpu", "prompt_tokens", "cached_tokens", "completion_tokens", "queue_s", "ttft_s", "total_s",
    "batch_size"))
_require_field_order(SimRequest, (
    "req_id", "prompt_tokens", "output_tokens", "block_hashes", "output_block_hashes", "token_ids", "tag"))


# ------------------------------------------------------------------ inputs


@dataclass(slots=True)
class ReplicaSpec:
    name: str
    gpu: str = "h100"
    model: str = "llama-3.1-8b"
    kv_blocks: int | None = None  # default: what vLLM would allocate on this GPU for this model
    cost_per_hour_usd: float | None = None  # default: the GPU's list price (taskplane.sim.gpus)
    model_loaded: bool = True
    cold_start_s: float | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    outages: list[tuple[float, float | None]] = field(default_factory=list)  # (down_at_s, up_at_s)


@dataclass(slots=True)
class ClusterSpec:
    replicas: list[ReplicaSpec]

    @classmethod
    def fleet(cls, spec: str = "h100:16", *, model: str = "llama-3.1-8b", kv_blocks: int | None = None,
              **kw: Any) -> ClusterSpec:
        """``"h100:8,l40s:8"`` -> 16 replicas named ``h100-0``.. ``l40s-7``."""
        reps: list[ReplicaSpec] = []
        for part in spec.split(","):
            gpu, _, count = part.strip().partition(":")
            gpu_profile(gpu)  # validate
            for i in range(int(count or 1)):
                reps.append(ReplicaSpec(name=f"{gpu}-{i}", gpu=gpu, model=model, kv_blocks=kv_blocks, **kw))
        return cls(reps)


# ------------------------------------------------------------------ outputs


@dataclass(slots=True)
class CallRecord:
    """One attempt of one call, in virtual seconds (converted to AttemptRecord on demand)."""

    attempt_key: str
    task_id: str
    step: int
    attempt: int
    session_id: str
    tenant: str
    agent: str
    priority: str
    model_requested: str
    model_served: str | None
    replica: str | None
    gpu: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    offered_s: float  # first offered to the policy (this attempt)
    dispatched_s: float | None  # sent to a replica
    admitted_s: float | None  # the engine scheduled it
    first_token_s: float | None
    finished_s: float
    gpu_seconds: float
    cost_usd: float
    outcome: Outcome
    error_type: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.offered_s

    @property
    def queue_s(self) -> float:
        return (self.admitted_s if self.admitted_s is not None else self.finished_s) - self.offered_s

    @property
    def total_s(self) -> float:
        return self.finished_s - self.offered_s


@dataclass(slots=True)
class TaskResult:
    task_id: str
    agent: str
    tenant: str
    priority: str
    status: TaskStatus
    arrival_s: float
    finished_s: float | None
    deadline_s: float | None  # absolute
    deadline_met: bool | None
    cost_usd: float
    attempts: int
    retries: int
    calls_done: int
    calls_total: int
    error: str | None = None


@dataclass(slots=True)
class ReplicaResult:
    name: str
    gpu: str
    cost_per_hour_usd: float
    busy_s: float
    steps: int
    prefix_queries: int
    prefix_hits: int
    finished: int


@dataclass
class ClusterResult:
    calls: list[CallRecord]
    tasks: list[TaskResult]
    replicas: list[ReplicaResult]
    end_s: float  # virtual time of the last event
    decision_ns: array  # wall time of each policy call (not deterministic; not in records)
    policy_calls: int = 0

    @property
    def fleet_gpu_seconds(self) -> float:
        return self.end_s * len(self.replicas)

    @property
    def fleet_cost_usd(self) -> float:
        """Every replica paid for the whole run (idle included): the fully loaded spend."""
        return sum(r.cost_per_hour_usd for r in self.replicas) * self.end_s / 3600.0

    def attempt_records(self, epoch: datetime = EPOCH) -> list[AttemptRecord]:
        """The calls as the rows the gateway writes to Postgres."""
        out = []
        for c in self.calls:
            out.append(AttemptRecord.model_construct(
                attempt_key=c.attempt_key, task_id=c.task_id, step=c.step, attempt=c.attempt,
                session_id=c.session_id, tenant=c.tenant, agent=c.agent, model_requested=c.model_requested,
                model_served=c.model_served, replica=c.replica, gpu=c.gpu, prompt_tokens=c.prompt_tokens,
                cached_tokens=c.cached_tokens, completion_tokens=c.completion_tokens,
                queue_ms=c.queue_s * 1000.0, ttft_ms=None if c.ttft_s is None else c.ttft_s * 1000.0,
                total_ms=c.total_s * 1000.0, gpu_seconds=c.gpu_seconds, price_version=None,
                cost_usd=c.cost_usd, outcome=c.outcome, error_type=c.error_type,
                started_at=epoch + timedelta(seconds=c.offered_s),
            ))
        return out

    def task_records(self, epoch: datetime = EPOCH) -> list[TaskRecord]:
        out = []
        for t in self.tasks:
            out.append(TaskRecord.model_construct(
                task_id=t.task_id, agent=t.agent, tenant=t.tenant, priority=t.priority, status=t.status,
                deadline=None if t.deadline_s is None else epoch + timedelta(seconds=t.deadline_s),
                deadline_met=t.deadline_met, started_at=epoch + timedelta(seconds=t.arrival_s),
                finished_at=None if t.finished_s is None else epoch + timedelta(seconds=t.finished_s),
                cost_usd=t.cost_usd, attempts=t.attempts, retries=t.retries, error=t.error,
            ))
        return out

    def summary(self) -> dict[str, Any]:
        ok = [c for c in self.calls if c.outcome == Outcome.SUCCESS]
        ttfts = sorted(c.ttft_s for c in ok if c.ttft_s is not None)
        prompt = sum(c.prompt_tokens for c in ok)
        succeeded = sum(1 for t in self.tasks if t.status == TaskStatus.SUCCEEDED)

        def pct(p: float) -> float | None:
            return ttfts[min(len(ttfts) - 1, int(p * len(ttfts)))] if ttfts else None

        return {
            "calls": len(self.calls), "calls_ok": len(ok), "tasks": len(self.tasks), "tasks_succeeded": succeeded,
            "ttft_p50_s": pct(0.5), "ttft_p99_s": pct(0.99),
            "prefix_hit_ratio": (sum(c.cached_tokens for c in ok) / prompt) if prompt else 0.0,
            "end_s": self.end_s, "fleet_cost_usd": self.fleet_cost_usd,
            "attempt_cost_usd": sum(c.cost_usd for c in self.calls),
        }


# ------------------------------------------------------------------ block hashes


def mix(a: int, b: int) -> int:
    """A 63-bit content id from two ints (splitmix64 finaliser)."""
    z = (a * 0x9E3779B97F4A7C15 + b + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & _MASK63


def block_contents(spec: TaskSpec, start: int, stop: int, block_size: int) -> list[int]:
    """The content ids of blocks ``start..stop-1`` of a closed-loop task: the agent's shared
    system prompt while it lasts (its whole blocks), then the task's own tokens; each block
    is its id repeated. One rule for the simulator and the hit-ceiling model."""
    n_prefix = spec.prefix_tokens // block_size
    key, seed = spec.prefix_key, spec.seed
    return [mix(key if j < n_prefix else seed, j) for j in range(start, stop)]


# ------------------------------------------------------------------ runtime state


@dataclass(slots=True, eq=False)
class _Task:
    spec: TaskSpec
    idx: int = 0  # next call to issue (closed loop)
    ctx: int = 0  # context tokens so far (closed loop)
    contents: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    cost: float = 0.0
    attempts: int = 0
    retries: int = 0
    done_calls: int = 0
    failed: str | None = None
    status: TaskStatus | None = None
    finished_s: float | None = None
    deadline_abs: float | None = None


@dataclass(slots=True, eq=False)
class _Call:
    task: _Task
    step: int
    prompt_tokens: int
    output_tokens: int
    n_prompt_blocks: int
    n_total_blocks: int
    key: str  # "task:step:attempt": the attempt's record key, call id and engine request id
    # the chain hashes / contents of the call's blocks (a closed-loop task's lists only grow,
    # so calls share them; an open-loop call has its own)
    hashes: list[int]
    contents: list[int]
    attempt: int = 1
    offered_s: float = 0.0
    dispatched_s: float | None = None
    request: CallRequest | None = None
    replica: int = -1
    model_served: str | None = None
    avoid: tuple[str, ...] = ()


# ------------------------------------------------------------------ the simulator


Policy = Any  # a callable place(request, replicas) -> Decision, or a Scheduler-like object


class ClusterSim:
    """One run of a workload on a cluster under a policy. Call :meth:`run` once."""

    def __init__(
        self,
        cluster: ClusterSpec,
        workload: Workload,
        policy: Policy,
        *,
        seed: int = 0,
        max_attempts: int = 3,
        retry_after_s: float = 1.0,
        requeue_interval_s: float = 0.5,
        until_s: float | None = None,
    ) -> None:
        self.cluster, self.workload, self.seed = cluster, workload, seed
        self.bs = workload.block_size
        self.max_attempts, self.retry_after_s = max_attempts, retry_after_s
        self.requeue_interval_s = requeue_interval_s
        self.until_s = math.inf if until_s is None else until_s

        if hasattr(policy, "decide"):
            self._decide: Callable[[CallRequest, Any, float], Decision] = policy.decide
        elif callable(policy):
            self._decide = lambda req, views, now: policy(req, views)
        else:
            raise TypeError("policy must be callable or have a decide(request, replicas, now_s) method")
        self._policy = policy
        self._release = getattr(policy, "release", None)
        self._observe = getattr(policy, "observe_completion", None)
        self._on_kv = getattr(policy, "on_kv_events", None)
        self._failed = getattr(policy, "replica_failed", None)

        self.engines: list[SimEngine] = []
        self.views: list[ReplicaView] = []
        self.prices: list[float] = []
        self._index: dict[str, int] = {}
        for i, r in enumerate(cluster.replicas):
            if r.name in self._index:
                raise ValueError(f"duplicate replica name {r.name!r}")
            self._index[r.name] = i
            eng = SimEngine(
                r.gpu, r.model, kv_blocks=r.kv_blocks, block_size=self.bs, max_num_seqs=r.max_num_seqs,
                max_num_batched_tokens=r.max_num_batched_tokens, model_loaded=r.model_loaded,
                cold_start_s=r.cold_start_s, emit_kv_events=self._on_kv is not None, emit_first_token=False,
                removed_per_block=False,
            )
            price = r.cost_per_hour_usd if r.cost_per_hour_usd is not None else eng.gpu.price_per_hour_usd
            self.engines.append(eng)
            self.prices.append(price)
            self.views.append(ReplicaView(
                name=r.name, model=r.model, gpu=r.gpu, cost_per_hour_usd=price, healthy=True,
                model_loaded=r.model_loaded, kv_blocks_total=eng.num_blocks, kv_blocks_free=eng.free_blocks(),
                block_size=self.bs, has_kv_events=self._on_kv is not None, max_num_seqs=r.max_num_seqs))
        # a Scheduler gets the fleet as a ReplicaTable kept up to date row by row (a plain
        # list would be copied into numpy columns on every decision: O(replicas) each)
        self._table = ReplicaTable(self.views) if hasattr(policy, "decide") else None
        self._replicas: Any = self._table if self._table is not None else self.views
        self._healthy = [True] * len(self.engines)
        self._wake_seq = [0] * len(self.engines)  # seq of each replica's live wake entry (0: none)
        self._dirty: set[int] = set()  # replicas whose engine changed since their view was set
        self._unsynced: set[int] = set()  # replicas whose view changed since their table row was written
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._calls_by_id: dict[str, _Call] = {}
        self._own_queue: list[tuple[int, float, int, _Call]] = []
        self._tick_pending = False
        self.records: list[CallRecord] = []
        self.tasks: list[_Task] = []
        self.decision_ns = array("q")
        self._now = 0.0
        self._ran = False

    # ---------------------------------------------------------------- loop
    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq = seq = self._seq + 1
        _heappush(self._heap, (t, kind, seq, payload))

    def run(self) -> ClusterResult:
        if self._ran:
            raise RuntimeError("a ClusterSim runs once; build a new one")
        self._ran = True
        initial = self._initial_events()
        n_init, nxt = len(initial), 1
        heap = self._heap
        if initial:
            heap.append(initial[0])
        heappop, heapreplace = heapq.heappop, heapq.heapreplace
        wake_seq, engines, until = self._wake_seq, self.engines, self.until_s
        engine_events, schedule_wake, issue, offer = self._engine_events, self._schedule_wake, self._issue, self._offer
        while heap:
            t, kind, seq, payload = heap[0]
            if seq <= n_init and nxt < n_init:  # an initial event: the next one takes its place
                heapreplace(heap, initial[nxt])
                nxt += 1
            else:
                heappop(heap)
            if t > until:
                break
            self._now = t
            if kind == _WAKE:
                if seq == wake_seq[payload]:
                    engine_events(payload, engines[payload].advance(t), t)
                    schedule_wake(payload)
            elif kind == _ARRIVAL:
                obj, k = payload
                if type(obj) is _Task:
                    issue(obj, k, t)
                else:
                    offer(obj, t)
            elif kind == _OUTAGE:
                self._outage(payload[0], payload[1], t)
            elif kind == _TICK:
                self._tick_pending = False
                self._release_queued(t)
            elif kind == _CONTROL:
                self._control(payload, t)
        return self._result()

    def _control(self, payload: Any, t: float) -> None:
        """An extension's event (pushed with kind ``_CONTROL``); the plain cluster has none."""

    def _initial_events(self) -> list[tuple[float, int, int, Any]]:
        """The tasks' first arrivals and the outages as heap entries, sorted.

        Their seq numbers are those pushing them one by one in this order would give, so
        simultaneous events keep their order; :meth:`run` feeds them to the heap one at a
        time rather than keeping every task's arrival in it for the whole run (a deep
        heap: each pop then sifts through ~log2(tasks) levels)."""
        events: list[tuple[float, int, int, Any]] = []
        for spec in self.workload.tasks:
            task = _Task(spec=spec, ctx=spec.prefix_tokens)
            if spec.deadline_s is not None:
                task.deadline_abs = spec.arrival_s + spec.deadline_s
            self.tasks.append(task)
            if not spec.calls:
                task.status, task.finished_s = TaskStatus.SUCCEEDED, spec.arrival_s
                continue
            if spec.open_loop:
                for k, c in enumerate(spec.calls):
                    events.append((c.at_s if c.at_s is not None else spec.arrival_s, _ARRIVAL, len(events) + 1,
                                   (task, k)))
            else:
                events.append((spec.arrival_s, _ARRIVAL, len(events) + 1, (task, 0)))
        for i, r in enumerate(self.cluster.replicas):
            for down, up in r.outages:
                events.append((down, _OUTAGE, len(events) + 1, (i, False)))
                if up is not None:
                    events.append((up, _OUTAGE, len(events) + 1, (i, True)))
        events.sort()  # seq numbers are unique: payloads are never compared
        self._seq = len(events)
        return events

    def _schedule_wake(self, i: int) -> None:
        """Arm replica ``i``'s next wake-up; an entry armed earlier goes stale (skipped)."""
        nt = self.engines[i].next_event_time()
        if nt < _INF:
            self._seq = seq = self._seq + 1
            self._wake_seq[i] = seq
            _heappush(self._heap, (nt, _WAKE, seq, i))
        else:
            self._wake_seq[i] = 0

    # ---------------------------------------------------------------- calls
    def _extend_hashes(self, task: _Task, n_blocks: int) -> None:
        """Name blocks ``len(task.hashes)..n_blocks-1``: their contents (kept when given), then
        their chained hashes (``repeated_block_hash``: memoised, shared with the KV index)."""
        hashes, contents = task.hashes, task.contents
        bs = self.bs
        if len(contents) < n_blocks:
            contents.extend(block_contents(task.spec, len(contents), n_blocks, bs))
        parent = hashes[-1] if hashes else _ROOT
        for c in contents[len(hashes):n_blocks]:
            parent = repeated_block_hash(parent, c, bs)
            hashes.append(parent)

    def _issue(self, task: _Task, k: int, t: float) -> None:
        """Call ``k`` of a task arrives."""
        if task.status is not None:
            return
        spec = task.spec
        cs = spec.calls[k]
        bs = self.bs
        if cs.at_s is not None:  # open loop: explicit prompt
            prompt = cs.prompt_tokens or (len(cs.contents or []) * bs)
            task.contents = list(cs.contents or [])
            task.hashes = []
            self._extend_hashes(task, min(len(task.contents), prompt // bs))
            n_prompt = len(task.hashes)
            n_total = n_prompt
            hashes, contents = task.hashes, task.contents
            task.hashes, task.contents = [], []
        else:
            task.ctx += cs.append_tokens
            prompt = task.ctx
            n_prompt = prompt // bs
            n_total = (prompt + cs.output_tokens) // bs
            self._extend_hashes(task, n_total)
            hashes, contents = task.hashes, task.contents
        call = _Call(task, k, prompt, max(1, cs.output_tokens), n_prompt, n_total, f"{spec.task_id}:{k}:1",
                     hashes, contents)  # positional: keywords cost ~2.5x
        self._offer(call, t)

    def _request(self, call: _Call, t: float) -> CallRequest:
        task, spec = call.task, call.task.spec
        budget = None if task.deadline_abs is None else (task.deadline_abs - t) * 1000.0
        # positional, in CallRequest's field order (checked at import): model, prompt_tokens,
        # max_tokens, block_hashes, tenant, priority, session_id, task_id, step,
        # steps_remaining, budget_ms, sunk_cost_usd, allow_fallback, now_s, agent, call_id,
        # block_size, tokenized, avoid_replicas
        return CallRequest(
            spec.model, call.prompt_tokens, call.output_tokens, call.hashes[: call.n_prompt_blocks], spec.tenant,
            spec.priority, spec.session_id or spec.task_id, spec.task_id, call.step, len(spec.calls) - call.step - 1,
            budget, task.cost, spec.allow_fallback, t, spec.agent, call.key, self.bs, True, call.avoid,
        )

    def _snapshot_views(self) -> None:
        """Copy the changed replicas' engine state into their views: the state a policy
        call at this moment would see. Their table rows are written by
        :meth:`_refresh_views`, only before the policy reads them: a replica that changes
        several times between two policy calls has its row written once."""
        dirty = self._dirty
        if not dirty:
            return
        engines, views, healthy = self.engines, self.views, self._healthy
        for i in dirty:
            e, v = engines[i], views[i]
            (v.num_running, v.num_waiting, v.kv_blocks_free, v.inflight_prefill_tokens,
             v.inflight_decode_tokens) = e.load()
            v.model_loaded = e.model_loaded
            v.healthy = healthy[i]
        if self._table is not None:
            self._unsynced |= dirty
        dirty.clear()

    def _refresh_views(self) -> None:
        """Views and table rows up to date, before a policy call."""
        self._snapshot_views()
        unsynced = self._unsynced
        if unsynced:
            upsert, views = self._table.upsert, self.views  # type: ignore[union-attr]
            for i in unsynced:
                upsert(views[i])
            unsynced.clear()

    def _offer(self, call: _Call, t: float) -> None:
        """Ask the policy where the call goes (first offer of an attempt, or a re-offer)."""
        if call.task.status is not None:
            return
        call.offered_s = t
        req = self._request(call, t)
        call.request = req
        self._refresh_views()
        t0 = time.perf_counter_ns()
        decision = self._decide(req, self._replicas, t)
        self.decision_ns.append(time.perf_counter_ns() - t0)
        self._apply(call, decision, t)

    def _apply(self, call: _Call, d: Decision, t: float) -> None:
        a = d.action
        if a == _PLACE:
            self._dispatch(call, d, t)
        elif a == _QUEUE:
            if self._release is not None:  # the policy hands it out later, by call id
                self._calls_by_id[call.key] = call
            else:
                spec = call.task.spec
                dl = call.task.deadline_abs if call.task.deadline_abs is not None else math.inf
                self._seq += 1
                heapq.heappush(self._own_queue, (_PRIO.get(spec.priority, 2), dl, self._seq, call))  # type: ignore[misc]
            self._ensure_tick(t)
        elif a == _SHED:
            self._record_failure(call, t, Outcome.SHED, "overloaded")
            self._retry_or_fail(call, t, d.retry_after_s or self.retry_after_s, "overloaded")
        elif a == _UNMEETABLE:
            self._record_failure(call, t, _ERROR, "deadline_unmeetable")
            self._fail_call(call, t, "deadline_unmeetable")
        else:  # NO_REPLICA
            self._record_failure(call, t, _ERROR, "no_replica")
            self._retry_or_fail(call, t, 1.0, "no_replica")

    def _dispatch(self, call: _Call, d: Decision, t: float) -> None:
        i = self._index.get(d.replica or "")
        if i is None:
            raise ValueError(f"policy placed a call on unknown replica {d.replica!r}")
        call.replica = i
        call.dispatched_s = t
        call.model_served = d.model or call.task.spec.model
        if not self._healthy[i]:
            self._record_failure(call, t, _ERROR, "replica_error", replica=i)
            self._retry_or_fail(call, t, 0.0, "replica_error", avoid=self.views[i].name)
            return
        hashes, n_prompt = call.hashes, call.n_prompt_blocks
        # the request's prompt hashes are the same slice (read-only on both sides)
        prompt_hashes = call.request.block_hashes if call.request is not None else hashes[:n_prompt]
        # the contents list is shared, not copied: a task's list only grows (past this
        # call's blocks, which the engine never reads beyond)
        tokens = RepeatedBlocks(call.contents, self.bs, call.prompt_tokens + call.output_tokens) if self._on_kv else None
        # positional, in SimRequest's field order (checked at import): req_id, prompt_tokens,
        # output_tokens, block_hashes, output_block_hashes, token_ids, tag
        sim = SimRequest(call.key, call.prompt_tokens, call.output_tokens, prompt_hashes,
                         hashes[n_prompt: call.n_total_blocks], tokens, call)
        self.engines[i].submit(sim, t)
        self._dirty.add(i)
        self._schedule_wake(i)

    # ---------------------------------------------------------------- engine events
    def _engine_events(self, i: int, events: list[Any], t: float) -> None:
        if not events:
            return
        self._dirty.add(i)
        freed = False
        for ev in events:
            kind = type(ev)  # the engine's own classes, never subclassed
            if kind is Finished:
                freed = True
                self._finished(i, ev)
            elif kind is KVEvents:
                if self._on_kv is not None:
                    self._on_kv(self.views[i].name, ev.events)
        if freed:
            self._release_queued(t)

    def _finished(self, i: int, ev: Finished) -> None:
        call: _Call = ev.tag
        cost = ev.gpu_seconds * self.prices[i] / 3600.0
        ok = ev.error is None
        self._record(call, ev.time, _SUCCESS if ok else _ERROR, None if ok else "replica_error", i, ev, cost)
        if self._observe is not None and call.request is not None:
            view = self.views[i]
            sent = call.dispatched_s or ev.arrival
            # positional, in CallOutcome's field order (checked at import): replica, ok, gpu,
            # prompt_tokens, cached_tokens, completion_tokens, queue_s, ttft_s, total_s, batch_size
            outcome = CallOutcome(
                view.name, ok, view.gpu, ev.prompt_tokens, ev.cached_tokens, ev.output_tokens,
                (call.dispatched_s or call.offered_s) - call.offered_s,
                None if ev.first_token is None else ev.first_token - sent, ev.time - sent,
                self.engines[i].num_running + 1)
            self._observe(call.request, outcome, ev.time)
        if not ok:
            self._retry_or_fail(call, ev.time, 0.0, "replica_error", avoid=self.views[i].name)
            return
        self._call_succeeded(call, ev.time)

    def _call_succeeded(self, call: _Call, t: float) -> None:
        task = call.task
        spec = task.spec
        task.done_calls += 1
        if spec.open_loop:
            if task.done_calls >= len(spec.calls):
                self._finish_task(task, t)
            return
        task.ctx += call.output_tokens
        k = call.step + 1
        if k >= len(spec.calls):
            self._finish_task(task, t)
            return
        t_next = t + spec.calls[k].gap_s
        if task.deadline_abs is not None and t_next > task.deadline_abs:
            self._end_task(task, task.deadline_abs, TaskStatus.FAILED_DEADLINE, "deadline passed between steps")
            return
        task.idx = k
        self._push(t_next, _ARRIVAL, (task, k))

    def _finish_task(self, task: _Task, t: float) -> None:
        if task.failed:
            self._end_task(task, t, TaskStatus.FAILED, task.failed)
        elif task.deadline_abs is not None and t > task.deadline_abs:
            self._end_task(task, t, TaskStatus.FAILED_DEADLINE, "finished after its deadline")
        else:
            self._end_task(task, t, TaskStatus.SUCCEEDED, None)

    def _end_task(self, task: _Task, t: float, status: TaskStatus, error: str | None) -> None:
        if task.status is not None:
            return
        task.status, task.finished_s, task.failed = status, t, error
        task.hashes = []  # free memory: finished tasks keep only their records
        task.contents = []

    def _retry_or_fail(self, call: _Call, t: float, after_s: float, why: str, avoid: str | None = None) -> None:
        task = call.task
        t_retry = t + after_s
        if call.attempt >= self.max_attempts or (task.deadline_abs is not None and t_retry > task.deadline_abs):
            self._fail_call(call, t, why)
            return
        task.retries += 1
        call.attempt += 1
        call.key = f"{task.spec.task_id}:{call.step}:{call.attempt}"
        call.dispatched_s = None
        call.replica = -1
        if avoid is not None and avoid not in call.avoid:
            call.avoid = (*call.avoid, avoid)
        self._push(t_retry, _ARRIVAL, (call, 0))

    def _fail_call(self, call: _Call, t: float, why: str) -> None:
        task = call.task
        status = TaskStatus.FAILED_DEADLINE if why in ("deadline_unmeetable", "deadline_exceeded") else TaskStatus.FAILED
        if task.spec.open_loop:
            task.failed = task.failed or why
            task.done_calls += 1
            if task.done_calls >= len(task.spec.calls):
                self._end_task(task, t, status, why)
            return
        self._end_task(task, t, status, why)

    # ---------------------------------------------------------------- records
    def _record(self, call: _Call, t: float, outcome: Outcome, error: str | None, replica: int = -1,
                ev: Finished | None = None, cost: float = 0.0) -> None:
        task, spec = call.task, call.task.spec
        name = gpu = None
        if replica >= 0:
            view = self.views[replica]
            name, gpu = view.name, view.gpu
        if ev is None:
            cached = completion = 0
            admitted = first_token = None
            gpu_s = 0.0
        else:
            cached, completion, admitted, first_token, gpu_s = (
                ev.cached_tokens, ev.output_tokens, ev.admitted, ev.first_token, ev.gpu_seconds)
        # positional, in CallRecord's field order (keywords cost ~3x for its 24 fields)
        self.records.append(CallRecord(
            call.key, spec.task_id, call.step, call.attempt, spec.session_id or spec.task_id, spec.tenant,
            spec.agent, spec.priority, spec.model, call.model_served, name, gpu, call.prompt_tokens,
            cached, completion, call.offered_s, call.dispatched_s, admitted, first_token, t, gpu_s, cost, outcome,
            error,
        ))
        self._calls_by_id.pop(call.key, None)
        task.attempts += 1
        task.cost += cost

    def _record_failure(self, call: _Call, t: float, outcome: Outcome, error: str, replica: int = -1) -> None:
        self._record(call, t, outcome, error, replica)

    # ---------------------------------------------------------------- queueing
    def _ensure_tick(self, t: float) -> None:
        if not self._tick_pending:
            self._tick_pending = True
            self._push(t + self.requeue_interval_s, _TICK, None)

    def _release_queued(self, t: float) -> None:
        if self._release is not None:
            if not getattr(self._policy, "pending", True):
                # nothing to hand out: the views are set as a release would have seen them
                # (a later decision sees this state unless the replica changes again)
                self._snapshot_views()
                return
            self._refresh_views()
            t0 = time.perf_counter_ns()
            released = self._release(self._replicas, t)
            if released:
                self.decision_ns.append(time.perf_counter_ns() - t0)
            for req, d in released:
                call = self._calls_by_id.get(req.call_id or "")
                if call is None:
                    continue
                if d.action == _QUEUE:
                    continue
                self._apply(call, d, t)
            if getattr(self._policy, "queued", 0):
                self._ensure_tick(t)
            return
        q = self._own_queue
        while q:
            _, dl, _, call = q[0]
            if call.task.status is not None:
                heapq.heappop(q)
                continue
            if t > dl:
                heapq.heappop(q)
                self._record_failure(call, t, _TIMEOUT, "deadline_exceeded")
                self._fail_call(call, t, "deadline_exceeded")
                continue
            heapq.heappop(q)
            req = self._request(call, t)
            call.request = req
            self._refresh_views()
            t0 = time.perf_counter_ns()
            d = self._decide(req, self._replicas, t)
            self.decision_ns.append(time.perf_counter_ns() - t0)
            if d.action == _QUEUE:
                self._seq += 1
                heapq.heappush(q, (_PRIO.get(call.task.spec.priority, 2), dl, self._seq, call))  # type: ignore[misc]
                break
            self._apply(call, d, t)
        if q:
            self._ensure_tick(t)

    # ---------------------------------------------------------------- outages
    def _outage(self, i: int, up: bool, t: float) -> None:
        eng = self.engines[i]
        if up:
            self._healthy[i] = True
            eng.model_loaded = False  # a restarted replica loads its weights again
        else:
            self._healthy[i] = False
            eng.reset(t)  # every call on it is aborted (and retried elsewhere)
            if self._failed is not None:
                self._failed(self.views[i].name)
        self._dirty.add(i)
        self._engine_events(i, eng.advance(t), t)
        self._schedule_wake(i)
        if up:
            self._release_queued(t)

    # ---------------------------------------------------------------- result
    def _result(self) -> ClusterResult:
        end = self._now
        tasks = []
        for task in self.tasks:
            spec = task.spec
            status = task.status or TaskStatus.RUNNING
            met = None
            if task.deadline_abs is not None and task.status is not None:
                met = status == TaskStatus.SUCCEEDED and (task.finished_s or 0.0) <= task.deadline_abs
            elif task.status is not None:
                met = status == TaskStatus.SUCCEEDED
            tasks.append(TaskResult(
                task_id=spec.task_id, agent=spec.agent, tenant=spec.tenant, priority=spec.priority, status=status,
                arrival_s=spec.arrival_s, finished_s=task.finished_s, deadline_s=task.deadline_abs,
                deadline_met=met, cost_usd=task.cost, attempts=task.attempts, retries=task.retries,
                calls_done=task.done_calls, calls_total=len(spec.calls), error=task.failed,
            ))
        reps = [ReplicaResult(name=v.name, gpu=v.gpu, cost_per_hour_usd=self.prices[i],
                              busy_s=self.engines[i].stats.busy_s, steps=self.engines[i].stats.steps,
                              prefix_queries=self.engines[i].stats.prefix_queries,
                              prefix_hits=self.engines[i].stats.prefix_hits, finished=self.engines[i].stats.finished)
                for i, v in enumerate(self.views)]
        return ClusterResult(calls=self.records, tasks=tasks, replicas=reps, end_s=end, decision_ns=self.decision_ns,
                             policy_calls=len(self.decision_ns))


def _root() -> int:
    from taskplane.scheduler.hashing import ROOT

    return ROOT


_ROOT = _root()


def simulate(cluster: ClusterSpec, workload: Workload, policy: Policy, **kw: Any) -> ClusterResult:
    """Run ``workload`` on ``cluster`` under ``policy`` in virtual time (see :class:`ClusterSim`)."""
    return ClusterSim(cluster, workload, policy, **kw).run()


def round_robin() -> Callable[[CallRequest, list[ReplicaView]], Decision]:
    """The simplest placement: healthy replicas of the model in turn (tests, examples)."""
    state = {"i": 0}

    def place(req: CallRequest, replicas: list[ReplicaView]) -> Decision:
        cands = [r for r in replicas if r.healthy and r.model == req.model and r.name not in req.avoid_replicas]
        if not cands:
            return Decision(Action.NO_REPLICA, reason="no healthy replica")
        r = cands[state["i"] % len(cands)]
        state["i"] += 1
        return Decision(Action.PLACE, replica=r.name, model=r.model)

    return place

"""Plain data crossing the scheduler boundary.

The gateway (live) and the cluster simulator (virtual time) both build a
``ClusterSnapshot`` and a ``CallRequest`` and get back a ``Decision``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


@dataclass(slots=True)
class ReplicaView:
    """What the scheduler knows about one replica at decision time."""

    name: str
    model: str  # the model this replica serves (or will serve after a cold start)
    gpu: str
    cost_per_hour_usd: float
    healthy: bool = True
    model_loaded: bool = True  # weight warmth
    kv_blocks_total: int = 1
    kv_blocks_free: int = 1
    block_size: int = 16
    num_running: int = 0
    num_waiting: int = 0
    inflight_prefill_tokens: int = 0  # prompt tokens queued/being prefilled (gateway's own count)
    # of those, tokens of prompts whose prefill has not begun, by the replica's KV events
    # (what the prefill gate waits for); None: not known, the gate goes by the count above
    unstarted_prefill_tokens: int | None = None
    inflight_decode_tokens: int = 0  # completion tokens still to generate
    has_kv_events: bool = False
    max_num_seqs: int = 256  # the engine's batch limit (vLLM --max-num-seqs)
    kv_host_blocks_total: int = 0  # KV blocks of its host (CPU) tier; 0: GPU only
    # LoRA (vllm:lora_requests_info): the adapters of its running and of its waiting requests,
    # and how many adapters one batch may mix (--max-loras); 0: LoRA not enabled or not known
    max_loras: int = 0
    lora_running: frozenset[str] = frozenset()
    lora_waiting: frozenset[str] = frozenset()
    # the adapters registered there (vLLM's /v1/models: the models whose parent is the base
    # model); None: not known, so every adapter is taken to be served
    lora_served: frozenset[str] | None = None
    # prefill/decode disaggregation (vLLM --kv-transfer-config kv_role): "both" serves whole
    # calls (the aggregated fleet); "prefill" only computes prompts whose KV a decode replica
    # pulls; "decode" generates, pulling the prompt's KV from the prefill replica named
    role: str = "both"
    # several base models on one GPU (vLLM sleep mode, one engine per model): the models hosted
    # here asleep, whose engines' vllm:engine_sleep_state shows weights_offloaded (level 1) or
    # discard_all (level 2); a call of one of them costs a swap (``model``'s engine sleeps,
    # that one wakes, the KV cache is lost)
    models_asleep: frozenset[str] = frozenset()
    sleep_level: int = 1
    # when the swap to ``model`` the control plane started here should be done (its clock, s; 0: none)
    swap_ready_s: float = 0.0


@dataclass(slots=True)
class CallRequest:
    """One LLM call as the scheduler sees it."""

    model: str
    prompt_tokens: int
    max_tokens: int
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full prompt blocks
    tenant: str = "default"
    priority: str = "standard"
    session_id: str | None = None
    task_id: str | None = None
    step: int | None = None
    steps_remaining: int | None = None
    budget_ms: float | None = None
    sunk_cost_usd: float = 0.0
    allow_fallback: bool = False
    now_s: float = 0.0  # decision time (wall or virtual), seconds
    agent: str | None = None  # agent name: session-pin TTLs are learned per agent
    call_id: str | None = None  # stable id of the call (correlates decide/observe_completion)
    block_size: int = 16  # tokens per block used to compute block_hashes
    tokenized: bool = True  # False: block_hashes are text_chain_hashes (approximate index only)
    avoid_replicas: tuple[str, ...] = ()  # never place here (a retry after a replica failed)
    tool: str | None = None  # the tool its task ran since the session's previous call (SDK hint)
    # the LoRA adapter the call runs with (vLLM serves it as a model of this name on replicas of
    # ``model``, the base model); None: the base model itself
    adapter: str | None = None


class Priority(StrEnum):
    """A call's priority band, most urgent first; the one rank table of the project."""

    CRITICAL = "critical", 0
    INTERACTIVE = "interactive", 1
    STANDARD = "standard", 2
    BATCH = "batch", 3

    rank: int  # 0 is the most urgent band

    def __new__(cls, value: str, rank: int = 0) -> Priority:  # (the default only for mypy's Priority(name))
        member = str.__new__(cls, value)
        member._value_ = value
        member.rank = rank
        return member

    @classmethod
    def rank_of(cls, name: str) -> int:
        """The rank of a band given by name (any case); unknown names count as standard."""
        try:
            return cls(name).rank
        except ValueError:
            pass
        try:
            return cls(str(name).lower()).rank
        except ValueError:
            return cls.STANDARD.rank


class Action(StrEnum):
    PLACE = "place"
    QUEUE = "queue"  # admission control holds the call
    SHED = "shed"  # 429 overloaded
    UNMEETABLE = "unmeetable"  # 504 deadline_unmeetable
    NO_REPLICA = "no_replica"  # 503


@dataclass(slots=True)
class Decision:
    action: Action
    replica: str | None = None
    model: str | None = None  # the model that will serve (fallback when moved)
    cached_blocks: int = 0
    predicted_ttft_ms: float | None = None
    predicted_total_ms: float | None = None
    scores: dict[str, float] = field(default_factory=dict)  # plugin -> score of the chosen replica
    reason: str = ""
    retry_after_s: float | None = None
    gpu: str | None = None  # GPU generation of the chosen replica
    predicted_queue_ms: float | None = None
    session_moved: bool = False  # the session's pin was broken and it moved to this replica
    # disaggregated: the replica that computes the prompt, whose KV ``replica`` (the decode
    # replica) pulls before it generates; None: ``replica`` serves the whole call
    prefill_replica: str | None = None


@dataclass(slots=True)
class CallOutcome:
    """What happened to a placed call; feeds the latency model, session pins and fairness."""

    replica: str
    ok: bool = True  # False: the replica failed the call (the session's pin is broken)
    gpu: str | None = None  # GPU generation (default: the one recorded at decision time)
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    completion_tokens: int = 0
    queue_s: float = 0.0  # time held in the admission queue
    ttft_s: float | None = None  # dispatch to first token (engine queue + prefill)
    total_s: float | None = None  # dispatch to last token
    batch_size: int | None = None  # running requests on the replica while decoding, if known
    cold_start_s: float | None = None  # weight-load time paid by this call, if any

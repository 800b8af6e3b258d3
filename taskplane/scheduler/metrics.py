"""Prometheus metrics of the scheduling core (registered once per process).

Labels carry the policy name so the simulator can run several policies side by side in
one process. Plugins bind their label children when they are built, so a decision pays
one ``observe`` per plugin and no label lookups.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SCORE_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

DECISIONS = Counter(
    "taskplane_scheduler_decisions_total", "scheduling decisions by outcome", ["policy", "action"]
)
DECISION_SECONDS = Histogram(
    "taskplane_scheduler_decision_seconds",
    "time to compute one decision",
    ["policy"],
    buckets=(25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2),
)
PLUGIN_SCORE = Histogram(
    "taskplane_scheduler_plugin_score",
    "normalised score a scorer gave the chosen replica",
    ["policy", "plugin"],
    buckets=SCORE_BUCKETS,
)
FILTERED = Counter(
    "taskplane_scheduler_filtered_replicas_total",
    "candidate replicas a filter removed",
    ["policy", "plugin"],
)
PLACEMENTS = Counter(
    "taskplane_scheduler_placements_total", "calls placed per replica", ["policy", "replica"]
)
QUEUE_DEPTH = Gauge(
    "taskplane_scheduler_queue_depth", "calls held by admission control", ["policy", "pool", "band"]
)
SHED = Counter(
    "taskplane_scheduler_shed_total",
    "calls refused by admission control",
    ["policy", "band", "reason"],
)
LIFETIME_PLANS = Counter(
    "taskplane_scheduler_kv_lifetime_plans_total",
    "KV lifetimes planned for sessions going into a tool gap (keep, host, drop)",
    ["policy", "action"],
)
TOOL_HINTS = Counter(
    "taskplane_scheduler_tool_hints_total",
    "calls that named the tool their task ran since the session's previous call (X-Taskplane-Tool)",
    ["policy"],
)
BACKLOG_HELD = Counter(
    "taskplane_scheduler_backlog_held_total",
    "calls held in flow control because every eligible replica's queued prefill exceeded "
    "max_prefill_backlog_ms (late binding)",
    ["policy"],
)
GATE_HELD = Counter(
    "taskplane_scheduler_prefill_gate_held_total",
    "calls of a pinned session held until their replica's in-flight prefill was done (serial_prefill)",
    ["policy"],
)
MOVED = Counter(
    "taskplane_scheduler_moved_total", "calls moved to a fallback model", ["policy", "model"]
)

KV_EVENTS = Counter("taskplane_kvindex_events_total", "KV events applied to the precise index", ["type"])
KV_EVENTS_STORED = KV_EVENTS.labels("BlockStored")
KV_EVENTS_REMOVED = KV_EVENTS.labels("BlockRemoved")
KV_EVENTS_CLEARED = KV_EVENTS.labels("AllBlocksCleared")
KV_BATCHES = Counter("taskplane_kvindex_batches_total", "KV event batches by outcome", ["outcome"])
KV_UNCHAINED = Counter(
    "taskplane_kvindex_unchained_blocks_total",
    "stored blocks skipped because their parent block is unknown (missed events)",
)
KV_BLOCKS = Gauge("taskplane_kvindex_blocks", "distinct block hashes indexed", ["index"])
KV_BLOCKS_PRECISE = KV_BLOCKS.labels("precise")
KV_BLOCKS_APPROX = KV_BLOCKS.labels("approximate")

"""Parse a vLLM (or simulated vLLM) ``/metrics`` page into a small typed snapshot.

Only what placement and the reports need. Values are summed over label sets (several
engines or models behind one endpoint); pass ``model`` to keep one ``model_name``.
Names follow vLLM V1 (``vllm:kv_cache_usage_perc``, a fraction 0..1 despite its name),
with V0's ``vllm:gpu_cache_usage_perc`` accepted as a fallback. ``sleeping`` comes from
``vllm:engine_sleep_state{sleep_state="awake"}`` (0 while the engine sleeps: vLLM's
``/health`` still answers 200 then, so this gauge is how a scrape tells). The LoRA fields
come from ``vllm:lora_requests_info``: vLLM keeps every label set it ever set, each valued
at the time it was set, so the newest (highest value) is the current one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(slots=True)
class MetricsSnapshot:
    num_running: float = 0.0
    num_waiting: float = 0.0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    prefix_cache_queries: float = 0.0  # tokens
    prefix_cache_hits: float = 0.0  # tokens
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    ttft_sum_s: float = 0.0
    ttft_count: float = 0.0
    e2e_sum_s: float = 0.0
    e2e_count: float = 0.0
    models: list[str] = field(default_factory=list)  # model_name labels seen
    sleeping: bool = False  # vLLM sleep mode: an engine reports awake = 0
    max_loras: int = 0  # --max-loras; 0: the page has no vllm:lora_requests_info
    lora_running: frozenset[str] = frozenset()  # adapters of the running requests
    lora_waiting: frozenset[str] = frozenset()  # adapters of the waiting requests

    @property
    def prefix_hit_ratio(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def ttft_mean_s(self) -> float | None:
        return self.ttft_sum_s / self.ttft_count if self.ttft_count else None


# sample name -> snapshot attribute (summed)
_SUMS = {
    "vllm:num_requests_running": "num_running",
    "vllm:num_requests_waiting": "num_waiting",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:time_to_first_token_seconds_sum": "ttft_sum_s",
    "vllm:time_to_first_token_seconds_count": "ttft_count",
    "vllm:e2e_request_latency_seconds_sum": "e2e_sum_s",
    "vllm:e2e_request_latency_seconds_count": "e2e_count",
}
_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def _int_label(value: str | None) -> int | None:
    if value is None or value in ("", "None", "null"):
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


_SUFFIXES = ("_total", "_sum", "_count", "_bucket", "_created")
_SLEEP = "vllm:engine_sleep_state"
_LORA = "vllm:lora_requests_info"
_NEEDED_SAMPLES = frozenset([*_SUMS, *_USAGE, "vllm:cache_config_info", _SLEEP, _LORA])


def _family(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


_NEEDED_FAMILIES = frozenset(_family(n) for n in _NEEDED_SAMPLES)


def relevant_lines(text: str) -> str:
    """Only the lines of the samples this module reads (and their families' ``# TYPE`` /
    ``# HELP`` lines).

    Why: a real vLLM page is about 55 KB, mostly histogram buckets; the Prometheus text
    parser spends about 40 ms on it, and the gateway parses every replica's page every
    second on its event loop, where that time delays every call in flight. The few lines
    kept parse in well under a millisecond, to the same values.
    """
    keep: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP") and parts[2] in _NEEDED_FAMILIES:
                keep.append(line)
            continue
        end = len(line)
        for sep in ("{", " "):
            i = line.find(sep)
            if 0 <= i < end:
                end = i
        if line[:end] in _NEEDED_SAMPLES:
            keep.append(line)
    return "\n".join(keep) + "\n" if any(line[0] != "#" for line in keep) else ""


def parse_metrics(text: str, model: str | None = None) -> MetricsSnapshot:
    """Parse Prometheus exposition text; raises ValueError if it is not parseable."""
    snap = MetricsSnapshot()
    usage: dict[str, list[float]] = {name: [] for name in _USAGE}
    models: set[str] = set()
    lora_at = float("-inf")
    kept = relevant_lines(text)
    try:
        # A page with none of our samples is parsed whole, so junk still raises.
        families = list(text_string_to_metric_families(kept if kept.strip() else text))
    except Exception as exc:  # the parser raises bare ValueError/TypeError on junk
        raise ValueError(f"not Prometheus text: {exc}") from exc
    for fam in families:
        for s in fam.samples:
            name, labels, value = s.name, s.labels, s.value
            mname = labels.get("model_name")
            if mname is not None:
                models.add(mname)
                if model is not None and mname != model:
                    continue
            attr = _SUMS.get(name)
            if attr is not None:
                setattr(snap, attr, getattr(snap, attr) + value)
            elif name in usage:
                usage[name].append(value)
            elif name == _SLEEP:
                if labels.get("sleep_state") == "awake" and value == 0:
                    snap.sleeping = True
            elif name == _LORA:
                if value >= lora_at:
                    lora_at = value
                    _apply_lora(snap, labels)
            elif name == "vllm:cache_config_info":
                bs, nb = _int_label(labels.get("block_size")), _int_label(labels.get("num_gpu_blocks"))
                if bs is not None:
                    snap.block_size = bs
                if nb is not None:
                    snap.num_gpu_blocks = (snap.num_gpu_blocks or 0) + nb
    for name in _USAGE:
        if usage[name]:
            snap.kv_cache_usage = sum(usage[name]) / len(usage[name])
            break
    snap.models = sorted(models)
    return snap


def _adapter_set(value: str | None) -> frozenset[str]:
    return frozenset(a for a in (value or "").split(",") if a)


def _apply_lora(snap: MetricsSnapshot, labels: dict[str, str]) -> None:
    snap.max_loras = _int_label(labels.get("max_lora")) or 0
    snap.lora_running = _adapter_set(labels.get("running_lora_adapters"))
    snap.lora_waiting = _adapter_set(labels.get("waiting_lora_adapters"))

"""The simulated replica's ``/metrics``: vLLM's metric names, read from the engine at scrape time."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from taskplane.sim.engine import SimEngine

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class EngineCollector(Collector):
    """Gauges and counters read from the engine at scrape time, with vLLM's names."""

    def __init__(self, engine: SimEngine, model: str) -> None:
        self.engine, self.model = engine, model

    def collect(self) -> Iterable[Any]:
        e, model = self.engine, self.model
        lv = [model, "0"]
        labels = ["model_name", "engine"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(lv, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(lv, value)
            return c

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", e.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", e.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv_usage())
        s = e.stats
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                      s.prefix_queries)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                      s.prefix_hits)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens)
        yield counter("vllm:request_success", "Count of successfully processed requests.", s.finished)
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
            labels=["block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization",
                    "num_gpu_blocks", "num_cpu_blocks", "engine"])
        info.add_metric([str(e.block_size), "auto", "True", "0.9", str(e.num_blocks), "0", "0"], 1.0)
        yield info

"""The shared parsers: KV-event payloads in every shape vLLM has sent, and /metrics text."""

from __future__ import annotations

import msgspec
import pytest

from taskplane.engines.kv_events import replay_endpoint_for
from taskplane.engines.metrics import parse_metrics
from taskplane.scheduler.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decode_batch,
    encode_batch,
    fold_hash,
)

enc = msgspec.msgpack.Encoder()


def test_round_trip_of_what_the_simulator_sends() -> None:
    events = [BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=list(range(32)), block_size=16),
              BlockRemoved(block_hashes=[1]), AllBlocksCleared()]
    raw = msgspec.msgpack.decode(encode_batch(12.5, events))
    # vLLM's envelope: [ts, [events], dp_rank]; events are maps tagged by "type"
    assert raw[0] == 12.5 and raw[2] == 0
    assert raw[1][0]["type"] == "BlockStored" and raw[1][0]["medium"] == "GPU"
    assert raw[1][2] == {"type": "AllBlocksCleared"}
    batch = decode_batch(encode_batch(12.5, events))
    assert batch.ts == 12.5 and batch.events == events


def test_decodes_vllm_0_31_capture_shape() -> None:
    """Tagged maps with the newer fields (lora_name, extra_keys, group_idx, kv_cache_spec_kind)."""
    stored = {"type": "BlockStored", "block_hashes": [2**63 + 5], "parent_block_hash": None,
              "token_ids": list(range(16)), "block_size": 16, "lora_id": None, "medium": "GPU",
              "lora_name": None, "extra_keys": [None], "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    removed = {"type": "BlockRemoved", "block_hashes": [2**63 + 5], "medium": "GPU", "group_idx": 0}
    batch = decode_batch(enc.encode([1.0, [stored, removed, {"type": "AllBlocksCleared"}], 0]))
    assert isinstance(batch.events[0], BlockStored) and batch.events[0].block_hashes == [2**63 + 5]
    assert isinstance(batch.events[1], BlockRemoved) and isinstance(batch.events[2], AllBlocksCleared)
    assert batch.data_parallel_rank == 0


def test_decodes_array_like_events_map_batches_and_byte_hashes() -> None:
    digest = bytes(range(32))
    old = ["BlockStored", [digest], None, list(range(16)), 16, None]  # early vLLM: tagged arrays
    batch = decode_batch(enc.encode([2.0, [old, ["BlockRemoved", [7]], ["AllBlocksCleared"]]]))
    assert batch.events[0].block_hashes == [int.from_bytes(digest[-8:], "big")]  # type: ignore[union-attr]
    assert batch.events[1] == BlockRemoved(block_hashes=[7])
    as_map = decode_batch(enc.encode({"ts": 3.0, "events": [{"type": "AllBlocksCleared"}],
                                      "data_parallel_rank": 1}))
    assert as_map.ts == 3.0 and as_map.data_parallel_rank == 1 and as_map.events == [AllBlocksCleared()]
    skipped = decode_batch(enc.encode([4.0, [{"type": "SomethingNew", "x": 1}], 0]))
    assert skipped.events == []
    assert fold_hash(-5) == -5  # SGLang's signed hashes pass through
    assert replay_endpoint_for("tcp://127.0.0.1:5557") == "tcp://127.0.0.1:6557"
    with pytest.raises(ValueError):
        decode_batch(b"\xc1")
    with pytest.raises(ValueError):
        decode_batch(enc.encode(5))


VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 624.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="tiny"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 0.8
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="585",num_gpu_blocks_override="None"} 1.0
"""


def test_parse_vllm_metrics_text() -> None:
    m = parse_metrics(VLLM_METRICS)
    assert (m.num_running, m.num_waiting, m.kv_cache_usage) == (3.0, 1.0, 0.25)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (1000.0, 624.0)
    assert m.prefix_hit_ratio == pytest.approx(0.624)
    assert (m.block_size, m.num_gpu_blocks) == (16, 585)
    assert m.ttft_count == 4 and m.ttft_mean_s == pytest.approx(0.2)
    assert m.models == ["tiny"]
    assert parse_metrics(VLLM_METRICS, model="other").num_running == 0
    v0 = parse_metrics('vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n')
    assert v0.kv_cache_usage == 0.5

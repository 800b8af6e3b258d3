"""vLLM's NixlConnector on the simulated replica (``--kv-transfer-config``).

The protocol is vLLM's, carried in a request's ``kv_transfer_params``:

- A prefill request (``{"do_remote_decode": true}``, sent with ``max_tokens: 1``) computes
  the prompt and answers with ``kv_transfer_params`` naming where its blocks are:
  ``{do_remote_prefill: true, do_remote_decode: false, remote_engine_id, remote_block_ids,
  remote_host, remote_port, remote_request_id, tp_size}``.
- A decode request carries those back (``do_remote_prefill: true``): the replica pulls the
  blocks from the named prefill replica before it schedules the call. The pull is a real
  HTTP request to the prefiller's side channel (``POST /kv_transfer/pull`` on its serving
  port; vLLM's NIXL side channel is a ZMQ port of its own), and the transfer takes
  ``bytes / link_gbps`` (``kv_connector_extra_config.link_gbps``, default 25 GB/s) of
  virtual time. The pulled blocks are stored in the decoder's prefix cache (BlockStored
  events), so the call and the session's next turns hit them.
- A failed pull (prefiller unreachable, another engine id, blocks evicted or already taken)
  is counted in ``vllm:nixl_num_failed_transfers`` and the prompt is recomputed locally:
  vLLM's default ``kv_load_failure_policy`` ("recompute").

Metrics (vLLM's NixlPromMetrics names): ``vllm:nixl_xfer_time_seconds``,
``vllm:nixl_bytes_transferred`` (histograms), ``vllm:nixl_num_failed_transfers``,
``vllm:nixl_num_kv_expired_reqs`` (prefill side: blocks never pulled within the timeout), and
vLLM's ``vllm:external_prefix_cache_queries`` / ``_hits`` (decode side: prompt tokens of
``do_remote_prefill`` calls, and those that arrived over the connector).

Unlike vLLM, the prefiller does not pin the blocks it keeps for pickup: they stay in its
prefix cache, evictable; a pull after their eviction fails (and the decoder recomputes).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog
from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily

from taskplane.sim.gpus import model_profile
from taskplane.sim.openai_api import ApiError
from taskplane.sim.textgen import engine_block_hashes

log = structlog.get_logger(__name__)

ROLES = ("kv_producer", "kv_consumer", "kv_both")
CONNECTORS = ("NixlConnector",)
DEFAULT_LINK_GBPS = 25.0
ABORT_TIMEOUT_S = 480.0  # vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT: unclaimed blocks are freed after it
XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
BYTES_BUCKETS = tuple(float(2 ** k) for k in range(16, 36, 2))


@dataclass(frozen=True, slots=True)
class KVTransferConfig:
    """vLLM's ``--kv-transfer-config`` JSON (the fields the simulator reads)."""

    kv_connector: str
    kv_role: str = "kv_both"
    link_gbps: float = DEFAULT_LINK_GBPS  # kv_connector_extra_config.link_gbps: the modelled link

    @classmethod
    def parse(cls, text: str) -> KVTransferConfig:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-transfer-config is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError("--kv-transfer-config must be a JSON object")
        conn, role = raw.get("kv_connector"), raw.get("kv_role", "kv_both")
        if conn not in CONNECTORS:
            raise ValueError(f"kv_connector {conn!r}: the simulator emulates {', '.join(CONNECTORS)}")
        if role not in ROLES:
            raise ValueError(f"kv_role {role!r} must be one of {', '.join(ROLES)}")
        extra = raw.get("kv_connector_extra_config") or {}
        gbps = float(extra.get("link_gbps", DEFAULT_LINK_GBPS))
        if gbps <= 0:
            raise ValueError("kv_connector_extra_config.link_gbps must be positive")
        return cls(kv_connector=str(conn), kv_role=str(role), link_gbps=gbps)

    @property
    def produces(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def consumes(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")


@dataclass(slots=True)
class _Kept:
    token_ids: list[int]
    block_ids: list[int]
    expires: float


@dataclass
class KVConnector:
    """One replica's connector: the blocks it keeps for pickup and the pulls it makes."""

    config: KVTransferConfig
    registry: CollectorRegistry
    host: str = "127.0.0.1"
    port: int = 0
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    kept: dict[str, _Kept] = field(default_factory=dict)
    pulled_tokens: int = 0  # prompt tokens that arrived over the connector (vllm:prompt_tokens_by_source)

    def __post_init__(self) -> None:
        labels = ["model_name", "engine"]
        r = self.registry
        self.xfer_time = Histogram("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV "
                                   "Cache transfers.", labels, buckets=XFER_BUCKETS, registry=r)
        self.xfer_bytes = Histogram("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV "
                                    "Cache transfers.", labels, buckets=BYTES_BUCKETS, registry=r)
        self.failed = Counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.",
                              labels, registry=r)
        self.expired = Counter("vllm:nixl_num_kv_expired_reqs", "Number of requests that had their KV expire.",
                               labels, registry=r)
        # vLLM's connector-side prefix cache: tokens asked of and found through the KV connector
        self.ext_queries = Counter("vllm:external_prefix_cache_queries", "External prefix cache queries from KV "
                                   "connector cross-instance cache sharing, in terms of number of queried tokens.",
                                   labels, registry=r)
        self.ext_hits = Counter("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector "
                                "cross-instance cache sharing, in terms of number of cached tokens.",
                                labels, registry=r)

    # ---------------------------------------------------------------- prefill side
    def keep(self, rep: Any, prompt: list[int], req_id: str) -> dict[str, Any]:
        """Keep a finished prefill's full blocks for pickup; vLLM's answer naming them."""
        self._expire(rep.model)
        n = len(prompt) // rep.block_size
        block_ids = engine_block_hashes(prompt, rep.block_size, rep.root)[:n]
        self.kept[req_id] = _Kept(list(prompt[: n * rep.block_size]), block_ids, time.monotonic() + ABORT_TIMEOUT_S)
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": block_ids,
                "remote_engine_id": self.engine_id, "remote_host": self.host, "remote_port": self.port,
                "remote_request_id": req_id, "tp_size": 1}

    def _expire(self, model: str) -> None:
        now = time.monotonic()
        for rid in [rid for rid, k in self.kept.items() if k.expires < now]:
            del self.kept[rid]
            self.expired.labels(model, "0").inc()

    def hand_over(self, rep: Any, body: dict[str, Any]) -> dict[str, Any]:
        """The side channel: give the kept blocks of a request to the decoder pulling them."""
        if body.get("engine_id") != self.engine_id:
            raise ApiError(404, f"unknown remote engine {body.get('engine_id')!r}")
        kept = self.kept.pop(str(body.get("request_id")), None)
        if kept is None:
            raise ApiError(404, f"no KV blocks kept for request {body.get('request_id')!r}")
        if rep.engine.cached_blocks(kept.block_ids) < len(kept.block_ids):
            raise ApiError(410, "the request's KV blocks were evicted before the pull")
        return {"engine_id": self.engine_id, "token_ids": kept.token_ids, "block_ids": kept.block_ids}

    # ---------------------------------------------------------------- decode side
    async def pull(self, rep: Any, params: dict[str, Any], prompt_tokens: int) -> int:
        """Pull a prefill's blocks into this replica's cache; the blocks stored (0: failed,
        the prompt is recomputed)."""
        model = rep.model
        self.ext_queries.labels(model, "0").inc(prompt_tokens)
        url = f"http://{params.get('remote_host')}:{params.get('remote_port')}/kv_transfer/pull"
        try:
            async with httpx.AsyncClient(timeout=10.0) as client:
                resp = await client.post(url, json={"engine_id": params.get("remote_engine_id"),
                                                    "request_id": params.get("remote_request_id")})
            resp.raise_for_status()
            tokens = [int(t) for t in resp.json()["token_ids"]]
        except (httpx.HTTPError, KeyError, ValueError, TypeError) as exc:
            self.failed.labels(model, "0").inc()
            log.warning("kv_pull_failed", url=url, error=str(exc))
            return 0
        n_bytes = len(tokens) * model_profile(model).kv_bytes_per_token
        secs = n_bytes / (self.config.link_gbps * 1e9)
        await asyncio.sleep(secs / rep.speed)
        hashes = engine_block_hashes(tokens, rep.block_size, rep.root)
        stored = rep.engine.receive(hashes, tokens, rep.vnow())
        rep.wake()
        self.xfer_time.labels(model, "0").observe(secs)
        self.xfer_bytes.labels(model, "0").observe(n_bytes)
        self.ext_hits.labels(model, "0").inc(len(tokens))
        self.pulled_tokens += len(tokens)
        log.info("kv_pulled", remote=f"{params.get('remote_host')}:{params.get('remote_port')}",
                 tokens=len(tokens), stored_blocks=stored, xfer_s=round(secs, 6))
        return stored


class PromptSources:
    """vLLM's ``vllm:prompt_tokens_by_source``: each prompt token computed here
    (``local_compute``), found in this replica's prefix cache (``local_cache_hit``) or
    brought by the KV connector (``external_kv_transfer``). The simulator stores pulled
    blocks in its prefix cache before the call hits them, so they are taken out of the local
    hits here (vLLM never counts them there; ``vllm:prefix_cache_hits`` still does, here)."""

    def __init__(self, stats: Any, connector: KVConnector, model: str) -> None:
        self.stats, self.connector, self.model = stats, connector, model

    def collect(self) -> Any:
        s, ext = self.stats, self.connector.pulled_tokens
        fam = CounterMetricFamily("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                  labels=["model_name", "engine", "source"])
        fam.add_metric([self.model, "0", "local_compute"], max(0, s.prompt_tokens - s.prefix_hits))
        fam.add_metric([self.model, "0", "local_cache_hit"], max(0, s.prefix_hits - ext))
        fam.add_metric([self.model, "0", "external_kv_transfer"], min(ext, s.prefix_hits))
        yield fam


def attach_router(app: FastAPI, rep: Any) -> None:
    """The prefill side's pickup endpoint (the simulator's side channel)."""
    conn: KVConnector = rep.kv_connector

    async def pull(request: Request) -> dict[str, Any]:
        body = await request.json()
        return conn.hand_over(rep, body if isinstance(body, dict) else {})

    app.add_api_route("/kv_transfer/pull", pull, methods=["POST"])


def transfer_params(body: dict[str, Any]) -> dict[str, Any]:
    """A request's ``kv_transfer_params`` (empty when absent or not an object)."""
    p = body.get("kv_transfer_params")
    return p if isinstance(p, dict) else {}

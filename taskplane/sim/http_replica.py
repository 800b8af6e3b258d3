"""One simulated vLLM replica as its HTTP server sees it (``taskplane sim-engine``).

Inside, one :class:`~taskplane.sim.engine.SimEngine` runs on a virtual clock:
``virtual seconds = wall seconds x speed``. With ``--speed 10`` the replica behaves as
a GPU ten times faster; every latency it reports (responses, histograms) is wall time.
A driver task advances the engine whenever its next event is due and wakes the waiting
HTTP handlers (:mod:`taskplane.sim.server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Histogram

from taskplane.engines.tokenize import tokenize
from taskplane.sim.engine import EngineConfig, Finished, FirstToken, KVEvents, SimEngine, SimRequest
from taskplane.sim.faults import Faults, apply_updates, parse_fault_spec
from taskplane.sim.kv_transfer import KVConnector, KVTransferConfig, PromptSources
from taskplane.sim.lora import LoraSettings, hash_root
from taskplane.sim.lora_api import LoraCollector
from taskplane.sim.metrics import E2E_BUCKETS, TTFT_BUCKETS, EngineCollector
from taskplane.sim.openai_api import ApiError
from taskplane.sim.publisher import KVEventPublisher
from taskplane.sim.sleep import SleepCollector, SleepState
from taskplane.sim.streaming import SimCall
from taskplane.sim.structured import (
    Choice,
    SchemaError,
    chat_logprobs,
    completion_logprobs,
    structured_choice,
)
from taskplane.sim.textgen import (
    apply_stop,
    engine_block_hashes,
    engine_root,
    generate_text,
    natural_length,
    request_rng,
)

log = structlog.get_logger(__name__)

DEFAULT_MAX_MODEL_LEN = 8192
STREAM_TICK_S = 0.02  # wall seconds between streamed chunks while decoding


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplicaOptions:
    """What ``taskplane sim-engine`` is started with: the GPU and model, vLLM's engine
    arguments, the clock's speed, faults at start, and where KV events are published."""

    gpu: str = "h100"
    model: str = "llama-3.1-8b"
    kv_blocks: int = 4096
    block_size: int = 16
    seed: int = 0
    speed: float = 1.0  # virtual seconds per wall second
    faults: tuple[str, ...] = ()  # fault specs, e.g. "slow=10", "hang"
    cold_start_s: float = 0.0  # > 0: the first request waits for the weights to load
    max_model_len: int | None = None  # None: DEFAULT_MAX_MODEL_LEN
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_events_port: int | None = None  # None: no KV events
    kv_replay_port: int | None = None  # None: the KV-events port + 1000
    host: str = "127.0.0.1"
    enable_sleep_mode: bool = False
    lora: LoraSettings | None = None  # --enable-lora (None: the base model only)
    lora_modules: tuple[tuple[str, str], ...] = ()  # --lora-modules NAME=PATH: adapters registered at start
    kv_transfer_config: str | None = None  # --kv-transfer-config JSON (vLLM's NixlConnector, kv_transfer.py)
    port: int = 0  # the serving port, named in a prefill's kv_transfer_params


class SimReplica:
    """State of one simulated replica: engine, clock, calls in flight, faults, events."""

    def __init__(self, options: ReplicaOptions = ReplicaOptions()) -> None:
        o = options
        if o.speed <= 0:
            raise ValueError("speed must be positive")
        self.options = o
        self.gpu, self.model, self.seed, self.speed = o.gpu, o.model, o.seed, o.speed
        self.max_model_len = o.max_model_len or DEFAULT_MAX_MODEL_LEN
        self.engine = SimEngine(EngineConfig(
            gpu=o.gpu, model=o.model, kv_blocks=o.kv_blocks, block_size=o.block_size, max_num_seqs=o.max_num_seqs,
            max_num_batched_tokens=o.max_num_batched_tokens, model_loaded=o.cold_start_s <= 0,
            cold_start_s=max(o.cold_start_s, 0.0), emit_kv_events=o.kv_events_port is not None, lora=o.lora,
        ))
        if o.lora_modules and self.engine.adapters is None:
            raise ValueError("--lora-modules needs --enable-lora")
        for name, path in o.lora_modules:
            self.engine.adapters.register(name, path)  # type: ignore[union-attr]
        self.block_size = o.block_size
        self.root = engine_root(o.seed)
        self.faults = Faults()
        pending_actions: list[str] = []
        for spec in o.faults:
            pending_actions += apply_updates(self.faults, parse_fault_spec(spec))
        if "crash" in pending_actions and self.faults.crash_after is None:
            self.faults.crash_after = 1
        self.engine.slow_factor = self.faults.slow
        self.publisher = (
            KVEventPublisher(o.host, o.kv_events_port, replay_port=o.kv_replay_port, seed=o.seed)
            if o.kv_events_port is not None else None
        )
        self.calls: dict[str, SimCall] = {}
        self._ids = itertools.count()
        self._sample_counter = itertools.count()
        self._err_rng = random.Random(o.seed ^ 0x5EED)
        self._wake = asyncio.Event()
        self._driver: asyncio.Task[None] | None = None
        self.t0 = time.monotonic()
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels, buckets=TTFT_BUCKETS, registry=self.registry).labels(o.model, "0")
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             labels, buckets=E2E_BUCKETS, registry=self.registry).labels(o.model, "0")
        self.registry.register(EngineCollector(self.engine, o.model))
        self.sleep = SleepState() if o.enable_sleep_mode else None  # vLLM's sleep mode (--enable-sleep-mode)
        self.registry.register(SleepCollector(self.sleep, o.model))
        self.registry.register(LoraCollector(self))
        self.kv_connector = (
            KVConnector(KVTransferConfig.parse(o.kv_transfer_config), self.registry, host=o.host, port=o.port)
            if o.kv_transfer_config else None
        )
        if self.kv_connector is not None:
            self.registry.register(PromptSources(self.engine.stats, self.kv_connector, o.model))

    # ---------------------------------------------------------------- clock and driver
    def vnow(self) -> float:
        return (time.monotonic() - self.t0) * self.speed

    async def start(self) -> None:
        self._wake = asyncio.Event()
        if self.publisher is not None:
            self.publisher.start()
        self._driver = asyncio.create_task(self._drive(), name="sim-engine-driver")

    async def stop(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
        if self.publisher is not None:
            await self.publisher.close()

    def wake(self) -> None:
        self._wake.set()

    async def _drive(self) -> None:
        while True:
            try:
                self._dispatch(self.engine.advance(self.vnow()))
                self._stream_progress()
            except Exception:  # keep serving; a bug here must not freeze every request
                log.exception("sim_driver_error")
            nt = self.engine.next_event_time()
            delay = None if nt == float("inf") else max(0.0, (nt - self.vnow()) / self.speed)
            if any(c.stream and c.decoding for c in self.calls.values()):
                delay = STREAM_TICK_S if delay is None else min(delay, STREAM_TICK_S)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    def _dispatch(self, events: list[Any]) -> None:
        wall = time.monotonic()
        for ev in events:
            if isinstance(ev, KVEvents):
                if self.publisher is not None:
                    self.publisher.publish(time.time(), ev.events, self.faults.drop_events)
                continue
            call = self.calls.get(str(ev.req_id))
            if call is None:
                continue
            if isinstance(ev, FirstToken):
                call.decoding = True
                if ev.cached_tokens is not None:
                    call.extra["cached"] = ev.cached_tokens
                self.ttft.observe(wall - call.arrival_wall)
                if not call.first.done():
                    call.first.set_result(wall)
                if call.queue is not None and call.text:
                    call.queue.put_nowait(call.text[:1])
                    call.sent = 1
            elif isinstance(ev, Finished):
                call.finished = ev
                self.calls.pop(call.req_id, None)
                if ev.error is None:
                    self.e2e.observe(wall - call.arrival_wall)
                if not call.first.done():
                    call.first.set_result(wall)
                if not call.done.done():
                    call.done.set_result(ev)
                if call.queue is not None:
                    if ev.error is None and call.sent < len(call.text):
                        call.queue.put_nowait(call.text[call.sent:])
                        call.sent = len(call.text)
                    call.queue.put_nowait(None)

    def _stream_progress(self) -> None:
        for call in self.calls.values():
            if call.queue is None or not call.decoding:
                continue
            n = min(self.engine.generated(call.req_id), len(call.text))
            if n > call.sent:
                call.queue.put_nowait(call.text[call.sent:n])
                call.sent = n

    # ---------------------------------------------------------------- requests
    def check_faults_on_request(self) -> None:
        f = self.faults
        if f.crash_after is not None:
            f.crash_after -= 1
            if f.crash_after <= 0:
                log.warning("sim_fault_crash")
                os._exit(1)
        if f.error_rate > 0 and self._err_rng.random() < f.error_rate:
            raise ApiError(500, "Internal server error (injected fault error_rate)")

    def _choice(self, rng: random.Random, body: dict[str, Any], room: int) -> Choice:
        """One choice: tool calls / schema-shaped JSON when asked, else seeded text."""
        try:
            shaped = structured_choice(body, rng)
        except SchemaError as exc:
            raise ApiError(400, str(exc), "tools" if body.get("tools") else "response_format") from None
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if shaped is not None:
            if shaped.content is not None and max_tokens is not None and len(shaped.content) > max_tokens:
                shaped.content, shaped.finish_reason = shaped.content[:max_tokens], "length"  # as vLLM cuts it
            return shaped
        stops = body.get("stop") or []
        if isinstance(stops, str):
            stops = [stops]
        if max_tokens is None:
            n, reason = min(natural_length(rng), room), "stop"
        else:
            n, reason = int(max_tokens), "length"
        text, stopped = apply_stop(generate_text(rng, n), stops)
        return Choice(content=text, finish_reason="stop" if stopped else reason)

    def adapter_names(self) -> set[str]:
        """The LoRA adapters a request may name as its model."""
        adapters = self.engine.adapters
        return set(adapters.registered) if adapters is not None else set()

    def make_call(self, prompt: list[int], body: dict[str, Any], stream: bool, *, chat: bool = True,
                  adapter: str | None = None) -> tuple[SimCall, SimRequest]:
        """The engine request and what it answers: ``n`` seeded choices (the first is decoded);
        ``adapter``: the LoRA adapter it runs with (its blocks hash apart from the base model's)."""
        temperature = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
        req_seed = body.get("seed")
        salt = f"seed={req_seed}" if req_seed is not None else (
            "greedy" if temperature == 0 else f"sample={next(self._sample_counter)}")
        room = self.max_model_len - len(prompt)
        choices = [self._choice(request_rng(self.seed, prompt, salt if i == 0 else f"{salt}#{i}"), body, room)
                   for i in range(int(body.get("n", 1)))]
        logprobs: list[dict[str, Any] | None] = [None] * len(choices)
        wants = body.get("logprobs")
        if wants:  # chat: true (+ top_logprobs); completions: the number of alternatives
            top = int(body.get("top_logprobs") or 0) if chat else int(wants)
            lp_rng = request_rng(self.seed, prompt, salt + "#logprobs")
            shape = chat_logprobs if chat else completion_logprobs
            logprobs = [shape(c.text, lp_rng, min(top, 20)) for c in choices]
        first = choices[0]
        out_tokens = tokenize(first.text)
        n_engine = max(1, max(len(tokenize(c.text)) for c in choices))
        all_tokens = prompt + out_tokens
        adapters = self.engine.adapters
        root = hash_root(self.root, adapters.registered[adapter] if adapters is not None and adapter else None)
        hashes = engine_block_hashes(all_tokens, self.block_size, root)
        n_prompt_blocks = len(prompt) // self.block_size
        req_id = f"{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        loop = asyncio.get_running_loop()
        call = SimCall(
            req_id=req_id, prompt_len=len(prompt), text=first.content or "", finish_reason=first.finish_reason,
            stream=stream, arrival_wall=time.monotonic(), done=loop.create_future(), first=loop.create_future(),
            choices=choices, logprobs=logprobs, completion_tokens=sum(len(tokenize(c.text)) for c in choices),
            queue=asyncio.Queue() if stream else None,
        )
        sim = SimRequest(
            req_id=req_id, prompt_tokens=len(prompt), output_tokens=n_engine,
            block_hashes=hashes[:n_prompt_blocks], output_block_hashes=hashes[n_prompt_blocks:],
            token_ids=all_tokens, adapter=adapter,
        )
        return call, sim

    def submit(self, call: SimCall, sim: SimRequest) -> None:
        self.calls[call.req_id] = call
        self.engine.submit(sim, self.vnow())
        self.wake()

    def abort(self, call: SimCall) -> None:
        if call.req_id in self.calls:
            self.calls.pop(call.req_id, None)
            self.engine.abort(call.req_id, self.vnow())
            self.wake()

    async def until_awake(self) -> None:
        """A call that arrives while the replica sleeps waits here, as vLLM queues it."""
        if self.sleep is not None:
            await self.sleep.awake.wait()

    def pause(self, level: int, *, abort: bool) -> None:
        """Sleep: ``abort`` ends the calls in flight; level >= 1 also drops the whole KV cache
        (weights offloaded or discarded), which the replica announces as AllBlocksCleared."""
        now = self.vnow()
        self._dispatch(self.engine.advance(now))
        if level >= 1:
            self.engine.reset(now, why="aborted: engine put to sleep")
        elif abort:
            for req_id in list(self.calls):
                self.engine.abort(req_id, now)
        self._dispatch(self.engine.advance(now))
        self.wake()

    def restart_empty(self) -> None:
        self._dispatch(self.engine.advance(self.vnow()))
        if self.publisher is not None:
            self.publisher.restart()
        self.engine.reset(self.vnow())
        self._dispatch(self.engine.advance(self.vnow()))
        self.wake()

    def state(self) -> dict[str, Any]:
        e = self.engine
        return {
            "model": self.model, "gpu": self.gpu, "virtual_time_s": self.vnow(), "speed": self.speed,
            "num_running": e.num_running, "num_waiting": e.num_waiting, "kv_usage": e.kv_usage(),
            "kv_blocks_total": e.num_blocks, "kv_blocks_free": e.free_blocks(),
            "cached_blocks": len(e.kv.ref), "block_size": e.block_size, "model_loaded": e.model_loaded,
            "stats": {k: getattr(e.stats, k) for k in e.stats.__dataclass_fields__},
            "kv_events": None if self.publisher is None else {
                "port": self.publisher.port, "replay_port": self.publisher.replay_port,
                "next_seq": self.publisher.seq, "sent": self.publisher.sent, "dropped": self.publisher.dropped},
            "faults": self.faults.as_dict(),
            "sleep": None if self.sleep is None else {
                "is_sleeping": self.sleep.paused, "level": self.sleep.level, "asleep": sorted(self.sleep.asleep),
                "sleeps": self.sleep.sleeps, "wakes": self.sleep.wakes},
        }

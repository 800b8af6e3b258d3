"""The simulated vLLM replica over HTTP (``taskplane sim-engine``).

Speaks what a vLLM OpenAI server speaks: ``/v1/chat/completions`` and
``/v1/completions`` (with SSE streaming), ``/v1/models``, ``/health``, ``/metrics``
with vLLM's metric names, ``/reset_prefix_cache``, and KV-cache events over ZMQ.
Plus ``GET/POST /admin/faults`` (fault injection) and ``GET /admin/state``.

Inside, one :class:`~taskplane.sim.engine.SimEngine` runs on a virtual clock:
``virtual seconds = wall seconds x speed``. With ``--speed 10`` the replica behaves as
a GPU ten times faster; every latency it reports (responses, histograms) is wall time.
A driver task advances the engine whenever its next event is due and wakes the waiting
HTTP handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from taskplane.engines.tokenize import chat_tokens, tokenize
from taskplane.sim.engine import Finished, FirstToken, KVEvents, SimEngine, SimRequest
from taskplane.sim.faults import Faults, apply_updates, parse_fault_spec
from taskplane.sim.publisher import KVEventPublisher
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
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
STREAM_TICK_S = 0.02  # wall seconds between streamed chunks while decoding


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": _ERROR_TYPES.get(status, "Error"),
                      "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


@dataclass(slots=True, eq=False)
class _Call:
    req_id: str
    prompt_len: int
    text: str
    finish_reason: str
    stream: bool
    arrival_wall: float
    done: asyncio.Future[Finished]
    first: asyncio.Future[float]
    queue: asyncio.Queue[str | None] | None = None
    sent: int = 0
    decoding: bool = False
    finished: Finished | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class SimReplica:
    """State of one simulated replica: engine, clock, calls in flight, faults, events."""

    def __init__(
        self,
        *,
        gpu: str = "h100",
        model: str = "llama-3.1-8b",
        kv_blocks: int = 4096,
        block_size: int = 16,
        seed: int = 0,
        speed: float = 1.0,
        faults: Iterable[str] = (),
        cold_start_s: float = 0.0,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        kv_events_port: int | None = None,
        kv_replay_port: int | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.gpu, self.model, self.seed, self.speed = gpu, model, seed, speed
        self.max_model_len = max_model_len
        self.engine = SimEngine(
            gpu, model, kv_blocks=kv_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, model_loaded=cold_start_s <= 0,
            cold_start_s=max(cold_start_s, 0.0), emit_kv_events=kv_events_port is not None,
        )
        self.block_size = block_size
        self.root = engine_root(seed)
        self.faults = Faults()
        pending_actions: list[str] = []
        for spec in faults:
            pending_actions += apply_updates(self.faults, parse_fault_spec(spec))
        if "crash" in pending_actions and self.faults.crash_after is None:
            self.faults.crash_after = 1
        self.engine.slow_factor = self.faults.slow
        self.publisher = (
            KVEventPublisher(host, kv_events_port, replay_port=kv_replay_port, seed=seed)
            if kv_events_port is not None else None
        )
        self.calls: dict[str, _Call] = {}
        self._ids = itertools.count()
        self._sample_counter = itertools.count()
        self._err_rng = random.Random(seed ^ 0x5EED)
        self._wake = asyncio.Event()
        self._driver: asyncio.Task[None] | None = None
        self.t0 = time.monotonic()
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels, buckets=TTFT_BUCKETS, registry=self.registry).labels(model, "0")
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             labels, buckets=E2E_BUCKETS, registry=self.registry).labels(model, "0")
        self.registry.register(_EngineCollector(self))

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

    def make_call(self, prompt: list[int], body: dict[str, Any], stream: bool) -> tuple[_Call, SimRequest]:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        temperature = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
        stops = body.get("stop") or []
        if isinstance(stops, str):
            stops = [stops]
        req_seed = body.get("seed")
        salt = f"seed={req_seed}" if req_seed is not None else (
            "greedy" if temperature == 0 else f"sample={next(self._sample_counter)}")
        rng = request_rng(self.seed, prompt, salt)
        room = self.max_model_len - len(prompt)
        if max_tokens is None:
            n, reason = min(natural_length(rng), room), "stop"
        else:
            n, reason = int(max_tokens), "length"
        text = generate_text(rng, n)
        text, stopped = apply_stop(text, stops)
        if stopped:
            reason = "stop"
        out_tokens = tokenize(text)
        n_engine = max(1, len(out_tokens))
        all_tokens = prompt + out_tokens
        hashes = engine_block_hashes(all_tokens, self.block_size, self.root)
        n_prompt_blocks = len(prompt) // self.block_size
        req_id = f"{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        loop = asyncio.get_running_loop()
        call = _Call(
            req_id=req_id, prompt_len=len(prompt), text=text, finish_reason=reason, stream=stream,
            arrival_wall=time.monotonic(), done=loop.create_future(), first=loop.create_future(),
            queue=asyncio.Queue() if stream else None,
        )
        sim = SimRequest(
            req_id=req_id, prompt_tokens=len(prompt), output_tokens=n_engine,
            block_hashes=hashes[:n_prompt_blocks], output_block_hashes=hashes[n_prompt_blocks:],
            token_ids=all_tokens,
        )
        return call, sim

    def submit(self, call: _Call, sim: SimRequest) -> None:
        self.calls[call.req_id] = call
        self.engine.submit(sim, self.vnow())
        self.wake()

    def abort(self, call: _Call) -> None:
        if call.req_id in self.calls:
            self.calls.pop(call.req_id, None)
            self.engine.abort(call.req_id, self.vnow())
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
        }


class _EngineCollector(Collector):
    """Gauges and counters read from the engine at scrape time, with vLLM's names."""

    def __init__(self, rep: SimReplica) -> None:
        self.rep = rep

    def collect(self) -> Iterable[Any]:
        e, model = self.rep.engine, self.rep.model
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


# -------------------------------------------------------------------- request parsing

def _require_model(rep: SimReplica, body: dict[str, Any]) -> None:
    model = body.get("model")
    if model is None:
        raise ApiError(400, "model is required", "model")
    if model != rep.model:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")


def _validate_sampling(body: dict[str, Any]) -> None:
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ApiError(400, f"{key} must be at least 1, got {v}.", key)
    n = body.get("n", 1)
    if n != 1:
        raise ApiError(400, "n must be 1 (the simulator returns one choice).", "n")
    t = body.get("temperature")
    if t is not None and (not isinstance(t, int | float) or isinstance(t, bool) or not 0 <= t <= 2):
        raise ApiError(400, f"temperature must be within [0, 2], got {t}.", "temperature")
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
        raise ApiError(400, "stop must be a string or a list of strings.", "stop")
    if not isinstance(body.get("stream", False), bool):
        raise ApiError(400, "stream must be a boolean.", "stream")


def _check_length(rep: SimReplica, prompt_len: int, body: dict[str, Any]) -> None:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    limit = rep.max_model_len
    if max_tokens is None:
        if prompt_len >= limit:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, your "
                                f"request has {prompt_len} input tokens. Please reduce the length of the "
                                "input messages.", "messages")
        return
    if prompt_len + max_tokens > limit:
        raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                            f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in "
                            "the completion). Please reduce the length of the messages or completion.", "messages")


def _chat_prompt(body: dict[str, Any]) -> list[int]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "messages must be a non-empty list.", "messages")
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, "each message must be an object with a role.", "messages")
    return chat_tokens(msgs)


def _completion_prompt(body: dict[str, Any]) -> list[int]:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str | list):
        p = p[0]
    if isinstance(p, str):
        toks = tokenize(p)
    elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        if any(t < 0 or t > 255 for t in p):
            raise ApiError(400, "token ids must be within the vocabulary (0..255).", "prompt")
        toks = list(p)
    else:
        raise ApiError(400, "prompt must be a string, a list of token ids, or a list with one of those.",
                       "prompt")
    if not toks:
        raise ApiError(400, "prompt must not be empty.", "prompt")
    return toks


# -------------------------------------------------------------------- app

def create_app(rep: SimReplica) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await rep.start()
        try:
            yield
        finally:
            await rep.stop()

    app = FastAPI(title="taskplane sim-engine", lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param)

    async def _json(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ApiError(400, "The request body is not valid JSON.") from None
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        return body

    async def _hang_if_needed() -> None:
        if rep.faults.hang:
            await asyncio.Event().wait()

    async def _serve(request: Request, chat: bool) -> Response:
        body = await _json(request)
        _require_model(rep, body)
        _validate_sampling(body)
        prompt = _chat_prompt(body) if chat else _completion_prompt(body)
        _check_length(rep, len(prompt), body)
        await _hang_if_needed()
        rep.check_faults_on_request()
        stream = bool(body.get("stream", False))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
        call, sim = rep.make_call(prompt, body, stream)
        rep.submit(call, sim)
        created = int(time.time())
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if stream:
            return StreamingResponse(_stream(rep, call, chat, cid, created, include_usage),
                                     media_type="text/event-stream")
        try:
            fin = await call.done
        except asyncio.CancelledError:
            rep.abort(call)
            raise
        if fin.error is not None:
            raise ApiError(500, f"Request failed: {fin.error}")
        usage = _usage(call, fin)
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": call.text,
                                                               "tool_calls": []},
                                      "logprobs": None, "finish_reason": call.finish_reason, "stop_reason": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": call.text, "logprobs": None, "finish_reason": call.finish_reason,
                      "stop_reason": None}
            obj = "text_completion"
        return JSONResponse({"id": cid, "object": obj, "created": created, "model": rep.model,
                             "choices": [choice], "usage": usage})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _serve(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, chat=False)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": rep.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
            "root": rep.model, "parent": None, "max_model_len": rep.max_model_len}]}

    @app.get("/health")
    async def health() -> Response:
        await _hang_if_needed()
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(rep.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        ok = rep.engine.clear_prefix_cache(rep.vnow())
        rep.wake()
        if not ok:
            raise ApiError(500, "Failed to reset prefix cache: blocks are in use.")
        return Response(status_code=200)

    @app.get("/admin/faults")
    async def get_faults() -> dict[str, Any]:
        return rep.faults.as_dict()

    @app.post("/admin/faults")
    async def set_faults(request: Request) -> dict[str, Any]:
        body = await _json(request)
        try:
            actions = apply_updates(rep.faults, body)
        except (TypeError, ValueError) as exc:
            raise ApiError(400, str(exc)) from None
        rep.engine.slow_factor = rep.faults.slow
        if "restart_empty" in actions:
            rep.restart_empty()
        if "crash" in actions:
            log.warning("sim_fault_crash")
            asyncio.get_running_loop().call_later(0.05, os._exit, 1)
        rep.wake()
        return {**rep.faults.as_dict(), "actions": actions}

    @app.get("/admin/state")
    async def state() -> dict[str, Any]:
        return rep.state()

    return app


def _usage(call: _Call, fin: Finished) -> dict[str, Any]:
    completion = len(call.text)
    return {"prompt_tokens": call.prompt_len, "total_tokens": call.prompt_len + completion,
            "completion_tokens": completion, "prompt_tokens_details": {"cached_tokens": fin.cached_tokens}}


def _sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def _stream(rep: SimReplica, call: _Call, chat: bool, cid: str, created: int,
                  include_usage: bool) -> AsyncIterator[bytes]:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        return {"id": cid, "object": obj, "created": created, "model": rep.model, "choices": [choice]}

    assert call.queue is not None
    try:
        await call.first
        if chat:
            yield _sse(chunk("", None, role=True))
        while True:
            piece = await call.queue.get()
            if piece is None:
                break
            yield _sse(chunk(piece, None))
        fin = call.finished
        if fin is None or fin.error is not None:
            err = {"error": {"message": f"Request failed: {fin.error if fin else 'unknown'}",
                             "type": "InternalServerError", "param": None, "code": 500}}
            yield _sse(err)
            return
        yield _sse(chunk(None, call.finish_reason))
        if include_usage:
            yield _sse({"id": cid, "object": obj, "created": created, "model": rep.model, "choices": [],
                        "usage": _usage(call, fin)})
        yield b"data: [DONE]\n\n"
    finally:
        if call.finished is None:
            rep.abort(call)


def serve(
    port: int,
    gpu: str = "h100",
    model: str = "llama-3.1-8b",
    kv_blocks: int = 4096,
    block_size: int = 16,
    kv_events_port: int | None = None,
    seed: int = 0,
    speed: float = 1.0,
    host: str = "127.0.0.1",
    faults: list[str] | None = None,
    cold_start_s: float = 0.0,
    max_model_len: int | None = None,
    kv_replay_port: int | None = None,
    max_num_seqs: int = 256,
) -> None:
    """Run one simulated replica until interrupted (``taskplane sim-engine``)."""
    import uvicorn

    env_len = os.environ.get("TASKPLANE_SIM_MAX_MODEL_LEN")
    rep = SimReplica(
        gpu=gpu, model=model, kv_blocks=kv_blocks, block_size=block_size, seed=seed, speed=speed,
        faults=faults or [], cold_start_s=cold_start_s,
        max_model_len=max_model_len or (int(env_len) if env_len else DEFAULT_MAX_MODEL_LEN),
        kv_events_port=kv_events_port, kv_replay_port=kv_replay_port, host=host, max_num_seqs=max_num_seqs,
    )
    uvicorn.run(create_app(rep), host=host, port=port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=2)

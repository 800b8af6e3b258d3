"""The simulated vLLM replica over HTTP (``taskplane sim-engine``).

Speaks what a vLLM OpenAI server speaks: ``/v1/chat/completions`` and
``/v1/completions`` (with SSE streaming), ``/v1/models``, ``/health``, ``/metrics``
with vLLM's metric names, ``/reset_prefix_cache``, and KV-cache events over ZMQ; with
``--enable-sleep-mode``, vLLM's ``/sleep``, ``/wake_up`` and ``/is_sleeping`` (taskplane/sim/sleep.py).
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
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest

from taskplane.engines.keepalive import REPLICA_KEEP_ALIVE_S
from taskplane.engines.tokenize import tokenize
from taskplane.sim import responses
from taskplane.sim.engine import EngineConfig, Finished, FirstToken, KVEvents, SimEngine, SimRequest
from taskplane.sim.faults import Faults, apply_updates, parse_fault_spec
from taskplane.sim.metrics import E2E_BUCKETS, TTFT_BUCKETS, EngineCollector
from taskplane.sim.openai_api import (
    ApiError,
    chat_prompt,
    check_length,
    completion_prompt,
    error_response,
    require_model,
    validate_sampling,
)
from taskplane.sim.publisher import KVEventPublisher
from taskplane.sim.sleep import SleepCollector, SleepState
from taskplane.sim.sleep import attach_router as attach_sleep_router
from taskplane.sim.streaming import SimCall, completion_body, stream
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
        enable_sleep_mode: bool = False,
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.gpu, self.model, self.seed, self.speed = gpu, model, seed, speed
        self.max_model_len = max_model_len
        self.engine = SimEngine(EngineConfig(
            gpu=gpu, model=model, kv_blocks=kv_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, model_loaded=cold_start_s <= 0,
            cold_start_s=max(cold_start_s, 0.0), emit_kv_events=kv_events_port is not None,
        ))
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
        self.calls: dict[str, SimCall] = {}
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
        self.registry.register(EngineCollector(self.engine, model))
        self.sleep = SleepState() if enable_sleep_mode else None  # vLLM's sleep mode (--enable-sleep-mode)
        self.registry.register(SleepCollector(self.sleep, model))

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

    def make_call(self, prompt: list[int], body: dict[str, Any], stream: bool, *, chat: bool = True,
                  ) -> tuple[SimCall, SimRequest]:
        """The engine request and what it answers: ``n`` seeded choices (the first is decoded)."""
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
        hashes = engine_block_hashes(all_tokens, self.block_size, self.root)
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
            token_ids=all_tokens,
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

    async def _hang_if_needed(*, inference: bool = True) -> None:
        if rep.faults.hang or (inference and rep.faults.stall):
            await asyncio.Event().wait()

    async def _run(body: dict[str, Any], chat: bool) -> tuple[SimCall, Finished | None]:
        """Validate, apply faults, put the call on the engine; await it unless it streams."""
        require_model(rep.model, body)
        validate_sampling(body)
        prompt = chat_prompt(body) if chat else completion_prompt(body)
        check_length(rep.max_model_len, len(prompt), body)
        await _hang_if_needed()
        rep.check_faults_on_request()
        arrived = time.monotonic()
        await rep.until_awake()
        call, sim = rep.make_call(prompt, body, bool(body.get("stream", False)), chat=chat)
        call.arrival_wall = arrived  # a call held while the replica slept counts the wait in its TTFT, as in vLLM
        rep.submit(call, sim)
        if call.stream:
            return call, None
        try:
            fin = await call.done
        except asyncio.CancelledError:
            rep.abort(call)
            raise
        if fin.error is not None:
            raise ApiError(500, f"Request failed: {fin.error}")
        return call, fin

    async def _serve(request: Request, chat: bool) -> Response:
        body = await _json(request)
        call, fin = await _run(body, chat)
        created = int(time.time())
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if fin is None:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
            return StreamingResponse(stream(call, chat=chat, cid=cid, created=created, model=rep.model,
                                            include_usage=include_usage, abort=rep.abort),
                                     media_type="text/event-stream")
        return JSONResponse(completion_body(call, fin, chat=chat, cid=cid, created=created, model=rep.model))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _serve(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, chat=False)

    @app.post("/v1/responses")
    async def responses_api(request: Request) -> Response:
        """The Responses API, served through the chat path (tools, text.format honoured)."""
        body = await _json(request)
        call, fin = await _run(responses.responses_to_chat(body), chat=True)
        assert fin is not None
        chat = completion_body(call, fin, chat=True, cid="chatcmpl-" + uuid.uuid4().hex,
                               created=int(time.time()), model=rep.model)
        return JSONResponse(responses.chat_to_response(chat, body))

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        """Embeddings: a prefill-only engine request per input, seeded unit vectors."""
        body = await _json(request)
        require_model(rep.model, body)
        inputs = responses.embedding_inputs(body)
        for toks in inputs:
            check_length(rep.max_model_len, len(toks), {})
        await _hang_if_needed()
        rep.check_faults_on_request()
        await rep.until_awake()
        out = responses.embeddings_body(body, inputs, rep.model, rep.seed)
        waits = []
        for toks in inputs:
            call, sim = rep.make_call(toks, {"max_tokens": 1}, False, chat=False)
            rep.submit(call, sim)
            waits.append(call)
        try:
            finished = [await c.done for c in waits]
        except asyncio.CancelledError:
            for c in waits:
                rep.abort(c)
            raise
        if any(f.error is not None for f in finished):
            raise ApiError(500, "Request failed: the engine lost an embedding request")
        return JSONResponse(out)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": rep.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
            "root": rep.model, "parent": None, "max_model_len": rep.max_model_len}]}

    @app.get("/health")
    async def health() -> Response:
        await _hang_if_needed(inference=False)
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

    if rep.sleep is not None:
        attach_sleep_router(app, rep)

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
    enable_sleep_mode: bool = False,
) -> None:
    """Run one simulated replica until interrupted (``taskplane sim-engine``)."""
    import uvicorn

    env_len = os.environ.get("TASKPLANE_SIM_MAX_MODEL_LEN")
    rep = SimReplica(
        gpu=gpu, model=model, kv_blocks=kv_blocks, block_size=block_size, seed=seed, speed=speed,
        faults=faults or [], cold_start_s=cold_start_s,
        max_model_len=max_model_len or (int(env_len) if env_len else DEFAULT_MAX_MODEL_LEN),
        kv_events_port=kv_events_port, kv_replay_port=kv_replay_port, host=host, max_num_seqs=max_num_seqs,
        enable_sleep_mode=enable_sleep_mode,
    )
    uvicorn.run(create_app(rep), host=host, port=port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=2, timeout_keep_alive=REPLICA_KEEP_ALIVE_S)

"""vLLM's sleep mode on the simulated replica (``taskplane sim-engine --enable-sleep-mode``).

The endpoints are vLLM's development ones (``VLLM_SERVER_DEV_MODE=1`` with
``--enable-sleep-mode``), with the same wire shapes:

- ``POST /sleep?level=0|1|2&mode=abort|wait``: the scheduler pauses at once (calls that
  arrive from then on wait at the door until the replica is awake again, as vLLM queues
  them); ``abort`` (default) aborts the calls in flight, ``wait`` lets them finish. Level
  1 offloads the weights to host memory and discards the KV cache, level 2 discards both,
  level 0 only pauses scheduling. Levels 1 and 2 clear the prefix cache, so the replica
  publishes ``AllBlocksCleared`` and holds no KV while it sleeps. Answers
  ``{"status": "sleeping", "level": L}`` once the offload is done.
- ``POST /wake_up`` (optionally ``?tags=weights`` / ``?tags=kv_cache``, repeatable):
  brings back what the tags name (all when none); scheduling resumes once nothing is left
  asleep. Answers ``{"status": "awake" | "sleeping", "tags": [...] | null}``.
- ``GET /is_sleeping``: ``{"is_sleeping": bool}`` (paused at any level).

``/health`` keeps answering 200 while asleep, as vLLM's does (it only reports a dead
engine): a client learns the state from ``/is_sleeping`` or from the gauge
``vllm:engine_sleep_state{sleep_state="awake"|"weights_offloaded"|"discard_all"}``, which
every replica exports (awake = 1 when sleep mode is off), set when an operation completes
as vLLM sets it.

Timing (virtual seconds; modelled, not measured): level 1 sleep copies the weights to the
host over PCIe and its wake copies them back (weights / 40 GB/s + 1 s to map the memory
again and re-allocate the KV cache); level 2 wake reloads the weights from local disk
(weights / 2 GB/s + 1 s) but skips the engine start a cold start pays (CUDA graphs and
warm-up, 10 s). An 8B model on an H100: cold start 18 s, level-1 wake 1.4 s, level-2 wake 9 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from taskplane.sim.gpus import gpu_profile, model_profile
from taskplane.sim.hosttier import PCIE_BYTES_PER_S

#: re-mapping the GPU memory and re-allocating the KV cache on wake (and the offload's bookkeeping)
REMAP_S = 1.0
DISCARD_S = 0.1
SleepMode = Literal["abort", "wait"]
PARTS = ("weights", "kv_cache")


def sleep_seconds(gpu: str, model: str, level: int) -> float:
    """How long ``POST /sleep?level=`` takes: level 1 copies the weights to host memory."""
    if level == 1:
        return model_profile(model).weight_bytes / PCIE_BYTES_PER_S + DISCARD_S
    return DISCARD_S if level == 2 else 0.0


def wake_seconds(gpu: str, model: str, level: int) -> float:
    """How long a full wake from ``level`` takes (the replica's hot start)."""
    weights = model_profile(model).weight_bytes
    if level == 1:
        return weights / PCIE_BYTES_PER_S + REMAP_S
    if level == 2:
        return weights / (gpu_profile(gpu).load_bw_gbs * 1e9) + REMAP_S
    return 0.0


@dataclass
class SleepState:
    """Whether the replica is paused, at which level, and which parts are still asleep."""

    level: int = 0
    paused: bool = False  # the scheduler takes nothing while True
    completed: bool = False  # the last sleep finished (the gauge shows it)
    asleep: set[str] = field(default_factory=set)  # of PARTS
    awake: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    sleeps: int = 0
    wakes: int = 0

    def __post_init__(self) -> None:
        self.awake.set()


class SleepCollector(Collector):
    """``vllm:engine_sleep_state`` as vLLM exports it (one gauge per state, 0 or 1)."""

    def __init__(self, state: SleepState | None, model: str) -> None:
        self.state, self.model = state, model

    def collect(self) -> Iterable[Any]:
        st = self.state
        sleeping = st is not None and st.completed
        level = st.level if st is not None else 0
        g = GaugeMetricFamily(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            labels=["model_name", "engine", "sleep_state"])
        g.add_metric([self.model, "0", "awake"], 0.0 if sleeping else 1.0)
        g.add_metric([self.model, "0", "weights_offloaded"], 1.0 if sleeping and level == 1 else 0.0)
        g.add_metric([self.model, "0", "discard_all"], 1.0 if sleeping and level == 2 else 0.0)
        yield g


def attach_router(app: FastAPI, rep: Any) -> None:
    """Add the sleep-mode endpoints for ``rep`` (a :class:`~taskplane.sim.http_replica.SimReplica`
    whose ``sleep`` is a :class:`SleepState`)."""
    router = APIRouter()
    st: SleepState = rep.sleep

    async def virtual_wait(seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds / rep.speed)

    @router.post("/sleep")
    async def sleep(level: Annotated[int, Query(ge=0, le=2)] = 1,
                    mode: Annotated[SleepMode, Query()] = "abort") -> JSONResponse:
        async with st.lock:
            if not st.paused:
                st.paused, st.completed, st.level = True, False, level
                st.awake.clear()
                if mode == "wait":
                    # calls that arrive from now on wait for the wake: the ones in flight are all there is
                    await asyncio.gather(*(c.done for c in list(rep.calls.values())), return_exceptions=True)
                rep.pause(level, abort=mode == "abort")
                st.asleep = set(PARTS) if level >= 1 else set()
                await virtual_wait(sleep_seconds(rep.gpu, rep.model, level))
                st.completed = True
                st.sleeps += 1
        return JSONResponse({"status": "sleeping", "level": level})

    @router.post("/wake_up")
    async def wake_up(request: Request) -> JSONResponse:
        tags = request.query_params.getlist("tags") or None
        async with st.lock:
            if st.paused:
                wanted = set(PARTS) if tags is None else {t for t in tags if t in PARTS}
                if "weights" in wanted & st.asleep:
                    await virtual_wait(wake_seconds(rep.gpu, rep.model, st.level) - REMAP_S)
                if "kv_cache" in wanted & st.asleep:
                    await virtual_wait(REMAP_S)
                st.asleep -= wanted
                if not st.asleep:  # all resident again: scheduling resumes (vLLM: fully awake)
                    st.paused = st.completed = False
                    st.wakes += 1
                    st.awake.set()
                    rep.wake()
        return JSONResponse({"status": "sleeping" if st.paused else "awake", "tags": tags})

    @router.get("/is_sleeping")
    async def is_sleeping() -> JSONResponse:
        return JSONResponse({"is_sleeping": st.paused})

    app.include_router(router)

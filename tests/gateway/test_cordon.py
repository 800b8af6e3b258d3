"""A cordoned replica (the autoscaler's scale-in victim, or the one it pre-drains) takes no
new session, while the sessions last placed on it keep coming, so it empties without
re-prefilling anyone. The placer and registry are the gateway's own, built from config as
`taskplane gateway` builds them; the cordon arrives as discovery delivers it (a changed
replica set with ``cordoned: true``)."""

from __future__ import annotations

from taskplane.calls.wiring import build_placer
from taskplane.config import GatewayConfig, ReplicaConfig
from taskplane.engines.registry import ReplicaRegistry
from taskplane.scheduler.types import Action, CallRequest

MODEL = "llama-3.1-8b"


def _config() -> GatewayConfig:
    return GatewayConfig.model_validate({
        "auth": False,
        "pools": [{"model": MODEL, "replicas": [{"url": f"http://127.0.0.1:{9 + i}", "name": f"r{i}"} for i in range(2)]}],
    })


def _call(session: str) -> CallRequest:
    return CallRequest(model=MODEL, prompt_tokens=64, max_tokens=8, session_id=session, task_id=session)


def _cordon(registry: ReplicaRegistry, config: GatewayConfig, name: str, cordoned: bool) -> None:
    pool = config.pools[0]
    replicas = [rc.model_copy(update={"cordoned": cordoned and rc.replica_name == name}) for rc in pool.replicas]
    registry.set_pool_replicas(pool, replicas)


async def test_a_cordoned_replica_keeps_its_sessions_and_takes_no_new_one() -> None:
    config = _config()
    registry = ReplicaRegistry(config)
    placer = build_placer(config, registry)
    homes: dict[str, str] = {}
    for i in range(8):
        d = await placer.place(_call(f"old-{i}"), exclude=set())
        assert d.action is Action.PLACE and d.replica is not None
        homes[f"old-{i}"] = d.replica
    victim = next(iter(homes.values()))
    on_victim = [s for s, r in homes.items() if r == victim]

    _cordon(registry, config, victim, True)
    assert registry.cordoned(MODEL) == [victim]
    for i in range(8):
        d = await placer.place(_call(f"new-{i}"), exclude=set())
        assert (d.action, d.replica) != (Action.PLACE, victim), "a new session went to the cordoned replica"
    for s in on_victim:  # a later step of a session already there stays with its KV
        d = await placer.place(_call(s), exclude=set())
        assert (d.action, d.replica) == (Action.PLACE, victim)

    _cordon(registry, config, victim, False)  # uncordoned: demand came back
    placed = {(await placer.place(_call(f"later-{i}"), exclude=set())).replica for i in range(8)}
    assert victim in placed


async def test_a_cordoned_replica_still_serves_when_it_is_the_sessions_home_and_a_retry_avoids_it() -> None:
    config = _config()
    registry = ReplicaRegistry(config)
    placer = build_placer(config, registry)
    first = await placer.place(_call("s"), exclude=set())
    assert first.replica is not None
    _cordon(registry, config, first.replica, True)
    retry = await placer.place(_call("s"), exclude={first.replica})  # the replica failed the try
    assert retry.action is Action.PLACE and retry.replica not in (None, first.replica)
    back = await placer.place(_call("s"), exclude=set())  # its home is now the other replica
    assert back.replica == retry.replica


def test_a_replica_file_entry_may_say_cordoned() -> None:
    rc = ReplicaConfig.model_validate({"url": "http://127.0.0.1:9", "name": "r0", "cordoned": True})
    assert rc.cordoned and not rc.draining

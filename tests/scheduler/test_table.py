"""ReplicaTable: the struct-of-arrays fleet view gives the same decisions as a list."""

from __future__ import annotations

from _sched_util import engine_store_events, fleet, replica, request, tokens

from taskplane.scheduler import build_policy
from taskplane.scheduler.table import COL, ReplicaTable


def test_updates_keep_views_and_columns_in_step() -> None:
    views = fleet(3)
    t = ReplicaTable(views)
    old = t.get("r1")
    t.update("r1", num_waiting=3, healthy=False)
    t.add("r1", num_waiting=1)
    assert t.get("r1").num_waiting == 4 and not t.get("r1").healthy  # type: ignore[union-attr]
    assert old is views[1] and old.num_waiting == 0  # earlier views are never mutated
    assert t.cols[1, COL["num_waiting"]] == 4 and t.cols[1, COL["healthy"]] == 0
    t.upsert(replica("r9", model="other"))
    assert list(t.pool("other")) == [3] and list(t.pool("m")) == [0, 1, 2]
    t.remove("r0")
    assert t.names == ["r1", "r2", "r9"] and list(t.pool("m")) == [0, 1]
    assert t.cols[0, COL["num_waiting"]] == 4
    c = t.copy()
    c.update("r2", num_running=7)
    assert t.get("r2").num_running == 0  # type: ignore[union-attr]
    # a non-contiguous pool still reads the right rows
    t.upsert(replica("r10"))
    rows = t.pool("m")
    assert list(rows) == [0, 1, 3]
    assert list(t.columns(rows)[:, COL["num_waiting"]]) == [4, 0, 0]


def test_table_and_list_give_the_same_decisions() -> None:
    views = [replica(f"r{i}", num_running=i % 3, gpu="h100" if i % 2 else "l40s") for i in range(8)]
    a, b = build_policy("taskplane", seed=4), build_policy("taskplane", seed=4)
    for s in (a, b):
        s.on_kv_events("r3", engine_store_events(tokens(1, 6))[0])
    table = ReplicaTable(views)
    for i in range(30):
        req = dict(session_id=f"s{i % 4}", step=i, steps_remaining=3, budget_ms=60_000)
        da = a.decide(request(tokens(i % 3, 6), **req), views, float(i))
        db = b.decide(request(tokens(i % 3, 6), **req), table, float(i))
        assert (da.action, da.replica, da.cached_blocks) == (db.action, db.replica, db.cached_blocks)

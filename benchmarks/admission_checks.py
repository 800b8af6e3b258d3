"""Admission and placement on workloads the bench was not tuned on, side by side.

`python -m benchmarks.admission_checks LABEL` writes checks-LABEL.json: a burst of 1,000 fresh
one-call chats within a second on 3 H100 (2,048 KV blocks each) from plain clients and
from clients with task headers, and an agent mix in a light phase (0.3x) then a heavy one
(1.6x of the 3-H100 capacity the agents bench measured, 0.745 tasks/s). To compare with
another commit run it with PYTHONPATH pointing at that tree (plain clients are skipped
where the simulator cannot express them).
"""
import json
import sys
from collections import Counter
from typing import Any

from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterSpec, simulate
from taskplane.sim.workloads.agents import AgentWorkloadConfig, generate_agent_tasks
from taskplane.sim.workloads.base import CallSpec, TaskSpec, Workload
from taskplane.store.records import TaskStatus

BS = 16
def burst(n, headers):
    tasks = []
    for i in range(n):
        contents = [7] * 64 + [10_000 + i * 16 + j for j in range(16)]
        call = CallSpec(output_tokens=64, at_s=i / n, prompt_tokens=len(contents) * BS, contents=contents)
        kw: dict[str, Any] = {} if headers else {"headers": False}
        tasks.append(TaskSpec(task_id=f"chat-{i}", arrival_s=i / n, calls=[call], seed=i, **kw))
    return Workload(name="burst", tasks=tasks, block_size=BS)

def summ(res):
    recs = res.attempt_records()
    out = Counter(r.outcome.value for r in recs)
    s = res.summary()
    tasks = res.task_records()
    ok = sum(1 for t in tasks if t.status == TaskStatus.SUCCEEDED)
    return {"attempts": dict(out), "tasks_ok": ok, "tasks": len(tasks),
            "ttft_p50_s": round(s.get("ttft_p50_s", 0), 3), "prefix_hit": round(s.get("prefix_hit_ratio", 0), 3),
            "max_replica_share": round(max(Counter(c.replica for c in res.calls).values()) / len(res.calls), 3)}

which = sys.argv[1]
pols = ["round-robin", "llm-d-scorers", "taskplane"]
report = {}
for headers in (False, True):
    try:
        wl = burst(1000, headers)
    except TypeError:
        continue
    for p in pols:
        report[f"burst1000 headers={headers} {p}"] = summ(simulate(ClusterSpec.fleet("h100:3", kv_blocks=2048), wl, build_policy(p, seed=1, metrics=False)))
        print(json.dumps({k: v for k, v in report.items() if k.endswith(p)}), flush=True)
# light and heavy phases: 0.3x then 1.6x of the h100:3 capacity (0.745 tasks/s), 150 s each
wl = generate_agent_tasks(AgentWorkloadConfig(n_tasks=240, arrival_rate_per_s=0.745, seed=11, phases=[(150.0, 0.3), (150.0, 1.6)]))
for p in pols:
    report[f"phases {p}"] = summ(simulate(ClusterSpec.fleet("h100:3"), wl, build_policy(p, seed=1, metrics=False)))
    print(p, report[f"phases {p}"], flush=True)
json.dump(report, open(f"checks-{which}.json", "w"), indent=1)

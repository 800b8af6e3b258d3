"""Hash of a deterministic cluster-sim run's call records, and its CPU per call.

    python scripts/sim_fingerprint.py REPLICAS TASKS [POLICY]

Performance work on the simulator or the scheduler must leave the hash unchanged (same
seed, same placements, same timings); only the CPU figure may move.
"""
import hashlib
import sys
import time

from taskplane.bench.scale import CountingScheduler
from taskplane.bench.workloads import agent_tenants, agent_workload
from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterSpec, simulate

reps, tasks = int(sys.argv[1]), int(sys.argv[2])
policy = sys.argv[3] if len(sys.argv) > 3 else "taskplane"
wl = agent_workload(tasks, 0.15 * reps, 1)
sched = build_policy(policy, seed=1, tenants=agent_tenants(), metrics=False)
c0 = time.process_time()
res = simulate(ClusterSpec.fleet(f"h100:{reps}"), wl, CountingScheduler(sched), seed=1)
cpu = time.process_time() - c0
h = hashlib.sha256()
for c in res.calls:
    h.update(repr((c.attempt_key, c.replica, c.prompt_tokens, c.cached_tokens, c.completion_tokens,
                   round(c.finished_s, 6), c.outcome, c.error_type, round(c.cost_usd, 12))).encode())
print(f"{policy} {reps}x{tasks}: calls={len(res.calls)} end={res.end_s:.3f} sha={h.hexdigest()[:16]} cpu={cpu:.1f}s "
      f"us/call={cpu/len(res.calls)*1e6:.0f}")

"""The live agent-sessions symptom in the cluster simulator: a burst of agent sessions on a
small fleet whose KV room binds while its compute is idle, so a working-set rule that holds
first calls for room costs latency and buys nothing. Prints, per policy, call latency (mean,
p99), first-call latency, held time, cached share and deadlines met, side by side.

    python -m benchmarks.flowcontrol_burst [SESSIONS] [REPLICAS] [KV_BLOCKS] [BURST_S] [SEED]

``taskplane-fixed`` is the taskplane preset with the holds as plain timed holds
(``hold_pays=False``, no short-queue exemption): flow control before holds were priced.
"""
import statistics
import sys

from taskplane.scheduler.flowcontrol.settings import AdmissionSettings
from taskplane.scheduler.policies import build_policy
from taskplane.sim.cluster import ClusterSpec, simulate
from taskplane.sim.workloads.agents import AgentWorkloadConfig, generate_agent_tasks
from taskplane.store.records import Outcome

sessions = int(sys.argv[1]) if len(sys.argv) > 1 else 72
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
kv_blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 256
burst_s = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 1

FIXED = AdmissionSettings(hold_pays=False, working_set_short_queue_ms=None)
rows = []
for label, policy, adm in (("round-robin", "round-robin", None), ("taskplane-fixed", "taskplane", FIXED),
                           ("taskplane", "taskplane", None)):
    wl = generate_agent_tasks(AgentWorkloadConfig(n_tasks=sessions, arrival_rate_per_s=sessions / burst_s, seed=seed))
    sched = build_policy(policy, seed=1, metrics=False, admission=adm)
    res = simulate(ClusterSpec.fleet(f"h100:{reps}", kv_blocks=kv_blocks), wl, sched, seed=seed)
    ok = [c for c in res.calls if c.outcome == Outcome.SUCCESS]
    lat = sorted(c.total_s * 1000 for c in ok)
    first = [c.total_s * 1000 for c in ok if c.step == 0]
    held = [((c.dispatched_s or c.finished_s) - c.offered_s) * 1000 for c in ok]
    prompt = sum(c.prompt_tokens for c in ok)
    met = sum(1 for t in res.tasks if t.deadline_met)
    failed = sum(1 for c in res.calls if c.outcome != Outcome.SUCCESS)
    rows.append((label, statistics.fmean(lat), lat[int(0.99 * (len(lat) - 1))], statistics.fmean(first),
                 max(held), sum(c.cached_tokens for c in ok) / prompt, met, len(res.tasks), failed))
rr = rows[0]
print(f"{sessions} sessions in {burst_s:g} s, {reps} x h100, {kv_blocks} KV blocks, seed {seed}")
print(f"{'policy':16} {'mean ms':>9} {'x rr':>5} {'p99 ms':>9} {'x rr':>5} {'first ms':>9} {'max held ms':>11} "
      f"{'cached':>7} {'x rr':>5} {'met':>7} {'failed':>6}")
for r in rows:
    print(f"{r[0]:16} {r[1]:9.0f} {r[1] / rr[1]:5.2f} {r[2]:9.0f} {r[2] / rr[2]:5.2f} {r[3]:9.0f} {r[4]:11.0f} "
          f"{r[5]:7.3f} {r[5] / rr[5]:5.2f} {r[6]:>3}/{r[7]:<3} {r[8]:6}")

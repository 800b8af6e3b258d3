"""The report fixes an operator asked for: a cancelled column per tenant, failed tasks listed
with their error and a link to the Temporal UI, dollars printed as dollars (never 5.4e-05)
in the HTML and its plots, one unambiguous time format on the timeline, and a sub-agent's
calls counted for the agent whose task it serves."""

from __future__ import annotations

import re
from datetime import timedelta

from _report_scenario import SINCE, T0, UNTIL, fleet

from taskplane.reports.compute import build_report
from taskplane.reports.html import render_html
from taskplane.reports.render import render_table
from taskplane.store.records import AttemptRecord, Outcome, TaskStatus


def _report():  # type: ignore[no-untyped-def]
    attempts, tasks = fleet()
    tasks[5] = tasks[5].model_copy(update={"status": TaskStatus.FAILED, "error": "LlmError: replica <gone> & more",
                                           "deadline_met": False})
    return build_report(attempts, tasks, since=SINCE, until=UNTIL), tasks


def test_cancelled_column_and_failed_task_list_with_links() -> None:
    report, _tasks = _report()
    assert sum(g.tasks_cancelled for g in report.groups_by["tenant"]) == report.tasks_cancelled > 0
    failed = {f.task_id: f for f in report.failed_tasks}
    assert "task-005" in failed and failed["task-005"].error == "LlmError: replica <gone> & more"
    assert all(f.status in ("failed", "failed-deadline", "cancelled") for f in report.failed_tasks)
    page = render_html(report, temporal_ui_url="http://127.0.0.1:18201")
    tenants = page[page.index('id="groups-tenant"'):]
    assert "<th>cancelled</th>" in tenants.split("</table>")[0]
    assert 'href="http://127.0.0.1:18201/namespaces/default/workflows/task-005"' in page
    assert "LlmError: replica &lt;gone&gt; &amp; more" in page  # escaped, never raw HTML
    table = render_table(report, width=160)
    assert "cancelled" in table and "task-005" in table


def test_dollars_and_time_ticks_are_readable() -> None:
    attempts, tasks = fleet()
    tiny = [a.model_copy(update={"cost_usd": a.cost_usd / 100}) for a in attempts]  # ~$5e-05 per task
    report = build_report(tiny, tasks, since=SINCE, until=UNTIL)
    page = render_html(report)
    assert not re.search(r"\$\d(\.\d+)?e-\d", page), "a dollar figure in scientific notation"
    assert "e-0" not in re.sub(r'data-value="[^"]*"|<script.*?</script>|<path[^>]*>|d="[^"]*"', "", page, flags=re.S)
    timeline = page[page.index('id="plot-cost-over-time"'):page.index('id="plot-by-agent-tenant"')]
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", timeline)
    ticks = [t for t in texts if re.fullmatch(r"[\d:]+", t)]
    assert ticks and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", t) for t in ticks), ticks  # no bare "30"
    assert all("e-" not in t for t in texts) and any(t.startswith("$0.0") for t in texts)


def test_sub_agent_spend_counts_for_the_goals_agent() -> None:
    attempts, tasks = fleet()
    parent = next(t for t in tasks if t.status is TaskStatus.SUCCEEDED and t.deadline_met and T0 <= t.started_at)
    child = AttemptRecord(attempt_key="child-1", task_id=f"{parent.task_id}.helper-0", step=0, attempt=1,
                          tenant=parent.tenant, agent="helper", model_requested="llama-3.1-8b", gpu="h100",
                          prompt_tokens=10, completion_tokens=5, cost_usd=0.5, outcome=Outcome.SUCCESS,
                          started_at=parent.started_at + timedelta(seconds=5))
    report = build_report([*attempts, child], tasks, since=SINCE, until=UNTIL)
    by_agent = {g.key: g for g in report.groups_by["agent"]}
    assert "helper" not in by_agent  # not an agent with no successful task
    base = {g.key: g for g in build_report(attempts, tasks, since=SINCE, until=UNTIL).groups_by["agent"]}
    assert by_agent[parent.agent].total_cost_usd - base[parent.agent].total_cost_usd == 0.5

"""The cost report's shape: what ``build_report`` returns and the JSON, CSV, table and HTML
formats render. ``Report.to_json_dict`` is the JSON format (a DESIGN.md contract)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class GroupRow(BaseModel):
    """One key of a grouping (an agent, a tenant, a model, a GPU, a day)."""

    key: str
    tasks_total: int = 0
    tasks_succeeded: int = 0
    tasks_succeeded_late: int = 0
    tasks_failed: int = 0
    tasks_cancelled: int = 0
    tasks_running: int = 0
    calls: int = 0
    total_cost_usd: float = 0.0
    gpu_seconds: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_per_successful_task_usd: float | None = None
    cache_hit_ratio: float | None = None


class Waste(BaseModel):
    """Where money went without producing a successful task. Categories are disjoint."""

    failed_tasks_usd: float = Field(default=0.0, description="all spend of tasks that failed, missed the deadline or were cancelled")
    retries_usd: float = Field(default=0.0, description="attempts that errored, timed out or were cancelled, in other tasks")
    shed_usd: float = Field(default=0.0, description="attempts shed by admission control, in other tasks")
    cache_miss_usd: float = Field(default=0.0, description="estimated prefill of context the session had already built")
    total_usd: float = 0.0
    share_of_spend: float | None = None


class TimePoint(BaseModel):
    start: datetime
    calls: int = 0
    total_cost_usd: float = 0.0
    tasks_succeeded: int = 0
    cost_per_successful_task_usd: float | None = None
    cumulative_cost_per_successful_task_usd: float | None = None
    cache_hit_ratio: float | None = None


class FailedTask(BaseModel):
    """A task that ended without success, for the report's list of what to look at."""

    task_id: str
    agent: str
    tenant: str
    status: str
    error: str | None = None
    cost_usd: float = 0.0
    finished_at: datetime | None = None


class Report(BaseModel):
    """The cost report. ``model_dump(mode="json")`` (minus ``groups_by``) is the JSON format."""

    generated_at: datetime
    since: datetime | None = None
    until: datetime | None = None
    tenant: str | None = None
    group_by: str = "tenant"
    count_sub_agents: bool = Field(default=False, description="sub-agents' tasks counted as tasks of their own")
    sub_agent_tasks: int = Field(default=0, description="sub-agents' tasks in the window (counted or not)")

    tasks_total: int = 0
    tasks_succeeded: int = 0
    tasks_succeeded_late: int = 0
    tasks_failed: int = 0
    tasks_cancelled: int = 0
    tasks_running: int = 0
    tasks_by_status: dict[str, int] = Field(default_factory=dict)

    calls: int = 0
    calls_by_outcome: dict[str, int] = Field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    gpu_seconds: float = 0.0

    total_cost_usd: float = 0.0
    cost_per_successful_task_usd: float | None = None
    cost_per_token_usd: float | None = None
    cost_per_million_tokens_usd: float | None = None
    cost_per_request_usd: float | None = None
    cache_hit_ratio: float | None = None
    # provisioned replica-hours (fleet_hours rows, idle included) in the window, when an
    # autoscaler records them: provisioned_gpu_hours, idle_gpu_hours, fleet_cost_usd,
    # fleet_cost_per_successful_task_usd (the fully loaded figure)
    fleet: dict[str, float | None] | None = None

    waste: Waste = Field(default_factory=Waste)
    groups: list[GroupRow] = Field(default_factory=list)
    groups_by: dict[str, list[GroupRow]] = Field(default_factory=dict)
    timeline_bucket_s: int = 0
    timeline: list[TimePoint] = Field(default_factory=list)
    failed_tasks: list[FailedTask] = Field(default_factory=list, description="the latest tasks that did not succeed")

    def to_json_dict(self) -> dict[str, object]:
        """The JSON report (DESIGN.md contract: tasks_succeeded, tasks_failed, total_cost_usd,
        cost_per_successful_task_usd), with groups for ``group_by`` only."""
        return self.model_dump(mode="json", exclude={"groups_by"})

"""Flow control: admission in front of the placement pipeline (priority bands, per-tenant
fair share, EDF, shedding, working-set room) plus fallback-model moves and deadline checks.
It composes :class:`taskplane.scheduler.core.Scheduler`; the pipeline knows nothing of it."""

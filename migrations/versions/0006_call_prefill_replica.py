"""Prefill/decode disaggregation: each attempt row names the replica that computed its prompt.

``llm_calls.prefill_replica`` (nullable text): on a disaggregated call, the prefill-role
replica that computed the prompt (``replica`` is the decode replica that pulled its KV and
generated); its share of that GPU is included in ``gpu_seconds`` and ``cost_usd``. NULL for
aggregated calls and for every row written before.

Revision ID: 0006_call_prefill_replica
Revises: 0005_call_adapter
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_call_prefill_replica"
down_revision: str | Sequence[str] | None = "0005_call_adapter"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("llm_calls", sa.Column("prefill_replica", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("llm_calls", "prefill_replica")

"""LoRA adapters: each attempt row names the adapter it ran with.

``llm_calls.adapter`` (nullable text): the LoRA adapter the call ran with on
``model_requested`` (vLLM serves it as a model of that name); NULL for the base model and
for every row written before adapters. Tasks are not given the column: an agent's calls
may use several adapters, and the report groups calls by theirs.

Revision ID: 0005_call_adapter
Revises: 0004_sub_agent_rollup
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_call_adapter"
down_revision: str | Sequence[str] | None = "0004_sub_agent_rollup"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("llm_calls", sa.Column("adapter", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("llm_calls", "adapter")

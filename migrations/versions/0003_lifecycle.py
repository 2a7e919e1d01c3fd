"""the lifecycle stream (its counter row and log) and an index for event retention

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 12:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("events_created", "events", ["created_at"])
    op.create_table(
        "counters",
        sa.Column("name", sa.String(length=40), nullable=False),
        sa.Column("value", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.execute("INSERT INTO counters (name, value) VALUES ('lifecycle', 0)")
    op.create_table(
        "lifecycle_events",
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("user_id", sa.String(length=200), nullable=False),
        sa.Column("thread_id", sa.UUID(), nullable=False),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
    )
    op.create_index("lifecycle_user_seq", "lifecycle_events", ["user_id", "seq"])
    op.create_index("lifecycle_created", "lifecycle_events", ["created_at"])


def downgrade() -> None:
    op.drop_table("lifecycle_events")
    op.drop_table("counters")
    op.drop_index("events_created", table_name="events")

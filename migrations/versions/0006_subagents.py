"""subagents: the registry fields of a child thread, the open-step flag, and scoped-variable requests

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 16:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("threads", sa.Column("title", sa.Text(), nullable=True))
    op.add_column("threads", sa.Column("description", sa.Text(), nullable=True))
    op.add_column("threads", sa.Column("resumable", sa.Boolean(), server_default=sa.text("false"), nullable=False))
    op.add_column("threads", sa.Column("blocking", sa.Boolean(), server_default=sa.text("true"), nullable=False))
    op.add_column("threads", sa.Column("receives_messages", sa.String(length=10), nullable=True))
    op.add_column("threads", sa.Column("parent_communication", sa.String(length=10), nullable=True))
    op.add_column("threads", sa.Column("spawn_group_id", sa.UUID(), nullable=True))
    op.add_column("threads", sa.Column("parent_call_id", sa.String(length=200), nullable=True))
    op.add_column("threads", sa.Column("parent_call_name", sa.String(length=200), nullable=True))
    op.add_column("threads", sa.Column("terminal", sa.Boolean(), server_default=sa.text("false"), nullable=False))
    op.add_column("threads", sa.Column("step_open", sa.Boolean(), server_default=sa.text("false"), nullable=False))
    op.create_table(
        "variable_requests",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("parent_id", sa.UUID(), nullable=False),
        sa.Column("agent", sa.String(length=200), nullable=False),
        sa.Column("required", postgresql.JSONB(astext_type=sa.Text()), server_default="[]", nullable=False),
        sa.Column("missing", postgresql.JSONB(astext_type=sa.Text()), server_default="[]", nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
        sa.Column("status", sa.String(length=20), server_default="pending", nullable=False),
        sa.Column("child_id", sa.UUID(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["parent_id"], ["threads.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("variable_requests_parent", "variable_requests", ["parent_id"])


def downgrade() -> None:
    op.drop_table("variable_requests")
    for column in (
        "step_open",
        "terminal",
        "parent_call_name",
        "parent_call_id",
        "spawn_group_id",
        "parent_communication",
        "receives_messages",
        "blocking",
        "resumable",
        "description",
        "title",
    ):
        op.drop_column("threads", column)

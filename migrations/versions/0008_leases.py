"""leases in a table of their own: the heartbeat renews them without waiting for the thread row

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 06:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("thread_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("token", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["thread_id"], ["threads.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("thread_id"),
    )
    op.execute(
        "INSERT INTO leases (thread_id, token, expires_at)"
        " SELECT id, lease_token, lease_expires_at FROM threads"
        " WHERE lease_token IS NOT NULL AND lease_expires_at IS NOT NULL"
    )
    op.drop_column("threads", "lease_expires_at")


def downgrade() -> None:
    op.add_column("threads", sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE threads SET lease_expires_at = leases.expires_at FROM leases"
        " WHERE leases.thread_id = threads.id AND leases.token = threads.lease_token"
    )
    op.drop_table("leases")

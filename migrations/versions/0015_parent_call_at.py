"""threads.parent_call_at: when the parent's blocking call a child's session answers was made, so the call's log row,
written with its result, has the call's duration as a callable's has

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("threads", sa.Column("parent_call_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("threads", "parent_call_at")

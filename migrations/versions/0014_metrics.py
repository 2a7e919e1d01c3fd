"""metrics: each sample's total over every process, added to by the workers' flushes

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25 19:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "metrics",
        sa.Column("sample", sa.String(length=200), nullable=False),
        sa.Column("labels", sa.Text(), nullable=False),
        sa.Column("family", sa.String(length=200), nullable=False),
        sa.Column("value", sa.Float(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("sample", "labels"),
    )


def downgrade() -> None:
    op.drop_table("metrics")

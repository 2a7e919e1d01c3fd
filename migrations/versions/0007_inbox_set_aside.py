"""inbox rows set aside: input whose delivery kept failing is kept, marked and skipped

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 22:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("inbox", sa.Column("set_aside_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("inbox", sa.Column("error", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("inbox", "error")
    op.drop_column("inbox", "set_aside_at")

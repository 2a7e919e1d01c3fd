"""schema_compat: which releases' code runs on the schema as it is, so that a process of an older release can tell a
newer schema it still runs on (an expand migration) from one it does not (ARCHITECTURE.md, "Migrations")

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 14:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
runs_with: str = "0015"  # a table no code before this one reads


def upgrade() -> None:
    op.create_table(
        "schema_compat",
        sa.Column("id", sa.SmallInteger(), server_default="1", nullable=False),
        sa.Column("revision", sa.Text(), nullable=False),
        sa.Column("runs_with", sa.Text(), nullable=False),
        sa.CheckConstraint("id = 1", name="schema_compat_one_row"),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("schema_compat")

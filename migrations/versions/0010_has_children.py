"""threads.has_children: whether a thread ever had a child, so the engine skips reading the children of the many
threads that never spawn one (it read them at every step); set by a trigger on every child's insert

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("threads", sa.Column("has_children", sa.Boolean(), server_default="false", nullable=False))
    op.execute(
        "UPDATE threads SET has_children = true WHERE id IN (SELECT parent_id FROM threads WHERE parent_id IS NOT NULL)"
    )
    op.execute(
        """
        CREATE FUNCTION threads_mark_parent() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE threads SET has_children = true WHERE id = NEW.parent_id AND NOT has_children;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER threads_parent_has_children AFTER INSERT ON threads FOR EACH ROW "
        "WHEN (NEW.parent_id IS NOT NULL) EXECUTE FUNCTION threads_mark_parent()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER threads_parent_has_children ON threads")
    op.execute("DROP FUNCTION threads_mark_parent()")
    op.drop_column("threads", "has_children")

"""message revisions: a per-database sequence stamped on every insert and update of a message, so the engine reads
only the messages of a thread that changed since its last step; `threads.messages_removed` counts deletions

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 07:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE SEQUENCE message_revs")
    op.add_column(
        "messages",
        sa.Column("rev", sa.BigInteger(), server_default=sa.text("nextval('message_revs')"), nullable=False),
    )
    op.execute(
        """
        CREATE FUNCTION messages_next_rev() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.rev := nextval('message_revs');
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER messages_rev BEFORE UPDATE ON messages FOR EACH ROW EXECUTE FUNCTION messages_next_rev()"
    )
    op.create_index("messages_thread_rev", "messages", ["thread_id", "rev"])
    op.add_column("threads", sa.Column("messages_removed", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    op.drop_column("threads", "messages_removed")
    op.drop_index("messages_thread_rev", table_name="messages")
    op.execute("DROP TRIGGER messages_rev ON messages")
    op.execute("DROP FUNCTION messages_next_rev()")
    op.drop_column("messages", "rev")
    op.execute("DROP SEQUENCE message_revs")

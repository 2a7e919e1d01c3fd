"""api_keys announce their changes: a trigger notifies `agents_keys` in the writer's transaction, so an API process
in open mode counts the keys once per change instead of at every request (it listens on its hub's connection)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24 23:10:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION api_keys_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('agents_keys', '');
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER api_keys_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON api_keys "
        "FOR EACH STATEMENT EXECUTE FUNCTION api_keys_changed()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER api_keys_changed ON api_keys")
    op.execute("DROP FUNCTION api_keys_changed()")

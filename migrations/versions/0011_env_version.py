"""counters.env: a version of the env values, bumped by a trigger in the transaction of any write to them, so a
worker keeps a thread's env layers between its steps and reads them again only when something changed (the engine
read them at every step; the fence reads the version with the thread row)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24 23:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("INSERT INTO counters (name, value) VALUES ('env', 0) ON CONFLICT (name) DO NOTHING")
    op.execute(
        """
        CREATE FUNCTION env_values_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE counters SET value = value + 1 WHERE name = 'env';
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER env_values_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON env_values "
        "FOR EACH STATEMENT EXECUTE FUNCTION env_values_changed()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER env_values_changed ON env_values")
    op.execute("DROP FUNCTION env_values_changed()")
    op.execute("DELETE FROM counters WHERE name = 'env'")

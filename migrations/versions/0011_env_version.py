"""counters.env: a version of the env values, moved on by the commit of any write to them (a deferred trigger: the
counter row is locked only at commit, after every other lock the writer takes, so it orders no lock), so a worker
keeps a thread's env layers between its steps and reads them again only when something changed (the engine read
them at every step; `queue.waiting` reads the version)

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
        "CREATE CONSTRAINT TRIGGER env_values_changed AFTER INSERT OR UPDATE OR DELETE ON env_values "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION env_values_changed()"
    )
    op.execute(
        "CREATE TRIGGER env_values_truncated AFTER TRUNCATE ON env_values "
        "FOR EACH STATEMENT EXECUTE FUNCTION env_values_changed()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER env_values_truncated ON env_values")
    op.execute("DROP TRIGGER env_values_changed ON env_values")
    op.execute("DROP FUNCTION env_values_changed()")
    op.execute("DELETE FROM counters WHERE name = 'env'")

"""Retention and the hot tables: `metrics.updated_at` (a series no worker added to for `METRIC_RETENTION_DAYS`
expires), indexes the retention sweeps find old rows by (`logs_created`, `effects_finished`), and storage parameters
for the tables every step updates (`bench/README.md`, "Storage": the figures before and after)

- `fillfactor` leaves room on each page, so an update that changes no indexed column stays on its page (a HOT update:
  no index entry, and the old version is pruned without a vacuum): `threads` (the engine's transactions update its
  row every step), `leases` (the heartbeat renews every lease each third of `LEASE_SECONDS`), `metrics` (each
  worker's flush updates every series it counted) and `counters` (the lifecycle and env counters). A table a restore
  or a rewrite leaves packed full stays HOT-friendly too: the restore sets the parameters before it loads the rows.
- `autovacuum_vacuum_scale_factor`: autovacuum waits for 50 rows plus a fifth of a table to be dead (the default
  0.2); `threads` grows with what users keep, so a fifth of it is a lot of dead versions: 2 % instead. `leases` and
  `inbox` hold a row per running thread and per waiting input, small unless a backlog builds: 5 %. The threshold
  (50 rows) stays, so no table is vacuumed less often than before.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 17:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
runs_with: str = "0016"  # a defaulted column, indexes and storage parameters: nothing the release before reads

TUNED = {
    "threads": "fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.05",
    "leases": "fillfactor = 50, autovacuum_vacuum_scale_factor = 0.05",
    "inbox": "autovacuum_vacuum_scale_factor = 0.05",
    "metrics": "fillfactor = 50",
    "counters": "fillfactor = 20",
}
RESET = "fillfactor, autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor"


def upgrade() -> None:
    # on a large `logs` the build holds its writes (and so turns) until it ends: build it beforehand with
    # `CREATE INDEX CONCURRENTLY` (docs/deployment.md) and this finds it
    op.create_index("logs_created", "logs", ["created_at"], if_not_exists=True)
    op.create_index(
        "effects_finished",
        "effects",
        ["updated_at"],
        postgresql_where=sa.text("status IN ('done', 'failed', 'cancelled')"),
        if_not_exists=True,
    )
    for table, parameters in TUNED.items():
        op.execute(f"ALTER TABLE {table} SET ({parameters})")  # SHARE UPDATE EXCLUSIVE: reads and writes go on
    # last: its lock holds the metrics flushes until the commit
    op.add_column(
        "metrics",
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
    )


def downgrade() -> None:
    for table in TUNED:
        op.execute(f"ALTER TABLE {table} RESET ({RESET})")
    op.drop_index("effects_finished", table_name="effects")
    op.drop_index("logs_created", table_name="logs")
    op.drop_column("metrics", "updated_at")

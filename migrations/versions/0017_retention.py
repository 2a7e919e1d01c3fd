"""Retention and the hot tables: `metrics.updated_at` (a series no worker added to for `METRIC_RETENTION_DAYS`
expires), indexes the retention sweeps find old rows by (`logs_created`, `effects_finished`), and storage parameters
for the tables every step updates (`bench/README.md`, "Storage": the figures before and after)

- `fillfactor` leaves room on each page, so an update that changes no indexed column stays on its page (a HOT update:
  no index entry, and the old version is pruned without a vacuum): `threads` (the engine's fenced transactions
  update its row every step), `leases` (the heartbeat renews every lease a third of `LEASE_SECONDS`), `metrics` (each
  worker's flush) and `counters` (the lifecycle and env counters).
- Per-table autovacuum: `autovacuum_vacuum_scale_factor` (default 0.2: a fifth of the table dead before a vacuum) is
  too lax for small tables that churn: `leases`, `inbox` (a row per input, deleted at its delivery), `counters` and
  `metrics` are vacuumed after a fixed count of dead rows instead; `threads`, which grows with what users keep, at
  2 % of its rows.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 17:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
runs_with: str = "0016"  # a defaulted column, indexes and storage parameters: nothing the release before reads

TUNED = {
    "threads": "fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000",
    "leases": "fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000",
    "inbox": "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000",
    "metrics": "fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000",
    "counters": "fillfactor = 20, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000",
}
RESET = "fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold"


def upgrade() -> None:
    op.add_column(
        "metrics",
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
    )
    op.create_index("logs_created", "logs", ["created_at"])
    op.create_index(
        "effects_finished",
        "effects",
        ["updated_at"],
        postgresql_where=sa.text("status IN ('done', 'failed', 'cancelled')"),
    )
    for table, parameters in TUNED.items():
        op.execute(f"ALTER TABLE {table} SET ({parameters})")


def downgrade() -> None:
    for table in TUNED:
        op.execute(f"ALTER TABLE {table} RESET ({RESET})")
    op.drop_index("effects_finished", table_name="effects")
    op.drop_index("logs_created", table_name="logs")
    op.drop_column("metrics", "updated_at")

"""logs.request_full: an LLM request's whole request (messages, tools, settings; secrets masked) when
`LOG_REQUESTS=full`, read one row at a time by `GET /threads/{id}/logs/{log_id}`

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 17:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
runs_with: str = "0016"  # a nullable column no code before this one reads or writes


def upgrade() -> None:
    op.add_column("logs", sa.Column("request_full", postgresql.JSONB(astext_type=sa.Text()), nullable=True))


def downgrade() -> None:
    op.drop_column("logs", "request_full")

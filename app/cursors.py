"""Opaque keyset cursors `(created_at, id)` for paginated lists."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime

from app import errors


def encode(created_at: datetime, row_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{row_id}".encode()).decode()


def decode(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The position a cursor names; anything this server did not give out is `BadCursor`."""
    try:
        stamp, row_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        return datetime.fromisoformat(stamp), uuid.UUID(row_id)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.BadCursor() from exc

"""Opaque keyset cursors `(created_at, id)` for paginated lists."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime

from app import errors


def encode(created_at: datetime, row_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{row_id}".encode()).decode()


def decode(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The position a cursor names; anything this server did not give out is `BadCursor`."""
    try:
        stamp, row_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        created_at = datetime.fromisoformat(stamp)
        if created_at.tzinfo is None:
            raise ValueError("a cursor's time has its offset")
        return created_at.astimezone(UTC), uuid.UUID(row_id)  # in UTC, or an offset past the calendar's end fails
    except (ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise errors.BadCursor() from exc

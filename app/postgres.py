"""The embedded PostgreSQL (the `pgserver` wheel) a fresh machine runs on when `DATABASE_URL` is not set."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from app.settings import Settings

log = logging.getLogger(__name__)


@contextmanager
def embedded(settings: Settings) -> Iterator[str]:
    """Start (or join) a real PostgreSQL from the `pgserver` wheel under `DATA_DIR`; yield its URL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pgserver's platformdirs warns about XDG_RUNTIME_DIR
        import pgserver

        data = (settings.data_dir / "pg").resolve()
        data.mkdir(parents=True, exist_ok=True)
        log.info("starting embedded PostgreSQL in %s", data)
        server: Any = pgserver.get_server(data, cleanup_mode="stop")  # type: ignore[attr-defined]
    try:
        yield f"postgresql+asyncpg://postgres@/postgres?host={data}"
    finally:
        log.info("stopping embedded PostgreSQL")
        server.cleanup()

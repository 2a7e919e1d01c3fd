"""The turn state machine: runs a claimed thread's steps (`semantics.md` §2–§5).

Outside the engine, two entries and nothing else: `run.Engine`, which the worker drives (composed in `app.runtime`),
and `thread_state` below, which the API uses to give a custom endpoint a `ThreadState`. The other modules are its
internals: `app.api` imports none of them.
"""

from __future__ import annotations

import uuid

from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.catalog import Catalog
from app.engine import outside
from app.spec.state import ThreadState


async def thread_state(
    sessions: async_sessionmaker[AsyncSession], catalog: Catalog, fernet: Fernet, thread_id: uuid.UUID
) -> ThreadState:
    """The state of thread `thread_id` for code outside its execution (a custom endpoint): `execution` is `None`."""
    return await outside.state(sessions, catalog, fernet, thread_id)

"""The turn state machine: runs a claimed thread's steps (`semantics.md` §2–§5).

Outside the engine, these entries and nothing else: `run.Engine`, which the worker drives (composed in
`app.runtime`), and the functions below, which the API calls: `thread_state` gives a custom endpoint a `ThreadState`,
`edit_message` and `delete_message` change a stored message through the hooks and checks the engine owns. The other
modules are its internals: `app.api` imports none of them (`tests/test_layers.py`).
"""

from __future__ import annotations

import uuid

from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import tables
from app.catalog import Catalog
from app.engine import edits, state
from app.spec.state import ThreadState


async def thread_state(
    sessions: async_sessionmaker[AsyncSession], catalog: Catalog, fernet: Fernet, thread_id: uuid.UUID
) -> ThreadState:
    """The state of thread `thread_id` for code outside its execution (a custom endpoint): `execution` is `None`."""
    return await state.outside(sessions, catalog, fernet, thread_id)


async def edit_message(
    session: AsyncSession,
    catalog: Catalog,
    fernet: Fernet,
    thread: tables.Thread,
    message_id: uuid.UUID,
    content: str,
) -> tables.Message:
    """`PATCH /threads/{id}/messages/{message_id}`: the new content through the acting side's update hooks, run
    outside the execution (`edits.edit`)."""
    runner = await state.prepare_hooks(catalog, fernet, session, thread, thread.side or "a", outside=True)
    return await edits.edit(session, runner, thread, message_id, content)


async def delete_message(session: AsyncSession, thread: tables.Thread, message_id: uuid.UUID) -> list[uuid.UUID]:
    """`DELETE /threads/{id}/messages/{message_id}`: the message, or a call with its results (`edits.delete`)."""
    return await edits.delete(session, thread, message_id)

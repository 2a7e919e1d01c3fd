"""`ThreadState` outside the thread's own execution: custom endpoints, handles to other threads (§12).

Each call runs in a short transaction of its own that locks the thread row (no lease: the running step, if any, keeps
its own); the writes only the thread's own execution may make are refused.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import children, tables, threads
from app.catalog import Catalog
from app.engine.context import load_env
from app.engine.state import RunState
from app.spec.state import SubagentEntry


async def state(
    sessions: async_sessionmaker[AsyncSession], catalog: Catalog, fernet: Fernet, thread_id: uuid.UUID
) -> RunState:
    """The state of thread `thread_id` for code outside its execution: `execution` is `None`, `context` empty."""

    @asynccontextmanager
    async def transaction() -> AsyncIterator[tuple[AsyncSession, tables.Thread]]:
        async with sessions() as session, session.begin():
            yield session, await threads.lock(session, thread_id)

    async with transaction() as (session, thread):
        agent = catalog.agent(thread.agent)
        side = agent.side(thread.side or "a")  # the acting side's prompt, as the engine resolves it
        prompt = catalog.prompts[side.prompt] if side is not None else None
        env = await load_env(session, fernet, catalog, thread, prompt)
        registry = [SubagentEntry.model_validate(children.entry(c)) for c in await children.listed(session, thread)]
    return RunState(
        thread, env, transaction, None, {}, catalog=catalog, fernet=fernet, sessions=sessions, children=registry
    )

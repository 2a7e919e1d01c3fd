"""Plain statements on a session's connection (`app/statements.py`)."""

from __future__ import annotations

import gc
import weakref

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import db, statements


async def test_a_session_that_sent_plain_statements_is_freed_without_the_cycle_collector(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """The driver a transaction keeps in `session.info` goes when the transaction ends: the session is then freed as
    soon as nothing refers to it. (Kept, it made every engine session a reference cycle of ~40 objects: garbage that
    piled up between the collector's full passes, a worker's memory growing with the time between them.)"""
    gc.disable()
    try:
        async with sessions() as session, session.begin():
            await (await statements.driver(session)).fetchrow("SELECT 1")
        in_transaction = weakref.ref(session.sync_session)
        async with db.autocommit(sessions) as session:
            await (await statements.driver(session, flush=False)).execute("SELECT 1")
        autocommit = weakref.ref(session.sync_session)
        del session
        assert in_transaction() is None and autocommit() is None
    finally:
        gc.enable()

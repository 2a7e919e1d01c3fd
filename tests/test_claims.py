"""Claims on real Postgres: the claim takes the oldest runnable threads' leases, each once, and returns their rows;
the fence proves a claim in a transaction, and fails once its lease expired."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import claims, db, errors, inputs, keys, queue, statements, tables, threads
from app.spec import define_agent

AGENT = define_agent(name="a", side_a={"prompt": "p"})


async def runnable(sessions: async_sessionmaker[AsyncSession], n: int) -> list[uuid.UUID]:
    ids = []
    async with sessions() as s, s.begin():
        for _ in range(n):
            row = await threads.create(s, AGENT, keys.OPEN)
            await queue.enqueue(s, row.id, inputs.Kind.MESSAGE, {"id": str(uuid.uuid4()), "role": "user"})
            ids.append(row.id)
    return ids


async def claim_one(
    sessions: async_sessionmaker[AsyncSession], owner: str = "w", lease: float = 30
) -> claims.Claim | None:
    async with db.autocommit(sessions) as s:
        return await claims.claim(await statements.driver(s), owner, lease)


async def test_claim_takes_the_oldest_runnable_thread_once(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    ids = await runnable(sessions, 2)
    first = await claim_one(sessions)
    second = await claim_one(sessions)
    assert first is not None and second is not None
    assert [first.thread_id, second.thread_id] == ids
    assert first.attempt == 1
    assert await claim_one(sessions) is None  # both leased


@pytest.mark.parametrize("raw", [True, False])
async def test_a_claim_returns_the_row_as_it_left_it_on_any_connection(
    sessions: async_sessionmaker[AsyncSession], database_url: str, raw: bool
) -> None:
    """The claimed row (the execution's first transaction starts from it): every column, JSON ones decoded on the
    worker's own connection too (it decodes no JSON), and its version, which the row's `xmin` is then."""
    [tid] = await runnable(sessions, 1)
    async with sessions() as s, s.begin():
        (await s.get_one(tables.Thread, tid)).session_result = {"content": "done", "attachments": []}
    if raw:
        conn = await db.connect(database_url)
        try:
            claim = await claims.claim(conn, "w", 30)
        finally:
            await conn.close()
    else:
        claim = await claim_one(sessions)
    assert claim is not None and claim.row is not None
    assert claim.row["session_result"] == {"content": "done", "attachments": []}
    assert (claim.row["id"], claim.row["lease_token"], claim.row["attempt"]) == (tid, claim.token, 1)
    async with sessions() as s:
        found = await (await statements.driver(s)).fetchval("SELECT xmin::text FROM threads WHERE id = $1", tid)
    assert int(found) == claim.xmin


async def test_one_claim_takes_as_many_threads_as_asked_each_with_its_own_token(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    ids = await runnable(sessions, 3)
    async with db.autocommit(sessions) as s:
        first = await claims.claim_many(await statements.driver(s), "w", 30, [], 2)
        rest = await claims.claim_many(await statements.driver(s), "w", 30, [], 5)
    assert [c.thread_id for c in first] == ids[:2] and [c.thread_id for c in rest] == ids[2:]
    taken = first + rest
    assert len({c.token for c in taken}) == 3
    async with sessions() as s, s.begin():  # each token fences its own thread, and only that one
        for c in taken:
            assert (await claims.fence(s, c)).id == c.thread_id
        with pytest.raises(errors.LeaseLost):
            await claims.fence(s, claims.Claim(thread_id=ids[0], token=taken[1].token, attempt=1))


async def test_nothing_runnable_claims_nothing(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        await threads.create(s, AGENT, keys.OPEN)
    assert await claim_one(sessions) is None


async def test_expired_lease_is_claimable_and_fences_the_old_holder(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    await runnable(sessions, 1)
    old = await claim_one(sessions, "old", lease=0.05)
    assert old is not None
    await asyncio.sleep(0.1)
    new = await claim_one(sessions, "new")
    assert new is not None and new.thread_id == old.thread_id and new.attempt == 2
    async with sessions() as s, s.begin():
        with pytest.raises(errors.LeaseLost):
            await claims.fence(s, old)
        with pytest.raises(errors.LeaseLost):
            await queue.release(s, old)
        assert (await claims.fence(s, new)).id == new.thread_id


async def test_concurrent_claimers_never_share_a_thread(sessions: async_sessionmaker[AsyncSession]) -> None:
    ids = await runnable(sessions, 40)

    async def claimer(n: int) -> list[uuid.UUID]:
        got = []
        while (claim := await claim_one(sessions, f"w{n}")) is not None:
            got.append(claim.thread_id)
        return got

    results = await asyncio.gather(*(claimer(n) for n in range(8)))
    claimed = [tid for r in results for tid in r]
    assert sorted(claimed) == sorted(ids)
    assert len(set(claimed)) == len(claimed)


async def test_waiting_and_terminated_threads_are_not_claimed(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    waiting, terminated = await runnable(sessions, 2)
    async with sessions() as s, s.begin():
        await s.execute(text("UPDATE threads SET status = 'waiting' WHERE id = :id"), {"id": waiting})
        await s.execute(text("UPDATE threads SET terminated_at = now() WHERE id = :id"), {"id": terminated})
    assert await claim_one(sessions) is None


async def test_a_worker_never_claims_a_thread_it_still_runs(sessions: async_sessionmaker[AsyncSession]) -> None:
    """Its lease expired but nobody took it: no second execution starts here. The first one can write no more
    (the heartbeat could not renew it for a whole lease, and another worker may claim it any moment)."""
    [tid] = await runnable(sessions, 1)
    first = await claim_one(sessions, lease=0.05)
    assert first is not None
    await asyncio.sleep(0.1)
    async with db.autocommit(sessions) as s:
        assert await claims.claim(await statements.driver(s), "w", 30, [tid]) is None
    with pytest.raises(errors.LeaseLost):
        async with sessions() as s, s.begin():
            await claims.fence(s, first)
    other = await claim_one(sessions, "other")
    assert other is not None and other.thread_id == tid  # another worker may take it over

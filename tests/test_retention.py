"""Retention (`app/retention.py`) on real Postgres: rows older than their setting go, newer ones stay, and the
conversation (threads, messages, files) never goes, however old."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import catalog, logs, metrics, retention
from app.settings import Settings
from tests.conftest import ROOT, client_for, wait_for

OLD = "now() - interval '3 days'"  # past every setting below (2 days)
NEW = "now() - interval '1 day'"
SHA = "a" * 64
DAYS = {
    "event_retention_days": 2,
    "log_retention_days": 2,
    "metric_retention_days": 2,
    "set_aside_retention_days": 2,
    "effect_retention_days": 2,
}


async def _thread(session: AsyncSession, created: str = "now()") -> uuid.UUID:
    tid = uuid.uuid4()
    await session.execute(
        text(
            f"INSERT INTO threads (id, agent, type, user_id, created_at) VALUES (:id, 'a', 'ai_human', 'u', {created})"
        ),
        {"id": tid},
    )
    return tid


async def _log(session: AsyncSession, tid: uuid.UUID, at: str) -> None:
    await session.execute(
        text(f"INSERT INTO logs (id, thread_id, kind, status, created_at) VALUES (:id, :t, 'llm', 'ok', {at})"),
        {"id": uuid.uuid4(), "t": tid},
    )


async def _effect(session: AsyncSession, tid: uuid.UUID, status: str, at: str) -> str:
    name = f"{status}-{'old' if at == OLD else 'new'}"
    await session.execute(
        text(
            "INSERT INTO effects (id, thread_id, name, args, run_at, status, updated_at) "
            f"VALUES (:id, :t, :name, '{{}}', {at}, :status, {at})"
        ),
        {"id": uuid.uuid4(), "t": tid, "name": name, "status": status},
    )
    return name


async def _inbox(session: AsyncSession, tid: uuid.UUID, label: str, set_aside: str | None, created: str) -> None:
    aside = set_aside or "NULL"
    await session.execute(
        text(
            "INSERT INTO inbox (thread_id, kind, payload, created_at, set_aside_at) "
            f"VALUES (:t, 'message', CAST(:p AS jsonb), {created}, {aside})"
        ),
        {"t": tid, "p": f'{{"label": "{label}"}}'},
    )


async def _metric(session: AsyncSession, sample: str, labels: str, at: str) -> None:
    family = sample.removesuffix("_bucket").removesuffix("_count").removesuffix("_total")
    await session.execute(
        text(
            "INSERT INTO metrics (family, sample, labels, value, updated_at) "
            f"VALUES (:family, :sample, :labels, 1, {at})"
        ),
        {"family": family, "sample": sample, "labels": labels},
    )


async def _sweep_all(sessions: async_sessionmaker[AsyncSession], batch: int = retention.BATCH) -> dict[str, int]:
    settings = Settings(**DAYS)  # type: ignore[arg-type]
    return {rule.what: await retention.sweep(sessions, rule, batch) for rule in retention.rules(settings)}


async def _column(sessions: async_sessionmaker[AsyncSession], query: str) -> list[Any]:
    async with sessions() as session:
        return list((await session.execute(text(query))).scalars())


async def test_what_is_older_than_its_setting_goes_and_the_rest_stays(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session, session.begin():
        tid = await _thread(session)
        await _log(session, tid, OLD)
        await _log(session, tid, NEW)
        await session.execute(
            text(f"INSERT INTO events (thread_id, seq, type, data, created_at) VALUES (:t, 1, 'x', '{{}}', {OLD})"),
            {"t": tid},
        )
        await session.execute(
            text(f"INSERT INTO events (thread_id, seq, type, data, created_at) VALUES (:t, 2, 'x', '{{}}', {NEW})"),
            {"t": tid},
        )
        for status in ("done", "failed", "cancelled", "scheduled", "queued", "running"):
            await _effect(session, tid, status, OLD)
        await _effect(session, tid, "done", NEW)
        await _inbox(session, tid, "aside-old", OLD, OLD)
        await _inbox(session, tid, "aside-new", NEW, OLD)
        await _inbox(session, tid, "waiting-old", None, OLD)  # not delivered yet: input, however old
    gone = await _sweep_all(sessions)
    assert gone == {"events": 1, "logs": 1, "metrics": 0, "inbox": 1, "effects": 3}
    assert await _column(sessions, "SELECT count(*) FROM logs WHERE created_at > now() - interval '2 days'") == [1]
    assert await _column(sessions, "SELECT seq FROM events") == [2]
    assert sorted(await _column(sessions, "SELECT name FROM effects")) == [
        "done-new",
        "queued-old",
        "running-old",
        "scheduled-old",
    ]
    assert sorted(await _column(sessions, "SELECT payload ->> 'label' FROM inbox")) == ["aside-new", "waiting-old"]
    assert await _sweep_all(sessions) == dict.fromkeys(gone, 0)  # nothing left to expire: the sweep is idempotent


async def test_the_conversation_never_expires(sessions: async_sessionmaker[AsyncSession]) -> None:
    """Threads, messages and files older than every setting stay, with their content."""
    async with sessions() as session, session.begin():
        tid = await _thread(session, OLD)
        await session.execute(
            text(
                "INSERT INTO messages (id, thread_id, role, content, created_at, updated_at) "
                f"VALUES (:id, :t, 'user', 'kept', {OLD}, {OLD})"
            ),
            {"id": uuid.uuid4(), "t": tid},
        )
        blob = f"INSERT INTO blobs (sha256, size, created_at) VALUES (:sha, 4, {OLD})"
        await session.execute(text(blob), {"sha": SHA})
        await session.execute(
            text("INSERT INTO blob_chunks (sha256, index, data) VALUES (:sha, 0, :data)"), {"sha": SHA, "data": b"kept"}
        )
        await session.execute(
            text(
                "INSERT INTO files (thread_id, path, sha256, size, created_at, updated_at) "
                f"VALUES (:t, '/notes.txt', :sha, 4, {OLD}, {OLD})"
            ),
            {"t": tid, "sha": SHA},
        )
    await _sweep_all(sessions)
    assert await _column(sessions, "SELECT count(*) FROM threads") == [1]
    assert await _column(sessions, "SELECT content FROM messages") == ["kept"]
    assert await _column(sessions, "SELECT path FROM files") == ["/notes.txt"]
    assert await _column(sessions, "SELECT data FROM blob_chunks") == [b"kept"]


async def test_a_metric_series_goes_whole_once_none_of_its_samples_moved(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A histogram's buckets move only when an observation falls in them: a series whose count moved lately keeps its
    old buckets; one where nothing moved goes with all its samples."""
    async with sessions() as session, session.begin():
        for labels, count_at in (('{"model":"live"}', NEW), ('{"model":"retired"}', OLD)):
            await _metric(session, "agents_llm_seconds_bucket", labels[:-1] + ',"le":"0.1"}', OLD)
            await _metric(session, "agents_llm_seconds_bucket", labels[:-1] + ',"le":"+Inf"}', count_at)
            await _metric(session, "agents_llm_seconds_count", labels, count_at)
        await _metric(session, "agents_steps_total", '{"agent":"a"}', NEW)
        await _metric(session, "agents_steps_total", '{"agent":"b"}', OLD)
    gone = await _sweep_all(sessions)
    assert gone["metrics"] == 4
    assert sorted(await _column(sessions, "SELECT sample || ' ' || labels FROM metrics")) == [
        'agents_llm_seconds_bucket {"model":"live","le":"+Inf"}',
        'agents_llm_seconds_bucket {"model":"live","le":"0.1"}',
        'agents_llm_seconds_count {"model":"live"}',
        'agents_steps_total {"agent":"a"}',
    ]


async def test_a_backlog_goes_in_bounded_batches(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as session, session.begin():
        tid = await _thread(session)
        for _ in range(7):
            await _log(session, tid, OLD)
    [rule] = [r for r in retention.rules(Settings(**DAYS)) if r.what == "logs"]  # type: ignore[arg-type]
    async with sessions() as session, session.begin():
        assert await logs.expire(session, rule.age, 3) == 3  # one statement deletes at most its batch
    assert await retention.sweep(sessions, rule, batch=3) == 4
    assert await _column(sessions, "SELECT count(*) FROM logs") == [0]


async def test_a_flush_moves_its_series_on(sessions: async_sessionmaker[AsyncSession]) -> None:
    """The metrics flush stamps the series it adds to, so a series in use never looks stale."""
    async with sessions() as session, session.begin():
        await _metric(session, "agents_steps_total", '{"agent":"a"}', OLD)
    meter = metrics.Meter()
    meter.steps.labels("a").inc()
    await meter.flush(sessions)
    assert await _column(sessions, "SELECT value FROM metrics WHERE sample = 'agents_steps_total'") == [2.0]
    assert (await _sweep_all(sessions))["metrics"] == 0


async def test_the_janitor_applies_the_retention_settings(app_factory: Any) -> None:
    app = await app_factory(
        catalog.load(ROOT / "agents"), with_worker=True, cleanup_interval=0.05, log_retention_days=1
    )
    client = client_for(app)
    tid = uuid.UUID((await client.post("/threads", json={"agent": "assistant"})).json()["id"])
    async with app.state.runtime.sessions() as session, session.begin():
        await _log(session, tid, OLD)
        await _log(session, tid, "now()")

    async def one_left() -> bool:
        return await _column(app.state.runtime.sessions, "SELECT count(*) FROM logs") == [1]

    await wait_for(one_left)
    exposed = (await client.get("/metrics")).text
    assert 'agents_janitor_deleted_total{what="logs"} 1.0' in exposed

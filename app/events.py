"""The per-thread event log and the lifecycle log (live fan-out to subscribers is `app.hub`).

An event is written in the transaction of the change it reports; its `seq` comes from
`threads.event_seq` under the thread row lock, so seq order is commit order. The NOTIFY issued in the same
transaction is delivered at commit. Streaming deltas (`message_chunk`) are never stored: they travel as NOTIFY
payloads only (`hub.Publisher`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import asyncpg
from sqlalchemy import func, select, text
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from app import errors, statements, tables
from app.event_types import (
    AgentHandoff,
    Custom,
    Error,
    FallbackTriggered,
    Lifecycle,
    LifecycleEvent,
    LlmRequest,
    LlmResponse,
    MessageData,
    MessageDeleted,
    Nothing,
    SessionEnded,
    StepCompleted,
    StepStarted,
    SubagentEntry,
    ThreadStatus,
    ToolCompleted,
    ToolStarted,
    TurnEnded,
)

CHANNEL = "agents_events"


# APPEND: the seq under the thread's row lock, the event, and its NOTIFY (delivered at commit) in one round trip.
_APPEND = """
    WITH next AS (UPDATE threads SET event_seq = event_seq + 1 WHERE id = $1 RETURNING event_seq)
    INSERT INTO events (thread_id, seq, type, data)
    SELECT $1, next.event_seq, $2, CAST($3 AS jsonb) FROM next
    RETURNING seq, pg_notify($4, CAST($1 AS text) || ':' || seq)
"""


# APPEND_MANY: a batch of one thread's events, their seqs taken at once under the row lock, one NOTIFY naming the
# first and carrying the events themselves when they fit (`$6`, see `carried`); without them the hub reads
# everything after what it has, so it gets the whole batch.
_APPEND_MANY = """
    WITH next AS (UPDATE threads SET event_seq = event_seq + $2 WHERE id = $1 RETURNING event_seq),
    stored AS (
        INSERT INTO events (thread_id, seq, type, data)
        SELECT $1, next.event_seq - $2 + e.ord, e.type, CAST(e.data AS jsonb)
        FROM next, unnest($3::text[], $4::text[]) WITH ORDINALITY AS e(type, data, ord)
    )
    SELECT pg_notify($5, CAST($1 AS text) || ':' || (next.event_seq - $2 + 1) || $6) FROM next
"""

CARRIED_BYTES = 8000 - 64  # a NOTIFY payload's limit, less `thread_id:seq` (at most 56 bytes) and the separator


def carried(types: list[str], datas: list[str]) -> str:
    """The suffix of a batch's NOTIFY: `:` and the events as a JSON array of `[type, data]` when that fits in a
    payload (the hub then hands them on without reading them back), else nothing."""
    if sum(map(len, datas)) > CARRIED_BYTES:  # too large whatever the encoding: not built at all
        return ""
    body = ":[" + ",".join(f"[{json.dumps(t)},{d}]" for t, d in zip(types, datas, strict=True)) + "]"
    return body if len(body.encode()) <= CARRIED_BYTES else ""


def _append_many_with(sets: str, wake: str | None) -> str:
    """`_APPEND_MANY` that also writes the thread row's changed columns (`sets`, from `$7`) in its UPDATE; with
    `wake` (a channel), it marks the thread runnable there too and wakes a worker on that channel at commit."""
    if wake is not None:
        sets = ", ".join(s for s in (sets, "runnable_since = coalesce(runnable_since, now())") if s)
    sql = _APPEND_MANY.replace("SET event_seq = event_seq + $2", f"SET event_seq = event_seq + $2, {sets}", 1)
    if wake is not None:
        sql = sql.replace("|| $6) FROM next", f"|| $6), pg_notify('{wake}', '') FROM next", 1)
    return sql


def _append_many_releasing(sets: str, token: int, channel: str) -> str:
    """`_APPEND_MANY` that also gives the thread back (`queue.release`'s plain case, `$token` the lease token): the
    lease row goes, the row's lease columns are cleared, and it stays runnable (a worker woken on `channel`) only if
    input waits. Returns the row's `runnable_since` and `attempt` as the release left them; no row when the lease
    is not the one given."""
    sets = ", ".join(s for s in (sets, _RELEASE_SETS) if s)
    sql = _APPEND_MANY.replace("SET event_seq = event_seq + $2", f"SET event_seq = event_seq + $2, {sets}", 1)
    mine = f"lease_token = ${token} RETURNING event_seq, runnable_since, attempt)"
    dropped = f"dropped AS (DELETE FROM leases WHERE thread_id = $1 AND token = ${token})"  # noqa: S608 -- a number
    sql = sql.replace("WHERE id = $1 RETURNING event_seq),", f"WHERE id = $1 AND {mine}, {dropped},", 1)
    sql = sql.replace("SELECT pg_notify($5,", "SELECT CASE WHEN $2 > 0 THEN pg_notify($5,", 1)  # no events: no news
    return sql.replace(
        "|| $6) FROM next",
        f"|| $6) END, next.runnable_since, next.attempt, "
        f"CASE WHEN next.runnable_since IS NOT NULL THEN pg_notify('{channel}', '') END FROM next",
        1,
    )


# INPUT_WAITS: whether the thread's inbox holds input, in an UPDATE of its row (also `queue._RELEASE`).
# RELEASE_SETS: as `queue._RELEASE` sets them without a refund or `again`: runnable only with input waiting (the row
# lock taken by the transaction's fence keeps any new input's commit after this one).
INPUT_WAITS = "EXISTS (SELECT 1 FROM inbox WHERE inbox.thread_id = threads.id AND inbox.set_aside_at IS NULL)"
_RELEASE_SETS = (
    "lease_token = NULL, lease_owner = NULL, attempt = 0, "
    f"runnable_since = CASE WHEN {INPUT_WAITS} THEN coalesce(runnable_since, now()) ELSE NULL END"
)
RELEASED = ("lease_token", "lease_owner", "attempt", "runnable_since")  # the columns a release sets


# RUNNABLE: keep (or set) `runnable_since` and wake a worker on `$2` at commit: `_APPEND_MANY`'s wake-up without
# events (after the deferred writes, `statements.defer`), and `queue.mark_runnable`.
RUNNABLE = (
    "UPDATE threads SET runnable_since = coalesce(runnable_since, now()) WHERE id = $1 RETURNING pg_notify($2, '')"
)


_BATCH = "events.batch"  # `session.info` key of the events held for one thread until `flush`


@dataclass
class _Held:
    thread_id: uuid.UUID
    items: list[tuple[str, str]] = field(default_factory=list)
    wake: str | None = None  # `runnable`: the wake-up channel
    release: tuple[uuid.UUID, str] | None = None  # `releasing`: the lease token, and the wake-up channel


def hold(session: AsyncSession, thread_id: uuid.UUID) -> None:
    """Keep the thread's events appended on `session` from now on and write them all at `flush`, in one statement.
    For a transaction that holds the thread's row lock from its start (the engine's fenced ones), so holding them
    changes no lock order; other threads' events are still written at once."""
    session.info[_BATCH] = _Held(thread_id)


async def flush(session: AsyncSession, thread: tables.Thread | None = None) -> None:
    """Write the events held on `session` (before its commit, and before a savepoint); with the held thread's row,
    its changed columns go in the same statement (the events' UPDATE of that row), and so do the deferred writes
    (`statements.defer`)."""
    held: _Held | None = session.info.get(_BATCH)
    if held is None:
        return
    # a release goes with the thread's row (the transaction's last flush); one without it writes only the events
    release = held.release if thread is not None and thread.id == held.thread_id else None
    writes = statements.deferred(session)
    if not (held.items or writes or held.wake or release):
        return
    driver = await statements.driver(session, flush=False, carries=True)
    types, datas = [t for t, _ in held.items], [d for _, d in held.items]
    extra, wake = [a for _, args in writes for a in args], held.wake
    held.items, held.wake = [], None
    if release is not None:
        assert thread is not None
        held.release = None
        await _flush_releasing(session, driver, thread, types, datas, writes, release)
        return
    if not types:
        if wake is not None:
            prefix = f"WITH {statements.ctes(writes, 3)} " if writes else ""
            await driver.execute(prefix + RUNNABLE, held.thread_id, wake, *extra)
        elif writes:
            await driver.execute(f"WITH {statements.ctes(writes, 1)} SELECT 1", *extra)
        return
    changes = statements.changes(thread, first=7) if thread is not None and thread.id == held.thread_id else None
    if wake is not None and changes is not None and "runnable_since" in changes.keys:
        raise ValueError("runnable_since is set by the statement itself when it wakes a worker")
    sets, params = ("", []) if changes is None else (changes.sets, changes.params)
    sql = _append_many_with(sets, wake) if sets or wake is not None else _APPEND_MANY
    if writes:  # before the statement's own CTEs, which start it
        sql = sql.replace("WITH ", f"WITH {statements.ctes(writes, 7 + len(params))}, ", 1)
    suffix = carried(types, datas)
    await driver.execute(sql, held.thread_id, len(types), types, datas, CHANNEL, suffix, *params, *extra)
    if changes is not None:
        changes.written(session)


async def _flush_releasing(
    session: AsyncSession,
    driver: statements.Driver,
    thread: tables.Thread,
    types: list[str],
    datas: list[str],
    writes: list[tuple[str, list[Any]]],
    release: tuple[uuid.UUID, str],
) -> None:
    token, channel = release
    keys = tuple(sorted(k for k in sa_inspect(thread).committed_state if k not in RELEASED))
    changes = statements.changes(thread, keys, first=7) if keys else None
    sets, params = ("", []) if changes is None else (changes.sets, changes.params)
    sql = _append_many_releasing(sets, 7 + len(params), channel)
    if writes:
        sql = sql.replace("WITH ", f"WITH {statements.ctes(writes, 8 + len(params))}, ", 1)
    extra = [a for _, args in writes for a in args]
    suffix = carried(types, datas)
    found = await driver.fetchrow(sql, thread.id, len(types), types, datas, CHANNEL, suffix, *params, token, *extra)
    if found is None:
        raise errors.LeaseLost()
    if changes is not None:
        changes.written(session)
    released = {"lease_token": None, "lease_owner": None, "attempt": found["attempt"]}
    for key, value in {**released, "runnable_since": found["runnable_since"]}.items():
        set_committed_value(thread, key, value)
    statements.settle(session, thread)


def releasing(session: AsyncSession, thread: tables.Thread, token: uuid.UUID, channel: str) -> bool:
    """Give the thread back (`queue.release` with neither `again` nor a refund) in the statement that writes the held
    events at the transaction's last flush (one round trip fewer), when `session` holds the thread's events; False
    when it does not, or when deferred input would escape the release's look at the inbox (the caller releases it).
    The transaction must hold the row lock (the engine's fence), and mark nothing runnable after this."""
    held: _Held | None = session.info.get(_BATCH)
    if (
        held is None
        or held.thread_id != thread.id
        or held.wake is not None
        or "inbox" in statements.deferred_tables(session)
    ):
        return False
    held.release = (token, channel)
    return True


def runnable(session: AsyncSession, thread_id: uuid.UUID, channel: str) -> bool:
    """Mark the thread runnable and wake a worker on `channel` in the statement that writes the held events (one
    round trip fewer), when `session` holds the thread's events; False when it does not (the caller does it). The
    held row object's `runnable_since` is not refreshed."""
    held: _Held | None = session.info.get(_BATCH)
    if held is not None and held.release is not None:
        raise ValueError("the thread is released at the end of this transaction: nothing may mark it runnable")
    if held is None or held.thread_id != thread_id:
        return False
    held.wake = channel
    return True


@asynccontextmanager
async def written_at_once(session: AsyncSession) -> AsyncIterator[None]:
    """Events appended inside are written at once (a savepoint that may roll back must take its events with it)."""
    await flush(session)
    await statements.send_deferred(session)
    held = session.info.pop(_BATCH, None)
    try:
        yield
    finally:
        if held is not None:
            session.info[_BATCH] = held


# `append` takes each stored type with its payload only (`STORED`): a misspelt type or a wrong shape fails mypy.
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["message_data"], data: MessageData
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["message_deleted"], data: MessageDeleted
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["step_started"], data: StepStarted
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["step_completed"], data: StepCompleted
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["llm_request"], data: LlmRequest
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["llm_response"], data: LlmResponse
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["fallback_triggered"], data: FallbackTriggered
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["tool_started"], data: ToolStarted
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["tool_completed"], data: ToolCompleted
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["turn_ended"], data: TurnEnded
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["session_ended"], data: SessionEnded
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["thread_status"], data: ThreadStatus
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["stopped_by_user", "thread_terminated"], data: Nothing
) -> int | None: ...
@overload
async def append(
    session: AsyncSession, thread_id: uuid.UUID, type_: Literal["agent_handoff"], data: AgentHandoff
) -> int | None: ...
@overload
async def append(
    session: AsyncSession,
    thread_id: uuid.UUID,
    type_: Literal["subagent_created", "subagent_status"],
    data: SubagentEntry,
) -> int | None: ...
@overload
async def append(session: AsyncSession, thread_id: uuid.UUID, type_: Literal["event"], data: Custom) -> int | None: ...
@overload
async def append(session: AsyncSession, thread_id: uuid.UUID, type_: Literal["error"], data: Error) -> int | None: ...
async def append(session: AsyncSession, thread_id: uuid.UUID, type_: str, data: Mapping[str, Any]) -> int | None:
    """Store one event of a thread and announce it at commit; returns its seq (None while held: see `hold`)."""
    payload = json.dumps(dict(data))
    held: _Held | None = session.info.get(_BATCH)
    if held is not None and held.thread_id == thread_id:
        held.items.append((type_, payload))
        return None
    driver = await statements.driver(session, flush=False)
    seq: int = await driver.fetchval(_APPEND, thread_id, type_, payload, CHANNEL)
    return seq


async def read(session: AsyncSession, thread_id: uuid.UUID, after: int, limit: int = 500) -> list[tables.Event]:
    """Stored events of a thread with seq greater than `after`, in order."""
    query = (
        select(tables.Event)
        .where(tables.Event.thread_id == thread_id, tables.Event.seq > after)
        .order_by(tables.Event.seq)
        .limit(limit)
    )
    return list((await session.execute(query)).scalars())


# READ_MANY: the next events of several threads, each after its own position, in one query; the payload as the text
# a stream sends (the hub decodes it once for its filters, and sends it as it is).
_READ_MANY = """
    SELECT e.thread_id, e.seq, e.type, CAST(e.data AS text) AS text
    FROM unnest(CAST($1 AS uuid[]), CAST($2 AS bigint[])) AS t(id, after)
    CROSS JOIN LATERAL (
        SELECT thread_id, seq, type, data FROM events
        WHERE thread_id = t.id AND seq > t.after ORDER BY seq LIMIT $3
    ) AS e
    ORDER BY e.thread_id, e.seq
"""


async def read_many(
    conn: asyncpg.Connection, afters: Mapping[uuid.UUID, int], limit: int = 500
) -> dict[uuid.UUID, list[asyncpg.Record]]:
    """For each thread, its stored events with seq greater than its position, in order (at most `limit` each), as
    records of `thread_id`, `seq`, `type` and `text` (the JSON payload), read outside any transaction."""
    ids = list(afters)
    found: dict[uuid.UUID, list[asyncpg.Record]] = {}
    for row in await conn.fetch(_READ_MANY, ids, [afters[i] for i in ids], limit):
        found.setdefault(row["thread_id"], []).append(row)
    return found


async def missed(session: AsyncSession, thread_id: uuid.UUID, after: int) -> int | None:
    """When retention removed events after `after`, the oldest seq still stored (the `events_missed` answer)."""
    row = (
        await session.execute(
            text(
                "SELECT t.event_seq, (SELECT min(seq) FROM events e WHERE e.thread_id = t.id) AS oldest "
                "FROM threads t WHERE t.id = :id"
            ),
            {"id": thread_id},
        )
    ).one()
    if after >= row.event_seq:
        return None
    oldest = row.oldest if row.oldest is not None else row.event_seq + 1
    return int(oldest) if oldest > after + 1 else None


# -- the lifecycle stream ------------------------------------------------------------------------------------

LIFECYCLE = uuid.UUID(int=0)  # the hub key of lifecycle subscribers


async def append_lifecycle(session: AsyncSession, thread: tables.Thread, type_: LifecycleEvent) -> int:
    """Record `thread_created` / `thread_updated` / `thread_deleted` for the thread's owner; returns its seq.

    The seq comes from the `lifecycle` counter row under its lock, so seq order is commit order (low volume).
    """
    seq: int = (
        await session.execute(text("UPDATE counters SET value = value + 1 WHERE name = 'lifecycle' RETURNING value"))
    ).scalar_one()
    data = Lifecycle(thread_id=str(thread.id), agent=thread.agent, status=thread.status, name=thread.name)
    session.add(tables.LifecycleEvent(seq=seq, user_id=thread.user_id, thread_id=thread.id, type=type_, data=data))
    await session.execute(select(func.pg_notify(CHANNEL, f"{LIFECYCLE}:{seq}")))
    return seq


async def read_lifecycle(
    session: AsyncSession, user_id: str | None, after: int, limit: int = 500
) -> list[tables.LifecycleEvent]:
    """Lifecycle events after `after`, of one user's threads (all threads when `user_id` is None)."""
    query = select(tables.LifecycleEvent).where(tables.LifecycleEvent.seq > after)
    if user_id is not None:
        query = query.where(tables.LifecycleEvent.user_id == user_id)
    return list((await session.execute(query.order_by(tables.LifecycleEvent.seq).limit(limit))).scalars())


async def missed_lifecycle(session: AsyncSession, after: int) -> int | None:
    """When retention removed lifecycle events after `after`, the oldest seq still stored."""
    row = (
        await session.execute(
            text(
                "SELECT c.value AS last, (SELECT min(seq) FROM lifecycle_events) AS oldest "
                "FROM counters c WHERE c.name = 'lifecycle'"
            )
        )
    ).one()
    if after >= row.last:
        return None
    oldest = row.oldest if row.oldest is not None else row.last + 1
    return int(oldest) if oldest > after + 1 else None


# EXPIRE: retention, in batches so a large backlog never holds one long transaction.
_EXPIRE = text(
    """
    DELETE FROM events WHERE ctid IN (
        SELECT ctid FROM events WHERE created_at < now() - make_interval(secs => :age) LIMIT :batch
    )
    """
)


_EXPIRE_LIFECYCLE = text(
    """
    DELETE FROM lifecycle_events WHERE seq IN (
        SELECT seq FROM lifecycle_events WHERE created_at < now() - make_interval(secs => :age) LIMIT :batch
    )
    """
)


async def expire(session: AsyncSession, age_seconds: float, batch: int = 10_000) -> int:
    """Delete one batch of thread and lifecycle events older than `age_seconds`; returns how many went."""
    gone = 0
    for statement in (_EXPIRE, _EXPIRE_LIFECYCLE):
        result = await session.execute(statement, {"age": age_seconds, "batch": batch})
        gone += int(result.rowcount)  # type: ignore[attr-defined]
    return gone

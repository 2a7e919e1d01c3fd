"""The per-thread event log and the lifecycle log (live fan-out to subscribers is `app.hub`).

An event is written in the transaction of the change it reports; its `seq` comes from
`threads.event_seq` under the thread row lock, so seq order is commit order. The NOTIFY issued in the same
transaction is delivered at commit. Streaming deltas (`message_chunk`) are never stored: they travel as NOTIFY
payloads only (`hub.Publisher`).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, overload

import asyncpg
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from app import db, errors, statements, tables
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
PAGE = 500  # stored events read per query (a stream's backlog, the hub's reads)


class Row(Protocol):
    """A stored event as read from `events` or `lifecycle_events`."""

    seq: int
    type: str
    data: dict[str, Any]


# APPEND: the seq under the thread's row lock, the event, and its NOTIFY (delivered at commit) in one round trip.
_APPEND = """
    WITH next AS (UPDATE threads SET event_seq = event_seq + 1 WHERE id = $1 RETURNING event_seq)
    INSERT INTO events (thread_id, seq, type, data)
    SELECT $1, next.event_seq, $2, CAST($3 AS jsonb) FROM next
    RETURNING seq, pg_notify($4, CAST($1 AS text) || ':' || seq)
"""


# APPEND_MANY: a batch of one thread's events (`$1` the thread, `$2` how many, `$3` and `$4` their types and payloads),
# their seqs taken at once under the row lock, one NOTIFY on `$5` naming the first and carrying the events themselves
# when they fit (`$6`, see `carried`; without them the hub reads everything after what it has, so it gets the whole
# batch), and no NOTIFY for no events. `append_many` joins a caller's parts to it: CTEs before it (`first`, the
# deferred writes) and after the row's UPDATE (`then`), that UPDATE's `sets`, `where` and `returning` (its row is
# `next`), and `select` items of the result.
_STORED = """stored AS (
        INSERT INTO events (thread_id, seq, type, data)
        SELECT $1, next.event_seq - $2 + e.ord, e.type, CAST(e.data AS jsonb)
        FROM next, unnest($3::text[], $4::text[]) WITH ORDINALITY AS e(type, data, ord)
    )"""
_LIVE = "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p"  # live notifications alone (`notify_first`)
_NEWS = "CASE WHEN $2 > 0 THEN pg_notify($5, CAST($1 AS text) || ':' || (next.event_seq - $2 + 1) || $6) END"


@functools.lru_cache(maxsize=1024)  # the same few shapes every time, as asyncpg caches each prepared text
def append_many(
    *,
    first: str = "",
    sets: str = "",
    where: str = "",
    returning: str = "",
    then: str = "",
    select: str = "",
    guarded: bool = False,
    live: int = 0,
) -> str:
    """APPEND_MANY with the caller's parts (see above). The row's `xmin` (the version it now is) comes back as
    `row_xmin`. `guarded`: a statement sent on its own (`Guard`) that fails, writing nothing, where `where` finds no
    row: one row always comes back, and `1 / 0` in it when the UPDATE wrote none. Its deferred writes (`first`) run
    after the query that reads `next`, so the thread row is locked first, as in a fenced transaction. `live`: the
    number of a parameter holding notification payloads (`notify_first`), notified on `$5` before the events' own."""
    # the parts are SQL of this module and of `queue` (S608), their values parameters
    update = (
        f"UPDATE threads SET {_listed(', ', 'event_seq = event_seq + $2', sets)} "  # noqa: S608
        f"WHERE {_listed(' AND ', 'id = $1', where)} "
        f"RETURNING {_listed(', ', 'event_seq', 'xmin AS row_xmin', returning)}"
    )
    ctes = _listed(", ", first, f"next AS ({update})", then, _STORED)
    items = _listed(", ", _NEWS, "next.row_xmin", select)
    source = "next"
    if live:  # joined to the row: all sent before the row's items (the events' NOTIFY among them) are computed
        notes = f"(SELECT count(pg_notify($5, p)) AS n FROM unnest(${live}::text[]) AS p) AS live"  # noqa: S608
        source = f"next CROSS JOIN {notes}"
    if not guarded:
        return f"WITH {ctes} SELECT {items} FROM {source}"  # noqa: S608
    return (
        f"WITH {ctes}, out AS (SELECT {items} FROM {source}) "  # noqa: S608
        "SELECT out.*, 1 / (SELECT count(*)::int FROM next) AS written FROM (SELECT 1) AS one LEFT JOIN out ON true"
    )


def _listed(separator: str, *parts: str) -> str:
    return separator.join(part for part in parts if part)


CARRIED_BYTES = 8000 - 64  # a NOTIFY payload's limit, less `thread_id:seq` (at most 56 bytes) and the separator


def carried(types: list[str], datas: list[str]) -> str:
    """The suffix of a batch's NOTIFY: `:` and the events as a JSON array of `[type, data]` when that fits in a
    payload (the hub then hands them on without reading them back), else nothing."""
    if sum(map(len, datas)) > CARRIED_BYTES:  # too large whatever the encoding: not built at all
        return ""
    body = ":[" + ",".join(f"[{json.dumps(t)},{d}]" for t, d in zip(types, datas, strict=True)) + "]"
    return body if len(body.encode()) <= CARRIED_BYTES else ""


@dataclass(frozen=True)
class Rider:
    """A write of the held thread's row (the queue's scheduling columns: its SQL is in `queue`) that the statement
    writing the held events carries, one round trip fewer: `sets`, `where`, `then` and `select` are its parts of
    `append_many` (no row when `where` fails: `LeaseLost`), `args` its parameters, numbered from `$7`, and `columns`
    the row's columns it writes.

    A `final` one gives the thread back: the flush with the row (the transaction's last) writes it, over the row's own
    changes to `columns`, and reads the values it left back into the row; nothing may ride after it. Any other is
    written by the next flush, and the row may not change `columns` itself."""

    sets: str
    columns: tuple[str, ...]
    args: tuple[Any, ...] = ()
    where: str = ""
    then: str = ""
    select: str = ""
    final: bool = False


_BATCH = "events.batch"  # `session.info` key of the events held for one thread until `flush`


@dataclass(frozen=True)
class Guard:
    """How `flush` sends a `statements.writes_only` session's writes: in one statement on `driver` (autocommit), the
    thread row written only where `where` holds as well (its parameters `args`, numbered `$1`… in `where`), and
    nothing written at all where it does not (`statements.Stale`)."""

    driver: db.Driver
    where: str
    args: tuple[Any, ...]


@dataclass
class _Held:
    thread_id: uuid.UUID
    items: list[tuple[str, str]] = field(default_factory=list)
    rider: Rider | None = None  # `add_rider`
    live: list[str] = field(default_factory=list)  # `notify_first`


def hold(session: AsyncSession, thread_id: uuid.UUID) -> None:
    """Keep the thread's events appended on `session` from now on and write them all at `flush`, in one statement.
    For a transaction that holds the thread's row lock from its start (the engine's fenced ones), so holding them
    changes no lock order; other threads' events are still written at once."""
    session.info[_BATCH] = _Held(thread_id)


def notify_first(session: AsyncSession, thread_id: uuid.UUID, payloads: list[str]) -> bool:
    """Have the statement that writes the thread's held events send `payloads` (live-only notifications: the
    thread's deltas not sent yet, `Publisher.take`) on the events channel first: delivered at its commit, just before
    the events they precede, and no round trip of their own. False when `session` holds no events of that thread."""
    held: _Held | None = session.info.get(_BATCH)
    if held is None or held.thread_id != thread_id:
        return False
    held.live = [*held.live, *payloads]
    return True


async def flush(
    session: AsyncSession, thread: tables.Thread | None = None, *, guard: Guard | None = None
) -> int | None:
    """Write the events held on `session` (before its commit, and before a savepoint); with the held thread's row,
    its changed columns go in the same statement (the events' UPDATE of that row), and so do the deferred writes
    (`statements.defer`) and the rider (`add_rider`). Returns the row's version it left (`xmin`), if it wrote it.
    `guard`: the session is `writes_only`; the statement goes on the guard's driver, guarded (`Guard`)."""
    held: _Held | None = session.info.get(_BATCH)
    if held is None:
        if guard is not None:
            raise statements.Unsent()
        return None
    row = thread if thread is not None and thread.id == held.thread_id else None
    rider = held.rider if held.rider is not None and (row is not None or not held.rider.final) else None
    writes = statements.deferred(session)
    if guard is not None and not held.items:  # the guard rides on the events' UPDATE of the row
        raise statements.Unsent()
    if not (held.items or writes or rider or held.live):
        return None
    driver = guard.driver if guard is not None else await statements.driver(session, flush=False, carries=True)
    extra = [a for _, args in writes for a in args]
    live, held.live = held.live, []
    if not held.items and rider is None:  # the deferred writes alone, the live notifications after them
        if writes:
            await driver.execute(f"WITH {statements.ctes(writes, 1)} SELECT 1", *extra)
        if live:
            await driver.execute(_LIVE, CHANNEL, live)
        return None
    types, datas = [t for t, _ in held.items], [d for _, d in held.items]
    held.items = []
    if rider is not None:
        held.rider = None
    args = rider.args if rider is not None else ()
    changes = None if row is None else _changes(row, rider, first=7 + len(args))
    sets, params = ("", []) if changes is None else (changes.sets, changes.params)
    at = 7 + len(args) + len(params)  # the next parameter's number
    where = rider.where if rider is not None else ""
    guarding: tuple[Any, ...] = ()
    if guard is not None:
        where = _listed(" AND ", where, statements.renumbered(guard.where, at + len(extra) - 1))
        guarding = guard.args
    sql = append_many(
        first=statements.ctes(writes, at) if writes else "",
        sets=_listed(", ", rider.sets if rider is not None else "", sets),
        guarded=guard is not None,
        live=at + len(extra) + len(guarding) if live else 0,
        **(_parts(rider, where) if rider is not None else {"where": where}),
    )
    try:
        found = await driver.fetchrow(
            sql, held.thread_id, len(types), types, datas, CHANNEL, carried(types, datas), *args, *params, *extra,
            *guarding, *([live] if live else []),
        )  # fmt: skip
    except DBAPIError as exc:
        if guard is not None and isinstance(exc.orig, asyncpg.DivisionByZeroError):  # `written`: no row
            raise statements.Stale() from exc
        raise
    if found is None and rider is not None and rider.where:
        raise errors.LeaseLost()
    if changes is not None:
        changes.written(session)
    if row is not None and rider is not None and rider.final:
        assert found is not None
        for key in rider.columns:
            set_committed_value(row, key, found[key])
        statements.settle(session, row)
    return None if found is None else int(found["row_xmin"])


def _changes(row: tables.Thread, rider: Rider | None, first: int) -> statements.Changes | None:
    """The row's changed columns the statement writes: not those a final rider writes over."""
    changed = tuple(sorted(sa_inspect(row).committed_state))
    if rider is not None and not rider.final and set(changed) & set(rider.columns):
        raise ValueError(f"{', '.join(rider.columns)}: written by the statement itself, not by the row")
    keys = tuple(k for k in changed if rider is None or k not in rider.columns)
    return statements.changes(row, keys, first=first) if keys else None


def _parts(rider: Rider, where: str) -> dict[str, str]:
    """A rider's parts of `append_many` (`where` its own and any guard's); a final one's also return the columns it
    writes (as `next` holds them)."""
    returning = ", ".join(rider.columns) if rider.final else ""
    read_back = ", ".join(f"next.{c}" for c in rider.columns) if rider.final else ""
    return {
        "where": where,
        "returning": returning,
        "then": rider.then,
        "select": _listed(", ", read_back, rider.select),
    }


def add_rider(session: AsyncSession, thread_id: uuid.UUID, rider: Rider) -> bool:
    """Have the statement that writes the thread's held events also write `rider` (see `Rider`), when `session` holds
    that thread's events and no other rider; False when it does not (the caller writes it itself)."""
    held: _Held | None = session.info.get(_BATCH)
    if held is not None and held.rider == rider:
        return True
    if held is not None and held.rider is not None and held.rider.final:
        raise ValueError("the thread is given back at the end of this transaction: nothing may ride after that")
    if held is None or held.thread_id != thread_id or held.rider is not None:
        return False
    held.rider = rider
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


# READ: a thread's events after a position, in order.
_READ = "SELECT * FROM events WHERE thread_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"


async def read(session: AsyncSession, thread_id: uuid.UUID, after: int, limit: int = PAGE) -> list[tables.Event]:
    """Stored events of a thread with seq greater than `after`, in order."""
    rows = await (await statements.driver(session)).fetch(_READ, thread_id, after, limit)
    return [statements.attach(session, tables.Event, row) for row in rows]


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
    conn: asyncpg.Connection, afters: Mapping[uuid.UUID, int], limit: int = PAGE
) -> dict[uuid.UUID, list[asyncpg.Record]]:
    """For each thread, its stored events with seq greater than its position, in order (at most `limit` each), as
    records of `thread_id`, `seq`, `type` and `text` (the JSON payload), read outside any transaction."""
    ids = list(afters)
    found: dict[uuid.UUID, list[asyncpg.Record]] = {}
    for row in await conn.fetch(_READ_MANY, ids, [afters[i] for i in ids], limit):
        found.setdefault(row["thread_id"], []).append(row)
    return found


# MISSED: a thread's last seq and the oldest one retention left.
_MISSED = """
    SELECT t.event_seq AS last, (SELECT min(seq) FROM events e WHERE e.thread_id = t.id) AS oldest
    FROM threads t WHERE t.id = $1
"""


async def missed(session: AsyncSession, thread_id: uuid.UUID, after: int) -> int | None:
    """When retention removed events after `after`, or `after` is past the thread's last event, the oldest seq still
    stored (the `events_missed` answer; the stream goes on from there)."""
    found = await (await statements.driver(session)).fetchrow(_MISSED, thread_id)
    assert found is not None  # the caller read the thread
    return _oldest_missed(found, after)


def _oldest_missed(found: asyncpg.Record, after: int) -> int | None:
    """From the `last` seq and the `oldest` one stored: the oldest if retention took any after `after`, or if
    `after` is past the last (the client saw events this database does not hold: it was restored from a backup
    older than what the client saw, docs/deployment.md "Backup and restore")."""
    oldest = int(found["oldest"] if found["oldest"] is not None else found["last"] + 1)
    if after > found["last"]:
        return oldest
    if after == found["last"]:
        return None
    return oldest if oldest > after + 1 else None


# -- the lifecycle stream ------------------------------------------------------------------------------------

LIFECYCLE = uuid.UUID(int=0)  # the hub key of lifecycle subscribers


# APPEND_LIFECYCLE: the seq from the `lifecycle` counter row under its lock (so seq order is commit order; low
# volume), the event, and its NOTIFY (`$5`, delivered at commit) in one statement.
_APPEND_LIFECYCLE = """
    WITH next AS (UPDATE counters SET value = value + 1 WHERE name = 'lifecycle' RETURNING value)
    INSERT INTO lifecycle_events (seq, user_id, thread_id, type, data)
    SELECT next.value, $1, $2, $3, CAST($4 AS jsonb) FROM next
    RETURNING seq, pg_notify($5, CAST($6 AS text) || ':' || seq)
"""


async def append_lifecycle(session: AsyncSession, thread: tables.Thread, type_: LifecycleEvent) -> int:
    """Record `thread_created` / `thread_updated` / `thread_deleted` for the thread's owner; returns its seq."""
    data = Lifecycle(thread_id=str(thread.id), agent=thread.agent, status=thread.status, name=thread.name)
    args = (thread.user_id, thread.id, type_, json.dumps(data), CHANNEL, str(LIFECYCLE))
    seq: int = await (await statements.driver(session)).fetchval(_APPEND_LIFECYCLE, *args)
    return seq


# READ_LIFECYCLE: lifecycle events after a position, of every thread; READ_LIFECYCLE_OF: of one user's threads.
_READ_LIFECYCLE = "SELECT * FROM lifecycle_events WHERE seq > $1 ORDER BY seq LIMIT $2"
_READ_LIFECYCLE_OF = "SELECT * FROM lifecycle_events WHERE seq > $1 AND user_id = $3 ORDER BY seq LIMIT $2"


async def read_lifecycle(
    session: AsyncSession, user_id: str | None, after: int, limit: int = PAGE
) -> list[tables.LifecycleEvent]:
    """Lifecycle events after `after`, of one user's threads (all threads when `user_id` is None)."""
    driver = await statements.driver(session)
    if user_id is None:
        rows = await driver.fetch(_READ_LIFECYCLE, after, limit)
    else:
        rows = await driver.fetch(_READ_LIFECYCLE_OF, after, limit, user_id)
    return [statements.attach(session, tables.LifecycleEvent, row) for row in rows]


# MISSED_LIFECYCLE: the lifecycle stream's last seq and the oldest one retention left.
_MISSED_LIFECYCLE = """
    SELECT c.value AS last, (SELECT min(seq) FROM lifecycle_events) AS oldest FROM counters c WHERE c.name = 'lifecycle'
"""


async def missed_lifecycle(session: AsyncSession, after: int) -> int | None:
    """When retention removed lifecycle events after `after`, the oldest seq still stored."""
    found = await (await statements.driver(session)).fetchrow(_MISSED_LIFECYCLE)
    assert found is not None  # the counter row is made by the first migration
    return _oldest_missed(found, after)


# EXPIRE: retention, in batches (`$2` rows) so a large backlog never holds one long transaction; how many went. One
# statement for each table: `events` (its rows by `ctid`) and `lifecycle_events`.
def _expire(table: str, key: str) -> str:
    return f"""
    WITH gone AS (
        DELETE FROM {table} WHERE {key} IN (
            SELECT {key} FROM {table} WHERE created_at < now() - make_interval(secs => $1) LIMIT $2
        )
        RETURNING 1
    )
    SELECT count(*) FROM gone
"""  # noqa: S608 -- this module's table and column names


_EXPIRE = (_expire("events", "ctid"), _expire("lifecycle_events", "seq"))


async def expire(session: AsyncSession, age_seconds: float, batch: int = 10_000) -> int:
    """Delete one batch of thread and lifecycle events older than `age_seconds`; returns how many went."""
    driver = await statements.driver(session)
    gone = 0
    for statement in _EXPIRE:
        gone += int(await driver.fetchval(statement, float(age_seconds), batch))
    return gone

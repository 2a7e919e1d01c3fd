"""The durable per-thread queue: enqueue (+NOTIFY), the inbox's reads, release, revoke; the claim that takes a
thread's lease and the fence that proves it are `claims`'s, the lease's renewal `heartbeat`'s.

Every other query of the queue is here, named and commented, and so is every other write of `inbox`, `leases` and
the thread row's scheduling columns. Three of those writes ride in another module's statement, so that they cost no
statement of their own:

- `effects.claim_due` (`effects._CLAIM_DUE`, the effects timer): for each due effect, an `effect` inbox row
  (`inputs.Kind.EFFECT`, `{effect_id, name}`) and `runnable_since` set on its thread (kept if set), in the statement
  that marks the effects `queued`, then a NOTIFY on `WAKEUP_CHANNEL`. One statement, so an effect is never `queued`
  without its inbox row, nor its row there without the thread runnable. Those rows are read and removed here
  (`next_effect`, `drop`), never by `take_inbox`.
- `MARKED` and `RELEASING`, written here as `events.Rider`s and carried by the statement that writes a transaction's
  held events (`events.flush`): ENQUEUE's runnable mark and wake-up (`enqueue_alongside`), and RELEASE without a
  refund when the engine's fenced transaction ends a run (`release_with_events`).

Scheduling state lives on `threads`:
`runnable_since` (set while input waits or a run must go on), `lease_token` / `lease_owner` (who runs it: the
fencing token every engine transaction checks under the row lock) and `attempt` (claims of the current step); and on
`leases`: until when the token holds, by the database clock. The expiry is in a table of its own because the
heartbeat must renew it while an engine transaction holds the thread row: if the worker's event loop stalls inside
such a transaction (a CPU-bound tool of another thread), a renewal that needs the thread row would wait until the lease
ran out, and the stalled transaction would commit and start a tool while another worker claims the thread.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from app import claims, db, errors, event_types, events, inputs, statements, tables

WAKEUP_CHANNEL = "agents_wakeup"


@dataclass(frozen=True, slots=True)
class Input:
    """One inbox row as delivery reads it; delivery validates its payload (`inputs.read`), so a malformed one is set
    aside like any input whose delivery fails."""

    id: int
    kind: str
    payload: dict[str, Any]
    place: int | None = None  # a message's position in the history, when the look that took it reserved one


# ENQUEUE: the inbox row, the thread marked runnable (the oldest wait wins the claim order, so an existing timestamp
# is kept) and the wake-up (delivered at commit), in one statement.
_ENQUEUE = """
    WITH added AS (INSERT INTO inbox (thread_id, kind, payload) VALUES ($1, $2, CAST($3 AS jsonb)) RETURNING id),
    marked AS (
        UPDATE threads SET runnable_since = coalesce(runnable_since, now()) WHERE id = $1
        RETURNING pg_notify($4, '')
    )
    SELECT added.id FROM added, marked
"""


async def enqueue(session: AsyncSession, thread_id: uuid.UUID, kind: str, payload: dict[str, Any]) -> int:
    """Add input to a thread's inbox and mark it runnable; workers are woken at commit."""
    driver = await statements.driver(session)
    inbox_id: int = await driver.fetchval(_ENQUEUE, thread_id, kind, json.dumps(payload), WAKEUP_CHANNEL)
    return inbox_id


# INBOX_ADD: ENQUEUE's inbox row alone (`enqueue_alongside`), and MARKED its runnable mark and wake-up, in the
# statement that writes the transaction's held events.
_INBOX_ADD = "INSERT INTO inbox (thread_id, kind, payload) VALUES ($1, $2, CAST($3 AS jsonb))"
MARKED = events.Rider(
    sets="runnable_since = coalesce(runnable_since, now())",
    columns=("runnable_since",),
    args=(WAKEUP_CHANNEL,),
    select="pg_notify($7, '')",
)


async def enqueue_alongside(session: AsyncSession, thread_id: uuid.UUID, kind: str, payload: dict[str, Any]) -> None:
    """`enqueue` in a transaction that holds the thread's events (`POST /messages`): the row, the runnable mark and
    the wake-up go in the statement that writes the events (`statements.defer`, `events.add_rider`)."""
    if not events.add_rider(session, thread_id, MARKED):
        await enqueue(session, thread_id, kind, payload)
        return
    await statements.defer(session, _INBOX_ADD, [thread_id, kind, json.dumps(payload)])


# POST: `POST /messages` in one statement outside any transaction (no BEGIN, no COMMIT): the thread row locked if it
# is the caller's (`$2`, NULL for an admin), not terminated and not stopped (the lock returns its latest version, so
# these hold at commit); the inbox row; the row marked runnable and, if it was idle, `queued` with its `thread_status`
# event, announced as `events.flush` announces a batch (`$6`: the event itself, carried); the wake-up. When a check
# fails nothing is written and no row comes back.
_POST = """
    WITH t AS (
        SELECT id, status FROM threads
        WHERE id = $1 AND (CAST($2 AS text) IS NULL OR user_id = $2) AND terminated_at IS NULL AND NOT stopped
        FOR NO KEY UPDATE
    ),
    next AS (
        UPDATE threads SET
            event_seq = threads.event_seq + CASE WHEN t.status = 'idle' THEN 1 ELSE 0 END,
            status = CASE WHEN t.status = 'idle' THEN 'queued' ELSE threads.status END,
            updated_at = CASE WHEN t.status = 'idle' THEN now() ELSE threads.updated_at END,
            runnable_since = coalesce(threads.runnable_since, now())
        FROM t WHERE threads.id = t.id
        RETURNING threads.event_seq, t.status = 'idle' AS queued
    ),
    added AS (INSERT INTO inbox (thread_id, kind, payload) SELECT $1, $3, CAST($4 AS jsonb) FROM next),
    stored AS (
        INSERT INTO events (thread_id, seq, type, data)
        SELECT $1, next.event_seq, 'thread_status', CAST($7 AS jsonb) FROM next WHERE next.queued
    )
    SELECT next.queued, pg_notify($8, ''),
           CASE WHEN next.queued THEN pg_notify($5, CAST($1 AS text) || ':' || next.event_seq || $6) END
    FROM next
"""
_QUEUED = json.dumps(event_types.ThreadStatus(status="queued"))  # the `thread_status` event of a thread that was idle


async def post(driver: db.Driver, thread_id: uuid.UUID, user_id: str | None, payload: dict[str, Any]) -> bool:
    """Queue a message for a thread its caller may post to (`user_id`; None for an admin), in one atomic statement
    (`driver` in autocommit); False, with nothing written, when the thread is not found, not the caller's,
    terminated or stopped (the caller's general path says which, or resumes the stop)."""
    found = await driver.fetchrow(
        _POST,
        thread_id,
        user_id,
        inputs.Kind.MESSAGE,
        json.dumps(payload),
        events.CHANNEL,
        events.carried(["thread_status"], [_QUEUED]),
        _QUEUED,
        WAKEUP_CHANNEL,
    )
    return found is not None


# WAITING: what the thread's inbox holds right now, in one read: input to deliver, effects to run.
# WAITING: with the env values' version (`counters.env`, moved on by the commit of any write to them), read here and
# not by the fence: a statement that waited for the row lock reads on the snapshot it started with, and would miss a
# write the lock's holder committed just before this step.
_WAITING = """
    SELECT coalesce(bool_or(kind <> 'effect'), false) AS input, coalesce(bool_or(kind = 'effect'), false) AS effect,
           (SELECT value FROM counters WHERE name = 'env') AS env_version
    FROM inbox WHERE thread_id = $1 AND set_aside_at IS NULL
"""
ENV_VERSION = "queue.env_version"  # `session.info` key: the env values' version as `waiting` read it (`env.layers`)


async def waiting(session: AsyncSession, thread_id: uuid.UUID) -> tuple[bool, bool]:
    """Whether input, and whether effects, wait in the thread's inbox (set-aside rows do not count); the env values'
    version goes into `session.info` for `env.layers` (the engine asks at every step's opening). Deferred writes
    (`statements.defer`: a tool call's log row) ride with it, unless they write what it reads."""
    writes = riders(session)
    prefix = f"WITH {statements.ctes(writes, 2)} " if writes else ""
    driver = await statements.driver(session, flush=False, carries=bool(writes))
    row = await driver.fetchrow(prefix + _WAITING, thread_id, *[a for _, args in writes for a in args])
    assert row is not None
    return waited(session, row)


def riders(session: AsyncSession) -> list[tuple[str, list[Any]]]:
    """The deferred writes a read of the inbox may carry: all of them, or none when one writes what it reads."""
    return [] if statements.deferred_tables(session) & {"inbox", "counters"} else statements.deferred(session)


def waited(session: AsyncSession, row: Any) -> tuple[bool, bool]:
    """`waiting`'s answer from a row that has `WAITING`'s columns (`input`, `effect`, `env_version`)."""
    session.info[ENV_VERSION] = row["env_version"]
    return bool(row["input"]), bool(row["effect"])


WAITING = _WAITING  # for a statement that reads the inbox with something else (`changes.changed_and_waiting`)


# REVOKE: whatever lease the thread has, deleted in the transaction that stops, terminates or deletes it (`control`):
# the holder's next fenced commit finds no lease (`FENCE`), and its heartbeat reports it lost.
_REVOKE = "DELETE FROM leases WHERE thread_id = $1"


async def revoke(session: AsyncSession, thread: tables.Thread) -> uuid.UUID | None:
    """Take the thread's lease from whoever holds it, on the row the caller locked: not runnable, its claims counted
    from zero again. Returns the token revoked (it names the execution to cancel), if one held it."""
    revoked = thread.lease_token
    thread.lease_token = None
    thread.lease_owner = None
    await (await statements.driver(session)).execute(_REVOKE, thread.id)
    thread.attempt = 0
    thread.runnable_since = None
    return revoked


# CLEAR: all of the thread's inbox, set-aside rows included: a terminated thread runs nothing again.
_CLEAR = "DELETE FROM inbox WHERE thread_id = $1"


async def clear(session: AsyncSession, thread_id: uuid.UUID) -> None:
    """Drop everything waiting in the thread's inbox (`control.terminate`)."""
    await (await statements.driver(session)).execute(_CLEAR, thread_id)


# WITHDRAW: the thread's waiting messages that speak for these children (`metadata.subagent_id`, as `messages.enqueue`
# stores it): their reports and notes, never to be delivered.
_WITHDRAW = """
    DELETE FROM inbox
    WHERE thread_id = $1 AND kind = $2 AND payload -> 'metadata' ->> 'subagent_id' = ANY(CAST($3 AS text[]))
"""


async def withdraw(session: AsyncSession, thread_id: uuid.UUID, children: list[uuid.UUID]) -> None:
    """Drop the thread's waiting messages from these children."""
    args = (thread_id, inputs.Kind.MESSAGE, [str(c) for c in children])
    await (await statements.driver(session)).execute(_WITHDRAW, *args)


# TAKE_INBOX: the thread's waiting input, removed as it is read. Effect rows stay: each is removed by `drop` in the
# transaction that records its handler's end (`next_effect`).
_TAKE = "DELETE FROM inbox WHERE thread_id = $1 AND kind <> 'effect' AND set_aside_at IS NULL"
_TAKE_INBOX = f"{_TAKE} RETURNING id, kind, payload"


async def take_inbox(session: AsyncSession, thread_id: uuid.UUID) -> list[Input]:
    """Remove and return the thread's pending input in order (the caller holds the fenced row lock)."""
    rows = await (await statements.driver(session, flush=False)).fetch(_TAKE_INBOX, thread_id)
    return _inputs(rows)


def _inputs(rows: list[Any]) -> list[Input]:
    return sorted((Input(r["id"], r["kind"], r["payload"]) for r in rows), key=lambda r: r.id)


# WAITING AND TAKING: `WAITING` and, unless an effect waits (due effects run first, §10), `TAKE_INBOX`, as CTEs of
# one statement (`changes.changed_waiting_and_taking`): an execution's first look at the inbox, from a thread that
# will deliver what it finds. When it takes the row lock too (`fence`), it deletes nothing unless it took it: the
# inbox rows are locked after the thread row, as the API locks them. Each message taken gets a place in the history
# (`PLACES`: a position of the messages' own sequence, taken under the row lock, so before any the thread's later
# messages take): the message it becomes is written there, and the history holds it without reading it back.
WAITING_AND_TAKING = f"""
    waiting AS ({_WAITING}),
    taken AS ({_TAKE} AND NOT (SELECT effect FROM waiting){{locked}} RETURNING id, kind, payload),
    places AS (
        SELECT array_agg(nextval(pg_get_serial_sequence('messages', 'position'))) AS places
        FROM taken WHERE kind = 'message'
    )
"""  # noqa: S608 -- fixed fragments of this module


def taken(rows: list[Any]) -> list[Input]:
    """The input a first look took (`WAITING_AND_TAKING`; its columns `taken_id`, `taken_kind`, `taken_payload` and
    `places`), in order; each message with its place."""
    found = sorted(
        (Input(r["taken_id"], r["taken_kind"], r["taken_payload"]) for r in rows if r["taken_id"] is not None),
        key=lambda r: r.id,
    )
    places = iter(sorted(rows[0]["places"] or []))
    return [dataclasses.replace(r, place=next(places)) if r.kind == inputs.Kind.MESSAGE else r for r in found]


# TRACED: the trace contexts and queuing times of the oldest messages waiting for the thread (`tracing.carrier`)
_TRACED = """
    SELECT payload -> 'trace' AS trace, payload ->> 'queued_at' AS queued_at FROM inbox
    WHERE thread_id = $1 AND kind = 'message' AND set_aside_at IS NULL ORDER BY id LIMIT $2
"""


async def traced(session: AsyncSession, thread_id: uuid.UUID, limit: int = 8) -> list[tuple[Any, str | None]]:
    """The trace context each of the oldest waiting messages was posted in, and when it was queued, oldest first;
    asked only when traces are on."""
    rows = await (await statements.driver(session)).fetch(_TRACED, thread_id, limit)
    return [(json.loads(r["trace"]) if isinstance(r["trace"], str) else r["trace"], r["queued_at"]) for r in rows]


# SET_ASIDE: one input kept out of every later delivery, with the reason (poison input); SET_ASIDE_ALL: every input
# still waiting for the thread.
_SET_ASIDE = "UPDATE inbox SET set_aside_at = now(), error = $2 WHERE id = $1"
_SET_ASIDE_ALL = """
    UPDATE inbox SET set_aside_at = now(), error = $2 WHERE thread_id = $1 AND set_aside_at IS NULL RETURNING *
"""


async def set_aside(session: AsyncSession, inbox_id: int, error: str) -> None:
    """Keep an input whose delivery keeps failing out of every later delivery, with the reason (poison input)."""
    await (await statements.driver(session)).execute(_SET_ASIDE, inbox_id, error)


async def set_aside_all(session: AsyncSession, thread_id: uuid.UUID, error: str) -> list[tables.Inbox]:
    """Set aside every input still waiting for the thread (the crash budget ran out while delivering it)."""
    rows = await (await statements.driver(session)).fetch(_SET_ASIDE_ALL, thread_id, error)
    return sorted((_inbox(session, row) for row in rows), key=lambda r: r.id)


# NEXT_EFFECT: the thread's oldest effect row, left in place until its handler finished (`drop`).
_NEXT_EFFECT = """
    SELECT * FROM inbox WHERE thread_id = $1 AND kind = $2 AND set_aside_at IS NULL ORDER BY id LIMIT 1
"""


async def next_effect(session: AsyncSession, thread_id: uuid.UUID) -> tables.Inbox | None:
    """The thread's oldest effect inbox row, left in place until its handler finished."""
    found = await (await statements.driver(session)).fetchrow(_NEXT_EFFECT, thread_id, inputs.Kind.EFFECT)
    return None if found is None else _inbox(session, found)


_DROP = "DELETE FROM inbox WHERE id = $1"


async def drop(session: AsyncSession, inbox_id: int) -> None:
    """Remove one inbox row."""
    await (await statements.driver(session)).execute(_DROP, inbox_id)


# PENDING: the thread's undelivered input, set-aside rows included (they are shown as failed).
_PENDING = "SELECT * FROM inbox WHERE thread_id = $1 ORDER BY id"


async def pending(session: AsyncSession, thread_id: uuid.UUID) -> list[tables.Inbox]:
    """The thread's undelivered input, oldest first (set-aside rows included: they are shown as failed)."""
    return [_inbox(session, row) for row in await (await statements.driver(session)).fetch(_PENDING, thread_id)]


def _inbox(session: AsyncSession, row: asyncpg.Record) -> tables.Inbox:
    found: tables.Inbox = statements.attach(session, tables.Inbox, row)
    return found


# LOCK_HELD: the release's first statement. It waits for any writer holding the row (an enqueue marking it runnable)
# so that the next statement, which takes a fresh snapshot, sees that writer's inbox row. Deciding in one statement
# would use the snapshot from before the wait and could clear `runnable_since` over waiting input (a lost wake-up).
_LOCK_HELD = "SELECT 1 FROM threads WHERE id = $1 AND lease_token = $2 FOR NO KEY UPDATE"

# RELEASE: drop the lease; stay runnable only if input waits (set-aside rows do not count) or the run goes on (`$3`),
# and then wake a worker at commit; `$4` refunds the claim (`$6`: the attempt the row holds, if it changed it); the
# row's other changes (`sets`, from `$7`) in the same UPDATE.
_INPUT_WAITS = "EXISTS (SELECT 1 FROM inbox WHERE inbox.thread_id = threads.id AND inbox.set_aside_at IS NULL)"
_RELEASED = ("lease_token", "lease_owner", "attempt", "runnable_since")  # the columns the release itself sets


def _release(sets: str) -> str:
    return f"""
    WITH dropped AS (DELETE FROM leases WHERE thread_id = $1 AND token = $2)
    UPDATE threads SET lease_token = NULL, lease_owner = NULL,
           attempt = CASE WHEN $4 THEN greatest(coalesce(CAST($6 AS integer), attempt) - 1, 0) ELSE 0 END,
           runnable_since = CASE WHEN $3 OR {_INPUT_WAITS} THEN coalesce(runnable_since, now()) ELSE NULL END{sets}
    WHERE id = $1 AND lease_token = $2
    RETURNING runnable_since, attempt, CASE WHEN runnable_since IS NOT NULL THEN pg_notify($5, '') END
"""  # noqa: S608 -- `sets` is a SET list of mapped columns, its values parameters


# RELEASING: RELEASE without a refund or `again` (`$7` the lease token, `$8` the wake-up channel), in the statement
# that writes a fenced transaction's held events: the row lock its fence took keeps any new input's commit after this
# one, so the inbox is looked at in the same statement.
RELEASING = events.Rider(
    sets="lease_token = NULL, lease_owner = NULL, attempt = 0, "
    f"runnable_since = CASE WHEN {_INPUT_WAITS} THEN coalesce(runnable_since, now()) ELSE NULL END",
    columns=_RELEASED,
    where="lease_token = $7",
    then="dropped AS (DELETE FROM leases WHERE thread_id = $1 AND token = $7)",
    select="CASE WHEN next.runnable_since IS NOT NULL THEN pg_notify($8, '') END",
    final=True,
)


async def release(
    session: AsyncSession,
    claim: claims.Claim,
    *,
    again: bool = False,
    keep_attempt: bool = False,
    fenced: bool = False,
    row: tables.Thread | None = None,
) -> bool:
    """Give the thread back; `again` keeps it runnable, `keep_attempt` refunds this claim (graceful stop). `fenced`:
    this transaction locked the row already (`fence`), so the decision's statement is after the lock anyway. `row`:
    the thread's row as this transaction changed it; its changes go in the same statement.

    Returns whether the thread is still runnable (a worker is woken at commit if so).
    """
    claim.releasing = True
    driver = await statements.driver(session, flush=row is None)
    if not fenced and await driver.fetchrow(_LOCK_HELD, claim.thread_id, claim.token) is None:
        raise errors.LeaseLost()
    changes, attempt = None, None
    if row is not None:
        pending = sa_inspect(row).committed_state
        attempt = row.attempt if "attempt" in pending else None
        keys = tuple(sorted(k for k in pending if k not in _RELEASED))
        changes = statements.changes(row, keys, first=7) if keys else None
    sql = _release(f", {changes.sets}" if changes is not None else "")
    params = changes.params if changes is not None else []
    found = await driver.fetchrow(
        sql, claim.thread_id, claim.token, again, keep_attempt, WAKEUP_CHANNEL, attempt, *params
    )
    if found is None:
        raise errors.LeaseLost()
    if row is not None:
        if changes is not None:
            changes.written(session)
        released = {"lease_token": None, "lease_owner": None, **{k: found[k] for k in ("attempt", "runnable_since")}}
        for key, value in released.items():
            set_committed_value(row, key, value)
        statements.settle(session, row)
    return found["runnable_since"] is not None


async def release_with_events(session: AsyncSession, claim: claims.Claim, row: tables.Thread) -> None:
    """`release` (neither `again` nor a refund) in a fenced transaction: in the statement that writes its held events
    when it holds them (one round trip fewer; mark nothing runnable after this), else on its own, as it is when input
    deferred to that statement would escape its look at the inbox."""
    claim.releasing = True
    rider = dataclasses.replace(RELEASING, args=(claim.token, WAKEUP_CHANNEL))
    if "inbox" in statements.deferred_tables(session) or not events.add_rider(session, row.id, rider):
        await release(session, claim, fenced=True, row=row)


# STATE: the queue as it is now, in one statement (the metrics' gauges). Runnable: what CLAIM would take (work
# waiting and no live lease); in flight: live leases. Both read `threads_runnable` and the small `leases` and `inbox`
# tables only.
_STATE = """
    WITH runnable AS (
        SELECT t.runnable_since FROM threads t
        WHERE t.runnable_since IS NOT NULL
          AND t.terminated_at IS NULL AND NOT t.stopped AND t.status <> 'waiting'
          AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.thread_id = t.id AND l.expires_at >= now())
    )
    SELECT (SELECT count(*) FROM runnable) AS runnable,
           (SELECT coalesce(extract(epoch FROM now() - min(runnable_since)), 0) FROM runnable) AS oldest,
           (SELECT count(*) FROM leases WHERE expires_at >= now()) AS in_flight,
           (SELECT count(*) FROM inbox WHERE set_aside_at IS NULL) AS inbox,
           (SELECT count(*) FROM inbox WHERE set_aside_at IS NOT NULL) AS set_aside
"""


async def state(conn: db.Driver) -> dict[str, float]:
    """Runnable threads, the oldest one's wait in seconds, executions in flight, inbox rows waiting and set aside."""
    found = await conn.fetchrow(_STATE)
    assert found is not None
    return {key: float(value) for key, value in found.items()}


# STRANDED: threads holding input that nothing will ever run: not leased (or the lease expired), not runnable, and not
# parked on purpose (stopped, terminated, waiting on a blocking child). The release above makes this impossible; the
# janitor looks anyway, repairs what it finds and says so loudly. Candidates are locked first and checked again by a
# second statement, whose fresh snapshot sees whatever committed before the locks were taken (no false alarms).
_STRANDED_CANDIDATES = """
    SELECT t.id FROM threads t
    WHERE t.id IN (SELECT thread_id FROM inbox WHERE set_aside_at IS NULL)
      AND t.runnable_since IS NULL
    FOR NO KEY UPDATE OF t SKIP LOCKED
"""
_STRANDED = """
    UPDATE threads t SET runnable_since = now()
    WHERE t.id = ANY(CAST($1 AS uuid[]))
      AND t.runnable_since IS NULL
      AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.thread_id = t.id AND l.expires_at >= now())
      AND t.terminated_at IS NULL AND NOT t.stopped AND t.status <> 'waiting'
      AND EXISTS (SELECT 1 FROM inbox i WHERE i.thread_id = t.id AND i.set_aside_at IS NULL)
    RETURNING t.id
"""
_WAKE = "SELECT pg_notify($1, '')"


async def repair_stranded(session: AsyncSession) -> list[uuid.UUID]:
    """Make runnable any thread whose waiting input nothing would run; the ids repaired (expected: none)."""
    driver = await statements.driver(session)
    candidates = [r["id"] for r in await driver.fetch(_STRANDED_CANDIDATES)]
    if not candidates:
        return []
    ids = [r["id"] for r in await driver.fetch(_STRANDED, candidates)]
    if ids:
        await driver.execute(_WAKE, WAKEUP_CHANNEL)
    return ids

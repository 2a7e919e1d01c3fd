"""The hot path's statements in plain SQL on a session's own asyncpg connection (a `db.Driver`), writes deferred to
ride in the next statement, and ORM rows inserted, updated or attached without the ORM's own round trips."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, event
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, make_transient_to_detached
from sqlalchemy.orm.attributes import instance_state, set_committed_value
from sqlalchemy.util import await_only

from app import db


async def driver(session: AsyncSession, *, flush: bool = True, carries: bool = False) -> db.Driver:
    """The session's connection as a `Driver`, inside its transaction (begun here if no statement began it yet).
    Pending ORM changes are flushed first, as SQLAlchemy's own statements would (unless in `no_autoflush`);
    `flush=False` for a statement that neither reads nor writes what the ORM may hold back (an event, a new row).
    Deferred writes (`defer`) are sent first, unless the statement `carries` them itself (`deferred`).
    `Unsent` in a session that sends nothing before its last statement (`writes_only`)."""
    if _WRITES_ONLY in session.info:
        raise Unsent()
    if _FENCE in session.info:  # the transaction's first statement: the fence goes first
        await _fence(session)
    sync = session.sync_session
    if flush and sync.autoflush:
        await write(session)
    if not carries and _DEFERRED in session.info:
        writes = deferred(session)
        carrier = await driver(session, flush=False, carries=True)
        await carrier.execute(f"WITH {ctes(writes, 1)} SELECT 1", *[a for _, args in writes for a in args])
        return carrier
    held = session.info.get(_DRIVER)
    if held is not None and held[0] is sync.get_transaction():  # the same transaction: the same connection
        if sync.in_nested_transaction():
            await session.connection()  # SQLAlchemy emits a savepoint lazily: before this statement, not after
        found: db.Driver = held[1]
        return found
    connection = await session.connection()
    pooled = connection.sync_connection.connection  # type: ignore[union-attr]
    # SQLAlchemy's adapter begins the transaction at the first statement sent through it, and has no public way to
    # begin it without one: its own `_start_transaction` (one round trip, BEGIN), as that first statement would
    adapted: Any = pooled.dbapi_connection
    if adapted._transaction is None and adapted.isolation_level != "autocommit":
        try:
            await adapted._start_transaction()
        except Exception as error:  # SQLAlchemy's translation, not wrapped as its statements' errors are
            cause = error.__cause__
            if not isinstance(cause, db.DRIVER_ERRORS):
                raise
            translated = db.translated("BEGIN", cause)
            if translated.connection_invalidated:
                await connection.invalidate()  # not back into the pool: the next checkout would fail the same way
            raise translated from error
    raw = pooled.driver_connection
    assert raw is not None  # checked out: not invalidated
    found = db.Driver(raw)
    session.info[_DRIVER] = (sync.get_transaction(), found)
    return found


_DRIVER = "statements.driver"  # `session.info` key: (the transaction, its Driver)


# -- a fence sent with the transaction's first read ----------------------------------------------------------------
# An engine transaction locks the thread row first (`claims.fence`), then reads. When it starts from the row as the
# execution's last commit left it, the lock can ride in its first read instead (`fence_later`): that read takes it
# with SKIP LOCKED and only if the row is still that version (`take_fence` gives the caller the fence's CTE), so it
# never waits and never reads on a snapshot older than the lock — a writer that committed in between changed the row.
# Any other first statement (another read, a write, SQLAlchemy's own) sends the fence alone first, waiting for the
# lock as usual. Where the fence finds the row changed, locked or the lease gone, `Stale` is raised: the caller rolls
# the transaction back (whatever rode with the fence with it) and runs the work again in an ordinary one.

_FENCE = "statements.fence"  # `session.info` key: the `Fence` the transaction's first statement sends


@dataclass(frozen=True)
class Fence:
    """The lock a transaction takes first: `alone`, a statement returning a row if it holds; `cte`, the same as the
    CTE of another statement (selecting a row if it holds, never waiting), its parameters numbered from `$first`
    (`cte(first)`); `args`, the parameters of either."""

    alone: str
    cte: Callable[[int], str]
    args: tuple[Any, ...]


def fence_later(session: AsyncSession, fence: Fence) -> None:
    """Lock with the transaction's first statement (see above)."""
    session.info[_FENCE] = fence


def take_fence(session: AsyncSession) -> Fence | None:
    """The fence still to send, for a read that carries it as a CTE (and raises `Stale` when it selects nothing)."""
    fence: Fence | None = session.info.pop(_FENCE, None)
    return fence


async def _fence(session: AsyncSession) -> None:
    fence: Fence = session.info.pop(_FENCE)
    if await (await driver(session, flush=False, carries=True)).fetchrow(fence.alone, *fence.args) is None:
        raise Stale()


# -- sessions that write in one statement --------------------------------------------------------------------------
# A transaction that reads nothing and writes only what can ride in one statement (the thread row's changes, its
# events, deferred writes) needs no BEGIN, no lock taken first and no COMMIT: the statement is its own transaction.
# The engine runs such a transaction on a `writes_only` session, from the thread row as its last commit left it, and
# sends the statement guarded (`events.Guard`: the row unchanged since, the lease still held); anything that would
# send a statement before it (a read, a write that cannot be deferred) raises `Unsent` instead, and a guard that fails
# writes nothing and raises `Stale`: the caller then runs the same work as an ordinary transaction.

_WRITES_ONLY = "statements.writes_only"  # `session.info` key: the session sends no statement of its own


class Unsent(BaseException):
    """A statement was asked of a `writes_only` session: the work needs an ordinary transaction. Not an `Exception`:
    code that catches those (a hook's, a tool's) lets it through to the engine, as it lets a cancellation through."""


class Stale(BaseException):
    """A guarded statement found the row changed since it was read, or the lease gone: it wrote nothing. Not an
    `Exception`, as `Unsent`."""


def writes_only(session: AsyncSession) -> None:
    """From now on `session` sends no statement: it defers its writes (`defer`) for one statement sent elsewhere
    (`events.flush` with a guard); a read or a write that cannot wait raises `Unsent`."""
    session.info[_WRITES_ONLY] = True


def unwritten(session: AsyncSession, row: Any) -> bool:
    """Whether `session` holds changes that are neither deferred nor `row`'s own (which the guarded statement
    writes): new or deleted objects, or changed columns of another row."""
    sync = session.sync_session
    if sync.new or sync.deleted:
        return True
    return any(other is not row and sa_inspect(other).committed_state for other in sync.dirty)


# -- deferred writes ---------------------------------------------------------------------------------------------
# A write nothing reads back at once (a message's answer, a log row, an inbox row) can wait for the transaction's next
# statement and ride in it as a data-modifying CTE: `events.flush` writes the engine's held events that way, so such
# a write costs no round trip of its own. Any other statement sends what is deferred first, on its own: a plain one
# through `driver`, SQLAlchemy's through the session events below (a query, a flush, the commit), so whatever
# follows a deferred write sees it, and none is lost. All parts of one statement see one snapshot and a row can be
# changed only once in it, so the thread row (which the events statement updates) is never deferred, and a second
# write of a row already deferred sends the first one before it. And Postgres runs the data-modifying CTEs nothing
# refers to last first: two new messages in one statement would take their positions (an identity) and revisions in
# the reverse of the order they were written, so a second new message sends the first one before it too — unless
# the first was given its position (taken from the same sequence before, `queue.WAITING_AND_TAKING`): whatever
# runs first, it comes before the second. (Their revisions may then be in reverse: those only say what changed since
# a read, and both are newer than any read before the statement.)

_DEFERRED = "statements.deferred"  # `session.info` key: the writes deferred, in order, with the rows they target
_TARGET = re.compile(r"^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)", re.IGNORECASE)


async def defer(session: AsyncSession, sql: str, args: list[Any], row: Any = None) -> None:
    """Send the write `sql` (it returns nothing) with the transaction's next statement; `row` names the row it
    changes when it changes an existing one (an UPDATE's key). Inside a savepoint, and for the thread row, it is sent
    at once (a savepoint's end must find it written, or rolled back)."""
    table = writes_table(sql)
    held: list[tuple[str, list[Any], tuple[str, Any] | None]] = session.info.get(_DEFERRED, [])
    target = None if row is None else (table, row)
    follows = (target is not None and target in {t for *_, t in held}) or (
        table == "messages" and _inserts(sql) and any(_takes_position(s) for s, *_ in held)
    )  # it must be written after one already deferred
    if _WRITES_ONLY in session.info:
        if table == "threads" or follows:
            raise Unsent()
        session.info.setdefault(_DEFERRED, []).append((sql, args, target))
        return
    if _FENCE in session.info and not (table == "threads" or follows):  # no statement yet: its first carries them
        session.info.setdefault(_DEFERRED, []).append((sql, args, target))
        return
    carrier = await driver(session, flush=False, carries=True)  # the transaction is begun: never autocommit
    if session.in_nested_transaction() or table == "threads" or follows:
        await driver(session, flush=False)  # what was deferred before goes first
        await carrier.execute(sql, *args)
        return
    session.info.setdefault(_DEFERRED, []).append((sql, args, target))


def writes_table(sql: str) -> str:
    """The table a single-table write writes."""
    found = _TARGET.match(sql)
    if found is None:
        raise ValueError(f"not a single-table write: {sql[:60]!r}")
    return found.group(1).lower()


def _inserts(sql: str) -> bool:
    return sql.lstrip()[:6].upper() == "INSERT"


def _takes_position(sql: str) -> bool:
    """Whether `sql` inserts a message that takes its position from the sequence as it runs: one written at a place
    taken earlier (`insert_statement` names its `"position"`) holds it whenever it runs."""
    return writes_table(sql) == "messages" and _inserts(sql) and '"position"' not in sql.split(")", 1)[0]


def deferred(session: AsyncSession | Session) -> list[tuple[str, list[Any]]]:
    """Take the writes deferred on `session`, for a statement that carries them (`ctes`)."""
    return [(sql, args) for sql, args, _ in session.info.pop(_DEFERRED, [])]


def deferred_tables(session: AsyncSession) -> set[str]:
    """The tables the writes deferred on `session` write."""
    return {writes_table(sql) for sql, *_ in session.info.get(_DEFERRED, [])}


async def send_deferred(session: AsyncSession) -> None:
    """Send what is deferred now (before a savepoint: its rollback must not take them with it)."""
    if _DEFERRED in session.info:
        await driver(session, flush=False)


_CTES: dict[tuple[tuple[str, ...], int], str] = {}
_PARAMETER = re.compile(r"[$](\d+)")


def ctes(writes: list[tuple[str, list[Any]]], first: int) -> str:
    """`writes` as data-modifying CTEs (`w0 AS (...), w1 AS (...)`), their parameters numbered on from `first`;
    cached, as asyncpg caches the prepared statement by its text."""
    key = (tuple(w for w, _ in writes), first)
    found = _CTES.get(key)
    if found is None:
        parts, at = [], first
        for i, (write, args) in enumerate(writes):
            parts.append(f"w{i} AS ({renumbered(write, at - 1)})")
            at += len(args)
        found = _CTES[key] = ", ".join(parts)
    return found


def renumbered(sql: str, shift: int) -> str:
    """`sql` with its parameters numbered `shift` higher."""
    return _PARAMETER.sub(lambda m: f"${int(m.group(1)) + shift}", sql)


def _send_deferred(session: Session, *_: Any) -> None:
    """Before SQLAlchemy runs a statement, flushes or commits: what is deferred goes first (in the session's
    greenlet, so the connection is driven as SQLAlchemy drives it)."""
    if _DEFERRED not in session.info:
        return
    writes = deferred(session)
    conn = session.connection().connection.driver_connection
    assert conn is not None  # checked out: not invalidated
    sql = f"WITH {ctes(writes, 1)} SELECT 1"
    try:
        await_only(conn.execute(sql, *[a for _, args in writes for a in args]))
    except db.DRIVER_ERRORS as error:
        raise db.translated(sql, error) from error


def _on_execute(state: Any) -> None:
    _send_deferred(state.session)


def _refuse(session: Session, *_: Any) -> None:
    """No statement, flush or commit of SQLAlchemy's own in a `writes_only` session, nor before the fence went in one
    that sends it later (`fence_later`: a statement of SQLAlchemy's cannot carry it)."""
    if _WRITES_ONLY in session.info or _FENCE in session.info:
        raise Unsent()


event.listen(Session, "do_orm_execute", lambda state: _refuse(state.session))
event.listen(Session, "before_flush", _refuse)
event.listen(Session, "before_commit", _refuse)
event.listen(Session, "after_begin", _refuse)
event.listen(Session, "do_orm_execute", _on_execute)
event.listen(Session, "before_flush", _send_deferred)
event.listen(Session, "before_commit", _send_deferred)


def _ended(session: Session, transaction: Any) -> None:
    """The outermost transaction ended (a commit sent them; a rollback drops them): none is carried over into the
    session's next transaction. A savepoint's end leaves the enclosing transaction's alone. The driver held for it
    goes too: `info` holding the transaction, which holds the session, would make every session a reference cycle
    (~40 objects) that only the cyclic collector frees — under load, megabytes of garbage between full collections."""
    if transaction.parent is None:
        session.info.pop(_DEFERRED, None)
        session.info.pop(_DRIVER, None)


event.listen(Session, "after_transaction_end", _ended)


async def write(session: AsyncSession) -> None:
    """Write the session's pending ORM changes. Changed columns of loaded rows (the thread row of every engine
    transaction) go in one prepared UPDATE each, in primary key order as the unit of work would; anything else (new or
    deleted objects) through the unit of work."""
    sync = session.sync_session
    if sync.new or sync.deleted:
        await session.flush()
        return
    dirty = sync.dirty
    if not dirty:
        return
    changed: list[tuple[Any, tuple[str, ...]]] = []
    for row in dirty:
        state = sa_inspect(row)
        keys = tuple(sorted(state.committed_state))
        if keys:
            changed.append((row, keys))
        else:  # set to what it was: nothing to write
            _settled(session, state)
    changed.sort(key=lambda item: (type(item[0]).__name__, str(sa_inspect(item[0]).identity)))
    for row, keys in changed:
        await update(session, row, keys)


_INSERTS: dict[tuple[type, tuple[str, ...]], tuple[str, str, list[tuple[str, bool]], list[tuple[str, str]]]] = {}


def _insert_of(cls: type, given: tuple[str, ...]) -> tuple[str, str, list[tuple[str, bool]], list[tuple[str, str]]]:
    """The INSERT of a mapped class's `given` attributes, and its RETURNING clause of every other column (its server
    defaults); with each given attribute and whether it is JSON (sent as text, as SQLAlchemy sends it), and what is
    read back."""
    mapper: Any = sa_inspect(cls)
    columns = {a.key: a.columns[0] for a in mapper.column_attrs}
    params = [(key, isinstance(columns[key].type, JSON)) for key in given]
    back = [(key, column.name) for key, column in columns.items() if key not in given]
    names = ", ".join(f'"{columns[key].name}"' for key in given)
    values = ", ".join(f"CAST(${i} AS jsonb)" if is_json else f"${i}" for i, (_, is_json) in enumerate(params, 1))
    returning = " RETURNING " + ", ".join(f'"{name}"' for _, name in back) if back else ""
    sql = f"INSERT INTO {mapper.local_table.name} ({names}) VALUES ({values})"  # noqa: S608 -- names of the mapped table
    return sql, returning, params, back


def _shape(row: Any) -> tuple[str, str, list[tuple[str, bool]], list[tuple[str, str]]]:
    cls = type(row)
    given = tuple(sorted(key for key in row.__dict__ if not key.startswith("_")))
    shape = _INSERTS.get((cls, given))
    if shape is None:
        shape = _INSERTS[(cls, given)] = _insert_of(cls, given)
    return shape


async def insert(session: AsyncSession, row: Any) -> None:
    """Insert a new ORM object in one prepared statement and add it to `session` as persistent, its server defaults
    read back: what `session.add` + `flush` does, without the unit of work (several times the round trip's cost)."""
    sql, returning, params, back = _shape(row)
    values = [json.dumps(row.__dict__[key]) if json_ else row.__dict__[key] for key, json_ in params]
    found = await (await driver(session, flush=False)).fetchrow(sql + returning, *values)
    for key, name in back:
        assert found is not None
        set_committed_value(row, key, found[name])
    make_transient_to_detached(row)
    session.add(row)


def attach_new(session: AsyncSession, row: Any) -> None:
    """A new ORM object whose INSERT was sent elsewhere (`insert_statement`, `defer`), added to `session` as
    persistent: what it was given is loaded, its server defaults are not (reading one would need a query)."""
    make_transient_to_detached(row)
    session.add(row)


def insert_statement(row: Any) -> tuple[str, list[Any]]:
    """The INSERT of a new ORM object (nothing read back) and its parameters, for a caller that sends it with other
    statements (`defer`); the object itself stays out of any session."""
    sql, _, params, _ = _shape(row)
    return sql, [json.dumps(row.__dict__[key]) if json_ else row.__dict__[key] for key, json_ in params]


@dataclass(frozen=True)
class Changes:
    """Columns of a persistent ORM object to write: `sets` is the SET list (its values from `$first` on, in the
    order of `params`), for an UPDATE of the caller's; `written` then records them as committed."""

    row: Any
    keys: tuple[str, ...]
    values: list[Any]  # the attributes' values, as the row holds them
    params: list[Any]  # the same, as sent (JSON as text)
    sets: str

    def written(self, session: AsyncSession) -> None:
        for key, value in zip(self.keys, self.values, strict=True):
            set_committed_value(self.row, key, value)
        _settled(session, sa_inspect(self.row))


_SETS: dict[tuple[type, tuple[str, ...], int], tuple[str, list[bool]]] = {}


def _sets_of(cls: type, keys: tuple[str, ...], first: int) -> tuple[str, list[bool]]:
    """The SET list of a mapped class's `keys` attributes, parameters numbered from `first`, and which are JSON."""
    mapper: Any = sa_inspect(cls)
    columns = {a.key: a.columns[0] for a in mapper.column_attrs}
    json_ = [isinstance(columns[key].type, JSON) for key in keys]
    sets = ", ".join(
        f'"{columns[key].name}" = ' + (f"CAST(${i} AS jsonb)" if is_json else f"${i}")
        for i, (key, is_json) in enumerate(zip(keys, json_, strict=True), first)
    )
    return sets, json_


def changes(row: Any, keys: tuple[str, ...] | None = None, first: int = 2) -> Changes | None:
    """The given columns of `row`, or all it changed since loaded (None if none), as a SET list from `$first`."""
    if keys is None:
        keys = tuple(sorted(sa_inspect(row).committed_state))
        if not keys:
            return None
    shape = _SETS.get((type(row), keys, first))
    if shape is None:
        shape = _SETS[(type(row), keys, first)] = _sets_of(type(row), keys, first)
    sets, json_ = shape
    values = [getattr(row, key) for key in keys]
    params = [json.dumps(v) if is_json else v for v, is_json in zip(values, json_, strict=True)]
    return Changes(row, keys, values, params, sets)


async def update(session: AsyncSession, row: Any, keys: tuple[str, ...], *, later: bool = False) -> None:
    """Write the `keys` attributes of a persistent ORM object in one prepared statement, as committed values (the
    unit of work will not write them again); `later`: with the transaction's next statement (`defer`)."""
    found = changes(row, keys)
    assert found is not None
    mapper: Any = sa_inspect(type(row))
    (primary,) = mapper.primary_key
    sql = f'UPDATE {mapper.local_table.name} SET {found.sets} WHERE "{primary.name}" = $1'  # noqa: S608 -- mapped names
    args = [sa_inspect(row).identity[0], *found.params]
    if later:
        await defer(session, sql, args, row=args[0])
    else:
        await (await driver(session, flush=False)).execute(sql, *args)
    found.written(session)


def settle(session: AsyncSession, row: Any) -> None:
    """Mark `row` unmodified if every change it holds was written (its columns set as committed)."""
    _settled(session, sa_inspect(row))


def _settled(session: AsyncSession, state: Any) -> None:
    """Mark a row whose changes are all written as unmodified: the unit of work would otherwise still visit it at
    the next flush (every commit flushes) to find nothing to write. Not inside a savepoint: one that rolls back
    expires the rows it modified, and this one must be among them (its values would outlive the rollback)."""
    if state.modified and not state.committed_state and not session.in_nested_transaction():
        state._commit_all(state.dict, session.sync_session.identity_map)


_COLUMNS: dict[type, tuple[Any, list[tuple[str, str]], list[str]]] = {}


def _columns_of(cls: type) -> tuple[Any, list[tuple[str, str]], list[str]]:
    """A mapped class's mapper, its (attribute, column name) pairs and its primary key's column names."""
    found = _COLUMNS.get(cls)
    if found is None:
        mapper: Any = sa_inspect(cls)
        pairs = [(a.key, a.columns[0].name) for a in mapper.column_attrs]
        found = _COLUMNS[cls] = (mapper, pairs, [c.name for c in mapper.primary_key])
    return found


def record(row: Any) -> dict[str, Any]:
    """A persistent ORM object's columns as `attach` takes them back (by column name)."""
    _, pairs, _ = _columns_of(type(row))
    return {name: row.__dict__[attr] for attr, name in pairs}


def attach(session: AsyncSession, cls: type, record: Any) -> Any:
    """A row read in plain SQL (a record of all its columns), as a persistent ORM object of `session`: what an ORM
    query returns, without its result processing."""
    mapper, pairs, primary = _columns_of(cls)
    key = mapper.identity_key_from_primary_key([record[name] for name in primary])
    held = session.sync_session.identity_map.get(key)
    if held is not None:  # over what the session holds, as `populate_existing` would
        for attr, name in pairs:
            set_committed_value(held, attr, record[name])
        _settled(session, instance_state(held))
        return held
    row = mapper.class_manager.new_instance()
    instance_state(row).dict.update({attr: record[name] for attr, name in pairs})  # loaded as the ORM loads a row
    make_transient_to_detached(row)
    session.add(row)
    return row

"""An execution's transactions on its thread row: one at a time, each fenced by the lease, and as few round trips as
the work allows.

Every transaction of an execution locks the thread row first and is conditioned on the claim's lease token
(`claims.fence`): BEGIN, the fence, the work, its events with the row's changes in one statement, COMMIT. Locking the
row first keeps one lock order with the API (which locks the row, then what it changes), so they never deadlock.

When the row is as the execution's last commit (or its claim) left it, the lock rides in the transaction's first
read instead (`statements.fence_later`): taken without waiting, and only on that version of the row; where it is
not taken, everything rolls back and the same work runs with the fence first.

A step's answer needs none of that: it reads nothing, and everything it writes (the message's answer, its log row,
the events, the row's changes, the close of the turn and the release) rides in the events' statement already. The row
is usually as the execution's last commit left it (nobody else writes it while the lease holds, except to post input,
stop, edit or delete), and that can be checked in that same statement: `written` sends it alone, outside any
transaction, guarded by the row's version (`xmin`, as the last commit left it) and by the lease (`claims.guard`), and
the statement's first act is to lock the row. Where the guard fails nothing is written and the same work runs again,
fenced. Work that turns out to need a read or a write that cannot ride raises `statements.Unsent` before anything is
sent, and runs fenced too.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import claims, db, errors, events, messages, statements, tables
from app.engine.history import Histories
from app.engine.tally import Tallies, Tally
from app.metrics import Meter

log = logging.getLogger("app.engine.run")  # its lines are the step loop's (`turn ended:`)

T = TypeVar("T")
Work = Callable[[AsyncSession, tables.Thread], Awaitable[T]]


@dataclass(frozen=True)
class Held:
    """The thread row as an execution's last commit left it: its columns, and its version (`xmin`)."""

    record: dict[str, Any]
    xmin: int


@dataclass(frozen=True)
class Said:
    """A turn's line, said once the transaction that ends the turn commits; its tally, kept again if it does not."""

    thread_id: uuid.UUID
    tally: Tally
    line: str


class Transactions:
    """The transactions of the executions one engine runs, by lease token."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        histories: Histories,
        tallies: Tallies,
        meter: Meter | None = None,
    ) -> None:
        self._sessions = sessions
        self._histories = histories
        self._tallies = tallies
        self._meter = meter  # counts the transactions run again fenced
        self._turns: dict[uuid.UUID, asyncio.Lock] = {}  # an execution's transactions take turns
        self._said: dict[uuid.UUID, list[Said]] = {}  # lines said once committed
        self._held: dict[uuid.UUID, Held] = {}  # the row as the last commit left it

    def begin(self, claim: claims.Claim) -> None:
        """An execution starts: its first transaction starts from the row as the claim left it, when the claim read
        it (`claims.claim_many`)."""
        if claim.row is not None and claim.xmin is not None:
            self._held[claim.token] = Held(claim.row, claim.xmin)

    def end(self, claim: claims.Claim) -> None:
        """An execution ended: forget it."""
        self._turns.pop(claim.token, None)
        self._said.pop(claim.token, None)
        self._held.pop(claim.token, None)

    def say(self, thread: tables.Thread, line: Callable[[Tally], str]) -> None:
        """The thread's turn ends with the transaction: its tally's `line`, said once that commits."""
        assert thread.lease_token is not None
        tally = self._tallies.end(thread.id)
        self._said.setdefault(thread.lease_token, []).append(Said(thread.id, tally, line(tally)))

    def _lock(self, claim: claims.Claim) -> asyncio.Lock:
        """One transaction at a time per execution: each locks the thread row, so a second one (the calls of one
        answer run at once) could only wait for the first while it held a connection of the pool; it waits here
        instead, holding nothing."""
        return self._turns.setdefault(claim.token, asyncio.Lock())

    @asynccontextmanager
    async def fenced(self, claim: claims.Claim) -> AsyncIterator[tuple[AsyncSession, tables.Thread]]:
        """A transaction on the thread row, fenced by the claim's lease token (`LeaseLost` if it no longer holds)."""
        async with self._lock(claim), self._fenced(claim) as found:
            yield found

    @asynccontextmanager
    async def _fenced(self, claim: claims.Claim) -> AsyncIterator[tuple[AsyncSession, tables.Thread]]:
        self._held.pop(claim.token, None)
        try:
            async with self._sessions() as session, session.begin():
                thread = await claims.fence(session, claim)
                events.hold(session, thread.id)  # the row is locked: its events go in one statement at the end
                yield session, thread
                xmin = await events.flush(session, thread)  # with the thread row's changes, in one statement
                await statements.write(session)  # anything else (the thread row's changes when no event was held)
        except BaseException as exc:
            self._not_committed(claim, exc)
        self._committed(claim, thread, xmin)

    async def written(self, claim: claims.Claim, work: Work[T], *, reads: bool, once: bool = False) -> T:
        """`work` in a transaction on the thread row. When the row is as this execution's last commit left it: if
        `work` `reads` nothing, as one statement outside any transaction (`statements.writes_only`), checked where it
        writes the row (`events.Guard`); if it reads, with the row's lock riding in its first statement
        (`statements.fence_later`). `work` may then run twice: again fenced, when that statement wrote nothing or that
        lock was not taken (the row changed meanwhile, the lease is gone, or the work needed more than one statement
        after all) — unless it must run `once` (user hooks run in it before it reads): fenced from the start."""
        async with self._lock(claim):
            held = self._held.pop(claim.token, None)
            if held is not None and not once:
                try:
                    if reads:
                        return await self._fenced_later(claim, held, work)
                    return await self._in_one_statement(claim, held, work)
                except (statements.Unsent, statements.Stale) as exc:
                    # nothing was written; what it changed in memory (the answer in the pending message) the fenced
                    # run writes again, and the history's next read takes whatever changed meanwhile
                    self._unsay(claim.token)
                    self._histories.settle(claim.thread_id, committed=False)
                    if self._meter is not None:
                        how, why = "in_read" if reads else "one_statement", type(exc).__name__.lower()
                        self._meter.transactions_rerun.labels(how, why).inc()
            async with self._fenced(claim) as (session, thread):
                return await work(session, thread)

    async def _fenced_later(self, claim: claims.Claim, held: Held, work: Work[T]) -> T:
        """`work` in a transaction from the held row whose lock rides in its first statement
        (`statements.fence_later`): `Stale`, everything rolled back, if the row changed since, another holds its
        lock or the lease is gone; `Unsent` if a statement of SQLAlchemy's came first."""
        try:
            async with self._sessions() as session, session.begin():
                statements.fence_later(session, claims.fence_later(claim, held.xmin))
                thread: tables.Thread = statements.attach(session, tables.Thread, held.record)
                events.hold(session, thread.id)
                done = await work(session, thread)
                xmin = await events.flush(session, thread)
                await statements.write(session)
        except (statements.Unsent, statements.Stale):
            raise  # read nothing into the history: what it holds stays
        except BaseException as exc:
            self._not_committed(claim, exc)
        self._committed(claim, thread, xmin)
        return done

    async def _in_one_statement(self, claim: claims.Claim, held: Held, work: Work[T]) -> T:
        """`work` on a `writes_only` session from the held row, its writes sent in one guarded statement (`Stale`
        if the row changed since or the lease is gone, `Unsent` if the work needed more than one statement)."""
        try:
            async with self._sessions() as session:
                statements.writes_only(session)
                thread: tables.Thread = statements.attach(session, tables.Thread, held.record)
                events.hold(session, thread.id)
                done = await work(session, thread)
                if statements.unwritten(session, thread):
                    raise statements.Unsent()
                async with db.alone(self._sessions) as driver:
                    xmin = await events.flush(session, thread, guard=claims.guard(driver, claim, held.xmin))
        except (statements.Unsent, statements.Stale):
            raise
        except BaseException as exc:
            self._not_committed(claim, exc)
        self._committed(claim, thread, xmin)
        return done

    async def partial(self, claim: claims.Claim, message_id: uuid.UUID, text: str) -> None:
        """A streaming message's text so far into its row (clients that reconnect read it there): one statement
        outside any transaction, conditioned on the lease and on the message still `pending`. It locks the message
        row alone, writes no event and leaves the thread row (and the version `written` checks) as it was; a stop
        that failed the message meanwhile, or a lease gone, makes it write nothing."""
        try:
            async with db.alone(self._sessions) as driver:
                await driver.execute(messages.PARTIAL, claim.thread_id, message_id, text, claim.token)
        except (DBAPIError, OSError) as exc:
            if errors.Unavailable.of(exc):
                raise errors.Unavailable() from exc
            raise

    def _committed(self, claim: claims.Claim, thread: tables.Thread, xmin: int | None) -> None:
        """A transaction committed: the lines of the turns it ended; the row as it left it, while the lease holds."""
        if xmin is not None and thread.lease_token == claim.token:
            self._held[claim.token] = Held(statements.record(thread), xmin)
        self._histories.settle(claim.thread_id, committed=True)
        for said in self._said.pop(claim.token, ()):  # the turns it ended did end
            log.info("%s", said.line)

    def _not_committed(self, claim: claims.Claim, exc: BaseException) -> NoReturn:
        """A transaction rolled back with `exc`: forget what it did, and raise `exc` (a lock cycle or the database
        gone as the engine's own errors)."""
        self._histories.drop(claim.thread_id)  # what it read may hold writes that were just rolled back
        self._unsay(claim.token)
        if isinstance(exc, DBAPIError | OSError) and errors.Contention.of(exc):
            raise errors.Contention() from exc
        if isinstance(exc, DBAPIError | OSError) and errors.Unavailable.of(exc):
            raise errors.Unavailable() from exc
        raise exc

    def _unsay(self, token: uuid.UUID) -> None:
        """The turns a transaction ended did not end: their tallies go on."""
        for said in self._said.pop(token, ()):
            self._tallies.reopen(said.thread_id, said.tally)

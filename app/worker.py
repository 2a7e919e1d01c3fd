"""The worker: claims runnable threads into a bounded set of slots and drives the engine on each.

Wake-up policy: a NOTIFY on the wake-up channel, the poll interval, or a slot freeing up — whichever comes first.
Leases are renewed by `app.heartbeat` on an OS thread and connection of its own; a lease that is lost cancels the
execution that held it, and so does a NOTIFY on the control channel (a stop or terminate revoked the lease). An
effects timer moves due effects into their threads' inboxes every poll interval. The database going away (a restart)
is waited out: claims pause, the listener reconnects, executions it interrupted are redone from what is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

import asyncpg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import blobs, claims, control, db, effects, errors, heap, liveness, queue, retention
from app.engine.run import Engine
from app.heartbeat import Heartbeat
from app.llm import waiting
from app.settings import Settings

log = logging.getLogger(__name__)

EFFECTS_BATCH = 100  # due effects queued per transaction
TRIM_SECONDS = 10.0  # how often the C heap's free memory goes back to the system (`app.heap`)


class Worker:
    """A pool of `worker_concurrency` concurrent thread executions in this process, `worker_active` of them at work
    at once: an execution waiting on its model gives its place up (`app.llm.waiting`)."""

    def __init__(self, settings: Settings, sessions: async_sessionmaker[AsyncSession], engine: Engine) -> None:
        self._settings = settings
        self._sessions = sessions
        self._engine = engine
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._running: dict[uuid.UUID, tuple[claims.Claim, asyncio.Task[None]]] = {}
        self._active = asyncio.Semaphore(settings.worker_active)  # executions at work, not waiting on a model
        self._wake = asyncio.Event()
        self._notices = 0  # wake-up notifications heard so far
        self._more = True  # whether something may be runnable that the last claim left (a full worker, a notice)

    @property
    def active(self) -> int:
        return len(self._running)

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and execute until `stop` is set; then cancel what runs and hand its leases back."""
        assert self._settings.database_url is not None
        heartbeat = Heartbeat(
            self._settings.database_url,
            self._settings.pooled,
            self._settings.lease_seconds,
            self._settings.watchdog_seconds,
            lambda: [c for c, _ in tuple(self._running.values())],
            self._cancel_lost,
        )
        heartbeat.start()
        listener: asyncpg.Connection | None = None
        claimer: asyncpg.Connection | None = None
        janitor = asyncio.create_task(self._janitor(stop), name="janitor")
        repairs = asyncio.create_task(self._repairs(stop), name="stranded-check")
        timer = asyncio.create_task(self._effects_timer(stop), name="effects-timer")
        flusher = asyncio.create_task(self._metrics(stop), name="metrics-flush")
        trimmer = asyncio.create_task(self._trimming(stop), name="heap-trim")
        path = self._settings.worker_heartbeat_file
        pulse = liveness.Pulse(path, self.owner, self._settings.poll_interval) if path else None
        log.info(
            "worker %s started with %d slots, %d at work at once (the others waiting on a model)",
            self.owner, self._settings.worker_concurrency, self._settings.worker_active,
        )  # fmt: skip
        try:
            while not stop.is_set():
                self._wake.clear()
                reached = False
                try:
                    listener = await self._listening(listener)
                    claimer = await self._claiming(claimer)
                    await self._fill(claimer)
                    reached = True
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, DBAPIError) as exc:
                    log.warning("cannot reach the database (%s); trying again", type(exc).__name__)
                except asyncpg.InternalClientError as exc:  # a connection a restart left mid-statement: open anew
                    log.warning("a queue connection broke (%s); opening new ones", exc)
                    for conn in (listener, claimer):
                        if conn is not None:
                            conn.terminate()
                if pulse is not None:
                    pulse.beat(reached)  # the loop goes round: `agents health worker` reads it
                if not await self._sleep(stop):
                    self._more = True  # the poll: leases that expired, a notification lost with its connection
        finally:
            if pulse is not None:
                pulse.remove()
            janitor.cancel()
            repairs.cancel()
            timer.cancel()
            flusher.cancel()
            trimmer.cancel()
            await self._drain()
            await heartbeat.stop()
            await self._flush()  # what this process counted since the last flush
            for conn in (listener, claimer):
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=1)
            log.info("worker %s stopped", self.owner)

    async def _listening(self, listener: asyncpg.Connection | None) -> asyncpg.Connection:
        """The LISTEN connection, opened again if the database dropped it (a notification lost meanwhile costs at
        most one poll interval)."""
        if listener is not None and not listener.is_closed():
            return listener
        assert self._settings.session_url is not None
        if listener is not None:
            log.info("listener connection lost; reconnecting")
        conn = await db.connect(self._settings.session_url, connect_timeout=10)  # LISTEN: never through a pooler
        await conn.add_listener(queue.WAKEUP_CHANNEL, lambda *_: self._notified())
        await conn.add_listener(control.CONTROL_CHANNEL, lambda *args: self._abandon(args[3]))
        return conn

    async def _claiming(self, claimer: asyncpg.Connection | None) -> asyncpg.Connection:
        """The connection claims run on (each is one statement, outside any transaction, so a pooler in transaction
        mode may carry it), opened again if lost."""
        if claimer is not None and not claimer.is_closed():
            return claimer
        assert self._settings.database_url is not None
        return await db.connect(self._settings.database_url, connect_timeout=10, pooled=self._settings.pooled)

    def _notified(self) -> None:
        self._notices += 1
        self._more = True
        self._wake.set()

    async def _fill(self, claimer: asyncpg.Connection) -> None:
        """Claim runnable threads, as many as there are free slots in one statement, until the slots are full or
        nothing is runnable; a claim that finds fewer than it asked for leaves nothing behind, unless a notification
        came meanwhile (then the next round claims again)."""
        while self._more and (free := self._settings.worker_concurrency - len(self._running)) > 0:
            heard = self._notices
            taken = await claims.claim_many(
                claimer, self.owner, self._settings.lease_seconds, list(self._running), free
            )
            for claim in taken:
                task = asyncio.create_task(self._execute(claim), name=f"thread-{claim.thread_id}")
                self._running[claim.thread_id] = (claim, task)
            if len(taken) < free:
                self._more = self._notices != heard

    async def _execute(self, claim: claims.Claim) -> None:
        heard = self._notices
        slot = waiting.Slot(self._active)
        waiting.current.set(slot)  # this task's context: its model calls give the slot up while they wait
        try:
            await slot.take()
            await self._engine.execute(claim)
        except (Exception, errors.Aborted):
            log.exception("execution of thread %s ended abnormally; its lease will expire", claim.thread_id)
        finally:
            slot.release()
            if self._running.get(claim.thread_id, (None,))[0] == claim:
                del self._running[claim.thread_id]
            # a notice while it ran may be its own release (runnable again), which any claim made meanwhile skipped
            # as still running: claim again
            if self._notices != heard:
                self._more = True
            if self._more:
                self._wake.set()  # a slot is free, and something may be waiting for one

    async def _sleep(self, stop: asyncio.Event) -> bool:
        """Until woken, stopped or the poll interval passed; whether it was woken (or stopped) before that."""
        waiters = [asyncio.create_task(self._wake.wait()), asyncio.create_task(stop.wait())]
        try:
            await asyncio.wait(waiters, timeout=self._settings.poll_interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        return self._wake.is_set() or stop.is_set()

    async def _janitor(self, stop: asyncio.Event) -> None:
        """Apply the retention rules (`app/retention.py`) and collect unreferenced file content now and then; any
        worker may do it (deletes are idempotent)."""
        while not stop.is_set():
            for rule in retention.rules(self._settings):
                try:
                    gone = await retention.sweep(self._sessions, rule)
                except Exception:
                    log.exception("the %s retention sweep failed; trying again later", rule.what)
                    continue
                self._engine.meter.janitor_deleted.labels(rule.what).inc(gone)
            try:
                async with self._sessions() as session, session.begin():
                    collected = await blobs.collect(session, self._settings.blob_grace_seconds)
                self._engine.meter.janitor_deleted.labels("blobs").inc(collected)
                if collected:
                    log.info("collected %d unreferenced blobs", collected)
            except Exception:
                log.exception("cleanup sweep failed; trying again later")
            await asyncio.sleep(self._settings.cleanup_interval)

    async def _repairs(self, stop: asyncio.Event) -> None:
        """Look for threads whose waiting input nothing would run (see `queue.repair_stranded`); it should never find
        one, so each find is a warning and is counted (`janitor_repairs`)."""
        while not stop.is_set():
            await asyncio.sleep(self._settings.lease_seconds)
            try:
                async with self._sessions() as session, session.begin():
                    repaired = await queue.repair_stranded(session)
            except Exception:
                log.exception("the stranded-input check failed; trying again later")
                continue
            for thread_id in repaired:
                self._engine.meter.janitor_repairs.labels("stranded_input").inc()
                log.warning("thread %s held input but was neither leased nor runnable: made runnable", thread_id)

    async def _effects_timer(self, stop: asyncio.Event) -> None:
        """Queue due effects into their threads' inboxes; every worker runs one (`SKIP LOCKED` gives each row to
        exactly one), and the rows are durable, so a restart loses nothing."""
        while not stop.is_set():
            try:
                while True:  # a transaction, not autocommit: cut off mid-statement (a stop), it is rolled back and
                    # its connection closed, where an autocommit one would go back to the pool still busy
                    async with self._sessions() as session, session.begin():
                        if await effects.claim_due(session, EFFECTS_BATCH) < EFFECTS_BATCH:
                            break
            except Exception:
                log.exception("queueing due effects failed; trying again at the next poll")
            await asyncio.sleep(self._settings.poll_interval)

    async def _metrics(self, stop: asyncio.Event) -> None:
        """Add this process's counts to the database's totals every `metrics_flush_seconds` (`app/metrics.py`)."""
        while not stop.is_set():
            await asyncio.sleep(self._settings.metrics_flush_seconds)
            await self._flush()

    async def _trimming(self, stop: asyncio.Event, every: float = TRIM_SECONDS) -> None:
        """Hand the C heap's free memory back every `every` seconds, on a thread (`app.heap`): a worker's RSS stays
        at what it holds instead of creeping with what it once held."""
        if not heap.supported():
            log.info("the C library has no malloc_trim: this worker's freed heap pages stay with it")
            return
        while not stop.is_set():
            await asyncio.sleep(every)
            await asyncio.to_thread(heap.trim)

    async def _flush(self) -> None:
        try:
            await self._engine.meter.flush(self._sessions)
        except Exception as exc:  # the database is away (a restart): the counts wait for the next flush
            log.warning("could not add this worker's counts to the metrics (%s); kept for the next flush", exc)

    def _cancel_lost(self, lost: set[tuple[uuid.UUID, uuid.UUID]]) -> None:
        """The heartbeat found these leases gone: the executions that held them must stop at once and write nothing.
        A thread released and claimed again since the heartbeat read its claims runs under a new token, and one whose
        execution is giving it back released it itself (its commit came between the heartbeat's read of the claims
        and its statement; cancelled, the execution lost what it does once committed): both are left alone. An
        execution whose release then fails ends anyway, and every write it tries is fenced."""
        for thread_id, token in lost:
            entry = self._running.get(thread_id)
            if entry is not None and entry[0].token == token and not entry[0].releasing:
                self._engine.meter.lease_losses.inc()
                log.warning("lease of thread %s lost; cancelling its execution", thread_id)
                entry[1].cancel()

    def _abandon(self, payload: str) -> None:
        """A stop or terminate took this thread's lease (`thread_id:token`): cancel its in-flight call now, not at the
        next heartbeat — if this worker still runs it under that token."""
        thread_id, _, token = payload.partition(":")
        try:
            entry = self._running.get(uuid.UUID(thread_id))
            revoked = uuid.UUID(token)
        except ValueError:
            return
        if entry is not None and entry[0].token == revoked:
            log.info("thread %s was stopped or terminated; cancelling its execution", thread_id)
            entry[1].cancel()

    async def _drain(self) -> None:
        """Cancel running executions and give their leases back without spending their attempt."""
        entries = list(self._running.values())
        for _, task in entries:
            task.cancel()
        await asyncio.gather(*(t for _, t in entries), return_exceptions=True)
        for claim, _ in entries:
            try:
                async with self._sessions() as session, session.begin():
                    await queue.release(session, claim, again=True, keep_attempt=True)
            except errors.LeaseLost:  # the execution ended (and released) before it was cancelled
                pass
            except (Exception, errors.Aborted):
                log.exception("could not release thread %s; its lease will expire", claim.thread_id)

"""The heartbeat: renews a worker's leases from an OS thread of its own, and the watchdog of the worker's event loop.

Tools, hooks and effects are user code on the worker's event loop; one that computes for a while (or calls something
blocking) must not cost the other threads of this process their leases. So the heartbeat runs on its own thread,
with its own event loop and its own connection: it renews each lease every `lease / 3` seconds whatever the main loop
does, the oldest first, in statements of at most `BATCH` leases (so under load the renewals spread over time, and a
slow statement holds up its own batch and those after it, not the ones before), each allowed to run until its leases
are nearly gone before the connection is taken for dead; one that fails is tried again a moment later (a sixteenth
of a beat) on a new connection.
A process whose loop is stuck for good must not keep its leases for ever either: the main loop ticks a clock, and
when it has not ticked for `watchdog_seconds` (much longer than a lease) the watchdog ends the process, so its leases
expire and other workers take its threads over; fencing discards anything it would still have written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable

import asyncpg

from app import claims, db

log = logging.getLogger(__name__)

TICK = 0.5  # seconds between the main loop's ticks
BATCH = 200  # leases renewed by one statement: a slow one holds up its own and the later ones, not those before
STUCK_EXIT_CODE = 70  # the process exit code when the watchdog ends it (EX_SOFTWARE)


# HEARTBEAT: renew every lease this process holds in one statement, run by the `Heartbeat` below on its own connection.
# Engine transactions never lock lease rows (only the thread row), so a renewal waits for nothing but a statement that
# ends the lease anyway (a claim of an expired one, a release, a revoke); such a row is skipped here and retried
# below. A lease is lost only when its row no longer carries the claim's token (expired and claimed by another worker,
# released, or revoked by stop / terminate).
HEARTBEAT = """
    WITH mine AS (SELECT * FROM unnest($1::uuid[], $2::uuid[]) AS m(id, token)),
    renewed AS (
        UPDATE leases SET expires_at = now() + make_interval(secs => $3)
        WHERE thread_id IN (
            SELECT l.thread_id FROM leases l JOIN mine ON l.thread_id = mine.id AND l.token = mine.token
            FOR NO KEY UPDATE OF l SKIP LOCKED
        )
        RETURNING thread_id
    )
    SELECT mine.id, mine.token,
           EXISTS (SELECT 1 FROM leases l WHERE l.thread_id = mine.id AND l.token = mine.token) AS held
    FROM mine WHERE mine.id NOT IN (SELECT thread_id FROM renewed)
"""  # the rows of the claims it did not renew, alone: most beats read none back


# HEARTBEAT_WAITING: the rows the first statement skipped because they were locked, renewed in a transaction of
# their own that waits for the locks (at most `lock_timeout`): the others are committed already, so no wait here can
# cost them their lease.
_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', $1, true)"  # SET LOCAL, with the value as a parameter
HEARTBEAT_WAITING = """
    UPDATE leases SET expires_at = now() + make_interval(secs => $3)
    WHERE (thread_id, token) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[]))
"""


async def renew(
    conn: asyncpg.Connection, held: list[claims.Claim], lease_seconds: float, lock_timeout: float = 1.0
) -> set[tuple[uuid.UUID, uuid.UUID]]:
    """Renew the leases of the claims `held`; return the (thread id, token) of those that were lost."""
    if not held:
        return set()
    ids, tokens = [c.thread_id for c in held], [c.token for c in held]
    rows = await conn.fetch(HEARTBEAT, ids, tokens, float(lease_seconds))
    lost = {(r["id"], r["token"]) for r in rows if not r["held"]}
    busy = [claims.Claim(r["id"], r["token"], 0) for r in rows if r["held"]]
    if busy:
        with contextlib.suppress(asyncpg.LockNotAvailableError):
            async with conn.transaction():
                await conn.execute(_LOCK_TIMEOUT, f"{int(lock_timeout * 1000)}ms")
                await conn.execute(
                    HEARTBEAT_WAITING, [c.thread_id for c in busy], [c.token for c in busy], float(lease_seconds)
                )
    return lost


class Heartbeat:
    """Keeps the leases of the claims `held()` alive; reports lost ones to `on_lost` on the main loop."""

    def __init__(
        self,
        url: str,
        pooled: bool,
        lease_seconds: float,
        watchdog_seconds: float,
        held: Callable[[], list[claims.Claim]],
        on_lost: Callable[[set[tuple[uuid.UUID, uuid.UUID]]], None],
    ) -> None:
        self._url = url
        self._pooled = pooled  # `url` is a pooler in transaction mode: each beat is one transaction, so it may be
        self._lease = lease_seconds
        self._watchdog = watchdog_seconds
        self._held = held
        self._on_lost = on_lost
        self._ticked = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._main, name="heartbeat", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticker: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start ticking on the running (main) loop and beating on the heartbeat thread."""
        self._loop = asyncio.get_running_loop()
        self._ticker = self._loop.create_task(self._tick(), name="watchdog-tick")
        self._thread.start()

    async def stop(self) -> None:
        """Stop beating (the caller hands its leases back itself)."""
        self._done.set()
        if self._ticker is not None:
            self._ticker.cancel()
        await asyncio.to_thread(self._thread.join, 10)

    async def _tick(self) -> None:
        while True:
            self._ticked = time.monotonic()
            await asyncio.sleep(TICK)

    def stalled(self) -> float:
        """Seconds since the main loop last ran its ticker."""
        return time.monotonic() - self._ticked

    # -- on the heartbeat thread ---------------------------------------------------------------------------

    def _main(self) -> None:
        asyncio.run(self._beat())

    async def _beat(self) -> None:
        interval = self._lease / 3
        tick = interval / 4
        renewed: dict[tuple[uuid.UUID, uuid.UUID], float] = {}  # claim -> when the statement that renewed it began
        stall_warned = failure_warned = -math.inf
        looked, wait = time.monotonic(), tick
        conn: asyncpg.Connection | None = None
        try:
            while not self._done.wait(wait):
                wait = tick
                if self._loop is not None and self._loop.is_closed():
                    return  # the worker's loop ended without stopping us (a test torn down early): nothing to keep
                now, stalled = time.monotonic(), self.stalled()
                if stalled > self._watchdog:
                    log.critical(
                        "the worker's event loop has not run for %.0f s (limit %.0f s): exiting so its leases pass on",
                        stalled,
                        self._watchdog,
                    )
                    os._exit(STUCK_EXIT_CODE)
                if stalled > interval and now - stall_warned > interval:
                    stall_warned = now
                    log.warning("the worker's event loop has not run for %.1f s; its leases are kept alive", stalled)
                by_key = {(c.thread_id, c.token): c for c in self._held()}
                # a claim is dated from its statement's start; one without (made elsewhere) from the last look at the
                # claims, less a tick for one handed to the worker just after it
                renewed = {k: renewed.get(k) or c.claimed_at or looked - tick for k, c in by_key.items()}
                looked = now
                due = sorted((k for k, at in renewed.items() if now - at >= interval), key=renewed.__getitem__)
                for start in range(0, len(due), BATCH):
                    if self._done.is_set():
                        return
                    batch = due[start : start + BATCH]
                    began = time.monotonic()
                    # until the first of these leases is half a beat from its end: a slow statement (a loaded database)
                    # may finish; one that cannot (a dead connection) is given up with time to connect and try again
                    left = renewed[batch[0]] + self._lease - began - interval / 2
                    try:
                        async with asyncio.timeout(max(left, tick)):
                            conn = conn or await db.connect(self._url, connect_timeout=interval, pooled=self._pooled)
                            lost = await renew(conn, [by_key[k] for k in batch], self._lease, interval / 2)
                    except Exception as exc:
                        if began - failure_warned > interval:
                            failure_warned = began
                            log.warning("heartbeat failed (%s: %s); reconnecting", type(exc).__name__, exc)
                        if conn is not None:
                            conn.terminate()  # at once: a dead socket would hold a polite close for its timeout
                        conn, wait = None, tick / 4  # tried again in a moment, these leases first
                        break
                    took = time.monotonic() - began
                    if took > interval / 2:
                        log.warning("renewing %d leases took %.1f s (a beat is %.1f s)", len(batch), took, interval)
                    for key in batch:
                        renewed[key] = began
                    if lost and self._loop is not None:
                        with contextlib.suppress(RuntimeError):  # the worker's loop closed meanwhile
                            self._loop.call_soon_threadsafe(self._on_lost, lost)
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=1)

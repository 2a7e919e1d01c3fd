"""The heartbeat's schedule: each lease renewed a beat after its claim or its last renewal, in batches; a slow renewal
waited for while its leases last, a failed one tried again at once on a new connection. The connection and the
statement are stand-ins here (the statement itself is tested on real leases in test_queue.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from app import claims, heartbeat
from app.heartbeat import Heartbeat


class _Connection:
    """A connection whose polite close, once a statement was cut off on it, hangs as a dead socket's would."""

    def __init__(self) -> None:
        self.dead = False
        self.terminated = False

    def terminate(self) -> None:
        self.terminated = True

    async def close(self, timeout: float | None = None) -> None:
        if self.dead:
            await asyncio.sleep(timeout or 60)


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> list[_Connection]:
    opened: list[_Connection] = []

    async def connect(*args: Any, **kwargs: Any) -> _Connection:
        opened.append(_Connection())
        return opened[-1]

    # the heartbeat's own name for the module: `app.db.connect` itself serves other tests' background work meanwhile
    monkeypatch.setattr(heartbeat, "db", SimpleNamespace(connect=connect))
    return opened


def _claims(n: int, at: float | None = None) -> list[claims.Claim]:
    return [claims.Claim(uuid.uuid4(), uuid.uuid4(), 1, claimed_at=at) for _ in range(n)]


async def _beating(held: list[claims.Claim], lease: float, done: Any, seconds: float = 15) -> None:
    """Run a heartbeat over the claims `held` until `done()` holds (at most `seconds`), then stop it."""
    beat = Heartbeat("postgresql://unused", False, lease, 60, lambda: held, lambda lost: None)
    beat.start()
    try:
        deadline = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < deadline, "the heartbeat did not get there in time"
            await asyncio.sleep(0.02)
    finally:
        await beat.stop()


async def test_a_renewal_that_hangs_is_given_up_before_the_lease_ends_and_tried_again_at_once(
    connections: list[_Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal slower than a beat (a loaded database) is waited for while its lease lasts; one that never answers
    (a dead connection) is given up half a beat before the lease ends, and tried again on a new connection at once,
    before the lease is gone — not a beat later, nor after a polite close of the dead one."""
    entered: list[float] = []
    abandoned: list[float] = []

    async def renew(conn: _Connection, claims: list[claims.Claim], *args: Any, **kwargs: Any) -> set[Any]:
        entered.append(time.monotonic())
        if len(entered) == 1:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                abandoned.append(time.monotonic())
                conn.dead = True
                raise
        return set()

    monkeypatch.setattr(heartbeat, "renew", renew)
    lease = 3.0
    interval = lease / 3
    held = _claims(1, at=time.monotonic())
    claimed = held[0].claimed_at
    assert claimed is not None
    await _beating(held, lease, lambda: len(entered) >= 2)
    assert abandoned, "the hanging renewal was never given up"
    assert abandoned[0] > claimed + lease - interval * 0.75  # past a beat of waiting: a slow statement may finish
    assert entered[1] < claimed + lease  # tried again while the lease still holds
    assert entered[1] - abandoned[0] < interval / 4
    assert len(connections) == 2 and connections[0].terminated  # the dead one dropped at once, a new one opened


async def test_a_lease_is_renewed_a_beat_after_its_claim(
    connections: list[_Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim carries the time its statement was sent: its first renewal comes a beat after that, however late the
    heartbeat first sees it (a slow claim, a busy event loop)."""
    renewals: list[float] = []

    async def renew(conn: _Connection, claims: list[claims.Claim], *args: Any, **kwargs: Any) -> set[Any]:
        renewals.append(time.monotonic())
        return set()

    monkeypatch.setattr(heartbeat, "renew", renew)
    lease = 3.0
    interval = lease / 3
    started = time.monotonic()
    held = _claims(1, at=started - interval * 0.9)  # claimed most of a beat before the heartbeat starts
    await _beating(held, lease, lambda: len(renewals) >= 1)
    assert renewals[0] - started < interval * 0.6  # at the first tick after it came due, not a beat after it was seen


async def test_leases_are_renewed_in_batches(connections: list[_Connection], monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker holding many leases renews them in statements of at most `BATCH`; every lease once a beat."""
    batches: list[list[uuid.UUID]] = []

    async def renew(conn: _Connection, claims: list[claims.Claim], *args: Any, **kwargs: Any) -> set[Any]:
        batches.append([c.thread_id for c in claims])
        return set()

    monkeypatch.setattr(heartbeat, "renew", renew)
    held = _claims(heartbeat.BATCH * 2 + 50)
    await _beating(held, 0.9, lambda: len(batches) >= 3)
    first = batches[:3]
    assert [len(b) for b in first] == [heartbeat.BATCH, heartbeat.BATCH, 50]
    assert {t for b in first for t in b} == {c.thread_id for c in held}

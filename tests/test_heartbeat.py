"""The heartbeat's schedule: each lease renewed every beat in batches, a slow renewal waited for, a failed one tried
again at once (the statement itself is tested on real leases in test_queue.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg
import pytest

from app import heartbeat, queue
from app.heartbeat import Heartbeat


def _claims(n: int) -> list[queue.Claim]:
    return [queue.Claim(uuid.uuid4(), uuid.uuid4(), 1) for _ in range(n)]


async def _until(done: Any, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, "the heartbeat did not get there in time"
        await asyncio.sleep(0.02)


async def test_a_renewal_that_hangs_is_given_up_before_the_lease_ends_and_tried_again_at_once(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal slower than a beat (a loaded database) is waited for while its leases last; one that never answers
    is given up with time left, and tried again a tick later — not a whole beat later, when the lease is gone."""
    entered: list[float] = []
    abandoned: list[float] = []

    async def renew(conn: asyncpg.Connection, claims: list[queue.Claim], *args: Any, **kwargs: Any) -> set[Any]:
        entered.append(time.monotonic())
        if len(entered) == 1:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                abandoned.append(time.monotonic())
                raise
        return set()

    monkeypatch.setattr(heartbeat, "renew", renew)
    lease = 3.0
    interval = lease / 3
    held = _claims(1)
    beat = Heartbeat(database_url, False, lease, 60, lambda: held, lambda lost: None)
    beat.start()
    try:
        await _until(lambda: len(entered) >= 2)
    finally:
        await beat.stop()
    assert abandoned, "the hanging renewal was never given up"
    assert abandoned[0] - entered[0] > interval * 1.2  # more than a beat: a slow statement may still finish
    assert abandoned[0] - entered[0] < lease - interval  # and given up while the lease is still held
    assert entered[1] - abandoned[0] < interval / 2  # tried again at the next tick


async def test_leases_are_renewed_in_batches(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker holding many leases renews them in statements of at most `BATCH`, so one slow statement holds up its
    own batch alone; every lease is renewed once a beat."""
    batches: list[list[uuid.UUID]] = []

    async def renew(conn: asyncpg.Connection, claims: list[queue.Claim], *args: Any, **kwargs: Any) -> set[Any]:
        batches.append([c.thread_id for c in claims])
        return set()

    monkeypatch.setattr(heartbeat, "renew", renew)
    held = _claims(heartbeat.BATCH * 2 + 50)
    beat = Heartbeat(database_url, False, 0.9, 60, lambda: held, lambda lost: None)
    beat.start()
    try:
        await _until(lambda: len(batches) >= 3)
    finally:
        await beat.stop()
    first = batches[:3]
    assert [len(b) for b in first] == [heartbeat.BATCH, heartbeat.BATCH, 50]
    assert {t for b in first for t in b} == {c.thread_id for c in held}

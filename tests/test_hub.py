"""The hub: one read per announced event for all of a process's subscribers, deltas kept behind the events before
them, the log as the fallback when the hub cannot read, and streams cut off when their key is revoked."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, cast

import pytest
from sqlalchemy import func, select

from app import catalog, db, event_types, events, hub, keys, publisher
from app.hub import Batch, Live, Overflow, Stored, Subscription
from tests.conftest import ROOT, client_for, wait_for
from tests.test_api import read_events


async def _thread(app: Any) -> uuid.UUID:
    client = client_for(app)
    return uuid.UUID((await client.post("/threads", json={"agent": "assistant"})).json()["id"])


async def _append(app: Any, thread_id: uuid.UUID, n: int) -> list[int]:
    seqs = []
    for i in range(n):  # one transaction each, as the engine's steps do
        async with app.state.runtime.sessions() as session, session.begin():
            seq = await events.append(session, thread_id, "event", {"event_type": "t", "data": {"i": i}})
        assert seq is not None  # not held: stored at once
        seqs.append(seq)
    return seqs


def held(app: Any, thread_id: uuid.UUID) -> list[tuple[int, Live]]:
    """The deltas the hub holds back behind the thread's events it is still reading."""
    tail = app.state.runtime.hub._tails.get(thread_id)
    return list(tail.held) if tail is not None else []


def announced(app: Any, thread_id: uuid.UUID) -> int | None:
    """The last of the thread's events the hub has heard announced (None: none yet)."""
    tail = app.state.runtime.hub._tails.get(thread_id)
    return None if tail is None else int(tail.wanted)


def delivered(sub: Subscription) -> list[Stored | Live]:
    """What the subscription holds, batches unpacked."""
    return [i for d in sub.items for i in (d.items if isinstance(d, Batch) else (d,))]


def delivered_stored(sub: Subscription) -> list[Stored]:
    """What the subscription holds, every item a stored event (none live-only)."""
    items = delivered(sub)
    assert all(isinstance(i, Stored) for i in items), items
    return [i for i in items if isinstance(i, Stored)]


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many keys each of the hub's reads asked for."""
    calls: list[int] = []
    original = hub.Hub._fetch

    async def counted(self: hub.Hub, afters: dict[uuid.UUID, int]) -> dict[uuid.UUID, list[hub.Entry]]:
        calls.append(len(afters))
        return await original(self, afters)

    monkeypatch.setattr(hub.Hub, "_fetch", counted)
    return calls


def _gated_reads(monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, list[int]]:
    """The hub's reads held back until the returned gate is set; how many keys each read asked for."""
    gate = asyncio.Event()
    calls: list[int] = []
    original = hub.Hub._fetch

    async def held_back(self: hub.Hub, afters: dict[uuid.UUID, int]) -> dict[uuid.UUID, list[hub.Entry]]:
        calls.append(len(afters))
        await gate.wait()
        return await original(self, afters)

    monkeypatch.setattr(hub.Hub, "_fetch", held_back)
    return gate, calls


async def test_many_subscribers_share_one_read_per_event(app_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    reads = _counting_reads(monkeypatch)
    subs = [app.state.runtime.hub.subscribe(thread_id) for _ in range(50)]
    seqs = await _append(app, thread_id, 5)

    async def everyone_has_all() -> bool:
        return all(len(delivered(s)) == 5 for s in subs)

    await wait_for(everyone_has_all, interval=0.01)
    assert 1 <= len(reads) <= 5  # one read per announcement at most (fewer when a read caught several)
    first = delivered_stored(subs[0])
    assert [item.seq for item in first] == seqs
    assert all(i.entry is not None and i.entry.type == "event" for i in first)
    assert [i.entry.data["data"]["i"] for i in first if i.entry] == [0, 1, 2, 3, 4]
    for sub in subs[1:]:  # the very same entries: read and serialised once
        assert all(a.entry is b.entry for a, b in zip(first, delivered_stored(sub), strict=True))
    for sub in subs:
        app.state.runtime.hub.unsubscribe(sub)
    assert app.state.runtime.hub.subscribers == 0


async def test_announcements_of_many_threads_are_read_together(
    app_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    threads = [await _thread(app) for _ in range(20)]
    subs = {t: app.state.runtime.hub.subscribe(t) for t in threads}
    reads = _counting_reads(monkeypatch)
    async with app.state.runtime.sessions() as session, session.begin():  # one commit announces all twenty
        seqs = {t: await events.append(session, t, "event", {"event_type": "t", "data": {}}) for t in threads}

    async def everyone_has_theirs() -> bool:
        return all(len(delivered(s)) == 1 for s in subs.values())

    await wait_for(everyone_has_theirs, interval=0.01)
    assert len(reads) < 20 and sum(reads) == 20  # batched: fewer queries than threads, every thread read once
    for thread_id, sub in subs.items():
        [item] = delivered(sub)
        assert isinstance(item, Stored) and item.seq == seqs[thread_id] and item.entry is not None
        app.state.runtime.hub.unsubscribe(sub)


async def test_a_delta_waits_for_the_events_announced_before_it(
    app_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    gate, _ = _gated_reads(monkeypatch)
    sub: Subscription = app.state.runtime.hub.subscribe(thread_id)
    [seq] = await _append(app, thread_id, 1)
    publisher = hub.Publisher(app.state.runtime.settings.database_url)
    try:
        publisher.publish(thread_id, "message_chunk", {"message_id": "m", "chunk": "hi", "offset": 0})
        await wait_for(lambda: asyncio.sleep(0, bool(held(app, thread_id))), interval=0.01)
        assert not sub.items  # the chunk arrived, but the event before it is still being read
        gate.set()
        await wait_for(lambda: asyncio.sleep(0, len(delivered(sub)) == 2), interval=0.01)
        stored, live = delivered(sub)
        assert isinstance(stored, Stored) and stored.seq == seq and stored.entry is not None
        assert isinstance(live, Live) and live.data["chunk"] == "hi"
    finally:
        await publisher.close()
        app.state.runtime.hub.unsubscribe(sub)


async def test_when_the_hub_cannot_read_streams_fall_back_to_the_log(
    app_factory: Any, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)

    async def broken(self: hub.Hub, afters: dict[uuid.UUID, int]) -> dict[uuid.UUID, list[hub.Entry]]:
        raise OSError("connection refused")

    monkeypatch.setattr(hub.Hub, "_fetch", broken)
    sub: Subscription = app.state.runtime.hub.subscribe(thread_id)
    base = await serve(app)
    reader = asyncio.create_task(read_events(base, f"/threads/{thread_id}/events", "turn_ended"))
    await wait_for(lambda: asyncio.sleep(0, app.state.runtime.hub.subscribers == 2), interval=0.01)  # it subscribed
    seqs = await _append(app, thread_id, 3)
    async with app.state.runtime.sessions() as session, session.begin():
        last = await events.append(session, thread_id, "turn_ended", {"side": "a", "reason": "stop_on_response"})
    frames = await asyncio.wait_for(reader, 10)
    assert [int(f["id"]) for f in frames] == [*seqs, last]  # every event, from the log
    assert all(isinstance(i, Stored) and i.entry is None for i in delivered(sub))  # "read it yourself"
    app.state.runtime.hub.unsubscribe(sub)


async def _flush_held(app: Any, thread_id: uuid.UUID, datas: list[dict[str, Any]]) -> None:
    """One engine-like transaction: the thread's events held, then written (and announced) in one statement."""
    async with app.state.runtime.sessions() as session, session.begin():
        events.hold(session, thread_id)
        for data in datas:
            await events.append(
                session, thread_id, "event", cast(event_types.Custom, data)
            )  # the hub carries any payload
        await events.flush(session)


async def test_a_held_batch_comes_with_its_announcement_and_is_not_read_back(
    app_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    reads = _counting_reads(monkeypatch)
    sub: Subscription = app.state.runtime.hub.subscribe(thread_id)
    await _flush_held(app, thread_id, [{"i": 0, "text": "héllo ✓"}, {"i": 1}])
    await _flush_held(app, thread_id, [{"i": 2}])
    await wait_for(lambda: asyncio.sleep(0, len(delivered(sub)) == 3), interval=0.01)
    assert reads == []  # handed on from the notifications alone
    items = delivered_stored(sub)
    assert [i.seq for i in items] == [1, 2, 3]
    assert [i.entry.data for i in items if i.entry] == [
        {"i": 0, "text": "héllo ✓"},
        {"i": 1},
        {"i": 2},
    ]
    app.state.runtime.hub.unsubscribe(sub)


async def test_a_batch_too_large_to_carry_is_read_from_the_log(
    app_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    reads = _counting_reads(monkeypatch)
    sub: Subscription = app.state.runtime.hub.subscribe(thread_id)
    big = "é" * 3000  # stored as `\u00e9`: 18,000 bytes each, over a NOTIFY payload
    await _flush_held(app, thread_id, [{"text": big}, {"text": big}])
    await wait_for(lambda: asyncio.sleep(0, len(delivered(sub)) == 2), interval=0.01)
    assert reads == [1]
    assert [i.entry.data["text"] == big for i in delivered(sub) if isinstance(i, Stored) and i.entry] == [True, True]
    app.state.runtime.hub.unsubscribe(sub)


async def test_a_carried_batch_waits_for_a_read_under_way(app_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    gate, reads = _gated_reads(monkeypatch)
    sub: Subscription = app.state.runtime.hub.subscribe(thread_id)
    [first] = await _append(app, thread_id, 1)  # announced without its event: read, and the read is held back
    await _flush_held(app, thread_id, [{"i": 1}])  # comes with its event, but must not pass the one before it
    await wait_for(lambda: asyncio.sleep(0, announced(app, thread_id) == first + 1), interval=0.01)
    assert not sub.items and reads == [1]
    gate.set()
    await wait_for(lambda: asyncio.sleep(0, len(delivered(sub)) == 2), interval=0.01)
    assert [i.seq for i in delivered_stored(sub)] == [first, first + 1]
    app.state.runtime.hub.unsubscribe(sub)


async def test_a_carried_batch_behind_a_read_is_read_to_its_end_across_pages(
    app_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    thread_id = await _thread(app)
    gate, _ = _gated_reads(monkeypatch)
    monkeypatch.setattr(events, "PAGE", 2)  # the first read ends inside the carried batch
    sub: Subscription = app.state.runtime.hub.subscribe(thread_id)
    [first] = await _append(app, thread_id, 1)
    await _flush_held(app, thread_id, [{"i": 1}, {"i": 2}, {"i": 3}])
    await wait_for(lambda: asyncio.sleep(0, announced(app, thread_id) == first + 3), interval=0.01)
    gate.set()
    await wait_for(lambda: asyncio.sleep(0, len(delivered(sub)) == 4), interval=0.01)
    assert [i.seq for i in delivered_stored(sub)] == [first, first + 1, first + 2, first + 3]
    app.state.runtime.hub.unsubscribe(sub)


async def test_a_key_revoked_before_its_stream_subscribed_is_caught_by_the_next_check(
    app_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A revocation announced while a stream was being opened (after its key was checked, before it subscribed) is
    heard by nobody: the periodic check ends that stream, and only that one."""
    monkeypatch.setattr(hub, "KEY_CHECK", 0.05)
    checks = 0
    check = hub.Hub._revoked

    async def counted(self: hub.Hub, held: set[uuid.UUID], keyless: bool) -> tuple[set[uuid.UUID], bool]:
        nonlocal checks
        checks += 1
        return await check(self, held, keyless)

    monkeypatch.setattr(hub.Hub, "_revoked", counted)
    app = await app_factory(catalog.load(ROOT / "agents"))
    the_hub = app.state.runtime.hub
    thread_id = await _thread(app)
    heard = the_hub.keyless._epoch  # moves on with each transaction that changes the keys, as the hub hears it
    async with app.state.runtime.sessions() as session, session.begin():
        (gone, key), (kept, _) = await keys.create(session, "gina"), await keys.create(session, "hal")
        assert (await keys.verify(session, key)).key_id == gone.id
    async with app.state.runtime.sessions() as session, session.begin():
        assert await keys.revoke(session, str(gone.id)) == 1

    async def came_and_went() -> bool:
        """The hub heard of both changes, and its check took them (`_keys_changed` cleared) with no stream open."""
        return the_hub.keyless._epoch == heard + 2 and not the_hub._keys_changed.is_set()

    await wait_for(came_and_went, interval=0.01)  # the announcement came and went: no stream held the key
    revoked = the_hub.subscribe(thread_id, gone.id)
    other = the_hub.subscribe(thread_id, kept.id)
    opened_open = the_hub.subscribe(thread_id)  # as in open mode, which the keys have ended
    with pytest.raises(Overflow):
        await asyncio.wait_for(revoked.wait(), 5)
    seen = checks
    await wait_for(lambda: asyncio.sleep(0, checks >= seen + 3), interval=0.01)  # more checks
    assert not other.overflowed and opened_open.overflowed
    for sub in (revoked, other, opened_open):
        the_hub.unsubscribe(sub)


async def _listening(dsn: str, payloads: list[int] | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """A connection listening to the hub's channel; the deltas it heard, unpacked (`payloads`: deltas per
    notification)."""
    conn = await db.connect(dsn, connect_timeout=5)
    heard: list[dict[str, Any]] = []

    def unpack(*args: Any) -> None:
        packed = json.loads(args[3])
        heard.extend({"thread_id": t, "type": type_, "data": data} for t, type_, data in packed)
        if payloads is not None:
            payloads.append(len(packed))

    await conn.add_listener(hub.CHANNEL, unpack)
    return conn, heard


class Gated:
    """A publisher's connection whose sends wait until `gate` opens (asyncpg's own attributes are read-only)."""

    def __init__(self, conn: Any, gate: asyncio.Event) -> None:
        self._conn, self._gate = conn, gate

    def is_closed(self) -> bool:
        return bool(self._conn.is_closed())

    async def execute(self, *args: Any) -> Any:
        await self._gate.wait()
        return await self._conn.execute(*args)

    async def close(self) -> None:
        await self._conn.close()


async def test_deltas_queued_meanwhile_go_out_together_in_order(database_url: str) -> None:
    dsn = database_url
    payloads: list[int] = []
    listener, heard = await _listening(dsn, payloads)
    publisher = hub.Publisher(dsn)
    sent: list[int] = []
    try:
        publisher.publish(uuid.uuid4(), "message_chunk", {"message_id": "warm", "chunk": "x", "offset": 0})
        await publisher.sent()
        assert publisher._conn is not None
        conn = publisher._conn

        class Counted:  # the connection, its sent counted (asyncpg's own attributes are read-only)
            def is_closed(self) -> bool:
                return conn.is_closed()

            async def execute(self, *args: Any) -> Any:
                sent.append(len(args[2]))
                return await conn.execute(*args)

            async def close(self) -> None:
                await conn.close()

        publisher._conn = Counted()  # type: ignore[assignment]
        threads = [uuid.uuid4() for _ in range(3)]
        for i in range(60):  # three streaming calls' deltas, interleaved, with nothing awaited between them
            thread_id = threads[i % 3]
            publisher.publish(thread_id, "message_chunk", {"message_id": str(thread_id), "chunk": "ab", "offset": i})
        publisher.publish(threads[0], "message_chunk", {"message_id": "long", "chunk": "y" * 2500, "offset": 0})
        await publisher.sent()  # returns once all of it is out
        assert len(sent) == 1  # one statement for everything queued while nothing was being sent
        await wait_for(lambda: asyncio.sleep(0, len(heard) == 64), interval=0.01)
        assert payloads[1:] == [56, 7]  # packed into as few notifications as fit (~130 bytes a small delta)
        for thread_id in threads:
            mine = [h["data"]["offset"] for h in heard if h["data"]["message_id"] == str(thread_id)]
            assert mine == sorted(mine) and len(mine) == 20
        long = [h["data"] for h in heard if h["data"]["message_id"] == "long"]
        assert [(d["offset"], len(d["chunk"])) for d in long] == [(0, 1000), (1000, 1000), (2000, 500)]
    finally:
        await publisher.close()
        await listener.close()


async def test_a_thread_s_deltas_are_taken_after_what_a_send_under_way_holds_of_them(database_url: str) -> None:
    """`take` (an answer's statement sends its thread's last deltas itself): it waits for a batch being sent that
    holds some of them, then takes that thread's still queued, in order and packed, and no other's; `sent` does not
    wait for what was taken."""
    listener, heard = await _listening(database_url)
    publisher = hub.Publisher(database_url)
    mine, other = uuid.uuid4(), uuid.uuid4()
    try:
        publisher.publish(mine, "message_chunk", {"message_id": "m", "chunk": "a", "offset": 0})
        await asyncio.sleep(0)  # the sender takes it: a batch under way
        assert publisher._sending_now == {str(mine)}
        for i, chunk in enumerate("bcd", 1):
            publisher.publish(mine, "message_chunk", {"message_id": "m", "chunk": chunk, "offset": i})
            publisher.publish(other, "message_chunk", {"message_id": "o", "chunk": chunk, "offset": i})
        taken = await publisher.take(mine)
        assert str(mine) not in publisher._sending_now  # it returned once the batch holding "a" was sent
        assert [[d[2]["chunk"] for d in json.loads(p)] for p in taken] == [["b", "c", "d"]]
        assert await publisher.take(mine) == []
        await asyncio.wait_for(publisher.sent(), 10)  # the other thread's go out as usual
        await wait_for(lambda: asyncio.sleep(0, len(heard) == 4), interval=0.01)
        assert [(h["data"]["message_id"], h["data"]["chunk"]) for h in heard] == [
            ("m", "a"),
            ("o", "b"),
            ("o", "c"),
            ("o", "d"),
        ]
    finally:
        await publisher.close()
        await listener.close()


async def test_a_wait_for_deltas_in_a_batch_under_way_outlasts_another_thread_s_take(database_url: str) -> None:
    """`sent` waits for what was queued when it was called, a batch under way included, even when another thread
    then takes deltas of its own (which are done for `sent` at once)."""
    publisher = hub.Publisher(database_url)
    gate = asyncio.Event()
    try:
        publisher.publish(uuid.uuid4(), "message_chunk", {"message_id": "warm", "chunk": "x", "offset": 0})
        await publisher.sent()
        assert publisher._conn is not None
        publisher._conn = Gated(publisher._conn, gate)  # type: ignore[assignment]
        mine, other = uuid.uuid4(), uuid.uuid4()
        publisher.publish(mine, "message_chunk", {"message_id": "m", "chunk": "a", "offset": 0})
        await asyncio.sleep(0)  # its batch is under way, held at the gate
        waiting = asyncio.ensure_future(publisher.sent())
        await asyncio.sleep(0)
        publisher.publish(other, "message_chunk", {"message_id": "o", "chunk": "b", "offset": 0})
        assert len(await publisher.take(other)) == 1
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done()  # "a" is still on its way
        gate.set()
        await asyncio.wait_for(waiting, 10)
    finally:
        gate.set()
        await publisher.close()


async def test_publishing_never_waits_for_the_database_nor_fails(caplog: pytest.LogCaptureFixture) -> None:
    publisher = hub.Publisher("postgresql://nobody@127.0.0.1:1/none")  # nothing listens there
    publisher.publish(uuid.uuid4(), "message_chunk", {"message_id": "m", "chunk": "hi", "offset": 0})  # returns
    await asyncio.wait_for(publisher.sent(), 10)  # dropped counts as done: a waiter is never stuck
    assert "1 live events not sent" in caplog.text
    publisher.LIMIT = 2
    for i in range(5):
        publisher.publish(uuid.uuid4(), "message_chunk", {"message_id": "m", "chunk": "hi", "offset": i})
    assert len(publisher._queued) <= 2 and "live events dropped: 2 queued" in caplog.text
    await asyncio.wait_for(publisher.close(), 10)


def test_a_delta_is_split_so_every_piece_fits_in_a_notify() -> None:
    text = "😀" * 1500 + "a" * 2500  # JSON writes each emoji as 12 bytes
    pieces = publisher._pieces(text, publisher.PIECE)
    assert "".join(pieces) == text
    assert all(len(json.dumps({"chunk": p}).encode()) < publisher.NOTIFY_BYTES - 300 for p in pieces)
    assert publisher._pieces("", publisher.PIECE) == [""]


async def test_a_waiter_is_served_even_when_a_sender_was_cut_off(database_url: str) -> None:
    dsn = database_url
    listener, heard = await _listening(dsn)
    publisher = hub.Publisher(dsn)
    try:
        publisher.publish(uuid.uuid4(), "message_chunk", {"message_id": "m", "chunk": "a", "offset": 0})
        assert publisher._sender is not None
        publisher._sender.cancel()  # before it ran at all: what it had queued is still queued
        await asyncio.sleep(0)
        await asyncio.wait_for(publisher.sent(), 10)  # a new sender takes it over
        await wait_for(lambda: asyncio.sleep(0, len(heard) == 1), interval=0.01)
    finally:
        await publisher.close()
        await listener.close()
    publisher.publish(uuid.uuid4(), "message_chunk", {"message_id": "m", "chunk": "late", "offset": 0})
    assert publisher._sender is None or publisher._sender.done()  # closed: dropped, no connection reopened


async def test_packed_deltas_reach_each_followed_thread_as_one_delivery_in_order(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    first, second, unfollowed = await _thread(app), await _thread(app), uuid.uuid4()
    the_hub: hub.Hub = app.state.runtime.hub
    subs = {t: the_hub.subscribe(t) for t in (first, second)}
    publisher = hub.Publisher(app.state.runtime.settings.database_url)
    try:
        for i in range(6):  # queued together: one notification
            thread_id = (first, second, unfollowed)[i % 3]
            publisher.publish(thread_id, "message_chunk", {"message_id": "m", "chunk": f"{i}", "offset": i})
        await publisher.sent()
        await wait_for(lambda: asyncio.sleep(0, all(len(delivered(s)) == 2 for s in subs.values())), interval=0.01)
        for thread_id, i in ((first, 0), (second, 1)):
            [delivery] = subs[thread_id].items  # one delivery: the stream writes it in one send
            assert isinstance(delivery, Batch)
            assert [cast(Live, d).data["chunk"] for d in delivery.items] == [f"{i}", f"{i + 3}"]
        # one delta in a notification of its own, as a publisher of the previous version sends it
        old = {"thread_id": str(first), "type": "message_chunk", "data": {"message_id": "m", "chunk": "x", "offset": 6}}
        async with app.state.runtime.sessions() as session, session.begin():
            await session.execute(select(func.pg_notify(hub.CHANNEL, json.dumps(old))))
        await wait_for(lambda: asyncio.sleep(0, len(delivered(subs[first])) == 3), interval=0.01)
        assert cast(Live, delivered(subs[first])[-1]).data["chunk"] == "x"
    finally:
        await publisher.close()
        for sub in subs.values():
            the_hub.unsubscribe(sub)


def test_deltas_are_packed_in_order_into_notifications_that_fit() -> None:
    items = [json.dumps([str(uuid.uuid4()), "message_chunk", {"chunk": "z" * n}]) for n in (10, 3000, 3000, 3000, 5)]
    payloads = publisher._packed(items)
    assert [len(json.loads(p)) for p in payloads] == [3, 2]
    assert all(len(p.encode()) <= publisher.NOTIFY_BYTES for p in payloads)
    assert [x for p in payloads for x in json.loads(p)] == [json.loads(i) for i in items]

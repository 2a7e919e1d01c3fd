"""API keys: the bootstrap key, revoking what `keys list` shows, and giving open mode's threads to a user."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import catalog, crypto, environment, errors, events, keys, tables
from app.settings import Settings
from tests.conftest import ROOT, client_for

CHOSEN = "sa_" + "Operator-Chosen_" * 3  # the key format: `sa_` and 32+ URL-safe characters


async def test_the_bootstrap_key_is_stored_once_hashed_and_stays_revoked(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as s, s.begin():
        row, created = await keys.bootstrap(s, CHOSEN)
        assert created and row.admin and row.user_id == "admin" and row.prefix == CHOSEN[:10]
        assert row.key_hash != CHOSEN and CHOSEN not in row.key_hash
    async with sessions() as s, s.begin():
        again, created = await keys.bootstrap(s, CHOSEN)  # every start-up runs it
        assert not created and again.id == row.id
        assert (await keys.verify(s, CHOSEN)).admin
        assert await keys.revoke(s, str(row.id)) == 1
    async with sessions() as s, s.begin():
        after, created = await keys.bootstrap(s, CHOSEN)
        assert not created and after.revoked_at is not None  # a revoked key is not brought back
        assert await keys.active_count(s) == 0


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (CHOSEN, True),
        ("", True),  # compose passes an unset variable as empty: no key
        ("sa_short", False),
        ("sk_" + "x" * 40, False),
        ("sa_" + "x" * 31, False),
        ("sa_" + "x" * 30 + " !", False),
    ],
)
def test_a_bootstrap_key_must_have_the_key_format(value: str, ok: bool) -> None:
    if ok:
        read = Settings(admin_api_key=value)
        assert (read.admin_api_key.get_secret_value() if read.admin_api_key else "") == value
        return
    with pytest.raises(ValidationError) as raised:
        Settings(admin_api_key=value)
    message = raised.value.errors()[0]["msg"]  # what `agents` prints
    assert "`sa_` followed by 32" in message and value not in message


async def test_revoke_takes_what_keys_list_shows(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        by_id, _ = await keys.create(s, "a")
        by_prefix, _ = await keys.create(s, "b")
        with_ellipsis, _ = await keys.create(s, "c")
        _, whole = await keys.create(s, "d")
    async with sessions() as s, s.begin():
        assert await keys.revoke(s, str(by_id.id)) == 1
        assert await keys.revoke(s, by_prefix.prefix) == 1
        assert await keys.revoke(s, f"{with_ellipsis.prefix}…") == 1  # pasted from `agents keys list`
        assert await keys.revoke(s, whole) == 1
        assert await keys.revoke(s, whole) == 0  # already revoked
        assert await keys.revoke(s, "sa_nothing") == 0
        assert await keys.active_count(s) == 0


async def test_an_ambiguous_prefix_is_refused(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        one, _ = await keys.bootstrap(s, "sa_SamePrefix" + "1" * 30)
        two, _ = await keys.bootstrap(s, "sa_SamePrefix" + "2" * 30)
        assert one.prefix == two.prefix
    async with sessions() as s, s.begin():
        with pytest.raises(errors.Conflict, match="2 active keys start with sa_SamePre") as refused:
            await keys.revoke(s, one.prefix + "…")
        assert str(one.id) in refused.value.message and str(two.id) in refused.value.message
    async with sessions() as s, s.begin():
        assert await keys.active_count(s) == 2  # nothing revoked
        assert await keys.revoke(s, str(two.id)) == 1
        assert await keys.revoke(s, one.prefix) == 1  # unambiguous once the other is revoked


async def test_adopting_gives_open_mode_threads_events_and_variables_to_a_user(
    app_factory: Any, settings: Settings
) -> None:
    app: FastAPI = await app_factory(catalog.load(ROOT / "agents"))
    async with client_for(app) as anon:  # open mode: no key yet
        made = (await anon.post("/threads", json={"agent": "assistant", "env": {"T": "thread"}})).json()["id"]
        assert (await anon.put(f"/threads/{made}/fs/notes.txt", content=b"hi")).status_code < 300
    fernet = crypto.server_key(settings)
    async with app.state.runtime.sessions() as s, s.begin():
        await environment.put(s, fernet, "user", keys.OPEN.user_id, {"REGION": "eu", "TEAM": "x"}, set())
        await environment.put(s, fernet, "user", "alice", {"TEAM": "alices"}, set())
        assert await keys.open_threads(s) == 1
        _, key = await keys.create(s, "alice")
    async with client_for(app, key) as alice:
        assert (await alice.get("/threads")).json()["threads"] == []  # hidden from her key
    async with app.state.runtime.sessions() as s, s.begin():
        adopted = await keys.adopt_open(s, "alice")
        assert adopted == keys.Adopted(threads=1, variables=1, kept=["TEAM"])
        assert await keys.open_threads(s) == 0
        assert (await environment.public(s, "user", "alice"))[0] == {"REGION": "eu", "TEAM": "alices"}
        owners = (await s.execute(select(tables.LifecycleEvent.user_id))).scalars().all()
        assert set(owners) == {"alice"}
        assert [e.type for e in await events.read_lifecycle(s, "alice", 0)] == ["thread_created"]
    async with client_for(app, key) as alice:
        listed = (await alice.get("/threads")).json()["threads"]
        assert [t["id"] for t in listed] == [made]
        assert (await alice.get(f"/threads/{made}/fs/notes.txt")).content == b"hi"
        assert (await alice.get(f"/threads/{made}")).json()["env"]["T"] == "thread"
        assert (await alice.get("/env/user")).json()["env"] == {"REGION": "eu", "TEAM": "alices"}


async def test_adopting_needs_a_real_user(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        for who in ("", "local"):
            with pytest.raises(errors.Invalid):
                await keys.adopt_open(s, who)

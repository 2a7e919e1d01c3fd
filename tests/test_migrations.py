"""Which schemas this release runs on (`app/migrations.py`): its own newest migration, and a newer one whose release
says this one still runs on it; `GET /ready`, `agents migrate` and the worker's start refuse the others by name."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app import db, errors, migrations
from tests.test_api import _catalog, assert_error

FUTURE = "9999"  # a migration no release knows yet


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    made = db.create_engine(database_url, 2)
    yield made
    await made.dispose()


async def _set(engine: AsyncEngine, at: str, compat: tuple[str, str] | None) -> None:
    """Put the database at migration `at`, with `compat` (revision, runs_with) as the row a newer release wrote."""
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = :at"), {"at": at})
        await conn.execute(text("DELETE FROM schema_compat"))
        if compat is not None:
            await conn.execute(
                text("INSERT INTO schema_compat (revision, runs_with) VALUES (:r, :w)"),
                {"r": compat[0], "w": compat[1]},
            )


async def test_an_upgrade_records_which_releases_run_on_the_schema(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT revision, runs_with FROM schema_compat"))).one()
    head = migrations.head()
    assert tuple(row) == (head, migrations.runs_with(head))
    found = await migrations.schema(engine)
    assert (found.at, found.fit, found.runs) == (head, migrations.Fit.CURRENT, True)


def test_every_migration_since_the_policy_names_the_oldest_release_that_runs_on_it() -> None:
    """From 0016 on each script says `runs_with`: a migration before it (the release before runs on what it leaves),
    never itself or a later one."""
    revisions = migrations.known()
    assert revisions[-1] == migrations.head()
    for at, revision in enumerate(revisions):
        runs_with = migrations.runs_with(revision)
        if at >= revisions.index("0016"):
            assert runs_with in revisions[:at], revision


@pytest.mark.parametrize(
    ("compat", "fit"),
    [
        (lambda head: (FUTURE, head), migrations.Fit.NEWER),  # its release says this one runs on it
        (lambda head: (FUTURE, "0016"), migrations.Fit.NEWER),  # ... and an older one too
        (lambda head: (FUTURE, "9998"), migrations.Fit.UNKNOWN),  # only releases this one does not know
        (lambda head: (head, head), migrations.Fit.UNKNOWN),  # written by another migration than the one it is at
        (lambda head: None, migrations.Fit.UNKNOWN),  # nothing says
    ],
)
async def test_a_newer_migration_runs_when_its_release_says_this_one_does(
    engine: AsyncEngine, compat: Any, fit: migrations.Fit
) -> None:
    await _set(engine, FUTURE, compat(migrations.head()))
    found = await migrations.schema(engine)
    assert (found.at, found.head, found.fit) == (FUTURE, migrations.head(), fit)
    if fit is migrations.Fit.NEWER:
        assert await migrations.upgrade(engine) == found  # nothing to do: the newer release migrated it
        return
    with pytest.raises(errors.SchemaUnknown, match=f"at migration {FUTURE}, which this release .* does not know"):
        await migrations.upgrade(engine)
    async with engine.connect() as conn:  # left as it was
        assert (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar_one() == FUTURE


async def test_ready_answers_whether_this_release_runs_on_the_schema(app_factory: Any, engine: AsyncEngine) -> None:
    app = await app_factory(_catalog())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as client:
        assert (await client.get("/ready")).json() == {"status": "ready"}
        await _set(engine, FUTURE, (FUTURE, migrations.head()))
        assert (await client.get("/ready")).json() == {"status": "ready"}
        await _set(engine, FUTURE, (FUTURE, "9998"))
        unknown = assert_error(await client.get("/ready"), 503, "schema_unknown")
        assert unknown["details"] == {"at": FUTURE, "knows": migrations.head()}
        await _set(engine, "0015", None)
        behind = assert_error(await client.get("/ready"), 503, "schema_behind")
        assert behind["message"] == (
            f"The database is at migration 0015 and this release needs {migrations.head()}: run `agents migrate`."
        )
        assert (await client.head("/ready")).status_code == 503


async def test_a_worker_starting_before_the_migration_waits_for_it(engine: AsyncEngine) -> None:
    await _set(engine, "0015", None)
    waiting = asyncio.create_task(migrations.until_runs(engine, wait=0.05))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = :h"), {"h": migrations.head()})
    found = await asyncio.wait_for(waiting, 5)
    assert found.fit is migrations.Fit.CURRENT


async def test_a_worker_refuses_a_schema_it_does_not_run_on(engine: AsyncEngine) -> None:
    await _set(engine, FUTURE, (FUTURE, "9998"))
    with pytest.raises(errors.SchemaUnknown):
        await asyncio.wait_for(migrations.until_runs(engine, wait=0.05), 5)

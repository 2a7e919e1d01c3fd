"""The database schema's migrations (the Alembic scripts in `migrations/`): upgrading, and whether this release's code
runs on the schema as it is.

Migrations expand, then contract one release later (ARCHITECTURE.md, "Migrations"), so the code of the release
before runs on a schema migrated to this release's head. Each script from 0016 on says so in `runs_with`: the
oldest release (named by its newest migration) whose code runs on the schema it leaves. Every upgrade writes the
head's `runs_with` into `schema_compat`, where a process of an older release, which cannot read the newer script,
finds it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app import errors

SCRIPTS = Path(__file__).resolve().parent.parent / "migrations"
LOCK = 7_316_001  # pg_advisory_xact_lock key: replicas never migrate at once
WAIT_SECONDS = 2.0  # how often a worker started before `agents migrate` finished looks again

log = logging.getLogger(__name__)


class Fit(enum.Enum):
    """How the database's schema fits this release's code."""

    CURRENT = "current"  # at this release's newest migration
    NEWER = "newer"  # at a migration this release does not know, made by a release whose schema it runs on
    BEHIND = "behind"  # at an older migration of this release (or none): `agents migrate` brings it up
    UNKNOWN = "unknown"  # at a migration this release does not know, and nothing says it runs on it


@dataclasses.dataclass(frozen=True)
class Schema:
    """The migration the database is at (`""`: none), this release's newest, and how they fit."""

    at: str
    head: str
    fit: Fit

    @property
    def runs(self) -> bool:
        """Whether this release's code runs on it."""
        return self.fit in (Fit.CURRENT, Fit.NEWER)

    def refusal(self) -> errors.NotReady:
        """Why this release's code does not run on it, as the error `/ready` answers and the worker exits with."""
        if self.fit is Fit.BEHIND:
            return errors.SchemaBehind(
                f"The database is at migration {self.at or 'none'} and this release needs {self.head}: "
                "run `agents migrate`.",
                at=self.at,
                needs=self.head,
            )
        return errors.SchemaUnknown(
            f"The database is at migration {self.at}, which this release (at {self.head}) does not know, and it "
            "does not say that this release runs on it: it was migrated by a newer release that no longer does. "
            "Run that release.",
            at=self.at,
            knows=self.head,
        )


async def upgrade(engine: AsyncEngine) -> Schema:
    """Upgrade the database to this release's newest migration; a database a newer release migrated is left as it
    is when this release runs on it, and refused (`errors.SchemaUnknown`) when not."""
    async with engine.begin() as conn:
        return await conn.run_sync(_upgrade)


async def schema(engine: AsyncEngine) -> Schema:
    """Where the database's schema is, and whether this release runs on it."""
    async with engine.connect() as conn:
        return await conn.run_sync(_schema)


async def until_runs(engine: AsyncEngine, wait: float = WAIT_SECONDS) -> Schema:
    """Return once this release's code runs on the database's schema (a worker's start): while it is behind (the
    new release's processes started before `agents migrate` finished) wait, saying so once; a schema a newer release
    made without this one in mind is refused (`errors.SchemaUnknown`), as waiting would not change it."""
    said = False
    while True:
        found = await schema(engine)
        if found.runs:
            if found.fit is Fit.NEWER:
                log.info(
                    "the database is at migration %s, newer than this release's %s, which runs on it",
                    found.at,
                    found.head,
                )
            return found
        if found.fit is Fit.UNKNOWN:
            raise found.refusal()
        if not said:
            log.warning("%s Waiting for it (every %g s).", found.refusal().message, wait)
            said = True
        await asyncio.sleep(wait)


def record(connection: Connection) -> None:
    """Write which releases run on the schema the migrations just left, when its script says (`migrations/env.py`
    calls this after every run, in its transaction)."""
    heads = MigrationContext.configure(connection).get_current_heads()
    if len(heads) != 1:
        return
    oldest = runs_with(heads[0])
    if oldest is None or not inspect(connection).has_table("schema_compat"):
        return
    connection.execute(
        text(
            "INSERT INTO schema_compat (id, revision, runs_with) VALUES (1, :revision, :runs_with) "
            "ON CONFLICT (id) DO UPDATE SET revision = EXCLUDED.revision, runs_with = EXCLUDED.runs_with"
        ),
        {"revision": heads[0], "runs_with": oldest},
    )


@functools.cache
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


@functools.cache
def known() -> tuple[str, ...]:
    """Every migration this release knows, the first first."""
    return tuple(reversed([script.revision for script in _scripts().walk_revisions()]))


def head() -> str:
    """This release's newest migration."""
    heads = _scripts().get_heads()
    assert len(heads) == 1, f"the migrations have several heads: {heads}"
    return heads[0]


def runs_with(revision: str) -> str | None:
    """What the migration's script says in `runs_with` (None: nothing, as the scripts before 0016)."""
    script = _scripts().get_revision(revision)
    assert script is not None
    value = getattr(script.module, "runs_with", None)
    return value if isinstance(value, str) else None


def _config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _upgrade(connection: Connection) -> Schema:
    connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK})
    found = _schema(connection)
    if found.fit is Fit.UNKNOWN:
        raise found.refusal()
    if found.fit is Fit.BEHIND:
        command.upgrade(_config(connection), "head")
        return Schema(head(), head(), Fit.CURRENT)
    return found


def _schema(connection: Connection) -> Schema:
    ours = head()
    heads = MigrationContext.configure(connection).get_current_heads()
    at = ",".join(heads)
    if heads == (ours,):
        return Schema(at, ours, Fit.CURRENT)
    if all(h in known() for h in heads):
        return Schema(at, ours, Fit.BEHIND)
    if len(heads) == 1 and inspect(connection).has_table("schema_compat"):
        row = connection.execute(text("SELECT revision, runs_with FROM schema_compat WHERE id = 1")).first()
        if row is not None and row.revision == heads[0] and row.runs_with in known():
            return Schema(at, ours, Fit.NEWER)
    return Schema(at, ours, Fit.UNKNOWN)

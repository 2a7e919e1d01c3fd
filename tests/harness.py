"""Drive threads in the test's own task: claim what is runnable and await its execution, as a worker would, without
one (no claim loop, no poll interval, no heartbeat, no waiting for a turn to show over HTTP)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI

from app import claims, db, statements
from app.engine.run import Engine
from app.hub import Publisher
from app.runtime import Runtime

LEASE_SECONDS = 300  # nothing renews a harness's leases: long enough for any execution a test awaits


class Harness:
    """The engine of an app started without a worker, on the app's sessions, settings, catalog and meter."""

    def __init__(self, engine: Engine, app: FastAPI) -> None:
        self.engine = engine
        self._runtime: Runtime = app.state.runtime
        self.owner = f"harness:{uuid.uuid4().hex[:8]}"

    async def step(self) -> uuid.UUID | None:
        """Claim the oldest runnable thread and run it until it has nothing left to do; its id, or None when nothing
        was runnable."""
        async with db.autocommit(self._runtime.sessions) as session:
            claim = await claims.claim(await statements.driver(session), self.owner, LEASE_SECONDS)
        if claim is None:
            return None
        await self.engine.execute(claim)
        return claim.thread_id

    async def drain(self) -> list[uuid.UUID]:
        """Run executions until nothing is runnable (a parent and the children it queues, in turn); the threads run,
        in order."""
        ran = []
        while (thread_id := await self.step()) is not None:
            ran.append(thread_id)
        return ran


@asynccontextmanager
async def harness(app: FastAPI, http: httpx.AsyncClient) -> AsyncIterator[Harness]:
    """A harness on a started app (`app_factory(catalog)`, no worker); `http` is its LLM client."""
    rt: Runtime = app.state.runtime
    url = rt.settings.database_url
    assert url is not None
    publisher = Publisher(url)
    try:
        engine = Engine(rt.settings, rt.sessions, rt.catalog, publisher, rt.fernet, http, rt.meter)
        yield Harness(engine, app)
    finally:
        await publisher.close()

"""The composition root: what one process runs on, made from its settings in one place and closed in one place.

`open` makes the parts a process needs — the API's pool, hub and open mode (`api`); the worker's pool, publisher,
LLM client, engine and worker pool (`worker`) — around what both share: the settings, the catalog, the Fernet for
secrets and the meter. `agents serve` opens both, `agents api` the API alone (`app.api.app.create_app`, in its
lifespan), `agents worker` the worker alone (`app.__main__`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app import crypto, db, keys, tracing
from app.catalog import Catalog
from app.engine.run import Engine, llm_http
from app.hub import Hub, Publisher
from app.metrics import Meter
from app.settings import Settings
from app.worker import Worker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Runtime:
    """A process's parts, opened by `open`; `hub` with the API, `worker` with a worker pool."""

    settings: Settings
    catalog: Catalog
    db: AsyncEngine  # the API's pool; the worker's when there is no API
    sessions: async_sessionmaker[AsyncSession]  # on `db`
    fernet: Fernet  # secrets at rest (env values)
    tokens: Fernet  # signs stream tokens
    meter: Meter  # this process's series: its streams, and its worker's work
    hub: Hub | None = None  # the API's fan-out of NOTIFY to its streams
    open_mode: bool = False  # the API serves without a key: bound to loopback, and no key existed at start
    worker: asyncio.Task[None] | None = None  # the worker pool, running
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # set as the process begins to stop

    async def until_stopped(self) -> None:
        """Return once `stopping` is set, or the worker pool ended by itself (its error is raised as `open` closes)."""
        stopping = asyncio.ensure_future(self.stopping.wait())
        waited: set[asyncio.Future[Any]] = {stopping} if self.worker is None else {stopping, self.worker}
        try:
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, settings: Settings, catalog: Catalog, *, api: bool, worker: bool, http: httpx.AsyncClient | None = None
    ) -> AsyncIterator[Runtime]:
        """The API's parts (`api`), a worker pool (`worker`) or both, on `settings.database_url`; closed on exit, the
        worker pool first (it stops claiming, cancels what runs and hands its leases back). `http` replaces the
        worker's client for LLM providers (tests pass one on an `httpx.MockTransport`) and is left open."""
        url = settings.database_url
        if url is None:
            raise ValueError("the runtime needs settings.database_url (the CLI starts the embedded Postgres)")
        if not (api or worker):
            raise ValueError("a runtime runs the API, a worker pool, or both")
        fernet = crypto.server_key(settings)
        meter = Meter()
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(tracing.started())  # closed last: the spans of the shutdown are exported too
            # every pool keeps its connections open once opened (an overflow one would be closed on return, and
            # opened again under load); a worker's executions hold one only inside a transaction
            pool = db.create_engine(url, settings.db_pool_size, 0, pooled=settings.pooled)
            stack.push_async_callback(pool.dispose)
            sessions = db.sessionmaker(pool)
            hub: Hub | None = None
            open_mode = False
            if api:
                hub = Hub(settings.session_url or url, settings.sse_buffer, sessions)  # LISTEN: a session
                await hub.start()
                stack.push_async_callback(hub.stop)
                open_mode = await _open_mode(settings, sessions)
            task: asyncio.Task[None] | None = None
            if worker:
                worker_db, worker_sessions = pool, sessions
                if api:  # a pool of its own: executions never wait behind requests for a connection, or vice versa
                    worker_db = db.create_engine(url, settings.db_pool_size, 0, pooled=settings.pooled)
                    stack.push_async_callback(worker_db.dispose)
                    worker_sessions = db.sessionmaker(worker_db)
                publisher = Publisher(url, pooled=settings.pooled)
                stack.push_async_callback(publisher.close)
                if http is None:
                    http = llm_http()
                    stack.push_async_callback(http.aclose)
                engine = Engine(settings, worker_sessions, catalog, publisher, fernet, http, meter)
                stop = asyncio.Event()
                task = asyncio.create_task(Worker(settings, worker_sessions, engine).run(stop))
                stack.push_async_callback(_stopped, stop, task)
            tokens = crypto.token_key(settings)
            yield cls(settings, catalog, pool, sessions, fernet, tokens, meter, hub, open_mode, task)


async def _open_mode(settings: Settings, sessions: async_sessionmaker[AsyncSession]) -> bool:
    async with sessions() as session:
        open_mode = settings.loopback and await keys.active_count(session) == 0
    if open_mode:
        log.warning(
            "no API key configured: serving OPEN on loopback %s (create one with `agents keys create`)", settings.host
        )
    return open_mode


async def _stopped(stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    await task

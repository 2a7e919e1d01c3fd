"""The FastAPI application: routers, error handlers, and the lifespan that owns the process's resources."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.middleware.cors import CORSMiddleware

from app import crypto, db, keys
from app.api import errors, openapi
from app.api.guard import Guard
from app.api.routes import (
    agents,
    effects,
    endpoints,
    env,
    events,
    files,
    health,
    logs,
    messages,
    metrics,
    playground,
    subagents,
    threads,
    variables,
)
from app.catalog import Catalog
from app.engine.run import Engine, llm_http
from app.hub import Hub, Publisher
from app.metrics import Meter
from app.settings import Settings, plain_url
from app.worker import Worker

log = logging.getLogger(__name__)


def create_app(
    settings: Settings, catalog: Catalog, *, with_worker: bool = False, http: httpx.AsyncClient | None = None
) -> FastAPI:
    """The API (and, with `with_worker`, a worker pool in the same process) on `settings.database_url`;
    `http` replaces the worker's client for LLM providers (tests pass one on an `httpx.MockTransport`)."""
    if settings.database_url is None:
        raise ValueError("create_app needs settings.database_url (the CLI starts the embedded Postgres)")
    url = settings.database_url

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine: AsyncEngine = db.create_engine(url, settings.db_pool_size, 0)  # all kept open once opened
        sessions = db.sessionmaker(engine)
        hub = Hub(plain_url(url), settings.sse_buffer, sessions)
        await hub.start()
        publisher = Publisher(plain_url(url))
        fernet = crypto.server_key(settings)
        app.state.tokens = crypto.token_key(settings)
        async with sessions() as session:
            app.state.open_mode = settings.loopback and await keys.active_count(session) == 0
        if app.state.open_mode:
            log.warning(
                "no API key configured: serving OPEN on loopback %s (create one with `agents keys create`)",
                settings.host,
            )
        app.state.engine, app.state.sessions, app.state.hub, app.state.fernet = engine, sessions, hub, fernet
        stop = asyncio.Event()
        worker_task: asyncio.Task[None] | None = None
        worker_db: AsyncEngine | None = None
        if with_worker:  # a pool of its own: executions never wait behind requests for a connection, or vice versa
            worker_db = db.create_engine(url, *db.worker_pool(settings.worker_concurrency))
            worker_sessions = db.sessionmaker(worker_db)
            runner = Engine(settings, worker_sessions, catalog, publisher, fernet, http or llm_http(), app.state.meter)
            worker_task = asyncio.create_task(Worker(settings, worker_db, worker_sessions, runner).run(stop))
        try:
            yield
        finally:
            stop.set()
            if worker_task is not None:
                await worker_task
            if worker_task is not None and http is None:
                await runner.http.aclose()
            await hub.stop()
            await publisher.close()
            await engine.dispose()
            if worker_db is not None:
                await worker_db.dispose()

    app = FastAPIOffline(  # `/docs` and `/redoc` from assets the package ships: no CDN, so they work offline
        title="Standard Agents runtime",
        version="0.1.0",
        description="Agent threads as HTTP resources: create threads, post messages, follow them over SSE.",
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},  # Swagger UI would fetch a badge from validator.swagger.io
    )
    app.state.settings = settings
    app.state.catalog = catalog
    app.state.open_mode = False
    app.state.meter = Meter()  # this process's series: its streams, and its worker's work (`with_worker`)
    app.state.stopping = asyncio.Event()  # set as the server begins to stop: waiting requests answer
    errors.install(app)
    openapi.install(app)

    app.add_middleware(Guard, max_body_bytes=settings.max_body_bytes, max_file_bytes=settings.max_file_bytes)
    if settings.cors_origins:  # outermost: a preflight is answered before anything else looks at the request
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID", "If-None-Match"],
            expose_headers=["ETag", "Retry-After", "Content-Disposition", "Location"],
            max_age=600,
        )

    routers = (
        health.router,
        metrics.router,
        agents.router,
        threads.router,
        messages.router,
        logs.router,
        events.router,
        files.router,
        effects.router,
        subagents.router,
        variables.router,
        env.router,
    )
    for router in routers:
        app.include_router(router)
    app.state.documented_routes = [  # a 405's `Allow` lists what each of them answers at the path
        r for router in routers for r in router.routes if isinstance(r, APIRoute) and r.include_in_schema
    ]
    if settings.playground_enabled:  # static, keyless: every call it makes is an API call with the user's key
        app.include_router(playground.router)
    app.include_router(endpoints.router)  # last: it takes every path under a thread, so built-in routes win
    return app

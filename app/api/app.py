"""The FastAPI application: routers, error handlers, and the lifespan that opens the process's `Runtime`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline
from starlette.middleware.cors import CORSMiddleware

from app import __version__, tracing
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
from app.api.streams import Streams
from app.catalog import Catalog
from app.runtime import Runtime
from app.settings import Settings


def create_app(
    settings: Settings, catalog: Catalog, *, with_worker: bool = False, http: httpx.AsyncClient | None = None
) -> FastAPI:
    """The API (and, with `with_worker`, a worker pool in the same process) on `settings.database_url`, on the
    `Runtime` its lifespan opens; `http` replaces the worker's client for LLM providers (tests pass one on an
    `httpx.MockTransport`)."""
    if settings.database_url is None:
        raise ValueError("create_app needs settings.database_url (the CLI starts the embedded Postgres)")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with Runtime.open(settings, catalog, api=True, worker=with_worker, http=http) as runtime:
            # on the app rather than in the lifespan's state: tests run the lifespan themselves, and serve the app
            # with `lifespan="off"` (`tests/conftest.py`)
            app.state.runtime = runtime
            yield

    app = FastAPIOffline(  # `/docs` and `/redoc` from assets the package ships: no CDN, so they work offline
        title="Standard Agents runtime",
        version=__version__,
        description="Agent threads as HTTP resources: create threads, post messages, follow them over SSE.",
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},  # Swagger UI would fetch a badge from validator.swagger.io
    )
    errors.install(app)
    openapi.install(app, catalog, settings)

    app.add_middleware(Guard, max_body_bytes=settings.max_body_bytes, max_file_bytes=settings.max_file_bytes)
    # in front of the guard: a stream request it serves has no body to count, and an open stream would hold the
    # guard's frame (it passes anything with a body, a NUL, or a parameter FastAPI must read, on to the guard)
    app.add_middleware(Streams)
    if settings.cors_origins:  # outermost: a preflight is answered before anything else looks at the request
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            # `X-Client`: the JS client's name and version, which a browser does not let it put in `User-Agent`
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID", "If-None-Match", "X-Client"],
            expose_headers=["ETag", "Retry-After", "Content-Disposition", "Location"],
            max_age=600,
        )

    app.add_middleware(tracing.Middleware)  # outermost: a span per request, a preflight's too (off: a pass-through)

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

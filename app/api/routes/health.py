"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app import __version__, migrations
from app.api import bodies, schemas
from app.api.deps import RuntimeDep
from app.api.errors import envelope

router = APIRouter(tags=["service"], route_class=bodies.Route)


@router.head("/health", include_in_schema=False)  # uptime checkers and load balancers that ask with HEAD
@router.get("/health", operation_id="getHealth")
async def health() -> schemas.Health:
    """The process is up, and its version."""
    return schemas.Health(status="ok", version=__version__)


@router.head("/ready", include_in_schema=False)
@router.get("/ready", operation_id="getReady", response_model=schemas.Status, responses={503: {"model": schemas.Error}})
async def ready(rt: RuntimeDep) -> JSONResponse:
    """The database answers and this release runs on its schema: at this release's newest migration, or at a newer
    one whose release says this one still runs on it. 503 `schema_behind` or `schema_unknown` otherwise."""
    try:
        found = await migrations.schema(rt.db)
    except Exception:
        return envelope(503, "not_ready", "The database does not answer.")
    if not found.runs:
        raise found.refusal()
    return JSONResponse({"status": "ready"})

"""`GET /metrics`: every series in the Prometheus text format, for admin keys (`app/metrics.py`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from app import errors, metrics
from app.api import bodies, schemas
from app.api.deps import CurrentUser, MeterDep, SessionDep

router = APIRouter(tags=["service"], route_class=bodies.Route)

RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {metrics.CONTENT_TYPE: {"schema": {"type": "string"}}}, "description": "The series."},
    401: {"model": schemas.Error},
    403: {"model": schemas.Error},
}


@router.get("/metrics", operation_id="getMetrics", response_class=Response, responses=RESPONSES)
async def scrape(session: SessionDep, who: CurrentUser, meter: MeterDep) -> Response:
    """Work done by every worker (totals kept in the database), the queue's state, this process's streams."""
    if not who.admin:
        raise errors.Forbidden("Metrics need an admin key (`agents keys create --admin`).")
    body = await metrics.exposition(session, meter)
    return Response(body, media_type=metrics.CONTENT_TYPE)

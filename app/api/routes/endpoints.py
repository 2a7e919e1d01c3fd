"""Custom thread endpoints: every method on `/threads/{id}` and under it, mounted after the built-in routes (which
always win) and dispatched to the catalog's endpoints (`http-api.md`, Custom thread endpoints)."""

from __future__ import annotations

import logging
import uuid

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic_core import PydanticSerializationError, to_jsonable_python
from starlette.exceptions import HTTPException
from starlette.routing import Match

from app import endpoints as routing
from app import errors, threads
from app.api.deps import CatalogDep, StreamUser, sessions
from app.engine import outside

router = APIRouter(tags=["endpoints"])
log = logging.getLogger(__name__)


# The caller is checked on a short session of its own: no session is held while the handler runs.
@router.api_route("/threads/{thread_id}", methods=list(routing.METHODS), include_in_schema=False)
@router.api_route("/threads/{thread_id}/{path:path}", methods=list(routing.METHODS), include_in_schema=False)
async def dispatch(thread_id: uuid.UUID, request: Request, who: StreamUser, catalog: CatalogDep) -> Response:
    """Run the endpoint the path resolves to, with a `ThreadState` outside the thread's execution."""
    path = str(request.path_params.get("path", ""))
    builtin = _builtin_methods(request)
    if routing.reserved(routing.split(path)):  # a built-in route's path: answer as the built-in routes would
        _refuse(builtin)
        raise HTTPException(404, "Not Found")
    async with sessions(request)() as session:
        thread = await threads.get(session, thread_id, who)
    match = catalog.endpoints.match(request.method, path)
    if match is None or match.route is None or match.endpoint is None:
        _refuse(builtin | set(match.allow if match else ()))
        raise errors.EndpointNotFound(f"No endpoint of this thread answers `{request.method} /{path.strip('/')}`.")
    state = await outside.state(sessions(request), catalog, request.app.state.fernet, thread.id)
    try:
        result = await match.endpoint.fn(request, state, match.params)
    except (errors.AgentsError, HTTPException):  # meant for the client: the error table answers them
        raise
    except Exception as exc:
        log.exception("endpoint %s (endpoints/%s) of thread %s failed", match.route, match.route.file, thread_id)
        raise errors.EndpointFailed(
            f"The endpoint `{match.route}` raised {type(exc).__name__}; the error has been logged."
        ) from exc
    if isinstance(result, Response):
        return result
    try:
        return JSONResponse(to_jsonable_python(result))
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        log.exception("endpoint %s (endpoints/%s) returned a value that is not JSON", match.route, match.route.file)
        raise errors.EndpointFailed(
            f"The endpoint `{match.route}` returned a {type(result).__name__}, which is not JSON-serialisable."
        ) from exc


def _builtin_methods(request: Request) -> set[str]:
    """The methods of the built-in routes whose path is the request's (it reached us: its method is not theirs)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, APIRoute) and route.endpoint is not dispatch:
            matched, _ = route.matches(request.scope)
            if matched is not Match.NONE:
                methods |= route.methods or set()
    return methods


def _refuse(allow: set[str]) -> None:
    """405 if the path answers other methods."""
    if allow:
        ordered = [m for m in routing.METHODS if m in allow] + sorted(allow - set(routing.METHODS))
        raise HTTPException(405, "Method Not Allowed", headers={"Allow": ", ".join(ordered)})

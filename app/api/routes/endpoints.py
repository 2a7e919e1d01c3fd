"""Custom thread endpoints: the methods of `/threads/{id}` and every path under it that no built-in route owns,
dispatched to the catalog's endpoints (`http-api.md`, Custom thread endpoints).

The router is mounted after the built-in routes, and its paths never start with a built-in route's name, so the
built-in routes keep their own answers (405 with `Allow`, trailing-slash redirects) for every method.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic_core import PydanticSerializationError, to_jsonable_python
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from app import engine, errors, routing, threads
from app.api import bodies
from app.api.deps import CatalogDep, FernetDep, SessionsDep, StreamUser


class _Route(bodies.OwnBody):
    """A method no endpoint can have (`OPTIONS`, `TRACE`, ...) is refused as `dispatch` refuses one the path's
    endpoints lack: 405 with the methods they take, rather than every method this route passes on to `dispatch`."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.methods and scope["method"] not in self.methods:
            path = str(scope["path_params"].get("path", ""))
            match = scope["app"].state.runtime.catalog.endpoints.match(scope["method"], path)
            _refuse(set(match.allow if match else ()) | (routing.THREAD_METHODS if not routing.split(path) else set()))
            raise errors.EndpointNotFound(f"No endpoint of this thread answers `/{path.strip('/')}`.")
        await super().handle(scope, receive, send)


router = APIRouter(tags=["endpoints"], route_class=_Route)
log = logging.getLogger(__name__)


class EndpointPath(Convertor[str]):
    """A path under `/threads/{id}/` that does not start with a built-in route's name."""

    regex = routing.unreserved_regex()

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("endpoint", EndpointPath())
ROOT_METHODS = [m for m in routing.METHODS if m not in routing.THREAD_METHODS]  # the others are built-in


# The caller is checked on a short session of its own: no session is held while the handler runs.
@router.api_route("/threads/{thread_id}", methods=ROOT_METHODS, include_in_schema=False)
@router.api_route("/threads/{thread_id}/{path:endpoint}", methods=list(routing.METHODS), include_in_schema=False)
async def dispatch(
    thread_id: uuid.UUID,
    request: Request,
    who: StreamUser,
    sessions: SessionsDep,
    catalog: CatalogDep,
    fernet: FernetDep,
) -> Response:
    """Run the endpoint the path resolves to, with a `ThreadState` outside the thread's execution."""
    path = str(request.path_params.get("path", ""))
    async with sessions() as session:
        thread = await threads.get(session, thread_id, who)
    match = catalog.endpoints.match(request.method, path)
    if match is None or match.route is None or match.endpoint is None:
        allow = set(match.allow if match else ())
        _refuse(allow | (routing.THREAD_METHODS if not routing.split(path) else set()))
        raise errors.EndpointNotFound(f"No endpoint of this thread answers `{request.method} /{path.strip('/')}`.")
    state = await engine.thread_state(sessions, catalog, fernet, thread.id)
    try:
        result: Any = await match.endpoint.fn(request, state, match.params)
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


def _refuse(allow: set[str]) -> None:
    """405 if the path answers other methods."""
    if allow:
        ordered = [m for m in routing.METHODS if m in allow]
        raise HTTPException(405, "Method Not Allowed", headers={"Allow": ", ".join(ordered)})

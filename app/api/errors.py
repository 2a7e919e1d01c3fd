"""The one table from domain errors to HTTP statuses, and the error envelope every failure uses."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException
from starlette.routing import Match

from app import errors

log = logging.getLogger(__name__)

STATUS: dict[type[errors.AgentsError], int] = {
    errors.Invalid: 400,
    errors.BadVariableName: 422,  # valid JSON, a name no variable may have
    errors.BadNumber: 422,  # parsed, but a value no field can hold
    errors.Unauthorized: 401,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.StillMissing: 400,  # the bootstrap POST answers as the reference runtime does
    errors.MissingVariables: 422,
    errors.TooLarge: 413,
    errors.NotAnImage: 422,
    errors.SearchTimeout: 422,
    errors.NotReady: 503,
    errors.ConfigError: 500,
    errors.EndpointFailed: 500,
}

HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
}
BODY = ("body",)  # where FastAPI locates the request body: no part of a field's name


def envelope(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if details:
        body["details"] = details
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def status_of(exc: errors.AgentsError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


async def _domain(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.AgentsError)
    response = envelope(status_of(exc), exc.code, exc.message, exc.details or None)
    if isinstance(exc, errors.Busy):
        response.headers["Retry-After"] = "1"
    return response


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    found = exc.errors()
    problems = [{"field": errors.field(e["loc"], skip=BODY), "message": e["msg"], "type": e["type"]} for e in found]
    if any(p["type"] == "json_invalid" for p in problems):
        return envelope(400, "malformed_json", "The request body is not valid JSON.", {"problems": problems})
    summary = errors.problems(found, whole="body", skip=BODY)
    return envelope(422, "invalid_request", f"Invalid request: {summary}", {"problems": problems})


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = HTTP_CODES.get(exc.status_code, "error")
    response = envelope(exc.status_code, code, str(exc.detail))
    response.headers.update(exc.headers or {})
    if exc.status_code == 405:
        response.headers["Allow"] = _allow(request, response.headers.get("Allow", ""))
    return response


def _allow(request: Request, allow: str) -> str:
    """Every method the path answers: the router's 405 names only the first route whose path matched."""
    methods = [m.strip() for m in allow.split(",") if m.strip()]
    routes: list[APIRoute] = request.app.state.documented_routes
    for route in routes:
        if route.matches(request.scope)[0] != Match.NONE:
            methods += sorted((route.methods or set()) - set(methods))
    return ", ".join(methods)


async def _driver(request: Request, exc: Exception) -> JSONResponse:
    if errors.Contention.of(exc):  # a lock cycle the database broke: nothing was written, the client may retry
        response = envelope(503, "contention", "The thread was busy; nothing was changed. Try again.")
        response.headers["Retry-After"] = "1"
        return response
    if errors.Unavailable.of(exc):
        return _unavailable(exc)
    return await _unexpected(request, exc)


async def _os(request: Request, exc: Exception) -> JSONResponse:
    """No connection to the database (refused, reset, its socket gone while it restarts)."""
    if errors.Unavailable.of(exc):
        return _unavailable(exc)
    return await _unexpected(request, exc)


def _unavailable(exc: Exception) -> JSONResponse:
    log.warning("database unreachable: %s: %s", type(exc).__name__, exc)
    message = "The database cannot be reached right now; nothing was changed. Try again shortly."
    response = envelope(503, errors.Unavailable.code, message)
    response.headers["Retry-After"] = "2"
    return response


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error", exc_info=exc)
    return envelope(500, "internal_error", "Something went wrong on our side; the error has been logged.")


Handler = Callable[[Request, Exception], Awaitable[Response]]

# What each error becomes, looked up along the exception's MRO as Starlette looks up an app's handlers; anything else
# is `_unexpected` (a 500 and the error logged), given to Starlette's outermost middleware.
HANDLERS: dict[type[Exception], Handler] = {
    errors.AgentsError: _domain,
    RequestValidationError: _validation,
    HTTPException: _http,
    DBAPIError: _driver,
    OSError: _os,
}


def handler(exc: Exception) -> Handler | None:
    """The handler the app has for `exc`, if any but the catch-all: for routes served in front of FastAPI's own
    (`app/api/streams.py`), whose failures must read as the app's do."""
    for cls in type(exc).__mro__:
        if cls in HANDLERS:
            return HANDLERS[cls]
    return None


def install(app: FastAPI) -> None:
    """Register the handlers on an app."""
    for cls, handle in HANDLERS.items():
        app.add_exception_handler(cls, handle)
    app.add_exception_handler(Exception, _unexpected)

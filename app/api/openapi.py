"""The OpenAPI document, made true to what the server answers.

FastAPI documents validation failures as its own `HTTPValidationError` and only the statuses a route declares; this
server answers every failure with the `Error` envelope, and some failures happen on every route of a kind (a body
that is not JSON, a key that is missing, a database that is down). Those are added here from what each operation
takes, so the routes declare only what is theirs (409, 410, ...).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.api import schemas
from app.catalog import Catalog
from app.settings import Settings

ERROR = {"$ref": "#/components/schemas/Error"}
NO_CONTROLS = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
_FASTAPI_ERRORS = ("HTTPValidationError", "ValidationError")

_COMMON: dict[str, str] = {
    "400": "The request is malformed: JSON that does not parse, text that is not Unicode, a cursor or path this "
    "server did not give out, a value outside what the route takes.",
    "401": "No valid API key (`Authorization: Bearer <key>`).",
    "403": "The key may not do this (an admin-only scope), or, in open mode, the `Host` is not this machine's or "
    "the request comes from a web page of another origin.",
    "404": "The thread (or the item it names) is not there, or not the caller's.",
    "413": "The body is larger than `MAX_BODY_BYTES` (or a file than `MAX_FILE_BYTES`).",
    "415": "The body is not JSON (`Content-Type: application/json`).",
    "422": "The request does not match the route's schema; `details.problems` lists each field.",
    "503": "The database cannot be reached, or the thread was busy; nothing was changed. Retry after `Retry-After`.",
}


def install(app: FastAPI, catalog: Catalog, settings: Settings) -> None:
    """Serve the amended document at `/openapi.json` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            amend(schema, sorted(catalog.agents), limits(settings))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def limits(settings: Settings) -> dict[str, int]:
    """The limits settings decide, by the names the schemas give them."""
    return {
        "MAX_BODY_BYTES": settings.max_body_bytes,
        "MAX_FILE_BYTES": settings.max_file_bytes,
        "ENV_MAX_VARIABLES": settings.env_max_variables,
        "ENV_MAX_VALUE_BYTES": settings.env_max_value_bytes,
    }


def amend(schema: dict[str, Any], agents: list[str], limits: dict[str, int]) -> None:
    """Every operation's error responses use the envelope, and list the failures its inputs can meet; a thread's
    `agent` is one of the `agents` this server hosts; a bound a setting decides is its number here (`limits`)."""
    _bounds(schema, limits)
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            if isinstance(operation, dict) and "responses" in operation:
                _errors(operation)
    _links(schema.get("paths", {}))
    components = schema.get("components", {}).get("schemas", {})
    for name in _FASTAPI_ERRORS:
        components.pop(name, None)
    agent = components.get("ThreadIn", {}).get("properties", {}).get("agent")
    if agent is not None and agents:
        agent["enum"] = agents


def _bounds(node: Any, limits: dict[str, int]) -> None:
    if isinstance(node, dict):
        for key, name in node.pop(schemas.BY_SETTING, {}).items():
            node[key] = limits[name]  # a name no setting has fails the document's build, not a client
        for value in node.values():
            _bounds(value, limits)
    elif isinstance(node, list):
        for item in node:
            _bounds(item, limits)


def _errors(operation: dict[str, Any]) -> None:
    responses: dict[str, Any] = operation["responses"]
    params = operation.get("parameters", [])
    for param in params:  # every path is refused with 400 `bad_path` if it holds control characters (the guard)
        schema = param.get("schema", {})
        if param.get("in") == "path" and schema.get("type") == "string" and "pattern" not in schema:
            schema["pattern"] = NO_CONTROLS
    body = "requestBody" in operation
    statuses = {"503"}
    if operation.get("security"):
        statuses |= {"401", "403"}
    if params or body:
        statuses |= {"400", "422"}
    if any(p.get("in") == "path" for p in params):
        statuses.add("404")
    if body:
        statuses |= {"413", "415"}
    for status in statuses:
        responses.setdefault(status, {"description": _COMMON[status]})
    for status, response in responses.items():
        if status.startswith(("4", "5")):
            response["content"] = {"application/json": {"schema": ERROR}}
            generic = (None, "", "Validation Error", HTTPStatus(int(status)).phrase)
            if status in _COMMON and response.get("description") in generic:
                response["description"] = _COMMON[status]


def _links(paths: dict[str, Any]) -> None:
    """`POST /threads` links to every operation on a thread: its `id` is their `thread_id` (clients and
    schema-driven tests can follow them)."""
    created = paths.get("/threads", {}).get("post", {}).get("responses", {}).get("201")
    if created is None:
        return
    links = created.setdefault("links", {})
    for item in paths.values():
        for operation in item.values():
            params = operation.get("parameters", []) if isinstance(operation, dict) else []
            if any(p.get("in") == "path" and p.get("name") == "thread_id" for p in params):
                links[operation["operationId"]] = {
                    "operationId": operation["operationId"],
                    "parameters": {"path.thread_id": "$response.body#/id"},
                }

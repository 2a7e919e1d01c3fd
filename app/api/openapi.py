"""The OpenAPI document, made true to what the server answers.

FastAPI documents validation failures as its own `HTTPValidationError` and only the statuses a route declares; this
server answers every failure with the `Error` envelope, and some failures happen on every route of a kind (a body
that is not JSON, a key that is missing, a database that is down). Those are added here from what each operation
takes, so the routes declare only what is theirs (409, 410, ...). The streams' frames (`frames`) and the catalog's
custom thread endpoints, which no FastAPI route describes, are added here too.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app import routing
from app.api import examples, frames, schemas
from app.catalog import Catalog
from app.settings import Settings
from app.spec import EndpointDefinition

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
            amend(schema, catalog, limits(settings))
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


def amend(schema: dict[str, Any], catalog: Catalog, limits: dict[str, int]) -> None:
    """Every operation's error responses use the envelope, and list the failures its inputs can meet; a thread's
    `agent` is one of the agents the `catalog` hosts, and its custom endpoints are operations; the streams' frames
    are components; a bound a setting decides is its number here (`limits`)."""
    paths = schema.setdefault("paths", {})
    custom = _endpoints(paths, catalog.endpoints)
    _bounds(schema, limits)
    for item in paths.values():
        for operation in item.values():
            if isinstance(operation, dict) and "responses" in operation:
                _errors(operation, json_only=operation.get("operationId") not in custom)
    examples.add(paths)
    _links(paths)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in _FASTAPI_ERRORS:
        components.pop(name, None)
    for name, component in frames.components().items():
        if components.setdefault(name, component) != component:
            raise ValueError(f"`{name}` names an API schema and an event's (app/api/frames.py)")
    agent = components.get("ThreadIn", {}).get("properties", {}).get("agent")
    if agent is not None and catalog.agents:
        agent["enum"] = sorted(catalog.agents)


def _bounds(node: Any, limits: dict[str, int]) -> None:
    if isinstance(node, dict):
        for key, name in node.pop(schemas.BY_SETTING, {}).items():
            node[key] = limits[name]  # a name no setting has fails the document's build, not a client
        for value in node.values():
            _bounds(value, limits)
    elif isinstance(node, list):
        for item in node:
            _bounds(item, limits)


def _errors(operation: dict[str, Any], *, json_only: bool) -> None:
    """`json_only`: a body of another type is refused (415); a custom endpoint's handler reads any."""
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
        statuses |= {"413", "415"} if json_only else {"413"}
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


def _endpoints(paths: dict[str, Any], router: routing.Router[EndpointDefinition]) -> set[str]:
    """The catalog's custom thread endpoints as operations (`http-api.md`, Custom thread endpoints); their ids."""
    ids: set[str] = set()
    for route, endpoint in router.entries:
        path = "/threads/{thread_id}" + "".join(
            f"/{s.value}" if s.kind == "static" else f"/{{{s.value}}}" for s in route.segments
        )
        operation_id = base = _camel("endpoint", route.method.lower(), *(_words(s) for s in route.segments))
        suffix = 2
        while operation_id in ids:  # `a-b` and `a_b`, `[x]` and `[...x]`: same words, other routes
            operation_id, suffix = f"{base}{suffix}", suffix + 1
        ids.add(operation_id)
        paths.setdefault(path, {})[route.method.lower()] = _endpoint(route, endpoint, operation_id)
    return ids


def _words(segment: routing.Segment) -> str:
    return segment.value if segment.kind == "static" else f"by_{segment.value}"


def _camel(first: str, *rest: str) -> str:
    words = [w for text in rest for w in re.split(r"[^A-Za-z0-9]+", text) if w]
    return first + "".join(w[:1].upper() + w[1:] for w in words)


def _endpoint(route: routing.Route, endpoint: EndpointDefinition, operation_id: str) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": "thread_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
    ]
    for segment in route.segments:
        if segment.kind != "static":
            what = "one path segment" if segment.kind == "param" else "the rest of the path (segments, `/`-separated)"
            params.append(
                {
                    "name": segment.value,
                    "in": "path",
                    "required": True,
                    "description": what,
                    "schema": {"type": "string"},
                }
            )
    operation: dict[str, Any] = {
        "tags": ["endpoints"],
        "summary": endpoint.description or f"Custom endpoint `{route.file}`",
        "description": f"A custom thread endpoint (`endpoints/{route.file}` in the agents folder). Every thread "
        "answers it, whatever its agent: the catalog's endpoints are not an agent's own. The answer is the handler's: "
        "JSON, or a response of its own.",
        "operationId": operation_id,
        "security": [{"HTTPBearer": []}],
        "parameters": params,
        "responses": {
            "200": {"description": "What the handler returns.", "content": {"application/json": {"schema": {}}}},
            "500": {"description": "The handler raised (`endpoint_error`); the traceback is in the server's log."},
        },
    }
    if route.method in ("POST", "PUT", "PATCH"):
        body = {schemas.BY_SETTING: {"x-max-bytes": "MAX_BODY_BYTES"}}
        operation["requestBody"] = {
            "required": False,
            "description": "What the handler reads; a JSON body meets the API's JSON rules first.",
            "content": {"application/json": {"schema": body}},
        }
    return operation

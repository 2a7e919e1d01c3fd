"""Dependencies routes declare: a session (the route commits), the caller, and the parts of the process's `Runtime`
(`app/runtime.py`) they use — routes read none of them from the app themselves."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Annotated

from cryptography.fernet import Fernet
from fastapi import Depends, Query, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import environment, errors, keys, tokens
from app.api import origins
from app.catalog import Catalog
from app.hub import Hub
from app.keys import Principal
from app.metrics import Meter
from app.runtime import Runtime
from app.settings import Settings, is_loopback


async def runtime(request: Request) -> Runtime:  # async: FastAPI runs a plain `def` dependency on a thread
    """The runtime the app's lifespan opened."""
    value: Runtime = request.app.state.runtime
    return value


RuntimeDep = Annotated[Runtime, Depends(runtime)]


async def sessions(rt: RuntimeDep) -> async_sessionmaker[AsyncSession]:
    return rt.sessions


async def session(rt: RuntimeDep) -> AsyncIterator[AsyncSession]:
    async with rt.sessions() as s:
        yield s


async def _identify(s: AsyncSession, rt: Runtime, request: Request, authorization: str | None) -> Principal:
    """The caller: a valid Bearer key, or anyone in open mode (loopback bind and no key configured)."""
    if authorization:
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise errors.Unauthorized("Send the key as `Authorization: Bearer <key>`.")
        return await keys.verify(s, key.strip())
    if await _open(s, rt):
        _local(rt, request)
        _same_origin(rt, request)
        return keys.OPEN
    raise errors.Unauthorized()


_HOST = re.compile(r"(?P<name>[a-z0-9.-]+|\[[0-9a-f:.]+\])(?::(?P<port>[0-9]{0,5}))?")  # RFC 9110 §7.2


def _host(header: str) -> str | None:
    """The name a `Host` header gives, lowercased, without its port; None if it is not a valid `Host`."""
    match = _HOST.fullmatch(header.strip().lower())
    if match is None or (match["port"] and int(match["port"]) > 65535):
        return None
    return match["name"].strip("[]").rstrip(".")


def _hub(rt: Runtime) -> Hub:
    assert rt.hub is not None  # the app's runtime is opened with the API
    return rt.hub


async def _open(s: AsyncSession, rt: Runtime) -> bool:
    """Whether the server is open: bound to loopback and no key exists."""
    hub = _hub(rt)
    return bool(rt.open_mode and await hub.keyless.none(s, listening=hub.listening))


def _local(rt: Runtime, request: Request) -> None:
    """Open mode serves only requests addressed to this machine: a web page that rebinds its own name to 127.0.0.1
    still sends that name as `Host` (read from the header itself: Starlette's URL falls back to the socket's
    address when the header does not parse). No `Host` at all is not a browser."""
    header = request.headers.get("host")
    if header is None:
        return
    host = _host(header)
    allowed = rt.settings.allowed_hosts
    if host is not None and (is_loopback(host) or host.endswith(".localhost") or host in allowed):
        return
    raise errors.HostNotAllowed(
        f"Host `{header[:100]}` is not served in open mode (no API key): use localhost, list it in ALLOWED_HOSTS, "
        "or create a key with `agents keys create`."
    )


def _same_origin(rt: Runtime, request: Request) -> None:
    """Open mode acts only for pages of its own origin or one in `CORS_ORIGINS`: a browser sends a form's POST or a
    `no-cors` fetch from any page to any address, and no key is there to stop it (with keys, a browser never adds
    one by itself: CORS decides which pages may send it)."""
    other = origins.foreign(request.headers, request.url.scheme, rt.settings.cors_origins)
    if other is None:
        return
    page = {"null": "A page with no origin (`Origin: null`)", "another site": "A page of another site"}
    raise errors.CrossOriginRefused(
        f"{page.get(other, f'A page of `{other[:100]}`')} may not call the API in open mode "
        "(no API key): list its origin in CORS_ORIGINS (`*` does not count without a key), or create a key with "
        "`agents keys create` and send it."
    )


async def local_in_open_mode(request: Request, rt: RuntimeDep) -> None:
    """A route that needs no key (the playground's static files) still refuses, in open mode, a `Host` that is not
    this machine's, as every API route does."""
    async with rt.sessions() as s:
        if await _open(s, rt):
            _local(rt, request)


# Documents the scheme in OpenAPI; the header itself is read by `_identify`, which says what is wrong with it.
_bearer = HTTPBearer(auto_error=False, description="An API key (`agents keys create`); none in open mode.")
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]


async def principal(
    request: Request, rt: RuntimeDep, s: Annotated[AsyncSession, Depends(session)], _: Bearer
) -> Principal:
    """The caller, checked on the request's own session (one connection per request)."""
    return await _identify(s, rt, request, request.headers.get("authorization"))


async def stream_principal(request: Request, rt: RuntimeDep, _: Bearer = None) -> Principal:
    """The caller of a stream, checked on a short session of its own: a stream holds no request-scoped session."""
    async with rt.sessions() as s:
        return await _identify(s, rt, request, request.headers.get("authorization"))


async def stream_reader(
    request: Request,
    rt: RuntimeDep,
    _: Bearer,
    token: Annotated[str | None, Query(description="a stream token, for browsers", max_length=4096)] = None,
) -> Principal:
    """The caller of a stream route: as `stream_principal`, or a stream token (`POST /stream-tokens`) in the URL,
    for this stream, whose key is still valid (or, minted in open mode, while the server is still open)."""
    if token is None:
        return await stream_principal(request, rt)
    thread_id = request.path_params.get("thread_id")
    scope = str(thread_id) if thread_id else tokens.EVENTS
    who = tokens.read(rt.tokens, token, scope, rt.settings.stream_token_seconds)
    async with rt.sessions() as s:
        if who.key_id is not None and await keys.revoked(s, {who.key_id}):
            raise errors.Unauthorized("The key this stream token was minted with has been revoked.")
        if who.key_id is None and not await _open(s, rt):
            raise errors.Unauthorized("This stream token was minted in open mode, which has ended.")
    return who


async def catalog(rt: RuntimeDep) -> Catalog:
    return rt.catalog


async def settings(rt: RuntimeDep) -> Settings:
    return rt.settings


async def fernet(rt: RuntimeDep) -> Fernet:
    return rt.fernet


async def hub(rt: RuntimeDep) -> Hub:
    return _hub(rt)


async def meter(rt: RuntimeDep) -> Meter:
    return rt.meter


async def env_limits(rt: RuntimeDep) -> environment.Limits:
    """How much env one thread, user or the instance may hold (`Settings.env_max_*`)."""
    return environment.Limits(rt.settings.env_max_variables, rt.settings.env_max_value_bytes)


SessionsDep = Annotated[async_sessionmaker[AsyncSession], Depends(sessions)]
SessionDep = Annotated[AsyncSession, Depends(session)]
CurrentUser = Annotated[Principal, Depends(principal)]
StreamUser = Annotated[Principal, Depends(stream_principal)]
StreamReader = Annotated[Principal, Depends(stream_reader)]
CatalogDep = Annotated[Catalog, Depends(catalog)]
SettingsDep = Annotated[Settings, Depends(settings)]
FernetDep = Annotated[Fernet, Depends(fernet)]
HubDep = Annotated[Hub, Depends(hub)]
MeterDep = Annotated[Meter, Depends(meter)]
EnvLimits = Annotated[environment.Limits, Depends(env_limits)]

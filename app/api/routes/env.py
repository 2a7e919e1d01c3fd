"""User and instance env: the caller's own values, and (admin keys) the instance's; secret values never leave."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path

from app import environment, errors
from app.api import bodies, schemas
from app.api.deps import CurrentUser, EnvLimits, FernetDep, SessionDep
from app.keys import Principal

router = APIRouter(tags=["env"], route_class=bodies.Route)

Scope = Literal["user", "instance"]
Name = Annotated[str, Path(json_schema_extra=schemas.ENV_NAME)]

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": schemas.Error},
    401: {"model": schemas.Error},
    403: {"model": schemas.Error},
}
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    413: {"model": schemas.Error},
    422: {"model": schemas.Error},
}


def _owner(scope: Scope, who: Principal) -> str:
    """Whose values a caller reaches in a scope: their own, or (admins only) the instance's."""
    if scope == "user":
        return who.user_id
    if not who.admin:
        raise errors.Forbidden("Instance env needs an admin key (`agents keys create --admin`).")
    return environment.INSTANCE


@router.get("/env/{scope}", operation_id="listEnvVariables", responses=ERRORS)
async def list_env(scope: Scope, session: SessionDep, who: CurrentUser) -> schemas.EnvList:
    """The scope's names and types; text values shown, secret values null."""
    values, types = await environment.public(session, scope, _owner(scope, who))
    return schemas.EnvList(env=values, env_types=types)


@router.get("/env/{scope}/{name}", operation_id="getEnvVariable", responses={**ERRORS, 404: {"model": schemas.Error}})
async def get_env(scope: Scope, name: Name, session: SessionDep, who: CurrentUser) -> schemas.EnvVariable:
    """One value (null when secret)."""
    values, types = await environment.public(session, scope, _owner(scope, who))
    if name not in types:
        raise errors.NotFound(f"No {scope} variable `{name}`.")
    return schemas.EnvVariable(name=name, type=types[name], value=values[name])


@router.put("/env/{scope}/{name}", operation_id="putEnvVariable", responses=WRITE_ERRORS)
async def put_env(
    scope: Scope,
    name: Name,
    body: schemas.EnvIn,
    session: SessionDep,
    who: CurrentUser,
    fernet: FernetDep,
    limits: EnvLimits,
) -> schemas.EnvVariable:
    """Set a value; `type: "secret"` stores it encrypted and it is never returned. 413 past the env limits."""
    owner = _owner(scope, who)
    environment.check({name: body.value}, limits)
    secret = {name} if body.type == "secret" else set()
    await environment.put(session, fernet, scope, owner, {name: body.value}, secret, most=limits.variables)
    await session.commit()
    return schemas.EnvVariable(name=name, type=body.type, value=None if body.type == "secret" else body.value)


@router.delete(
    "/env/{scope}/{name}", operation_id="deleteEnvVariable", responses={**ERRORS, 404: {"model": schemas.Error}}
)
async def delete_env(scope: Scope, name: Name, session: SessionDep, who: CurrentUser) -> schemas.EnvVariable:
    """Remove a value; 404 when there is none."""
    owner = _owner(scope, who)
    values, types = await environment.public(session, scope, owner)
    if name not in types or await environment.remove(session, scope, owner, [name]) == 0:
        raise errors.NotFound(f"No {scope} variable `{name}`.")
    await session.commit()
    return schemas.EnvVariable(name=name, type=types[name], value=values[name])

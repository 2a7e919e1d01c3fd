"""Variables of the caller (`user`) and of the instance (`instance`, admin keys only)."""

from __future__ import annotations

from typing import Literal

from agents_client import call, models
from agents_client.call import Call

Scope = Literal["user", "instance"]


def _path(scope: Scope, name: str | None = None) -> str:
    return f"/env/{scope}" if name is None else f"/env/{scope}/{call.segment(name)}"


def _list(scope: Scope) -> Call[models.EnvList]:
    return Call("GET", _path(scope), call.model(models.EnvList))


def _one(method: str, scope: Scope, name: str, body: object = None) -> Call[models.EnvVariable]:
    return Call(method, _path(scope, name), call.model(models.EnvVariable), json=body)


class Env:
    def __init__(self, send: call.Sender) -> None:
        self._send = send

    def list(self, scope: Scope = "user") -> models.EnvList:
        """The scope's names and types; text values shown, secret ones None."""
        return self._send(_list(scope))

    def get(self, name: str, scope: Scope = "user") -> models.EnvVariable:
        return self._send(_one("GET", scope, name))

    def set(self, name: str, value: str, *, secret: bool = False, scope: Scope = "user") -> models.EnvVariable:
        """Set a value; a secret is stored encrypted and never returned."""
        return self._send(_one("PUT", scope, name, {"value": value, "type": "secret" if secret else "text"}))

    def delete(self, name: str, scope: Scope = "user") -> models.EnvVariable:
        return self._send(_one("DELETE", scope, name))


class AsyncEnv:
    def __init__(self, send: call.AsyncSender) -> None:
        self._send = send

    async def list(self, scope: Scope = "user") -> models.EnvList:
        """The scope's names and types; text values shown, secret ones None."""
        return await self._send(_list(scope))

    async def get(self, name: str, scope: Scope = "user") -> models.EnvVariable:
        return await self._send(_one("GET", scope, name))

    async def set(self, name: str, value: str, *, secret: bool = False, scope: Scope = "user") -> models.EnvVariable:
        """Set a value; a secret is stored encrypted and never returned."""
        return await self._send(_one("PUT", scope, name, {"value": value, "type": "secret" if secret else "text"}))

    async def delete(self, name: str, scope: Scope = "user") -> models.EnvVariable:
        return await self._send(_one("DELETE", scope, name))

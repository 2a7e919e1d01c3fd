"""The agents the server hosts."""

from __future__ import annotations

from agents_client import call, models
from agents_client.call import Call


def _list() -> Call[list[models.Agent]]:
    return Call("GET", "/agents", call.models_of(models.Agent))


def _get(name: str) -> Call[models.AgentDetail]:
    return Call("GET", f"/agents/{call.segment(name)}", call.model(models.AgentDetail))


class Agents:
    def __init__(self, send: call.Sender) -> None:
        self._send = send

    def list(self) -> list[models.Agent]:
        return self._send(_list())

    def get(self, name: str) -> models.AgentDetail:
        """One agent, with its sides and prompts."""
        return self._send(_get(name))


class AsyncAgents:
    def __init__(self, send: call.AsyncSender) -> None:
        self._send = send

    async def list(self) -> list[models.Agent]:
        return await self._send(_list())

    async def get(self, name: str) -> models.AgentDetail:
        """One agent, with its sides and prompts."""
        return await self._send(_get(name))

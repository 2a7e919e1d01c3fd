"""The scoped-variables bootstrap: a subagent that needs values only its creator may give waits as a variables
request (its id comes in the parent's tool result, `metadata.error_data.request_id`, or in an `event` event of type
`subagent_env_required`); `get` names what is missing, `provide` gives it and the subagent starts."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from agents_client import call, models
from agents_client.call import Call, ThreadRef


def _path(thread: ThreadRef, request: str | uuid.UUID) -> str:
    return call.thread_path(thread, "variables", call.segment(request))


def _get(thread: ThreadRef, request: str | uuid.UUID) -> Call[models.VariableRequest]:
    return Call("GET", _path(thread, request), call.model(models.VariableRequest))


def _provide(thread: ThreadRef, request: str | uuid.UUID, env: Mapping[str, str]) -> Call[models.VariablesDone]:
    return Call("POST", _path(thread, request), call.model(models.VariablesDone), json={"env": dict(env)})


class Variables:
    def __init__(self, send: call.Sender) -> None:
        self._send = send

    def get(self, thread: ThreadRef, request: str | uuid.UUID) -> models.VariableRequest:
        """The names the waiting subagent requires, and those still missing (never values)."""
        return self._send(_get(thread, request))

    def provide(self, thread: ThreadRef, request: str | uuid.UUID, env: Mapping[str, str]) -> models.VariablesDone:
        """Give the missing values: the subagent is created and starts (400 `missing_variables` while names are
        still missing, 409 `already_used` the second time)."""
        return self._send(_provide(thread, request, env))


class AsyncVariables:
    def __init__(self, send: call.AsyncSender) -> None:
        self._send = send

    async def get(self, thread: ThreadRef, request: str | uuid.UUID) -> models.VariableRequest:
        """The names the waiting subagent requires, and those still missing (never values)."""
        return await self._send(_get(thread, request))

    async def provide(
        self, thread: ThreadRef, request: str | uuid.UUID, env: Mapping[str, str]
    ) -> models.VariablesDone:
        """Give the missing values: the subagent is created and starts (400 `missing_variables` while names are
        still missing, 409 `already_used` the second time)."""
        return await self._send(_provide(thread, request, env))

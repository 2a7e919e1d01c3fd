"""A thread's scheduled effects: list them, cancel one that has not started."""

from __future__ import annotations

import uuid

from agents_client import call, models
from agents_client.call import Call, ThreadRef


def _list(thread: ThreadRef) -> Call[models.EffectList]:
    return Call("GET", call.thread_path(thread, "effects"), call.model(models.EffectList))


def _cancel(thread: ThreadRef, effect: str | uuid.UUID) -> Call[models.Effect]:
    path = call.thread_path(thread, "effects", call.segment(effect), "cancel")
    return Call("POST", path, call.model(models.Effect))


class Effects:
    def __init__(self, send: call.Sender) -> None:
        self._send = send

    def list(self, thread: ThreadRef) -> models.EffectList:
        """The thread's effects by due time, whatever their status."""
        return self._send(_list(thread))

    def cancel(self, thread: ThreadRef, effect: str | uuid.UUID) -> models.Effect:
        """Cancel an effect that has not started (409 `effect_not_cancellable` once it has)."""
        return self._send(_cancel(thread, effect))


class AsyncEffects:
    def __init__(self, send: call.AsyncSender) -> None:
        self._send = send

    async def list(self, thread: ThreadRef) -> models.EffectList:
        """The thread's effects by due time, whatever their status."""
        return await self._send(_list(thread))

    async def cancel(self, thread: ThreadRef, effect: str | uuid.UUID) -> models.Effect:
        """Cancel an effect that has not started (409 `effect_not_cancellable` once it has)."""
        return await self._send(_cancel(thread, effect))

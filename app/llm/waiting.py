"""An execution's place among a worker's executions at work (`WORKER_ACTIVE`), given up while it waits on a model.

A worker runs up to `WORKER_CONCURRENCY` executions, most of them, with a real model, waiting on its stream: that
costs memory, not CPU. The work between (steps, their transactions, tools) is bounded apart, so that a worker full
of CPU-bound turns (a model that answers at once) does not interleave hundreds of them on one event loop, each
transaction then holding its connection across hundreds of other tasks' turns. The worker gives each execution a
`Slot` (`current`); the model chain (`retry.FallbackModel`) gives it up for the call and takes it back after.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar


class Slot:
    """One execution's hold on a permit of the worker's `slots`; its model calls (several at once, from calls of
    one answer run together) give it up while any of them waits."""

    def __init__(self, slots: asyncio.Semaphore) -> None:
        self._slots = slots
        self._held = False
        self._away = 0  # model calls of this execution in flight

    async def take(self) -> None:
        """Wait for a permit (the execution starts, or its last model call in flight returned)."""
        if not self._held:
            await self._slots.acquire()
            self._held = True

    def release(self) -> None:
        """Give the permit back, if held (the execution ended)."""
        if self._held:
            self._held = False
            self._slots.release()

    def away(self) -> None:
        """A model call starts: the permit goes to another execution while it waits."""
        self._away += 1
        self.release()

    async def back(self) -> None:
        """A model call returned: the permit is taken back once none is in flight."""
        self._away -= 1
        if self._away == 0:
            await self.take()


current: ContextVar[Slot | None] = ContextVar("waiting_slot", default=None)

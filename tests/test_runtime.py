"""The composition root: what a process opens for the API and for a worker pool, and how it stops."""

from __future__ import annotations

import asyncio

import pytest

from app import catalog
from app.runtime import Runtime
from app.settings import Settings
from app.worker import Worker


async def test_a_worker_alone_has_no_api_and_stops_its_pool_as_it_closes(settings: Settings) -> None:
    async with Runtime.open(settings, catalog.empty(), api=False, worker=True) as runtime:
        assert runtime.hub is None and not runtime.open_mode
        assert runtime.worker is not None
        runtime.stopping.set()  # as a SIGTERM does
        await asyncio.wait_for(runtime.until_stopped(), 5)
        assert not runtime.worker.done()  # the pool stops as the runtime closes, not before
    assert runtime.worker.done() and runtime.worker.exception() is None


async def test_a_worker_pool_that_fails_ends_the_wait_and_its_error_is_raised(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing(self: Worker, stop: asyncio.Event) -> None:
        raise RuntimeError("the pool failed")

    monkeypatch.setattr(Worker, "run", failing)
    with pytest.raises(RuntimeError, match="the pool failed"):
        async with Runtime.open(settings, catalog.empty(), api=False, worker=True) as runtime:
            await asyncio.wait_for(runtime.until_stopped(), 5)


async def test_the_api_alone_runs_no_worker_pool(settings: Settings) -> None:
    async with Runtime.open(settings, catalog.empty(), api=True, worker=False) as runtime:
        assert runtime.hub is not None and runtime.worker is None
        assert runtime.open_mode  # loopback, and no key yet


async def test_a_runtime_runs_the_api_or_a_worker_pool(settings: Settings) -> None:
    with pytest.raises(ValueError, match="the API, a worker pool, or both"):
        async with Runtime.open(settings, catalog.empty(), api=False, worker=False):
            pass

"""The C heap's free memory handed back to the system (`app/heap.py`), and the worker doing it on a thread."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app import heap
from app.settings import Settings
from app.worker import Worker


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not heap.supported(), reason="the C library has no malloc_trim")
def test_trim_gives_back_free_pages_that_survivors_pin_inside_the_heap() -> None:
    """~100 MB of 4 KB buffers (over CPython's small-object size: from malloc, under its mmap threshold: inside the
    heap), one in fifty kept: glibc cannot give the free pages between the survivors back on its own; `trim` does."""
    chunks = [bytes(4000) + i.to_bytes(4, "little") for i in range(25_000)]
    kept = chunks[::50]
    del chunks
    before = rss_mb()
    heap.trim()
    after = rss_mb()
    assert len(kept) == 500
    assert before - after > 50, (before, after)


async def test_the_worker_trims_its_heap_on_a_thread_of_its_own(settings: Settings, monkeypatch: Any) -> None:
    loop, loop_thread = asyncio.get_running_loop(), threading.current_thread()
    seen: list[threading.Thread] = []
    thrice = asyncio.Event()

    def trim() -> bool:
        seen.append(threading.current_thread())
        if len(seen) == 3:
            loop.call_soon_threadsafe(thrice.set)
        return True

    monkeypatch.setattr(heap, "trim", trim)
    monkeypatch.setattr(heap, "supported", lambda: True)
    worker = Worker(settings, None, SimpleNamespace(meter=None))  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(worker._trimming(stop, every=0.01))
    await asyncio.wait_for(thrice.wait(), 5)
    stop.set()
    await asyncio.wait_for(task, 1)
    assert seen and all(t is not loop_thread for t in seen)

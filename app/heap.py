"""The process's C heap: memory freed inside it handed back to the system.

CPython takes what it does not keep in its own small-object arenas (strings and buffers over 512 bytes: message
contents, request bodies, rows read) from the C library's `malloc`. glibc keeps what is freed for reuse and returns it
to the system only from the top of its heaps, so a long-lived process that holds caches (a worker's histories) among
short-lived buffers keeps a growing share of free pages: the hour-long soak measured a worker's RSS creeping ~3 MB a
minute with the Python heap flat, and `malloc_trim` giving back ~35 MB of it each time. `trim` does that; it is a no-op
where the C library has no `malloc_trim` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        found: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return found


def trim() -> bool:
    """Hand the free memory at the top and inside the C heap back to the system (glibc's `malloc_trim(0)`); whether
    anything was returned. It takes the allocator's locks for a few milliseconds to tens of them and releases the GIL
    meanwhile: call it from a thread (`asyncio.to_thread`), not on the event loop."""
    found = _malloc_trim()
    return bool(found(0)) if found is not None else False


def supported() -> bool:
    """Whether `trim` can do anything here."""
    return _malloc_trim() is not None

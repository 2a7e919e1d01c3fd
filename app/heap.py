"""The process's C heap: memory freed inside it handed back to the system.

CPython takes what it does not keep in its own small-object arenas (strings and buffers over 512 bytes: message
contents, request bodies, rows read) from the C library's `malloc`. glibc keeps what is freed for reuse and returns it
to the system only from the top of its heaps, so a long-lived process that holds caches (a worker's histories) among
short-lived buffers keeps a growing share of free pages: under the soak `malloc_trim` gave 30-35 MB back from a
worker every two minutes (`bench/README.md`, "Soak"). `trim` does that; it is a no-op where the C library has no
`malloc_trim` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    """glibc's `malloc_trim` among the symbols the process already has (no library search, no subprocess), or None."""
    try:
        found = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    found.argtypes = [ctypes.c_size_t]
    found.restype = ctypes.c_int
    return found


def trim() -> bool:
    """Hand the free memory at the top and inside the C heap back to the system (glibc's `malloc_trim(0)`); whether
    anything was returned. It takes the allocator's arena locks for a few milliseconds to tens of them and releases
    the GIL meanwhile: call it from a thread (`asyncio.to_thread`), where it stalls the event loop only when the loop
    itself needs the allocator at that moment."""
    found = _malloc_trim()
    return bool(found(0)) if found is not None else False


def supported() -> bool:
    """Whether `trim` can do anything here."""
    return _malloc_trim() is not None

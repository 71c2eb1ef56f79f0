"""The C heap's free pages handed back to the kernel now and then (glibc's ``malloc_trim``).

glibc gives freed memory back to the kernel only from the top of its heap; the holes that a
burst of work leaves inside it (a start of 110 pods: models, CRI replies, threads' buffers)
stay resident although free, ~1 MiB at rest. ``malloc_trim(0)`` releases the free pages inside
the heap as well, in well under a millisecond. Elsewhere (musl) there is nothing to call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import trio

__all__ = ["TRIM_PERIOD", "malloc_trim", "trim_heap_forever"]

TRIM_PERIOD = 10.0


def malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


async def trim_heap_forever(period: float = TRIM_PERIOD,
                            trim: Callable[[], object] | None = None) -> None:
    """Trim the heap every ``period`` seconds (``trim``: glibc's, by default); returns at
    once where there is nothing to trim with."""
    trim = trim or malloc_trim()
    if trim is None:
        return
    while True:
        await trio.sleep(period)
        trim()

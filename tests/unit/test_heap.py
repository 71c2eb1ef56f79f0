"""heap: glibc's malloc_trim found and called every period."""

from __future__ import annotations

import ctypes

import pytest
import trio
import trio.testing

from trio_kubelet import heap
from trio_kubelet.heap import TRIM_PERIOD, malloc_trim, trim_heap_forever


def test_malloc_trim_is_found_and_called() -> None:
    trim = malloc_trim()
    assert trim is not None, "glibc (the CI's and the nodes' C library) has malloc_trim"
    blocks = [ctypes.create_string_buffer(4096) for _ in range(4096)]
    del blocks[::2]
    assert trim() in (0, 1)


async def test_trims_every_period(autojump_clock: trio.testing.MockClock) -> None:
    calls: list[float] = []
    with trio.move_on_after(TRIM_PERIOD * 3 + 1):
        await trim_heap_forever(trim=lambda: calls.append(trio.current_time()))
    assert calls == [TRIM_PERIOD, TRIM_PERIOD * 2, TRIM_PERIOD * 3]


async def test_without_malloc_trim_there_is_nothing_to_do(
        monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock) -> None:
    monkeypatch.setattr(heap, "malloc_trim", lambda: None)
    with trio.fail_after(1):
        await trim_heap_forever()

"""At most a few pod starts in flight per CPU; a slow one stops holding the others back."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_kubelet.reconcile.start_order import PER_CPU, SLOW, StartOrder


async def _start(order: StartOrder, takes: float, began: list[float]) -> None:
    async with order.pod_start():
        began.append(trio.current_time())
        await trio.sleep(takes)


async def test_starts_beyond_the_limit_wait_for_one_to_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order, began = StartOrder(cpus=2), []
    async with trio.open_nursery() as nursery:
        for index in range(2 * PER_CPU):
            nursery.start_soon(_start, order, 1.0 + index, began)
        await trio.sleep(0.5)
        nursery.start_soon(_start, order, 1.0, began)  # waits for the first to end
        nursery.start_soon(_start, order, 1.0, began)  # and this one for the second
    assert began == [0.0] * 2 * PER_CPU + [1.0, 2.0]


async def test_a_slow_start_stops_counting_after_a_while(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order, began = StartOrder(cpus=1), []
    async with trio.open_nursery() as nursery:
        for _ in range(PER_CPU):
            nursery.start_soon(_start, order, 3600.0, began)  # CNI plugins that hang
        await trio.sleep(0.1)
        nursery.start_soon(_start, order, 1.0, began)
        nursery.start_soon(_start, order, 1.0, began)
        await trio.sleep(SLOW + 2.0)
        # both go once the hung ones have been in flight SLOW seconds, and do not wait
        # for each other: the limit counts only the starts that are getting somewhere
        assert began == [0.0] * PER_CPU + [SLOW, SLOW]
        nursery.cancel_scope.cancel()


async def test_slow_starts_at_worst_let_everyone_go(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order, began = StartOrder(cpus=1), []
    async with trio.open_nursery() as nursery:
        for _ in range(3 * PER_CPU):
            nursery.start_soon(_start, order, 3600.0, began)
        await trio.sleep(3 * SLOW)
        nursery.cancel_scope.cancel()
    assert began == pytest.approx([0.0] * PER_CPU + [SLOW] * PER_CPU + [2 * SLOW] * PER_CPU)

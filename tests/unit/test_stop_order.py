"""A sandbox stop waits while the node's killed containers keep going, and not much longer."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_kubelet.reconcile.stop_order import STALL, WAIT_LIMIT, StopOrder


async def _stop(order: StopOrder, grace: int, takes: float) -> None:
    with order.container_stop(grace):
        await trio.sleep(takes)


async def _turn_after(order: StopOrder, delay: float) -> float:
    """How long a sandbox stop asked for ``delay`` s from now waits for its turn."""
    await trio.sleep(delay)
    asked = trio.current_time()
    await order.sandbox_turn()
    return trio.current_time() - asked


async def test_no_container_stopping_means_no_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert await _turn_after(StopOrder(), 0) == 0


async def test_a_container_in_its_grace_period_holds_nobody_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order = StopOrder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop, order, 30, 20.0)  # SIGTERM handled slowly, no SIGKILL yet
        assert await _turn_after(order, 1.0) == 0
        assert not order.killing()


async def test_waits_while_killed_containers_keep_going(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order = StopOrder()
    async with trio.open_nursery() as nursery:
        for index in range(10):  # all killed at 2 s; the runtime reports one every 0.5 s
            nursery.start_soon(_stop, order, 2, 2.5 + index * 0.5)
        waited = await _turn_after(order, 2.6)  # the sandbox of the first one to go
        assert trio.current_time() == 2.5 + 9 * 0.5
        assert waited == pytest.approx(2.5 + 9 * 0.5 - 2.6)
        assert not order.killing()


async def test_a_container_that_never_goes_holds_others_up_for_a_stall_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order = StopOrder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop, order, 2, 60.0)  # an exit the runtime never reports
        nursery.start_soon(_stop, order, 2, 3.0)
        waited = await _turn_after(order, 3.1)  # the second one's sandbox
        assert waited == pytest.approx(STALL - 0.1)
        assert order.killing()
        nursery.cancel_scope.cancel()


async def test_never_waits_longer_than_the_limit(autojump_clock: trio.testing.MockClock) -> None:
    order = StopOrder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop, order, 2, 3600.0)  # never goes
        for index in range(100):  # a stream of kills, one returning every 0.5 s
            nursery.start_soon(_stop, order, 2, 2.5 + index * 0.5)
        waited = await _turn_after(order, 2.6)
        assert waited == pytest.approx(WAIT_LIMIT)
        nursery.cancel_scope.cancel()

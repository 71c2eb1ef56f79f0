"""A sandbox stop waits for the containers being killed elsewhere, and never longer than 2 s."""

from __future__ import annotations

import trio
import trio.testing

from trio_kubelet.reconcile.stop_order import SANDBOX_WAIT_LIMIT, StopOrder


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


async def test_waits_until_the_killed_containers_are_gone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order = StopOrder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop, order, 2, 2.5)  # killed at 2 s, gone at 2.5 s
        nursery.start_soon(_stop, order, 2, 3.0)  # killed at 2 s, gone at 3 s
        waited = await _turn_after(order, 2.2)
        assert waited == 3.0 - 2.2
        assert not order.killing()


async def test_never_waits_longer_than_the_limit(autojump_clock: trio.testing.MockClock) -> None:
    order = StopOrder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop, order, 2, 60.0)  # an exit the runtime never reports
        waited = await _turn_after(order, 2.0)
        assert waited == SANDBOX_WAIT_LIMIT
        assert order.killing()
        nursery.cancel_scope.cancel()

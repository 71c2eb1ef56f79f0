"""The pod lifecycle event generator: relist the runtime every period and report changes."""

from __future__ import annotations

import logging

import trio

from trio_kubelet.core.pleg import PlegState, lifecycle_events, snapshot
from trio_kubelet.events import Event, PodLifecycleEvent, RelistDone
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.errors import CRIError
from trio_kubelet.runtime.inspect import relist

log = logging.getLogger("trio_kubelet.pleg")

RELIST_PERIOD = 1.0


async def run_pleg(
    send: trio.MemorySendChannel[Event], client: CRIClient, *, period: float = RELIST_PERIOD
) -> None:
    """Relist every ``period`` seconds and send one event per container state change.

    A failed relist keeps the previous record, so the changes it hid are reported
    by the next successful relist instead of being lost.
    """
    previous: dict[str, tuple[str, PlegState]] = {}
    failing = False
    async with send:
        while True:
            started = trio.current_time()
            try:
                pods = await relist(client)
            except CRIError as err:
                if not failing:
                    log.warning("PLEG relist failed: %s", err)
                failing = True
                await send.send(RelistDone(ok=False, error=str(err)))
            else:
                if failing:
                    log.info("PLEG relist recovered")
                failing = False
                current = snapshot(pods.values())
                for change in lifecycle_events(previous, current):
                    await send.send(
                        PodLifecycleEvent(
                            pod_uid=change.pod_uid,
                            type=change.type,
                            container_id=change.container_id,
                        )
                    )
                previous = current
                await send.send(RelistDone(ok=True, duration=trio.current_time() - started))
            await trio.sleep_until(started + period)

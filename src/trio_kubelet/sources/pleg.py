"""The pod lifecycle event generator: relist the runtime every period and report changes."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping

import trio

from trio_kubelet.core.observed import RuntimePodStatus
from trio_kubelet.core.pleg import PlegState, lifecycle_events, snapshot
from trio_kubelet.events import Event, PodLifecycleEvent, RelistDone
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.errors import CRIError
from trio_kubelet.runtime.inspect import relist

log = logging.getLogger("trio_kubelet.pleg")

RELIST_PERIOD = 1.0


def _report(
    metrics: AgentMetrics,
    pods: dict[str, RuntimePodStatus],
    duration: float,
    interval: float | None,
    wall_time: float,
) -> None:
    by_state: Counter[str] = Counter()
    running_pods = 0
    for pod in pods.values():
        states = [c.state.value for c in pod.containers]
        by_state.update(states)
        running_pods += "running" in states
    metrics.record_relist(
        duration=duration,
        interval=interval,
        wall_time=wall_time,
        running_pods=running_pods,
        containers_by_state=by_state,
    )


async def run_pleg(
    send: trio.MemorySendChannel[Event],
    client: CRIClient,
    *,
    period: float = RELIST_PERIOD,
    metrics: AgentMetrics | None = None,
    on_relist: Callable[[Mapping[str, RuntimePodStatus]], None] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Relist every ``period`` seconds and send one event per container state change.

    A failed relist keeps the previous record, so the changes it hid are reported
    by the next successful relist instead of being lost. ``on_relist`` is given
    each successful relist's pods (the OOM watcher's `update`), so no one else
    lists the runtime for the same answer; it must return at once.
    """
    previous: dict[str, tuple[str, PlegState]] = {}
    failing = False
    last_start: float | None = None
    task_status.started()
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
                if on_relist is not None:
                    on_relist(pods)
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
                duration = trio.current_time() - started
                if metrics is not None:
                    interval = started - last_start if last_start is not None else None
                    _report(metrics, pods, duration, interval, time.time())
                last_start = started
                await send.send(RelistDone(ok=True, duration=duration))
            await trio.sleep_until(started + period)

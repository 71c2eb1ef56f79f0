"""A live pod table for a terminal, printed like ``kubectl get pods -w``.

The row logic follows kubectl's pod printer: the STATUS column shows the most
telling reason (Init:1/2, CrashLoopBackOff, Completed, Error, …), not just the phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

from trio_kubelet.clock import TrioWallClock
from trio_kubelet.core.timestamps import parse_time
from trio_kubelet.model.pod import ContainerStatus, Pod, is_sidecar
from trio_kubelet.status.store import PodStatusStore

COLUMNS = ("NAME", "PHASE", "READY", "STATUS", "RESTARTS", "AGE")
WIDTHS = (34, 10, 6, 26, 9, 6)


@dataclass(frozen=True)
class PodRow:
    name: str
    phase: str
    ready: str
    status: str
    restarts: int
    started: float

    def render(self, now: float) -> str:
        cells = (
            self.name,
            self.phase,
            self.ready,
            self.status,
            str(self.restarts),
            human_age(now - self.started),
        )
        return "".join(cell.ljust(width) for cell, width in zip(cells, WIDTHS, strict=True))


def human_age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def _terminated_reason(status: ContainerStatus) -> str | None:
    terminated = status.state.terminated
    if terminated is None:
        return None
    if terminated.reason:
        return terminated.reason
    if terminated.signal:
        return f"Signal:{terminated.signal}"
    return f"ExitCode:{terminated.exit_code}"


def pod_status_text(pod: Pod) -> str:
    """kubectl's STATUS column for one pod."""
    status = pod.status
    if pod.metadata.deletion_timestamp:
        return "Terminating"
    init_progress = _init_progress(pod)
    if init_progress is not None:
        return init_progress
    reason = status.reason or status.phase
    running = False
    for container in reversed(status.container_statuses):
        if container.state.waiting is not None and container.state.waiting.reason:
            reason = container.state.waiting.reason
        elif container.state.terminated is not None:
            reason = _terminated_reason(container) or reason
        elif container.state.running is not None and container.ready:
            running = True
    if running and reason == "Completed":
        ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions)
        reason = "Running" if ready else "NotReady"
    return reason


def _init_progress(pod: Pod) -> str | None:
    """``Init:…`` while init containers are still in the way, counting sidecars as kubectl does."""
    inits = pod.spec.init_containers
    by_name = {s.name: s for s in pod.status.init_container_statuses}
    for index, init in enumerate(inits):
        init_status = by_name.get(init.name)
        if init_status is None:
            return f"Init:{index}/{len(inits)}"
        terminated = init_status.state.terminated
        if terminated is not None and terminated.exit_code == 0:
            continue
        if is_sidecar(init) and init_status.started:
            continue
        if terminated is not None:
            return f"Init:{_terminated_reason(init_status)}"
        waiting = init_status.state.waiting
        if waiting is not None and waiting.reason and waiting.reason != "PodInitializing":
            return f"Init:{waiting.reason}"
        return f"Init:{index}/{len(inits)}"
    return None


def pod_row(pod: Pod, now: float) -> PodRow:
    status = pod.status
    counted = [
        *status.container_statuses,
        *(
            s
            for s in status.init_container_statuses
            if any(c.name == s.name and is_sidecar(c) for c in pod.spec.init_containers)
        ),
    ]
    total = len(pod.spec.containers) + sum(1 for c in pod.spec.init_containers if is_sidecar(c))
    ready = sum(1 for s in counted if s.ready)
    restarts = sum(
        s.restart_count for s in (*status.init_container_statuses, *status.container_statuses)
    )
    started = parse_time(status.start_time) or now
    return PodRow(
        name=pod.metadata.name,
        phase=status.phase,
        ready=f"{ready}/{total}",
        status=pod_status_text(pod),
        restarts=restarts,
        started=started,
    )


def header() -> str:
    return "".join(name.ljust(width) for name, width in zip(COLUMNS, WIDTHS, strict=True))


async def print_pod_changes(store: PodStatusStore, out: TextIO, clock: TrioWallClock) -> None:
    """Print a header, then one line each time a pod's row changes (or it goes away)."""
    print(header(), file=out, flush=True)
    shown: dict[str, PodRow] = {}
    while True:
        now = clock.now()
        current = {pod.metadata.uid: pod_row(pod, now) for pod in store.pods()}
        for uid, row in current.items():
            if shown.get(uid) != row:
                print(row.render(now), file=out, flush=True)
        for uid in shown.keys() - current.keys():
            gone = shown[uid]
            print(
                PodRow(gone.name, "-", "0/0", "Deleted", gone.restarts, gone.started).render(now),
                file=out,
                flush=True,
            )
        shown = current
        await store.wait_changed()

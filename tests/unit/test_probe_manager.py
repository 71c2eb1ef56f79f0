"""probes.manager: when workers tick besides their period (MockClock, a recording prober)."""

from __future__ import annotations

import math
from typing import Any

import trio
import trio.testing

from trio_kubelet.core.probes import ProbeResult
from trio_kubelet.events import Event
from trio_kubelet.model.pod import Container, Pod, PodStatus, Probe
from trio_kubelet.probes.manager import ProbeManager
from trio_kubelet.probes.prober import ProbeOutcome
from trio_kubelet.status.store import PodStatusStore

UID = "3b7e9a10-5555-4000-8000-000000000001"
T_START = 1_795_766_400.0  # 2026-11-27T08:00:00Z, when the container started


class RecordingProber:
    """Answers every probe with FAILURE and remembers when it was asked."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def probe(self, probe: Probe, container: Container, container_id: str,
                    pod_ip: str) -> ProbeOutcome:
        self.calls.append(trio.current_time())
        return ProbeOutcome(ProbeResult.FAILURE, "not yet")

    async def aclose(self) -> None:
        pass


def pod() -> Pod:
    exec_probe: dict[str, Any] = {"exec": {"command": ["cat", "/tmp/health"]}}
    return Pod.model_validate({
        "metadata": {"name": "web", "namespace": "default", "uid": UID},
        "spec": {"containers": [{
            "name": "main", "image": "busybox",
            "readinessProbe": {**exec_probe, "periodSeconds": 30},
            "startupProbe": {**exec_probe, "periodSeconds": 5, "failureThreshold": 120},
        }]},
    })


def status(*, started: bool) -> PodStatus:
    return PodStatus.model_validate({
        "phase": "Running", "podIP": "10.88.0.5", "startTime": "2026-11-27T08:00:00Z",
        "containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": False,
            "started": started, "restartCount": 0, "containerID": "containerd://abc",
            "state": {"running": {"startedAt": "2026-11-27T08:00:00Z"}},
        }],
    })


async def test_readiness_is_probed_as_soon_as_the_container_has_started(
    autojump_clock: trio.testing.MockClock,
) -> None:
    prober, store = RecordingProber(), PodStatusStore()
    send, _receive = trio.open_memory_channel[Event](math.inf)
    manager = ProbeManager(prober, store, send,
                           wall_clock=lambda: T_START + trio.current_time(), jitter=lambda: 0.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        store.set(pod(), status(started=False))
        manager.set_pod(pod())
        await trio.sleep(12)  # the startup probe ticks every 5 s, readiness waits for it
        startup_calls = len(prober.calls)
        assert startup_calls >= 2
        # The startup probe passed (the worker published it; the pod's status says so now).
        store.set(pod(), status(started=True))
        manager.status_changed(UID)
        await trio.sleep(1)
        # Readiness runs now, not at its next 30-s tick.
        assert len(prober.calls) > startup_calls
        nursery.cancel_scope.cancel()

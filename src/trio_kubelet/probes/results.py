"""The published probe results, per pod and probe type, keyed by runtime container ID.

Owned by the sync loop, which applies every ``ProbeResultEvent`` here in event
order; pod workers read a pod's maps when they decide actions and status, and
a recording captures the maps each decision used.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from trio_kubelet.core.observed import ProbeResult
from trio_kubelet.core.probes import ProbeType
from trio_kubelet.events import ProbeResultEvent

_EMPTY: Mapping[str, ProbeResult] = MappingProxyType({})


class ProbeResults:
    def __init__(self) -> None:
        self._pods: dict[str, dict[ProbeType, dict[str, ProbeResult]]] = {}

    def apply(self, event: ProbeResultEvent) -> bool:
        """Record the event's result; True when it changed what the pod's maps say."""
        kind = ProbeType(event.probe)
        results = self._pods.setdefault(event.pod_uid, {}).setdefault(kind, {})
        if event.forget:
            results.pop(event.forget, None)
        result = ProbeResult(event.result)
        if results.get(event.container_id) is result:
            return False
        results[event.container_id] = result
        return True

    def of(self, uid: str, kind: ProbeType) -> Mapping[str, ProbeResult]:
        """The pod's published results of one probe type (read-only, live)."""
        pod = self._pods.get(uid)
        results = pod.get(kind) if pod is not None else None
        return MappingProxyType(results) if results is not None else _EMPTY

    def remove_pod(self, uid: str) -> None:
        self._pods.pop(uid, None)

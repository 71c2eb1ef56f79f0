"""What the HTTP servers may see of the agent: a read-only view plus the CRI client.

Handlers never reach into the reconciler; they read the latest published state
(pod statuses, the newest resource sample, health timestamps) and make their own
CRI calls only for streaming (logs, exec, attach, port-forward).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trio_kubelet.config import AgentOptions
from trio_kubelet.model.pod import Pod
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.status.store import PodStatusStore

# PLEG is unhealthy when it has not relisted for this long (pleg/generic.go).
PLEG_RELIST_THRESHOLD = 180.0


@dataclass
class NodeView:
    options: AgentOptions
    store: PodStatusStore
    client: CRIClient
    # trio.current_time() of the last successful relist, and of the last sync-loop iteration.
    last_relist: Callable[[], float | None]
    last_sync_loop: Callable[[], float | None]
    # The newest resource sample (sources/sampler.py), or None before the first one.
    latest_sample: Callable[[], Any] = field(default=lambda: None)
    pod_logs_dir: Path = Path("/var/log/pods")
    node_logs_dir: Path = Path("/var/log")

    def pods(self) -> list[Pod]:
        return self.store.pods()

    def find_pod(self, namespace: str, name: str) -> Pod | None:
        for pod in self.store.pods():
            if pod.metadata.namespace == namespace and pod.metadata.name == name:
                return pod
        return None

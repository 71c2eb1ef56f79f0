"""compute_pod_actions: what to kill and start so the runtime matches the pod spec.

The Go kubelet's ``computePodActions`` (kuberuntime_manager.go) as a pure function.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trio_kubelet.core.observed import ProbeResult, RuntimePodStatus
from trio_kubelet.model.pod import Container, Pod


@dataclass(frozen=True, slots=True)
class ContainerToKill:
    """A running (or unknown) container instance to stop, and why."""

    name: str
    reason: str
    message: str


@dataclass(slots=True)
class PodActions:
    """The decision for one sync of one pod.

    Indexes refer to positions in ``spec.init_containers``, ``spec.containers`` and
    ``spec.ephemeral_containers``; ``containers_to_kill`` is keyed by runtime container ID.
    """

    kill_pod: bool = False
    create_sandbox: bool = False
    sandbox_id: str = ""
    attempt: int = 0
    init_containers_to_start: list[int] = field(default_factory=list)
    containers_to_start: list[int] = field(default_factory=list)
    containers_to_kill: dict[str, ContainerToKill] = field(default_factory=dict)
    ephemeral_containers_to_start: list[int] = field(default_factory=list)


def compute_pod_actions(
    pod: Pod,
    status: RuntimePodStatus,
    *,
    liveness: Mapping[str, ProbeResult] | None = None,
    startup: Mapping[str, ProbeResult] | None = None,
) -> PodActions:
    raise NotImplementedError


def _unused(_: Container) -> None:  # placeholder so the import is used until implemented
    return None

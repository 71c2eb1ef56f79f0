"""Turn CRI answers into the core's observed runtime state (`core.observed`), per pod UID.

`relist` is the PLEG hot path: two list calls and one pass over the answers.
`inspect_pod` adds the per-object status calls that carry exit codes, reasons
and network details, for the one pod being synced.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter
from typing import Protocol

from ..core.observed import (
    ContainerState,
    RuntimeContainer,
    RuntimePodStatus,
    RuntimeSandbox,
    SandboxState,
)
from .cri.runtime import v1
from .errors import CRINotFound
from .labels import (
    CONTAINER_HASH,
    CONTAINER_NAME,
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    RESTART_COUNT,
)

__all__ = ["RuntimeReader", "group_by_pod", "inspect_pod", "relist"]

_CONTAINER_STATES = {
    v1.ContainerState.CONTAINER_CREATED: ContainerState.CREATED,
    v1.ContainerState.CONTAINER_RUNNING: ContainerState.RUNNING,
    v1.ContainerState.CONTAINER_EXITED: ContainerState.EXITED,
    v1.ContainerState.CONTAINER_UNKNOWN: ContainerState.UNKNOWN,
}
_SANDBOX_STATES = {
    v1.PodSandboxState.SANDBOX_READY: SandboxState.READY,
    v1.PodSandboxState.SANDBOX_NOTREADY: SandboxState.NOTREADY,
}
_NEWEST_FIRST = attrgetter("created_at")


class RuntimeReader(Protocol):
    """The part of `CRIClient` this module needs (lets tests pass something smaller)."""

    async def list_pod_sandbox(
        self, filter: v1.PodSandboxFilter | None = None,
    ) -> list[v1.PodSandbox]: ...

    async def list_containers(
        self, filter: v1.ContainerFilter | None = None,
    ) -> list[v1.Container]: ...

    async def container_status(self, id: str) -> v1.ContainerStatusResponse: ...

    async def pod_sandbox_status(self, id: str) -> v1.PodSandboxStatusResponse: ...


def _seconds(ns: int) -> float:
    return ns / 1e9 if ns else 0.0


def _int(value: str | None) -> int:
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


class _Pod:
    """Accumulates one pod's objects during a relist pass."""

    __slots__ = ("containers", "name", "namespace", "sandboxes")

    def __init__(self, name: str, namespace: str) -> None:
        self.name = name
        self.namespace = namespace
        self.sandboxes: list[RuntimeSandbox] = []
        self.containers: list[RuntimeContainer] = []


def _sandbox(s: v1.PodSandbox) -> RuntimeSandbox:
    meta = s.metadata
    return RuntimeSandbox(
        id=s.id, state=_SANDBOX_STATES.get(s.state, SandboxState.NOTREADY),
        attempt=meta.attempt if meta is not None else 0, created_at=_seconds(s.created_at))


def _container(c: v1.Container) -> RuntimeContainer:
    meta, annotations = c.metadata, c.annotations
    return RuntimeContainer(
        id=c.id,
        name=meta.name if meta is not None else c.labels.get(CONTAINER_NAME, ""),
        state=_CONTAINER_STATES.get(c.state, ContainerState.UNKNOWN),
        spec_hash=annotations.get(CONTAINER_HASH, ""),
        restart_count=_int(annotations.get(RESTART_COUNT)),
        attempt=meta.attempt if meta is not None else 0,
        created_at=_seconds(c.created_at),
        image=c.image.image if c.image is not None else "",
        image_ref=c.image_ref,
        sandbox_id=c.pod_sandbox_id,
    )


def group_by_pod(sandboxes: Iterable[v1.PodSandbox],
                 containers: Iterable[v1.Container]) -> dict[str, RuntimePodStatus]:
    """Group listed sandboxes and containers by our pod-UID label, newest first.

    Objects without the label were not made by a kubelet and are ignored.
    """
    pods: dict[str, _Pod] = {}
    uid_key = POD_UID
    for s in sandboxes:
        labels = s.labels
        uid = labels.get(uid_key)
        if uid is None:
            continue
        pod = pods.get(uid)
        if pod is None:
            pod = pods[uid] = _Pod(labels.get(POD_NAME, ""), labels.get(POD_NAMESPACE, ""))
        pod.sandboxes.append(_sandbox(s))
    for c in containers:
        labels = c.labels
        uid = labels.get(uid_key)
        if uid is None:
            continue
        pod = pods.get(uid)
        if pod is None:
            pod = pods[uid] = _Pod(labels.get(POD_NAME, ""), labels.get(POD_NAMESPACE, ""))
        pod.containers.append(_container(c))
    result: dict[str, RuntimePodStatus] = {}
    for uid, pod in pods.items():
        pod.sandboxes.sort(key=_NEWEST_FIRST, reverse=True)
        pod.containers.sort(key=_NEWEST_FIRST, reverse=True)
        result[uid] = RuntimePodStatus(uid=uid, name=pod.name, namespace=pod.namespace,
                                       sandboxes=tuple(pod.sandboxes),
                                       containers=tuple(pod.containers))
    return result


async def relist(client: RuntimeReader) -> dict[str, RuntimePodStatus]:
    """Every pod the runtime holds, by UID, from one ListPodSandbox and one ListContainers."""
    sandboxes = await client.list_pod_sandbox()
    containers = await client.list_containers()
    return group_by_pod(sandboxes, containers)


async def inspect_pod(client: RuntimeReader, uid: str) -> RuntimePodStatus:
    """One pod in full: listed objects plus ContainerStatus for each container and
    PodSandboxStatus for the newest sandbox. Objects removed meanwhile are skipped."""
    selector = {POD_UID: uid}
    sandboxes = await client.list_pod_sandbox(v1.PodSandboxFilter(label_selector=selector))
    listed = await client.list_containers(v1.ContainerFilter(label_selector=selector))
    base = group_by_pod(sandboxes, listed).get(uid)
    if base is None:
        return RuntimePodStatus(uid=uid)
    by_id = {c.id: c for c in listed}
    containers = []
    for brief in base.containers:
        try:
            response = await client.container_status(brief.id)
        except CRINotFound:
            continue
        if response.status is not None:
            containers.append(_detailed_container(response.status, by_id[brief.id]))
    sandboxes_out = list(base.sandboxes)
    if sandboxes_out:
        try:
            response_sb = await client.pod_sandbox_status(sandboxes_out[0].id)
        except CRINotFound:
            sandboxes_out.pop(0)
        else:
            if response_sb.status is not None:
                sandboxes_out[0] = _detailed_sandbox(response_sb.status)
    return RuntimePodStatus(uid=uid, name=base.name, namespace=base.namespace,
                            sandboxes=tuple(sandboxes_out), containers=tuple(containers))


def _detailed_container(status: v1.ContainerStatus, listed: v1.Container) -> RuntimeContainer:
    meta, annotations = status.metadata, status.annotations
    return RuntimeContainer(
        id=status.id,
        name=meta.name if meta is not None else status.labels.get(CONTAINER_NAME, ""),
        state=_CONTAINER_STATES.get(status.state, ContainerState.UNKNOWN),
        spec_hash=annotations.get(CONTAINER_HASH, ""),
        restart_count=_int(annotations.get(RESTART_COUNT)),
        attempt=meta.attempt if meta is not None else 0,
        exit_code=status.exit_code,
        reason=status.reason,
        message=status.message,
        created_at=_seconds(status.created_at),
        started_at=_seconds(status.started_at),
        finished_at=_seconds(status.finished_at),
        image=status.image.image if status.image is not None else "",
        image_ref=status.image_ref,
        sandbox_id=listed.pod_sandbox_id,
    )


def _detailed_sandbox(status: v1.PodSandboxStatus) -> RuntimeSandbox:
    linux = status.linux
    namespaces = linux.namespaces if linux is not None else None
    options = namespaces.options if namespaces is not None else None
    host_network = options is not None and options.network == v1.NamespaceMode.NODE
    network = status.network
    ip = network.ip if network is not None and not host_network else ""
    extra = tuple(p.ip for p in network.additional_ips) if network is not None else ()
    meta = status.metadata
    return RuntimeSandbox(
        id=status.id, state=_SANDBOX_STATES.get(status.state, SandboxState.NOTREADY),
        attempt=meta.attempt if meta is not None else 0,
        created_at=_seconds(status.created_at), host_network=host_network, ip=ip,
        additional_ips=extra if not host_network else ())

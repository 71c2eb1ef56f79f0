"""Turn CRI answers into the core's observed runtime state (`core.observed`), per pod UID.

`relist` is the PLEG hot path: two list calls and one pass over the answers.
Both list calls come back as upb-backed protobuf messages (`CRIClient.*_brief`),
which decode a 250-container reply in well under a millisecond and create a
Python object only for the fields read here. `inspect_pod` adds the per-object
status calls that carry exit codes, reasons and network details, for the one pod
being synced; those stay betterproto2 messages. With `TerminationMessages` it also
reads what exited containers left as their termination message, once per container.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from operator import attrgetter
from pathlib import Path
from typing import Protocol

from ..core.observed import (
    MAX_TERMINATION_LOG_BYTES,
    MAX_TERMINATION_LOG_LINES,
    MAX_TERMINATION_MESSAGE_BYTES,
    ContainerState,
    RuntimeContainer,
    RuntimePodStatus,
    RuntimeSandbox,
    SandboxState,
    wants_log_tail,
)
from ..core.pleg import RuntimeEvent, RuntimeEventType
from ..model.pod import Container, Pod
from .cri.runtime import v1
from .cri_upb.runtime.v1 import api_pb2 as upb
from .crilog import LogOptions, open_log, read_log
from .errors import CRINotFound
from .labels import (
    CONTAINER_HASH,
    CONTAINER_NAME,
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    RESTART_COUNT,
)

__all__ = [
    "RuntimeReader",
    "TerminationMessages",
    "group_by_pod",
    "inspect_pod",
    "relist",
    "runtime_event",
    "with_created",
]

# CRI enum numbers (upb gives plain ints; betterproto2 enums are ints too).
_CONTAINER_STATES: dict[int, ContainerState] = {
    upb.CONTAINER_CREATED: ContainerState.CREATED,
    upb.CONTAINER_RUNNING: ContainerState.RUNNING,
    upb.CONTAINER_EXITED: ContainerState.EXITED,
    upb.CONTAINER_UNKNOWN: ContainerState.UNKNOWN,
}
_SANDBOX_STATES: dict[int, SandboxState] = {
    upb.SANDBOX_READY: SandboxState.READY,
    upb.SANDBOX_NOTREADY: SandboxState.NOTREADY,
}
_EVENT_TYPES: dict[int, RuntimeEventType] = {
    upb.CONTAINER_CREATED_EVENT: "created",
    upb.CONTAINER_STARTED_EVENT: "started",
    upb.CONTAINER_STOPPED_EVENT: "stopped",
    upb.CONTAINER_DELETED_EVENT: "deleted",
}
# Newest first; on a creation-time tie (a coarse clock) the higher attempt is the newer one.
_NEWEST_FIRST = attrgetter("created_at", "attempt")


class RuntimeReader(Protocol):
    """The part of `CRIClient` this module needs (lets tests pass something smaller)."""

    async def list_pod_sandbox_brief(
        self, filter: v1.PodSandboxFilter | None = None,
    ) -> Sequence[upb.PodSandbox]: ...

    async def list_containers_brief(
        self, filter: v1.ContainerFilter | None = None,
    ) -> Sequence[upb.Container]: ...

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


# Each attribute read on a upb message makes a Python object, so the two builders
# below read every field they need exactly once. An unset metadata/image reads as
# an empty message (zero values), never None.


def _sandbox(s: upb.PodSandbox) -> RuntimeSandbox:
    created_at = s.created_at
    return RuntimeSandbox(
        id=s.id, state=_SANDBOX_STATES.get(s.state, SandboxState.NOTREADY),
        attempt=s.metadata.attempt, created_at=created_at / 1e9 if created_at else 0.0)


def _container(c: upb.Container, labels: Mapping[str, str]) -> RuntimeContainer:
    meta, annotations, created_at = c.metadata, c.annotations, c.created_at
    return RuntimeContainer(
        id=c.id,
        name=meta.name or labels.get(CONTAINER_NAME, ""),
        state=_CONTAINER_STATES.get(c.state, ContainerState.UNKNOWN),
        spec_hash=annotations.get(CONTAINER_HASH, ""),
        restart_count=_int(annotations.get(RESTART_COUNT)),
        attempt=meta.attempt,
        created_at=created_at / 1e9 if created_at else 0.0,
        image=c.image.image,
        image_ref=c.image_ref,
        sandbox_id=c.pod_sandbox_id,
    )


def _labelled_pod(pods: dict[str, _Pod], labels: Mapping[str, str]) -> _Pod | None:
    """The pod an object's labels name (added to ``pods`` the first time); None without our
    pod-UID label."""
    uid = labels.get(POD_UID)
    if uid is None:
        return None
    pod = pods.get(uid)
    if pod is None:
        pod = pods[uid] = _Pod(labels.get(POD_NAME, ""), labels.get(POD_NAMESPACE, ""))
    return pod


def group_by_pod(sandboxes: Iterable[upb.PodSandbox],
                 containers: Iterable[upb.Container]) -> dict[str, RuntimePodStatus]:
    """Group listed sandboxes and containers by our pod-UID label, newest first.

    Objects without the label were not made by a kubelet and are ignored.
    """
    pods: dict[str, _Pod] = {}
    for s in sandboxes:
        if (pod := _labelled_pod(pods, s.labels)) is not None:
            pod.sandboxes.append(_sandbox(s))
    for c in containers:
        labels = c.labels
        if (pod := _labelled_pod(pods, labels)) is not None:
            pod.containers.append(_container(c, labels))
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
    sandboxes = await client.list_pod_sandbox_brief()
    containers = await client.list_containers_brief()
    return group_by_pod(sandboxes, containers)


def runtime_event(message: upb.ContainerEventResponse) -> RuntimeEvent | None:
    """What PLEG reads of one GetContainerEvents reply (None: an event type CRI added later).

    The pod is the one our pod-UID label names on the sandbox status the event carries, or
    on the event's own container among the statuses it carries (a deleted sandbox's event
    carries neither: PLEG knows its pod from before).
    """
    kind = _EVENT_TYPES.get(message.container_event_type)
    if kind is None:
        return None
    cid = message.container_id
    uid = ""
    if message.HasField("pod_sandbox_status"):
        uid = message.pod_sandbox_status.labels.get(POD_UID, "")
    if not uid:
        uid = next((c.labels.get(POD_UID, "") for c in message.containers_statuses
                    if c.id == cid), "")
    return RuntimeEvent(container_id=cid, type=kind, pod_uid=uid)


async def inspect_pod(
    client: RuntimeReader,
    uid: str,
    *,
    pod: Pod | None = None,
    messages: TerminationMessages | None = None,
) -> RuntimePodStatus:
    """One pod in full: listed objects plus ContainerStatus for each container and
    PodSandboxStatus for the newest sandbox. Objects removed meanwhile are skipped.

    Given the pod's spec and its worker's ``messages``, exited containers carry their
    termination message."""
    selector = {POD_UID: uid}
    sandboxes = await client.list_pod_sandbox_brief(v1.PodSandboxFilter(label_selector=selector))
    listed = await client.list_containers_brief(v1.ContainerFilter(label_selector=selector))
    base = group_by_pod(sandboxes, listed).get(uid)
    if messages is not None:
        messages.keep_only(c.id for c in (base.containers if base is not None else ()))
    if base is None:
        return RuntimePodStatus(uid=uid)
    listed_ids = [(brief.id, brief.sandbox_id) for brief in base.containers]
    containers = await _in_full(client, listed_ids, pod, messages)
    sandboxes_out = list(base.sandboxes)
    if sandboxes_out:
        try:
            response_sb = await client.pod_sandbox_status(sandboxes_out[0].id)
        except CRINotFound:
            sandboxes_out.pop(0)
        else:
            if response_sb.status is not None:
                sandboxes_out[0] = detailed_sandbox(response_sb.status)
    return RuntimePodStatus(uid=uid, name=base.name, namespace=base.namespace,
                            sandboxes=tuple(sandboxes_out), containers=tuple(containers))


async def with_created(
    client: RuntimeReader,
    before: RuntimePodStatus,
    sandbox: RuntimeSandbox | None,
    created: Sequence[tuple[str, str]],
    *,
    pod: Pod,
    messages: TerminationMessages | None = None,
) -> RuntimePodStatus:
    """The pod as ``before`` showed it plus what a sync then created in it: a new
    ``sandbox`` (already asked about) and the ``created`` (container id, sandbox id) pairs,
    one ContainerStatus each. Three calls fewer per new pod than `inspect_pod`, and the same
    answer unless something else changed meanwhile, which PLEG then tells the worker of."""
    containers = await _in_full(client, created, pod, messages)
    sandboxes = [sandbox, *before.sandboxes] if sandbox is not None else list(before.sandboxes)
    containers.extend(before.containers)
    sandboxes.sort(key=_NEWEST_FIRST, reverse=True)
    containers.sort(key=_NEWEST_FIRST, reverse=True)
    return RuntimePodStatus(uid=before.uid, name=before.name or pod.metadata.name,
                            namespace=before.namespace or pod.metadata.namespace,
                            sandboxes=tuple(sandboxes), containers=tuple(containers))


async def _in_full(
    client: RuntimeReader,
    listed: Iterable[tuple[str, str]],
    pod: Pod | None,
    messages: TerminationMessages | None,
) -> list[RuntimeContainer]:
    """ContainerStatus of each (container id, sandbox id), skipping containers removed
    meanwhile; exited ones carry their termination message when ``pod`` and ``messages``
    are given."""
    specs: dict[str, Container] | None = None  # built at the first exited container
    containers = []
    for container_id, sandbox_id in listed:
        try:
            response = await client.container_status(container_id)
        except CRINotFound:
            continue
        status = response.status
        if status is None:
            continue
        detail = _detailed_container(status, sandbox_id)
        if messages is not None and pod is not None and detail.state is ContainerState.EXITED:
            specs = specs if specs is not None else _specs_by_name(pod)
            spec = specs.get(detail.name)
            if spec is not None:
                message = await messages.read(status, spec)
                detail = replace(detail, termination_message=message)
        containers.append(detail)
    return containers


def _detailed_container(status: v1.ContainerStatus, sandbox_id: str) -> RuntimeContainer:
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
        sandbox_id=sandbox_id,
    )


def detailed_sandbox(status: v1.PodSandboxStatus) -> RuntimeSandbox:
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


# -- termination messages --------------------------------------------------------------------


class TerminationMessages:
    """What exited containers left as their termination message, read once per container.

    An exited container never changes, so its message is read the first time it is seen
    exited and remembered while the runtime still lists it: inspecting a pod on every
    sync costs no file reads. A message taken from the log is the exception: the
    runtime may still be copying the last output when it reports the exit, so it is
    read again whenever the log file has changed (one stat per sync).
    """

    def __init__(self) -> None:
        self._read: dict[str, tuple[str, tuple[int, int] | None]] = {}

    async def read(self, status: v1.ContainerStatus, spec: Container) -> str:
        """The message of the exited container ``status`` describes (an instance of ``spec``)."""
        known = self._read.get(status.id)
        if known is not None and (known[1] is None or known[1] == _stamp(status.log_path)):
            return known[0]
        file_message = read_termination_file(status, spec)
        if not _falls_back_to_log(status, spec, file_message):
            self._read[status.id] = (file_message, None)
            return file_message
        stamp = _stamp(status.log_path)  # before reading: a later write shows as a change
        message = await read_log_tail(Path(status.log_path))
        self._read[status.id] = (message, stamp)
        return message

    def keep_only(self, container_ids: Iterable[str]) -> None:
        """Forget the containers that are gone."""
        listed = set(container_ids)
        for gone in [cid for cid in self._read if cid not in listed]:
            del self._read[gone]

    def __len__(self) -> int:
        return len(self._read)


async def termination_message(status: v1.ContainerStatus, spec: Container) -> str:
    """The end of the file mounted at ``terminationMessagePath``, or with
    FallbackToLogsOnError the tail of the container's log (``wants_log_tail``)."""
    file_message = read_termination_file(status, spec)
    if _falls_back_to_log(status, spec, file_message):
        return await read_log_tail(Path(status.log_path))
    return file_message


def _falls_back_to_log(status: v1.ContainerStatus, spec: Container, file_message: str) -> bool:
    policy = spec.termination_message_policy
    return bool(status.log_path) and wants_log_tail(
        policy, status.exit_code, status.reason, file_message
    )


def read_termination_file(status: v1.ContainerStatus, spec: Container) -> str:
    """What the container wrote to the host file mounted at its terminationMessagePath."""
    if not spec.termination_message_path:
        return ""
    in_container = _absolute(spec.termination_message_path)
    host_path = next((m.host_path for m in status.mounts if m.container_path == in_container), "")
    return read_message_file(Path(host_path)) if host_path else ""


def read_message_file(path: Path, limit: int = MAX_TERMINATION_MESSAGE_BYTES) -> str:
    """The last ``limit`` bytes of a termination-message file ("" when there is none).

    A few system calls on a small file, so not worth a thread.
    """
    try:
        with path.open("rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(max(0, size - limit))
            data = file.read(limit)
    except FileNotFoundError:
        return ""
    except OSError as err:
        return f"Error on reading termination log {path}: {err}"
    return data.decode(errors="replace")


async def read_log_tail(
    path: Path,
    lines: int = MAX_TERMINATION_LOG_LINES,
    limit: int = MAX_TERMINATION_LOG_BYTES,
) -> str:
    """The last ``lines`` lines of a CRI log (both streams), at most its last ``limit`` bytes."""
    try:
        file = await open_log(path)
    except OSError as err:
        return f"Error on reading termination message from logs: {err}"
    tail = bytearray()
    async for block in read_log(file, LogOptions(tail_lines=lines)):
        tail += block
        del tail[:-limit]
    return tail.decode(errors="replace")


def _stamp(path: str) -> tuple[int, int]:
    """Size and modification time of a file, to notice it changed ((-1, -1): none)."""
    try:
        stat = os.stat(path)
    except OSError:
        return -1, -1
    return stat.st_size, stat.st_mtime_ns


def _absolute(path: str) -> str:
    return path if path.startswith("/") else "/" + path


def _specs_by_name(pod: Pod) -> dict[str, Container]:
    spec = pod.spec
    every = (*spec.init_containers, *spec.containers, *spec.ephemeral_containers)
    return {c.name: c for c in every}

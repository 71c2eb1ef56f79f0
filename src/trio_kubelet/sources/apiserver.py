"""The API-server pod source: pods bound to this node, kept by a list+watch.

Sends the complete set as ``PodSetUpdate(source="api")`` after every change, as the
static source does, so the sync loop's PodConfig applies the same SET semantics to
both. What the reconciler compares is the pod without its status and bookkeeping
fields: the agent's own status patches come back through the watch and must not
look like new specs (Go's PodConfig ignores status-only updates the same way). The
one exception is the conditions the pod's readiness gates name, which decide Ready.

Mirror pods (the API copies of static pods) are not run: they are kept aside for
the mirror-pod manager. The API's view of each pod's status is kept for the status
manager, which merges into it and never lets a terminal phase regress.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio
from pydantic import ValidationError

from trio_kubelet.apiserver.client import JSON, APIClient, WatchEvent
from trio_kubelet.apiserver.object_cache import ObjectCache
from trio_kubelet.apiserver.reflector import Reflector
from trio_kubelet.config import describe_validation_error
from trio_kubelet.core.phase import CONFIG_SOURCE_ANNOTATION, MIRROR_ANNOTATION
from trio_kubelet.events import Event, ManifestProblem, PodSetUpdate
from trio_kubelet.model.pod import Pod

log = logging.getLogger("trio_kubelet.sources.apiserver")

API_SOURCE = "api"
# Fields the API server maintains that say nothing about what to run.
_BOOKKEEPING = ("resourceVersion", "managedFields", "selfLink")


@dataclass(frozen=True)
class RejectedPod:
    """A pod bound to the node that the agent cannot run, and why."""

    namespace: str
    name: str
    uid: str
    reason: str


class APIPods:
    """What the API server says about this node's pods, shared by the source's readers."""

    def __init__(self, caches: Sequence[ObjectCache] = ()) -> None:
        # ConfigMap/Secret caches: they watch what the pods to run reference.
        self.caches = tuple(caches)
        self.pods: dict[str, Pod] = {}  # regular pods to run, by UID (status stripped)
        self.api_status: dict[str, JSON] = {}  # the API's current status of each, by UID
        self.mirrors: dict[str, JSON] = {}  # mirror pods by "namespace/name"
        self.rejected: dict[str, RejectedPod] = {}
        self.synced = False  # a complete list has been seen
        self._changed = trio.Event()

    def next_change(self) -> trio.Event:
        """The event the next change (`notify`) sets."""
        return self._changed

    def notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def take(self, obj: JSON) -> None:
        """Add or update one pod from the API.

        A new version of a pod to run is registered with the caches as it is: they swap its
        references and keep the watches both versions use. Unregistering it first would
        restart its objects' watches at every status update, leaving them unlisted for a
        moment each time (and the pod's next volume refresh failing on that).
        """
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
            self.forget(obj)
            self.mirrors[_key(meta)] = obj
            return
        self.api_status[uid] = obj.get("status") or {}
        try:
            pod = pod_to_run(obj)
        except ValidationError as err:
            if self.pods.pop(uid, None) is not None:
                for cache in self.caches:
                    cache.unregister_pod(uid)
            reason = describe_validation_error(err)
            rejected = RejectedPod(
                str(meta.get("namespace", "")), str(meta.get("name", "")), uid, reason
            )
            if self.rejected.get(uid) != rejected:
                log.warning(
                    "Pod %s/%s (%s) cannot be run: %s",
                    rejected.namespace,
                    rejected.name,
                    uid,
                    reason,
                )
            self.rejected[uid] = rejected
            return
        self.rejected.pop(uid, None)
        self.pods[uid] = pod
        for cache in self.caches:
            cache.register_pod(pod)

    def forget(self, obj: JSON) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if self.pods.pop(uid, None) is not None:
            for cache in self.caches:
                cache.unregister_pod(uid)
        self.api_status.pop(uid, None)
        self.rejected.pop(uid, None)
        key = _key(meta)
        if str((self.mirrors.get(key) or {}).get("metadata", {}).get("uid")) == uid:
            del self.mirrors[key]

    def update(self) -> PodSetUpdate:
        problems = [
            ManifestProblem(file=f"{r.namespace}/{r.name}", reason=r.reason)
            for r in self.rejected.values()
        ]
        return PodSetUpdate(source=API_SOURCE, pods=list(self.pods.values()), problems=problems)


def pod_to_run(obj: Mapping[str, Any]) -> Pod:
    """The pod as the reconciler sees it: no API bookkeeping, source annotated, and of its
    status only the conditions its readiness gates name (see ``_gate_conditions``)."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _BOOKKEEPING}
    meta["annotations"] = {**(meta.get("annotations") or {}), CONFIG_SOURCE_ANNOTATION: API_SOURCE}
    body = {k: v for k, v in obj.items() if k != "status"}
    conditions = _gate_conditions(obj)
    if conditions:
        body["status"] = {"conditions": conditions}
    return Pod.model_validate({**body, "metadata": meta})


def _gate_conditions(obj: Mapping[str, Any]) -> list[Any]:
    """The pod's status conditions whose types its ``readinessGates`` name.

    Someone other than the kubelet sets them, and Ready depends on them: a change must
    reach the pod's worker as a change of the pod (Go's HandlePodReconcile syncs a pod
    whose readiness needs reconciling). No other part of the status is kept, so the
    agent's own status patches never look like new specs.
    """
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    gates = {
        gate.get("conditionType")
        for gate in spec.get("readinessGates") or []
        if isinstance(gate, Mapping)
    }
    return [
        condition
        for condition in status.get("conditions") or []
        if isinstance(condition, Mapping) and condition.get("type") in gates
    ]


class _Handler:
    def __init__(self, state: APIPods, send: trio.MemorySendChannel[Event]) -> None:
        self.state = state
        self.send = send

    async def replace(self, items: list[JSON]) -> None:
        state = self.state
        before = set(state.pods)
        state.pods.clear()
        state.api_status.clear()
        state.mirrors.clear()
        state.rejected.clear()
        for item in items:
            state.take(item)
        for uid in before - state.pods.keys():
            for cache in state.caches:
                cache.unregister_pod(uid)
        state.synced = True
        await self._publish()

    async def apply(self, event: WatchEvent) -> None:
        if event.type == "DELETED":
            self.state.forget(event.object)
        else:
            self.state.take(event.object)
        await self._publish()

    async def _publish(self) -> None:
        self.state.notify()
        await self.send.send(self.state.update())


async def run_api_source(
    send: trio.MemorySendChannel[Event],
    client: APIClient,
    node_name: str,
    state: APIPods,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """List+watch ``/api/v1/pods?fieldSelector=spec.nodeName=<node>`` forever."""
    task_status.started()
    reflector = Reflector(
        client,
        "/api/v1/pods",
        _Handler(state, send),
        params={"fieldSelector": f"spec.nodeName={node_name}"},
        what=f"pods bound to node {node_name}",
    )
    async with send:
        await reflector.run()


def _key(meta: Mapping[str, Any]) -> str:
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

"""The status manager: the API server learns each pod's status from here, and only changes.

The pod workers publish statuses to the ``PodStatusStore``; this task turns them into
``pods/<name>/status`` strategic merge patches (with the pod's UID as a precondition, so a
recreated pod of the same name is never overwritten). It merges rather than replaces:
conditions owned by others (a scheduler's, a readiness gate's) and fields the agent
does not manage are kept. A terminal phase in the API is never regressed.

It also finishes graceful deletions: once a pod with a deletion timestamp has nothing
left running, the pod object is deleted with grace period 0 (the Go kubelet's
canBeDeleted), and it reports pods the agent cannot run as Failed with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from trio_kubelet.apiserver.client import JSON, APIClient
from trio_kubelet.apiserver.errors import APIError, Conflict, Forbidden, NotFound, Unreachable
from trio_kubelet.apiserver.resync import resync_forever
from trio_kubelet.core.eviction import DISRUPTION_TARGET
from trio_kubelet.core.phase import KUBELET_CONDITIONS
from trio_kubelet.model.pod import Pod, PodStatus
from trio_kubelet.sources.apiserver import APIPods, RejectedPod
from trio_kubelet.status.merge_patch import merge_patch
from trio_kubelet.status.store import PodStatusStore

log = logging.getLogger("trio_kubelet.status")

# The Go status manager also re-checks every pod this often, whatever changed.
SYNC_PERIOD = 10.0
TERMINAL = ("Succeeded", "Failed")
# Status fields the kubelet owns; anything else in the API's status is someone else's.
KUBELET_FIELDS = frozenset(
    {
        "phase",
        "conditions",
        "message",
        "reason",
        "hostIP",
        "hostIPs",
        "podIP",
        "podIPs",
        "startTime",
        "qosClass",
        "initContainerStatuses",
        "containerStatuses",
        "ephemeralContainerStatuses",
    }
)
UNSUPPORTED_REASON = "UnsupportedPodSpec"
# The conditions the kubelet writes: its own, and DisruptionTarget, which it shares (an
# eviction sets it). Any other condition in a status is someone else's to set.
WRITTEN_CONDITIONS = KUBELET_CONDITIONS | {DISRUPTION_TARGET}


def desired_status(api_status: JSON, ours: JSON) -> JSON | None:
    """What the API's status should become, or None when it must not change.

    None when the API already holds a terminal phase and ours is not terminal: a
    pod that finished stays finished whatever a restarted agent observes.
    """
    if api_status.get("phase") in TERMINAL and ours.get("phase") not in TERMINAL:
        return None
    merged = {k: v for k, v in api_status.items() if k not in KUBELET_FIELDS}
    merged.update(ours)
    # Ours may carry others' conditions as the pod showed them (readiness gates); the
    # API's copy of those is newer (Go's mergePodStatus). The API's order is kept, ours
    # that it lacks go last: the order the API server gives a strategic merge.
    own = {c.get("type"): c for c in ours.get("conditions", [])}
    own = {kind: c for kind, c in own.items() if kind in WRITTEN_CONDITIONS}
    conditions = [own.pop(c.get("type"), c) for c in api_status.get("conditions", [])]
    conditions += own.values()
    if conditions or "conditions" in ours:
        merged["conditions"] = conditions
    return merged


def status_patch(old: JSON, new: JSON) -> JSON:
    """The strategic merge patch turning the API's status ``old`` into ``new`` (Go's status
    manager sends one as well).

    It is the JSON merge patch, except for the lists the API server merges by key: only the
    conditions that changed are sent, each as a patch of its own entry (so one set by
    someone else meanwhile, a readiness gate's, is never overwritten or dropped), and the
    pod's and host's IP lists are replaced whole.
    """
    patch = merge_patch(old, new)
    if isinstance(patch.get("conditions"), list):
        before = {c.get("type"): c for c in old.get("conditions", [])}
        changed = [
            {"type": c.get("type"), **merge_patch(before.get(c.get("type"), {}), c)}
            for c in new.get("conditions", [])
            if before.get(c.get("type")) != c
        ]
        if changed:
            patch["conditions"] = changed
        else:
            del patch["conditions"]
    for key in ("podIPs", "hostIPs"):
        if isinstance(patch.get(key), list):
            patch[key] = [{"$patch": "replace"}, *patch[key]]
    return patch


def rejected_status(rejected: RejectedPod, now: str) -> JSON:
    return {
        "phase": "Failed",
        "reason": UNSUPPORTED_REASON,
        "message": f"Pod cannot be run by this node: {rejected.reason}",
        "startTime": now,
    }


class StatusManager:
    def __init__(
        self,
        client: APIClient,
        store: PodStatusStore,
        api: APIPods,
        *,
        mirror_of: Callable[[Pod], JSON | None] = lambda pod: None,
        wall_time: Callable[[], str],
    ) -> None:
        self.client = client
        self.store = store
        self.api = api
        self.mirror_of = mirror_of  # the mirror pod of a static pod, if there is one
        self.wall_time = wall_time  # RFC 3339 now
        self._sent: dict[str, JSON] = {}  # the status last patched, by the API object's UID
        # Each pod's status as last converted to the API's form, by the pod's UID: a round
        # looks at every pod whenever any changes, and most have not.
        self._converted: dict[str, tuple[PodStatus, JSON]] = {}
        self._deleting: set[str] = set()

    async def run(self) -> None:
        await resync_forever(
            self.sync_all,
            what="update pod statuses",
            changed=(self.store.next_change, self.api.next_change),
            period=SYNC_PERIOD,
        )

    async def sync_all(self) -> None:
        if not self.api.synced:
            return
        pods = self.store.pods()
        for pod in pods:
            uid = pod.metadata.uid
            if uid in self.api.api_status:
                await self._sync_status(pod, uid, self.api.api_status[uid], self._ours(pod))
                if pod.metadata.deletion_timestamp and self.store.is_stopped(uid):
                    await self._delete(pod)
            else:
                mirror = self.mirror_of(pod)
                if mirror is not None:
                    meta = mirror.get("metadata") or {}
                    await self._sync_status(
                        pod,
                        str(meta.get("uid")),
                        mirror.get("status") or {},
                        self._ours(pod),
                        name=str(meta.get("name")),
                    )
        for rejected in list(self.api.rejected.values()):
            status = self.api.api_status.get(rejected.uid, {})
            if status.get("reason") != UNSUPPORTED_REASON:
                ours = rejected_status(rejected, self.wall_time())
                await self._patch(rejected.namespace, rejected.name, rejected.uid, status, ours)
        live = self.api.api_status.keys() | {
            str((m.get("metadata") or {}).get("uid")) for m in self.api.mirrors.values()
        }
        self._sent = {uid: sent for uid, sent in self._sent.items() if uid in live}
        self._deleting &= live
        if len(self._converted) > len(pods):
            kept = {pod.metadata.uid for pod in pods}
            self._converted = {uid: c for uid, c in self._converted.items() if uid in kept}

    def _ours(self, pod: Pod) -> JSON:
        """The pod's status in the API's form, converted once per status."""
        converted = self._converted.get(pod.metadata.uid)
        if converted is None or converted[0] is not pod.status:
            converted = (pod.status, pod.status.to_api())
            self._converted[pod.metadata.uid] = converted
        return converted[1]

    async def _sync_status(
        self, pod: Pod, uid: str, api_status: JSON, ours: JSON, *, name: str = ""
    ) -> None:
        wanted = desired_status(api_status, ours)
        if wanted is None:
            if self._sent.get(uid) is not api_status:
                log.info(
                    "Pod %s (%s) is %s in the API; not reporting %s",
                    pod.full_name,
                    uid,
                    api_status.get("phase"),
                    ours.get("phase"),
                )
                self._sent[uid] = api_status
            return
        if wanted == api_status or wanted == self._sent.get(uid):
            return
        await self._patch(
            pod.metadata.namespace, name or pod.metadata.name, uid, api_status, wanted
        )

    async def _patch(self, namespace: str, name: str, uid: str, old: JSON, new: JSON) -> None:
        patch: dict[str, Any] = {"metadata": {"uid": uid}, "status": status_patch(old, new)}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
        try:
            answer = await self.client.patch(path, patch, kind="strategic")
        except (NotFound, Conflict) as err:
            log.info("Not updating the status of pod %s/%s (%s): %s", namespace, name, uid, err)
            self._sent[uid] = new
            return
        except Unreachable:
            raise
        except Forbidden as err:
            # Asking again with the same status gets the same answer: wait for a new one.
            log.error(
                "Not allowed to update the status of pod %s/%s (%s): %s", namespace, name, uid, err
            )
            self._sent[uid] = new
            return
        except APIError as err:
            log.error(
                "Failed to update the status of pod %s/%s (%s): %s", namespace, name, uid, err
            )
            return
        self._sent[uid] = new
        if uid in self.api.api_status:
            self.api.api_status[uid] = answer.get("status") or new
        log.debug("Status of pod %s/%s (%s) is now %s", namespace, name, uid, new.get("phase"))

    async def _delete(self, pod: Pod) -> None:
        uid = pod.metadata.uid
        if uid in self._deleting:
            return
        try:
            await self.client.delete_pod_now(pod.metadata.namespace, pod.metadata.name, uid)
        except Unreachable:
            raise
        except APIError as err:
            log.error("Failed to delete pod %s (%s): %s", pod.full_name, uid, err)
            return
        log.info("Pod %s (%s) has stopped; deleted it from the API server", pod.full_name, uid)
        self._deleting.add(uid)

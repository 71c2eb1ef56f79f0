"""The status manager: the API server learns each pod's status from here, and only changes.

The pod workers publish statuses to the ``PodStatusStore``; this task turns them into
``pods/<name>/status`` merge patches (with the pod's UID as a precondition, so a
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
from trio_kubelet.model.pod import Pod
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


def desired_status(api_status: JSON, ours: JSON) -> JSON | None:
    """What the API's status should become, or None when it must not change.

    None when the API already holds a terminal phase and ours is not terminal: a
    pod that finished stays finished whatever a restarted agent observes.
    """
    if api_status.get("phase") in TERMINAL and ours.get("phase") not in TERMINAL:
        return None
    merged = {k: v for k, v in api_status.items() if k not in KUBELET_FIELDS}
    merged.update(ours)
    own_types = {c.get("type") for c in ours.get("conditions", [])}
    kept = [c for c in api_status.get("conditions", []) if c.get("type") not in own_types]
    if kept or "conditions" in ours:
        merged["conditions"] = [*ours.get("conditions", []), *kept]
    return merged


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
        self._deleting: set[str] = set()

    async def run(self) -> None:
        await resync_forever(
            self.sync_all,
            what="update pod statuses",
            changed=(self.store.wait_changed, self.api.wait_changed),
            period=SYNC_PERIOD,
        )

    async def sync_all(self) -> None:
        if not self.api.synced:
            return
        for pod in self.store.pods():
            uid = pod.metadata.uid
            if uid in self.api.api_status:
                await self._sync_status(pod, uid, self.api.api_status[uid], pod.status.to_api())
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
                        pod.status.to_api(),
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
        patch: dict[str, Any] = {"metadata": {"uid": uid}, "status": merge_patch(old, new)}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
        try:
            answer = await self.client.patch(path, patch, kind="merge")
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

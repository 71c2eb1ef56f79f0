"""Mirror pods: the API server's read-only copies of this node's static pods.

For every static pod the agent runs there is a pod object in the API with the
annotation ``kubernetes.io/config.mirror`` (the static pod's content hash) and the
Node as its owner, so that ``kubectl get pods`` shows static pods too. A mirror
deleted by someone, or left from an older version of the manifest, is (re)created;
a mirror whose static pod is gone is deleted. Its status is the static pod's (the
status manager patches it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from trio_kubelet.apiserver.client import JSON, APIClient
from trio_kubelet.apiserver.errors import AlreadyExists, APIError, Unreachable
from trio_kubelet.apiserver.resync import resync_forever
from trio_kubelet.core.phase import MIRROR_ANNOTATION
from trio_kubelet.model.pod import Pod
from trio_kubelet.sources.apiserver import APIPods
from trio_kubelet.sources.static_files import CONFIG_HASH_ANNOTATION

log = logging.getLogger("trio_kubelet.mirror")

RECHECK_PERIOD = 10.0


def mirror_pod(pod: Pod, node_name: str, node_uid: str) -> JSON:
    """The mirror pod object for static pod ``pod`` (no UID: the API server assigns one)."""
    wire = pod.to_api()
    meta = wire["metadata"]
    annotations = dict(meta.get("annotations") or {})
    annotations[MIRROR_ANNOTATION] = annotations.get(CONFIG_HASH_ANNOTATION, "")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": meta.get("labels") or {},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node_name,
                    "uid": node_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {**wire["spec"], "nodeName": node_name},
    }


def mirror_is_current(mirror: JSON, pod: Pod) -> bool:
    """The mirror was made from this version of the static pod and is not being deleted."""
    meta = mirror.get("metadata") or {}
    wanted = pod.metadata.annotations.get(CONFIG_HASH_ANNOTATION, "")
    return (
        not meta.get("deletionTimestamp")
        and (meta.get("annotations") or {}).get(MIRROR_ANNOTATION) == wanted
    )


class MirrorPods:
    def __init__(
        self,
        client: APIClient,
        api: APIPods,
        node_name: str,
        static_pods: Callable[[], dict[str, Pod] | None],
        node_uid: Callable[[], str | None],
        pods_changed: Callable[[], trio.Event],
    ) -> None:
        self.client = client
        self.api = api
        self.node_name = node_name
        self.static_pods = static_pods  # by UID; None until the file source has reported
        self.node_uid = node_uid  # None until the Node is registered (it owns the mirrors)
        self.pods_changed = pods_changed  # the event the node's pods' next change sets

    def mirror_of(self, pod: Pod) -> JSON | None:
        """The current mirror of static pod ``pod``, for its status."""
        mirror = self.api.mirrors.get(f"{pod.metadata.namespace}/{pod.metadata.name}")
        return mirror if mirror is not None and mirror_is_current(mirror, pod) else None

    async def run(self) -> None:
        await resync_forever(
            self.sync,
            what="sync mirror pods",
            changed=(self.api.next_change, self.pods_changed),
            period=RECHECK_PERIOD,
        )

    async def sync(self) -> None:
        static = self.static_pods()
        node_uid = self.node_uid()
        if static is None or node_uid is None or not self.api.synced:
            return
        wanted = {f"{p.metadata.namespace}/{p.metadata.name}": p for p in static.values()}
        for key, mirror in list(self.api.mirrors.items()):
            pod = wanted.get(key)
            if pod is None or not mirror_is_current(mirror, pod):
                await self._delete(
                    mirror, "its static pod is gone" if pod is None else "its static pod changed"
                )
        for key, pod in wanted.items():
            if key not in self.api.mirrors:
                await self._create(pod, node_uid)

    async def _create(self, pod: Pod, node_uid: str) -> None:
        try:
            body = mirror_pod(pod, self.node_name, node_uid)
            created = await self.client.create(
                f"/api/v1/namespaces/{pod.metadata.namespace}/pods", body
            )
        except AlreadyExists:
            return  # made by someone else, or still being deleted: seen on the next round
        except Unreachable:
            raise
        except APIError as err:
            log.error("Failed to create the mirror pod of %s: %s", pod.full_name, err)
            return
        self.api.take(created)
        log.info(
            "Created mirror pod %s/%s (%s) for static pod %s",
            pod.metadata.namespace,
            pod.metadata.name,
            created["metadata"]["uid"],
            pod.metadata.uid,
        )

    async def _delete(self, mirror: JSON, why: str) -> None:
        meta: dict[str, Any] = mirror.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return  # already going
        try:
            await self.client.delete_pod_now(
                str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
            )
        except Unreachable:
            raise
        except APIError as err:
            log.error(
                "Failed to delete mirror pod %s/%s: %s",
                meta.get("namespace"),
                meta.get("name"),
                err,
            )
            return
        self.api.forget(mirror)
        log.info("Deleted mirror pod %s/%s: %s", meta.get("namespace"), meta.get("name"), why)

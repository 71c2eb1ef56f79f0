"""The labels and annotations the agent stores on CRI objects, and how to read them back.

They are what lets a restarted agent adopt the sandboxes and containers it
created before, instead of creating duplicates. Keys are the Go kubelet's.
"""

from __future__ import annotations

POD_UID = "io.kubernetes.pod.uid"
POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
CONTAINER_NAME = "io.kubernetes.container.name"
# Annotations (not labels): values that change or are not selectors.
CONTAINER_HASH = "io.kubernetes.container.hash"
RESTART_COUNT = "io.kubernetes.container.restartCount"
TERMINATION_GRACE = "io.kubernetes.pod.terminationGracePeriod"
CONTAINER_TYPE = "io.kubernetes.container.type"  # "init", "sidecar", "ephemeral" or "regular"
MANAGED_BY = "io.kubernetes.container.managed-by"  # marks objects created by a kubelet
MANAGED_BY_VALUE = "trio-kubelet"


def sandbox_labels(
    uid: str, name: str, namespace: str, pod_labels: dict[str, str]
) -> dict[str, str]:
    """Pod labels plus the identity labels the agent relies on (which win on conflict)."""
    return {
        **pod_labels,
        POD_UID: uid,
        POD_NAME: name,
        POD_NAMESPACE: namespace,
        MANAGED_BY: MANAGED_BY_VALUE,
    }


def container_labels(uid: str, name: str, namespace: str, container: str) -> dict[str, str]:
    return {
        POD_UID: uid,
        POD_NAME: name,
        POD_NAMESPACE: namespace,
        CONTAINER_NAME: container,
        MANAGED_BY: MANAGED_BY_VALUE,
    }


def container_annotations(
    spec_hash: str, restart_count: int, container_type: str, grace_seconds: int
) -> dict[str, str]:
    return {
        CONTAINER_HASH: spec_hash,
        RESTART_COUNT: str(restart_count),
        CONTAINER_TYPE: container_type,
        TERMINATION_GRACE: str(grace_seconds),
    }

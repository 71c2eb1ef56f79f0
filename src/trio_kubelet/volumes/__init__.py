"""Pod volumes on the node: emptyDir, hostPath, configMap, secret, downwardAPI, projected.

``VolumeManager`` sets them up and tears them down; ``container_mounts`` and
``termination_log_mount`` turn them into a container's CRI mounts. Payloads are
decided by pure functions (``projection``), the filesystem work is in the others.
"""

from trio_kubelet.volumes.errors import (
    CREATE_CONTAINER_CONFIG_ERROR,
    FAILED_MOUNT,
    VolumeError,
)
from trio_kubelet.volumes.manager import TokenSource, VolumeManager
from trio_kubelet.volumes.mounts import container_mounts, termination_log_mount

__all__ = [
    "CREATE_CONTAINER_CONFIG_ERROR",
    "FAILED_MOUNT",
    "TokenSource",
    "VolumeError",
    "VolumeManager",
    "container_mounts",
    "termination_log_mount",
]

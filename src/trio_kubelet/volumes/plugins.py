"""Which volume plugin serves a pod volume, and the Go kubelet's directory name for it."""

from __future__ import annotations

from typing import Any, Literal

from trio_kubelet.model.pod import Volume
from trio_kubelet.volumes.errors import FAILED_MOUNT, VolumeError

Plugin = Literal["empty-dir", "host-path", "configmap", "secret", "downward-api", "projected"]

_SOURCES: dict[str, Plugin] = {
    "empty_dir": "empty-dir",
    "host_path": "host-path",
    "config_map": "configmap",
    "secret": "secret",
    "downward_api": "downward-api",
    "projected": "projected",
}

# Volumes of API data are always mounted read-only (Go's ReadOnly attribute, CVE-2017-1002102).
API_DATA_PLUGINS: frozenset[Plugin] = frozenset(
    {"configmap", "secret", "downward-api", "projected"}
)


def volume_plugin(volume: Volume) -> tuple[Plugin, dict[str, Any]]:
    """The plugin and its source; a volume without any source is an emptyDir (API defaulting)."""
    found = [
        (plugin, source)
        for field, plugin in _SOURCES.items()
        if (source := getattr(volume, field)) is not None
    ]
    if len(found) > 1:
        raise VolumeError(FAILED_MOUNT, "may not specify more than 1 volume type", volume.name)
    if found:
        return found[0]
    if volume.model_extra:
        kinds = ", ".join(sorted(volume.model_extra))
        raise VolumeError(FAILED_MOUNT, f"no volume plugin matched: {kinds}", volume.name)
    return "empty-dir", {}


def plugin_dir_name(plugin: Plugin) -> str:
    """``kubernetes.io~configmap``: the escaped plugin name under ``<pod>/volumes/``."""
    return f"kubernetes.io~{plugin}"

"""The pod volume manager: sets up each pod's volumes on the node and tears them down.

Layout as the Go kubelet's: ``<pods_dir>/<uid>/volumes/kubernetes.io~<plugin>/<name>``
(hostPath volumes are the host path itself). What a volume should hold is decided in
the trio thread (object lookups, the token source, pure payloads); the filesystem work
runs in a worker thread through ``trio.to_thread``, because mounts, tree walks and
writes can block on a slow disk. One lock keeps that work from interleaving, so the
atomic writer and tear down never race on a pod directory.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import trio

from trio_kubelet.core.objects import ObjectLookup, ObjectUnavailable
from trio_kubelet.kube_events import EventRecorder
from trio_kubelet.model.pod import Pod, Volume
from trio_kubelet.volumes import mounter
from trio_kubelet.volumes.atomic_writer import write_atomically
from trio_kubelet.volumes.empty_dir import memory_size, set_up_empty_dir
from trio_kubelet.volumes.errors import FAILED_MOUNT, VolumeError
from trio_kubelet.volumes.host_path import set_up_host_path
from trio_kubelet.volumes.plugins import Plugin, plugin_dir_name, volume_plugin
from trio_kubelet.volumes.projection import Payload, volume_payload

log = logging.getLogger("trio_kubelet.volumes")

VOLUMES_DIR = "volumes"

# A serviceAccountToken projection -> a token for the pod's service account; raises
# ObjectUnavailable when none can be had (the message is shown to the user).
TokenSource = Callable[[Pod, Mapping[str, Any]], Awaitable[str]]

_SetUp = Callable[[], None]  # the filesystem work of one volume, run in the worker thread


class VolumeManager:
    """Shared by every pod worker; ``events`` receives the FailedMount events."""

    def __init__(self, pods_dir: Path, events: EventRecorder | None = None) -> None:
        self.pods_dir = pods_dir
        self.events = events if events is not None else EventRecorder()
        self._lock = trio.Lock()
        self._ready: set[tuple[str, str]] = set()  # (pod uid, volume) set up at least once

    def pod_dir(self, uid: str) -> Path:
        """``<pods_dir>/<uid>``; the uid must be one path component."""
        return self.pods_dir / _component(uid, "pod uid")

    async def set_up(
        self,
        pod: Pod,
        lookup: ObjectLookup,
        *,
        node_allocatable: Mapping[str, Fraction],
        token_for: TokenSource | None = None,
    ) -> dict[str, Path]:
        """Set up every volume of ``pod`` and return volume name -> host path.

        Called again, it refreshes the configMap, secret, downwardAPI and projected
        contents (so updates reach running pods on resync); emptyDir and hostPath
        volumes are set up once. Each failure is a FailedMount event. A volume that
        fails again after it was set up keeps its last content and its path; one that
        was never set up raises ``VolumeError`` (the first such volume), after all the
        others have been tried.
        """
        uid = pod.metadata.uid
        pod_dir = self.pod_dir(uid)
        inputs = _Inputs(lookup, node_allocatable, token_for)
        paths: dict[str, Path] = {}
        work: dict[str, _SetUp] = {}
        failed: dict[str, str] = {}
        for volume in pod.spec.volumes:
            try:
                plugin, source = volume_plugin(volume)
                path = paths[volume.name] = _volume_path(pod_dir, plugin, volume, source)
                if plugin in ("empty-dir", "host-path") and (uid, volume.name) in self._ready:
                    continue
                work[volume.name] = await _plan(pod, plugin, source, path, inputs)
            except VolumeError as err:
                failed[volume.name] = err.message
        if work:
            async with self._lock:
                failed |= await trio.to_thread.run_sync(_run, pod_dir, work)
        self._ready |= {(uid, name) for name in work if name not in failed}
        for name, message in failed.items():
            text = _set_up_failed(name, message)
            log.warning("Pod %s: %s", pod.full_name, text)
            self.events.pod_event(pod, "Warning", FAILED_MOUNT, text, logged=True)
        never_ready = [name for name in failed if (uid, name) not in self._ready]
        if never_ready:
            name = never_ready[0]
            raise VolumeError(FAILED_MOUNT, _set_up_failed(name, failed[name]), name)
        return paths

    async def tear_down(self, uid: str) -> None:
        """Unmount everything under the pod's directory and remove it.

        For a pod that is gone and whose containers are removed: the directory also
        holds their termination-log files. Raises ``OSError`` (and keeps the directory)
        when a mount cannot be unmounted, so nothing mounted is ever deleted through.
        """
        pod_dir = self.pod_dir(uid)
        async with self._lock:
            await trio.to_thread.run_sync(_remove_pod_dir, pod_dir)
        self._ready = {key for key in self._ready if key[0] != uid}

    async def tear_down_orphans(self, known_uids: Collection[str]) -> list[str]:
        """Tear down the directory of every pod not in ``known_uids``; the uids removed.

        ``known_uids`` must include pods that still have containers in the runtime.
        A pod that cannot be torn down is logged and tried again next time.
        """
        present = await trio.to_thread.run_sync(_pod_dir_names, self.pods_dir)
        removed = []
        for uid in sorted(present - set(known_uids)):
            try:
                await self.tear_down(uid)
            except OSError as err:
                log.warning("Cannot remove the directory of orphaned pod %s: %s", uid, err)
                continue
            removed.append(uid)
        return removed


@dataclass(frozen=True, slots=True)
class _Inputs:
    """What set up reads besides the pod: cluster objects, the node, service account tokens."""

    lookup: ObjectLookup
    node_allocatable: Mapping[str, Fraction]
    token_for: TokenSource | None


async def _plan(
    pod: Pod, plugin: Plugin, source: Mapping[str, Any], path: Path, inputs: _Inputs
) -> _SetUp:
    """Decide what the volume must hold; the returned function puts it on disk."""
    fs_group = pod.spec.security_context.fs_group
    if plugin == "host-path":
        return functools.partial(set_up_host_path, source)
    if plugin == "empty-dir":
        medium = source.get("medium") or ""
        size = None
        if medium == "Memory":
            size = memory_size(pod, source.get("sizeLimit"), inputs.node_allocatable)
        return functools.partial(
            set_up_empty_dir, path, medium=medium, size=size, fs_group=fs_group
        )
    token = await _token(pod, source, inputs.token_for) if plugin == "projected" else None
    payload = volume_payload(
        plugin, source, pod, inputs.lookup, node_allocatable=inputs.node_allocatable, token=token
    )
    # Go keeps secrets (and whatever may hold them) off the disk: a tmpfs wraps them.
    medium = "" if plugin == "configmap" else "Memory"
    size = memory_size(pod, None, inputs.node_allocatable) if medium else None
    return functools.partial(_set_up_api_data, path, payload, medium, size, fs_group)


def _set_up_failed(volume: str, message: str) -> str:
    """The Go kubelet's FailedMount event text."""
    return f'MountVolume.SetUp failed for volume "{volume}" : {message}'


async def _token(
    pod: Pod, source: Mapping[str, Any], token_for: TokenSource | None
) -> str | None:
    """The token of the volume's serviceAccountToken source, if it has one and one can be had."""
    wanted = [
        projection["serviceAccountToken"]
        for projection in source.get("sources") or []
        if projection.get("serviceAccountToken") is not None
    ]
    if not wanted or token_for is None:
        return None
    try:
        return await token_for(pod, wanted[0])
    except ObjectUnavailable as err:
        raise VolumeError(FAILED_MOUNT, str(err)) from None


def _volume_path(pod_dir: Path, plugin: Plugin, volume: Volume, source: Mapping[str, Any]) -> Path:
    name = _component(volume.name, "volume name")  # also names subPath bind mounts
    if plugin == "host-path":
        return Path(str(source.get("path", "")))
    return pod_dir / VOLUMES_DIR / plugin_dir_name(plugin) / name


def _component(name: str, what: str) -> str:
    """A name used as one path component, so that it cannot reach outside its directory."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise VolumeError(FAILED_MOUNT, f"invalid {what} {name!r}")
    return name


# -- in the worker thread ---------------------------------------------------------------------


def _run(pod_dir: Path, work: Mapping[str, _SetUp]) -> dict[str, str]:
    """Run each volume's set up; the message of each one that failed."""
    failed: dict[str, str] = {}
    pod_dir.parent.mkdir(parents=True, exist_ok=True)
    pod_dir.mkdir(mode=0o750, exist_ok=True)
    (pod_dir / VOLUMES_DIR).mkdir(mode=0o750, exist_ok=True)
    for name, set_up in work.items():
        try:
            set_up()
        except VolumeError as err:
            failed[name] = err.message
        except OSError as err:
            failed[name] = str(err)
    return failed


def _set_up_api_data(
    path: Path, payload: Payload, medium: str, size: int | None, fs_group: int | None
) -> None:
    set_up_empty_dir(path, medium=medium, size=size, fs_group=fs_group)
    if write_atomically(path, payload, fs_group=fs_group):
        log.debug("Wrote new contents of volume %s", path)


def _remove_pod_dir(pod_dir: Path) -> None:
    if not pod_dir.exists():
        return
    for point in mounter.mount_points_under(pod_dir):
        mounter.unmount(point)
    if mounter.mount_points_under(pod_dir):  # mounted again meanwhile: never delete through
        raise OSError(f"{pod_dir} still has mounts")
    shutil.rmtree(pod_dir)


def _pod_dir_names(pods_dir: Path) -> set[str]:
    if not pods_dir.is_dir():
        return set()
    return {entry.name for entry in os.scandir(pods_dir) if entry.is_dir(follow_symlinks=False)}

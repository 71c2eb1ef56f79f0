"""volumes.manager: a pod's volumes set up, refreshed, reported and torn down on disk."""

from __future__ import annotations

import base64
import os
import re
import stat
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from trio_kubelet.core.objects import ObjectKind, ObjectUnavailable
from trio_kubelet.kube_events import EventRecorder, EventType, ObjectRef
from trio_kubelet.model.pod import Pod
from trio_kubelet.volumes import mounter
from trio_kubelet.volumes.errors import VolumeError
from trio_kubelet.volumes.manager import VolumeManager
from trio_kubelet.volumes.mounts import container_mounts

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tmpfs volumes need root")

UID = "5d1c2f3a-7777-4000-8000-000000000001"
ALLOCATABLE = {"memory": Fraction(64 * 2**20), "cpu": Fraction(2)}


class Events(EventRecorder):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def event(self, ref: ObjectRef, type: EventType, reason: str, message: str, *,
              logged: bool = False) -> None:
        self.seen.append((reason, message))


@dataclass
class Cluster:
    objects: dict[tuple[ObjectKind, str], dict[str, Any]] = field(default_factory=dict)

    def lookup(self, kind: ObjectKind, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.objects.get((kind, name))


@dataclass
class Env:
    manager: VolumeManager
    events: Events
    cluster: Cluster
    pods_dir: Path
    host: Path

    async def set_up(self, pod: Pod, **kwargs: Any) -> dict[str, Path]:
        return await self.manager.set_up(pod, self.cluster.lookup,
                                         node_allocatable=ALLOCATABLE, **kwargs)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    events = Events()
    cluster = Cluster({
        ("ConfigMap", "app"): {"data": {"level": "debug"}},
        ("Secret", "creds"): {"data": {"password": base64.b64encode(b"hunter2").decode()}},
    })
    (tmp_path / "host").mkdir()
    yield Env(VolumeManager(tmp_path / "pods", events), events, cluster, tmp_path / "pods",
              tmp_path / "host")
    for point in mounter.mount_points_under(tmp_path):
        mounter.unmount(point)


def make_pod(host: Path, *volumes: dict[str, Any], uid: str = UID, **spec: Any) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "web", "namespace": "team", "uid": uid, "labels": {"v": "1"}},
        "spec": {
            "containers": [{"name": "app", "image": "x:1"}],
            "volumes": list(volumes) or [
                {"name": "scratch", "emptyDir": {}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}},
                {"name": "logs", "hostPath": {"path": str(host / "logs"),
                                              "type": "DirectoryOrCreate"}},
                {"name": "cfg", "configMap": {"name": "app"}},
                {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400}},
                {"name": "info", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                {"name": "token", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "audience": "vault"}}]}},
            ],
            **spec,
        },
    })


async def token_for(pod: Pod, source: Mapping[str, Any]) -> str:
    return f"jwt-for-{pod.metadata.name}-{source['audience']}"


async def test_every_kind_is_set_up_where_go_puts_it(env: Env) -> None:
    paths = await env.set_up(make_pod(env.host), token_for=token_for)
    volumes = env.pods_dir / UID / "volumes"
    assert paths == {
        "scratch": volumes / "kubernetes.io~empty-dir" / "scratch",
        "shm": volumes / "kubernetes.io~empty-dir" / "shm",
        "logs": env.host / "logs",
        "cfg": volumes / "kubernetes.io~configmap" / "cfg",
        "creds": volumes / "kubernetes.io~secret" / "creds",
        "info": volumes / "kubernetes.io~downward-api" / "info",
        "token": volumes / "kubernetes.io~projected" / "token",
    }
    assert (env.host / "logs").is_dir()
    assert (paths["cfg"] / "level").read_text() == "debug"
    assert (paths["creds"] / "password").read_text() == "hunter2"
    assert stat.S_IMODE((paths["creds"] / "password").stat().st_mode) == 0o400
    assert (paths["info"] / "labels").read_text() == 'v="1"'
    assert (paths["token"] / "token").read_text() == "jwt-for-web-vault"
    mounted = {point.name: mounter.fs_type(point) for point in mounter.mount_points_under(volumes)}
    assert mounted == {"shm": "tmpfs", "creds": "tmpfs", "info": "tmpfs", "token": "tmpfs"}
    assert os.statvfs(paths["shm"]).f_blocks * os.statvfs(paths["shm"]).f_frsize == 8 * 2**20
    assert env.events.seen == []


async def test_set_up_again_refreshes_api_data(env: Env) -> None:
    pod = make_pod(env.host)
    paths = await env.set_up(pod, token_for=token_for)
    env.cluster.objects["ConfigMap", "app"] = {"data": {"level": "info", "extra": "1"}}
    pod.metadata.labels["v"] = "2"
    assert await env.set_up(pod, token_for=token_for) == paths
    assert (paths["cfg"] / "level").read_text() == "info"
    assert (paths["cfg"] / "extra").read_text() == "1"
    assert (paths["info"] / "labels").read_text() == 'v="2"'
    assert len(mounter.mount_points_under(env.pods_dir)) == 4  # nothing mounted twice


async def test_a_volume_never_set_up_fails_the_pod_but_not_the_others(env: Env) -> None:
    pod = make_pod(env.host, {"name": "cfg", "configMap": {"name": "missing"}},
                   {"name": "scratch", "emptyDir": {}})
    with pytest.raises(VolumeError) as caught:
        await env.set_up(pod)
    message = 'MountVolume.SetUp failed for volume "cfg" : configmap "missing" not found'
    assert (caught.value.reason, caught.value.message, caught.value.volume) == (
        "FailedMount", message, "cfg",
    )
    assert env.events.seen == [("FailedMount", message)]
    assert (env.pods_dir / UID / "volumes" / "kubernetes.io~empty-dir" / "scratch").is_dir()


async def test_a_failed_refresh_keeps_the_last_content(env: Env) -> None:
    pod = make_pod(env.host, {"name": "cfg", "configMap": {"name": "app"}})
    paths = await env.set_up(pod)
    del env.cluster.objects["ConfigMap", "app"]
    assert await env.set_up(pod) == paths
    assert (paths["cfg"] / "level").read_text() == "debug"
    assert env.events.seen == [
        ("FailedMount", 'MountVolume.SetUp failed for volume "cfg" : configmap "app" not found')
    ]


async def test_service_account_tokens_need_a_source(env: Env) -> None:
    pod = make_pod(env.host, {"name": "token", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}})
    with pytest.raises(VolumeError, match="serviceAccountToken needs an API server"):
        await env.set_up(pod)

    async def refused(pod: Pod, source: Mapping[str, Any]) -> str:
        raise ObjectUnavailable('serviceaccounts "default" is forbidden')

    with pytest.raises(VolumeError, match='serviceaccounts "default" is forbidden'):
        await env.set_up(pod, token_for=refused)


async def test_fs_group_owns_api_data_and_empty_dirs(env: Env) -> None:
    pod = make_pod(env.host, {"name": "creds", "secret": {"secretName": "creds",
                                                          "defaultMode": 0o600}},
                   {"name": "scratch", "emptyDir": {}}, securityContext={"fsGroup": 2000})
    paths = await env.set_up(pod)
    password = (paths["creds"] / "password").stat()
    assert (password.st_gid, stat.S_IMODE(password.st_mode)) == (2000, 0o640)
    scratch = paths["scratch"].stat()
    assert (scratch.st_gid, stat.S_IMODE(scratch.st_mode)) == (2000, 0o2777)


async def test_volume_names_cannot_leave_the_pod_directory(env: Env) -> None:
    pod = make_pod(env.host, {"name": "../escape", "emptyDir": {}})
    with pytest.raises(VolumeError, match=re.escape("invalid volume name '../escape'")):
        await env.set_up(pod)
    with pytest.raises(VolumeError, match=re.escape("invalid pod uid '..'")):
        await env.manager.tear_down("..")


async def test_tear_down_unmounts_everything_and_removes_the_pod(env: Env) -> None:
    container = {"name": "app", "image": "x:1",
                 "volumeMounts": [{"name": "logs", "mountPath": "/l", "subPath": "app"}]}
    pod = make_pod(env.host, containers=[container])
    paths = await env.set_up(pod, token_for=token_for)
    pod_dir = env.manager.pod_dir(UID)
    container_mounts(pod, pod.spec.containers[0], paths, {}, pod_dir=pod_dir)
    (env.host / "logs" / "app" / "keep").write_text("host data")
    assert len(mounter.mount_points_under(pod_dir)) == 5  # 4 tmpfs, 1 subPath
    await env.manager.tear_down(UID)
    assert not pod_dir.exists()
    assert mounter.mount_points_under(env.pods_dir) == []
    assert (env.host / "logs" / "app" / "keep").read_text() == "host data"
    await env.manager.tear_down(UID)  # nothing left: fine


async def test_tear_down_orphans_spares_known_pods(env: Env) -> None:
    other = "5d1c2f3a-7777-4000-8000-000000000002"
    await env.set_up(make_pod(env.host, {"name": "shm", "emptyDir": {"medium": "Memory"}}))
    await env.set_up(make_pod(env.host, {"name": "shm", "emptyDir": {"medium": "Memory"}},
                              uid=other))
    assert await env.manager.tear_down_orphans({UID}) == [other]
    assert sorted(p.name for p in env.pods_dir.iterdir()) == [UID]
    assert await env.manager.tear_down_orphans({UID}) == []

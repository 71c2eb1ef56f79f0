"""volumes.mounts and volumes.subpath: a container's CRI mounts, subPaths resolved safely."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trio_kubelet.model.pod import Container, Pod
from trio_kubelet.volumes import mounter
from trio_kubelet.volumes.atomic_writer import write_atomically
from trio_kubelet.volumes.errors import VolumeError
from trio_kubelet.volumes.mounts import container_mounts, termination_log_mount

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Path]:
    """A pod directory with an emptyDir ``data`` and a configMap ``cfg``, and a host dir."""
    pod_dir = tmp_path / "pods" / "uid-1"
    (pod_dir / "volumes" / "data").mkdir(parents=True)
    (pod_dir / "volumes" / "data").chmod(0o2775)
    (pod_dir / "volumes" / "cfg").mkdir()
    write_atomically(pod_dir / "volumes" / "cfg", {"app.conf": (b"port=80", 0o644)})
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "secret").write_text("the host's")
    yield pod_dir
    for point in mounter.mount_points_under(tmp_path):
        mounter.unmount(point)


def make_pod(*mounts: dict[str, Any]) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "web", "uid": "uid-1"},
        "spec": {
            "volumes": [{"name": "data", "emptyDir": {}},
                        {"name": "cfg", "configMap": {"name": "app"}}],
            "containers": [{"name": "app", "image": "x:1", "volumeMounts": list(mounts)}],
        },
    })


def mounts_of(pod_dir: Path, *mounts: dict[str, Any],
              env: dict[str, str] | None = None) -> list[tuple[str, str, bool]]:
    pod = make_pod(*mounts)
    paths = {"data": pod_dir / "volumes" / "data", "cfg": pod_dir / "volumes" / "cfg"}
    found = container_mounts(pod, pod.spec.containers[0], paths, env or {}, pod_dir=pod_dir)
    return [(m.container_path, m.host_path, m.readonly) for m in found]


def failure(pod_dir: Path, *mounts: dict[str, Any], env: dict[str, str] | None = None) -> str:
    with pytest.raises(VolumeError) as caught:
        mounts_of(pod_dir, *mounts, env=env)
    assert caught.value.reason == "CreateContainerConfigError"
    return caught.value.message


def subpath_target(pod_dir: Path, volume: str, index: int) -> str:
    return str(pod_dir / "volume-subpaths" / volume / "app" / str(index))


def test_plain_mounts_and_read_only_api_data(node: Path) -> None:
    assert mounts_of(
        node,
        {"name": "data", "mountPath": "/data"},
        {"name": "data", "mountPath": "ro", "readOnly": True},
        {"name": "cfg", "mountPath": "/etc/app"},
    ) == [
        ("/data", str(node / "volumes" / "data"), False),
        ("/ro", str(node / "volumes" / "data"), True),
        ("/etc/app", str(node / "volumes" / "cfg"), True),
    ]
    assert mounter.mount_points_under(node) == []


def test_a_volume_that_is_not_set_up_cannot_be_mounted(node: Path) -> None:
    pod = make_pod({"name": "data", "mountPath": "/data"})
    with pytest.raises(VolumeError, match='cannot find volume "data" to mount into container'):
        container_mounts(pod, pod.spec.containers[0], {}, {}, pod_dir=node)


@needs_root
def test_a_file_sub_path_through_the_data_link_is_bind_mounted(node: Path) -> None:
    found = mounts_of(node, {"name": "cfg", "mountPath": "/etc/app.conf", "subPath": "app.conf"})
    target = subpath_target(node, "cfg", 0)
    assert found == [("/etc/app.conf", target, True)]
    assert Path(target).read_bytes() == b"port=80"
    assert mounter.mount_points_under(node) == [Path(target)]
    # A restart of the container reuses the mount.
    again = mounts_of(node, {"name": "cfg", "mountPath": "/x", "subPath": "app.conf"})
    assert again[0][1] == target
    assert mounter.mount_points_under(node) == [Path(target)]


@needs_root
def test_a_changed_sub_path_is_mounted_again(node: Path) -> None:
    mounts_of(node, {"name": "cfg", "mountPath": "/c", "subPath": "app.conf"})
    write_atomically(node / "volumes" / "cfg", {"app.conf": (b"port=81", 0o644)})
    mounts_of(node, {"name": "cfg", "mountPath": "/c", "subPath": "app.conf"})
    target = Path(subpath_target(node, "cfg", 0))
    assert target.read_bytes() == b"port=81"
    assert mounter.mount_points_under(node) == [target]


@needs_root
def test_missing_sub_path_directories_get_the_volume_mode(node: Path) -> None:
    found = mounts_of(node, {"name": "data", "mountPath": "/logs", "subPath": "logs/app"})
    created = node / "volumes" / "data" / "logs" / "app"
    assert stat.S_IMODE(created.stat().st_mode) == 0o2775
    assert stat.S_IMODE(created.parent.stat().st_mode) == 0o2775
    (created / "x").write_text("through the volume")
    assert (Path(found[0][1]) / "x").read_text() == "through the volume"


@needs_root
def test_sub_path_expr_is_expanded_from_the_environment(node: Path) -> None:
    env = {"POD": "web-1", "EMPTY": ""}
    mounts_of(node, {"name": "data", "mountPath": "/l", "subPathExpr": "$(POD)/$$x$(oops"},
              env=env)
    assert (node / "volumes" / "data" / "web-1" / "$x$(oops").is_dir()
    expr = "$(B)/$(EMPTY)/$(A)"
    message = failure(node, {"name": "data", "mountPath": "/l", "subPathExpr": expr}, env=env)
    assert message == "missing value for A, B, EMPTY"


@pytest.mark.parametrize(
    ("sub_path", "message"),
    [
        ("/etc", "error SubPath `/etc` must not be an absolute path"),
        ("a/../..", "unable to provision SubPath `a/../..`: must not contain '..'"),
    ],
)
def test_sub_paths_may_not_leave_the_volume_by_name(
    node: Path, sub_path: str, message: str
) -> None:
    assert failure(node, {"name": "data", "mountPath": "/d", "subPath": sub_path}) == message


@needs_root
def test_symlinks_out_of_the_volume_are_refused(node: Path) -> None:
    host = node.parent.parent / "host"
    data = node / "volumes" / "data"
    (data / "escape").symlink_to(host)
    (data / "chain").symlink_to("escape")  # a relative link to a link out
    (data / "fine").symlink_to(data / "real")
    (data / "real").mkdir()
    what = 'volumeMount "data" of container "app"'
    for sub_path in ("escape/secret", "chain", "escape"):
        assert failure(node, {"name": "data", "mountPath": "/d", "subPath": sub_path}) == (
            f"failed to prepare subPath for {what}"
        )
    assert failure(node, {"name": "data", "mountPath": "/d", "subPath": "escape/new/dir"}) == (
        f"failed to create subPath directory for {what}"
    )
    assert not (host / "new").exists()
    assert mounts_of(node, {"name": "data", "mountPath": "/d", "subPath": "fine"})[0][1] == (
        subpath_target(node, "data", 0)
    )
    assert mounter.mount_points_under(node) == [Path(subpath_target(node, "data", 0))]


def test_termination_log_is_a_fresh_world_writable_file(node: Path) -> None:
    container = Container(name="app", image="x:1", termination_message_path="/dev/termination-log")
    first = termination_log_mount(node, container)
    second = termination_log_mount(node, container)
    assert first is not None and second is not None
    assert first.container_path == "/dev/termination-log"
    assert first.host_path != second.host_path
    host = Path(first.host_path)
    assert host.parent == node / "containers" / "app"
    assert len(host.name) == 8 and int(host.name, 16) >= 0
    assert stat.S_IMODE(host.stat().st_mode) == 0o666 and host.read_bytes() == b""
    assert not first.readonly


def test_no_termination_log_without_a_path(node: Path) -> None:
    assert termination_log_mount(node, Container(name="a", image="x:1",
                                                 termination_message_path="")) is None

"""The CRI mounts of a container: its volume mounts (with subPaths), the pod's /etc/hosts
and its termination log.

The Go kubelet's ``makeMounts`` and kuberuntime's termination-log mount. Choosing the
mounts is pure; the filesystem is touched only to prepare a subPath safely (see
``subpath``), to write the pod's hosts file and to create the termination-log file.
Each is a few system calls, so these functions are synchronous.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from trio_kubelet.core.hosts_file import ETC_HOSTS_PATH, gets_managed_hosts, pod_hosts_content
from trio_kubelet.model.pod import Container, Pod, VolumeMount
from trio_kubelet.runtime.cri.runtime import v1 as cri
from trio_kubelet.volumes.errors import CREATE_CONTAINER_CONFIG_ERROR, VolumeError
from trio_kubelet.volumes.plugins import API_DATA_PLUGINS, volume_plugin
from trio_kubelet.volumes.subpath import UnsafeSubPath, bind_subpath, make_subpath_dirs

log = logging.getLogger("trio_kubelet.volumes")

SUBPATHS_DIR = "volume-subpaths"
CONTAINERS_DIR = "containers"
ETC_HOSTS_FILE = "etc-hosts"
NODE_HOSTS_FILE = Path(ETC_HOSTS_PATH)


def container_mounts(
    pod: Pod,
    container: Container,
    volume_paths: Mapping[str, Path],
    expand_env: Mapping[str, str],
    *,
    pod_dir: Path,
) -> list[cri.Mount]:
    """One mount per volume mount of ``container``, in order.

    ``volume_paths`` is what ``VolumeManager.set_up`` returned, ``expand_env`` the
    container's environment (for ``subPathExpr``), ``pod_dir`` the pod's directory
    (subPath bind mounts live there). Volumes of API data are always read-only.
    Raises ``VolumeError`` with reason CreateContainerConfigError.
    """
    read_only = {
        volume.name for volume in pod.spec.volumes if volume_plugin(volume)[0] in API_DATA_PLUGINS
    }
    mounts = []
    for index, mount in enumerate(container.volume_mounts):
        volume_path = volume_paths.get(mount.name)
        if volume_path is None:
            raise _config_error(
                f'cannot find volume "{mount.name}" to mount into container "{container.name}"'
            )
        host_path = volume_path
        sub_path = _sub_path(mount, expand_env)
        if sub_path:
            target = pod_dir / SUBPATHS_DIR / mount.name / container.name / str(index)
            host_path = _prepare_subpath(volume_path, sub_path, target, mount, container)
        mounts.append(
            cri.Mount(
                container_path=_absolute(mount.mount_path),
                host_path=str(host_path),
                readonly=mount.read_only or mount.name in read_only,
            )
        )
    return mounts


def etc_hosts_mount(
    pod_dir: Path,
    pod: Pod,
    container: Container,
    pod_ips: Sequence[str],
    *,
    cluster_domain: str,
    node_hosts_file: Path = NODE_HOSTS_FILE,
) -> cri.Mount | None:
    """``<pod_dir>/etc-hosts`` at the container's /etc/hosts; None when it gets none.

    As the Go kubelet, the file is written again at each container start, so a
    sandbox re-created with another IP is named right; hostNetwork pods get the
    node's file as it is now. Raises ``VolumeError`` (CreateContainerConfigError).
    """
    if not gets_managed_hosts(pod, container, pod_ips):
        return None
    node_hosts = ""
    if pod.spec.host_network:
        try:
            node_hosts = node_hosts_file.read_bytes().decode("utf-8", "surrogateescape")
        except OSError as err:
            log.error("Cannot read the node's hosts file %s: %s", node_hosts_file, err)
            raise _config_error(f"cannot read the node's hosts file {node_hosts_file}") from None
    content = pod_hosts_content(pod, pod_ips, cluster_domain, node_hosts)
    host_path = pod_dir / ETC_HOSTS_FILE
    try:
        _write_in_place(host_path, content.encode("utf-8", "surrogateescape"))
    except OSError as err:
        log.error("Cannot write the hosts file %s: %s", host_path, err)
        raise _config_error(
            f'cannot write the hosts file of container "{container.name}"'
        ) from None
    return cri.Mount(container_path=ETC_HOSTS_PATH, host_path=str(host_path), selinux_relabel=True)


def _write_in_place(path: Path, content: bytes) -> None:
    """Rewrite the file itself, not a replacement: running containers have its inode mounted.

    An unchanged file is left alone, so a container reading it never sees it truncated.
    """
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    try:
        if path.read_bytes() == content:
            return
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
    with os.fdopen(os.open(path, flags, 0o644), "wb") as file:
        file.write(content)
    os.chmod(path, 0o644)


def termination_log_mount(pod_dir: Path, container: Container) -> cri.Mount | None:
    """A fresh, world-writable file at ``terminationMessagePath``; None without one.

    Each start of a container gets its own ``<pod>/containers/<name>/<random>`` file.
    As in Go, a file that cannot be made is logged and the container runs without it.
    """
    if not container.termination_message_path:
        return None
    host_path = pod_dir / CONTAINERS_DIR / container.name / os.urandom(4).hex()
    try:
        host_path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        os.close(os.open(host_path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC, 0o666))
        os.chmod(host_path, 0o666)  # any user of the container may write its message
    except OSError as err:
        log.error("Cannot create the termination-log file %s: %s", host_path, err)
        return None
    return cri.Mount(
        container_path=_absolute(container.termination_message_path), host_path=str(host_path)
    )


def _sub_path(mount: VolumeMount, env: Mapping[str, str]) -> str:
    """The subPath, with ``subPathExpr`` expanded; both are rejected when they leave the volume."""
    sub_path = mount.sub_path or ""
    if mount.sub_path_expr:
        sub_path, missing = _expand(mount.sub_path_expr, env)
        if missing:
            raise _config_error(f"missing value for {', '.join(sorted(missing))}")
    if sub_path.startswith("/"):
        raise _config_error(f"error SubPath `{sub_path}` must not be an absolute path")
    if ".." in sub_path.split("/"):
        raise _config_error(f"unable to provision SubPath `{sub_path}`: must not contain '..'")
    return sub_path


def _expand(text: str, env: Mapping[str, str]) -> tuple[str, set[str]]:
    """``$(VAR)`` references replaced from ``env`` as Go's expansion does, and the missing names.

    ``$$`` is a literal ``$``, an unterminated ``$(`` stays as it is. Names without a
    (non-empty) value expand to nothing and are reported missing.
    """
    out: list[str] = []
    missing: set[str] = set()
    cursor = 0
    while cursor < len(text):
        char = text[cursor]
        if char != "$" or cursor + 1 == len(text):
            out.append(char)
            cursor += 1
            continue
        following = text[cursor + 1]
        close = text.find(")", cursor + 2) if following == "(" else -1
        if following == "$":
            out.append("$")
        elif close != -1:
            name = text[cursor + 2 : close]
            value = env.get(name, "")
            if not value:
                missing.add(name)
            out.append(value)
            cursor = close + 1
            continue
        else:
            out.append("$" + following)
        cursor += 2
    return "".join(out), missing


def _prepare_subpath(
    volume_path: Path, sub_path: str, target: Path, mount: VolumeMount, container: Container
) -> Path:
    """Go keeps the details out of the message: they would describe the host's filesystem."""
    what = f'volumeMount "{mount.name}" of container "{container.name}"'
    if not os.path.exists(os.path.join(volume_path, sub_path)):
        try:
            make_subpath_dirs(volume_path, sub_path)
        except (OSError, UnsafeSubPath) as err:
            log.error("Cannot create subPath %r of %s: %s", sub_path, what, err)
            raise _config_error(f"failed to create subPath directory for {what}") from None
    try:
        return bind_subpath(volume_path, sub_path, target)
    except (OSError, UnsafeSubPath) as err:
        log.error("Cannot prepare subPath %r of %s: %s", sub_path, what, err)
        raise _config_error(f"failed to prepare subPath for {what}") from None


def _absolute(path: str) -> str:
    return path if path.startswith("/") else "/" + path


def _config_error(message: str) -> VolumeError:
    return VolumeError(CREATE_CONTAINER_CONFIG_ERROR, message)

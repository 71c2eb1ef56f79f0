"""A container's CRI config with what its spec only refers to (``generateContainerConfig``).

Its environment (``core.env``: values, fields, resources, ConfigMaps and Secrets), its
command and args with ``$(VAR)`` expanded, its mounts (volumes, the pod's /etc/hosts,
the termination log), and the checks the Go kubelet makes at this point (runAsNonRoot
against the image's user). A failure is the container's ``CreateContainerConfigError``
with the precise reason; other containers go on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from trio_kubelet.core.env import (
    CREATE_CONTAINER_CONFIG_ERROR,
    EnvError,
    container_env,
    expand_command,
)
from trio_kubelet.core.objects import ObjectLookup
from trio_kubelet.core.pod_dns import DNSSettings
from trio_kubelet.model.pod import Container, Pod
from trio_kubelet.runtime import configs
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.cri.runtime import v1 as cri
from trio_kubelet.runtime.security import (
    SecurityContextError,
    effective_security_context,
    verify_run_as_non_root,
)
from trio_kubelet.volumes import VolumeError, container_mounts, termination_log_mount
from trio_kubelet.volumes.mounts import etc_hosts_mount


class ContainerConfigError(Exception):
    """The container cannot be configured; ``message`` is shown in its waiting state."""

    reason = CREATE_CONTAINER_CONFIG_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What a pod reads of the node: its IPs and allocatable resources (the environment),
    its DNS settings (the sandbox's resolv.conf, the cluster domain in /etc/hosts).

    ``dns`` None leaves resolv.conf to the runtime (tests, replay).
    """

    host_ips: Sequence[str] = ()
    allocatable: Mapping[str, Fraction] | None = None
    dns: DNSSettings | None = None


async def prepare_container(
    client: CRIClient,
    lookup: ObjectLookup,
    node: NodeFacts,
    pod: Pod,
    container: Container,
    pod_ips: Sequence[str],
    *,
    kind: str,
    image_ref: str,
    restart_count: int,
    volume_paths: Mapping[str, Path] | None = None,
    pod_dir: Path | None = None,
) -> cri.ContainerConfig:
    """The container's CRI config, env and command resolved; raises ContainerConfigError."""
    try:
        await _check_run_as_non_root(client, pod, container, image_ref)
        envs = container_env(
            pod,
            container,
            lookup=lookup,
            pod_ip=pod_ips[0] if pod_ips else "",
            pod_ips=list(pod_ips),
            host_ip=node.host_ips[0] if node.host_ips else "",
            host_ips=list(node.host_ips),
            node_allocatable=node.allocatable or {},
        )
        command, args = expand_command(container, envs)
        mounts: list[cri.Mount] = []
        if pod_dir is not None:
            mounts = container_mounts(
                pod, container, volume_paths or {}, dict(envs), pod_dir=pod_dir
            )
            hosts = etc_hosts_mount(
                pod_dir,
                pod,
                container,
                pod_ips,
                cluster_domain=node.dns.cluster_domain if node.dns is not None else "",
            )
            if hosts is not None:
                mounts.append(hosts)
            termination_log = termination_log_mount(pod_dir, container)
            if termination_log is not None:
                mounts.append(termination_log)
        config = configs.container_config(
            pod,
            container,
            kind=kind,
            image_ref=image_ref,
            restart_count=restart_count,
            envs=envs,
            command=command,
            args=args,
            mounts=mounts,
        )
    except VolumeError as err:
        raise ContainerConfigError(err.message) from None
    except (EnvError, SecurityContextError) as err:
        raise ContainerConfigError(str(err)) from None
    return config


async def _check_run_as_non_root(
    client: CRIClient, pod: Pod, container: Container, image_ref: str
) -> None:
    effective = effective_security_context(pod, container)
    if not effective.run_as_non_root:
        return
    uid: int | None = None
    username = ""
    if effective.run_as_user is None:  # only then does the image's user matter
        image = await client.image_status(image_ref)
        if image is not None:
            uid = image.uid.value if image.uid is not None else None
            username = image.username
    problem = verify_run_as_non_root(pod, container, uid, username)
    if problem is not None:
        raise ContainerConfigError(problem)

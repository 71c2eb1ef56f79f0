"""Translating a pod spec into the CRI's sandbox and container configurations."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trio_kubelet.core.hashing import container_hash
from trio_kubelet.core.pod_dns import ResolvConf
from trio_kubelet.core.pod_hostname import pod_hostname
from trio_kubelet.core.resources import linux_resources
from trio_kubelet.model.pod import Container, Pod
from trio_kubelet.runtime import labels, security
from trio_kubelet.runtime.cri.runtime import v1 as cri

_PROTOCOLS = {"TCP": cri.Protocol.TCP, "UDP": cri.Protocol.UDP, "SCTP": cri.Protocol.SCTP}


def pod_log_directory(pod_logs_dir: Path, pod: Pod) -> Path:
    """``<podLogsDir>/<namespace>_<name>_<uid>``, where the runtime writes container logs."""
    meta = pod.metadata
    return pod_logs_dir / f"{meta.namespace}_{meta.name}_{meta.uid}"


def container_log_path(container_name: str, restart_count: int) -> str:
    """The log file of one container instance, relative to the pod log directory."""
    return f"{container_name}/{restart_count}.log"


def sandbox_hostname(pod: Pod) -> str:
    """The pod's hostname: empty with host network (the runtime needs its own UTS namespace)."""
    if pod.spec.host_network:
        return ""
    return pod_hostname(pod)


def sandbox_config(
    pod: Pod,
    attempt: int,
    pod_logs_dir: Path,
    *,
    cgroup_parent: str = "",
    dns: ResolvConf | None = None,
) -> cri.PodSandboxConfig:
    """``cgroup_parent``: the pod's cgroup (cgroupsPerQOS), "" for the runtime's default.

    ``dns``: the pod's resolver configuration (``core.pod_dns``); None lets the runtime
    copy the node's resolv.conf.
    """
    meta = pod.metadata
    ports = [
        cri.PortMapping(
            protocol=_PROTOCOLS[port.protocol],
            container_port=port.container_port,
            host_port=port.host_port,
            host_ip=port.host_ip or "",
        )
        for container in pod.spec.containers
        for port in container.ports
        if port.host_port
    ]
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(
            name=meta.name, uid=meta.uid, namespace=meta.namespace, attempt=attempt
        ),
        hostname=sandbox_hostname(pod),
        log_directory=str(pod_log_directory(pod_logs_dir, pod)),
        dns_config=_dns_config(dns) if dns is not None else None,
        port_mappings=ports,
        labels=labels.sandbox_labels(meta.uid, meta.name, meta.namespace, meta.labels),
        annotations=dict(meta.annotations),
        linux=cri.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent,
            security_context=security.sandbox_security_context(pod),
            sysctls=security.pod_sysctls(pod),
        ),
    )


def _dns_config(dns: ResolvConf) -> cri.DnsConfig:
    return cri.DnsConfig(
        servers=list(dns.servers), searches=list(dns.searches), options=list(dns.options)
    )


def container_config(
    pod: Pod,
    container: Container,
    *,
    kind: str,
    image_ref: str,
    restart_count: int,
    envs: Sequence[tuple[str, str]] | None = None,
    command: Sequence[str] | None = None,
    args: Sequence[str] | None = None,
    mounts: Sequence[cri.Mount] = (),
) -> cri.ContainerConfig:
    """``kind`` is "init", "sidecar", "ephemeral" or "regular" (stored for adoption and GC).

    ``envs``, ``command`` and ``args`` are the resolved and expanded ones
    (``reconcile.container_setup``); left out, the spec's literal values are used.
    """
    meta = pod.metadata
    if envs is None:
        envs = [(env.name, env.value or "") for env in container.env]
    return cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name=container.name, attempt=restart_count),
        image=cri.ImageSpec(image=image_ref, user_specified_image=container.image),
        command=list(container.command if command is None else command),
        args=list(container.args if args is None else args),
        working_dir=container.working_dir or "",
        envs=[cri.KeyValue(key=key, value=value) for key, value in envs],
        mounts=list(mounts),
        labels=labels.container_labels(meta.uid, meta.name, meta.namespace, container.name),
        annotations=labels.container_annotations(
            container_hash(container),
            restart_count,
            kind,
            pod.spec.termination_grace_period_seconds,
        ),
        log_path=container_log_path(container.name, restart_count),
        stdin=container.stdin,
        stdin_once=container.stdin_once,
        tty=container.tty,
        linux=cri.LinuxContainerConfig(
            resources=_linux_resources(container),
            security_context=security.container_security_context(pod, container),
        ),
    )


def _linux_resources(container: Container) -> cri.LinuxContainerResources:
    wanted = linux_resources(container)
    return cri.LinuxContainerResources(
        cpu_shares=wanted.cpu_shares,
        cpu_quota=wanted.cpu_quota,
        cpu_period=wanted.cpu_period,
        memory_limit_in_bytes=wanted.memory_limit_bytes,
    )

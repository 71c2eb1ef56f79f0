"""The real-runtime environment works: images loaded, host-network and CNI pods run through CRI."""

from __future__ import annotations

import ipaddress
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cri_api.v1 import api_pb2 as cri

if TYPE_CHECKING:
    from conftest import Containerd

pytestmark = pytest.mark.integration
CRI_TIMEOUT = 30.0


def sandbox_config(name: str, log_dir: Path, *, host_network: bool) -> cri.PodSandboxConfig:
    network = cri.NODE if host_network else cri.POD
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name=name, namespace="default", uid=f"uid-{name}"),
        # A host-network sandbox shares the node's UTS namespace: it must not set a hostname.
        hostname="" if host_network else name,
        log_directory=str(log_dir),
        linux=cri.LinuxPodSandboxConfig(
            security_context=cri.LinuxSandboxSecurityContext(
                namespace_options=cri.NamespaceOption(network=network)
            )
        ),
    )


def run_pod(
    containerd: Containerd, config: cri.PodSandboxConfig, command: list[str]
) -> tuple[str, str]:
    """Run a sandbox with one busybox container; return (sandbox id, container id)."""
    runtime = containerd.runtime_service
    sandbox_id = runtime.RunPodSandbox(
        cri.RunPodSandboxRequest(config=config), timeout=CRI_TIMEOUT
    ).pod_sandbox_id
    container = cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name="main"),
        image=cri.ImageSpec(image=containerd.BUSYBOX_TAGGED),
        command=command,
        log_path="main.log",
    )
    container_id = runtime.CreateContainer(
        cri.CreateContainerRequest(
            pod_sandbox_id=sandbox_id, config=container, sandbox_config=config
        ),
        timeout=CRI_TIMEOUT,
    ).container_id
    runtime.StartContainer(
        cri.StartContainerRequest(container_id=container_id), timeout=CRI_TIMEOUT
    )
    return sandbox_id, container_id


def container_state(containerd: Containerd, container_id: str) -> int:
    status = containerd.runtime_service.ContainerStatus(
        cri.ContainerStatusRequest(container_id=container_id), timeout=CRI_TIMEOUT
    ).status
    return int(status.state)


def http_get(host: str, port: int, path: str, deadline: float) -> bytes:
    """GET over a raw socket, retrying until the server listens or the deadline passes."""
    while True:
        try:
            with socket.create_connection((host, port), timeout=1) as conn:
                conn.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
                return b"".join(iter(lambda: conn.recv(4096), b""))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_images_are_loaded_in_the_k8s_namespace(containerd: Containerd) -> None:
    refs = set(containerd.ctr("images", "ls", "-q").split())
    assert {containerd.BUSYBOX, containerd.BUSYBOX_TAGGED, containerd.PAUSE} <= refs

    # The CRI plugin indexes what ctr imported: the agent will see the same images.
    images = containerd.image_service.ListImages(cri.ListImagesRequest(), timeout=CRI_TIMEOUT)
    cri_tags = {tag for image in images.images for tag in image.repo_tags}
    assert containerd.BUSYBOX_TAGGED in cri_tags
    assert containerd.PAUSE in cri_tags


def test_host_network_pod_runs(containerd: Containerd, tmp_path: Path) -> None:
    config = sandbox_config("hostnet", tmp_path, host_network=True)
    sandbox_id, container_id = run_pod(containerd, config, ["sleep", "5"])

    assert container_state(containerd, container_id) == cri.CONTAINER_RUNNING
    status = containerd.runtime_service.PodSandboxStatus(
        cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id), timeout=CRI_TIMEOUT
    ).status
    assert status.state == cri.SANDBOX_READY
    assert status.network.ip == ""


def test_cni_pod_gets_an_ip_reachable_from_the_host(containerd: Containerd, tmp_path: Path) -> None:
    config = sandbox_config("cni", tmp_path, host_network=False)
    command = ["httpd", "-f", "-p", "8080", "-h", "/etc"]
    sandbox_id, container_id = run_pod(containerd, config, command)

    status = containerd.runtime_service.PodSandboxStatus(
        cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id), timeout=CRI_TIMEOUT
    ).status
    pod_ip = ipaddress.ip_address(status.network.ip)
    assert pod_ip in ipaddress.ip_network("10.88.0.0/16")
    assert container_state(containerd, container_id) == cri.CONTAINER_RUNNING
    body = http_get(str(pod_ip), 8080, "/group", deadline=time.monotonic() + 10)
    assert b"nobody:x:65534:" in body


def test_reset_leaves_no_pods_behind(containerd: Containerd, tmp_path: Path) -> None:
    run_pod(containerd, sandbox_config("leftover", tmp_path, host_network=False), ["sleep", "60"])

    containerd.reset()

    runtime = containerd.runtime_service
    assert not runtime.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=CRI_TIMEOUT).items
    assert not runtime.ListContainers(cri.ListContainersRequest(), timeout=CRI_TIMEOUT).containers
    assert containerd.ctr("containers", "ls", "-q").split() == []

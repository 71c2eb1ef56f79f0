"""What the Node object says about the machine: read from the host (blocking; run in a thread).

The Go kubelet takes these from cAdvisor's MachineInfo (cores, memory, huge pages, ids), its
VersionInfo (kernel, OS image) and the root filesystem's size. The cAdvisor-style machine
description is the one ``/spec`` serves (``node/machine_info.read_machine_spec``), so both
report the same machine.
"""

from __future__ import annotations

import ipaddress
import os
import platform
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trio_kubelet.node.machine_info import read_machine_spec
from trio_kubelet.node.registration import MachineFacts

# Python's platform.machine() → Go's GOARCH, the names Kubernetes uses for kubernetes.io/arch.
GO_ARCH = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "arm",
    "armv6l": "arm",
    "i386": "386",
    "i686": "386",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}


def go_architecture(machine: str) -> str:
    return GO_ARCH.get(machine.lower(), machine.lower())


def os_image(os_release: str) -> str:
    """PRETTY_NAME from /etc/os-release, or "Linux" as cAdvisor falls back to."""
    match = re.search(r"^PRETTY_NAME=(.*)$", os_release, re.M)
    if not match:
        return "Linux"
    return match.group(1).strip().strip("\"'") or "Linux"


def machine_facts(
    info: Mapping[str, Any], *, root_fs_bytes: int, kernel: str, os_release: str, machine: str
) -> MachineFacts:
    """Facts from a cAdvisor MachineInfo mapping plus what cAdvisor's VersionInfo adds."""
    return MachineFacts(
        num_cores=int(info.get("num_cores") or 0),
        memory_bytes=int(info.get("memory_capacity") or 0),
        ephemeral_storage_bytes=root_fs_bytes,
        hugepages=tuple(
            (int(page["page_size"]), int(page["num_pages"])) for page in info.get("hugepages", ())
        ),
        machine_id=str(info.get("machine_id", "")),
        system_uuid=str(info.get("system_uuid", "")),
        boot_id=str(info.get("boot_id", "")),
        kernel_version=kernel,
        os_image=os_image(os_release),
        architecture=go_architecture(machine),
    )


def read_machine_facts(root_dir: Path) -> MachineFacts:
    """Read the host. ``root_dir`` (or its nearest existing parent) sizes ephemeral-storage."""
    directory = root_dir
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    st = os.statvfs(directory)
    try:
        os_release = Path("/etc/os-release").read_text(errors="replace")
    except OSError:
        os_release = ""
    return machine_facts(
        read_machine_spec(),
        root_fs_bytes=st.f_blocks * st.f_frsize,
        kernel=platform.release(),
        os_release=os_release,
        machine=platform.machine(),
    )


# --- the node's InternalIP ----------------------------------------------------------------


def usable_node_ip(address: str) -> bool:
    """Go's validateNodeIP: not loopback, multicast, link-local or unspecified, and on this host."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if ip.is_loopback or ip.is_multicast or ip.is_link_local or ip.is_unspecified:
        return False
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((address, 0))  # succeeds only for an address of one of our interfaces
    except OSError:
        return False
    return True


def _default_route_address() -> str | None:
    """The source address of the default route (Go's ChooseHostInterface); no packet is sent."""
    for family, target in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((target, 9))
                address = str(probe.getsockname()[0])
        except OSError:
            continue
        if usable_node_ip(address):
            return address
    return None


def internal_ips(node_ip: str | None, node_name: str) -> list[str]:
    """The node's InternalIP address(es), in the Go kubelet's order of preference.

    ``--node-ip`` if given; else the node name if it is an IP; else the first usable IPv4
    (then IPv6) address the node name resolves to; else the default route's source address.
    Empty when nothing qualifies (the Node then only has its Hostname address).
    """
    if node_ip:
        return node_ip.split(",")
    try:
        ipaddress.ip_address(node_name)
    except ValueError:
        pass
    else:
        return [node_name]
    try:
        resolved = [str(entry[4][0]) for entry in socket.getaddrinfo(node_name, None)]
    except OSError:
        resolved = []
    usable = [address for address in dict.fromkeys(resolved) if usable_node_ip(address)]
    ipv4 = [address for address in usable if ":" not in address]
    if usable:
        return (ipv4 or usable)[:1]
    chosen = _default_route_address()
    return [chosen] if chosen else []

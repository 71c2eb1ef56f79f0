"""The machine's facts, read from /proc and /sys: the one reader of cores, memory and ids.

Two views are built from the same low-level readers, so they never disagree about the
machine: ``read_machine_spec`` is cAdvisor's ``MachineInfo`` JSON (what ``/spec`` serves and
what node registration takes its capacity and ids from), and the sampler's
``sources/sampler.read_machine_info`` keeps the few facts the stats need. Everything here
blocks on small file reads: read it once at start, in a thread.

Nothing here imports the rest of the agent, so ``sources/`` and ``server/`` can both use it.
"""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MachineIds",
    "cpuinfo_processors",
    "num_cores",
    "parse_meminfo",
    "read_machine_ids",
    "read_machine_spec",
    "read_meminfo",
]


# --- low-level readers (shared with the sampler) -------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _read_int(path: Path, default: int = 0) -> int:
    text = _read(path)
    try:
        return int(text.strip()) if text is not None else default
    except ValueError:
        return default


def _first_value(*paths: Path) -> str:
    """The first of ``paths`` that holds something; an empty file is passed over like a missing
    one (an image ships /etc/machine-id empty until first boot fills it)."""
    for path in paths:
        value = (_read(path) or "").strip()
        if value:
            return value
    return ""


@dataclass(frozen=True, slots=True)
class MachineIds:
    """The identifiers the Node's nodeInfo, ``/spec`` and the cAdvisor metrics all report."""

    machine_id: str
    system_uuid: str
    boot_id: str


def read_machine_ids(root: Path = Path("/"), proc: Path | None = None) -> MachineIds:
    """The ids under ``root``; ``proc`` (default ``root/proc``) is where boot_id is read."""
    proc = root / "proc" if proc is None else proc
    return MachineIds(
        machine_id=_first_value(root / "etc/machine-id", root / "var/lib/dbus/machine-id"),
        system_uuid=_first_value(root / "sys/class/dmi/id/product_uuid"),
        boot_id=_first_value(proc / "sys/kernel/random/boot_id"),
    )


def cpuinfo_processors(proc: Path) -> list[dict[str, str]]:
    """One ``key: value`` mapping per logical CPU in ``proc/cpuinfo``.

    A CPU starts at its ``processor`` line and ends at a blank line or the next CPU, so a
    block without one (ARM's trailing ``Hardware`` block) is not a CPU.
    """
    processors: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in (_read(proc / "cpuinfo") or "").splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key == "processor":
            current = {}
            processors.append(current)
        elif not line:
            current = None
        if sep and current is not None:
            current[key] = value.strip()
    return processors


def num_cores(processors: list[dict[str, str]]) -> int:
    """Logical CPUs: those cpuinfo lists, else what the OS says (cpuinfo formats vary by arch)."""
    return len(processors) or os.cpu_count() or 1


def parse_meminfo(data: bytes) -> dict[str, int]:
    """A meminfo file in bytes. Also on the sampler's per-tick path: keep it lean.

    A NUMA node's meminfo keeps its ``Node N`` prefix in the keys (``"Node 0 MemTotal"``).
    """
    figures: dict[str, int] = {}
    for line in data.decode().splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields:
            figures[key] = int(fields[0]) * (1024 if len(fields) > 1 else 1)
    return figures


def read_meminfo(path: Path) -> dict[str, int]:
    """``parse_meminfo`` of ``path``; empty when it cannot be read or parsed (the machine
    description is best effort, and a start must not fail on it)."""
    try:
        return parse_meminfo(path.read_bytes())
    except (OSError, ValueError):
        return {}


# --- cAdvisor's MachineInfo (/spec) --------------------------------------------------------


def _cpuinfo(root: Path) -> dict[str, Any]:
    processors = cpuinfo_processors(root / "proc")
    sockets = {p.get("physical id", "0") for p in processors}
    cores = {(p.get("physical id", "0"), p.get("core id", p["processor"])) for p in processors}
    logical = num_cores(processors)
    mhz = next((p["cpu MHz"] for p in processors if "cpu MHz" in p), "0")
    khz = _read_int(root / "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if not khz:
        try:
            khz = int(float(mhz) * 1000)
        except ValueError:
            khz = 0
    return {
        "vendor_id": next((p["vendor_id"] for p in processors if "vendor_id" in p), ""),
        "num_cores": logical,
        "num_physical_cores": len(cores) or logical,
        "num_sockets": len(sockets) or 1,
        "cpu_frequency_khz": khz,
    }


def _hugepages(directory: Path) -> list[dict[str, int]]:
    pages = []
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return []
    for entry in entries:
        match = re.fullmatch(r"hugepages-(\d+)kB", entry.name)
        if match:
            pages.append({"page_size": int(match.group(1)),
                          "num_pages": _read_int(entry / "nr_hugepages")})
    return pages


def _unescape_mount(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _filesystems(root: Path) -> list[dict[str, Any]]:
    seen: set[str] = set()
    filesystems = []
    for line in (_read(root / "proc/mounts") or "").splitlines():
        fields = line.split()
        if len(fields) < 3 or not fields[0].startswith("/dev/") or fields[0] in seen:
            continue
        seen.add(fields[0])
        try:
            st = os.statvfs(_unescape_mount(fields[1]))
        except OSError:
            continue
        filesystems.append({"device": fields[0], "capacity": st.f_blocks * st.f_frsize,
                            "type": "vfs", "inodes": st.f_files, "has_inodes": st.f_files > 0})
    return filesystems


def _disk_map(root: Path) -> dict[str, dict[str, Any]]:
    disks: dict[str, dict[str, Any]] = {}
    try:
        devices = sorted((root / "sys/block").iterdir())
    except OSError:
        return disks
    for device in devices:
        if device.name.startswith(("loop", "ram")):
            continue
        numbers = (_read(device / "dev") or "").strip()
        major, sep, minor = numbers.partition(":")
        if not sep:
            continue
        scheduler = re.search(r"\[(.+?)\]", _read(device / "queue/scheduler") or "")
        disks[numbers] = {"name": device.name, "major": int(major), "minor": int(minor),
                          "size": _read_int(device / "size") * 512,
                          "scheduler": scheduler.group(1) if scheduler else "none"}
    return disks


def _network_devices(root: Path) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = []
    try:
        interfaces = sorted((root / "sys/class/net").iterdir())
    except OSError:
        return devices
    for interface in interfaces:
        if interface.name == "lo" or interface.name.startswith("veth"):
            continue
        devices.append({"name": interface.name,
                        "mac_address": (_read(interface / "address") or "").strip(),
                        "speed": _read_int(interface / "speed"),
                        "mtu": _read_int(interface / "mtu")})
    return devices


def _cpu_list(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        low, sep, high = part.partition("-")
        if low.isdigit():
            cpus.extend(range(int(low), int(high) + 1) if sep and high.isdigit() else [int(low)])
    return cpus


def _topology(root: Path) -> list[dict[str, Any]]:
    nodes = []
    try:
        node_dirs = sorted((root / "sys/devices/system/node").glob("node[0-9]*"),
                           key=lambda p: int(p.name[4:]))
    except OSError:
        return []
    for node_dir in node_dirs:
        node_id = int(node_dir.name[4:])
        cores: dict[tuple[int, int], list[int]] = {}
        for cpu in _cpu_list(_read(node_dir / "cpulist") or ""):
            topology = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
            key = (_read_int(topology / "physical_package_id"), _read_int(topology / "core_id"))
            cores.setdefault(key, []).append(cpu)
        nodes.append({
            "node_id": node_id,
            "memory": read_meminfo(node_dir / "meminfo").get(f"Node {node_id} MemTotal", 0),
            "hugepages": _hugepages(node_dir / "hugepages"),
            "cores": [{"core_id": core, "thread_ids": sorted(threads), "caches": [],
                       "uncore_caches": None, "socket_id": socket}
                      for (socket, core), threads in sorted(cores.items())],
            "caches": [],
        })
    return nodes


def read_machine_spec(root: Path = Path("/")) -> dict[str, Any]:
    """The machine as cAdvisor's ``MachineInfo`` JSON, from /proc and /sys under ``root``.

    Blocking (a few dozen small reads and statvfs calls): read it once at start.
    """
    meminfo = read_meminfo(root / "proc/meminfo")
    ids = read_machine_ids(root)
    return {
        "timestamp": datetime.datetime.now(datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"),
        **_cpuinfo(root),
        "memory_capacity": meminfo.get("MemTotal", 0),
        "swap_capacity": meminfo.get("SwapTotal", 0),
        "memory_by_type": {},
        "nvm": {"memory_mode_capacity": 0, "app direct_mode_capacity": 0, "avg_power_budget": 0},
        "hugepages": _hugepages(root / "sys/kernel/mm/hugepages"),
        "machine_id": ids.machine_id,
        "system_uuid": ids.system_uuid,
        "boot_id": ids.boot_id,
        "filesystems": _filesystems(root),
        "disk_map": _disk_map(root),
        "network_devices": _network_devices(root),
        "topology": _topology(root),
        "cloud_provider": "Unknown",
        "instance_type": "Unknown",
        "instance_id": "None",
    }

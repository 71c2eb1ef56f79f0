"""node.machine_info: the machine's facts from a fake /proc and /sys, and both views agreeing."""

from __future__ import annotations

import json
import os
from pathlib import Path

from trio_kubelet.node.machine_info import (
    cpuinfo_processors,
    num_cores,
    parse_meminfo,
    read_machine_ids,
    read_machine_spec,
    read_meminfo,
)
from trio_kubelet.sources.sampler import read_machine_info

CPU = "processor\t: {0}\nvendor_id\t: GenuineIntel\nphysical id\t: 0\ncore id\t: {1}\n" \
      "cpu MHz\t\t: 2400.000\n"


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# --- the shared readers ----------------------------------------------------------------------


def test_cpuinfo_has_one_mapping_per_processor_line(tmp_path: Path) -> None:
    write(tmp_path, "cpuinfo", "\n".join(CPU.format(n, n % 2) for n in range(3))
          + "\nHardware\t: BCM2835\nRevision\t: a02082\n")
    processors = cpuinfo_processors(tmp_path)
    assert [p["processor"] for p in processors] == ["0", "1", "2"]
    assert processors[1]["core id"] == "1"
    assert "Hardware" not in processors[2], "ARM's trailing block is not a CPU"
    # Without blank lines between them, each processor line still starts a CPU.
    write(tmp_path, "cpuinfo", "processor\t: 0\nprocessor\t: 1\n")
    assert num_cores(cpuinfo_processors(tmp_path)) == 2


def test_num_cores_falls_back_to_the_os_without_cpuinfo(tmp_path: Path) -> None:
    assert cpuinfo_processors(tmp_path) == []
    assert num_cores([]) == (os.cpu_count() or 1)


def test_meminfo_in_bytes() -> None:
    assert parse_meminfo(b"MemTotal:  2 kB\nHugePages_Total:  4\n") == {
        "MemTotal": 2048, "HugePages_Total": 4}
    assert parse_meminfo(b"Node 1 MemTotal:  3 kB\n") == {"Node 1 MemTotal": 3072}


def test_read_meminfo_is_empty_when_unreadable(tmp_path: Path) -> None:
    assert read_meminfo(tmp_path / "missing") == {}
    write(tmp_path, "garbled", "MemTotal: lots kB\n")
    assert read_meminfo(tmp_path / "garbled") == {}


def test_machine_ids_fall_back_to_dbus_when_etc_has_none(tmp_path: Path) -> None:
    write(tmp_path, "var/lib/dbus/machine-id", "from-dbus\n")
    write(tmp_path, "sys/class/dmi/id/product_uuid", "uuid-1\n")
    write(tmp_path, "other-proc/sys/kernel/random/boot_id", "boot-2\n")
    ids = read_machine_ids(tmp_path, tmp_path / "other-proc")
    assert (ids.machine_id, ids.system_uuid, ids.boot_id) == ("from-dbus", "uuid-1", "boot-2")
    write(tmp_path, "etc/machine-id", "")  # an image's placeholder before first boot
    assert read_machine_ids(tmp_path).machine_id == "from-dbus"
    write(tmp_path, "etc/machine-id", "from-etc\n")
    assert read_machine_ids(tmp_path).machine_id == "from-etc"
    assert read_machine_ids(tmp_path).boot_id == "", "boot_id is read under root/proc"


# --- the cAdvisor MachineInfo (/spec) --------------------------------------------------------


def test_read_machine_spec_from_proc_and_sys(tmp_path: Path) -> None:
    write(tmp_path, "proc/cpuinfo", "\n".join(CPU.format(n, n % 2) for n in range(4)))
    write(tmp_path, "proc/meminfo", "MemTotal:       2048 kB\nSwapTotal:      1024 kB\n")
    write(tmp_path, "etc/machine-id", "abc\n")
    write(tmp_path, "proc/sys/kernel/random/boot_id", "boot-1\n")
    write(tmp_path, "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "3\n")
    write(tmp_path, "proc/mounts", "/dev/root / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n")
    write(tmp_path, "sys/block/sda/dev", "8:0\n")
    write(tmp_path, "sys/block/sda/size", "100\n")
    write(tmp_path, "sys/block/sda/queue/scheduler", "none [mq-deadline]\n")
    write(tmp_path, "sys/block/loop0/dev", "7:0\n")
    write(tmp_path, "sys/class/net/eth0/address", "02:00:00:00:00:01\n")
    write(tmp_path, "sys/class/net/eth0/mtu", "1500\n")
    write(tmp_path, "sys/class/net/lo/mtu", "65536\n")
    write(tmp_path, "sys/devices/system/node/node0/cpulist", "0-1\n")
    write(tmp_path, "sys/devices/system/node/node0/meminfo", "Node 0 MemTotal:  1024 kB\n")
    write(tmp_path, "sys/devices/system/cpu/cpu1/topology/core_id", "1\n")

    info = read_machine_spec(tmp_path)
    assert (info["num_cores"], info["num_physical_cores"], info["num_sockets"]) == (4, 2, 1)
    assert info["vendor_id"] == "GenuineIntel"
    assert info["cpu_frequency_khz"] == 2_400_000
    assert (info["memory_capacity"], info["swap_capacity"]) == (2048 * 1024, 1024 * 1024)
    assert (info["machine_id"], info["boot_id"], info["system_uuid"]) == ("abc", "boot-1", "")
    assert info["hugepages"] == [{"page_size": 2048, "num_pages": 3}]
    assert [fs["device"] for fs in info["filesystems"]] == ["/dev/root"]
    assert info["filesystems"][0]["capacity"] > 0 and info["filesystems"][0]["type"] == "vfs"
    assert info["disk_map"] == {"8:0": {"name": "sda", "major": 8, "minor": 0, "size": 51200,
                                        "scheduler": "mq-deadline"}}
    assert info["network_devices"] == [{"name": "eth0", "mac_address": "02:00:00:00:00:01",
                                        "speed": 0, "mtu": 1500}]
    [node] = info["topology"]
    assert (node["node_id"], node["memory"]) == (0, 1024 * 1024)
    assert [(c["core_id"], c["thread_ids"]) for c in node["cores"]] == [(0, [0]), (1, [1])]
    assert info["cloud_provider"] == "Unknown"


def test_read_machine_spec_of_this_machine_is_json() -> None:
    info = read_machine_spec()
    json.dumps(info)
    assert info["num_cores"] >= 1 and info["memory_capacity"] > 0


# --- both views of one machine ---------------------------------------------------------------


def test_the_sampler_and_spec_report_the_same_machine(tmp_path: Path) -> None:
    write(tmp_path, "proc/cpuinfo", "\n".join(CPU.format(n, 0) for n in range(3)))
    write(tmp_path, "proc/meminfo", "MemTotal:       4096 kB\nMemFree:  1 kB\n")
    write(tmp_path, "proc/stat", "cpu  1 0 0 0 0 0 0 0 0 0\nbtime 1690000000\n")
    write(tmp_path, "proc/sys/kernel/random/boot_id", "boot-3\n")

    spec = read_machine_spec(tmp_path)
    info = read_machine_info(tmp_path / "proc")
    assert (info.num_cores, info.memory_capacity_bytes, info.boot_id) == (3, 4096 * 1024, "boot-3")
    assert (spec["num_cores"], spec["memory_capacity"], spec["boot_id"]) == (
        info.num_cores, info.memory_capacity_bytes, info.boot_id)
    assert info.boot_time == 1690000000.0
    # The sampler reads /proc where it is told, the ids of this machine from /.
    assert info.machine_id == read_machine_ids().machine_id

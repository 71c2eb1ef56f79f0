"""The Node object the kubelet registers and the status it keeps sending. Pure: no I/O, no clock.

What goes in follows the Go kubelet (kubelet_node_status.go and nodestatus/setters.go):
labels, taints, capacity from the machine, allocatable = capacity minus kubeReserved,
systemReserved and the hard eviction thresholds, addresses, the kubelet's port (the API
server reaches logs and exec through it), version facts and the conditions. Quantities are
written as Go's resource.Quantity prints them, so ``kubectl describe node`` reads the same.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import ceil
from typing import Any

from trio_kubelet import __version__
from trio_kubelet.config import CLOUD_PROVIDER_EXTERNAL, AgentOptions, KubeletConfiguration
from trio_kubelet.core.image_gc import ListedImage
from trio_kubelet.model.quantity import format_quantity, parse_quantity
from trio_kubelet.node.conditions import conditions_changed, node_conditions

# The Kubernetes release whose kubelet behaviour this agent follows and is tested against (the
# kube-apiserver of scripts/build-control-plane). The agent's own version rides along as semver
# build metadata, as distributions do ("v1.30.2+k3s1"): kubectl shows both, and version-skew
# checks, which parse the major.minor.patch part, see a v1.36 kubelet.
KUBERNETES_VERSION = "v1.36.3"
KUBELET_VERSION = f"{KUBERNETES_VERSION}+trio-kubelet.{__version__}"

CONTROLLER_MANAGED_ATTACH = "volumes.kubernetes.io/controller-managed-attach-detach"
# --cloud-provider=external: what the node registers with for the cloud controller manager.
UNINITIALIZED_TAINT = {
    "key": "node.cloudprovider.kubernetes.io/uninitialized",
    "value": "true",
    "effect": "NoSchedule",
}
PROVIDED_NODE_IP = "alpha.kubernetes.io/provided-node-ip"
HOSTNAME_LABEL = "kubernetes.io/hostname"
OS_LABEL = "kubernetes.io/os"
ARCH_LABEL = "kubernetes.io/arch"
BETA_OS_LABEL = "beta.kubernetes.io/os"
BETA_ARCH_LABEL = "beta.kubernetes.io/arch"
# Labels the kubelet reasserts on a Node that already exists (Go's updateDefaultLabels);
# --node-labels are only applied when the Node is created.
DEFAULT_LABELS = (
    HOSTNAME_LABEL,
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
    OS_LABEL,
    ARCH_LABEL,
    BETA_OS_LABEL,
    BETA_ARCH_LABEL,
)
HUGEPAGES_PREFIX = "hugepages-"
# Go's MaxNamesPerImageInNodeStatus: the names (digests, then tags) one image lists.
MAX_NAMES_PER_IMAGE = 5
# Capacity computed from the machine (with the hugepages-* sizes); other capacity entries,
# such as extended resources someone advertised, are carried over as they are.
MACHINE_RESOURCES = ("cpu", "memory", "pods", "ephemeral-storage")
_BINARY_SUFFIX = re.compile(r"[KMGTPE]i$")


@dataclass(frozen=True)
class MachineFacts:
    """The machine as the Node reports it (node/machine.py reads it from the host)."""

    num_cores: int
    memory_bytes: int
    ephemeral_storage_bytes: int  # size of the filesystem holding the kubelet root dir
    hugepages: tuple[tuple[int, int], ...] = ()  # (page size in KiB, pages reserved)
    machine_id: str = ""
    system_uuid: str = ""
    boot_id: str = ""
    kernel_version: str = ""
    os_image: str = "Linux"
    operating_system: str = "linux"
    architecture: str = "amd64"


@dataclass(frozen=True)
class StatusInputs:
    """Everything one status computation reads, gathered by the manager at one instant."""

    machine: MachineFacts
    internal_ips: tuple[str, ...] = ()
    runtime: tuple[str, str] | None = None  # (name, version) from CRI Version; None: unknown
    runtime_errors: tuple[str, ...] = ()  # e.g. ("container runtime is down",)
    pleg_error: str | None = None  # e.g. "pleg was last seen active 3m0s ago; threshold is 3m0s"
    network_error: str | None = None  # e.g. "container runtime network not ready: ..."
    shutdown_error: str | None = None  # "node is shutting down" during a graceful shutdown
    memory_pressure: bool = False
    disk_pressure: bool = False
    pid_pressure: bool = False
    # The runtime's images (the last listing); None: not listed yet, status.images left out.
    images: tuple[ListedImage, ...] | None = None
    # What the runtime's Status answer says it supports; None: no answer yet, or no features.
    features: RuntimeFeatures | None = None


@dataclass(frozen=True)
class RuntimeHandlerFeatures:
    """One runtime handler (a RuntimeClass's handler; "" the default) and what it supports."""

    name: str
    recursive_read_only_mounts: bool = False
    user_namespaces: bool = False


@dataclass(frozen=True)
class RuntimeFeatures:
    """The CRI Status answer's handlers and runtime-wide features, as the node reports them."""

    handlers: tuple[RuntimeHandlerFeatures, ...] = ()
    supplemental_groups_policy: bool | None = None  # None: the runtime did not say


# --- quantities -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Amount:
    """A resource amount with the print format Go gives it (BinarySI for bytes)."""

    value: Fraction
    binary: bool = False

    def __str__(self) -> str:
        return format_quantity(self.value, binary=self.binary)


def _float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def threshold_amount(threshold: str, capacity: Fraction) -> Fraction | None:
    """The amount an eviction threshold ("100Mi" or "10%") keeps back; None if Go ignores it.

    Percentages are taken as Go does, in float32 and truncated, so allocatable matches the
    Go kubelet's to the byte. "0%" and "100%" disable the signal.
    """
    if not threshold.endswith("%"):
        return parse_quantity(threshold)
    if threshold in ("0%", "100%"):
        return None
    fraction = _float32(_float32(float(threshold[:-1])) / 100)
    return Fraction(int(float(ceil(capacity)) * fraction))


# --- capacity and allocatable -----------------------------------------------------------------


def hugepage_resource(page_size_kib: int) -> str:
    return HUGEPAGES_PREFIX + format_quantity(page_size_kib * 1024, binary=True)


def machine_capacity(machine: MachineFacts, max_pods: int) -> dict[str, Amount]:
    """What the machine offers: cores, memory, pods, the root filesystem, reserved huge pages."""
    capacity = {
        "cpu": Amount(Fraction(machine.num_cores)),
        "memory": Amount(Fraction(machine.memory_bytes), binary=True),
        "pods": Amount(Fraction(max_pods)),
        "ephemeral-storage": Amount(Fraction(machine.ephemeral_storage_bytes), binary=True),
    }
    for size_kib, pages in machine.hugepages:
        capacity[hugepage_resource(size_kib)] = Amount(Fraction(size_kib * 1024 * pages), True)
    return capacity


def allocatable_reservation(
    capacity: Mapping[str, Amount],
    *,
    kube_reserved: Mapping[str, str],
    system_reserved: Mapping[str, str],
    eviction_hard: Mapping[str, str],
) -> dict[str, Fraction]:
    """What is kept back from pods, per resource: kube + system reserved + hard eviction."""
    eviction: dict[str, Fraction] = {}
    for signal, resource in (
        ("memory.available", "memory"),
        ("nodefs.available", "ephemeral-storage"),
    ):
        if signal in eviction_hard:
            held = capacity.get(resource, Amount(Fraction(0))).value
            amount = threshold_amount(eviction_hard[signal], held)
            if amount is not None:
                eviction[resource] = amount
    reservation = {}
    for resource in capacity:
        total = Fraction(0)
        for reserved in (system_reserved, kube_reserved):
            if resource in reserved:
                total += parse_quantity(reserved[resource])
        total += eviction.get(resource, Fraction(0))
        if total:
            reservation[resource] = total
    return reservation


def node_allocatable(
    capacity: Mapping[str, Amount], reservation: Mapping[str, Fraction]
) -> dict[str, Amount]:
    """Capacity minus the reservation, never negative; memory also loses the huge pages."""
    allocatable = {
        name: Amount(
            max(Fraction(0), amount.value - reservation.get(name, Fraction(0))), amount.binary
        )
        for name, amount in capacity.items()
    }
    if "memory" in allocatable:
        huge = sum(
            (a.value for n, a in capacity.items() if n.startswith(HUGEPAGES_PREFIX)), Fraction(0)
        )
        memory = allocatable["memory"]
        allocatable["memory"] = Amount(max(Fraction(0), memory.value - huge), memory.binary)
    return allocatable


def configured_allocatable(
    capacity: Mapping[str, Amount], config: KubeletConfiguration
) -> dict[str, Amount]:
    """Allocatable as the configuration's reservations and hard eviction thresholds leave it."""
    reservation = allocatable_reservation(
        capacity,
        kube_reserved=config.kube_reserved,
        system_reserved=config.system_reserved,
        eviction_hard=config.eviction_hard,
    )
    return node_allocatable(capacity, reservation)


def _amounts(resources: Mapping[str, Any]) -> dict[str, Fraction]:
    return {name: parse_quantity(str(value)) for name, value in resources.items()}


# --- the Node -------------------------------------------------------------------------------


def node_labels(options: AgentOptions, machine: MachineFacts) -> dict[str, str]:
    """The labels the Node is created with; --node-labels may override the defaults."""
    labels = {
        HOSTNAME_LABEL: options.node_name,
        OS_LABEL: machine.operating_system,
        ARCH_LABEL: machine.architecture,
        BETA_OS_LABEL: machine.operating_system,
        BETA_ARCH_LABEL: machine.architecture,
    }
    labels.update(options.node_labels)
    return labels


_VERSION = re.compile(r"^\s*v?(\d+(?:\.\d+)+)(.*)$")
_SEMVER_TAIL = re.compile(
    r"^(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)


def container_runtime_version(runtime: tuple[str, str] | None) -> str:
    """``containerd://1.7.2``: the CRI runtime name and its version as Go's version parser
    keeps it (no leading "v"; pre-release/build kept only if the version is semver)."""
    if runtime is None:
        return "Unknown://Unknown"
    name, version = runtime
    match = _VERSION.match(version)
    if not match:
        return f"{name}://Unknown"
    numbers, tail = match.groups()
    if numbers.count(".") == 2 and _SEMVER_TAIL.match(tail):
        return f"{name}://{numbers}{tail}"
    return f"{name}://{numbers}"


def readiness_errors(inputs: StatusInputs) -> list[str]:
    """Why the node is not Ready, in the Go kubelet's order (runtime, PLEG, network, node
    shutdown)."""
    errors = list(inputs.runtime_errors)
    if inputs.pleg_error:
        errors.append(f"PLEG is not healthy: {inputs.pleg_error}")
    if inputs.network_error:
        errors.append(inputs.network_error)
    if inputs.shutdown_error:
        errors.append(inputs.shutdown_error)
    return errors


def node_status(
    options: AgentOptions, inputs: StatusInputs, previous: Mapping[str, Any], now: float
) -> dict[str, Any]:
    """The status fields the kubelet owns, computed over ``previous`` (the API server's copy).

    Capacity the kubelet does not own (extended resources someone advertised) is carried
    over and, as in Go, becomes allocatable too.
    """
    config = options.config
    capacity = {
        name: Amount(parse_quantity(text), binary=bool(_BINARY_SUFFIX.search(text)))
        for name, text in (previous.get("capacity") or {}).items()
        if name not in MACHINE_RESOURCES and not name.startswith(HUGEPAGES_PREFIX)
    }
    capacity.update(machine_capacity(inputs.machine, config.max_pods))
    allocatable = configured_allocatable(capacity, config)
    machine = inputs.machine
    runtime = container_runtime_version(inputs.runtime)
    status: dict[str, Any] = {
        "capacity": {name: str(capacity[name]) for name in sorted(capacity)},
        "allocatable": {name: str(allocatable[name]) for name in sorted(allocatable)},
        "conditions": node_conditions(
            previous.get("conditions") or [],
            now=now,
            not_ready=readiness_errors(inputs),
            memory_pressure=inputs.memory_pressure,
            disk_pressure=inputs.disk_pressure,
            pid_pressure=inputs.pid_pressure,
        ),
        "addresses": _addresses(options, inputs, previous),
        "daemonEndpoints": {"kubeletEndpoint": {"Port": config.port}},
        "nodeInfo": {
            "machineID": machine.machine_id,
            "systemUUID": machine.system_uuid,
            "bootID": machine.boot_id,
            "kernelVersion": machine.kernel_version,
            "osImage": machine.os_image,
            "containerRuntimeVersion": runtime,
            "kubeletVersion": KUBELET_VERSION,
            "operatingSystem": machine.operating_system,
            "architecture": machine.architecture,
        },
    }
    if inputs.images is not None:
        status["images"] = node_images(inputs.images, config.node_status_max_images)
    if inputs.features is not None:
        status.update(runtime_feature_status(inputs.features))
    return status


def _addresses(
    options: AgentOptions, inputs: StatusInputs, previous: Mapping[str, Any]
) -> list[dict[str, str]]:
    """The node's InternalIPs and Hostname; with an external cloud provider, the addresses
    the Node already has once someone (its cloud controller manager) has set them."""
    if options.cloud_provider == CLOUD_PROVIDER_EXTERNAL and previous.get("addresses"):
        return list(previous["addresses"])
    return [
        *({"type": "InternalIP", "address": ip} for ip in inputs.internal_ips),
        {"type": "Hostname", "address": options.node_name},
    ]


def runtime_feature_status(features: RuntimeFeatures) -> dict[str, Any]:
    """status.runtimeHandlers and status.features as Go's setters fill them (both gates on
    in 1.36): every handler with both flags; features only when the runtime reported them."""
    status: dict[str, Any] = {}
    if features.handlers:
        status["runtimeHandlers"] = [
            {
                "name": handler.name,
                "features": {
                    "recursiveReadOnlyMounts": handler.recursive_read_only_mounts,
                    "userNamespaces": handler.user_namespaces,
                },
            }
            for handler in features.handlers
        ]
    if features.supplemental_groups_policy is not None:
        status["features"] = {"supplementalGroupsPolicy": features.supplemental_groups_policy}
    return status


def node_images(images: Sequence[ListedImage], max_images: int) -> list[dict[str, Any]]:
    """status.images as Go sets it: largest first (equal sizes in the runtime's order), at
    most ``max_images`` (-1: all), each with up to 5 names, repo digests before tags."""
    largest_first = sorted(images, key=lambda image: -image.size)
    if max_images > -1:
        largest_first = largest_first[:max_images]
    return [
        {
            "names": [*image.digests, *image.tags][:MAX_NAMES_PER_IMAGE],
            "sizeBytes": image.size,
        }
        for image in largest_first
    ]


def initial_node(options: AgentOptions, inputs: StatusInputs, now: float) -> dict[str, Any]:
    """The Node to create: name, labels, taints, the attach-detach annotation and a status."""
    spec: dict[str, Any] = {}
    taints = [
        {"key": t.key, **({"value": t.value} if t.value else {}), "effect": t.effect}
        for t in options.config.register_with_taints
    ]
    # Volumes are attached by the attach/detach controller, the Go kubelet's default.
    annotations = {CONTROLLER_MANAGED_ATTACH: "true"}
    if options.cloud_provider == CLOUD_PROVIDER_EXTERNAL:
        # The cloud controller manager removes the taint once it has set the node up, and
        # reads the addresses the operator gave.
        taints.append(UNINITIALIZED_TAINT)
        if options.node_ip:
            annotations[PROVIDED_NODE_IP] = options.node_ip
    if taints:
        spec["taints"] = taints
    if options.config.provider_id:
        spec["providerID"] = options.config.provider_id
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": options.node_name,
            "labels": node_labels(options, inputs.machine),
            "annotations": annotations,
        },
        "spec": spec,
        "status": node_status(options, inputs, {}, now),
    }


def reconcile_patch(
    initial: Mapping[str, Any], existing: Mapping[str, Any]
) -> dict[str, Any] | None:
    """What to patch (on nodes/NAME/status) into a Node that already existed, or None.

    As Go's tryRegisterWithAPIServer: reassert the default labels and the attach-detach
    annotation, and bring huge page capacity up to date (sizes gone are removed).
    """
    new_meta, old_meta = initial.get("metadata", {}), existing.get("metadata", {})
    new_labels, old_labels = new_meta.get("labels") or {}, old_meta.get("labels") or {}
    labels = {
        key: new_labels[key]
        for key in DEFAULT_LABELS
        if key in new_labels and old_labels.get(key) != new_labels[key]
    }
    annotations = {
        key: value
        for key, value in (new_meta.get("annotations") or {}).items()
        if (old_meta.get("annotations") or {}).get(key) != value
    }
    status: dict[str, Any] = {}
    new_status, old_status = initial.get("status", {}), existing.get("status", {})
    for field in ("capacity", "allocatable"):
        new, old = new_status.get(field) or {}, old_status.get(field)
        if not old:
            status[field] = dict(new)
            continue
        changes: dict[str, str | None] = {
            name: value
            for name, value in new.items()
            if name.startswith(HUGEPAGES_PREFIX)
            and (name not in old or parse_quantity(old[name]) != parse_quantity(value))
        }
        changes.update(
            {name: None for name in old if name.startswith(HUGEPAGES_PREFIX) and name not in new}
        )
        if changes:
            status[field] = changes
    patch: dict[str, Any] = {}
    metadata = {k: v for k, v in (("labels", labels), ("annotations", annotations)) if v}
    if metadata:
        patch["metadata"] = metadata
    if status:
        patch["status"] = status
    return patch or None


# --- sending the status ---------------------------------------------------------------------


def _differs(ours: Any, theirs: Any) -> bool:
    """Whether the server's value differs from ours in anything we set (maps: our keys only)."""
    if isinstance(ours, Mapping):
        return not isinstance(theirs, Mapping) or any(
            _differs(value, theirs.get(key)) for key, value in ours.items()
        )
    return bool(ours != theirs)


def changed_fields(reported: Mapping[str, Any], desired: Mapping[str, Any]) -> list[str]:
    """The status fields whose desired value differs from the reported one.

    Heartbeat times do not count, quantities compare by value ("1k" == "1000"), and only
    what the kubelet sets is compared.
    """
    changed = []
    for field, value in desired.items():
        old = reported.get(field)
        if field == "conditions":
            differs = conditions_changed(old or [], value)
        elif field in ("capacity", "allocatable"):
            differs = _amounts(old or {}) != _amounts(value)
        else:
            differs = _differs(value, old)
        if differs:
            changed.append(field)
    return changed


def labels_to_restore(node: Mapping[str, Any], machine: MachineFacts) -> dict[str, str]:
    """The kubernetes.io/os and /arch labels, if the Node lost them or has them wrong.

    Schedulers and DaemonSets select nodes by them, so the Go kubelet puts them back on
    every status update.
    """
    labels = node.get("metadata", {}).get("labels") or {}
    wanted = ((OS_LABEL, machine.operating_system), (ARCH_LABEL, machine.architecture))
    return {key: value for key, value in wanted if labels.get(key) != value}


def should_report(
    changed: bool, *, now: float, last_report: float | None, report_frequency: float
) -> bool:
    """Send the status when it changed, or when nodeStatusReportFrequency has passed."""
    return changed or last_report is None or now - last_report >= report_frequency


def status_patch(
    desired: Mapping[str, Any], changed: Sequence[str], labels: Mapping[str, str]
) -> dict[str, Any]:
    """The strategic merge patch for nodes/NAME/status: changed fields, and always the
    conditions (their heartbeats are what a report is for), plus ``labels`` to restore.

    Addresses replace the whole list: their merge key is the type, which would fold two
    InternalIPs (dual stack) into one.
    """
    status = {f: desired[f] for f in desired if f in changed or f == "conditions"}
    if "addresses" in status:
        status["addresses"] = [{"$patch": "replace"}, *status["addresses"]]
    patch: dict[str, Any] = {"status": status}
    if labels:
        patch["metadata"] = {"labels": dict(labels)}
    return patch

"""node/registration.py: the Node object, its capacity and allocatable, and when to send status."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest

from trio_kubelet.cli import parse_run_options
from trio_kubelet.config import AgentOptions, ConfigError, KubeletConfiguration
from trio_kubelet.core.image_gc import ListedImage
from trio_kubelet.model.quantity import format_quantity
from trio_kubelet.node.registration import (
    KUBELET_VERSION,
    Amount,
    MachineFacts,
    RuntimeFeatures,
    RuntimeHandlerFeatures,
    StatusInputs,
    allocatable_reservation,
    changed_fields,
    container_runtime_version,
    initial_node,
    labels_to_restore,
    machine_capacity,
    node_allocatable,
    node_images,
    node_status,
    reconcile_patch,
    should_report,
    status_patch,
    threshold_amount,
)

GI, MI = 1024**3, 1024**2
MACHINE = MachineFacts(
    num_cores=4,
    memory_bytes=8 * GI,
    ephemeral_storage_bytes=100 * GI,
    hugepages=((2048, 256), (1048576, 0)),
    machine_id="m-1",
    system_uuid="s-1",
    boot_id="b-1",
    kernel_version="6.1.0-18-amd64",
    os_image="Debian GNU/Linux 12 (bookworm)",
)
INPUTS = StatusInputs(machine=MACHINE, internal_ips=("10.0.0.5",), runtime=("containerd", "v1.7.2"))
NOW = 1_700_000_000.0


def options(*flags: str) -> AgentOptions:
    return parse_run_options(["--hostname-override", "node-a", *flags])


@pytest.mark.parametrize(
    ("value", "binary", "text"),
    [
        (0, True, "0"),
        (8, False, "8"),
        (Fraction(79, 10), False, "7900m"),
        (Fraction(1, 10), False, "100m"),
        (110, False, "110"),
        (1000, False, "1k"),
        (1_500_000, False, "1500k"),
        (512, True, "512"),  # below 1024 a BinarySI amount prints as DecimalSI
        (16 * GI, True, "16Gi"),
        (16318420 * 1024, True, "16318420Ki"),
        (56453061600, True, "56453061600"),  # not a multiple of 1024
        (-2 * MI, True, "-2Mi"),
    ],
)
def test_quantities_print_as_go_canonicalizes_them(
    value: Fraction | int, binary: bool, text: str
) -> None:
    assert format_quantity(value, binary=binary) == text


def test_percent_thresholds_are_float32_and_truncated_like_go() -> None:
    capacity = Fraction(270553174016)
    # float32(10)/100 is 0.100000001490116..., a little more than a tenth.
    assert threshold_amount("10%", capacity) == Fraction(27055317804)
    assert threshold_amount("100Mi", capacity) == 100 * MI
    assert threshold_amount("0%", capacity) is None  # Go ignores 0% and 100%
    assert threshold_amount("100%", capacity) is None


def test_allocatable_is_capacity_minus_reserved_and_hard_eviction() -> None:
    capacity = machine_capacity(MACHINE, 110)
    reservation = allocatable_reservation(
        capacity,
        kube_reserved={"cpu": "100m", "memory": "256Mi", "pid": "1000"},
        system_reserved={"cpu": "200m", "memory": "512Mi", "ephemeral-storage": "1Gi"},
        eviction_hard={
            "memory.available": "100Mi",
            "nodefs.available": "10%",
            "pid.available": "5%",
        },
    )
    allocatable = {
        name: str(amount) for name, amount in node_allocatable(capacity, reservation).items()
    }
    ten_percent = int(100 * GI * 0.10000000149011612)
    assert allocatable == {
        "cpu": "3700m",
        # 8Gi - 256Mi - 512Mi - 100Mi, less the 512Mi of reserved 2Mi huge pages
        "memory": "6812Mi",
        "pods": "110",
        "ephemeral-storage": format_quantity(100 * GI - GI - ten_percent, binary=True),
        "hugepages-2Mi": "512Mi",
        "hugepages-1Gi": "0",
    }
    assert {name: str(amount) for name, amount in capacity.items()} == {
        "cpu": "4",
        "memory": "8Gi",
        "pods": "110",
        "ephemeral-storage": "100Gi",
        "hugepages-2Mi": "512Mi",
        "hugepages-1Gi": "0",
    }


def test_allocatable_never_goes_negative_and_percent_memory_threshold() -> None:
    capacity = {"memory": Amount(Fraction(GI), binary=True), "cpu": Amount(Fraction(1))}
    reservation = allocatable_reservation(
        capacity,
        kube_reserved={"cpu": "2"},
        system_reserved={},
        eviction_hard={"memory.available": "5%"},
    )
    allocatable = node_allocatable(capacity, reservation)
    assert str(allocatable["cpu"]) == "0"
    assert allocatable["memory"].value == GI - int(GI * 0.05000000074505806)


@pytest.mark.parametrize(
    ("runtime", "shown"),
    [
        (("containerd", "v1.7.2"), "containerd://1.7.2"),
        (("containerd", "1.6.20~ds1"), "containerd://1.6.20"),  # Debian's: not semver
        (("containerd", "1.7.0-rc.1"), "containerd://1.7.0-rc.1"),
        (("cri-o", "1.29"), "cri-o://1.29"),
        (("containerd", "dev"), "containerd://Unknown"),
        (None, "Unknown://Unknown"),
    ],
)
def test_container_runtime_version(runtime: tuple[str, str] | None, shown: str) -> None:
    assert container_runtime_version(runtime) == shown


def test_initial_node_labels_taints_endpoint_and_info() -> None:
    node = initial_node(
        options(
            "--node-labels",
            "node.kubernetes.io/pool=blue,example.com/team=a",
            "--register-with-taints",
            "dedicated=infra:NoSchedule,gpu:NoExecute",
            "--port",
            "11250",
        ),
        INPUTS,
        NOW,
    )
    assert node["metadata"]["name"] == "node-a"
    assert node["metadata"]["labels"] == {
        "kubernetes.io/hostname": "node-a",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/pool": "blue",
        "example.com/team": "a",
    }
    assert node["metadata"]["annotations"] == {
        "volumes.kubernetes.io/controller-managed-attach-detach": "true"
    }
    assert node["spec"]["taints"] == [
        {"key": "dedicated", "value": "infra", "effect": "NoSchedule"},
        {"key": "gpu", "effect": "NoExecute"},
    ]
    status = node["status"]
    assert status["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 11250}}
    assert status["addresses"] == [
        {"type": "InternalIP", "address": "10.0.0.5"},
        {"type": "Hostname", "address": "node-a"},
    ]
    assert status["nodeInfo"] == {
        "machineID": "m-1",
        "systemUUID": "s-1",
        "bootID": "b-1",
        "kernelVersion": "6.1.0-18-amd64",
        "osImage": "Debian GNU/Linux 12 (bookworm)",
        "containerRuntimeVersion": "containerd://1.7.2",
        "kubeletVersion": KUBELET_VERSION,
        "operatingSystem": "linux",
        "architecture": "amd64",
    }
    assert KUBELET_VERSION.startswith("v1.36.3+trio-kubelet.")
    assert [c["type"] for c in status["conditions"]] == [
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
        "Ready",
    ]
    assert "taints" not in initial_node(options(), INPUTS, NOW)["spec"]


def test_node_labels_override_the_defaults() -> None:
    node = initial_node(options("--node-labels", "kubernetes.io/hostname=other"), INPUTS, NOW)
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "other"


def test_not_ready_reasons_reach_the_ready_condition() -> None:
    inputs = replace(
        INPUTS,
        runtime_errors=("container runtime is down",),
        pleg_error="pleg was last seen active 3m0s ago; threshold is 3m0s",
    )
    ready = node_status(options(), inputs, {}, NOW)["conditions"][-1]
    assert ready["status"] == "False"
    assert ready["reason"] == "KubeletNotReady"
    assert ready["message"] == (
        "[container runtime is down, PLEG is not healthy: pleg was last seen active 3m0s ago; "
        "threshold is 3m0s]"
    )


def test_foreign_capacity_is_kept_and_becomes_allocatable() -> None:
    previous = {
        "capacity": {
            "example.com/dongle": "4",
            "example.com/cache": "1Gi",
            "hugepages-32Mi": "0",
            "cpu": "64",
        },
        "allocatable": {"example.com/dongle": "2"},
    }
    status = node_status(options(), INPUTS, previous, NOW)
    assert status["capacity"]["example.com/dongle"] == "4"
    assert status["allocatable"]["example.com/dongle"] == "4"
    assert status["allocatable"]["example.com/cache"] == "1Gi"
    assert status["capacity"]["cpu"] == "4"
    assert "hugepages-32Mi" not in status["capacity"]


def reported(status: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``status`` as the API server would hand it back, plus ``changes``."""
    served = {
        **status,
        "capacity": dict(status["capacity"]),
        "allocatable": dict(status["allocatable"]),
        "nodeInfo": {**status["nodeInfo"], "kubeProxyVersion": ""},
        "conditions": [
            {**c, "lastHeartbeatTime": "2023-11-14T22:00:00Z"} for c in status["conditions"]
        ],
    }
    served.update(changes)
    return served


def test_only_real_changes_count() -> None:
    desired = node_status(options(), INPUTS, {}, NOW)
    assert changed_fields(reported(desired), desired) == []
    # "1k" and "1000" are the same quantity.
    big = node_status(options("--max-pods", "1000"), INPUTS, {}, NOW)
    assert big["capacity"]["pods"] == "1k"
    served = reported(big)
    served["capacity"]["pods"] = served["allocatable"]["pods"] = "1000"
    assert changed_fields(served, big) == []
    moved = reported(desired, addresses=[{"type": "InternalIP", "address": "10.0.0.9"}])
    assert changed_fields(moved, desired) == ["addresses"]
    not_ready = node_status(options(), replace(INPUTS, network_error="cni down"), {}, NOW)
    assert changed_fields(reported(desired), not_ready) == ["conditions"]


def test_send_when_changed_or_when_the_report_is_due() -> None:
    assert should_report(False, now=NOW, last_report=None, report_frequency=300)
    assert not should_report(False, now=NOW, last_report=NOW - 299, report_frequency=300)
    assert should_report(False, now=NOW, last_report=NOW - 300, report_frequency=300)
    assert should_report(True, now=NOW, last_report=NOW - 1, report_frequency=300)


def test_status_patch_sends_conditions_changes_and_replaces_addresses() -> None:
    desired = node_status(options(), INPUTS, {}, NOW)
    patch = status_patch(desired, [], {})
    assert patch == {"status": {"conditions": desired["conditions"]}}
    patch = status_patch(desired, ["addresses", "capacity"], {"kubernetes.io/os": "linux"})
    assert patch["status"]["addresses"][0] == {"$patch": "replace"}
    assert patch["status"]["addresses"][1:] == desired["addresses"]
    assert patch["status"]["capacity"] == desired["capacity"]
    assert patch["metadata"] == {"labels": {"kubernetes.io/os": "linux"}}


def test_lost_os_and_arch_labels_are_restored() -> None:
    node = {"metadata": {"labels": {"kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64"}}}
    assert labels_to_restore(node, MACHINE) == {"kubernetes.io/arch": "amd64"}
    assert labels_to_restore({}, MACHINE) == {
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }


def test_reregistration_reasserts_default_labels_and_huge_pages_only() -> None:
    initial = initial_node(options("--node-labels", "example.com/team=b"), INPUTS, NOW)
    existing = {
        "metadata": {
            "labels": {
                **initial["metadata"]["labels"],
                "kubernetes.io/hostname": "old",
                "example.com/team": "a",
            },
            "annotations": {},
        },
        "status": {
            "capacity": {
                **initial["status"]["capacity"],
                "hugepages-32Mi": "0",
                "hugepages-2Mi": "0",
            },
            "allocatable": dict(initial["status"]["allocatable"]),
        },
    }
    assert reconcile_patch(initial, existing) == {
        "metadata": {
            "labels": {"kubernetes.io/hostname": "node-a"},
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "status": {"capacity": {"hugepages-2Mi": "512Mi", "hugepages-32Mi": None}},
    }
    assert reconcile_patch(initial, initial) is None
    bare = {"metadata": initial["metadata"], "status": {}}
    assert reconcile_patch(initial, bare) == {
        "status": {
            "capacity": initial["status"]["capacity"],
            "allocatable": initial["status"]["allocatable"],
        }
    }


def test_agent_options_default_node_has_no_labels_of_its_own() -> None:
    plain = AgentOptions(config=KubeletConfiguration(), node_name="n")
    assert initial_node(plain, INPUTS, NOW)["metadata"]["labels"]["kubernetes.io/hostname"] == "n"


# --- status.images -------------------------------------------------------------------------


def listed(name: str, size: int, tags: int = 1, digests: int = 1) -> ListedImage:
    return ListedImage(
        f"sha256:{name}",
        size,
        tags=tuple(f"docker.io/library/{name}:{n}" for n in range(tags)),
        digests=tuple(f"docker.io/library/{name}@sha256:{n:064d}" for n in range(digests)),
    )


def test_status_images_are_largest_first_capped_with_digests_before_tags() -> None:
    images = [listed("small", 10), listed("big", 1000, tags=4, digests=3), listed("mid", 100)]
    assert node_images(images, 2) == [
        {
            "names": [
                *(f"docker.io/library/big@sha256:{n:064d}" for n in range(3)),
                "docker.io/library/big:0",
                "docker.io/library/big:1",
            ],  # five names at most
            "sizeBytes": 1000,
        },
        {
            "names": ["docker.io/library/mid@sha256:" + "0" * 64, "docker.io/library/mid:0"],
            "sizeBytes": 100,
        },
    ]
    assert [i["sizeBytes"] for i in node_images(images, -1)] == [1000, 100, 10]
    assert node_images(images, 0) == []
    ties = [listed("a", 5), listed("b", 5)]
    assert [i["names"][-1] for i in node_images(ties, 50)] == [
        "docker.io/library/a:0",
        "docker.io/library/b:0",
    ]


def test_node_status_lists_images_once_they_are_known() -> None:
    opts = options("--node-status-max-images=1")
    assert "images" not in node_status(opts, INPUTS, {}, 0.0)
    inputs = replace(INPUTS, images=(listed("x", 1), listed("y", 2)))
    status = node_status(opts, inputs, {}, 0.0)
    assert [i["sizeBytes"] for i in status["images"]] == [2]
    assert changed_fields({**status, "images": []}, status) == ["images"]


def test_runtime_handlers_and_features_are_reported_as_the_runtime_states_them() -> None:
    features = RuntimeFeatures(
        handlers=(
            RuntimeHandlerFeatures("", recursive_read_only_mounts=True),
            RuntimeHandlerFeatures("runc", recursive_read_only_mounts=True, user_namespaces=True),
        ),
        supplemental_groups_policy=True,
    )
    status = node_status(options(), replace(INPUTS, features=features), {}, 0.0)
    assert status["runtimeHandlers"] == [
        {"name": "", "features": {"recursiveReadOnlyMounts": True, "userNamespaces": False}},
        {"name": "runc", "features": {"recursiveReadOnlyMounts": True, "userNamespaces": True}},
    ]
    assert status["features"] == {"supplementalGroupsPolicy": True}
    # A runtime that names no features (containerd 1.6): neither field.
    silent = node_status(options(), INPUTS, {}, 0.0)
    assert "runtimeHandlers" not in silent and "features" not in silent
    handlers_only = replace(features, supplemental_groups_policy=None)
    status = node_status(options(), replace(INPUTS, features=handlers_only), {}, 0.0)
    assert "features" not in status and len(status["runtimeHandlers"]) == 2


def test_an_external_cloud_provider_node_waits_for_its_controller() -> None:
    """--cloud-provider=external: registered tainted uninitialized, with the given IP as an
    annotation; the addresses its cloud controller manager sets are kept from then on."""
    external = options("--cloud-provider=external", "--node-ip=10.0.0.5",
                       "--provider-id=aws:///eu-west-1a/i-0abc", "--register-with-taints",
                       "dedicated=db:NoSchedule")
    node = initial_node(external, INPUTS, NOW)
    assert node["spec"]["taints"] == [
        {"key": "dedicated", "value": "db", "effect": "NoSchedule"},
        {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true",
         "effect": "NoSchedule"},
    ]
    assert node["spec"]["providerID"] == "aws:///eu-west-1a/i-0abc"
    assert node["metadata"]["annotations"]["alpha.kubernetes.io/provided-node-ip"] == "10.0.0.5"
    assert node["status"]["addresses"] == [
        {"type": "InternalIP", "address": "10.0.0.5"}, {"type": "Hostname", "address": "node-a"}]

    cloud = [{"type": "InternalIP", "address": "172.31.0.9"},
             {"type": "InternalDNS", "address": "ip-172-31-0-9.internal"}]
    status = node_status(external, INPUTS, {"addresses": cloud}, NOW)
    assert status["addresses"] == cloud
    assert node_status(options(), INPUTS, {"addresses": cloud}, NOW)["addresses"] == [
        {"type": "InternalIP", "address": "10.0.0.5"}, {"type": "Hostname", "address": "node-a"}
    ], "without it the kubelet's own addresses win, as in Go"
    plain = initial_node(options(), INPUTS, NOW)
    assert "providerID" not in plain["spec"] and "taints" not in plain["spec"]
    assert "alpha.kubernetes.io/provided-node-ip" not in plain["metadata"]["annotations"]


def test_only_an_external_cloud_provider_is_known() -> None:
    with pytest.raises(ConfigError, match='--cloud-provider: unsupported "gce"'):
        options("--cloud-provider=gce")

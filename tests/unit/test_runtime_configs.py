"""runtime.configs: a pod spec translated into CRI sandbox and container configurations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trio_kubelet.core.hashing import container_hash
from trio_kubelet.model.pod import ContainerPort, Pod
from trio_kubelet.runtime import configs, labels
from trio_kubelet.runtime.cri.runtime import v1

UID = "0d1f7c0e-2222-4000-8000-000000000001"
LOGS = Path("/var/log/pods")


def make_pod(name: str = "web", **spec: Any) -> Pod:
    containers = spec.pop("containers", [{"name": "main", "image": "busybox:1.36"}])
    return Pod.model_validate({
        "metadata": {
            "name": name, "namespace": "shop", "uid": UID,
            "labels": {"app": "web", labels.POD_UID: "forged"},
            "annotations": {"owner": "team-a"},
        },
        "spec": {"containers": containers, **spec},
    })


# -- sandbox -----------------------------------------------------------------------------------


def test_sandbox_metadata_log_directory_labels_and_annotations() -> None:
    config = configs.sandbox_config(make_pod(), 3, LOGS)
    assert config.metadata == v1.PodSandboxMetadata(
        name="web", uid=UID, namespace="shop", attempt=3)
    assert config.log_directory == f"/var/log/pods/shop_web_{UID}"
    # Pod labels are kept; the identity labels the agent relies on win over forged ones.
    assert config.labels == {
        "app": "web",
        labels.POD_UID: UID,
        labels.POD_NAME: "web",
        labels.POD_NAMESPACE: "shop",
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
    }
    assert config.annotations == {"owner": "team-a"}


def test_pod_network_sandbox_has_the_pod_name_as_hostname() -> None:
    config = configs.sandbox_config(make_pod(), 0, LOGS)
    assert config.hostname == "web"
    assert config.linux is not None and config.linux.security_context is not None
    options = config.linux.security_context.namespace_options
    assert options == v1.NamespaceOption(
        network=v1.NamespaceMode.POD, pid=v1.NamespaceMode.CONTAINER, ipc=v1.NamespaceMode.POD)


def test_spec_hostname_wins_and_is_cut_to_a_valid_label() -> None:
    assert configs.sandbox_config(make_pod(hostname="db-0"), 0, LOGS).hostname == "db-0"
    long_name = "a" * 62 + "-tail"
    assert configs.sandbox_hostname(make_pod(long_name)) == "a" * 62


def test_host_network_sandbox_has_no_hostname_and_node_namespaces() -> None:
    pod = make_pod(hostNetwork=True, hostPID=True, hostIPC=True, hostname="ignored")
    config = configs.sandbox_config(pod, 0, LOGS)
    # containerd refuses a hostname without a private UTS namespace.
    assert config.hostname == ""
    assert config.linux is not None and config.linux.security_context is not None
    options = config.linux.security_context.namespace_options
    assert options == v1.NamespaceOption(
        network=v1.NamespaceMode.NODE, pid=v1.NamespaceMode.NODE, ipc=v1.NamespaceMode.NODE)


def test_only_ports_with_a_host_port_become_port_mappings() -> None:
    pod = make_pod(containers=[
        {"name": "web", "image": "nginx:1.27", "ports": [
            {"containerPort": 80, "hostPort": 8080},
            {"containerPort": 443},
            {"containerPort": 53, "hostPort": 5353, "protocol": "UDP", "hostIP": "127.0.0.1"},
        ]},
        {"name": "metrics", "image": "busybox:1.36", "ports": [
            {"containerPort": 9100, "hostPort": 9100, "protocol": "SCTP"},
        ]},
    ])
    assert configs.sandbox_config(pod, 0, LOGS).port_mappings == [
        v1.PortMapping(protocol=v1.Protocol.TCP, container_port=80, host_port=8080, host_ip=""),
        v1.PortMapping(protocol=v1.Protocol.UDP, container_port=53, host_port=5353,
                       host_ip="127.0.0.1"),
        v1.PortMapping(protocol=v1.Protocol.SCTP, container_port=9100, host_port=9100,
                       host_ip=""),
    ]


def test_port_mapping_keeps_the_host_ip() -> None:
    pod = make_pod()
    pod.spec.containers[0].ports = [
        ContainerPort(container_port=53, host_port=5353, protocol="UDP", host_ip="127.0.0.1")
    ]
    [mapping] = configs.sandbox_config(pod, 0, LOGS).port_mappings
    assert mapping.host_ip == "127.0.0.1"


def test_manifest_host_ip_reaches_the_port_mapping() -> None:
    pod = make_pod(containers=[{"name": "dns", "image": "busybox:1.36", "ports": [
        {"containerPort": 53, "hostPort": 5353, "protocol": "UDP", "hostIP": "127.0.0.1"},
    ]}])
    [mapping] = configs.sandbox_config(pod, 0, LOGS).port_mappings
    assert mapping.host_ip == "127.0.0.1"


def test_log_directory_and_log_path_naming() -> None:
    pod = make_pod()
    assert configs.pod_log_directory(Path("/logs"), pod) == Path(f"/logs/shop_web_{UID}")
    assert configs.container_log_path("main", 0) == "main/0.log"
    assert configs.container_log_path("main", 12) == "main/12.log"


# -- container ---------------------------------------------------------------------------------

FULL = {
    "name": "app",
    "image": "registry.local/app:v2",
    "command": ["/bin/app"],
    "args": ["--port", "8080"],
    "workingDir": "/srv",
    "env": [{"name": "MODE", "value": "prod"}, {"name": "EMPTY"}],
    "stdin": True,
    "tty": True,
}


def test_container_config_carries_the_process_spec() -> None:
    pod = make_pod(containers=[FULL])
    container = pod.spec.containers[0]
    config = configs.container_config(pod, container, kind="regular",
                                      image_ref="sha256:abc", restart_count=4)
    assert config.metadata == v1.ContainerMetadata(name="app", attempt=4)
    assert config.image == v1.ImageSpec(image="sha256:abc",
                                        user_specified_image="registry.local/app:v2")
    assert (config.command, config.args, config.working_dir) == (
        ["/bin/app"], ["--port", "8080"], "/srv")
    assert config.envs == [v1.KeyValue(key="MODE", value="prod"),
                           v1.KeyValue(key="EMPTY", value="")]
    assert (config.stdin, config.stdin_once, config.tty) == (True, False, True)
    assert config.log_path == "app/4.log"


def test_container_config_defaults_are_empty() -> None:
    pod = make_pod()
    config = configs.container_config(pod, pod.spec.containers[0], kind="regular",
                                      image_ref="sha256:abc", restart_count=0)
    assert (config.command, config.args, config.working_dir, config.envs) == ([], [], "", [])


def test_container_labels_and_annotations_identify_it_for_adoption() -> None:
    pod = make_pod(terminationGracePeriodSeconds=7, containers=[FULL])
    container = pod.spec.containers[0]
    config = configs.container_config(pod, container, kind="sidecar",
                                      image_ref="sha256:abc", restart_count=2)
    assert config.labels == {
        labels.POD_UID: UID,
        labels.POD_NAME: "web",
        labels.POD_NAMESPACE: "shop",
        labels.CONTAINER_NAME: "app",
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
    }
    assert config.annotations == {
        labels.CONTAINER_HASH: container_hash(container),
        labels.RESTART_COUNT: "2",
        labels.CONTAINER_TYPE: "sidecar",
        labels.TERMINATION_GRACE: "7",
    }


def test_container_shares_the_pod_namespaces() -> None:
    pod = make_pod(hostNetwork=True, hostPID=True)
    config = configs.container_config(pod, pod.spec.containers[0], kind="regular",
                                      image_ref="sha256:abc", restart_count=0)
    assert config.linux is not None and config.linux.security_context is not None
    assert config.linux.security_context.namespace_options == v1.NamespaceOption(
        network=v1.NamespaceMode.NODE, pid=v1.NamespaceMode.NODE, ipc=v1.NamespaceMode.POD)


def test_a_spec_edit_changes_the_stored_hash() -> None:
    before = make_pod(containers=[FULL])
    after = make_pod(containers=[{**FULL, "args": ["--port", "9090"]}])
    hashes = [
        configs.container_config(p, p.spec.containers[0], kind="regular", image_ref="x",
                                 restart_count=0).annotations[labels.CONTAINER_HASH]
        for p in (before, after)
    ]
    assert hashes[0] != hashes[1]

"""core.hosts_file, core.pod_hostname and volumes.mounts.etc_hosts_mount: the /etc/hosts a pod's
containers get, the names in it, and the pod model's hostname/subdomain/hostAliases checks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from trio_kubelet.config import describe_validation_error
from trio_kubelet.core.hosts_file import (
    HOST_NETWORK_HEADER,
    MANAGED_HEADER,
    gets_managed_hosts,
    host_alias_lines,
    managed_hosts_content,
    pod_hosts_content,
)
from trio_kubelet.core.pod_hostname import pod_domain, pod_hostname
from trio_kubelet.model.pod import HostAlias, Pod
from trio_kubelet.runtime import configs
from trio_kubelet.volumes import VolumeError
from trio_kubelet.volumes.mounts import ETC_HOSTS_FILE, etc_hosts_mount

LOCALHOST = (
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "fe00::0\tip6-mcastprefix\n"
    "fe00::1\tip6-allnodes\n"
    "fe00::2\tip6-allrouters\n"
)
ALIASES = [
    {"ip": "127.0.0.1", "hostnames": ["foo.local", "bar.local"]},
    {"ip": "10.1.2.3", "hostnames": ["foo.remote"]},
]
ALIAS_LINES = (
    "\n# Entries added by HostAliases.\n127.0.0.1\tfoo.local\tbar.local\n10.1.2.3\tfoo.remote\n"
)


def make_pod(name: str = "web", containers: list[dict[str, Any]] | None = None, **spec: Any) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {"name": name, "namespace": "shop", "uid": "uid-1"},
            "spec": {
                "containers": containers or [{"name": "main", "image": "busybox:1.36"}],
                **spec,
            },
        }
    )


def spec_error(**spec: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        make_pod(**spec)
    return describe_validation_error(caught.value)


# -- hostname and domain -----------------------------------------------------------------------


def test_hostname_is_the_spec_hostname_else_the_pod_name() -> None:
    assert pod_hostname(make_pod()) == "web"
    assert pod_hostname(make_pod(hostname="db-0")) == "db-0"
    assert pod_hostname(make_pod(hostname="")) == "web"


def test_a_long_pod_name_is_cut_to_63_characters_without_trailing_separators() -> None:
    assert pod_hostname(make_pod("a" * 63)) == "a" * 63
    assert pod_hostname(make_pod("a" * 70)) == "a" * 63
    assert pod_hostname(make_pod("a" * 61 + "--b")) == "a" * 61
    assert pod_hostname(make_pod("a" * 62 + ".b")) == "a" * 62
    assert configs.sandbox_hostname(make_pod("b" * 62 + "-tail")) == "b" * 62


def test_host_network_sandboxes_keep_the_nodes_hostname() -> None:
    assert configs.sandbox_hostname(make_pod(hostNetwork=True, hostname="db-0")) == ""


def test_domain_comes_from_the_subdomain() -> None:
    assert pod_domain(make_pod(), "cluster.local") == ""
    pod = make_pod(subdomain="db")
    assert pod_domain(pod, "cluster.local") == "db.shop.svc.cluster.local"


def test_hostname_override_replaces_the_hostname_and_drops_the_domain() -> None:
    pod = make_pod(hostname="custom-host", subdomain="t", hostnameOverride="override-host")
    assert pod_hostname(pod) == "override-host"
    assert pod_domain(pod, "cluster.local") == ""
    assert pod_hosts_content(pod, ["10.88.0.5"], "cluster.local") == (
        MANAGED_HEADER + LOCALHOST + "10.88.0.5\toverride-host\n"
    )
    dotted = make_pod(hostnameOverride="override.example.host")
    assert configs.sandbox_hostname(dotted) == "override.example.host"
    assert pod_hostname(make_pod(hostnameOverride="a" * 62 + ".b")) == "a" * 62


# -- content -----------------------------------------------------------------------------------


def test_managed_content_names_the_pod_by_each_ip() -> None:
    pod = make_pod()
    assert pod_hosts_content(pod, ["10.88.0.5", "fd00::5"], "cluster.local") == (
        MANAGED_HEADER + LOCALHOST + "10.88.0.5\tweb\nfd00::5\tweb\n"
    )


def test_managed_content_with_subdomain_puts_the_fqdn_first() -> None:
    pod = make_pod(hostname="db-0", subdomain="db")
    assert pod_hosts_content(pod, ["10.88.0.5"], "cluster.local") == (
        MANAGED_HEADER + LOCALHOST + "10.88.0.5\tdb-0.db.shop.svc.cluster.local\tdb-0\n"
    )


def test_managed_content_ends_with_the_host_aliases() -> None:
    pod = make_pod(hostAliases=ALIASES)
    assert pod_hosts_content(pod, ["10.88.0.5"], "cluster.local") == (
        MANAGED_HEADER + LOCALHOST + "10.88.0.5\tweb\n" + ALIAS_LINES
    )


def test_managed_content_without_ips() -> None:
    assert managed_hosts_content([], "web", "", []) == MANAGED_HEADER + LOCALHOST


def test_host_network_content_is_the_nodes_file_then_the_aliases() -> None:
    node = "127.0.0.1 localhost\n192.168.1.50 node-1\n"
    pod = make_pod(hostNetwork=True, hostAliases=ALIASES, subdomain="db")
    assert pod_hosts_content(pod, ["192.168.1.50"], "cluster.local", node) == (
        HOST_NETWORK_HEADER + node + ALIAS_LINES
    )
    assert pod_hosts_content(make_pod(hostNetwork=True), [], "", node) == HOST_NETWORK_HEADER + node


def test_host_alias_lines() -> None:
    assert host_alias_lines([]) == ""
    assert host_alias_lines([HostAlias(ip="10.0.0.1")]) == (
        "\n# Entries added by HostAliases.\n10.0.0.1\t\n"
    )


# -- which containers get it -------------------------------------------------------------------


def test_containers_get_the_file_once_the_pod_has_an_ip() -> None:
    pod = make_pod()
    main = pod.spec.containers[0]
    assert gets_managed_hosts(pod, main, ["10.88.0.5"])
    assert not gets_managed_hosts(pod, main, [])
    host = make_pod(hostNetwork=True)
    assert gets_managed_hosts(host, host.spec.containers[0], [])


def test_a_container_mounting_its_own_etc_hosts_keeps_it() -> None:
    pod = make_pod(
        containers=[
            {
                "name": "own",
                "image": "busybox:1.36",
                "volumeMounts": [{"name": "hosts", "mountPath": "/etc/hosts"}],
            },
            {
                "name": "other",
                "image": "busybox:1.36",
                "volumeMounts": [{"name": "hosts", "mountPath": "/etc/hosts.d"}],
            },
        ],
        volumes=[{"name": "hosts", "emptyDir": {}}],
    )
    own, other = pod.spec.containers
    assert not gets_managed_hosts(pod, own, ["10.88.0.5"])
    assert gets_managed_hosts(pod, other, ["10.88.0.5"])


# -- writing it: volumes.mounts.etc_hosts_mount ------------------------------------------------


def test_the_mount_writes_the_pods_file(tmp_path: Path) -> None:
    pod = make_pod(hostAliases=ALIASES)
    pod_dir = tmp_path / "pods" / "uid-1"
    mount = etc_hosts_mount(
        pod_dir, pod, pod.spec.containers[0], ["10.88.0.5"], cluster_domain="cluster.local"
    )
    assert mount is not None
    path = pod_dir / ETC_HOSTS_FILE
    assert (mount.container_path, mount.host_path, mount.readonly) == (
        "/etc/hosts",
        str(path),
        False,
    )
    assert path.read_text() == pod_hosts_content(pod, ["10.88.0.5"], "cluster.local")
    assert path.stat().st_mode & 0o777 == 0o644


def test_the_file_is_rewritten_in_place_when_the_ip_changes(tmp_path: Path) -> None:
    """Running containers have the file's inode mounted: a new sandbox IP must reach them."""
    pod = make_pod()
    main = pod.spec.containers[0]
    mount = etc_hosts_mount(tmp_path, pod, main, ["10.88.0.5"], cluster_domain="")
    assert mount is not None
    path = Path(mount.host_path)
    inode = path.stat().st_ino
    etc_hosts_mount(tmp_path, pod, main, ["10.88.0.9"], cluster_domain="")
    assert path.stat().st_ino == inode
    assert path.read_text().endswith("10.88.0.9\tweb\n")


def test_an_unchanged_file_is_not_written_again(tmp_path: Path) -> None:
    pod = make_pod()
    main = pod.spec.containers[0]
    etc_hosts_mount(tmp_path, pod, main, ["10.88.0.5"], cluster_domain="")
    path = tmp_path / ETC_HOSTS_FILE
    os.utime(path, (1, 1))
    etc_hosts_mount(tmp_path, pod, main, ["10.88.0.5"], cluster_domain="")
    assert path.stat().st_mtime == 1


def test_no_mount_and_no_file_without_an_ip(tmp_path: Path) -> None:
    pod = make_pod()
    assert etc_hosts_mount(tmp_path, pod, pod.spec.containers[0], [], cluster_domain="") is None
    assert not (tmp_path / ETC_HOSTS_FILE).exists()


def test_host_network_copies_the_nodes_file(tmp_path: Path) -> None:
    node_hosts = tmp_path / "node-hosts"
    node_hosts.write_bytes(b"127.0.0.1 localhost\n10.0.0.1 caf\xe9\n")  # not UTF-8: kept as is
    pod = make_pod(hostNetwork=True, hostAliases=ALIASES)
    pod_dir = tmp_path / "pod"
    etc_hosts_mount(
        pod_dir, pod, pod.spec.containers[0], [], cluster_domain="", node_hosts_file=node_hosts
    )
    assert (pod_dir / ETC_HOSTS_FILE).read_bytes() == (
        HOST_NETWORK_HEADER.encode()
        + b"127.0.0.1 localhost\n10.0.0.1 caf\xe9\n"
        + ALIAS_LINES.encode()
    )


def test_an_unreadable_node_file_is_a_container_config_error(tmp_path: Path) -> None:
    pod = make_pod(hostNetwork=True)
    with pytest.raises(VolumeError) as caught:
        etc_hosts_mount(
            tmp_path,
            pod,
            pod.spec.containers[0],
            [],
            cluster_domain="",
            node_hosts_file=tmp_path / "missing",
        )
    assert caught.value.reason == "CreateContainerConfigError"
    assert "hosts file" in caught.value.message


# -- the pod model: hostname, subdomain, hostAliases -------------------------------------------


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"hostname": "Web"}, "spec.hostname: hostname"),
        ({"hostname": "a" * 64}, "spec.hostname: hostname"),
        ({"subdomain": "db.shop"}, "spec.subdomain: subdomain"),
        ({"hostnameOverride": "Not-RFC1123"}, "spec.hostnameOverride: hostnameOverride"),
        ({"hostnameOverride": ""}, "spec.hostnameOverride: hostnameOverride"),
        ({"hostAliases": [{"ip": "10.0.0", "hostnames": ["a"]}]}, "spec.hostAliases[0].ip: IP"),
        ({"hostAliases": [{"hostnames": ["a"]}]}, "spec.hostAliases[0].ip: IP"),
        (
            {"hostAliases": [ALIASES[0], {"ip": "::1", "hostnames": ["ok", "Not_OK"]}]},
            "spec.hostAliases[1].hostnames[1]: hostname",
        ),
    ],
)
def test_invalid_names_are_rejected_naming_the_field(spec: dict[str, Any], error: str) -> None:
    assert spec_error(**spec).startswith(error)


def test_valid_aliases_round_trip() -> None:
    pod = make_pod(hostname="db-0", subdomain="db", hostAliases=ALIASES)
    assert pod.spec.host_aliases[0] == HostAlias(
        ip="127.0.0.1", hostnames=["foo.local", "bar.local"]
    )
    assert pod.to_api()["spec"]["hostAliases"] == ALIASES

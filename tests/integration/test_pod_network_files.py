"""A pod's /etc/hosts, /etc/resolv.conf and hostname on containerd, as its containers see them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.harness import running_agent

pytestmark = pytest.mark.integration

# The node's resolver configuration the agent is given (--resolv-conf), so that what pods
# inherit from it does not depend on the machine the tests run on.
NODE_RESOLV_CONF = (
    "# the test node\nnameserver 192.0.2.53\nsearch corp.example.\noptions timeout:2\n"
)
LOCALHOST = [
    "127.0.0.1\tlocalhost",
    "::1\tlocalhost ip6-localhost ip6-loopback",
    "fe00::0\tip6-localnet",
    "fe00::0\tip6-mcastprefix",
    "fe00::1\tip6-allnodes",
    "fe00::2\tip6-allrouters",
]
ALIAS_LINES = [
    "",
    "# Entries added by HostAliases.",
    "127.0.0.1\tfoo.local\tbar.local",
    "10.1.2.3\tfoo.remote",
]
SHOW = 'cat /etc/hosts; echo "--- resolv.conf"; cat /etc/resolv.conf; echo "--- hostname"; hostname'

IDENTITY = f"""\
apiVersion: v1
kind: Pod
metadata: {{name: identity, namespace: shop}}
spec:
  restartPolicy: Never
  hostname: db-0
  subdomain: db
  hostAliases:
  - {{ip: 127.0.0.1, hostnames: [foo.local, bar.local]}}
  - {{ip: 10.1.2.3, hostnames: [foo.remote]}}
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", '{SHOW}']
"""

DNS_NONE = f"""\
apiVersion: v1
kind: Pod
metadata: {{name: dns-none}}
spec:
  restartPolicy: Never
  dnsPolicy: "None"
  dnsConfig:
    nameservers: [1.1.1.1, 2001:db8::53]
    searches: [my.example]
    options: [{{name: ndots, value: "2"}}, {{name: edns0}}]
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", '{SHOW}']
"""

HOST_NETWORK = f"""\
apiVersion: v1
kind: Pod
metadata: {{name: host-net}}
spec:
  restartPolicy: Never
  hostNetwork: true
  hostAliases:
  - {{ip: 127.0.0.1, hostnames: [foo.local, bar.local]}}
  - {{ip: 10.1.2.3, hostnames: [foo.remote]}}
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", '{SHOW}']
"""


def _sections(lines: list[str]) -> tuple[list[str], list[str], list[str]]:
    """The container's output split into /etc/hosts, /etc/resolv.conf and its hostname."""
    resolv_at, hostname_at = lines.index("--- resolv.conf"), lines.index("--- hostname")
    return lines[:resolv_at], lines[resolv_at + 1 : hostname_at], lines[hostname_at + 1 :]


def _node_resolv_conf(tmp_path: Path) -> str:
    path = tmp_path / "node-resolv.conf"
    path.write_text(NODE_RESOLV_CONF)
    return str(path)


async def _show(agent, name: str, manifest: str) -> tuple[list[str], list[str], list[str]]:
    agent.write(f"{name}.yaml", manifest)
    pod = await agent.wait_for(name, lambda p: p.status.phase in ("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded", pod.status
    return _sections(agent.output(pod, "main"))


async def test_hostname_subdomain_aliases_and_cluster_dns(containerd, tmp_path):
    flags = ["--cluster-dns", "10.96.0.10", "--cluster-domain", "cluster.local"]
    flags += ["--resolv-conf", _node_resolv_conf(tmp_path)]
    async with running_agent(containerd.endpoint, tmp_path, *flags) as agent:
        hosts, resolv, hostname = await _show(agent, "identity", IDENTITY)
        pod = agent.pod("identity")
        assert pod is not None and pod.status.pod_ip
        assert hosts == [
            "# Kubernetes-managed hosts file.",
            *LOCALHOST,
            f"{pod.status.pod_ip}\tdb-0.db.shop.svc.cluster.local\tdb-0",
            *ALIAS_LINES,
        ]
        assert resolv == [
            "search shop.svc.cluster.local svc.cluster.local cluster.local corp.example",
            "nameserver 10.96.0.10",
            "options ndots:5",
        ]
        assert hostname == ["db-0"]
        # The file lives with the pod's other state, under the root directory.
        etc_hosts = tmp_path / "root" / "pods" / pod.metadata.uid / "etc-hosts"
        assert etc_hosts.read_text().splitlines() == hosts


async def test_dns_policy_none_uses_only_the_pods_dns_config(containerd, tmp_path):
    flags = ["--cluster-dns", "10.96.0.10", "--resolv-conf", _node_resolv_conf(tmp_path)]
    async with running_agent(containerd.endpoint, tmp_path, *flags) as agent:
        hosts, resolv, hostname = await _show(agent, "dns-none", DNS_NONE)
        pod = agent.pod("dns-none")
        assert pod is not None
        assert resolv == [
            "search my.example",
            "nameserver 1.1.1.1",
            "nameserver 2001:db8::53",
            "options ndots:2 edns0",
        ]
        # No hostname in the spec: the pod's name, with no domain (no subdomain).
        assert hostname == ["dns-none-itest-node"]
        assert hosts[-1] == f"{pod.status.pod_ip}\tdns-none-itest-node"


async def test_host_network_pod_gets_the_nodes_files_and_its_aliases(containerd, tmp_path):
    # ClusterFirst on the host network resolves as the node: no cluster DNS here.
    flags = ["--cluster-dns", "10.96.0.10", "--resolv-conf", _node_resolv_conf(tmp_path)]
    async with running_agent(containerd.endpoint, tmp_path, *flags) as agent:
        hosts, resolv, hostname = await _show(agent, "host-net", HOST_NETWORK)
        node_hosts = Path("/etc/hosts").read_text().splitlines()
        assert hosts == [
            "# Kubernetes-managed hosts file (host network).",
            *node_hosts,
            *ALIAS_LINES,
        ]
        assert resolv == ["search corp.example", "nameserver 192.0.2.53", "options timeout:2"]
        assert hostname == [Path("/proc/sys/kernel/hostname").read_text().strip()]

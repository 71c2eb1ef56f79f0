"""The /etc/hosts the agent gives a pod's containers, and which containers get it.

The Go kubelet's ``managedHostsFileContent``, ``nodeHostsFileContent`` and
``hostsEntriesFromHostAliases`` (pkg/kubelet/kubelet_pods.go). Pure: a host-network
pod's file starts from the node's /etc/hosts, which the caller reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from trio_kubelet.core.pod_hostname import pod_domain, pod_hostname
from trio_kubelet.model.pod import Container, HostAlias, Pod

ETC_HOSTS_PATH = "/etc/hosts"
MANAGED_HEADER = "# Kubernetes-managed hosts file.\n"
HOST_NETWORK_HEADER = "# Kubernetes-managed hosts file (host network).\n"
_LOCALHOST_LINES = (
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "fe00::0\tip6-mcastprefix\n"
    "fe00::1\tip6-allnodes\n"
    "fe00::2\tip6-allrouters\n"
)


def gets_managed_hosts(pod: Pod, container: Container, pod_ips: Sequence[str]) -> bool:
    """Whether the agent mounts its hosts file at the container's /etc/hosts.

    Not while the pod has no IP yet (its own line would be missing; a host-network
    pod has the node's addresses), and not over a volume the container mounts there.
    """
    if not pod_ips and not pod.spec.host_network:
        return False
    return all(mount.mount_path != ETC_HOSTS_PATH for mount in container.volume_mounts)


def pod_hosts_content(
    pod: Pod, pod_ips: Sequence[str], cluster_domain: str, node_hosts: str = ""
) -> str:
    """The pod's hosts file: the node's for a host-network pod, else its own names.

    ``node_hosts`` is the node's /etc/hosts, used only with host network.
    """
    if pod.spec.host_network:
        return HOST_NETWORK_HEADER + node_hosts + host_alias_lines(pod.spec.host_aliases)
    return managed_hosts_content(
        pod_ips, pod_hostname(pod), pod_domain(pod, cluster_domain), pod.spec.host_aliases
    )


def managed_hosts_content(
    pod_ips: Sequence[str], hostname: str, domain: str, host_aliases: Sequence[HostAlias]
) -> str:
    """Localhost names, one line per pod IP naming the pod (FQDN first if it has a domain),
    then the hostAliases."""
    lines = [MANAGED_HEADER, _LOCALHOST_LINES]
    for ip in pod_ips:
        names = f"{hostname}.{domain}\t{hostname}" if domain else hostname
        lines.append(f"{ip}\t{names}\n")
    lines.append(host_alias_lines(host_aliases))
    return "".join(lines)


def host_alias_lines(host_aliases: Sequence[HostAlias]) -> str:
    """A commented block with one line per alias entry (its IP, then its names); "" for none."""
    if not host_aliases:
        return ""
    lines = ["\n# Entries added by HostAliases.\n"]
    lines.extend(alias.ip + "\t" + "\t".join(alias.hostnames) + "\n" for alias in host_aliases)
    return "".join(lines)

"""Which sysctls a pod may set on this node (``pkg/kubelet/sysctl``), as pure functions.

The safe set is namespaced per pod and harmless to other pods; an operator allows
more with allowedUnsafeSysctls. Names are compared in dotted form.
"""

from __future__ import annotations

from collections.abc import Sequence

from trio_kubelet.model.pod import Pod

# SafeSysctlAllowlist: namespaced, and without effect on other pods. Go drops the keepalive,
# fin_timeout and reserved-ports entries on kernels too old to namespace them (< 4.6 at most).
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    }
)
_IPC, _NET = "ipc", "net"
_SYSCTL_NAMESPACES = {"kernel.sem": _IPC}
_SYSCTL_NAMESPACE_PREFIXES = {
    "kernel.shm": _IPC,
    "kernel.msg": _IPC,
    "fs.mqueue.": _IPC,
    "net.": _NET,
}


def normalize_sysctl_name(name: str) -> str:
    """``net/ipv4/conf/eth0.100/rp_filter`` → ``net.ipv4.conf.eth0/100.rp_filter``: a name
    whose first separator is a slash has its dots and slashes swapped (sysctl.d(5))."""
    first = next((char for char in name if char in "./"), ".")
    if first == ".":
        return name
    return name.translate(str.maketrans("./", "/."))


def sysctl_rejection(pod: Pod, *, allowed_unsafe: Sequence[str] = ()) -> str | None:
    """The admission message (reason SysctlForbidden) for the first sysctl the node
    does not allow, or None when all are allowed.

    Allowed are the safe sysctls plus ``allowed_unsafe`` (the kubelet's allowedUnsafeSysctls:
    names, or prefixes ending in ``*``); a net sysctl is still refused to a host-network pod,
    an IPC one to a host-IPC pod, since it would change the node's own setting.
    """
    spec = pod.spec
    allowed = [*sorted(SAFE_SYSCTLS), *(normalize_sysctl_name(p) for p in allowed_unsafe)]
    for sysctl in spec.security_context.sysctls:
        name = normalize_sysctl_name(sysctl.get("name", ""))
        pattern = next((p for p in allowed if _sysctl_matches(name, p)), None)
        if pattern is None:
            return f'forbidden sysctl: "{name}" not allowlisted'
        namespace = _sysctl_namespace(pattern.removesuffix("*"))
        if (namespace == _NET and spec.host_network) or (namespace == _IPC and spec.host_ipc):
            return f'forbidden sysctl: "{name}" not allowed with host {namespace} enabled'
    return None


def _sysctl_matches(name: str, pattern: str) -> bool:
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return name == pattern


def _sysctl_namespace(name: str) -> str | None:
    """The kernel namespace that isolates a sysctl, None when it is not known to be namespaced."""
    if name in _SYSCTL_NAMESPACES:
        return _SYSCTL_NAMESPACES[name]
    return next(
        (ns for prefix, ns in _SYSCTL_NAMESPACE_PREFIXES.items() if name.startswith(prefix)),
        None,
    )

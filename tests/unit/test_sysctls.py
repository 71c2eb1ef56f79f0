"""core.sysctls: the sysctls a pod may set here, and their names in dotted form."""

from __future__ import annotations

from typing import Any

import pytest

from trio_kubelet.core import admission, sysctls
from trio_kubelet.model.pod import Pod

UID = "0d1f7c0e-2222-4000-8000-000000000002"


def make_pod(**spec: Any) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "web", "namespace": "shop", "uid": UID},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}], **spec},
    })


@pytest.mark.parametrize(("name", "normal"), [
    ("kernel.shm_rmid_forced", "kernel.shm_rmid_forced"),
    ("kernel/shm_rmid_forced", "kernel.shm_rmid_forced"),
    ("net.ipv4.conf.eno2/100.rp_filter", "net.ipv4.conf.eno2/100.rp_filter"),
    ("net/ipv4/conf/eno2.100/rp_filter", "net.ipv4.conf.eno2/100.rp_filter"),
    ("", ""),
])
def test_sysctl_names_are_normalised_to_dots(name: str, normal: str) -> None:
    assert sysctls.normalize_sysctl_name(name) == normal


# -- sysctl admission --------------------------------------------------------------------------


def sysctl_pod(*names: str, **spec: Any) -> Pod:
    sysctls = [{"name": name, "value": "1"} for name in names]
    return make_pod(securityContext={"sysctls": sysctls}, **spec)


def test_safe_sysctls_are_admitted() -> None:
    assert sysctls.sysctl_rejection(sysctl_pod(*sorted(sysctls.SAFE_SYSCTLS))) is None
    assert sysctls.sysctl_rejection(make_pod()) is None


def test_unsafe_sysctl_is_forbidden() -> None:
    pod = sysctl_pod("net.ipv4.tcp_syncookies", "kernel/msgmax")
    assert sysctls.sysctl_rejection(pod) == 'forbidden sysctl: "kernel.msgmax" not allowlisted'
    assert admission.SYSCTL_FORBIDDEN == "SysctlForbidden"


def test_allowed_unsafe_sysctls_by_name_or_prefix() -> None:
    pod = sysctl_pod("kernel.msgmax", "net.core.somaxconn")
    assert sysctls.sysctl_rejection(pod, allowed_unsafe=["kernel.msg*", "net.core.somaxconn"]) \
        is None
    assert sysctls.sysctl_rejection(pod, allowed_unsafe=["kernel.msg*"]) == (
        'forbidden sysctl: "net.core.somaxconn" not allowlisted')


def test_namespaced_sysctls_are_forbidden_when_the_pod_shares_the_hosts_namespace() -> None:
    net = sysctl_pod("net.ipv4.ip_local_port_range", hostNetwork=True)
    assert sysctls.sysctl_rejection(net) == (
        'forbidden sysctl: "net.ipv4.ip_local_port_range" not allowed with host net enabled')
    ipc = sysctl_pod("kernel.shm_rmid_forced", hostIPC=True)
    assert sysctls.sysctl_rejection(ipc) == (
        'forbidden sysctl: "kernel.shm_rmid_forced" not allowed with host ipc enabled')
    assert sysctls.sysctl_rejection(sysctl_pod("kernel.msgmax", hostIPC=True),
                                     allowed_unsafe=["kernel.msg*"]) == (
        'forbidden sysctl: "kernel.msgmax" not allowed with host ipc enabled')
    assert sysctls.sysctl_rejection(sysctl_pod("kernel.shm_rmid_forced", hostNetwork=True)) \
        is None

"""runtime.security: pod and container security contexts as the Go kubelet hands them to the CRI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trio_kubelet.model.pod import Pod
from trio_kubelet.runtime import configs, security
from trio_kubelet.runtime.cri.runtime import v1

UID = "0d1f7c0e-2222-4000-8000-000000000002"
ROOT = Path("/var/lib/kubelet/seccomp")
PROFILE = v1.SecurityProfileProfileType


def make_pod(container_sc: dict[str, Any] | None = None, **spec: Any) -> Pod:
    container: dict[str, Any] = {"name": "main", "image": "busybox:1.36"}
    if container_sc is not None:
        container["securityContext"] = container_sc
    return Pod.model_validate({
        "metadata": {"name": "web", "namespace": "shop", "uid": UID},
        "spec": {"containers": [container], **spec},
    })


def context(pod: Pod, **kwargs: Any) -> v1.LinuxContainerSecurityContext:
    return security.container_security_context(pod, pod.spec.containers[0], **kwargs)


def non_root_error(pod: Pod, uid: int | None, username: str = "") -> str | None:
    return security.verify_run_as_non_root(pod, pod.spec.containers[0], uid, username)


# -- effective context -------------------------------------------------------------------------


def test_container_fields_override_the_pods_and_the_rest_is_inherited() -> None:
    pod = make_pod({"runAsUser": 2000, "readOnlyRootFilesystem": True},
                   securityContext={"runAsUser": 1000, "runAsGroup": 3000, "runAsNonRoot": True})
    effective = security.effective_security_context(pod, pod.spec.containers[0])
    assert (effective.run_as_user, effective.run_as_group, effective.run_as_non_root) == (
        2000, 3000, True)
    assert effective.read_only_root_filesystem is True


# -- container ---------------------------------------------------------------------------------


def test_no_security_context_leaves_the_image_user_and_runs_unconfined() -> None:
    sc = context(make_pod())
    assert sc.run_as_user is None and sc.run_as_group is None and sc.run_as_username == ""
    assert (sc.privileged, sc.readonly_rootfs, sc.no_new_privs) == (False, False, False)
    assert sc.capabilities is None
    assert sc.supplemental_groups == []
    assert sc.seccomp == v1.SecurityProfile(profile_type=PROFILE.Unconfined)
    assert sc.masked_paths == list(security.DEFAULT_MASKED_PATHS)
    assert sc.readonly_paths == list(security.DEFAULT_READONLY_PATHS)
    assert sc.namespace_options == v1.NamespaceOption(
        network=v1.NamespaceMode.POD, pid=v1.NamespaceMode.CONTAINER, ipc=v1.NamespaceMode.POD)


def test_container_settings_reach_the_runtime() -> None:
    pod = make_pod({
        "runAsUser": 1234, "runAsGroup": 5678, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE", "CAP_CHOWN"]},
    })
    sc = context(pod)
    assert sc.run_as_user == v1.Int64Value(value=1234)
    assert sc.run_as_group == v1.Int64Value(value=5678)
    assert sc.readonly_rootfs is True
    # Names pass through as written: the runtime adds the CAP_ prefix, as with the Go kubelet.
    assert sc.capabilities == v1.Capability(
        add_capabilities=["NET_BIND_SERVICE", "CAP_CHOWN"], drop_capabilities=["ALL"])


def test_run_as_user_zero_is_sent_not_dropped() -> None:
    sc = context(make_pod({"runAsUser": 0}))
    assert sc.run_as_user == v1.Int64Value(value=0)


def test_fs_group_comes_first_among_the_supplemental_groups() -> None:
    pod = make_pod(securityContext={"fsGroup": 2000, "supplementalGroups": [3000, 4000]})
    assert context(pod).supplemental_groups == [2000, 3000, 4000]


@pytest.mark.parametrize(("allow", "no_new_privs"), [(False, True), (True, False), (None, False)])
def test_no_new_privs_only_when_escalation_is_explicitly_forbidden(
    allow: bool | None, no_new_privs: bool
) -> None:
    sc = {} if allow is None else {"allowPrivilegeEscalation": allow}
    assert context(make_pod(sc)).no_new_privs is no_new_privs


def test_privileged_container_still_gets_the_default_paths() -> None:
    # The runtime clears them for a privileged container; the kubelet always sends them.
    sc = context(make_pod({"privileged": True}))
    assert sc.privileged is True
    assert sc.masked_paths == list(security.DEFAULT_MASKED_PATHS)
    assert "/sys/firmware" in sc.masked_paths and "/proc/sys" in sc.readonly_paths


def test_container_seccomp_wins_over_the_pods() -> None:
    pod = make_pod({"seccompProfile": {"type": "RuntimeDefault"}},
                   securityContext={"seccompProfile": {"type": "Localhost",
                                                       "localhostProfile": "a.json"}})
    assert context(pod).seccomp == v1.SecurityProfile(profile_type=PROFILE.RuntimeDefault)


def test_localhost_seccomp_is_a_file_under_the_profile_root() -> None:
    pod = make_pod(securityContext={"seccompProfile": {"type": "Localhost",
                                                       "localhostProfile": "/profiles/a.json"}})
    assert context(pod).seccomp == v1.SecurityProfile(
        profile_type=PROFILE.Localhost, localhost_ref=f"{ROOT}/profiles/a.json")
    custom = context(pod, seccomp_profile_root=Path("/srv/kubelet/seccomp"))
    assert custom.seccomp is not None
    assert custom.seccomp.localhost_ref == "/srv/kubelet/seccomp/profiles/a.json"


def test_explicit_unconfined_seccomp() -> None:
    pod = make_pod({"seccompProfile": {"type": "Unconfined"}})
    assert context(pod).seccomp == v1.SecurityProfile(profile_type=PROFILE.Unconfined)


def test_localhost_seccomp_without_a_profile_cannot_be_created() -> None:
    pod = make_pod({"seccompProfile": {"type": "Localhost"}})
    with pytest.raises(security.SecurityContextError, match="localhostProfile must be set"):
        context(pod)


def test_container_context_survives_the_wire() -> None:
    pod = make_pod({"runAsUser": 7, "capabilities": {"add": ["NET_ADMIN"]},
                    "allowPrivilegeEscalation": False},
                   securityContext={"fsGroup": 9})
    sc = context(pod)
    assert v1.LinuxContainerSecurityContext.parse(bytes(sc)) == sc


# -- sandbox -----------------------------------------------------------------------------------


def test_sandbox_takes_the_pod_user_groups_and_always_the_default_seccomp() -> None:
    pod = make_pod({"runAsUser": 99, "seccompProfile": {"type": "Unconfined"}},
                   securityContext={"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000,
                                    "supplementalGroups": [4000],
                                    "seccompProfile": {"type": "Unconfined"}})
    sc = security.sandbox_security_context(pod)
    assert sc.run_as_user == v1.Int64Value(value=1000)
    assert sc.run_as_group == v1.Int64Value(value=3000)
    assert sc.supplemental_groups == [2000, 4000]
    assert sc.seccomp == v1.SecurityProfile(profile_type=PROFILE.RuntimeDefault)
    assert (sc.privileged, sc.readonly_rootfs) == (False, False)


def test_sandbox_is_privileged_when_any_container_is() -> None:
    pod = Pod.model_validate({
        "metadata": {"name": "web", "namespace": "shop", "uid": UID},
        "spec": {
            "initContainers": [{"name": "setup", "image": "busybox:1.36",
                                "securityContext": {"privileged": True}}],
            "containers": [{"name": "main", "image": "busybox:1.36"}],
        },
    })
    assert security.sandbox_security_context(pod).privileged is True
    assert security.sandbox_security_context(make_pod()).privileged is False


def test_sandbox_config_carries_the_sysctls_in_dotted_form() -> None:
    pod = make_pod(securityContext={"sysctls": [
        {"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"},
        {"name": "net/ipv4/conf/eth0.100/rp_filter", "value": "1"},
    ]})
    config = configs.sandbox_config(pod, 0, Path("/var/log/pods"))
    assert config.linux is not None
    assert config.linux.sysctls == {
        "net.ipv4.ip_local_port_range": "1024 65535",
        "net.ipv4.conf.eth0/100.rp_filter": "1",
    }
    assert config.linux.security_context == security.sandbox_security_context(pod)


# -- runAsNonRoot ------------------------------------------------------------------------------

WHERE = f'(pod: "web_shop({UID})", container: main)'


def test_without_run_as_non_root_anything_goes() -> None:
    assert non_root_error(make_pod(), 0) is None
    assert non_root_error(make_pod({"runAsNonRoot": False}), 0) is None
    # The container's explicit false overrides the pod's true.
    pod = make_pod({"runAsNonRoot": False}, securityContext={"runAsNonRoot": True})
    assert non_root_error(pod, 0) is None


def test_image_running_as_root_is_refused() -> None:
    pod = make_pod(securityContext={"runAsNonRoot": True})
    expected = f"container has runAsNonRoot and image will run as root {WHERE}"
    assert non_root_error(pod, 0) == expected
    # An image that names no user runs as root.
    assert non_root_error(pod, None, "") == expected


def test_image_with_a_user_name_cannot_be_verified() -> None:
    pod = make_pod({"runAsNonRoot": True})
    assert non_root_error(pod, None, "nginx") == (
        "container has runAsNonRoot and image has non-numeric user (nginx), cannot verify "
        f"user is non-root {WHERE}")


def test_image_with_a_non_root_uid_passes() -> None:
    assert non_root_error(make_pod({"runAsNonRoot": True}), 1000) is None


def test_run_as_user_decides_over_the_image() -> None:
    assert non_root_error(make_pod({"runAsNonRoot": True, "runAsUser": 1000}), 0) is None
    pod = make_pod({"runAsNonRoot": True, "runAsUser": 0})
    assert non_root_error(pod, 1000) == f"container's runAsUser breaks non-root policy {WHERE}"


def test_image_uid_out_of_range_is_refused() -> None:
    message = non_root_error(make_pod({"runAsNonRoot": True}), 2**31)
    assert message == (
        f"container has runAsNonRoot and image has an invalid user id ({2**31}). "
        "(Must be 1-(2147483647)): must be between 0 and 2147483647, inclusive "
        f"{WHERE}")

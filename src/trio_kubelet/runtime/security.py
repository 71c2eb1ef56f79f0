"""Pod and container security contexts in the CRI's terms, with the checks the Go kubelet makes.

Pure functions: what ``kuberuntime`` (security_context.go, helpers.go, kuberuntime_sandbox.go)
and ``pkg/securitycontext`` derive from a pod spec, the runAsNonRoot verification, and the
sysctls in the sandbox's form. Nothing here talks to the runtime.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trio_kubelet.config import DEFAULT_ROOT_DIR
from trio_kubelet.core.sysctls import normalize_sysctl_name
from trio_kubelet.model.pod import Container, Pod, SecurityContext
from trio_kubelet.runtime.cri.runtime import v1 as cri

# The Go kubelet's seccompProfileRoot: <root-dir>/seccomp.
DEFAULT_SECCOMP_PROFILE_ROOT = DEFAULT_ROOT_DIR / "seccomp"

# pkg/securitycontext's defaults (kept in step with moby). The kubelet sends them even for a
# privileged container: the runtime drops them there, so the spec stays the same either way.
DEFAULT_MASKED_PATHS = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
DEFAULT_READONLY_PATHS = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)

_MAX_USER_ID = 2**31 - 1


class SecurityContextError(ValueError):
    """The pod's security settings cannot be expressed to the runtime (the container is not
    created: the Go kubelet reports CreateContainerConfigError with this message)."""


def effective_security_context(pod: Pod, container: Container) -> SecurityContext:
    """The pod's runAsUser/runAsGroup/runAsNonRoot, overridden by every field the container
    sets itself (``DetermineEffectiveSecurityContext``)."""
    pod_sc = pod.spec.security_context
    effective = SecurityContext(
        run_as_user=pod_sc.run_as_user,
        run_as_group=pod_sc.run_as_group,
        run_as_non_root=pod_sc.run_as_non_root,
    )
    own = container.security_context
    if own is None:
        return effective
    overrides = {
        name: value
        for name in SecurityContext.model_fields
        if (value := getattr(own, name)) is not None
    }
    return effective.model_copy(update=overrides)


def container_security_context(
    pod: Pod,
    container: Container,
    *,
    seccomp_profile_root: Path = DEFAULT_SECCOMP_PROFILE_ROOT,
) -> cri.LinuxContainerSecurityContext:
    """The container's CRI security context (``determineEffectiveSecurityContext``).

    The user is left to the runtime when neither the pod nor the container names one: it then
    runs the image's user, which is what the Go kubelet asks for by passing that user on.
    Raises :class:`SecurityContextError` for a Localhost seccomp profile without a file.
    """
    effective = effective_security_context(pod, container)
    capabilities = effective.capabilities
    return cri.LinuxContainerSecurityContext(
        capabilities=(
            cri.Capability(
                add_capabilities=list(capabilities.add),
                drop_capabilities=list(capabilities.drop),
            )
            if capabilities is not None
            else None
        ),
        privileged=bool(effective.privileged),
        namespace_options=_namespace_options(pod),
        run_as_user=_int64(effective.run_as_user),
        run_as_group=_int64(effective.run_as_group),
        readonly_rootfs=bool(effective.read_only_root_filesystem),
        supplemental_groups=_supplemental_groups(pod),
        # AddNoNewPrivileges: only an explicit allowPrivilegeEscalation: false sets it.
        no_new_privs=effective.allow_privilege_escalation is False,
        masked_paths=list(DEFAULT_MASKED_PATHS),
        readonly_paths=list(DEFAULT_READONLY_PATHS),
        seccomp=_seccomp_profile(pod, container, seccomp_profile_root),
    )


def sandbox_security_context(pod: Pod) -> cri.LinuxSandboxSecurityContext:
    """The sandbox's CRI security context (``generatePodSandboxLinuxConfig``).

    The sandbox always runs the runtime's default seccomp profile, whatever the pod asks for
    its containers (kubernetes#84623), and is privileged when any container is: containerd
    refuses a privileged container in an unprivileged sandbox.
    """
    pod_sc = pod.spec.security_context
    return cri.LinuxSandboxSecurityContext(
        namespace_options=_namespace_options(pod),
        run_as_user=_int64(pod_sc.run_as_user),
        run_as_group=_int64(pod_sc.run_as_group),
        supplemental_groups=_supplemental_groups(pod),
        privileged=any(
            c.security_context is not None and c.security_context.privileged
            for c in _all_containers(pod)
        ),
        seccomp=cri.SecurityProfile(profile_type=cri.SecurityProfileProfileType.RuntimeDefault),
    )


def pod_sysctls(pod: Pod) -> dict[str, str]:
    """The pod's sysctls for ``LinuxPodSandboxConfig.sysctls``, names in dotted form (runc
    only understands dots; Go normalises them before creating the sandbox)."""
    return {
        normalize_sysctl_name(sysctl.get("name", "")): sysctl.get("value", "")
        for sysctl in pod.spec.security_context.sysctls
    }


def verify_run_as_non_root(
    pod: Pod, container: Container, image_uid: int | None, image_username: str
) -> str | None:
    """Why the container must not start under ``runAsNonRoot``, or None when it may.

    ``image_uid``/``image_username`` are the image's user as the runtime's ImageStatus reports
    it; an image that names neither runs as root, as the Go kubelet assumes.
    """
    effective = effective_security_context(pod, container)
    if not effective.run_as_non_root:
        return None
    where = f'(pod: "{_format_pod(pod)}", container: {container.name})'
    if effective.run_as_user is not None:
        if effective.run_as_user == 0:
            return f"container's runAsUser breaks non-root policy {where}"
        return None
    if image_uid is None and image_username:
        return (
            f"container has runAsNonRoot and image has non-numeric user ({image_username}), "
            f"cannot verify user is non-root {where}"
        )
    uid = image_uid or 0
    if uid == 0:
        return f"container has runAsNonRoot and image will run as root {where}"
    if not 0 <= uid <= _MAX_USER_ID:
        return (
            f"container has runAsNonRoot and image has an invalid user id ({uid}). "
            f"(Must be 1-({_MAX_USER_ID})): must be between 0 and {_MAX_USER_ID}, inclusive "
            f"{where}"
        )
    return None


def _seccomp_profile(pod: Pod, container: Container, root: Path) -> cri.SecurityProfile:
    """The container's field wins over the pod's; neither means Unconfined, the kubelet's
    default while seccompDefault is off."""
    own = container.security_context
    profile = own.seccomp_profile if own is not None else None
    if profile is None:
        profile = pod.spec.security_context.seccomp_profile
    return _field_seccomp_profile(profile, root)


def _field_seccomp_profile(profile: dict[str, Any] | None, root: Path) -> cri.SecurityProfile:
    profile = profile or {}
    kind = profile.get("type")
    if kind == "RuntimeDefault":
        return cri.SecurityProfile(profile_type=cri.SecurityProfileProfileType.RuntimeDefault)
    if kind == "Localhost":
        local = profile.get("localhostProfile")
        if not local:
            raise SecurityContextError(
                "localhostProfile must be set if seccompProfile type is Localhost."
            )
        # filepath.Join: the profile is always under the root, even when written absolute.
        ref = posixpath.normpath(f"{root}/{local}")
        return cri.SecurityProfile(
            profile_type=cri.SecurityProfileProfileType.Localhost, localhost_ref=ref
        )
    return cri.SecurityProfile(profile_type=cri.SecurityProfileProfileType.Unconfined)


def _supplemental_groups(pod: Pod) -> list[int]:
    """fsGroup first, then the pod's supplementalGroups, in the order Go appends them."""
    pod_sc = pod.spec.security_context
    fs_group = [pod_sc.fs_group] if pod_sc.fs_group is not None else []
    return [*fs_group, *pod_sc.supplemental_groups]


def _namespace_options(pod: Pod) -> cri.NamespaceOption:
    spec = pod.spec
    return cri.NamespaceOption(
        network=cri.NamespaceMode.NODE if spec.host_network else cri.NamespaceMode.POD,
        pid=cri.NamespaceMode.NODE if spec.host_pid else cri.NamespaceMode.CONTAINER,
        ipc=cri.NamespaceMode.NODE if spec.host_ipc else cri.NamespaceMode.POD,
    )


def _int64(value: int | None) -> cri.Int64Value | None:
    return cri.Int64Value(value=value) if value is not None else None


def _all_containers(pod: Pod) -> Iterator[Container]:
    spec = pod.spec
    yield from spec.init_containers
    yield from spec.containers
    yield from spec.ephemeral_containers


def _format_pod(pod: Pod) -> str:
    """Go's ``format.Pod``: ``name_namespace(uid)``."""
    meta = pod.metadata
    return f"{meta.name}_{meta.namespace}({meta.uid})"

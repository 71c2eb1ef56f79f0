"""Security contexts on a real containerd: users and groups, read-only root, capabilities,
no_new_privs, seccomp and sysctls, as seen from inside the containers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.harness import container, running_agent
from trio_kubelet.model.pod import Pod

if TYPE_CHECKING:
    from tests.containerd_fixture import Containerd

pytestmark = pytest.mark.integration

CAP_SYS_ADMIN = 1 << 21
# One line per fact, so each container's log reads as a list of answers.
STATUS_FIELD = "grep '^{0}:' /proc/self/status | cut -f2"

IDENTITY = """\
apiVersion: v1
kind: Pod
metadata: {name: identity}
spec:
  restartPolicy: Never
  securityContext:
    fsGroup: 2000
    supplementalGroups: [3000]
    sysctls:
    - {name: kernel.shm_rmid_forced, value: "1"}
  containers:
  - name: main
    image: busybox:1.36
    securityContext: {runAsUser: 1234, runAsGroup: 4321}
    command: ["sh", "-c", "id -u; id -g; id -G; cat /proc/sys/kernel/shm_rmid_forced; SECCOMP"]
"""

RESTRICTED = """\
apiVersion: v1
kind: Pod
metadata: {name: restricted}
spec:
  restartPolicy: Never
  containers:
  - name: readonly
    image: busybox:1.36
    securityContext: {readOnlyRootFilesystem: true}
    command: ["sh", "-c", "if touch /probe 2>/dev/null; then echo writable; else echo readonly; fi"]
  - name: caps
    image: busybox:1.36
    securityContext:
      capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}
      allowPrivilegeEscalation: false
      seccompProfile: {type: RuntimeDefault}
    command: ["sh", "-c", "CAPEFF; NONEWPRIVS; SECCOMP"]
  - name: privileged
    image: busybox:1.36
    securityContext: {privileged: true}
    command: ["sh", "-c", "CAPEFF"]
"""


def manifest(template: str) -> str:
    return (
        template.replace("CAPEFF", STATUS_FIELD.format("CapEff"))
        .replace("NONEWPRIVS", STATUS_FIELD.format("NoNewPrivs"))
        .replace("SECCOMP", STATUS_FIELD.format("Seccomp"))
    )


def finished(pod: Pod) -> bool:
    return pod.status.phase in ("Succeeded", "Failed")


def assert_succeeded(pod: Pod, *names: str) -> None:
    """Every container exited 0; otherwise say which did not, and why."""
    states = {name: container(pod, name).state for name in names}
    assert pod.status.phase == "Succeeded", {
        name: state.model_dump(exclude_none=True) for name, state in states.items()
    }


async def test_user_groups_and_sysctls_reach_the_container(
    containerd: Containerd, tmp_path: Path
) -> None:
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("identity.yaml", manifest(IDENTITY))
        pod = await agent.wait_for("identity", finished)
        assert_succeeded(pod, "main")
        uid, gid, groups, shm_rmid_forced, seccomp = agent.output(pod, "main")
        assert (uid, gid) == ("1234", "4321")
        # fsGroup and supplementalGroups join the process's groups.
        assert {"2000", "3000"} <= set(groups.split()), groups
        assert shm_rmid_forced == "1"
        assert seccomp == "0", "no seccompProfile means Unconfined (seccompDefault is off)"


async def test_read_only_root_capabilities_and_privileges(
    containerd: Containerd, tmp_path: Path
) -> None:
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("restricted.yaml", manifest(RESTRICTED))
        pod = await agent.wait_for("restricted", finished)
        assert_succeeded(pod, "readonly", "caps", "privileged")
        assert agent.output(pod, "readonly") == ["readonly"]
        cap_eff, no_new_privs, seccomp = agent.output(pod, "caps")
        assert int(cap_eff, 16) == 1 << 10, f"only CAP_NET_BIND_SERVICE expected, got {cap_eff}"
        assert no_new_privs == "1"
        assert seccomp == "2", "RuntimeDefault is a seccomp filter"
        # A privileged container runs (its sandbox was made privileged) with all capabilities.
        [privileged_caps] = agent.output(pod, "privileged")
        assert int(privileged_caps, 16) & CAP_SYS_ADMIN

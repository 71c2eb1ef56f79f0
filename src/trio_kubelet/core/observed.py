"""What the container runtime reports about one pod, as plain immutable values.

These mirror the Go kubelet's ``kubecontainer.PodStatus``: the agent builds them
from CRI answers (``runtime/inspect.py``) and every pure decision reads them.
Times are seconds since the epoch (floats); 0.0 means "not set".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ContainerState(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"


class SandboxState(enum.Enum):
    READY = "ready"
    NOTREADY = "notready"


@dataclass(frozen=True, slots=True)
class RuntimeContainer:
    """One container instance as the runtime knows it."""

    id: str
    name: str
    state: ContainerState
    spec_hash: str = ""
    restart_count: int = 0
    attempt: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    # What an exited container left in its terminationMessagePath (or its log's tail).
    termination_message: str = ""
    created_at: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    image: str = ""
    image_ref: str = ""
    sandbox_id: str = ""


@dataclass(frozen=True, slots=True)
class RuntimeSandbox:
    """One pod sandbox instance."""

    id: str
    state: SandboxState
    attempt: int = 0
    created_at: float = 0.0
    host_network: bool = False
    ip: str = ""
    additional_ips: tuple[str, ...] = ()

    @property
    def ips(self) -> list[str]:
        """Every IP of the sandbox, primary first (none with host network)."""
        return [self.ip, *self.additional_ips] if self.ip else []


@dataclass(frozen=True, slots=True)
class RuntimePodStatus:
    """Everything the runtime holds for one pod UID.

    ``sandboxes`` and ``containers`` are ordered newest first, as the Go kubelet
    orders them, so "the status of container X" is the first entry named X.
    """

    uid: str
    name: str = ""
    namespace: str = ""
    sandboxes: tuple[RuntimeSandbox, ...] = ()
    containers: tuple[RuntimeContainer, ...] = field(default=())

    def find(self, name: str) -> RuntimeContainer | None:
        """The newest instance of the named container, if any."""
        for container in self.containers:
            if container.name == name:
                return container
        return None

    def instances(self, name: str) -> list[RuntimeContainer]:
        """Every instance of the named container, newest first."""
        return [c for c in self.containers if c.name == name]

    @property
    def ip(self) -> str:
        """The pod IP of the newest sandbox ("" for host network or none)."""
        return self.sandboxes[0].ip if self.sandboxes else ""


# How much of a container's termination message the kubelet keeps (kubecontainer's limits):
# the end of the file, or with FallbackToLogsOnError the last lines of its log.
MAX_TERMINATION_MESSAGE_BYTES = 4096
MAX_TERMINATION_LOG_BYTES = 2048
MAX_TERMINATION_LOG_LINES = 80
FALLBACK_TO_LOGS_ON_ERROR = "FallbackToLogsOnError"
# containerd's reason for a container whose process never started: it has no log to read.
CONTAINER_CANNOT_RUN = "ContainerCannotRun"


def wants_log_tail(policy: str, exit_code: int, reason: str, file_message: str) -> bool:
    """Whether an exited container's message comes from its log rather than its file.

    Only with FallbackToLogsOnError, only for a failure (a non-zero exit of a process
    that ran), and only when the container wrote no message of its own.
    """
    return (
        policy == FALLBACK_TO_LOGS_ON_ERROR
        and exit_code != 0
        and reason != CONTAINER_CANNOT_RUN
        and not file_message
    )


class ProbeResult(enum.Enum):
    """A probe's published result for one container instance (prober/results)."""

    SUCCESS = "success"
    FAILURE = "failure"
    UNKNOWN = "unknown"

"""The v1 Pod: spec, metadata and status, with the API server's defaults and validation.

Only what the agent reads is typed; every other field is kept as an extra so it
survives a round trip. Defaults are the ones ``pkg/apis/core/v1/defaults.go``
applies, so a static manifest means the same here as it would on a cluster.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from trio_kubelet.model.base import KubeModel
from trio_kubelet.model.quantity import QuantityError, parse_quantity

RestartPolicy = Literal["Always", "OnFailure", "Never"]
PullPolicy = Literal["Always", "IfNotPresent", "Never"]

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


# The API server's limits on a pod's dnsConfig (pkg/apis/core/validation).
MAX_DNS_NAMESERVERS = 3
MAX_DNS_SEARCH_PATHS = 32
MAX_DNS_SEARCH_LIST_CHARS = 2048
# Search paths may hold underscores (relaxed DNS search validation, GA in Kubernetes 1.34).
_DNS_SEARCH_PATH = re.compile(
    r"^[a-z0-9_]([-a-z0-9_]*[a-z0-9_])?(\.[a-z0-9_]([-a-z0-9_]*[a-z0-9_])?)*$"
)


def _check_dns_label(value: str, what: str) -> str:
    if len(value) > 63 or not _DNS1123_LABEL.match(value):
        raise ValueError(f"{what} {value!r} must be a lowercase RFC 1123 label (a-z, 0-9, '-')")
    return value


def _check_dns_subdomain(value: str, what: str) -> str:
    if len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value):
        raise ValueError(f"{what} {value!r} must be a lowercase RFC 1123 subdomain")
    return value


def _check_ip(value: str, what: str) -> str:
    """Go's IsValidIP: a plain IPv4 or IPv6 address (no zone, no prefix length)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        valid = False
    else:
        valid = "%" not in value
    if not valid:
        raise ValueError(
            f"{what} {value!r} must be a valid IP address, e.g. 10.9.8.7 or 2001:db8::1"
        )
    return value


class ObjectMeta(KubeModel):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    generate_name: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    owner_references: list[dict[str, Any]] | None = None


class EnvVar(KubeModel):
    name: str
    value: str | None = None
    value_from: dict[str, Any] | None = None


class ContainerPort(KubeModel):
    container_port: int = Field(ge=1, le=65535)
    name: str | None = None
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    host_port: int | None = Field(default=None, ge=0, le=65535)
    host_ip: str | None = Field(default=None, alias="hostIP")


class ResourceRequirements(KubeModel):
    limits: dict[str, str | int | float] = Field(default_factory=dict)
    requests: dict[str, str | int | float] = Field(default_factory=dict)

    @field_validator("limits", "requests")
    @classmethod
    def _quantities(cls, values: dict[str, str | int | float]) -> dict[str, str | int | float]:
        for name, value in values.items():
            try:
                parse_quantity(value)
            except QuantityError as err:
                raise ValueError(f"{name}: {err}") from None
        return values


class ExecAction(KubeModel):
    command: list[str] = Field(default_factory=list)


class HTTPHeader(KubeModel):
    name: str
    value: str


class HTTPGetAction(KubeModel):
    port: int | str
    path: str = "/"
    host: str | None = None
    scheme: Literal["HTTP", "HTTPS"] = "HTTP"
    http_headers: list[HTTPHeader] = Field(default_factory=list)


class TCPSocketAction(KubeModel):
    port: int | str
    host: str | None = None


class GRPCAction(KubeModel):
    port: int
    service: str | None = None


class SleepAction(KubeModel):
    seconds: int = Field(ge=0)


class Probe(KubeModel):
    exec: ExecAction | None = None
    http_get: HTTPGetAction | None = None
    tcp_socket: TCPSocketAction | None = None
    grpc: GRPCAction | None = None
    initial_delay_seconds: int = Field(default=0, ge=0)
    timeout_seconds: int = Field(default=1, ge=1)
    period_seconds: int = Field(default=10, ge=1)
    success_threshold: int = Field(default=1, ge=1)
    failure_threshold: int = Field(default=3, ge=1)
    termination_grace_period_seconds: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _one_handler(self) -> Probe:
        handlers = [h for h in (self.exec, self.http_get, self.tcp_socket, self.grpc) if h]
        if len(handlers) != 1:
            raise ValueError("must specify exactly one of exec, httpGet, tcpSocket, grpc")
        return self


class LifecycleHandler(KubeModel):
    exec: ExecAction | None = None
    http_get: HTTPGetAction | None = None
    tcp_socket: TCPSocketAction | None = None
    sleep: SleepAction | None = None

    @model_validator(mode="after")
    def _one_handler(self) -> LifecycleHandler:
        handlers = [h for h in (self.exec, self.http_get, self.tcp_socket, self.sleep) if h]
        if len(handlers) != 1:
            raise ValueError("must specify exactly one of exec, httpGet, tcpSocket, sleep")
        return self


class Lifecycle(KubeModel):
    post_start: LifecycleHandler | None = None
    pre_stop: LifecycleHandler | None = None


class Capabilities(KubeModel):
    add: list[str] = Field(default_factory=list)
    drop: list[str] = Field(default_factory=list)


class SecurityContext(KubeModel):
    run_as_user: int | None = Field(default=None, ge=0)
    run_as_group: int | None = Field(default=None, ge=0)
    run_as_non_root: bool | None = None
    read_only_root_filesystem: bool | None = None
    privileged: bool | None = None
    allow_privilege_escalation: bool | None = None
    capabilities: Capabilities | None = None
    seccomp_profile: dict[str, Any] | None = None


class PodSecurityContext(KubeModel):
    run_as_user: int | None = Field(default=None, ge=0)
    run_as_group: int | None = Field(default=None, ge=0)
    run_as_non_root: bool | None = None
    supplemental_groups: list[int] = Field(default_factory=list)
    fs_group: int | None = None
    sysctls: list[dict[str, str]] = Field(default_factory=list)
    seccomp_profile: dict[str, Any] | None = None


class VolumeMount(KubeModel):
    name: str
    mount_path: str
    read_only: bool = False
    sub_path: str | None = None
    sub_path_expr: str | None = None


class Volume(KubeModel):
    """A pod volume: the source kinds are kept as untyped mappings until volumes/ acts on them."""

    name: str
    empty_dir: dict[str, Any] | None = None
    host_path: dict[str, Any] | None = None
    config_map: dict[str, Any] | None = None
    secret: dict[str, Any] | None = None
    downward_api: dict[str, Any] | None = Field(default=None, alias="downwardAPI")
    projected: dict[str, Any] | None = None


class Container(KubeModel):
    name: str
    image: str = ""
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    working_dir: str | None = None
    env: list[EnvVar] = Field(default_factory=list)
    env_from: list[dict[str, Any]] = Field(default_factory=list)
    ports: list[ContainerPort] = Field(default_factory=list)
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    volume_mounts: list[VolumeMount] = Field(default_factory=list)
    liveness_probe: Probe | None = None
    readiness_probe: Probe | None = None
    startup_probe: Probe | None = None
    lifecycle: Lifecycle | None = None
    termination_message_path: str = "/dev/termination-log"
    termination_message_policy: Literal["File", "FallbackToLogsOnError"] = "File"
    image_pull_policy: PullPolicy | None = None
    security_context: SecurityContext | None = None
    stdin: bool = False
    stdin_once: bool = False
    tty: bool = False
    # Only meaningful on init containers ("Always" makes a sidecar); ephemeral
    # containers additionally carry targetContainerName.
    restart_policy: RestartPolicy | None = None
    target_container_name: str | None = None

    @field_validator("name")
    @classmethod
    def _name_is_label(cls, value: str) -> str:
        return _check_dns_label(value, "container name")

    @model_validator(mode="after")
    def _default_pull_policy(self) -> Container:
        if self.image_pull_policy is None:
            self.image_pull_policy = default_pull_policy(self.image)
        return self


def image_tag(image: str) -> str | None:
    """The tag of an image reference, or None when it has a digest or no tag."""
    if "@" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def default_pull_policy(image: str) -> PullPolicy:
    """Always for ``:latest`` or untagged references, IfNotPresent otherwise (as the API server)."""
    if "@" in image:
        return "IfNotPresent"
    tag = image_tag(image)
    return "Always" if tag in (None, "latest") else "IfNotPresent"


class HostAlias(KubeModel):
    """Names the pod's /etc/hosts gives to one IP address."""

    ip: str = Field(default="", validate_default=True)
    hostnames: list[str] = Field(default_factory=list)

    @field_validator("ip")
    @classmethod
    def _valid_ip(cls, value: str) -> str:
        return _check_ip(value, "IP")

    @field_validator("hostnames")
    @classmethod
    def _valid_hostnames(cls, values: list[str]) -> list[str]:
        for index, name in enumerate(values):
            _check_dns_subdomain(name, f"[{index}]: hostname")
        return values


class PodDNSConfigOption(KubeModel):
    name: str = Field(default="", validate_default=True)
    value: str | None = None

    @field_validator("name")
    @classmethod
    def _name_required(cls, value: str) -> str:
        if not value:
            raise ValueError("required value: a resolver option must have a name")
        return value


class PodDNSConfig(KubeModel):
    """Resolver settings the pod adds to (or, with dnsPolicy None, uses instead of) the node's."""

    nameservers: list[str] = Field(default_factory=list)
    searches: list[str] = Field(default_factory=list)
    options: list[PodDNSConfigOption] = Field(default_factory=list)

    @field_validator("nameservers")
    @classmethod
    def _valid_nameservers(cls, values: list[str]) -> list[str]:
        if len(values) > MAX_DNS_NAMESERVERS:
            raise ValueError(f"must not have more than {MAX_DNS_NAMESERVERS} nameservers")
        for index, server in enumerate(values):
            _check_ip(server, f"[{index}]: nameserver")
        return values

    @field_validator("searches")
    @classmethod
    def _valid_searches(cls, values: list[str]) -> list[str]:
        if len(values) > MAX_DNS_SEARCH_PATHS:
            raise ValueError(f"must not have more than {MAX_DNS_SEARCH_PATHS} search paths")
        if len(" ".join(values)) > MAX_DNS_SEARCH_LIST_CHARS:
            raise ValueError(
                f"must not have more than {MAX_DNS_SEARCH_LIST_CHARS} characters "
                "(spaces included) in the search list"
            )
        for index, search in enumerate(values):
            name = search.removesuffix(".")
            if search != "." and (len(name) > 253 or not _DNS_SEARCH_PATH.match(name)):
                raise ValueError(f"[{index}]: search path {search!r} must be a DNS subdomain")
        return values


class PodOS(KubeModel):
    """The operating system the pod's containers need (``spec.os``)."""

    name: str


class PodReadinessGate(KubeModel):
    """A pod condition type that must be True, besides its containers, for the pod to be Ready."""

    condition_type: str


class PodSpec(KubeModel):
    containers: list[Container]
    init_containers: list[Container] = Field(default_factory=list)
    ephemeral_containers: list[Container] = Field(default_factory=list)
    restart_policy: RestartPolicy = "Always"
    termination_grace_period_seconds: int = Field(default=30, ge=0)
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    host_network: bool = False
    host_pid: bool = Field(default=False, alias="hostPID")
    host_ipc: bool = Field(default=False, alias="hostIPC")
    hostname: str | None = None
    subdomain: str | None = None
    hostname_override: str | None = None
    node_name: str | None = None
    dns_policy: Literal["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"] = (
        "ClusterFirst"
    )
    dns_config: PodDNSConfig | None = None
    host_aliases: list[HostAlias] = Field(default_factory=list)
    security_context: PodSecurityContext = Field(default_factory=PodSecurityContext)
    volumes: list[Volume] = Field(default_factory=list)
    service_account_name: str | None = None
    priority: int | None = None
    priority_class_name: str | None = None
    enable_service_links: bool = True
    scheduler_name: str = "default-scheduler"
    runtime_class_name: str | None = None
    readiness_gates: list[PodReadinessGate] = Field(default_factory=list)
    os: PodOS | None = None

    @field_validator("hostname", "subdomain")
    @classmethod
    def _dns_labels(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value:  # "" is the same as unset
            _check_dns_label(value, str(info.field_name))
        return value

    @field_validator("hostname_override")
    @classmethod
    def _dns_subdomain(cls, value: str | None) -> str | None:
        if value is not None:  # the API server refuses "", as Go's kubelet would
            _check_dns_subdomain(value, "hostnameOverride")
        return value

    @model_validator(mode="after")
    def _validate(self) -> PodSpec:
        if not self.containers:
            raise ValueError("containers: at least one container is required")
        if self.dns_policy == "None":
            if self.dns_config is None:
                raise ValueError('dnsConfig: required value when dnsPolicy is "None"')
            if not self.dns_config.nameservers:
                raise ValueError(
                    "dnsConfig.nameservers: at least one nameserver is required when "
                    'dnsPolicy is "None"'
                )
        seen: dict[str, str] = {}
        for field, group in (
            ("initContainers", self.init_containers),
            ("containers", self.containers),
            ("ephemeralContainers", self.ephemeral_containers),
        ):
            for index, container in enumerate(group):
                where = f"{field}[{index}]"
                if container.name in seen:
                    raise ValueError(
                        f"{where}.name: duplicate container name {container.name!r} "
                        f"(already used by {seen[container.name]})"
                    )
                seen[container.name] = where
                if not container.image:
                    raise ValueError(f"{where}.image: required value")
                if container.restart_policy is not None and field != "initContainers":
                    raise ValueError(f"{where}.restartPolicy: may only be set on init containers")
                if field == "initContainers" and container.restart_policy not in (None, "Always"):
                    raise ValueError(f"{where}.restartPolicy: only 'Always' is supported")
        volume_names = {v.name for v in self.volumes}
        if len(volume_names) != len(self.volumes):
            raise ValueError("volumes: duplicate volume name")
        for field, group in (
            ("initContainers", self.init_containers),
            ("containers", self.containers),
        ):
            for index, container in enumerate(group):
                for mount in container.volume_mounts:
                    if mount.name not in volume_names:
                        raise ValueError(
                            f"{field}[{index}].volumeMounts.name: volume {mount.name!r} not found"
                        )
        return self


class ContainerStateWaiting(KubeModel):
    reason: str | None = None
    message: str | None = None


class ContainerStateRunning(KubeModel):
    started_at: str | None = None


class ContainerStateTerminated(KubeModel):
    exit_code: int
    signal: int | None = None
    reason: str | None = None
    message: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    container_id: str | None = Field(default=None, alias="containerID")


class ContainerState(KubeModel):
    waiting: ContainerStateWaiting | None = None
    running: ContainerStateRunning | None = None
    terminated: ContainerStateTerminated | None = None


class ContainerStatus(KubeModel):
    name: str
    state: ContainerState = Field(default_factory=ContainerState)
    last_state: ContainerState = Field(default_factory=ContainerState)
    ready: bool = False
    started: bool | None = None
    restart_count: int = 0
    image: str = ""
    image_id: str = Field(default="", alias="imageID")
    container_id: str | None = Field(default=None, alias="containerID")


class PodCondition(KubeModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None
    last_probe_time: str | None = None


class PodIP(KubeModel):
    ip: str


class PodStatus(KubeModel):
    phase: Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"] = "Pending"
    conditions: list[PodCondition] = Field(default_factory=list)
    message: str | None = None
    reason: str | None = None
    host_ip: str | None = Field(default=None, alias="hostIP")
    pod_ip: str | None = Field(default=None, alias="podIP")
    pod_ips: list[PodIP] = Field(default_factory=list, alias="podIPs")
    start_time: str | None = None
    qos_class: str | None = None
    init_container_statuses: list[ContainerStatus] = Field(default_factory=list)
    container_statuses: list[ContainerStatus] = Field(default_factory=list)
    ephemeral_container_statuses: list[ContainerStatus] = Field(default_factory=list)


class Pod(KubeModel):
    api_version: Literal["v1"] = "v1"
    kind: Literal["Pod"] = "Pod"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: PodSpec
    status: PodStatus = Field(default_factory=PodStatus)

    @field_validator("metadata")
    @classmethod
    def _meta_names(cls, meta: ObjectMeta) -> ObjectMeta:
        if meta.name and (len(meta.name) > 253 or not _DNS1123_SUBDOMAIN.match(meta.name)):
            raise ValueError(f"name {meta.name!r} must be a lowercase RFC 1123 subdomain")
        if meta.namespace:
            _check_dns_label(meta.namespace, "namespace")
        return meta

    @property
    def full_name(self) -> str:
        """``name_namespace``, the Go kubelet's key for a pod in logs and backoff."""
        return f"{self.metadata.name}_{self.metadata.namespace}"


def is_sidecar(container: Container) -> bool:
    """An init container with ``restartPolicy: Always`` runs beside the main containers."""
    return container.restart_policy == "Always"

"""The node agent's settings: KubeletConfiguration (v1beta1) with the Go defaults, plus node flags.

The configuration file is the Go kubelet's ``kubelet.config.k8s.io/v1beta1``
``KubeletConfiguration``, read with the same defaults (``defaults.go``) and the same
leniency: an unknown field is reported and ignored, as the Go kubelet does when it
falls back from strict to lenient decoding. Flags that the Go kubelet also keeps in
the file override it; the few settings that only exist as flags (root dir, node
name, node IP, kubeconfig, recording) join it in one frozen :class:`AgentOptions`.

Every error is a :class:`ConfigError` whose message is one line naming the field by
its wire (camelCase) path, or the flag that set it.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic.alias_generators import to_camel

from trio_kubelet.core.container_gc import GCPolicy
from trio_kubelet.core.eviction import SIGNALS
from trio_kubelet.model.duration import DurationError, format_duration, parse_duration

log = logging.getLogger(__name__)

API_VERSION = "kubelet.config.k8s.io/v1beta1"
KIND = "KubeletConfiguration"


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


DEFAULT_ROOT_DIR = Path("/var/lib/kubelet")
DEFAULT_EVICTION_HARD: dict[str, str] = {
    "memory.available": "100Mi",
    "nodefs.available": "10%",
    "nodefs.inodesFree": "5%",
    "imagefs.available": "15%",
}
EVICTION_SIGNALS = frozenset(SIGNALS)
_NODE_ALLOCATABLE_KEYS = frozenset(
    {
        "pods",
        "system-reserved",
        "system-reserved-compressible",
        "kube-reserved",
        "kube-reserved-compressible",
        "none",
    }
)

# KubeletConfiguration fields of the Go kubelet that this agent does not implement:
# accepted without complaint (an operator's existing file must load) and listed once.
GO_ONLY_FIELDS = _words(
    """enableServer volumePluginDir imagePullCredentialsVerificationPolicy
    preloadedImagesVerificationAllowlist eventRecordQPS eventBurst enableDebuggingHandlers
    enableContentionProfiling oomScoreAdj
    kubeletCgroups systemCgroups cpuManagerPolicy
    cpuManagerPolicyOptions singleProcessOOMKill cpuManagerReconcilePeriod
    memoryManagerPolicy topologyManagerPolicy topologyManagerScope
    topologyManagerPolicyOptions qosReserved hairpinMode podCIDR
    runOnce cpuCFSQuota cpuCFSQuotaPeriod maxOpenFiles contentType
    podsPerCore enableControllerAttachDetach makeIPTablesUtilChains
    iptablesMasqueradeBit iptablesDropBit failSwapOn memorySwap containerLogMaxWorkers
    containerLogMonitorInterval configMapAndSecretChangeDetectionStrategy reservedSystemCPUs
    showHiddenMetricsForVersion systemReservedCgroup kubeReservedCgroup
    kernelMemcgNotification logging.flushFrequency logging.options
    enableSystemLogHandler enableSystemLogQuery
    reservedMemory enableProfilingHandler enableDebugFlagsHandler seccompDefault
    memoryThrottlingFactor tracing
    failCgroupV1 userNamespaces podHousekeepingPeriod"""
)

CLOUD_PROVIDER_EXTERNAL = "external"

_WIRE = "wire"  # validation-context key: the data comes from a file, not from Python code


class ConfigError(Exception):
    """Invalid configuration; ``str()`` is one line naming the field or flag."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split("\n")))


# --- field types ---------------------------------------------------------------------------


def _signed_duration(value: Any, info: ValidationInfo) -> float:
    wire = bool(info.context and info.context.get(_WIRE))
    if isinstance(value, str):
        try:
            seconds = parse_duration(value)
        except DurationError as exc:
            raise ValueError(str(exc)) from None
    elif isinstance(value, int | float) and not isinstance(value, bool) and not wire:
        seconds = float(value)
    else:
        shown = json.dumps(value) if isinstance(value, int | float | bool) else type(value).__name__
        raise ValueError(f'invalid duration {shown}: expected a string such as "20s" or "1m30s"')
    return seconds


def _duration(value: Any, info: ValidationInfo) -> float:
    seconds = _signed_duration(value, info)
    if seconds < 0:
        raise ValueError(f"must not be negative (got {format_duration(seconds)})")
    return seconds


Duration = Annotated[
    float,
    BeforeValidator(_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
"""Seconds in Python, a Go duration string on the wire."""

SignedDuration = Annotated[
    float,
    BeforeValidator(_signed_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
"""A `Duration` that may be negative (where Go gives a negative one a meaning)."""


def _range(low: int, high: int) -> BeforeValidator:
    def check(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}, inclusive (got {value})")
        return value

    return BeforeValidator(check)


def _non_negative(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise ValueError(f"must not be a negative number (got {value})")
    return value


def _positive(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
        raise ValueError(f"must be greater than 0 (got {value})")
    return value


def _ip_address(value: Any) -> Any:
    if isinstance(value, str):
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{json.dumps(value)} is not a valid IP address") from None
    return value


_QUANTITY = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[kMGTPEmun])?$")


def _quantity(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and not _QUANTITY.match(value):
        raise ValueError(f'{json.dumps(value)} is not a quantity (e.g. "10Mi", "100M", "1Gi")')
    return value


def _threshold_map(value: Any) -> Any:
    """An eviction threshold map: known signal names, each a quantity or a percentage."""
    if not isinstance(value, dict):
        return value
    for signal, threshold in value.items():
        if signal not in EVICTION_SIGNALS:
            raise ValueError(
                f"[{signal}]: unknown eviction signal (expected one of "
                f"{', '.join(sorted(EVICTION_SIGNALS))})"
            )
        if isinstance(threshold, str) and threshold.endswith("%"):
            try:
                percent = float(threshold[:-1])
            except ValueError:
                percent = -1.0
            if not 0 <= percent <= 100:
                raise ValueError(f"[{signal}]: invalid percentage {json.dumps(threshold)}")
        elif isinstance(threshold, str):
            try:
                _quantity(threshold)
            except ValueError as exc:
                raise ValueError(f"[{signal}]: {exc}") from None
    return value


Port = Annotated[int, _range(1, 65535)]
OptionalPort = Annotated[int, _range(0, 65535)]
Percent = Annotated[int, _range(0, 100)]
NonNegative = Annotated[int, BeforeValidator(_non_negative)]
IPAddress = Annotated[str, BeforeValidator(_ip_address)]
# tlsMinVersion's values, as Go's crypto/tls names them.
TLS_VERSIONS = ("VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13")
# tlsCipherSuites' values (Go's crypto/tls names; the IANA ones) and OpenSSL's name of each.
# TLS 1.3 suites have none: as in Go, TLS 1.3 always offers its own three.
TLS_CIPHER_SUITES: Mapping[str, str | None] = {
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": "ECDHE-ECDSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": "ECDHE-RSA-DES-CBC3-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": "ECDHE-RSA-RC4-SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA": "DES-CBC3-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_RC4_128_SHA": "RC4-SHA",
}


def _tls_version(value: Any) -> Any:
    if isinstance(value, str) and value and value not in TLS_VERSIONS:
        raise ValueError(
            f"{json.dumps(value)} is not a TLS version (expected one of {', '.join(TLS_VERSIONS)})"
        )
    return value


def _cipher_suites(value: Any) -> Any:
    if isinstance(value, list):
        for index, name in enumerate(value):
            if name not in TLS_CIPHER_SUITES:
                raise ValueError(f"[{index}]: unknown cipher suite {json.dumps(name)}")
    return value


Quantity = Annotated[str, BeforeValidator(_quantity)]
ThresholdMap = Annotated[dict[str, str], BeforeValidator(_threshold_map)]


class _ConfigModel(BaseModel):
    """camelCase on the wire; null and Go zero values mean "use the default", as in Go."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    # Aliases of non-pointer Go fields whose zero value the Go defaulter replaces.
    go_zero_defaults: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _go_zero_values(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or not (info.context and info.context.get(_WIRE)):
            return data
        kept = {}
        for key, value in data.items():
            if value is None or (key in cls.go_zero_defaults and _is_go_zero(value)):
                continue
            kept[key] = value
        return kept


def _is_go_zero(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if value == 0 or value == "":
        return True
    if isinstance(value, str):
        try:
            return parse_duration(value) == 0
        except DurationError:
            return False
    return False


class AnonymousAuthentication(_ConfigModel):
    enabled: bool = False


class WebhookAuthentication(_ConfigModel):
    go_zero_defaults: ClassVar[frozenset[str]] = frozenset({"cacheTTL"})

    enabled: bool = True
    cache_ttl: Duration = Field(default=120.0, alias="cacheTTL")


class X509Authentication(_ConfigModel):
    client_ca_file: str = Field(default="", alias="clientCAFile")


class KubeletAuthentication(_ConfigModel):
    x509: X509Authentication = Field(default_factory=X509Authentication, alias="x509")
    webhook: WebhookAuthentication = Field(default_factory=WebhookAuthentication)
    anonymous: AnonymousAuthentication = Field(default_factory=AnonymousAuthentication)


class WebhookAuthorization(_ConfigModel):
    go_zero_defaults: ClassVar[frozenset[str]] = frozenset(
        {"cacheAuthorizedTTL", "cacheUnauthorizedTTL"}
    )

    cache_authorized_ttl: Duration = Field(default=300.0, alias="cacheAuthorizedTTL")
    cache_unauthorized_ttl: Duration = Field(default=30.0, alias="cacheUnauthorizedTTL")


class KubeletAuthorization(_ConfigModel):
    go_zero_defaults: ClassVar[frozenset[str]] = frozenset({"mode"})

    mode: Literal["AlwaysAllow", "Webhook"] = "Webhook"
    webhook: WebhookAuthorization = Field(default_factory=WebhookAuthorization)


class LoggingConfiguration(_ConfigModel):
    """Go's ``logging`` block: ``format``, and ``verbosity`` unless ``--v`` is given."""

    go_zero_defaults: ClassVar[frozenset[str]] = frozenset({"format"})

    format: Literal["text", "json"] = "text"
    verbosity: int = Field(default=0, ge=0)


class CrashLoopBackOff(_ConfigModel):
    max_container_restart_period: Duration = 300.0

    @model_validator(mode="after")
    def _within_bounds(self) -> CrashLoopBackOff:
        if not 1.0 <= self.max_container_restart_period <= 300.0:
            shown = format_duration(self.max_container_restart_period)
            raise ValueError(
                f"maxContainerRestartPeriod: must be between 1s and 300s (got {shown})"
            )
        return self


_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def qualified_name_error(key: str) -> str | None:
    """Why ``key`` is not a label/taint key (``[prefix/]name``, Go's IsQualifiedName), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return f"{json.dumps(key)}: the prefix must be a lowercase RFC 1123 subdomain"
    if len(name) > 63 or not _LABEL_NAME.match(name):
        return (
            f"{json.dumps(key)}: the name must be 1-63 alphanumerics, '-', '_' or '.', "
            "starting and ending with an alphanumeric"
        )
    return None


def label_value_error(value: str) -> str | None:
    """Why ``value`` is not a label (or taint) value, or None."""
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        return (
            f"{json.dumps(value)}: a value must be at most 63 alphanumerics, '-', '_' or '.', "
            "starting and ending with an alphanumeric"
        )
    return None


class Taint(_ConfigModel):
    """A taint the node registers with (``registerWithTaints``, a v1.Taint)."""

    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]

    @model_validator(mode="after")
    def _valid_key_and_value(self) -> Taint:
        error = qualified_name_error(self.key) or label_value_error(self.value)
        if error:
            raise ValueError(error)
        return self


class ShutdownGracePeriodByPodPriority(_ConfigModel):
    """One round of a graceful node shutdown: pods of at least ``priority`` get this many
    seconds."""

    priority: int
    shutdown_grace_period_seconds: Annotated[int, BeforeValidator(_non_negative)]


class KubeletConfiguration(_ConfigModel):
    """The subset of ``kubelet.config.k8s.io/v1beta1`` KubeletConfiguration this agent acts on.

    Defaults are the Go kubelet's. Durations are float seconds.
    """

    go_zero_defaults: ClassVar[frozenset[str]] = _words(
        """syncFrequency fileCheckFrequency httpCheckFrequency address port runtimeRequestTimeout
        podLogsDir maxPods nodeStatusUpdateFrequency nodeStatusReportFrequency
        nodeLeaseDurationSeconds imageMinimumGCAge evictionPressureTransitionPeriod
        cgroupDriver kubeAPIBurst containerLogMaxSize containerRuntimeEndpoint
        healthzBindAddress volumeStatsAggPeriod"""
    )

    api_version: Literal["kubelet.config.k8s.io/v1beta1"] = "kubelet.config.k8s.io/v1beta1"
    kind: Literal["KubeletConfiguration"] = "KubeletConfiguration"

    # Pod sources.
    static_pod_path: str = ""
    file_check_frequency: Duration = 20.0
    http_check_frequency: Duration = 20.0
    static_pod_url: str = Field(default="", alias="staticPodURL")
    static_pod_url_header: dict[str, list[str]] = Field(
        default_factory=dict, alias="staticPodURLHeader"
    )
    sync_frequency: Duration = 60.0

    # Container runtime.
    container_runtime_endpoint: str = "unix:///run/containerd/containerd.sock"
    image_service_endpoint: str = ""
    runtime_request_timeout: Duration = 120.0
    # An exec/attach/port-forward session that moves no data for this long is closed (0: never).
    streaming_connection_idle_timeout: Duration = 4 * 3600.0
    pod_logs_dir: str = "/var/log/pods"
    max_pods: NonNegative = 110
    # pids.max of each pod cgroup (cgroupsPerQOS); -1 or 0: no limit.
    pod_pids_limit: int = -1
    # Sysctl names (or prefixes ending in *) pods may set beyond the safe set.
    allowed_unsafe_sysctls: list[str] = Field(default_factory=list)

    # Servers.
    address: IPAddress = "0.0.0.0"
    port: Port = 10250
    read_only_port: OptionalPort = 0
    healthz_port: OptionalPort = 10248
    healthz_bind_address: IPAddress = "127.0.0.1"
    tls_cert_file: str = ""
    tls_private_key_file: str = ""
    # The serving TLS floor and TLS 1.2 suites; empty: TLS 1.2, forward-secret AEAD suites.
    tls_min_version: Annotated[str, BeforeValidator(_tls_version)] = Field(
        default="", alias="tlsMinVersion")
    tls_cipher_suites: Annotated[list[str], BeforeValidator(_cipher_suites)] = Field(
        default_factory=list, alias="tlsCipherSuites")
    # The node's spec.providerID at registration (the cloud's name for the machine).
    provider_id: str = Field(default="", alias="providerID")
    # Refuse to start while a kernel setting differs from what the Go kubelet expects
    # (node/kernel_tunables.py); never changes them.
    protect_kernel_defaults: bool = False
    # Renew the client certificate from the cluster before it expires (CSRs).
    rotate_certificates: bool = False
    # Serve 10250 with a certificate the cluster issues (kubernetes.io/kubelet-serving CSRs),
    # renewed like the client one, instead of a self-signed or given one.
    server_tls_bootstrap: bool = Field(default=False, alias="serverTLSBootstrap")
    authentication: KubeletAuthentication = Field(default_factory=KubeletAuthentication)
    authorization: KubeletAuthorization = Field(default_factory=KubeletAuthorization)
    logging: LoggingConfiguration = Field(default_factory=LoggingConfiguration)

    # How often pod volumes' disk use is measured (du-like walks); negative: never.
    volume_stats_agg_period: SignedDuration = 60.0

    # Cluster and node status.
    cluster_domain: str = ""
    cluster_dns: list[IPAddress] = Field(default_factory=list, alias="clusterDNS")
    # The node's resolver configuration, the base of pods' DNS; "" for none (a *string in
    # Go: an explicit "" is kept, not defaulted).
    resolv_conf: str = "/etc/resolv.conf"
    node_status_update_frequency: Duration = 10.0
    # Images listed in the Node's status.images, largest first; -1: all of them.
    node_status_max_images: Annotated[int, _range(-1, 2**31 - 1)] = 50
    node_status_report_frequency: Duration = 300.0
    node_lease_duration_seconds: Annotated[int, BeforeValidator(_positive)] = 40
    register_node: bool = True
    register_with_taints: list[Taint] = Field(default_factory=list)
    kube_api_qps: NonNegative = Field(default=50, alias="kubeAPIQPS")
    kube_api_burst: NonNegative = Field(default=100, alias="kubeAPIBurst")

    # Images.
    image_gc_high_threshold_percent: Percent = Field(
        default=85, alias="imageGCHighThresholdPercent"
    )
    image_gc_low_threshold_percent: Percent = Field(default=80, alias="imageGCLowThresholdPercent")
    image_minimum_gc_age: Duration = Field(default=120.0, alias="imageMinimumGCAge")
    image_maximum_gc_age: Duration = Field(default=0.0, alias="imageMaximumGCAge")
    serialize_image_pulls: bool = True
    max_parallel_image_pulls: int | None = None
    # Image pulls a second, and how many may come at once; 0 QPS is no limit.
    registry_pull_qps: NonNegative = Field(default=5, alias="registryPullQPS")
    registry_burst: NonNegative = Field(default=10, alias="registryBurst")

    # Eviction.
    eviction_hard: ThresholdMap = Field(default_factory=lambda: dict(DEFAULT_EVICTION_HARD))
    eviction_soft: ThresholdMap = Field(default_factory=dict)
    eviction_soft_grace_period: dict[str, Duration] = Field(default_factory=dict)
    eviction_pressure_transition_period: Duration = 300.0
    eviction_max_pod_grace_period: int = 0
    eviction_minimum_reclaim: dict[str, str] = Field(default_factory=dict)
    merge_default_eviction_settings: bool = False
    # Evict pods past their own local storage limits (emptyDir sizeLimit, ephemeral-storage).
    local_storage_capacity_isolation: bool = True

    # Graceful node shutdown (on SIGTERM here; see node/shutdown.py): the whole budget and the
    # part of it kept for critical pods, or explicit rounds by pod priority.
    shutdown_grace_period: Duration = 0.0
    shutdown_grace_period_critical_pods: Duration = 0.0
    shutdown_grace_period_by_pod_priority: list[ShutdownGracePeriodByPodPriority] = Field(
        default_factory=list
    )

    # Cgroups and node allocatable.
    cgroups_per_qos: bool = Field(default=True, alias="cgroupsPerQOS")
    cgroup_root: str = "/"
    cgroup_driver: Literal["cgroupfs", "systemd"] = "cgroupfs"
    enforce_node_allocatable: list[str] = Field(default_factory=lambda: ["pods"])
    kube_reserved: dict[str, Quantity] = Field(default_factory=dict)
    system_reserved: dict[str, Quantity] = Field(default_factory=dict)

    # Containers.
    crash_loop_back_off: CrashLoopBackOff = Field(
        default_factory=CrashLoopBackOff, alias="crashLoopBackOff"
    )
    container_log_max_size: Quantity = "10Mi"
    container_log_max_files: int = 5
    feature_gates: dict[str, bool] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _go_coupled_defaults(cls, data: Any, info: ValidationInfo) -> Any:
        """Defaults that depend on other fields, applied only to what a file left out."""
        if not isinstance(data, dict) or not (info.context and info.context.get(_WIRE)):
            return data
        data = dict(data)
        update = data.get("nodeStatusUpdateFrequency")
        report = data.get("nodeStatusReportFrequency")
        report_unset = report is None or _is_go_zero(report)
        if report_unset and update is not None and not _is_go_zero(update):
            # Go keeps reporting as often as it updates when only the update period is set.
            data["nodeStatusReportFrequency"] = update
        parallel = data.get("maxParallelImagePulls")
        if data.get("serializeImagePulls") is None and isinstance(parallel, int) and parallel >= 2:
            data["serializeImagePulls"] = False
        if data.get("mergeDefaultEvictionSettings") and isinstance(data.get("evictionHard"), dict):
            data["evictionHard"] = {**DEFAULT_EVICTION_HARD, **data["evictionHard"]}
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> KubeletConfiguration:
        low, high = self.image_gc_low_threshold_percent, self.image_gc_high_threshold_percent
        if low >= high:
            raise ValueError(
                f"imageGCLowThresholdPercent: {low} must be less than "
                f"imageGCHighThresholdPercent ({high})"
            )
        max_age, min_age = self.image_maximum_gc_age, self.image_minimum_gc_age
        if max_age and max_age <= min_age:
            raise ValueError(
                f"imageMaximumGCAge: {format_duration(max_age)} must be greater than "
                f"imageMinimumGCAge ({format_duration(min_age)})"
            )
        parallel = self.max_parallel_image_pulls
        if parallel is not None and parallel < 1:
            raise ValueError(f"maxParallelImagePulls: must be a positive number (got {parallel})")
        if self.serialize_image_pulls and parallel is not None and parallel > 1:
            raise ValueError(
                "maxParallelImagePulls: cannot be larger than 1 unless serializeImagePulls is false"
            )
        if self.tls_min_version == "VersionTLS13" and self.tls_cipher_suites:
            raise ValueError("tlsCipherSuites: may not be set if tlsMinVersion is VersionTLS13")
        if self.container_log_max_files < 2:
            raise ValueError(
                f"containerLogMaxFiles: must be 2 or greater (got {self.container_log_max_files})"
            )
        for index, key in enumerate(self.enforce_node_allocatable):
            if key not in _NODE_ALLOCATABLE_KEYS:
                raise ValueError(
                    f"enforceNodeAllocatable[{index}]: unknown value {json.dumps(key)} (expected "
                    f"one of {', '.join(sorted(_NODE_ALLOCATABLE_KEYS))})"
                )
        if "none" in self.enforce_node_allocatable and len(self.enforce_node_allocatable) > 1:
            raise ValueError('enforceNodeAllocatable: "none" cannot be combined with other values')
        self._check_shutdown()
        return self

    def _check_shutdown(self) -> None:
        """Go's rules for the graceful shutdown periods."""
        whole, critical = self.shutdown_grace_period, self.shutdown_grace_period_critical_pods
        for name, period in (("shutdownGracePeriod", whole),
                             ("shutdownGracePeriodCriticalPods", critical)):
            if 0 < period < 1:
                raise ValueError(f"{name}: {format_duration(period)} must be either zero or "
                                 "otherwise >= 1 sec")
        if critical > whole:
            raise ValueError(
                f"shutdownGracePeriodCriticalPods: {format_duration(critical)} must be <= "
                f"shutdownGracePeriod ({format_duration(whole)})"
            )
        if self.shutdown_grace_period_by_pod_priority and (whole > 0 or critical > 0):
            raise ValueError(
                "shutdownGracePeriodByPodPriority: cannot be given together with "
                "shutdownGracePeriod or shutdownGracePeriodCriticalPods"
            )

    def to_wire(self) -> dict[str, Any]:
        """The configuration as a KubeletConfiguration document (camelCase, Go durations)."""
        return self.model_dump(by_alias=True, mode="json")


# --- validation errors, named by wire path ------------------------------------------------

_UNION_TAGS = frozenset({"int", "str", "float", "bool", "list", "dict", "none"})
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A message that starts with a path relative to the error's location ("containers[1].name: ...").
_SEGMENT = r"(?:[A-Za-z][A-Za-z0-9]*|\[[^\]\s]+\])"
_LEADING_PATH = re.compile(rf"^({_SEGMENT}(?:\.?{_SEGMENT})*): (.+)$", re.S)
_SINGLE_QUOTED = re.compile(r"(?<![\w'])'([^'\n]*)'(?![\w'])")


def wire_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a wire path: ``spec.containers[1].name``, ``labels[a/b]``."""
    path = ""
    for item in loc:
        if isinstance(item, int):
            path += f"[{item}]"
        elif item in _UNION_TAGS or "[" in item:
            continue  # the member of a union pydantic tried, not a field
        elif _IDENTIFIER.match(item):
            path += f".{item}" if path else item
        else:
            path += f"[{item}]"
    return path


def _join_path(base: str, relative: str) -> str:
    if not base:
        return relative
    return base + relative if relative.startswith("[") else f"{base}.{relative}"


def _error_message(error: Mapping[str, Any]) -> str:
    if error["type"] == "missing":
        return "required value"
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    if message.startswith("Input should be "):
        message = "must be " + message.removeprefix("Input should be ")
    message = re.sub(r" or instance of \w+", "", message).replace("a valid dictionary", "a mapping")
    message = _SINGLE_QUOTED.sub(r'"\1"', message)
    value = error.get("input")
    if error["type"] != "value_error" and isinstance(value, str | int | float | bool):
        message += f" (got {json.dumps(value)})"
    return message


def field_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """``(wire path, message)`` for each distinct field a pydantic ValidationError names."""
    found: dict[str, str] = {}
    for error in exc.errors():
        path, message = wire_path(error["loc"]), _error_message(error)
        nested = _LEADING_PATH.match(message)
        if nested:
            path, message = _join_path(path, nested.group(1)), nested.group(2)
        found.setdefault(path, message)
    return list(found.items())


def describe_validation_error(exc: ValidationError) -> str:
    """All field errors on one line: ``spec.containers[0].name: required value; ...``."""
    return "; ".join(
        f"{path}: {message}" if path else message for path, message in field_errors(exc)
    )


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """A YAML syntax error with its 1-based line and column, on one line."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        problem = exc.problem or exc.context or "syntax error"
        return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return f"invalid YAML: {' '.join(str(exc).split())}"


# --- loading --------------------------------------------------------------------------------

# Path fields that, when relative, are relative to the config file's directory (as in Go).
_PATH_FIELDS: tuple[tuple[str, ...], ...] = (
    ("staticPodPath",),
    ("tlsCertFile",),
    ("tlsPrivateKeyFile",),
    ("podLogsDir",),
    ("authentication", "x509", "clientCAFile"),
    ("resolvConf",),
)


def _unknown_fields(model: type[BaseModel], data: Mapping[str, Any], prefix: str = "") -> list[str]:
    fields = {info.alias or name: info for name, info in model.model_fields.items()}
    unknown: list[str] = []
    for key, value in data.items():
        info = fields.get(key)
        if info is None:
            unknown.append(prefix + str(key))
            continue
        nested = info.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel) and isinstance(value, dict):
            unknown.extend(_unknown_fields(nested, value, f"{prefix}{key}."))
    return unknown


def _resolve_relative_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    for path in _PATH_FIELDS:
        parent: Any = data
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        value = parent.get(path[-1])
        if isinstance(value, str) and value and not Path(value).is_absolute():
            parent[path[-1]] = str(base / value)
    return data


def load_config_file(path: Path) -> KubeletConfiguration:
    """Read a KubeletConfiguration file; unknown fields are logged and ignored."""
    return _validated(_read_document(path, "config file"), path, "config file")


def _read_document(path: Path, what: str) -> dict[str, Any]:
    """One KubeletConfiguration file as its wire mapping: kind and apiVersion checked,
    unknown fields reported, relative paths made absolute against the file's directory."""

    def invalid(message: str) -> ConfigError:
        return ConfigError(f"invalid {what} {path}: {message}")

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise invalid(f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise invalid("not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise invalid(describe_yaml_error(exc)) from None
    if not isinstance(data, dict):
        raise invalid(f"expected a {KIND} mapping, got {_kind_of(data)}")
    kind, api_version = data.get("kind"), data.get("apiVersion")
    if kind != KIND:
        raise invalid(
            f"kind: required value (expected {KIND})"
            if kind is None
            else f"kind: unsupported {json.dumps(kind)} (expected {KIND})"
        )
    if api_version != API_VERSION:
        raise invalid(
            f"apiVersion: required value (expected {API_VERSION})"
            if api_version is None
            else f"apiVersion: unsupported {json.dumps(api_version)} (expected {API_VERSION})"
        )
    _report_unknown_fields(path, what, _unknown_fields(KubeletConfiguration, data))
    return _resolve_relative_paths(data, path.absolute().parent)


def _validated(data: Mapping[str, Any], path: Path, what: str) -> KubeletConfiguration:
    try:
        return KubeletConfiguration.model_validate(data, context={_WIRE: True})
    except ValidationError as exc:
        raise ConfigError(f"invalid {what} {path}: {describe_validation_error(exc)}") from None


DROP_IN_SUFFIX = ".conf"


def drop_in_files(directory: Path) -> list[Path]:
    """The ``--config-dir`` files in the Go kubelet's order: a depth-first walk with each
    directory's entries sorted by name, keeping the non-directories named ``*.conf``."""
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError as exc:
        raise ConfigError(
            f"--config-dir: cannot read {directory}: {exc.strerror or exc}"
        ) from None
    found: list[Path] = []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            found.extend(drop_in_files(Path(entry.path)))
        elif entry.name.endswith(DROP_IN_SUFFIX):
            found.append(Path(entry.path))
    return found


def merge_patch(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``patch`` over ``base`` as a JSON merge patch does it (maps merge key by key, lists and
    scalars replace), except that a null leaves the base's value: the Go kubelet decodes the
    merged document over the configuration it already holds, so a removed key changes nothing."""
    merged = dict(base)
    for key, value in patch.items():
        if value is None:
            continue
        old = merged.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            merged[key] = merge_patch(old, value)
        else:
            merged[key] = value
    return merged


def _with_drop_ins(
    data: dict[str, Any], config: KubeletConfiguration, directory: Path
) -> KubeletConfiguration:
    """Each drop-in merged over the configuration so far, in order; a file whose merge makes
    the configuration invalid is the one named."""
    for path in drop_in_files(directory):
        data = merge_patch(data, _read_document(path, "drop-in config file"))
        config = _validated(data, path, "drop-in config file")
    return config


def _kind_of(value: Any) -> str:
    if value is None:
        return "an empty document"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__} value"


def _report_unknown_fields(path: Path, what: str, fields: list[str]) -> None:
    unsupported = [name for name in fields if name in GO_ONLY_FIELDS]
    unknown = [name for name in fields if name not in GO_ONLY_FIELDS]
    if unknown:
        log.warning("%s %s: unknown field(s) ignored: %s", what, path, ", ".join(unknown))
    if unsupported:
        log.info(
            "%s %s: Go kubelet field(s) not implemented by trio-kubelet, ignored: %s",
            what,
            path,
            ", ".join(unsupported),
        )


def _within(path: str, field: str) -> bool:
    return path == field or path.startswith((f"{field}.", f"{field}["))


def apply_flag_overrides(
    config: KubeletConfiguration, overrides: Mapping[str, tuple[str, Any]]
) -> KubeletConfiguration:
    """Override config fields from flags: ``{"staticPodPath": ("--pod-manifest-path", value)}``.

    Keys are dotted wire paths (``authentication.x509.clientCAFile``). An invalid result
    names the flag that set the field.
    """
    data = config.model_dump(by_alias=True)
    for dotted, (_flag, value) in overrides.items():
        *parents, leaf = dotted.split(".")
        target = data
        for key in parents:
            target = target[key]
        target[leaf] = value
    try:
        return KubeletConfiguration.model_validate(data)
    except ValidationError as exc:
        messages = []
        for path, message in field_errors(exc):
            flag = next((f for p, (f, _) in overrides.items() if _within(path, p)), None)
            messages.append(f"{flag}: {message}" if flag else f"{path}: {message}")
        raise ConfigError("; ".join(messages)) from None


def load_config(
    config_file: Path | None = None,
    overrides: Mapping[str, tuple[str, Any]] | None = None,
    config_dir: Path | None = None,
) -> KubeletConfiguration:
    """The configuration as the Go kubelet builds it: the file (or the defaults), then each
    ``--config-dir`` drop-in over it, then the flags over everything."""
    data: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
    config = KubeletConfiguration()
    if config_file is not None:
        data = _read_document(config_file, "config file")
        config = _validated(data, config_file, "config file")
    if config_dir is not None:
        config = _with_drop_ins(data, config, config_dir)
    return apply_flag_overrides(config, overrides) if overrides else config


# --- node options that only exist as flags --------------------------------------------------

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def resolve_node_name(hostname_override: str | None = None) -> str:
    """``--hostname-override`` or the host name, trimmed and lowercased as the Go kubelet does."""
    if hostname_override is not None and hostname_override.strip():
        name, source = hostname_override.strip().lower(), "--hostname-override"
    else:
        name, source = socket.gethostname().strip().lower(), "host name"
    if not name:
        raise ConfigError("--hostname-override: the host name is empty; set a node name")
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        hint = "" if source == "--hostname-override" else "; set --hostname-override"
        raise ConfigError(
            f"{source}: {json.dumps(name)} is not a valid node name "
            f"(must be a lowercase RFC 1123 subdomain){hint}"
        )
    return name


def parse_node_ips(value: str) -> str:
    """``--node-ip``: one IP, or an IPv4 and an IPv6 address separated by a comma."""
    addresses = [part.strip() for part in value.split(",")]
    parsed = []
    for address in addresses:
        try:
            parsed.append(ipaddress.ip_address(address))
        except ValueError:
            raise ConfigError(
                f"--node-ip: {json.dumps(address)} is not a valid IP address"
            ) from None
    if len(parsed) > 2 or (len(parsed) == 2 and parsed[0].version == parsed[1].version):
        raise ConfigError(f"--node-ip: {json.dumps(value)} must be one IP or one IPv4 and one IPv6")
    return ",".join(addresses)


# Labels in the kubernetes.io / k8s.io namespaces a kubelet may set on its own Node (the Go
# kubelet's kubeletapis.IsKubeletLabel; the NodeRestriction admission plugin rejects others).
KUBELET_LABELS = frozenset(
    {
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
    }
)
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")


def _in_namespace(key: str, *namespaces: str) -> bool:
    prefix = key.rpartition("/")[0]
    return any(prefix == ns or prefix.endswith("." + ns) for ns in namespaces)


def parse_node_labels(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``--node-labels k=v,k2=v2`` (repeatable; a later value wins), checked as the Go kubelet does.

    Labels in the kubernetes.io / k8s.io namespaces must be ones a kubelet may set on its own
    Node; the API server would refuse the others at registration.
    """
    labels: dict[str, str] = {}
    for value in values:
        for pair in (part.strip() for part in value.split(",")):
            if not pair:
                continue
            key, sep, label = pair.partition("=")
            if not sep:
                raise ConfigError(f"--node-labels: {json.dumps(pair)} must be key=value")
            error = qualified_name_error(key.strip()) or label_value_error(label.strip())
            if error:
                raise ConfigError(f"--node-labels: {error}")
            labels[key.strip()] = label.strip()
    unknown = sorted(
        key
        for key in labels
        if _in_namespace(key, "kubernetes.io", "k8s.io")
        and key not in KUBELET_LABELS
        and not _in_namespace(key, *KUBELET_LABEL_NAMESPACES)
    )
    if unknown:
        raise ConfigError(
            f"--node-labels: unknown 'kubernetes.io' or 'k8s.io' labels {', '.join(unknown)}: "
            f"they must begin with an allowed prefix ({', '.join(KUBELET_LABEL_NAMESPACES)}) "
            f"or be one of {', '.join(sorted(KUBELET_LABELS))}"
        )
    return tuple(labels.items())


def _checked_lock_contention(lock_file: Path | None, exit_on_contention: bool) -> bool:
    if exit_on_contention and lock_file is None:
        raise ConfigError("--exit-on-lock-contention: no lock file specified (--lock-file)")
    return exit_on_contention


def _checked_cloud_provider(name: str) -> str:
    """As Go's kubelet since the in-tree providers went: none, or "external"."""
    if name not in ("", CLOUD_PROVIDER_EXTERNAL):
        raise ConfigError(f'--cloud-provider: unsupported {json.dumps(name)} (only "external", '
                          "with a cloud controller manager, or none)")
    return name


def _checked_kubeconfig(
    kubeconfig: Path | None, bootstrap: Path | None, config: KubeletConfiguration
) -> Path | None:
    if bootstrap is not None and kubeconfig is None:
        raise ConfigError(
            "--bootstrap-kubeconfig: needs --kubeconfig (where the kubeconfig for the "
            "certificate it obtains is written)"
        )
    if config.server_tls_bootstrap and kubeconfig is None:
        raise ConfigError(
            "serverTLSBootstrap: needs --kubeconfig (the cluster issues the serving certificate)"
        )
    return kubeconfig


@dataclass(frozen=True)
class AgentOptions:
    """Everything the agent is started with: the configuration and the node's flag-only options."""

    config: KubeletConfiguration
    node_name: str
    root_dir: Path = DEFAULT_ROOT_DIR
    node_ip: str | None = None
    # --cloud-provider: "" or "external" (a cloud controller manager initialises the node).
    cloud_provider: str = ""
    # --lock-file (held while the agent runs) and --exit-on-lock-contention.
    lock_file: Path | None = None
    exit_on_lock_contention: bool = False
    # --node-labels, in the order given (a tuple keeps the options hashable).
    node_labels: tuple[tuple[str, str], ...] = ()
    kubeconfig: Path | None = None
    # The kubeconfig to ask the cluster for a client certificate with when --kubeconfig is
    # missing or its certificate is unusable (TLS bootstrap).
    bootstrap_kubeconfig: Path | None = None
    # Where certificates go (Go's --cert-dir): the self-signed serving pair, and the ones the
    # cluster issues; None: <root-dir>/pki.
    cert_dir: Path | None = None
    record: Path | None = None
    record_max_bytes: int | None = None
    config_file: Path | None = None
    log_level: int = logging.INFO
    verbosity: int = 0
    # trio-kubelet's own: print a live pod table (like `kubectl get pods -w`) on stdout.
    show_pods: bool = False
    # Container GC: Go's deprecated --minimum-container-ttl-duration,
    # --maximum-dead-containers-per-container, --maximum-dead-containers (flags only).
    container_gc: GCPolicy = field(default_factory=GCPolicy)

    @property
    def certificate_dir(self) -> Path:
        """--cert-dir, or <root-dir>/pki."""
        return self.cert_dir if self.cert_dir is not None else self.root_dir / "pki"


def build_agent_options(
    *,
    config_file: Path | None = None,
    config_dir: Path | None = None,
    overrides: Mapping[str, tuple[str, Any]] | None = None,
    root_dir: Path = DEFAULT_ROOT_DIR,
    hostname_override: str | None = None,
    node_ip: str | None = None,
    cloud_provider: str = "",
    lock_file: Path | None = None,
    exit_on_lock_contention: bool = False,
    node_labels: Sequence[str] = (),
    kubeconfig: Path | None = None,
    bootstrap_kubeconfig: Path | None = None,
    cert_dir: Path | None = None,
    record: Path | None = None,
    record_max_bytes: int | None = None,
    verbosity: int | None = None,
    show_pods: bool = False,
    container_gc: GCPolicy | None = None,
) -> AgentOptions:
    """Load and check everything; raises :class:`ConfigError` naming the field or flag.

    ``verbosity`` is ``--v``'s; without it, the file's ``logging.verbosity`` holds."""
    config = load_config(config_file, overrides, config_dir)
    if verbosity is None:
        verbosity = config.logging.verbosity
    return AgentOptions(
        config=config,
        node_name=resolve_node_name(hostname_override),
        root_dir=root_dir.absolute(),
        node_ip=parse_node_ips(node_ip) if node_ip else None,
        cloud_provider=_checked_cloud_provider(cloud_provider),
        lock_file=lock_file,
        exit_on_lock_contention=_checked_lock_contention(lock_file, exit_on_lock_contention),
        node_labels=parse_node_labels(node_labels),
        kubeconfig=_checked_kubeconfig(kubeconfig, bootstrap_kubeconfig, config),
        bootstrap_kubeconfig=bootstrap_kubeconfig,
        cert_dir=cert_dir.absolute() if cert_dir is not None else None,
        record=record,
        record_max_bytes=record_max_bytes,
        config_file=config_file,
        log_level=logging.DEBUG if verbosity >= 4 else logging.INFO,
        verbosity=verbosity,
        show_pods=show_pods,
        container_gc=container_gc if container_gc is not None else GCPolicy(),
    )

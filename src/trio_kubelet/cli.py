"""The ``trio-kubelet`` command line: ``run`` (the node agent, Go kubelet flags), ``replay`` and
``hollow`` (many simulated nodes in one process).

``trio-kubelet --config k.yaml --pod-manifest-path /etc/kubernetes/manifests`` works
as the Go kubelet's command line does: with no subcommand the agent runs. Flags
that also exist in the KubeletConfiguration override the file. Any flag or config
error is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from trio_kubelet import __version__
from trio_kubelet.config import (
    DEFAULT_ROOT_DIR,
    AgentOptions,
    ConfigError,
    build_agent_options,
)
from trio_kubelet.core.container_gc import GCPolicy
from trio_kubelet.model.duration import DurationError, parse_duration

PROG = "trio-kubelet"
EXIT_USAGE = 2
EXIT_START_FAILED = 1  # the node could not start (a port in use), as the Go kubelet exits


class UsageError(Exception):
    """A bad command line; the message is printed as ``trio-kubelet: error: <message>``."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse says "argument --max-pods: ..."; the flag alone reads better.
        raise UsageError(message.removeprefix("argument "))


# --- flag value parsers (each error message is what follows "--flag: ") ----------------------


def _signed_duration(text: str) -> float:
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> float:
    seconds = _signed_duration(text)
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"must not be negative (got {json.dumps(text)})")
    return seconds


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {json.dumps(text)}") from None


def _bool(text: str) -> bool:
    """Go's strconv.ParseBool."""
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {json.dumps(text)} (use true or false)")


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _feature_gates(text: str) -> dict[str, bool]:
    gates = {}
    for pair in _list(text):
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(f"expected Name=true|false, got {json.dumps(pair)}")
        gates[name.strip()] = _bool(value.strip())
    return gates


def _url_headers(text: str) -> dict[str, list[str]]:
    headers: dict[str, list[str]] = {}
    for pair in _list(text):
        name, sep, value = pair.partition(":")
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(f"expected key:value, got {json.dumps(pair)}")
        headers.setdefault(name.strip(), []).append(value.strip())
    return headers


def _taints(text: str) -> list[dict[str, str]]:
    """``key=value:Effect,key:Effect`` as v1.Taint mappings; the configuration checks them."""
    taints = []
    for spec in _list(text):
        key_value, sep, effect = spec.partition(":")
        key, _, value = key_value.partition("=")
        if not sep or ":" in effect or "=" in value or not key:
            raise argparse.ArgumentTypeError(
                f"invalid taint spec {json.dumps(spec)} (expected key=value:Effect or key:Effect)"
            )
        taints.append({"key": key, "value": value, "effect": effect})
    return taints


def _pairs(text: str, separator: str) -> dict[str, str]:
    """``key<sep>value,...`` as a map, as Go's map-of-strings flags read it (a later key wins)."""
    found = {}
    for pair in _list(text):
        key, sep, value = pair.partition(separator)
        if not sep or not key.strip() or not value.strip():
            raise argparse.ArgumentTypeError(
                f"expected key{separator}value, got {json.dumps(pair)}"
            )
        found[key.strip()] = value.strip()
    return found


def _thresholds(text: str) -> dict[str, str]:
    """``memory.available<100Mi,nodefs.available<10%`` (--eviction-hard, --eviction-soft)."""
    return _pairs(text, "<")


def _key_values(text: str) -> dict[str, str]:
    """``memory.available=1m30s,...`` or ``cpu=100m,memory=100Mi``."""
    return _pairs(text, "=")


_SIZE = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_SIZE_FACTORS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SIZE_FACTORS.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40})


def _byte_size(text: str) -> int:
    match = _SIZE.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(
            f'invalid size {json.dumps(text)} (a positive number of bytes, e.g. "50Mi")'
        )
    return int(match.group(1)) * _SIZE_FACTORS[match.group(2)]


def _verbosity(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative (got {value})")
    return value


# --- flags that override the KubeletConfiguration ----------------------------------------


@dataclass(frozen=True)
class ConfigFlag:
    """A flag that sets one KubeletConfiguration field (dotted wire path)."""

    flag: str
    field: str
    parse: Callable[[str], Any]
    help: str
    metavar: str = ""

    @property
    def dest(self) -> str:
        return "config_" + self.flag.removeprefix("--").replace("-", "_")

    @property
    def is_bool(self) -> bool:
        return self.parse is _bool

    @property
    def accumulates(self) -> bool:
        return self.parse is _url_headers


CONFIG_FLAGS: tuple[ConfigFlag, ...] = (
    ConfigFlag(
        "--pod-manifest-path", "staticPodPath", str, "static pod manifest file or directory", "PATH"
    ),
    ConfigFlag(
        "--file-check-frequency",
        "fileCheckFrequency",
        _duration,
        "full rescan period of the manifest path",
        "DURATION",
    ),
    ConfigFlag("--manifest-url", "staticPodURL", str, "URL of static pod manifests", "URL"),
    ConfigFlag(
        "--manifest-url-header",
        "staticPodURLHeader",
        _url_headers,
        "HTTP headers for --manifest-url, 'key:value,...' (repeatable)",
        "HEADERS",
    ),
    ConfigFlag(
        "--http-check-frequency",
        "httpCheckFrequency",
        _duration,
        "polling period of --manifest-url",
        "DURATION",
    ),
    ConfigFlag(
        "--sync-frequency",
        "syncFrequency",
        _duration,
        "period of the full resync of every pod",
        "DURATION",
    ),
    ConfigFlag(
        "--container-runtime-endpoint",
        "containerRuntimeEndpoint",
        str,
        "CRI runtime socket",
        "ENDPOINT",
    ),
    ConfigFlag(
        "--image-service-endpoint",
        "imageServiceEndpoint",
        str,
        "CRI image service socket (default: the runtime's)",
        "ENDPOINT",
    ),
    ConfigFlag(
        "--streaming-connection-idle-timeout",
        "streamingConnectionIdleTimeout",
        _duration,
        "close exec/attach/port-forward sessions idle this long, 0 never",
        "DURATION",
    ),
    ConfigFlag(
        "--runtime-request-timeout",
        "runtimeRequestTimeout",
        _duration,
        "timeout of CRI requests except long-running ones",
        "DURATION",
    ),
    ConfigFlag("--max-pods", "maxPods", _int, "most pods this node runs", "N"),
    ConfigFlag(
        "--pod-max-pids", "podPidsLimit", _int, "most processes in one pod, -1 for no limit", "N"
    ),
    ConfigFlag(
        "--allowed-unsafe-sysctls",
        "allowedUnsafeSysctls",
        _list,
        "unsafe sysctls (or prefixes ending in *) pods may set, comma-separated",
        "NAMES",
    ),
    ConfigFlag("--address", "address", str, "IP address the kubelet API listens on", "IP"),
    ConfigFlag("--port", "port", _int, "port of the kubelet API (HTTPS)", "PORT"),
    ConfigFlag(
        "--read-only-port", "readOnlyPort", _int, "read-only HTTP port, 0 disables it", "PORT"
    ),
    ConfigFlag("--healthz-port", "healthzPort", _int, "healthz port, 0 disables it", "PORT"),
    ConfigFlag(
        "--healthz-bind-address",
        "healthzBindAddress",
        str,
        "IP address the healthz server listens on",
        "IP",
    ),
    ConfigFlag(
        "--tls-cert-file", "tlsCertFile", str, "serving certificate of the kubelet API", "FILE"
    ),
    ConfigFlag(
        "--tls-private-key-file", "tlsPrivateKeyFile", str, "key of --tls-cert-file", "FILE"
    ),
    ConfigFlag("--provider-id", "providerID", str, "the node's spec.providerID", "ID"),
    ConfigFlag(
        "--protect-kernel-defaults",
        "protectKernelDefaults",
        _bool,
        "refuse to start while a kernel setting differs from the kubelet's expected ones",
    ),
    ConfigFlag(
        "--tls-min-version",
        "tlsMinVersion",
        str,
        "lowest TLS version served: VersionTLS10 … VersionTLS13 (default VersionTLS12)",
        "VERSION",
    ),
    ConfigFlag(
        "--tls-cipher-suites",
        "tlsCipherSuites",
        _list,
        "TLS 1.2 cipher suites served, Go's names, comma-separated (default: ECDHE with AES-GCM "
        "or ChaCha20)",
        "SUITES",
    ),
    ConfigFlag(
        "--client-ca-file",
        "authentication.x509.clientCAFile",
        str,
        "CA that signs client certificates",
        "FILE",
    ),
    ConfigFlag(
        "--anonymous-auth",
        "authentication.anonymous.enabled",
        _bool,
        "allow anonymous requests to the kubelet API",
    ),
    ConfigFlag(
        "--authentication-token-webhook",
        "authentication.webhook.enabled",
        _bool,
        "verify bearer tokens with TokenReviews sent to the API server",
    ),
    ConfigFlag(
        "--authentication-token-webhook-cache-ttl",
        "authentication.webhook.cacheTTL",
        _duration,
        "how long TokenReview answers are cached",
        "DURATION",
    ),
    ConfigFlag("--authorization-mode", "authorization.mode", str, "AlwaysAllow or Webhook", "MODE"),
    ConfigFlag(
        "--authorization-webhook-cache-authorized-ttl",
        "authorization.webhook.cacheAuthorizedTTL",
        _duration,
        "how long allowing SubjectAccessReview answers are cached",
        "DURATION",
    ),
    ConfigFlag(
        "--authorization-webhook-cache-unauthorized-ttl",
        "authorization.webhook.cacheUnauthorizedTTL",
        _duration,
        "how long denying SubjectAccessReview answers are cached",
        "DURATION",
    ),
    ConfigFlag("--cluster-domain", "clusterDomain", str, "DNS domain of the cluster", "DOMAIN"),
    ConfigFlag(
        "--cluster-dns", "clusterDNS", _list, "DNS server IPs for pods, comma-separated", "IPS"
    ),
    ConfigFlag(
        "--resolv-conf",
        "resolvConf",
        str,
        'resolver configuration pods\' DNS starts from, "" for none (default /etc/resolv.conf)',
        "FILE",
    ),
    ConfigFlag(
        "--node-status-update-frequency",
        "nodeStatusUpdateFrequency",
        _duration,
        "how often node status is computed",
        "DURATION",
    ),
    ConfigFlag("--register-node", "registerNode", _bool, "register the node with the API server"),
    ConfigFlag(
        "--node-status-max-images",
        "nodeStatusMaxImages",
        _int,
        "images listed in the Node's status, largest first (-1: all; default 50)",
        "N",
    ),
    ConfigFlag(
        "--rotate-certificates",
        "rotateCertificates",
        _bool,
        "renew the client certificate from the cluster before it expires",
    ),
    ConfigFlag(
        "--rotate-server-certificates",
        "serverTLSBootstrap",
        _bool,
        "serve 10250 with a certificate the cluster issues, renewed before it expires",
    ),
    ConfigFlag(
        "--register-with-taints",
        "registerWithTaints",
        _taints,
        "taints the node registers with, 'key=value:Effect,...'",
        "TAINTS",
    ),
    ConfigFlag("--kube-api-qps", "kubeAPIQPS", _int, "API server requests per second", "N"),
    ConfigFlag("--kube-api-burst", "kubeAPIBurst", _int, "API server request burst", "N"),
    ConfigFlag(
        "--image-gc-high-threshold",
        "imageGCHighThresholdPercent",
        _int,
        "disk usage %% that starts image GC",
        "PERCENT",
    ),
    ConfigFlag(
        "--image-gc-low-threshold",
        "imageGCLowThresholdPercent",
        _int,
        "disk usage %% image GC frees down to",
        "PERCENT",
    ),
    ConfigFlag("--serialize-image-pulls", "serializeImagePulls", _bool, "pull one image at a time"),
    ConfigFlag(
        "--registry-qps", "registryPullQPS", _int, "image pulls a second, 0 for no limit", "N"
    ),
    ConfigFlag("--registry-burst", "registryBurst", _int, "image pulls allowed at once", "N"),
    ConfigFlag(
        "--minimum-image-ttl-duration",
        "imageMinimumGCAge",
        _duration,
        "how long an unused image stays before image GC may remove it",
        "DURATION",
    ),
    ConfigFlag("--cgroup-driver", "cgroupDriver", str, "cgroupfs or systemd", "DRIVER"),
    ConfigFlag("--cgroup-root", "cgroupRoot", str, "root cgroup for pods", "CGROUP"),
    ConfigFlag("--cgroups-per-qos", "cgroupsPerQOS", _bool, "create the QoS cgroup hierarchy"),
    ConfigFlag(
        "--logging-format",
        "logging.format",
        str,
        'the agent\'s log lines: "text" (klog\'s) or "json" (one object a line, as Go\'s)',
        "FORMAT",
    ),
    ConfigFlag("--pod-logs-dir", "podLogsDir", str, "directory of container logs", "DIR"),
    ConfigFlag(
        "--container-log-max-size",
        "containerLogMaxSize",
        str,
        "size at which a container's log is rotated",
        "SIZE",
    ),
    ConfigFlag(
        "--container-log-max-files",
        "containerLogMaxFiles",
        _int,
        "log files kept per container, the live one included",
        "N",
    ),
    ConfigFlag(
        "--local-storage-capacity-isolation",
        "localStorageCapacityIsolation",
        _bool,
        "evict pods past their own ephemeral storage limits",
    ),
    ConfigFlag(
        "--volume-stats-agg-period",
        "volumeStatsAggPeriod",
        _signed_duration,
        "how often pod volumes' disk use is measured; negative (as --flag=-1s) never",
        "DURATION",
    ),
    ConfigFlag("--feature-gates", "featureGates", _feature_gates, "Name=true|false,...", "GATES"),
    ConfigFlag(
        "--eviction-hard",
        "evictionHard",
        _thresholds,
        "hard eviction thresholds, e.g. memory.available<100Mi,nodefs.available<10%%",
        "THRESHOLDS",
    ),
    ConfigFlag(
        "--eviction-soft",
        "evictionSoft",
        _thresholds,
        "soft eviction thresholds (each needs --eviction-soft-grace-period)",
        "THRESHOLDS",
    ),
    ConfigFlag(
        "--eviction-soft-grace-period",
        "evictionSoftGracePeriod",
        _key_values,
        "how long a soft threshold must hold before evicting, e.g. memory.available=1m30s",
        "PERIODS",
    ),
    ConfigFlag(
        "--eviction-minimum-reclaim",
        "evictionMinimumReclaim",
        _key_values,
        "what an eviction must free beyond the threshold, e.g. memory.available=500Mi",
        "AMOUNTS",
    ),
    ConfigFlag(
        "--eviction-pressure-transition-period",
        "evictionPressureTransitionPeriod",
        _duration,
        "how long a pressure condition outlives its last sighting",
        "DURATION",
    ),
    ConfigFlag(
        "--eviction-max-pod-grace-period",
        "evictionMaxPodGracePeriod",
        _int,
        "most grace seconds a soft eviction gives a pod",
        "SECONDS",
    ),
    ConfigFlag(
        "--enforce-node-allocatable",
        "enforceNodeAllocatable",
        _list,
        "what allocatable is enforced on: pods (default), none",
        "LEVELS",
    ),
    ConfigFlag(
        "--kube-reserved", "kubeReserved", _key_values, "kept from pods for the kubelet",
        "RESOURCES",
    ),
    ConfigFlag(
        "--system-reserved", "systemReserved", _key_values, "kept from pods for the system",
        "RESOURCES",
    ),
)


# Go kubelet flags for features trio-kubelet does not have. A command line written for the
# Go kubelet still starts the agent; each one given is named in a warning at start-up.
GO_ONLY_FLAGS = (
    "--application-metrics-count-limit",
    "--boot-id-file",
    "--container-hints",
    "--containerd",
    "--containerd-namespace",
    "--contention-profiling",
    "--cpu-cfs-quota",
    "--cpu-cfs-quota-period",
    "--cpu-manager-policy",
    "--cpu-manager-policy-options",
    "--cpu-manager-reconcile-period",
    "--enable-controller-attach-detach",
    "--enable-debugging-handlers",
    "--enable-load-reader",
    "--enable-server",
    "--event-burst",
    "--event-qps",
    "--event-storage-age-limit",
    "--event-storage-event-limit",
    "--experimental-allocatable-ignore-eviction",
    "--experimental-mounter-path",
    "--fail-cgroupv1",
    "--fail-swap-on",
    "--global-housekeeping-interval",
    "--hairpin-mode",
    "--housekeeping-interval",
    "--image-credential-provider-bin-dir",
    "--image-credential-provider-config",
    "--kernel-memcg-notification",
    "--kube-api-content-type",
    "--kube-reserved-cgroup",
    "--kubelet-cgroups",
    "--log-cadvisor-usage",
    "--log-dir",
    "--log-flush-frequency",
    "--log-json-info-buffer-size",
    "--log-json-split-stream",
    "--log-text-info-buffer-size",
    "--log-text-split-stream",
    "--logtostderr",
    "--machine-id-file",
    "--make-iptables-util-chains",
    "--max-open-files",
    "--memory-manager-policy",
    "--oom-score-adj",
    "--pod-cidr",
    "--pod-infra-container-image",
    "--pods-per-core",
    "--qos-reserved",
    "--reserved-cpus",
    "--reserved-memory",
    "--runonce",
    "--runtime-cgroups",
    "--seccomp-default",
    "--storage-driver-buffer-duration",
    "--storage-driver-db",
    "--storage-driver-host",
    "--storage-driver-password",
    "--storage-driver-secure",
    "--storage-driver-table",
    "--storage-driver-user",
    "--system-cgroups",
    "--system-reserved-cgroup",
    "--topology-manager-policy",
    "--topology-manager-policy-options",
    "--topology-manager-scope",
    "--vmodule",
    "--volume-plugin-dir",
)


def _ignored_dest(flag: str) -> str:
    return "ignored_" + flag.removeprefix("--").replace("-", "_")


def ignored_flags(args: argparse.Namespace) -> list[str]:
    """The Go-only flags on the command line (they change nothing)."""
    return [flag for flag in GO_ONLY_FLAGS if getattr(args, _ignored_dest(flag), None) is not None]


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    node = parser.add_argument_group("node")
    node.add_argument("--config", type=Path, metavar="FILE", help="KubeletConfiguration file")
    node.add_argument(
        "--config-dir",
        type=Path,
        metavar="DIR",
        help="drop-in KubeletConfiguration files (*.conf, by name, subdirectories included), "
        "each merged over --config and the ones before it; flags still win",
    )
    node.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="API server credentials; without it the node runs standalone",
    )
    node.add_argument(
        "--bootstrap-kubeconfig",
        type=Path,
        metavar="FILE",
        help="credentials to ask the cluster for a client certificate with when --kubeconfig "
        "is missing or its certificate is unusable (TLS bootstrap)",
    )
    node.add_argument(
        "--root-dir",
        type=Path,
        default=DEFAULT_ROOT_DIR,
        metavar="DIR",
        help=f"kubelet state directory (default {DEFAULT_ROOT_DIR})",
    )
    node.add_argument(
        "--hostname-override", metavar="NAME", help="node name instead of the host name"
    )
    node.add_argument("--node-ip", metavar="IP[,IP]", help="IP address(es) of the node")
    node.add_argument(
        "--lock-file",
        type=Path,
        metavar="FILE",
        help="take an exclusive lock on FILE before starting (waiting while another holds it)",
    )
    node.add_argument(
        "--exit-on-lock-contention",
        nargs="?",
        const=True,
        default=False,
        type=_bool,
        metavar="BOOL",
        help="with --lock-file: exit as soon as another process opens it (a hand-over)",
    )
    node.add_argument(
        "--cloud-provider",
        default="",
        metavar="external",
        help='"external": the node registers tainted node.cloudprovider.kubernetes.io/'
        "uninitialized until a cloud controller manager sets it up, and keeps the addresses "
        "that sets",
    )
    node.add_argument(
        "--node-labels",
        action="append",
        default=[],
        metavar="KEY=VALUE,...",
        help="labels the node registers with (repeatable)",
    )
    node.add_argument(
        "--v",
        "-v",
        dest="verbosity",
        type=_verbosity,
        metavar="N",
        help="log verbosity; 4 or more logs debug messages (default: logging.verbosity, 0)",
    )
    record = parser.add_argument_group("recording")
    record.add_argument(
        "--record",
        type=Path,
        metavar="FILE",
        help="record every event and runtime/API answer for replay",
    )
    record.add_argument(
        "--record-max-bytes",
        type=_byte_size,
        metavar="SIZE",
        help="rotate the recording past this size (e.g. 500Mi; FILE.1 … FILE.5 are kept)",
    )
    parser.add_argument(
        "--show-pods",
        action="store_true",
        help="print a live pod table on stdout, like `kubectl get pods -w` (logs go to stderr)",
    )
    node.add_argument(
        "--cert-dir",
        type=Path,
        metavar="DIR",
        help="where certificates are kept: the self-signed serving one when --tls-cert-file is "
        "not given, and those the cluster issues (default <root-dir>/pki)",
    )
    _add_container_gc_flags(parser)
    go_only = parser.add_argument_group(
        "Go kubelet flags accepted and ignored, with a warning",
        " ".join(GO_ONLY_FLAGS),
    )
    for name in GO_ONLY_FLAGS:
        go_only.add_argument(name, dest=_ignored_dest(name), nargs="?", const="true",
                             help=argparse.SUPPRESS)
    overrides = parser.add_argument_group("configuration (each overrides the --config file)")
    for flag in CONFIG_FLAGS:
        kwargs: dict[str, Any] = {"dest": flag.dest, "type": flag.parse, "help": flag.help}
        if flag.is_bool:
            kwargs.update(nargs="?", const=True, metavar="BOOL")
        elif flag.accumulates:
            kwargs.update(action="append", metavar=flag.metavar)
        else:
            kwargs["metavar"] = flag.metavar
        overrides.add_argument(flag.flag, **kwargs)


def _add_container_gc_flags(parser: argparse.ArgumentParser) -> None:
    """The Go kubelet's container GC flags (deprecated there in favour of eviction, but
    still honoured; they have no KubeletConfiguration field)."""
    default = GCPolicy()
    gc = parser.add_argument_group("container GC (deprecated Go kubelet flags)")
    gc.add_argument(
        "--minimum-container-ttl-duration",
        type=_duration,
        default=default.min_age,
        metavar="DURATION",
        help="minimum age of a dead container before it may be removed (default 0)",
    )
    gc.add_argument(
        "--maximum-dead-containers-per-container",
        type=_int,
        default=default.max_per_pod_container,
        metavar="N",
        help="dead instances kept per container, negative for no limit (default 1)",
    )
    gc.add_argument(
        "--maximum-dead-containers",
        type=_int,
        default=default.max_containers,
        metavar="N",
        help="dead containers kept on the node, negative for no limit (default -1)",
    )


def _add_replay_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", type=Path, metavar="FILE", help="a recording made with run --record"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the replayed decisions differ from the recording",
    )
    parser.add_argument(
        "--until", type=_duration, metavar="DURATION", help="stop at this virtual time (e.g. 90s)"
    )
    parser.add_argument("--pod", metavar="NAMESPACE/NAME", help="only this pod")
    parser.add_argument(
        "--explain", action="store_true", help="print the inputs behind each decision"
    )
    parser.add_argument(
        "--timeline",
        nargs="?",
        const="-",
        metavar="OUT",
        help="render a timeline (to OUT, or stdout)",
    )


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive (got {value})")
    return value


def _port(text: str) -> int:
    value = _int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be a port between 1 and 65535 (got {value})")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {json.dumps(text)}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative (got {json.dumps(text)})")
    return value


def _add_hollow_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", type=Path, required=True, metavar="FILE",
                        help="API server credentials every hollow node uses")
    parser.add_argument("--nodes", type=_positive_int, required=True, metavar="N",
                        help="how many hollow nodes to run")
    parser.add_argument("--name-prefix", default="hollow-", metavar="PREFIX",
                        help="node i is named PREFIXi (default hollow-)")
    parser.add_argument("--max-pods", type=_positive_int, metavar="N",
                        help="pods per node (maxPods; default 110)")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="KubeletConfiguration every hollow node shares")
    parser.add_argument("--root-dir", type=Path, metavar="DIR",
                        help="scratch directory, DIR/NODE per node (default: a new temporary "
                        "directory, removed at exit)")
    parser.add_argument("--record-dir", type=Path, metavar="DIR",
                        help="record each node for replay, to DIR/NODE.jsonl")
    parser.add_argument("--port-base", type=_port, metavar="PORT",
                        help="serve node i's kubelet API on PORT+i (default: no HTTP servers)")
    parser.add_argument("--start-rate", type=_rate, metavar="NODES_PER_SECOND",
                        help="start the nodes at this rate (default 50; 0: all at once)")
    parser.add_argument("--keep-nodes", action="store_true",
                        help="leave the Node objects at exit (they go NotReady) instead of "
                        "deleting them")
    parser.add_argument("--v", "-v", dest="verbosity", type=_verbosity, default=0, metavar="N",
                        help="log verbosity; 2 or more logs every node's messages")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="A Kubernetes node agent on trio.", allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run = commands.add_parser("run", help="run the node agent (the default)", allow_abbrev=False)
    run.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    _add_run_flags(run)
    replay = commands.add_parser(
        "replay", help="re-run a recording's decisions under a virtual clock", allow_abbrev=False
    )
    _add_replay_flags(replay)
    hollow = commands.add_parser(
        "hollow", help="run many simulated nodes (real agents over fake runtimes) in one process",
        allow_abbrev=False,
    )
    _add_hollow_flags(hollow)
    return parser


def _config_overrides(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    overrides: dict[str, tuple[str, Any]] = {}
    for flag in CONFIG_FLAGS:
        value = getattr(args, flag.dest)
        if value is None:
            continue
        if flag.accumulates:  # repeated --manifest-url-header: merge the maps
            merged: dict[str, list[str]] = {}
            for headers in value:
                for name, values in headers.items():
                    merged.setdefault(name, []).extend(values)
            value = merged
        overrides[flag.field] = (flag.flag, value)
    return overrides


def agent_options(args: argparse.Namespace) -> AgentOptions:
    """The AgentOptions for parsed ``run`` arguments; raises ConfigError naming the field."""
    return build_agent_options(
        config_file=args.config,
        config_dir=args.config_dir,
        overrides=_config_overrides(args),
        root_dir=args.root_dir,
        hostname_override=args.hostname_override,
        cloud_provider=args.cloud_provider,
        lock_file=args.lock_file,
        exit_on_lock_contention=args.exit_on_lock_contention,
        node_ip=args.node_ip,
        node_labels=args.node_labels,
        kubeconfig=args.kubeconfig,
        bootstrap_kubeconfig=args.bootstrap_kubeconfig,
        cert_dir=args.cert_dir,
        record=args.record,
        record_max_bytes=args.record_max_bytes,
        verbosity=args.verbosity,
        show_pods=args.show_pods,
        container_gc=GCPolicy(
            min_age=args.minimum_container_ttl_duration,
            max_per_pod_container=args.maximum_dead_containers_per_container,
            max_containers=args.maximum_dead_containers,
        ),
    )


def parse_run_options(argv: Sequence[str]) -> AgentOptions:
    """AgentOptions from a Go-kubelet-style command line (used by tests and tools)."""
    return agent_options(build_parser().parse_args(["run", *argv]))


# --- logging ------------------------------------------------------------------------------


class KlogFormatter(logging.Formatter):
    """``I0102 15:04:05.123456 logger.name] message`` — one line per record, like klog."""

    LETTERS = {logging.DEBUG: "D", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E"}

    def format(self, record: logging.LogRecord) -> str:
        letter = self.LETTERS.get(record.levelno, "F" if record.levelno > logging.ERROR else "D")
        when = datetime.fromtimestamp(record.created).strftime("%m%d %H:%M:%S.%f")
        message = record.getMessage().replace("\n", "\\n")
        line = f"{letter}{when} {record.name}] {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JSONFormatter(logging.Formatter):
    """``logging.format: json``: one object a line with Go's keys: ``ts`` (milliseconds since
    the epoch), ``caller``, ``msg``, and ``v`` (the verbosity) or, for an error, ``err``
    (the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created * 1000, 3),
            "caller": f"{record.filename}:{record.lineno}",
            "msg": record.getMessage(),
        }
        if record.levelno >= logging.ERROR:
            if record.exc_info:
                entry["err"] = self.formatException(record.exc_info)
        else:
            entry["v"] = 0 if record.levelno >= logging.INFO else 4
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(verbosity: int, log_format: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if log_format == "json" else KlogFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbosity >= 4 else logging.INFO)
    # One line per API request only at --v 6 and above, as client-go logs them.
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.DEBUG if verbosity >= 6 else logging.WARNING)


# --- commands -----------------------------------------------------------------------------


def _fail(message: str) -> int:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    options = agent_options(args)
    configure_logging(options.verbosity, options.config.logging.format)
    ignored = ignored_flags(args)
    if ignored:
        logging.getLogger("trio_kubelet").warning(
            "Go kubelet flag(s) not implemented by trio-kubelet, ignored: %s", ", ".join(ignored))
    agent = importlib.import_module("trio_kubelet.agent")
    import trio

    # Everything imported so far lives as long as the process: keep it out of the
    # collector's full passes, whose pauses otherwise set the HTTP servers' p99.
    gc.freeze()
    # The agent handles SIGINT/SIGTERM itself; a KeyboardInterrupt that still escapes
    # (Ctrl-C before its handler is installed) is a normal way to stop, not a crash.
    from trio_kubelet.server.listeners import ServerStartError

    try:
        with contextlib.suppress(KeyboardInterrupt):
            trio.run(agent.run_agent, options)
    except ServerStartError as exc:  # a port in use: before any pod was touched
        logging.getLogger("trio_kubelet").error("%s", exc)
        return EXIT_START_FAILED
    return 0


def _replay(args: argparse.Namespace) -> int:
    try:
        replay = importlib.import_module("trio_kubelet.replay.cli")
    except ModuleNotFoundError as exc:
        if exc.name not in ("trio_kubelet.replay", "trio_kubelet.replay.cli"):
            raise
        print("replay is not available yet", file=sys.stderr)
        return EXIT_USAGE
    status = replay.replay_main(args)
    return int(status or 0)


def _hollow(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    import trio

    from trio_kubelet import hollow

    first = f"{args.name_prefix}0"
    if len(first) > 253 or not _DNS_SUBDOMAIN.match(first):
        return _fail(f"--name-prefix: {json.dumps(args.name_prefix)} does not make valid node "
                     f"names ({json.dumps(first)} is not a lowercase RFC 1123 subdomain)")
    if args.nodes > hollow.MAX_NODES:
        return _fail(f"--nodes: at most {hollow.MAX_NODES} (got {args.nodes})")
    overrides: dict[str, tuple[str, Any]] = {
        "cgroupsPerQOS": ("hollow", False),
        "resolvConf": ("hollow", ""),
        "healthzPort": ("hollow", 0),
    }
    if args.max_pods is not None:
        overrides["maxPods"] = ("--max-pods", args.max_pods)
    scratch = args.root_dir or Path(tempfile.mkdtemp(prefix="trio-kubelet-hollow-"))
    base = build_agent_options(
        config_file=args.config, overrides=overrides, root_dir=scratch,
        hostname_override=first, kubeconfig=args.kubeconfig, verbosity=args.verbosity,
    )
    if not base.config.cluster_dns:  # else every pod gets a MissingClusterDNS event
        base = replace(base, config=base.config.model_copy(
            update={"cluster_dns": [hollow.CLUSTER_DNS]}))
    options = hollow.HollowOptions(
        base=base, nodes=args.nodes, scratch=base.root_dir, name_prefix=args.name_prefix,
        record_dir=args.record_dir, port_base=args.port_base, keep_nodes=args.keep_nodes,
        start_rate=hollow.DEFAULT_START_RATE if args.start_rate is None else args.start_rate,
    )
    configure_logging(args.verbosity, base.config.logging.format)
    if args.verbosity < 2:  # 500 nodes' lines would drown the runner's own
        logging.getLogger("trio_kubelet").setLevel(logging.WARNING)
        logging.getLogger("trio_kubelet.hollow").setLevel(logging.INFO)
    if args.record_dir is not None:
        args.record_dir.mkdir(parents=True, exist_ok=True)
    gc.freeze()
    try:
        with hollow.node_log_prefix(logging.getLogger().handlers[0]), \
                contextlib.suppress(KeyboardInterrupt):
            trio.run(hollow.run_process, options)
    finally:
        if args.root_dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _with_default_command(argv: Sequence[str]) -> list[str]:
    """No subcommand means ``run``, so the Go kubelet's command lines work unchanged."""
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        return ["run", *argv]
    return list(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``trio-kubelet``; returns the exit status."""
    argv = _with_default_command(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        return _fail(str(exc))
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else 0
    try:
        if args.command == "replay":
            return _replay(args)
        if args.command == "hollow":
            return _hollow(args)
        return _run(args)
    except ConfigError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())

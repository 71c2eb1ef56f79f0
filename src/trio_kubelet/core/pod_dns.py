"""A pod's resolver settings (the CRI sandbox's DNS config) from its dnsPolicy and dnsConfig.

The Go kubelet's pkg/kubelet/network/dns (``GetPodDNS`` and its resolv.conf parsing).
Pure: the node's resolv.conf arrives already parsed (``parse_resolv_conf``, once at
start-up), and the Warning events the Go kubelet records come back as ``DNSWarning``
values for the caller to report.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from trio_kubelet.model.pod import (
    MAX_DNS_NAMESERVERS,
    MAX_DNS_SEARCH_LIST_CHARS,
    MAX_DNS_SEARCH_PATHS,
    Pod,
    PodDNSConfig,
)

# Longer search paths make some resolvers (glibc 2.28) abort, so they are dropped.
MAX_SEARCH_PATH_LENGTH = 253
# What ClusterFirst pods get instead of the node's options: cluster names such as
# "svc-name.namespace" go through the search list before being tried as absolute names.
CLUSTER_FIRST_OPTIONS = ("ndots:5",)

MISSING_CLUSTER_DNS = "MissingClusterDNS"
DNS_CONFIG_FORMING = "DNSConfigForming"
CHECK_LIMITS_FOR_RESOLV_CONF = "CheckLimitsForResolvConf"

MISSING_CLUSTER_DNS_MESSAGE = (
    "no cluster DNS server is configured (clusterDNS, --cluster-dns): pods with dnsPolicy "
    '"ClusterFirst" get the "Default" policy instead'
)


@dataclass(frozen=True, slots=True)
class ResolvConf:
    """A resolver configuration: nameservers, search paths, options ("name" or "name:value")."""

    servers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DNSSettings:
    """The node's side of every pod's DNS: clusterDNS, clusterDomain and the parsed resolvConf.

    ``resolv_conf`` is the file's path, "" when the node gives pods no resolver of its
    own (pods then query the node's loopback address, as with the Go kubelet).
    ``node_ips`` choose that loopback address's family.
    """

    cluster_dns: tuple[str, ...] = ()
    cluster_domain: str = ""
    resolv_conf: str = ""
    host: ResolvConf = field(default_factory=ResolvConf)
    node_ips: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DNSWarning:
    """A Warning event for the pod: its reason and message."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class PodDNS:
    """The pod's resolver configuration and what to warn about while forming it."""

    config: ResolvConf
    warnings: tuple[DNSWarning, ...] = ()


def parse_resolv_conf(text: str) -> tuple[ResolvConf, list[str]]:
    """The nameservers, search paths and options of a resolv.conf, and its problems.

    Nameserver lines add up; the last search line wins (trailing dots removed, a lone
    "." dropped); options lines merge, a later option replacing an earlier one of the
    same name. Other keywords are ignored. A problem (a nameserver line without an
    address) is reported, the rest of the file still counts.
    """
    servers: list[str] = []
    searches: list[str] = []
    options: dict[str, str] = {}
    problems: list[str] = []
    for number, line in enumerate(text.split("\n"), start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        keyword, args = fields[0], fields[1:]
        if keyword == "nameserver":
            if args:
                servers.append(args[0])
            else:
                problems.append(f"line {number}: nameserver without an address")
        elif keyword == "search":
            searches = [s.removesuffix(".") for s in args if s != "."]
        elif keyword == "options":
            for option in args:
                options[option.partition(":")[0]] = option
    return ResolvConf(tuple(servers), tuple(searches), tuple(options.values())), problems


def resolv_conf_problem(host: ResolvConf, path: str, cluster_domain: str) -> str | None:
    """Why pods cannot get all of the node's search paths, checked once at start-up.

    ClusterFirst pods put three cluster domains first, so with a cluster domain the
    node's search line has three paths fewer to work with.
    """
    limit = MAX_DNS_SEARCH_PATHS - (3 if cluster_domain else 0)
    if len(host.searches) > limit:
        return f"resolv.conf file {path!r} has more than {limit} search domains"
    if any(len(search) > MAX_SEARCH_PATH_LENGTH for search in host.searches):
        return (
            f"resolv.conf file {path!r} has a search path longer than "
            f"{MAX_SEARCH_PATH_LENGTH} characters"
        )
    if len(" ".join(host.searches)) > MAX_DNS_SEARCH_LIST_CHARS:
        return (
            f"resolv.conf file {path!r} has a search line longer than "
            f"{MAX_DNS_SEARCH_LIST_CHARS} characters"
        )
    return None


def effective_dns_policy(pod: Pod) -> str:
    """The policy the pod's DNS is formed with: "ClusterFirst", "Default" or "None".

    Host-network pods resolve as the node does unless they ask for
    ClusterFirstWithHostNet.
    """
    policy = pod.spec.dns_policy
    if policy == "ClusterFirstWithHostNet":
        return "ClusterFirst"
    if policy == "ClusterFirst" and pod.spec.host_network:
        return "Default"
    return policy


def pod_dns(pod: Pod, settings: DNSSettings) -> PodDNS:
    """The pod's resolver configuration, cut to the limits resolvers cope with."""
    warnings: list[DNSWarning] = []
    policy = effective_dns_policy(pod)
    if policy == "None":
        config = ResolvConf()
    elif policy == "ClusterFirst" and settings.cluster_dns:
        config = ResolvConf(
            servers=settings.cluster_dns,
            searches=_cluster_searches(pod, settings),
            options=CLUSTER_FIRST_OPTIONS,
        )
    else:
        if policy == "ClusterFirst":
            warnings.append(DNSWarning(MISSING_CLUSTER_DNS, _missing_cluster_dns(pod)))
        config = _node_config(settings)
    if pod.spec.dns_config is not None:
        config = _with_pod_dns_config(config, pod.spec.dns_config)
    servers = config.servers
    if len(servers) > MAX_DNS_NAMESERVERS:
        servers = servers[:MAX_DNS_NAMESERVERS]
        message = (
            f"Too many nameservers: only the first {MAX_DNS_NAMESERVERS} are used, "
            f"the applied nameserver line is: {' '.join(servers)}"
        )
        warnings.append(DNSWarning(DNS_CONFIG_FORMING, message))
    searches, cut = fit_search_list(config.searches)
    if cut:
        message = (
            "Search line limits were exceeded and some search paths left out, "
            f"the applied search line is: {' '.join(searches)}"
        )
        warnings.append(DNSWarning(DNS_CONFIG_FORMING, message))
    return PodDNS(ResolvConf(servers, searches, config.options), tuple(warnings))


def fit_search_list(searches: Sequence[str]) -> tuple[tuple[str, ...], bool]:
    """The search paths within the limits, and whether any had to go.

    At most 32 paths, none longer than 253 characters, the line at most 2048
    characters: paths past the limits are dropped from the end.
    """
    kept = [s for s in searches[:MAX_DNS_SEARCH_PATHS] if len(s) <= MAX_SEARCH_PATH_LENGTH]
    while kept and len(" ".join(kept)) > MAX_DNS_SEARCH_LIST_CHARS:
        kept.pop()
    return tuple(kept), len(kept) != len(searches)


def _cluster_searches(pod: Pod, settings: DNSSettings) -> tuple[str, ...]:
    """The namespace's, the cluster's service domains and the cluster domain, then the node's."""
    node = _node_searches(settings)
    domain = settings.cluster_domain
    if not domain:
        return node
    namespace = pod.metadata.namespace
    return _unique([f"{namespace}.svc.{domain}", f"svc.{domain}", domain, *node])


def _node_searches(settings: DNSSettings) -> tuple[str, ...]:
    return settings.host.searches if settings.resolv_conf else ()


def _node_config(settings: DNSSettings) -> ResolvConf:
    """The node's resolv.conf, or with none, its loopback address and no search paths.

    With no resolv.conf the Go kubelet still writes one, pointing at the node's own
    resolver, rather than let the runtime copy the node's file.
    """
    if settings.resolv_conf:
        return settings.host
    loopbacks = _unique("::1" if _is_ipv6(ip) else "127.0.0.1" for ip in settings.node_ips)
    return ResolvConf(servers=loopbacks or ("127.0.0.1",), searches=(".",))


def _with_pod_dns_config(config: ResolvConf, extra: PodDNSConfig) -> ResolvConf:
    """The pod's dnsConfig added: new servers and paths appended, its options win by name."""
    options: dict[str, str] = {}
    for option in config.options:
        name, _, value = option.partition(":")
        options[name] = value
    for pod_option in extra.options:
        options[pod_option.name] = pod_option.value or ""
    return ResolvConf(
        servers=_unique([*config.servers, *extra.nameservers]),
        searches=_unique([*config.searches, *extra.searches]),
        options=tuple(f"{name}:{value}" if value else name for name, value in options.items()),
    )


def _missing_cluster_dns(pod: Pod) -> str:
    meta = pod.metadata
    return f'pod "{meta.name}_{meta.namespace}({meta.uid})": {MISSING_CLUSTER_DNS_MESSAGE}'


def _unique(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


def _is_ipv6(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 6
    except ValueError:
        return False

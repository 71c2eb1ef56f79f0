"""A container's environment, command and args, computed as the Go kubelet computes them.

The Go sources are ``makeEnvironmentVariables`` (pkg/kubelet/kubelet_pods.go), the ``$(VAR)``
expansion of third_party/forked/golang/expansion, the downward API helpers (pkg/fieldpath,
pkg/api/v1/resource) and the service links of pkg/kubelet/envvars. Pure: ConfigMaps,
Secrets and Services come through an :data:`ObjectLookup` (Services when it is also a
:class:`ServiceLookup`), addresses and node allocatable as arguments. Errors carry the Go
kubelet's wording, since users read them in pod status.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections import ChainMap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

from trio_kubelet.core.objects import (
    ObjectKind,
    ObjectLookup,
    ObjectUnavailable,
    ServiceLink,
    ServiceLookup,
    object_data,
)
from trio_kubelet.core.phase import is_static_pod
from trio_kubelet.model.pod import Container, Pod
from trio_kubelet.model.quantity import QuantityError, parse_quantity

CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"

_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
# Limits the downward API defaults to node allocatable when unset or zero (hugepages never are).
_DEFAULTED_LIMITS = ("cpu", "memory", "ephemeral-storage")
# Field paths the API conversion accepts but the env resolver cannot answer.
_CONVERTIBLE_ONLY = frozenset({"spec.restartPolicy", "spec.schedulerName", "status.phase"})
_MASTER_SERVICES = frozenset({"kubernetes"})
# Where the API server publishes the ``kubernetes`` Service (Go's --master-service-namespace).
_MASTER_NAMESPACE = "default"
_ENV_FROM_SOURCES: tuple[tuple[str, ObjectKind], ...] = (
    ("configMapRef", "ConfigMap"),
    ("secretRef", "Secret"),
)


class EnvError(Exception):
    """The environment cannot be built; the container waits with this reason and message."""

    reason: ClassVar[str] = CREATE_CONTAINER_CONFIG_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def expand(text: str, mapping: Mapping[str, str]) -> str:
    """Replace each defined ``$(VAR)``; ``$$`` is a literal ``$``; all else stays as written."""
    out: list[str] = []
    cursor = 0
    while True:
        dollar = text.find("$", cursor)
        if dollar < 0 or dollar + 1 >= len(text):
            out.append(text[cursor:])
            return "".join(out)
        out.append(text[cursor:dollar])
        after = text[dollar + 1]
        cursor = dollar + 2
        if after == "(":
            close = text.find(")", cursor)
            if close < 0:
                out.append("$(")
                continue
            name = text[cursor:close]
            out.append(mapping.get(name, f"$({name})"))
            cursor = close + 1
        elif after == "$":
            out.append("$")
        else:
            out.append("$" + after)


def expand_command(
    container: Container, env: Iterable[tuple[str, str]]
) -> tuple[list[str], list[str]]:
    """The container's command and args with ``$(VAR)`` expanded against its final environment."""
    mapping = dict(env)
    return (
        [expand(part, mapping) for part in container.command],
        [expand(part, mapping) for part in container.args],
    )


def container_env(
    pod: Pod,
    container: Container,
    *,
    lookup: ObjectLookup,
    pod_ip: str,
    pod_ips: Sequence[str],
    host_ip: str,
    host_ips: Sequence[str],
    node_allocatable: Mapping[str, Fraction],
) -> list[tuple[str, str]]:
    """The container's environment: envFrom, then env (which overrides), then service links.

    Go builds this from a map, so its order is unspecified; here it is deterministic: each
    name where it was first defined (envFrom sources in order, their keys sorted, then env
    in declaration order), then the service variables nobody defined, sorted. Names are
    unique; a later definition replaces the value. Raises :class:`EnvError` for anything
    that keeps the container from starting (a missing object or key that is not optional,
    an unavailable object, Services never listed, an unsupported field).
    """
    service_env = pod_service_env(pod, lookup)
    objects = _Objects(lookup, pod.metadata.namespace)
    defined: dict[str, str] = {}
    for source in container.env_from:
        defined.update(_read_env_from(source, objects))
    resolver = _Resolver(
        pod, container, objects, _Addresses(pod_ip, pod_ips, host_ip, host_ips), node_allocatable
    )
    known = ChainMap(defined, service_env)
    for var in container.env:
        if var.value:
            # A non-empty value wins over valueFrom, and sees only what is defined so far.
            defined[var.name] = expand(var.value, known)
            continue
        value = resolver.value_from(var.value_from) if var.value_from else ""
        if value is not None:
            defined[var.name] = value
    services = sorted((k, v) for k, v in service_env.items() if k not in defined)
    return [*defined.items(), *services]


def pod_service_env(pod: Pod, lookup: ObjectLookup) -> dict[str, str]:
    """The link variables of ``pod``'s containers, read through ``lookup``'s Services.

    A lookup that lists no Services (no API server) gives none. Services never listed
    fail a pod from the API server, which would otherwise start without
    ``KUBERNETES_SERVICE_HOST`` for good; a static pod goes on with none, since it may
    have to run before any API server answers.
    """
    if not isinstance(lookup, ServiceLookup):
        return {}
    namespace, linked = pod.metadata.namespace, pod.spec.enable_service_links
    try:
        services = list(lookup.services(_MASTER_NAMESPACE))
        if linked and namespace != _MASTER_NAMESPACE:
            services += lookup.services(namespace)
    except ObjectUnavailable as err:
        if is_static_pod(pod):
            return {}
        raise EnvError(str(err)) from None
    return service_env_vars(services, namespace, linked)


def service_env_vars(
    services: Iterable[ServiceLink], namespace: str, enable_service_links: bool
) -> dict[str, str]:
    """The Docker-link style variables for the services a pod in ``namespace`` should see.

    The ``kubernetes`` service of the default namespace is always included (in-cluster
    clients read it); the namespace's own services only with ``enableServiceLinks``, and a
    local service of the same name shadows it. Headless and ExternalName services (no
    cluster IP) give nothing.
    """
    chosen: dict[str, ServiceLink] = {}
    for service in services:
        if service.cluster_ip in ("", "None"):
            continue
        if service.namespace == _MASTER_NAMESPACE and service.name in _MASTER_SERVICES:
            chosen.setdefault(service.name, service)
        elif service.namespace == namespace and enable_service_links:
            chosen[service.name] = service
    env: dict[str, str] = {}
    for name in sorted(chosen):
        env.update(_service_links(chosen[name]))
    return env


def _service_links(service: ServiceLink) -> dict[str, str]:
    ports = service.ports
    if not ports:
        return {}
    prefix, ip = _env_var_name(service.name), service.cluster_ip
    env = {f"{prefix}_SERVICE_HOST": ip, f"{prefix}_SERVICE_PORT": str(ports[0].port)}
    for port in ports:
        if port.name:
            env[f"{prefix}_SERVICE_PORT_{_env_var_name(port.name)}"] = str(port.port)
    for index, port in enumerate(ports):
        number = str(port.port)
        protocol = port.protocol or "TCP"
        host_port = f"[{ip}]:{number}" if ":" in ip else f"{ip}:{number}"
        url = f"{protocol.lower()}://{host_port}"
        if index == 0:
            env[f"{prefix}_PORT"] = url
        base = f"{prefix}_PORT_{number}_{protocol.upper()}"
        env[base] = url
        env[f"{base}_PROTO"] = protocol.lower()
        env[f"{base}_PORT"] = number
        env[f"{base}_ADDR"] = ip
    return env


def _env_var_name(name: str) -> str:
    return name.upper().replace("-", "_")


def _mapping(value: object) -> Mapping[str, Any]:
    """A sub-object of the pod's API form; anything malformed reads as empty."""
    return value if isinstance(value, Mapping) else {}


class _Objects:
    """Reads each object once per call, as the Go kubelet caches them while building the env."""

    def __init__(self, lookup: ObjectLookup, namespace: str) -> None:
        self._lookup = lookup
        self._namespace = namespace
        self._seen: dict[tuple[ObjectKind, str], dict[str, str] | None] = {}

    def data(self, kind: ObjectKind, name: str, *, optional: bool) -> dict[str, str] | None:
        """The object's string data; None when it is missing and ``optional``."""
        if (kind, name) not in self._seen:
            try:
                obj = self._lookup(kind, self._namespace, name)
                self._seen[kind, name] = None if obj is None else _string_data(kind, obj)
            except ObjectUnavailable as err:
                raise EnvError(str(err)) from None
        data = self._seen[kind, name]
        if data is None and not optional:
            # The wording of the API's NotFound error, as the kubelet's managers return it.
            raise EnvError(f'{kind.lower()} "{name}" not found')
        return data

    def key(self, kind: ObjectKind, ref: Mapping[str, Any]) -> str | None:
        """One key of a configMapKeyRef/secretKeyRef; None when missing and optional."""
        name, key, optional = str(ref.get("name", "")), str(ref.get("key", "")), _optional(ref)
        data = self.data(kind, name, optional=optional)
        if data is None:
            return None
        if key not in data:
            if optional:
                return None
            raise EnvError(f"couldn't find key {key} in {kind} {self._namespace}/{name}")
        return data[key]


def _string_data(kind: ObjectKind, obj: Mapping[str, Any]) -> dict[str, str]:
    if kind == "ConfigMap":
        # Only ``data``: the kubelet never puts binaryData into the environment.
        return {str(k): str(v) for k, v in _mapping(obj.get("data")).items()}
    return {k: v.decode("utf-8", errors="replace") for k, v in object_data(kind, obj).items()}


def _optional(ref: Mapping[str, Any]) -> bool:
    return ref.get("optional") is True


def _read_env_from(source: Mapping[str, Any], objects: _Objects) -> dict[str, str]:
    """One envFrom entry's keys, prefixed; none when the object is optional and missing.

    Every key is taken, whatever its form: since RelaxedEnvironmentVariableValidation
    (GA in 1.34) the Go kubelet no longer skips keys that are not C identifiers, and the
    API server's key validation already rules out ``=`` and empty keys.
    """
    for field_name, kind in _ENV_FROM_SOURCES:
        ref = source.get(field_name)
        if isinstance(ref, Mapping):
            data = objects.data(kind, str(ref.get("name", "")), optional=_optional(ref)) or {}
            prefix = str(source.get("prefix") or "")
            return {prefix + key: data[key] for key in sorted(data)}
    return {}


@dataclass(frozen=True, slots=True)
class _Addresses:
    pod_ip: str
    pod_ips: Sequence[str]
    host_ip: str
    host_ips: Sequence[str]

    def sorted_pod_ips(self) -> list[str]:
        """One IP per family, the node's family first (the Go kubelet's sortPodIPs)."""
        primary = 6 if _ip_version(self.host_ip) == 6 else 4
        candidates = self.pod_ips or [self.pod_ip]
        ordered: list[str] = []
        for version in (primary, 10 - primary):
            ordered += [ip for ip in candidates if _ip_version(ip) == version][:1]
        return ordered


def _ip_version(ip: str) -> int:
    try:
        return ipaddress.ip_address(ip).version
    except ValueError:
        return 0


@dataclass(frozen=True, slots=True)
class _Resolver:
    """Resolves ``valueFrom`` sources: downward API fields, resources, ConfigMap/Secret keys."""

    pod: Pod
    container: Container
    objects: _Objects
    addresses: _Addresses
    allocatable: Mapping[str, Fraction]

    def value_from(self, source: Mapping[str, Any]) -> str | None:
        """The value, or None to leave the variable out (an optional reference that is missing).

        Sources are tried in Go's order; one this kubelet does not know (fileKeyRef, whose
        feature gate is off by default) yields the empty string, as Go's does with the gate off.
        """
        if isinstance(ref := source.get("fieldRef"), Mapping):
            return self._field(ref)
        if isinstance(ref := source.get("resourceFieldRef"), Mapping):
            return self._resource(ref)
        if isinstance(ref := source.get("configMapKeyRef"), Mapping):
            return self.objects.key("ConfigMap", ref)
        if isinstance(ref := source.get("secretKeyRef"), Mapping):
            return self.objects.key("Secret", ref)
        return ""

    def _field(self, ref: Mapping[str, Any]) -> str:
        version, path = ref.get("apiVersion") or "v1", str(ref.get("fieldPath", ""))
        if version != "v1":
            raise EnvError(f"unsupported pod version: {version}")
        meta = self.pod.metadata
        subscripted = _split_subscript(path)
        if subscripted is not None:
            base, key = subscripted
            if base == "metadata.annotations":
                return meta.annotations.get(_qualified_key(path, key, key.lower()), "")
            if base == "metadata.labels":
                return meta.labels.get(_qualified_key(path, key, key), "")
            raise EnvError(f"field label does not support subscript: {path}")
        match "spec.nodeName" if path == "spec.host" else path:
            case "metadata.name":
                return meta.name
            case "metadata.namespace":
                return meta.namespace
            case "metadata.uid":
                return meta.uid
            case "metadata.labels":
                return _format_map(meta.labels)
            case "metadata.annotations":
                return _format_map(meta.annotations)
            case "spec.nodeName":
                return self.pod.spec.node_name or ""
            case "spec.serviceAccountName":
                return self.pod.spec.service_account_name or ""
            case "status.hostIP":
                return self.addresses.host_ip
            case "status.hostIPs":
                return ",".join(self.addresses.host_ips or [self.addresses.host_ip])
            case "status.podIP":
                return next(iter(self.addresses.sorted_pod_ips()), self.addresses.pod_ip)
            case "status.podIPs":
                return ",".join(self.addresses.sorted_pod_ips())
        if path in _CONVERTIBLE_ONLY:
            raise EnvError(f"unsupported fieldPath: {path}")
        raise EnvError(f"field label not supported: {path}")

    def _resource(self, ref: Mapping[str, Any]) -> str:
        resource = str(ref.get("resource", ""))
        limit_or_request, _, name = resource.partition(".")
        known = name in _DEFAULTED_LIMITS or name.startswith("hugepages-")
        if limit_or_request not in ("limits", "requests") or not known:
            raise EnvError(f"unsupported container resource : {resource}")
        try:
            divisor = parse_quantity(ref.get("divisor") or 0) or Fraction(1)
        except QuantityError as err:
            raise EnvError(f"resourceFieldRef {resource}: divisor: {err}") from None
        if divisor < 0:
            raise EnvError(f"resourceFieldRef {resource}: divisor must be positive")
        limits, requests = self._resources_of(str(ref.get("containerName") or ""))
        value = (limits if limit_or_request == "limits" else requests).get(name, Fraction(0))
        if name == "cpu":
            # Go compares millicores, each rounded up, and rounds the quotient up too.
            return str(_ceil_div(math.ceil(value * 1000), math.ceil(divisor * 1000)))
        return str(_ceil_div(math.ceil(value), math.ceil(divisor)))

    def _resources_of(self, name: str) -> tuple[dict[str, Fraction], dict[str, Fraction]]:
        """Limits and requests as Go's downward API sees them.

        Requests default to limits (API defaulting); unset or zero cpu, memory and
        ephemeral-storage limits become node allocatable, except for an init container
        named by ``containerName`` (Go defaults only the pod's regular containers there).
        """
        if not name:
            return _effective_resources(self.container, self.allocatable)
        for candidate in self.pod.spec.containers:
            if candidate.name == name:
                return _effective_resources(candidate, self.allocatable)
        for candidate in self.pod.spec.init_containers:
            if candidate.name == name:
                return _effective_resources(candidate, {})
        raise EnvError(f"container {name} not found")


def _effective_resources(
    container: Container, allocatable: Mapping[str, Fraction]
) -> tuple[dict[str, Fraction], dict[str, Fraction]]:
    limits = {k: parse_quantity(v) for k, v in container.resources.limits.items()}
    requests = {**limits, **{k: parse_quantity(v) for k, v in container.resources.requests.items()}}
    for name in _DEFAULTED_LIMITS:
        if not limits.get(name) and name in allocatable:
            limits[name] = allocatable[name]
    return limits, requests


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def _split_subscript(path: str) -> tuple[str, str] | None:
    """``metadata.labels['key']`` as (``metadata.labels``, ``key``); None when not subscripted."""
    if not path.endswith("']"):
        return None
    base, sep, key = path[:-2].partition("['")
    return (base, key) if sep and base else None


def _qualified_key(path: str, key: str, checked: str) -> str:
    """``key`` when ``checked`` is a qualified name (``[prefix/]name``), as Go requires."""
    prefix, slash, name = checked.rpartition("/")
    valid = len(name) <= 63 and _QUALIFIED_NAME_PART.match(name) is not None
    if slash:
        valid = valid and len(prefix) <= 253 and _DNS1123_SUBDOMAIN.match(prefix) is not None
    if not valid:
        raise EnvError(
            f"invalid key subscript in {path}: must be a qualified name "
            "('name' or 'prefix/name', e.g. 'MyName' or 'example.com/MyName')"
        )
    return key


def _format_map(values: Mapping[str, str]) -> str:
    """``key="value"`` lines in key order, values quoted as Go's %q quotes them."""
    return "\n".join(f"{key}={_go_quote(values[key])}" for key in sorted(values))


_GO_ESCAPES = {
    "\a": r"\a",
    "\b": r"\b",
    "\f": r"\f",
    "\n": r"\n",
    "\r": r"\r",
    "\t": r"\t",
    "\v": r"\v",
    "\\": r"\\",
    '"': r"\"",
}


def _go_quote(text: str) -> str:
    out = ['"']
    for char in text:
        code = ord(char)
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xD800 <= code < 0xE000:
            out.append("\\ufffd")  # a lone surrogate is not a rune; Go writes U+FFFD
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)

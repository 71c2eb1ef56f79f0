"""The API server's validation of a pod, for pods that did not come through it (files, URL).

A pod from a static file or the manifest URL never met the API server, so the agent
checks it as ``ValidatePodCreate`` would (``pkg/apis/core/validation`` with the
apimachinery helpers) before running it, as Go's file and URL sources do. Pods from
the API server were validated there: this is not run for them.

``Pod.model_validate`` has already checked types, enumerations and the rules the model
itself relies on (container names unique DNS labels, ports 1-65535, probe handlers,
…). The rules here are the rest: metadata (label keys and values, annotation keys and
their 256 KiB total), resources (non-negative quantities, requests within limits),
integer ranges (the Go field's type and the API's bounds), port, volume and env names,
volume mounts, probe thresholds. Each rule is a function from the pod's wire form to
``FieldError``s, listed in ``RULES``; the integer bounds are one table, ``INTEGER_RANGES``.

Messages are the API server's (``field.Error``): ``metadata.annotations: Too long: must
have at most 262144 bytes``, ``spec.containers[0].resources.limits[cpu]: Invalid value:
"-1": must be greater than or equal to 0``. One difference: a value longer than 100
characters is shown cut short, so a 5,000-character label does not flood the log.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from trio_kubelet.model.pod import Pod
from trio_kubelet.model.quantity import parse_quantity

TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024  # bytes, keys and values (TotalAnnotationSizeLimitB)
LABEL_VALUE_MAX_LENGTH = 63
_SHOWN_VALUE_CHARS = 100

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class FieldError:
    """One field's problem, printed as the API server's ``field.Error`` prints it."""

    field: str
    type: str  # "Invalid value", "Required value", "Duplicate value", "Not found", "Too long"
    value: Any = None
    detail: str = ""

    def __str__(self) -> str:
        body = self.type
        if self.type not in ("Required value", "Too long"):  # these never show the value
            body += f": {_shown(self.value)}"
        return f"{self.field}: {body}: {self.detail}" if self.detail else f"{self.field}: {body}"


def _shown(value: Any) -> str:
    """Go's ``%q`` for strings, ``%v`` for numbers; a long string cut short."""
    if isinstance(value, str):
        if len(value) > _SHOWN_VALUE_CHARS:
            cut = json.dumps(value[:_SHOWN_VALUE_CHARS], ensure_ascii=False)
            return f"{cut[:-1]}...\" ({len(value)} characters)"
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def describe_field_errors(errors: Iterable[FieldError]) -> str:
    """All errors on one line, ``; ``-separated, as a problem's reason."""
    return "; ".join(map(str, errors))


# --- the formats (k8s.io/apimachinery/pkg/util/validation) ----------------------------------

_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = rf"{_DNS1123_LABEL_FMT}(\.{_DNS1123_LABEL_FMT})*"
_LABEL_KEY_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT = f"({_LABEL_KEY_FMT})?"
_DNS1123_LABEL = re.compile(f"^{_DNS1123_LABEL_FMT}$")
_DNS1123_SUBDOMAIN = re.compile(f"^{_DNS1123_SUBDOMAIN_FMT}$")
_LABEL_KEY = re.compile(f"^{_LABEL_KEY_FMT}$")
_LABEL_VALUE = re.compile(f"^{_LABEL_VALUE_FMT}$")
_PORT_NAME_CHARS = re.compile("^[-a-z0-9]+$")


def _regex_error(message: str, fmt: str, *examples: str) -> str:
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{fmt}')"


def _max_length(length: int) -> str:
    return f"must be no more than {length} characters"


def _inclusive_range(low: int, high: int) -> str:
    return f"must be between {low} and {high}, inclusive"


def dns1123_label_errors(value: str) -> list[str]:
    errors = [_max_length(63)] if len(value) > 63 else []
    if not _DNS1123_LABEL.match(value):
        if _DNS1123_SUBDOMAIN.match(value):
            errors.append("must not contain dots")
        else:
            errors.append(_regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
                "or '-', and must start and end with an alphanumeric character",
                _DNS1123_LABEL_FMT, "my-name", "123-abc"))
    return errors


def dns1123_subdomain_errors(value: str) -> list[str]:
    errors = [_max_length(253)] if len(value) > 253 else []
    if not _DNS1123_SUBDOMAIN.match(value):
        errors.append(_regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
            "'-' or '.', and must start and end with an alphanumeric character",
            _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errors


def qualified_name_errors(value: str) -> list[str]:
    """IsQualifiedName: a label or annotation key, ``[prefix/]name``."""
    parts = value.split("/")
    name_regex_error = _regex_error(
        "must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
        "with an alphanumeric character", _LABEL_KEY_FMT, "MyName", "my.name", "123-abc")
    if len(parts) > 2:
        return [f"a valid label key {name_regex_error} with an optional DNS subdomain prefix "
                "and '/' (e.g. 'example.com/MyName')"]
    errors = []
    name = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend(f"prefix part {e}" for e in dns1123_subdomain_errors(parts[0]))
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append(f"name part {_max_length(63)}")
    if not _LABEL_KEY.match(name):
        errors.append(f"name part {name_regex_error}")
    return errors


def label_value_errors(value: str) -> list[str]:
    errors = [_max_length(LABEL_VALUE_MAX_LENGTH)] if len(value) > LABEL_VALUE_MAX_LENGTH else []
    if not _LABEL_VALUE.match(value):
        errors.append(_regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, "
            "'-', '_' or '.', and must start and end with an alphanumeric character",
            _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errors


def port_name_errors(value: str) -> list[str]:
    errors = [_max_length(15)] if len(value) > 15 else []
    if not _PORT_NAME_CHARS.match(value):
        errors.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not re.search("[a-z]", value):
        errors.append("must contain at least one letter (a-z)")
    if "--" in value:
        errors.append("must not contain consecutive hyphens")
    if value.startswith("-") or value.endswith("-"):
        errors.append("must not begin or end with a hyphen")
    return errors


# --- walking the pod ------------------------------------------------------------------------

Wire = Mapping[str, Any]
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
HOOKS = ("postStart", "preStop")


def _containers(pod: Wire) -> Iterator[tuple[str, Wire]]:
    spec = pod.get("spec") or {}
    for kind in CONTAINER_LISTS:
        for index, container in enumerate(spec.get(kind) or ()):
            yield f"spec.{kind}[{index}]", container


def _select(node: Any, pattern: str, path: str) -> Iterator[tuple[str, Any]]:
    """``(path, value)`` at ``pattern``: dotted keys, ``name[*]`` for each item of a list."""
    if not pattern:
        yield path, node
        return
    step, _, rest = pattern.partition(".")
    key, each = step.removesuffix("[*]"), step.endswith("[*]")
    if not isinstance(node, dict) or key not in node:
        return
    here = f"{path}.{key}" if path else key
    value = node[key]
    if not each:
        yield from _select(value, rest, here)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _select(item, rest, f"{here}[{index}]")


def _expand(pattern: str) -> list[str]:
    """A table pattern with ``{probe}`` or ``{hook}`` as concrete patterns."""
    for name, choices in (("{probe}", PROBES), ("{hook}", [f"lifecycle.{h}" for h in HOOKS])):
        if name in pattern:
            return [pattern.replace(name, choice) for choice in choices]
    return [pattern]


# --- the rules ------------------------------------------------------------------------------

_NON_NEGATIVE = "must be greater than or equal to 0"

# (field, lowest, highest, the API's words for a value below lowest; None: the range's words).
# The highest is the Go field's type limit unless the API sets a tighter one.
INTEGER_RANGES: tuple[tuple[str, int, int, str | None], ...] = (
    ("metadata.generation", 0, INT64_MAX, _NON_NEGATIVE),
    ("metadata.deletionGracePeriodSeconds", INT64_MIN, INT64_MAX, None),
    ("spec.terminationGracePeriodSeconds", 0, INT64_MAX, _NON_NEGATIVE),
    ("spec.activeDeadlineSeconds", 1, INT32_MAX, None),
    ("spec.priority", INT32_MIN, INT32_MAX, None),
    ("spec.securityContext.runAsUser", 0, INT32_MAX, None),
    ("spec.securityContext.runAsGroup", 0, INT32_MAX, None),
    ("spec.securityContext.fsGroup", 0, INT32_MAX, None),
    ("spec.securityContext.supplementalGroups[*]", 0, INT32_MAX, None),
    ("{container}.securityContext.runAsUser", 0, INT32_MAX, None),
    ("{container}.securityContext.runAsGroup", 0, INT32_MAX, None),
    ("{container}.{probe}.initialDelaySeconds", 0, INT32_MAX, _NON_NEGATIVE),
    ("{container}.{probe}.timeoutSeconds", 0, INT32_MAX, _NON_NEGATIVE),
    ("{container}.{probe}.periodSeconds", 0, INT32_MAX, _NON_NEGATIVE),
    ("{container}.{probe}.successThreshold", 0, INT32_MAX, _NON_NEGATIVE),
    ("{container}.{probe}.failureThreshold", 0, INT32_MAX, _NON_NEGATIVE),
    ("{container}.{probe}.terminationGracePeriodSeconds", 1, INT64_MAX, "must be greater than 0"),
    ("{container}.{probe}.httpGet.port", 1, 65535, None),
    ("{container}.{probe}.tcpSocket.port", 1, 65535, None),
    ("{container}.{probe}.grpc.port", 1, 65535, None),
    ("{container}.{hook}.httpGet.port", 1, 65535, None),
    ("{container}.{hook}.tcpSocket.port", 1, 65535, None),
    ("{container}.{hook}.sleep.seconds", 0, INT64_MAX, _NON_NEGATIVE),
)
_CONTAINER = "{container}."
_INTEGER_FIELDS = tuple(
    (concrete, low, high, below)
    for pattern, low, high, below in INTEGER_RANGES
    for concrete in _expand(pattern)
)
# Pod-level fields from the root; container fields from each container (walked once).
_POD_INTEGERS = tuple(f for f in _INTEGER_FIELDS if not f[0].startswith(_CONTAINER))
_CONTAINER_INTEGERS = tuple(
    (f[0].removeprefix(_CONTAINER), *f[1:]) for f in _INTEGER_FIELDS
    if f[0].startswith(_CONTAINER))


def integer_ranges(pod: Wire) -> Iterator[FieldError]:
    """Every integer of ``INTEGER_RANGES`` within its bounds (a named port is not checked)."""
    places = [(pod, "", _POD_INTEGERS)]
    places += [(container, where, _CONTAINER_INTEGERS) for where, container in _containers(pod)]
    for node, where, fields in places:
        for pattern, low, high, below in fields:
            for path, value in _select(node, pattern, where):
                if not isinstance(value, int) or isinstance(value, bool) or low <= value <= high:
                    continue
                detail = (below if below is not None and value < low
                          else _inclusive_range(low, high))
                yield FieldError(path, "Invalid value", value, detail)


def _label_map(field: str, labels: Any) -> Iterator[FieldError]:
    """ValidateLabels: qualified-name keys, label-format values; errors on the map's path."""
    for key, value in (labels or {}).items():
        for message in qualified_name_errors(str(key)):
            yield FieldError(field, "Invalid value", key, message)
        if not isinstance(value, str):
            yield FieldError(field, "Invalid value", value, "must be a string")
            continue
        for message in label_value_errors(value):
            yield FieldError(field, "Invalid value", value, message)


def metadata_labels(pod: Wire) -> Iterator[FieldError]:
    yield from _label_map("metadata.labels", (pod.get("metadata") or {}).get("labels"))


def node_selector(pod: Wire) -> Iterator[FieldError]:
    selector = (pod.get("spec") or {}).get("nodeSelector")
    if isinstance(selector, Mapping):
        yield from _label_map("spec.nodeSelector", selector)
    elif selector is not None:
        yield FieldError("spec.nodeSelector", "Invalid value", selector, "must be a map")


def metadata_annotations(pod: Wire) -> Iterator[FieldError]:
    """Keys are qualified names (case aside); keys and values together at most 256 KiB."""
    found = (pod.get("metadata") or {}).get("annotations") or {}
    size = 0
    for key, value in found.items():
        for message in qualified_name_errors(key.lower()):
            yield FieldError("metadata.annotations", "Invalid value", key, message)
        size += len(key.encode()) + len(value.encode())
    if size > TOTAL_ANNOTATION_SIZE_LIMIT:
        yield FieldError("metadata.annotations", "Too long", None,
                         f"must have at most {TOTAL_ANNOTATION_SIZE_LIMIT} bytes")


def _overcommitable(resource: str) -> bool:
    """Native resources other than hugepages may have requests below their limits."""
    native = "/" not in resource or resource.startswith("kubernetes.io/")
    return native and not resource.startswith("hugepages-")


def container_resources(pod: Wire) -> Iterator[FieldError]:
    """Quantities not negative; a request at most its limit (equal, if not overcommitable)."""
    for where, container in _containers(pod):
        found = container.get("resources") or {}
        limits = found.get("limits") or {}
        requests = found.get("requests") or {}
        for kind, quantities in (("limits", limits), ("requests", requests)):
            for name, value in quantities.items():
                if parse_quantity(value) < 0:  # parses: the model checked it
                    yield FieldError(f"{where}.resources.{kind}[{name}]", "Invalid value",
                                     str(value), _NON_NEGATIVE)
        yield from _requests_within_limits(f"{where}.resources", requests, limits)


def _requests_within_limits(where: str, requests: Mapping[str, Any],
                            limits: Mapping[str, Any]) -> Iterator[FieldError]:
    for name, value in requests.items():
        if name not in limits:
            if not _overcommitable(name):
                yield FieldError(f"{where}.limits", "Required value", None,
                                 "Limit must be set for non overcommitable resources")
            continue
        request, limit = parse_quantity(value), parse_quantity(limits[name])
        if request != limit and not _overcommitable(name):
            yield FieldError(f"{where}.requests", "Invalid value", str(value),
                             f"must be equal to {name} limit of {limits[name]}")
        elif request > limit:
            yield FieldError(f"{where}.requests", "Invalid value", str(value),
                             f"must be less than or equal to {name} limit of {limits[name]}")


def port_names(pod: Wire) -> Iterator[FieldError]:
    """Port names: IANA service name format, unique within the container."""
    for where, container in _containers(pod):
        names: set[str] = set()
        for index, port in enumerate(container.get("ports") or ()):
            name = port.get("name")
            if not name:
                continue
            path = f"{where}.ports[{index}].name"
            problems = port_name_errors(name)
            for message in problems:
                yield FieldError(path, "Invalid value", name, message)
            if not problems and name in names:
                yield FieldError(path, "Duplicate value", name)
            names.add(name)


def volume_names(pod: Wire) -> Iterator[FieldError]:
    """Volume names are DNS-1123 labels (their uniqueness is the model's)."""
    for index, volume in enumerate((pod.get("spec") or {}).get("volumes") or ()):
        path = f"spec.volumes[{index}].name"
        name = volume.get("name") or ""
        if not name:
            yield FieldError(path, "Required value")
        for message in dns1123_label_errors(name) if name else ():
            yield FieldError(path, "Invalid value", name, message)


def volume_mounts(pod: Wire) -> Iterator[FieldError]:
    """A mount names a volume of the pod, has a path, and no two share a path.

    (The model already refuses an unknown volume in containers and init containers;
    here ephemeral containers are held to it too.)
    """
    names = {v.get("name") for v in (pod.get("spec") or {}).get("volumes") or ()}
    for where, container in _containers(pod):
        paths: set[str] = set()
        for index, mount in enumerate(container.get("volumeMounts") or ()):
            path = f"{where}.volumeMounts[{index}]"
            if mount.get("name") not in names:
                yield FieldError(f"{path}.name", "Not found", mount.get("name"))
            mount_path = mount.get("mountPath") or ""
            if not mount_path:
                yield FieldError(f"{path}.mountPath", "Required value")
            elif mount_path in paths:
                yield FieldError(f"{path}.mountPath", "Invalid value", mount_path,
                                 "must be unique")
            paths.add(mount_path)


def env_names(pod: Wire) -> Iterator[FieldError]:
    """Variable names: non-empty printable ASCII without '=' (relaxed validation, GA in 1.34)."""
    for where, container in _containers(pod):
        for index, variable in enumerate(container.get("env") or ()):
            path = f"{where}.env[{index}].name"
            name = variable.get("name") or ""
            if not name:
                yield FieldError(path, "Required value")
            elif any(not (" " <= c <= "~") or c == "=" for c in name):
                yield FieldError(path, "Invalid value", name,
                                 "a valid environment variable name must consist only of "
                                 "printable ASCII characters other than '='")


def probe_thresholds(pod: Wire) -> Iterator[FieldError]:
    """Liveness and startup probes succeed once; a readiness probe has no grace period."""
    for where, container in _containers(pod):
        for kind in ("livenessProbe", "startupProbe"):
            threshold = (container.get(kind) or {}).get("successThreshold", 1)
            if threshold != 1:
                yield FieldError(f"{where}.{kind}.successThreshold", "Invalid value", threshold,
                                 "must be 1")
        grace = (container.get("readinessProbe") or {}).get("terminationGracePeriodSeconds")
        if grace is not None:
            yield FieldError(f"{where}.readinessProbe.terminationGracePeriodSeconds",
                             "Invalid value", grace, "must not be set for readinessProbes")


Rule = Callable[[Wire], Iterable[FieldError]]

RULES: tuple[Rule, ...] = (
    metadata_labels,
    metadata_annotations,
    node_selector,
    container_resources,
    integer_ranges,
    port_names,
    volume_names,
    volume_mounts,
    env_names,
    probe_thresholds,
)


def validate_pod(pod: Pod) -> list[FieldError]:
    """Every rule's errors for ``pod`` (empty: the API server would accept it)."""
    wire = pod.to_api()
    return [error for rule in RULES for error in rule(wire)]

"""What a volume of API data holds: configMap, secret, downwardAPI and projected payloads.

Pure: objects come through an ``ObjectLookup``, node allocatable and the service account
token are passed in, so a payload is a function of its inputs. The result maps a
relative path to (content, mode), ready for the atomic writer. Behaviour and messages
are the Go kubelet's (``MakePayload``, ``CollectData``, the projected plugin, and the
AtomicWriter's path validation).
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from trio_kubelet.core.objects import ObjectKind, ObjectLookup, ObjectUnavailable, object_data
from trio_kubelet.model.pod import Container, Pod
from trio_kubelet.model.quantity import QuantityError, parse_quantity
from trio_kubelet.volumes.errors import FAILED_MOUNT, VolumeError
from trio_kubelet.volumes.plugins import Plugin

Payload = dict[str, tuple[bytes, int]]

DEFAULT_MODE = 0o644  # the API default of defaultMode for every kind here
NO_TOKEN = "serviceAccountToken needs an API server"
_MAX_PATH = 4096
_MAX_NAME = 255


class _Failed(Exception):
    """A payload cannot be built; the message is Go's (several are aggregated where Go does)."""


def volume_payload(
    plugin: Plugin,
    source: Mapping[str, Any],
    pod: Pod,
    lookup: ObjectLookup,
    *,
    node_allocatable: Mapping[str, Fraction],
    token: str | None = None,
) -> Payload:
    """The files of a configmap, secret, downward-api or projected volume, paths cleaned.

    ``token`` is the service account token for a projected ``serviceAccountToken``
    source, fetched by the caller. Raises ``VolumeError`` (FailedMount).
    """
    namespace = pod.metadata.namespace
    try:
        default_mode = _mode(source.get("defaultMode", DEFAULT_MODE), "defaultMode")
        if plugin == "configmap":
            payload = _object_payload("ConfigMap", source, "name", namespace, lookup, default_mode)
        elif plugin == "secret":
            payload = _object_payload(
                "Secret", source, "secretName", namespace, lookup, default_mode
            )
        elif plugin == "downward-api":
            payload = _downward_api(source.get("items") or [], pod, node_allocatable, default_mode)
        elif plugin == "projected":
            payload = _projected(source, pod, lookup, node_allocatable, token, default_mode)
        else:
            raise ValueError(f"{plugin} volumes have no payload")
        return clean_payload(payload)
    except _Failed as err:
        raise VolumeError(FAILED_MOUNT, str(err)) from None


def clean_payload(payload: Mapping[str, tuple[bytes, int]]) -> Payload:
    """The payload with its paths validated and cleaned (AtomicWriter's validatePayload).

    Paths are relative, without ``..`` and not starting with ``..`` (the writer's own
    names). Raises ``VolumeError`` (FailedMount).
    """
    cleaned: Payload = {}
    for path, content in payload.items():
        try:
            cleaned[_clean_path(path)] = content
        except _Failed as err:
            raise VolumeError(FAILED_MOUNT, str(err)) from None
    return cleaned


def _clean_path(path: str) -> str:
    if not path:
        raise _Failed(f'invalid path: must not be empty: "{path}"')
    if path.startswith("/"):
        raise _Failed(f"invalid path: must be relative path: {path}")
    if len(path) > _MAX_PATH:
        raise _Failed(f"invalid path: must be less than or equal to {_MAX_PATH} characters")
    items = path.split("/")
    for item in items:
        if item == "..":
            raise _Failed(f"invalid path: must not contain '..': {path}")
        if len(item) > _MAX_NAME:
            raise _Failed(
                f"invalid path: filenames must be less than or equal to {_MAX_NAME} characters"
            )
    clean = posixpath.normpath(path)  # safe: no ".." is left to collapse
    if clean == ".":
        raise _Failed(f"invalid path: must name a file: {path}")
    if clean.split("/")[0].startswith(".."):
        raise _Failed(f"invalid path: must not start with '..': {path}")
    return clean


def _item_mode(item: Mapping[str, Any], default_mode: int) -> int:
    mode = item.get("mode")
    return default_mode if mode is None else _mode(mode, "items.mode")


def _mode(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise _Failed(f"{where}: must be a number between 0 and 0777 (octal), both inclusive")
    return value


# -- configMap and secret ---------------------------------------------------------------------


def _object_payload(
    kind: ObjectKind,
    source: Mapping[str, Any],
    name_field: str,
    namespace: str,
    lookup: ObjectLookup,
    default_mode: int,
) -> Payload:
    """Go's MakePayload: every key, or the ``items`` key→path mappings, with their modes.

    The object is named by ``name_field`` of the source (``secretName`` in a secret volume).
    """
    name = str(source.get(name_field, ""))
    optional = bool(source.get("optional"))
    resource = kind.lower()
    try:
        obj = lookup(kind, namespace, name)
        data = object_data(kind, obj) if obj is not None else {}
    except ObjectUnavailable as err:
        raise _Failed(str(err)) from None
    if obj is None and not optional:
        raise _Failed(f'{resource} "{name}" not found')
    items = source.get("items") or []
    if not items:
        return {key: (value, default_mode) for key, value in data.items()}
    payload: Payload = {}
    for item in items:
        key = item.get("key", "")
        if key not in data:
            if optional:
                continue
            noun = "config" if kind == "ConfigMap" else "secret"
            raise _Failed(f"{resource} references non-existent {noun} key: {key}")
        payload[item.get("path", "")] = (data[key], _item_mode(item, default_mode))
    return payload


# -- downwardAPI ------------------------------------------------------------------------------


def _downward_api(
    items: list[Mapping[str, Any]],
    pod: Pod,
    node_allocatable: Mapping[str, Fraction],
    default_mode: int,
) -> Payload:
    """Go's CollectData: every item is tried, and all the failures are reported together."""
    payload: Payload = {}
    errors: list[str] = []
    for item in items:
        try:
            mode = _item_mode(item, default_mode)
            if item.get("fieldRef") is not None:
                value = _field_value(pod, item["fieldRef"].get("fieldPath", ""))
            elif item.get("resourceFieldRef") is not None:
                value = _resource_value(pod, item["resourceFieldRef"], node_allocatable)
            else:
                value = ""
        except _Failed as err:
            errors.append(str(err))
            continue
        payload[item.get("path", "")] = (value.encode(), mode)
    if errors:
        raise _Failed(_aggregate(errors))
    return payload


def _field_value(pod: Pod, field_path: str) -> str:
    """Go's ExtractFieldPathAsString: the metadata fields a downwardAPI volume may show."""
    meta = pod.metadata
    if field_path.endswith("']") and "['" in field_path[:-2]:
        path, subscript = field_path[:-2].split("['", 1)
        if path == "metadata.labels":
            return meta.labels.get(subscript, "")
        if path == "metadata.annotations":
            return meta.annotations.get(subscript, "")
        raise _Failed(f'fieldPath "{field_path}" does not support subscript')
    simple: dict[str, Callable[[], str]] = {
        "metadata.name": lambda: meta.name,
        "metadata.namespace": lambda: meta.namespace,
        "metadata.uid": lambda: meta.uid,
        "metadata.labels": lambda: _format_map(meta.labels),
        "metadata.annotations": lambda: _format_map(meta.annotations),
    }
    if field_path not in simple:
        raise _Failed(f"unsupported fieldPath: {field_path}")
    return simple[field_path]()


def _format_map(values: Mapping[str, str]) -> str:
    """``key="value"`` lines in key order, values quoted as Go's %q does."""
    return "\n".join(f"{key}={_go_quote(values[key])}" for key in sorted(values))


_GO_ESCAPES = {
    "\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t", "\v": r"\v",
    '"': r"\"", "\\": r"\\",
}


def _go_quote(text: str) -> str:
    out = []
    for char in text:
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


def _resource_value(
    pod: Pod, ref: Mapping[str, Any], node_allocatable: Mapping[str, Fraction]
) -> str:
    """A container's request or limit in units of the divisor, rounded up.

    An unset (or zero) limit of cpu, memory or ephemeral-storage reads as the node's
    allocatable amount; an unset request as the limit the container declares (the API
    server's defaulting), else 0.
    """
    name = ref.get("containerName") or ""
    container = _find_container(pod, name)
    resource = str(ref.get("resource", ""))
    kind, _, resource_name = resource.partition(".")
    if kind not in ("limits", "requests") or not (
        resource_name in ("cpu", "memory", "ephemeral-storage")
        or resource_name.startswith("hugepages-")
    ):
        raise _Failed(f"unsupported container resource : {resource}")
    try:
        divisor = parse_quantity(ref.get("divisor") or 0) or Fraction(1)
        limit = _quantity(container.resources.limits.get(resource_name))
        if kind == "limits":
            value = limit
            if not value and not resource_name.startswith("hugepages-"):
                value = node_allocatable.get(resource_name, Fraction(0))
        else:
            value = _quantity(container.resources.requests.get(resource_name, limit))
    except QuantityError as err:
        raise _Failed(str(err)) from None
    if resource_name == "cpu":  # whole millicores, as Quantity.MilliValue rounds
        value, divisor = Fraction(math.ceil(value * 1000)), Fraction(math.ceil(divisor * 1000))
    else:  # whole bytes, as Quantity.Value rounds
        value, divisor = Fraction(math.ceil(value)), Fraction(math.ceil(divisor))
    if not divisor:
        raise _Failed(f"invalid divisor for {resource}: {ref.get('divisor')}")
    return str(math.ceil(value / divisor))


def _quantity(value: str | int | float | Fraction | None) -> Fraction:
    if value is None:
        return Fraction(0)
    if isinstance(value, Fraction):
        return value
    return parse_quantity(value)


def _find_container(pod: Pod, name: str) -> Container:
    for container in (*pod.spec.containers, *pod.spec.init_containers):
        if container.name == name:
            return container
    raise _Failed(f"container {name} not found")


# -- projected --------------------------------------------------------------------------------


def _projected(
    source: Mapping[str, Any],
    pod: Pod,
    lookup: ObjectLookup,
    node_allocatable: Mapping[str, Fraction],
    token: str | None,
    default_mode: int,
) -> Payload:
    """Every source's files in one volume; all failing sources are reported together."""
    namespace = pod.metadata.namespace

    def projection_payload(projection: Mapping[str, Any]) -> Payload:
        if (part := projection.get("configMap")) is not None:
            return _object_payload("ConfigMap", part, "name", namespace, lookup, default_mode)
        if (part := projection.get("secret")) is not None:
            return _object_payload("Secret", part, "name", namespace, lookup, default_mode)
        if (part := projection.get("downwardAPI")) is not None:
            return _downward_api(part.get("items") or [], pod, node_allocatable, default_mode)
        if (part := projection.get("serviceAccountToken")) is not None:
            return _token(part, pod, token, default_mode)
        kinds = ", ".join(sorted(projection)) or "nothing"
        raise _Failed(f"unsupported projected volume source: {kinds}")

    payload: Payload = {}
    errors: list[str] = []
    for projection in source.get("sources") or []:
        try:
            payload |= projection_payload(projection)
        except _Failed as err:
            errors.append(str(err))
    if errors:
        raise _Failed(_aggregate(errors))
    return payload


def _token(source: Mapping[str, Any], pod: Pod, token: str | None, default_mode: int) -> Payload:
    if token is None:
        raise _Failed(NO_TOKEN)
    # With an fsGroup the token is 0600 and ownership adds group read: 0640, never world.
    mode = 0o600 if pod.spec.security_context.fs_group is not None else default_mode
    return {source.get("path", ""): (token.encode(), mode)}


def _aggregate(errors: list[str]) -> str:
    """Go's utilerrors aggregate message: one error bare, several as ``[a, b]``, deduplicated."""
    unique = list(dict.fromkeys(errors))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"

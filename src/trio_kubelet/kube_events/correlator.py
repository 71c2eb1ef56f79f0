"""Kubernetes Events as the kubelet writes them, and the correlation that keeps them few.

The correlator follows client-go's EventCorrelator: similar events (alike except the
message) are folded into one aggregate event, an identical event updates the Event
already written (count + 1) instead of creating another, and a token bucket per
source and object drops the rest. Pure: time is the event's own timestamp, memory is
bounded by LRU caches.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, TypeVar

from trio_kubelet.core.timestamps import format_time
from trio_kubelet.model.pod import Pod

EventType = Literal["Normal", "Warning"]
JSON = dict[str, Any]

COMPONENT = "kubelet"
CACHE_SIZE = 4096  # entries in each LRU cache (client-go's maxLruCacheEntries)
SPAM_BURST = 25  # events a source may send about one object at once...
SPAM_REFILL = 1 / 300  # ...then one more every 5 minutes
AGGREGATE_AFTER = 10  # distinct messages of similar events before they are combined...
AGGREGATE_WINDOW = 600.0  # ...when each came within this many seconds of the previous one
AGGREGATE_PREFIX = "(combined from similar events): "


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The core/v1 ObjectReference an event is about (``involvedObject``)."""

    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = ""
    field_path: str = ""
    resource_version: str = ""

    def to_api(self) -> dict[str, str]:
        fields = {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "apiVersion": self.api_version,
            "resourceVersion": self.resource_version,
            "fieldPath": self.field_path,
        }
        return {key: value for key, value in fields.items() if value}


def pod_ref(pod: Pod, container: str | None = None) -> ObjectRef:
    """The pod, or one of its containers as ``spec.containers{name}`` (GenerateContainerRef).

    A container the spec does not name (any more) leaves the field path empty, so the
    event is still shown on the pod.
    """
    meta = pod.metadata
    return ObjectRef(
        kind="Pod",
        name=meta.name,
        namespace=meta.namespace,
        uid=meta.uid,
        api_version="v1",
        field_path=_field_path(pod, container) if container is not None else "",
        resource_version=meta.resource_version or "",
    )


def _field_path(pod: Pod, container: str) -> str:
    spec = pod.spec
    for path, group in (
        ("spec.containers", spec.containers),
        ("spec.initContainers", spec.init_containers),
        ("spec.ephemeralContainers", spec.ephemeral_containers),
    ):
        if any(c.name == container for c in group):
            return f"{path}{{{container}}}"
    return ""


def node_ref(node_name: str) -> ObjectRef:
    """The Node as the Go kubelet refers to it: no API version, the name doubles as UID."""
    return ObjectRef(kind="Node", name=node_name, uid=node_name)


@dataclass(frozen=True, slots=True)
class Event:
    """A core/v1 Event, as the kubelet creates (count 1) or updates (count > 1) it."""

    involved: ObjectRef
    type: EventType
    reason: str
    message: str
    host: str  # the node: source.host and reportingInstance
    first_timestamp: float  # epoch seconds
    last_timestamp: float
    name: str  # "<object name>.<hex unix nanoseconds>", unique per occurrence
    count: int = 1

    @property
    def namespace(self) -> str:
        return self.involved.namespace or "default"

    def to_api(self) -> JSON:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "involvedObject": self.involved.to_api(),
            "reason": self.reason,
            "message": self.message,
            "source": {"component": COMPONENT, "host": self.host},
            "firstTimestamp": format_time(self.first_timestamp),
            "lastTimestamp": format_time(self.last_timestamp),
            "count": self.count,
            "type": self.type,
            "reportingComponent": COMPONENT,
            "reportingInstance": self.host,
        }

    def update_patch(self) -> JSON:
        """What changes when the Event is seen again (client-go patches exactly these)."""
        return {
            "count": self.count,
            "lastTimestamp": format_time(self.last_timestamp),
            "message": self.message,
        }


def new_event(
    ref: ObjectRef, type: EventType, reason: str, message: str, *, host: str, nanos: int
) -> Event:
    """A first occurrence at ``nanos`` (unix nanoseconds), named after it as client-go does."""
    seconds = nanos / 1e9
    return Event(ref, type, reason, message, host, seconds, seconds, f"{ref.name}.{nanos:x}")


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A map that forgets its least recently used entry beyond ``size`` entries."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


@dataclass(frozen=True, slots=True)
class Write:
    """An event to send: a new Event (POST), or an update of the one named the same (PATCH)."""

    event: Event
    update: bool


@dataclass(slots=True)
class _Similar:
    """The distinct messages of similar events seen lately (an ordered set)."""

    last: float
    messages: dict[str, None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Written:
    name: str
    first_timestamp: float
    count: int


@dataclass(frozen=True, slots=True)
class _Bucket:
    tokens: float
    at: float


class EventCorrelator:
    """Decides, event by event, what reaches the API server (client-go's EventCorrelator)."""

    def __init__(self, cache_size: int = CACHE_SIZE) -> None:
        self._similar: LRU[tuple[str, ...], _Similar] = LRU(cache_size)
        self._written: LRU[tuple[str, ...], _Written] = LRU(cache_size)
        self._buckets: LRU[tuple[str, ...], _Bucket] = LRU(cache_size)

    def correlate(self, event: Event) -> Write | None:
        """Aggregate, then deduplicate, then rate-limit; None when the event is dropped.

        A dropped duplicate still counts, so the next update carries the true count.
        """
        event, key = self._aggregate(event)
        written = self._written.get(key)
        if written is not None:
            event = replace(
                event,
                name=written.name,
                first_timestamp=written.first_timestamp,
                count=written.count + 1,
            )
        self._written.put(key, _Written(event.name, event.first_timestamp, event.count))
        if not self._take_token(event):
            return None
        return Write(event, update=written is not None)

    def _aggregate(self, event: Event) -> tuple[Event, tuple[str, ...]]:
        """The event, or its aggregate once similar ones carried enough distinct messages."""
        now = event.last_timestamp
        similar_key = (*_source_object(event), event.type, event.reason)
        similar = self._similar.get(similar_key)
        if similar is None or now - similar.last > AGGREGATE_WINDOW:
            similar = _Similar(last=now)
        similar.messages[event.message] = None
        similar.last = now
        self._similar.put(similar_key, similar)
        if len(similar.messages) < AGGREGATE_AFTER:
            ref = event.involved
            return event, (*similar_key, ref.field_path, event.message)
        del similar.messages[next(iter(similar.messages))]  # stay at the threshold
        aggregate = replace(event, message=AGGREGATE_PREFIX + event.message)
        return aggregate, ("aggregate", *similar_key)

    def _take_token(self, event: Event) -> bool:
        """The spam filter: a token bucket per source and involved object."""
        key = _source_object(event)
        now = event.last_timestamp
        bucket = self._buckets.get(key) or _Bucket(float(SPAM_BURST), now)
        tokens = min(float(SPAM_BURST), bucket.tokens + max(0.0, now - bucket.at) * SPAM_REFILL)
        allowed = tokens >= 1.0
        self._buckets.put(key, _Bucket(tokens - 1.0 if allowed else tokens, max(now, bucket.at)))
        return allowed


def _source_object(event: Event) -> tuple[str, ...]:
    ref = event.involved
    return (event.host, ref.kind, ref.namespace, ref.name, ref.uid, ref.api_version)

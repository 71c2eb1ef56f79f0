"""The events every source sends to the reconciler: one discriminated union.

Events are pydantic models so the recorder can write them as JSON unchanged and
the replayer can read them back. Sources only describe the world; the sync loop
decides what the descriptions mean.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from trio_kubelet.model.pod import Pod


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True)


class ManifestProblem(BaseModel):
    """A manifest file (or one document in it) that could not be turned into a pod."""

    model_config = ConfigDict(frozen=True)

    file: str
    reason: str


class PodSetUpdate(_Event):
    """The complete set of pods one source wants now (the PodConfig "SET" operation).

    The sync loop diffs it against the previous set from the same source, so a
    pod missing from the set is removed and a changed one is updated.
    """

    kind: Literal["pod_set"] = "pod_set"
    source: str
    pods: list[Pod]
    problems: list[ManifestProblem] = Field(default_factory=list)


class PodLifecycleEvent(_Event):
    """A container or sandbox changed state: seen by a PLEG relist, or told by the runtime's
    container event stream (``via``)."""

    kind: Literal["pleg"] = "pleg"
    pod_uid: str
    type: Literal["ContainerStarted", "ContainerDied", "ContainerRemoved", "ContainerChanged"]
    container_id: str
    via: Literal["relist", "stream"] = "relist"


StreamState = Literal["open", "closed", "unsupported"]


class ContainerEventStream(_Event):
    """The runtime's container event stream (CRI GetContainerEvents) is proven open, was
    lost, or is not offered (``unsupported``, containerd 1.6). While it is open PLEG relists
    only as a safety net; a recording shows which changes it told (``via="stream"``)."""

    kind: Literal["event_stream"] = "event_stream"
    state: StreamState
    error: str = ""


class RelistDone(_Event):
    """PLEG finished a relist (healthy) or failed one (runtime unreachable)."""

    kind: Literal["relist"] = "relist"
    ok: bool
    duration: float = 0.0
    error: str = ""


class ProbeResultEvent(_Event):
    """A probe worker published a new result for one container instance.

    ``forget`` is an older instance of the same container whose result of this
    probe type is void now.
    """

    kind: Literal["probe"] = "probe"
    pod_uid: str
    container_name: str
    container_id: str
    probe: Literal["liveness", "readiness", "startup"]
    result: Literal["success", "failure", "unknown"]
    forget: str = ""

class OOMEvent(_Event):
    """The kernel OOM-killed a process in a container."""

    kind: Literal["oom"] = "oom"
    container_id: str
    pod_uid: str = ""
    pod_name: str = ""
    pod_namespace: str = ""
    container_name: str = ""
    time: float  # epoch seconds when the agent saw it
    count: int  # OOM kills seen in this container so far (container_oom_events_total)
    process: str = ""  # the killed process, when /dev/kmsg named it
    pid: int = 0


class NodeConditions(_Event):
    """The node conditions one manager reports now (``eviction``: the pressure conditions;
    ``shutdown``: NodeShutdown). Admission refuses new pods by the union of the latest."""

    kind: Literal["node_conditions"] = "node_conditions"
    source: Literal["eviction", "shutdown"]
    conditions: list[str]


class EvictPod(_Event):
    """Kill a pod with ``grace`` and mark it Failed with ``reason`` and ``message``: the
    eviction manager's choice (Evicted) or a graceful node shutdown's (Terminated)."""

    kind: Literal["evict"] = "evict"
    pod_uid: str
    message: str
    grace: int
    reason: str


class ResyncTick(_Event):
    """Periodic resync of every pod (syncFrequency) and retry of pods whose sync failed."""

    kind: Literal["resync"] = "resync"


Event = Annotated[
    PodSetUpdate
    | PodLifecycleEvent
    | RelistDone
    | ContainerEventStream
    | ResyncTick
    | OOMEvent
    | ProbeResultEvent
    | NodeConditions
    | EvictPod,
    Field(discriminator="kind"),
]

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)

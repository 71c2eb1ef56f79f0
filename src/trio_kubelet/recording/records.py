"""The lines of a recording (JSON Lines): header, events, CRI answers, decisions, statuses.

A recording is a complete account of why the agent did what it did: every event
the sync loop consumed, every CRI call and its answer, and for every pod sync the
inputs of the pure decisions (the pod spec version, the observed runtime state,
the wall time) with the decisions that came out. ``t`` is trio's clock (seconds
since the agent started); ``now`` is the wall time the decision was given.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

FORMAT_VERSION = 1


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    t: float = 0.0


class Header(_Record):
    """First line of every recording file (also after a rotation)."""

    kind: Literal["header"] = "header"
    format: int = FORMAT_VERSION
    agent_version: str
    node: str
    start_time: float  # epoch seconds at t == 0
    config: dict[str, Any]
    sources: list[str] = Field(default_factory=list)
    rotated_from: str | None = None


class EventRecord(_Record):
    """One event as the sync loop consumed it (``events.Event`` as JSON)."""

    kind: Literal["event"] = "event"
    seq: int
    event: dict[str, Any]


class CRIRecord(_Record):
    """One CRI call and its answer or error."""

    kind: Literal["cri"] = "cri"
    method: str
    request: dict[str, Any]
    response: dict[str, Any] | None = None
    error: str | None = None
    error_code: str | None = None
    duration: float = 0.0


class ContainerStart(BaseModel):
    """The crash-loop gate for one container the actions asked to start: input and answer.

    ``prior_delay``/``prior_update`` are the backoff entry before the gate (None: no
    entry), so each gate can be re-checked on its own.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    container: str
    key: str
    prior_delay: float | None = None
    prior_update: float | None = None
    allowed: bool
    remaining: float = 0.0
    delay: float = 0.0


class DecisionRecord(_Record):
    """One pod sync: the decision inputs and what the pure core decided."""

    kind: Literal["decision"] = "decision"
    uid: str
    pod: str  # name_namespace
    spec_seq: int  # seq of the event that last set this pod's spec (-1: teardown)
    now: float
    observed: dict[str, Any]  # core.observed.RuntimePodStatus as JSON
    liveness: dict[str, str] = Field(default_factory=dict)
    startup: dict[str, str] = Field(default_factory=dict)
    actions: dict[str, Any]  # core.actions.PodActions as JSON (reasons included)
    starts: list[ContainerStart] = Field(default_factory=list)


class AdmissionRecord(_Record):
    """Whether a new pod was admitted: the inputs of ``core.admission.admit`` and its answer.

    ``admitted`` maps the UIDs of the pods already admitted to the seq of the event
    that set their specs; ``allocatable`` holds the node's figures as fractions;
    ``node_conditions`` the pressure conditions the eviction manager reported then.
    """

    kind: Literal["admission"] = "admission"
    uid: str
    pod: str
    spec_seq: int
    admitted: dict[str, int]
    allocatable: dict[str, str]
    node_conditions: list[str] = Field(default_factory=list)
    reason: str | None = None  # None: admitted
    message: str | None = None


class EvictionRecord(_Record):
    """A round that chose a pod to evict: the inputs of ``core.eviction.choose_victim``.

    ``actionable`` names the thresholds met (signal, hard?), most urgent first, as the
    recording's configuration defines them; ``observations`` maps a signal to
    [available, capacity, time]; ``candidates`` maps the active pods' UIDs (in the order
    the loop gave them) to the seq of the event that set their specs; ``usage`` holds
    each pod's ``PodUsage`` fields; ``refused`` the pods whose workers declined.
    """

    kind: Literal["eviction"] = "eviction"
    actionable: list[tuple[str, bool]]
    observations: dict[str, tuple[int, int, float]]
    dedicated_image_fs: bool
    candidates: dict[str, int]
    usage: dict[str, dict[str, Any]]
    refused: list[str] = Field(default_factory=list)
    uid: str | None = None  # None: no pod could be evicted
    message: str | None = None
    grace: int | None = None


class AssessRecord(_Record):
    """An eviction round whose verdict mattered (the node's conditions changed, or a
    threshold was actionable): the inputs and the verdict of ``core.eviction.assess``.

    Thresholds are named [signal, hard], as the recording's configuration defines them;
    observations map a signal to [available, capacity, time]. ``first_observed``,
    ``condition_seen``, ``met`` and ``last_observations`` are the state the round began
    with; ``conditions`` and ``actionable`` (most urgent first) what it decided.
    """

    kind: Literal["assess"] = "assess"
    now: float
    observations: dict[str, tuple[int, int, float]]
    first_observed: list[tuple[str, bool, float]]
    condition_seen: dict[str, float]
    met: list[tuple[str, bool]]
    last_observations: dict[str, tuple[int, int, float]]
    conditions: list[str]
    actionable: list[tuple[str, bool]]


class StorageEvictionRecord(_Record):
    """A round that found pods past their own local storage limits: the inputs of
    ``core.eviction.storage_overruns`` and what it found.

    ``candidates`` maps the active pods' UIDs (in the loop's order) to the seq of the
    event that set their specs; ``usage`` holds each candidate's ``StorageUsage``
    fields; ``overruns`` rows are [uid, limit, message]; ``refused`` the pods whose
    workers declined.
    """

    kind: Literal["storage_eviction"] = "storage_eviction"
    dedicated_image_fs: bool
    candidates: dict[str, int]
    usage: dict[str, dict[str, Any]]
    overruns: list[tuple[str, str, str]]
    refused: list[str] = Field(default_factory=list)


class ContainerGCRecord(_Record):
    """A container GC pass that removed something: the inputs of
    ``core.container_gc.plan_container_gc`` and the plan.

    ``policy`` is [min_age, max_per_pod_container, max_containers] (flags, not in the
    header's configuration); ``containers`` rows are [id, pod_uid, name, state,
    created_at, attempt, sandbox_id, log_path] and ``sandboxes`` rows [id, pod_uid,
    state, created_at, attempt]; ``existing_pods`` holds only the UIDs the runtime or
    the log directory mention (the rest cannot change the plan).
    """

    kind: Literal["container_gc"] = "container_gc"
    now: float
    policy: tuple[float, int, int]
    sources_ready: bool
    containers: list[tuple[str, str, str, str, float, int, str, str]]
    sandboxes: list[tuple[str, str, str, float, int]]
    log_dirs: list[str]
    existing_pods: list[str]
    removed_containers: list[str]
    removed_sandboxes: list[str]
    removed_log_dirs: list[str]


class ImageGCRecord(_Record):
    """An image GC pass that chose images to remove: the inputs of ``core.image_gc``'s
    choices (the policy comes from the header's configuration) and what they chose.

    ``images`` rows are [id, size, pinned, first_detected, last_used] as the pass
    detected them, times on trio's clock and None for "never". ``image_fs`` is
    [capacity, available] read after the age removals (``removed_by_age``: those of
    ``expired`` that succeeded); None for the eviction manager's reclaim, which frees
    all it can and removes nothing for age.
    """

    kind: Literal["image_gc"] = "image_gc"
    now: float
    started_at: float
    images: list[tuple[str, int, bool, float | None, float | None]]
    in_use: list[str]
    image_fs: tuple[int, int] | None
    expired: list[str]
    removed_by_age: list[str]
    removals: list[str]


class LogRotationRecord(_Record):
    """A container log that reached the rotation size: the inputs of
    ``core.log_rotation.plan_rotation`` and the plan.

    ``log`` is the live log's path relative to the pod logs directory; ``siblings`` the
    names in its directory; ``policy`` [max_size, max_files]; ``stamp`` the new name's
    suffix (the wall clock, formatted). ``rotate_to`` is None when the plan waited.
    """

    kind: Literal["log_rotation"] = "log_rotation"
    log: str
    size: int
    siblings: list[str]
    policy: tuple[int, int]
    stamp: str
    removed: list[str]
    compressed: list[str]
    rotate_to: str | None


class StatusRecord(_Record):
    """A pod status the worker published, with the inputs it was decided from.

    ``decided`` says which pure function decided it: ``sync`` (``compute_pod_status``),
    ``rejected`` (``rejected_status``: admission's ``reason``/``message``) or ``evicted``
    (``compute_pod_status`` of a terminal pod, then ``evicted_status`` with ``reason``,
    ``message`` and ``disruption``, False for a pod past its active deadline); None in
    recordings made before status inputs were kept, which replay cannot re-check.
    ``prior``: the worker had published a status before (the previous one is this pod's
    last status record). ``errors`` maps a container to the (reason, message) of its last
    failed start; ``readiness``/``startup`` are probe results by container ID.
    """

    kind: Literal["status"] = "status"
    uid: str
    pod: str
    status: dict[str, Any]
    decided: Literal["sync", "rejected", "evicted"] | None = None
    spec_seq: int = -1
    now: float = 0.0
    observed: dict[str, Any] = Field(default_factory=dict)
    prior: bool = False
    errors: dict[str, tuple[str, str]] = Field(default_factory=dict)
    readiness: dict[str, str] = Field(default_factory=dict)
    startup: dict[str, str] = Field(default_factory=dict)
    host_ip: str = ""
    runtime_name: str = ""
    terminal: bool = False
    reason: str = ""
    message: str = ""
    disruption: bool = True  # absent (True) in recordings made before it was kept


class InFlightSpec(BaseModel):
    """A pod spec version a running sync decided on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uid: str
    seq: int
    pod: dict[str, Any]


class SnapshotRecord(_Record):
    """The sources' pod sets when a rotated file starts, so the file replays on its own.

    ``spec_seqs`` maps each pod UID to the seq of the event that set its spec;
    ``in_flight`` holds the spec versions of syncs still running at the rotation
    (their decisions land in the new file but may use an older spec).
    """

    kind: Literal["snapshot"] = "snapshot"
    pod_sets: dict[str, list[dict[str, Any]]]
    spec_seqs: dict[str, int]
    in_flight: list[InFlightSpec] = Field(default_factory=list)


class TeardownRecord(_Record):
    """A pod's containers and sandboxes were removed (the end of its lanes)."""

    kind: Literal["teardown"] = "teardown"
    uid: str
    pod: str


Record = Annotated[
    Header
    | EventRecord
    | SnapshotRecord
    | CRIRecord
    | DecisionRecord
    | AdmissionRecord
    | EvictionRecord
    | AssessRecord
    | StorageEvictionRecord
    | ContainerGCRecord
    | ImageGCRecord
    | LogRotationRecord
    | StatusRecord
    | TeardownRecord,
    Field(discriminator="kind"),
]

RECORD_ADAPTER: TypeAdapter[Record] = TypeAdapter(Record)

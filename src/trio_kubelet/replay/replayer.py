"""Replaying a recording: recompute every recorded decision with the pure core and compare.

The replayer rebuilds the desired state the sync loop had (``PodConfig`` fed the
recorded events, or a rotated file's snapshot), keeps every pod spec version by
``(uid, seq)`` — the version the event with that seq set — and, for each recorded
pod sync, calls ``compute_pod_actions`` on the recorded spec version and observed
runtime state and ``gate_container_start`` on each recorded crash-loop gate. Any
difference from the recording is a divergence. Nothing here does I/O; time only
advances in ``replay_in_virtual_time``, which walks trio's clock along the recording.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any, TypeVar

import trio
import trio.testing
from pydantic import ValidationError

from trio_kubelet.config import ConfigError, KubeletConfiguration
from trio_kubelet.core.actions import PodActions, compute_pod_actions
from trio_kubelet.core.admission import Rejection, admit, rejected_status
from trio_kubelet.core.backoff import (
    Backoff,
    BackoffEntry,
    StartGate,
    backoff_key,
    format_duration,
    gate_container_start,
)
from trio_kubelet.core.container_gc import GCContainer, GCPolicy, GCSandbox, plan_container_gc
from trio_kubelet.core.eviction import (
    EvictionState,
    Observation,
    PodUsage,
    StorageUsage,
    Threshold,
    assess,
    choose_victim,
    evicted_status,
    storage_overruns,
)
from trio_kubelet.core.image_gc import (
    NEVER,
    ImageFs,
    ImageGCPolicy,
    ImageRecord,
    bytes_to_free,
    choose_for_space,
    eviction_order,
    expired_images,
)
from trio_kubelet.core.observed import (
    ContainerState,
    ProbeResult,
    RuntimeContainer,
    RuntimePodStatus,
    SandboxState,
)
from trio_kubelet.core.phase import compute_pod_status
from trio_kubelet.events import EVENT_ADAPTER, PodSetUpdate
from trio_kubelet.images.gc import image_gc_policy
from trio_kubelet.model.pod import Container, Pod, PodStatus
from trio_kubelet.reconcile.podconfig import PodConfig
from trio_kubelet.recording.codec import (
    actions_to_json,
    observed_from_json,
    probe_results_from_json,
)
from trio_kubelet.recording.records import (
    AdmissionRecord,
    AssessRecord,
    ContainerGCRecord,
    ContainerStart,
    DecisionRecord,
    EventRecord,
    EvictionRecord,
    Header,
    ImageGCRecord,
    Record,
    SnapshotRecord,
    StatusRecord,
    StorageEvictionRecord,
)
from trio_kubelet.replay.reader import NumberedRecord, RecordingError, field_path
from trio_kubelet.resources.eviction import EvictionConfig

# How far trio's clock may lag behind the record being replayed (see replay_in_virtual_time).
CLOCK_STEP = 0.01
# Gate times are sums and differences of epoch seconds: equal up to float rounding.
GATE_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first decision the replay recomputed differently from the recording."""

    line: int
    event_index: int  # events consumed before this decision
    pod: str
    reason: str
    expected: dict[str, Any]  # as recorded
    actual: dict[str, Any]  # as replayed
    diff: str  # unified diff of the two, as sorted, indented JSON


@dataclass(frozen=True, slots=True)
class DecisionTrace:
    """One replayed pod sync, as the trace prints it."""

    line: int
    t: float  # seconds since the recording's header
    pod: str
    uid: str
    summary: str  # e.g. "kill app (LivenessProbe); start app"
    gates: tuple[str, ...] = ()  # gates worth showing, e.g. "app: back-off 20s, 3.1s left"
    inputs: tuple[str, ...] = ()  # with explain: the observed state behind the decision
    reasons: tuple[str, ...] = ()  # with explain: why, in words
    diverged: bool = False


@dataclass
class ReplayResult:
    """The replayed trace and what the re-check found."""

    trace: list[DecisionTrace] = field(default_factory=list)
    records: int = 0
    events: int = 0
    decisions: int = 0
    statuses: int = 0  # pod statuses re-decided
    admissions: int = 0
    evictions: int = 0
    gc_passes: int = 0  # container and image GC passes that removed something
    gates: int = 0
    divergences: int = 0
    divergence: Divergence | None = None  # the first one
    end: float = 0.0  # relative time of the last record replayed

    @property
    def ok(self) -> bool:
        return self.divergences == 0


#: Every record kind the replay acts on, registered once (``@_replays``) with the method
#: that applies it (events, snapshots) or re-decides it with the pure core and explains it
#: in the trace (every decision kind); ``Replayer.feed`` dispatches on the record's type.
_HANDLERS: dict[type[Any], Callable[[Replayer, int, float, Any], None]] = {}

_R = TypeVar("_R")


def _replays(
    kind: type[_R],
) -> Callable[[Callable[[Replayer, int, float, _R], None]],
              Callable[[Replayer, int, float, _R], None]]:
    def register(
        handler: Callable[[Replayer, int, float, _R], None],
    ) -> Callable[[Replayer, int, float, _R], None]:
        _HANDLERS[kind] = handler
        return handler

    return register


def _redecide_status(pod: Pod, record: StatusRecord, previous: PodStatus | None) -> PodStatus:
    """The status the worker's pure functions give for the recorded inputs."""
    if record.decided == "rejected":
        return rejected_status(pod, Rejection(record.reason, record.message))
    status = compute_pod_status(
        pod,
        observed_from_json(record.observed),
        now=record.now,
        previous=previous,
        sync_errors=record.errors,
        readiness=probe_results_from_json(record.readiness),
        startup=probe_results_from_json(record.startup),
        host_ip=record.host_ip,
        runtime_name=record.runtime_name,
        pod_is_terminal=record.terminal,
    )
    if record.decided == "evicted":
        status = evicted_status(status, record.message, record.now, record.reason)
    return status


def json_diff(expected: Any, actual: Any) -> str:
    """A unified diff of two JSON values (recorded vs replayed)."""
    before = json.dumps(expected, sort_keys=True, indent=2).splitlines()
    after = json.dumps(actual, sort_keys=True, indent=2).splitlines()
    return "\n".join(difflib.unified_diff(before, after, "recorded", "replayed", lineterm=""))


class Replayer:
    """Consumes a recording record by record (``feed``); the outcome is ``result``."""

    def __init__(
        self, *, until: float | None = None, pod: str | None = None, explain: bool = False
    ) -> None:
        self.until = until
        self.pod = pod
        self.explain = explain
        self.result = ReplayResult()
        self.header: Header | None = None
        # Replaced by one expecting the recorded sources once the header is read.
        self._config = PodConfig(())
        self._versions: dict[tuple[str, int], Pod] = {}
        self._pod_matches: dict[str, bool] = {}
        self._eviction_config: EvictionConfig | None = None
        self._image_gc_policy: ImageGCPolicy | None = None
        self._statuses: dict[str, PodStatus] = {}  # each pod's last recorded status

    # -- time ---------------------------------------------------------------------------------

    def relative(self, line: int, record: Record) -> float:
        """Seconds between the recording's (first) header and ``record``."""
        if self.header is None:
            if not isinstance(record, Header):
                raise RecordingError(line, "a recording starts with a header")
            self.header = record
            self._config = PodConfig(record.sources)
        return record.t - self.header.t

    def in_range(self, t: float) -> bool:
        return self.until is None or t <= self.until

    # -- records ------------------------------------------------------------------------------

    def feed(self, line: int, record: Record) -> None:
        """Apply one record; records past ``until`` are skipped.

        Skipped, not the end: a decision is written once it has been carried out, so
        an earlier decision can follow a later event in the file.
        """
        t = self.relative(line, record)
        if not self.in_range(t):
            return
        result = self.result
        result.records += 1
        result.end = max(result.end, t)
        handler = _HANDLERS.get(type(record))
        if handler is not None:
            handler(self, line, t, record)

    @_replays(EventRecord)
    def _event(self, line: int, t: float, record: EventRecord) -> None:
        self.result.events += 1
        try:
            event = EVENT_ADAPTER.validate_python(record.event)
        except ValidationError as err:
            raise RecordingError(line, _describe("event", err)) from None
        if isinstance(event, PodSetUpdate):
            for change in self._config.apply(event):
                if change.pod is not None:
                    self._versions[(change.uid, record.seq)] = change.pod

    @_replays(SnapshotRecord)
    def _snapshot(self, line: int, t: float, record: SnapshotRecord) -> None:
        """Start over from the pod sets a rotated file begins with."""
        config = PodConfig(self.header.sources if self.header else ())
        for source, wire_pods in record.pod_sets.items():
            pods = []
            for index, wire in enumerate(wire_pods):
                try:
                    pods.append(Pod.model_validate(wire))
                except ValidationError as err:
                    raise RecordingError(
                        line, _describe(f"pod_sets.{source}[{index}]", err)
                    ) from None
            config.apply(PodSetUpdate(source=source, pods=pods))
        desired = config.desired()
        for uid, seq in record.spec_seqs.items():
            pod = desired.get(uid)
            if pod is not None:
                self._versions.setdefault((uid, seq), pod)
        for index, spec in enumerate(record.in_flight):
            try:
                self._versions.setdefault((spec.uid, spec.seq), Pod.model_validate(spec.pod))
            except ValidationError as err:
                raise RecordingError(line, _describe(f"in_flight[{index}].pod", err)) from None
        self._config = config

    # -- decisions ----------------------------------------------------------------------------

    @_replays(DecisionRecord)
    def _decision(self, line: int, t: float, record: DecisionRecord) -> None:
        if self.pod is not None and not self._wanted(record.pod):
            return
        self.result.decisions += 1
        observed, liveness, startup = _decision_inputs(line, record)
        pod = self._versions.get((record.uid, record.spec_seq))
        if pod is None:
            self._diverge(
                line,
                record.pod,
                f"the spec of pod {record.pod} ({record.uid}) set by event seq "
                f"{record.spec_seq} is not in the recording (the file starts after that "
                "event and has no snapshot of it)",
                record.actions,
                {},
            )
            self.result.trace.append(
                DecisionTrace(line, t, record.pod, record.uid, "(pod spec unknown)", diverged=True)
            )
            return
        actions = compute_pod_actions(pod, observed, liveness=liveness, startup=startup)
        replayed = actions_to_json(actions)
        diverged = replayed != record.actions
        if diverged:
            self._diverge(
                line,
                record.pod,
                "the replayed actions differ from the recorded ones",
                record.actions,
                replayed,
            )
        gates: list[str] = []
        reasons: list[str] = list(record.actions.get("reasons", ())) if self.explain else []
        to_start = _names_to_start(pod, record.actions)
        for index, start in enumerate(record.starts):
            gate = self._check_gate(line, index, record, pod, observed, start, to_start)
            diverged |= gate is None
            if gate is None:
                continue
            newest = observed.find(start.container)
            text = _gate_text(start.container, newest, gate)
            if text:
                gates.append(text)
            if self.explain:
                reasons.extend(_gate_reason(pod, start, newest, gate))
        inputs = _explain_inputs(pod, record, observed) if self.explain else ()
        self.result.trace.append(
            DecisionTrace(
                line,
                t,
                record.pod,
                record.uid,
                summarize(pod, observed, actions),
                tuple(gates),
                tuple(inputs),
                tuple(reasons),
                diverged,
            )
        )

    @_replays(StatusRecord)
    def _status(self, line: int, t: float, record: StatusRecord) -> None:
        """Re-decide a published pod status from the inputs recorded with it."""
        previous = self._statuses.get(record.uid) if record.prior else None
        try:
            self._statuses[record.uid] = PodStatus.model_validate(record.status)
        except ValidationError as err:
            raise RecordingError(line, _describe("status", err)) from None
        if record.decided is None or (record.prior and previous is None):
            return  # recorded without its inputs, or its previous status is not in the file
        if self.pod is not None and not self._wanted(record.pod):
            return
        self.result.statuses += 1
        pod = self._versions.get((record.uid, record.spec_seq))
        if pod is None:
            self._diverge(line, record.pod, f"the spec of pod {record.pod} ({record.uid}) set "
                          f"by event seq {record.spec_seq} is not in the recording",
                          record.status, {})
            return
        try:
            replayed = _redecide_status(pod, record, previous).to_api()
        except (KeyError, ValueError, TypeError) as err:
            raise RecordingError(line, f"status: inputs: {err}") from None
        if replayed != record.status:
            self._diverge(line, record.pod, "the replayed pod status differs from the recorded one",
                          record.status, replayed)
            summary = f"status: {replayed.get('phase')} (recorded {record.status.get('phase')})"
            self.result.trace.append(
                DecisionTrace(line, t, record.pod, record.uid, summary, diverged=True))

    @_replays(AdmissionRecord)
    def _admission(self, line: int, t: float, record: AdmissionRecord) -> None:
        """Re-decide whether the pod was admitted, from its spec and the admitted pods' specs."""
        if self.pod is not None and not self._wanted(record.pod):
            return
        self.result.admissions += 1
        recorded = {"reason": record.reason, "message": record.message}
        wanted = [(record.uid, record.spec_seq), *record.admitted.items()]
        missing = [key for key in wanted if key not in self._versions]
        if missing:
            uid, seq = missing[0]
            self._diverge(
                line,
                record.pod,
                f"the spec of pod {uid} set by event seq {seq} is not in the recording",
                recorded,
                {},
            )
            return
        pod = self._versions[(record.uid, record.spec_seq)]
        others = [self._versions[key] for key in record.admitted.items()]
        try:
            allocatable = {name: Fraction(value) for name, value in record.allocatable.items()}
        except (ValueError, ZeroDivisionError):
            raise RecordingError(line, "allocatable: not a fraction") from None
        config = self.header.config if self.header else {}
        rejection = admit(
            pod,
            others,
            allocatable,
            allowed_unsafe_sysctls=config.get("allowedUnsafeSysctls") or (),
            node_conditions=record.node_conditions,
        )
        replayed = {
            "reason": rejection.reason if rejection else None,
            "message": rejection.message if rejection else None,
        }
        diverged = replayed != recorded
        if diverged:
            self._diverge(
                line,
                record.pod,
                "the replayed admission differs from the recorded one",
                recorded,
                replayed,
            )
        summary = f"reject: {rejection.reason}: {rejection.message}" if rejection else "admit"
        self.result.trace.append(
            DecisionTrace(line, t, record.pod, record.uid, summary, diverged=diverged)
        )

    @_replays(EvictionRecord)
    def _evict(self, line: int, t: float, record: EvictionRecord) -> None:
        """Re-choose the evicted pod from the recorded figures and the pods' spec versions."""
        self.result.evictions += 1
        recorded = {"uid": record.uid, "message": record.message, "grace": record.grace}
        pods = self._candidates(line, record.candidates, recorded)
        if pods is None:
            return
        named = self._named_thresholds(line)
        try:
            actionable = [named[(signal, hard)] for signal, hard in record.actionable]
            usage = {uid: PodUsage(**fields) for uid, fields in record.usage.items()}
        except (KeyError, TypeError) as err:
            raise RecordingError(
                line, f"a threshold or pod usage the configuration does not explain: {err}"
            ) from None
        if not actionable:
            raise RecordingError(line, "actionable: no threshold")
        observations = {
            signal: Observation(*figures) for signal, figures in record.observations.items()
        }
        config = self.header.config if self.header else {}
        victim = choose_victim(
            actionable[0],
            actionable,
            observations,
            pods,
            usage,
            dedicated_image_fs=record.dedicated_image_fs,
            max_pod_grace_period=int(config.get("evictionMaxPodGracePeriod") or 0),
            refused=record.refused,
        )
        replayed = {
            "uid": victim.pod.metadata.uid if victim else None,
            "message": victim.message if victim else None,
            "grace": victim.grace if victim else None,
        }
        pod = victim.pod.full_name if victim else "(none)"
        diverged = replayed != recorded
        if diverged:
            self._diverge(line, pod, "the replayed eviction differs from the recorded one",
                          recorded, replayed)
        summary = f"evict ({actionable[0].signal}): {victim.message}" if victim else "evict none"
        uid = victim.pod.metadata.uid if victim else ""
        self.result.trace.append(DecisionTrace(line, t, pod, uid, summary, diverged=diverged))

    @_replays(AssessRecord)
    def _assess(self, line: int, t: float, record: AssessRecord) -> None:
        """Re-decide an eviction round's verdict from the figures and the state it began with."""
        if self.pod is not None:
            return  # a node-wide verdict, not one pod's
        config, named = self._eviction(line), self._named_thresholds(line)
        try:
            state = EvictionState(
                first_observed={named[(signal, hard)]: at
                                for signal, hard, at in record.first_observed},
                condition_seen=dict(record.condition_seen),
                met=tuple(named[key] for key in record.met),
                observations={s: Observation(*o) for s, o in record.last_observations.items()},
            )
        except KeyError as err:
            raise RecordingError(
                line, f"assess: a threshold the configuration does not have: {err}") from None
        verdict = assess(
            config.thresholds,
            {signal: Observation(*o) for signal, o in record.observations.items()},
            state,
            now=record.now,
            transition_period=config.transition_period,
        )
        recorded = {"conditions": record.conditions,
                    "actionable": [list(key) for key in record.actionable]}
        replayed = {"conditions": list(verdict.conditions),
                    "actionable": [[th.signal, th.hard] for th in verdict.actionable]}
        diverged = replayed != recorded
        if diverged:
            self._diverge(line, "(node)",
                          "the replayed eviction verdict differs from the recorded one",
                          recorded, replayed)
        acting = ", ".join(th.signal for th in verdict.actionable) or "nothing"
        summary = f"pressure: {', '.join(verdict.conditions) or 'none'}; act on {acting}"
        self.result.trace.append(DecisionTrace(line, t, "(node)", "", summary, diverged=diverged))

    def _candidates(
        self, line: int, candidates: dict[str, int], recorded: dict[str, Any]
    ) -> list[Pod] | None:
        """An eviction round's pods, by the spec versions recorded; None (a divergence)
        when one of them is not in the recording."""
        missing = [uid for uid, seq in candidates.items() if (uid, seq) not in self._versions]
        if missing:
            self._diverge(line, missing[0],
                          f"the spec of pod {missing[0]} is not in the recording", recorded, {})
            return None
        return [self._versions[key] for key in candidates.items()]

    @_replays(StorageEvictionRecord)
    def _storage_eviction(self, line: int, t: float, record: StorageEvictionRecord) -> None:
        """Re-check the pods' local storage limits from the recorded figures and specs."""
        self.result.evictions += len(record.overruns) - len(record.refused)
        recorded = {"overruns": [list(row) for row in record.overruns]}
        pods = self._candidates(line, record.candidates, recorded)
        if pods is None:
            return
        try:
            usage = {uid: StorageUsage(**fields) for uid, fields in record.usage.items()}
        except TypeError as err:
            raise RecordingError(line, f"storage_eviction: usage: {err}") from None
        overruns = storage_overruns(pods, usage, dedicated_image_fs=record.dedicated_image_fs)
        replayed = {"overruns": [[o.pod.metadata.uid, o.limit, o.message] for o in overruns]}
        diverged = replayed != recorded
        if diverged:
            self._diverge(line, overruns[0].pod.full_name if overruns else "(none)",
                          "the replayed local storage check differs from the recorded one",
                          recorded, replayed)
        for overrun in overruns:
            pod = overrun.pod
            self.result.trace.append(DecisionTrace(
                line, t, pod.full_name, pod.metadata.uid,
                f"evict ({overrun.limit}): {overrun.message}", diverged=diverged))

    @_replays(ContainerGCRecord)
    def _container_gc(self, line: int, t: float, record: ContainerGCRecord) -> None:
        """Re-plan a container GC pass from the runtime's containers and sandboxes it saw."""
        if self.pod is not None:
            return  # a node-wide choice, not one pod's
        self.result.gc_passes += 1
        try:
            containers = [
                GCContainer(cid, uid, name, ContainerState(state), created, attempt, sandbox, log)
                for cid, uid, name, state, created, attempt, sandbox, log in record.containers
            ]
            sandboxes = [
                GCSandbox(sid, uid, SandboxState(state), created, attempt)
                for sid, uid, state, created, attempt in record.sandboxes
            ]
        except ValueError as err:
            raise RecordingError(line, f"container_gc: {err}") from None
        min_age, per_container, total = record.policy
        plan = plan_container_gc(
            containers,
            sandboxes,
            policy=GCPolicy(min_age, per_container, total),
            now=record.now,
            existing_pods=frozenset(record.existing_pods),
            sources_ready=record.sources_ready,
            log_dirs=record.log_dirs,
        )
        recorded = {
            "containers": record.removed_containers,
            "sandboxes": record.removed_sandboxes,
            "log_dirs": record.removed_log_dirs,
        }
        replayed = {
            "containers": [c.id for c in plan.containers],
            "sandboxes": [s.id for s in plan.sandboxes],
            "log_dirs": list(plan.log_dirs),
        }
        summary = (
            f"container GC: remove {len(plan.containers)} containers, "
            f"{len(plan.sandboxes)} sandboxes, {len(plan.log_dirs)} pod log directories"
        )
        self._gc_trace(line, t, "the replayed container GC plan differs from the recorded one",
                       recorded, replayed, summary)

    @_replays(ImageGCRecord)
    def _image_gc(self, line: int, t: float, record: ImageGCRecord) -> None:
        """Re-choose an image GC pass's removals, by age and for space, from its records."""
        if self.pod is not None:
            return  # a node-wide choice, not one pod's
        self.result.gc_passes += 1
        policy = self._image_policy(line)
        in_use = frozenset(record.in_use)
        images = [
            ImageRecord(image_id, size, pinned, NEVER if first is None else first,
                        NEVER if last is None else last)
            for image_id, size, pinned, first, last in record.images
        ]
        order = eviction_order(images, in_use)
        expired: list[ImageRecord] = []
        if record.image_fs is None:  # the eviction manager's reclaim: all it can, no ages
            removals = choose_for_space(order, math.inf, record.now, policy).removals
        else:
            expired = expired_images(order, record.now, policy, record.started_at)
            gone = set(record.removed_by_age)
            needed = bytes_to_free(ImageFs(*record.image_fs), policy)
            rest = [r for r in order if r.id not in gone]
            removals = choose_for_space(rest, needed, record.now, policy).removals if needed else ()
        recorded = {"expired": record.expired, "removals": record.removals}
        replayed = {"expired": [r.id for r in expired], "removals": [r.id for r in removals]}
        summary = f"image GC: remove {len(expired)} for age, {len(removals)} for space"
        self._gc_trace(line, t, "the replayed image GC choice differs from the recorded one",
                       recorded, replayed, summary)

    def _gc_trace(self, line: int, t: float, reason: str, recorded: dict[str, Any],
                  replayed: dict[str, Any], summary: str) -> None:
        diverged = replayed != recorded
        if diverged:
            self._diverge(line, "(node)", reason, recorded, replayed)
        self.result.trace.append(DecisionTrace(line, t, "(node)", "", summary, diverged=diverged))

    def _image_policy(self, line: int) -> ImageGCPolicy:
        """The image GC policy of the recording's configuration (parsed once)."""
        if self._image_gc_policy is None:
            self._image_gc_policy = image_gc_policy(self._header_config(line))
        return self._image_gc_policy

    def _eviction(self, line: int) -> EvictionConfig:
        """The eviction settings of the recording's configuration (parsed once)."""
        if self._eviction_config is None:
            try:
                self._eviction_config = EvictionConfig.from_config(self._header_config(line))
            except ConfigError as err:
                raise RecordingError(line, f"header config: {err}") from None
        return self._eviction_config

    def _named_thresholds(self, line: int) -> dict[tuple[str, bool], Threshold]:
        """The configuration's thresholds by the [signal, hard] that records name them with."""
        return {(th.signal, th.hard): th for th in self._eviction(line).thresholds}

    def _header_config(self, line: int) -> KubeletConfiguration:
        wire = self.header.config if self.header else {}
        try:
            return KubeletConfiguration.model_validate(wire)
        except ValidationError as err:
            raise RecordingError(line, f"header config: {err}") from None

    def _check_gate(
        self,
        line: int,
        index: int,
        record: DecisionRecord,
        pod: Pod,
        observed: RuntimePodStatus,
        start: ContainerStart,
        to_start: set[str],
    ) -> StartGate | None:
        """Re-decide one recorded crash-loop gate from its prior entry; None if it diverged."""
        self.result.gates += 1
        where = f"starts[{index}]"
        container = _container(pod, start.container)
        if container is None or start.container not in to_start:
            self._diverge(
                line,
                record.pod,
                f"{where}: the worker gated container {start.container}, which the recorded "
                "actions do not start",
                start.model_dump(),
                {"containers_to_start": sorted(to_start)},
            )
            return None
        if start.prior_delay is not None and start.prior_update is None:
            raise RecordingError(line, f"{where}.prior_update: required with prior_delay")
        backoff = Backoff()
        if start.prior_delay is not None and start.prior_update is not None:
            entry = BackoffEntry(start.prior_delay, start.prior_update)
            backoff = Backoff(entries=MappingProxyType({start.key: entry}))
        gate = gate_container_start(backoff, start.key, observed.find(start.container), record.now)
        replayed = start.model_copy(
            update={
                "key": backoff_key(pod, container),
                "allowed": gate.allowed,
                "remaining": gate.remaining,
                "delay": gate.delay,
            }
        )
        if not _same_gate(start, replayed):
            self._diverge(
                line,
                record.pod,
                f"{where}: the replayed crash-loop gate of {start.container} differs",
                start.model_dump(),
                replayed.model_dump(),
            )
            return None
        return gate

    def _diverge(
        self, line: int, pod: str, reason: str, expected: dict[str, Any], actual: dict[str, Any]
    ) -> None:
        result = self.result
        result.divergences += 1
        if result.divergence is None:
            events = result.events
            diff = json_diff(expected, actual)
            result.divergence = Divergence(line, events, pod, reason, expected, actual, diff)

    def _wanted(self, full_name: str) -> bool:
        matches = self._pod_matches.get(full_name)
        if matches is None:
            matches = self.pod in pod_aliases(full_name, self.header.node if self.header else "")
            self._pod_matches[full_name] = matches
        return matches


def pod_aliases(full_name: str, node: str) -> set[str]:
    """The names ``--pod`` accepts for a pod.

    Its name, ``name_namespace`` and ``namespace/name``, each also without a static
    pod's ``-<node>`` suffix.
    """
    name, _, namespace = full_name.partition("_")
    names = {name}
    if node and name.endswith(f"-{node}") and len(name) > len(node) + 1:
        names.add(name[: -len(node) - 1])
    aliases = {full_name}
    for each in names:
        aliases.update((each, f"{each}_{namespace}", f"{namespace}/{each}"))
    return aliases


def _describe(prefix: str, err: ValidationError) -> str:
    first = err.errors(include_url=False, include_input=False)[0]
    path = field_path((prefix, *first["loc"]))
    return f"{path}: {first['msg']}"


def _decision_inputs(
    line: int, record: DecisionRecord
) -> tuple[RuntimePodStatus, dict[str, ProbeResult], dict[str, ProbeResult]]:
    """The recorded inputs as core values; a malformed one is a recording error."""
    try:
        observed = observed_from_json(record.observed)
    except KeyError as err:
        raise RecordingError(line, f"observed: {json.dumps(err.args[0])} is missing") from None
    except (ValueError, TypeError) as err:
        raise RecordingError(line, f"observed: {err}") from None
    try:
        liveness = probe_results_from_json(record.liveness)
        startup = probe_results_from_json(record.startup)
    except ValueError as err:
        raise RecordingError(line, f"liveness/startup: {err}") from None
    return observed, liveness, startup


def _same_gate(recorded: ContainerStart, replayed: ContainerStart) -> bool:
    return (
        recorded.key == replayed.key
        and recorded.allowed == replayed.allowed
        and math.isclose(recorded.remaining, replayed.remaining, abs_tol=GATE_TOLERANCE)
        and math.isclose(recorded.delay, replayed.delay, abs_tol=GATE_TOLERANCE)
    )


def _all_containers(pod: Pod) -> Iterator[Container]:
    spec = pod.spec
    yield from spec.init_containers
    yield from spec.containers
    yield from spec.ephemeral_containers


def _container(pod: Pod, name: str) -> Container | None:
    return next((c for c in _all_containers(pod) if c.name == name), None)


def _names(containers: Sequence[Container], indexes: Iterable[Any]) -> list[str]:
    return [containers[i].name for i in indexes if isinstance(i, int) and 0 <= i < len(containers)]


def _names_to_start(pod: Pod, actions: Mapping[str, Any]) -> set[str]:
    """The containers the recorded actions ask to start (the only ones the worker gates)."""
    spec = pod.spec
    return {
        *_names(spec.ephemeral_containers, actions.get("ephemeral_containers_to_start", ())),
        *_names(spec.init_containers, actions.get("init_containers_to_start", ())),
        *_names(spec.containers, actions.get("containers_to_start", ())),
    }


# -- words --------------------------------------------------------------------------------------


def summarize(pod: Pod, observed: RuntimePodStatus, actions: PodActions) -> str:
    """One line for a decision: ``create sandbox (attempt 0); start init-1``."""
    spec = pod.spec
    parts: list[str] = []
    live = any(c.state is ContainerState.RUNNING for c in observed.containers) or any(
        s.state is SandboxState.READY for s in observed.sandboxes
    )
    if actions.kill_pod and (live or not actions.create_sandbox):
        parts.append("kill pod")
    if actions.create_sandbox:
        parts.append(f"create sandbox (attempt {actions.attempt})")
    for kill in actions.containers_to_kill.values():
        parts.append(f"kill {kill.name} ({kill.reason})" if kill.reason else f"kill {kill.name}")
    parts.extend(
        f"start ephemeral {name}"
        for name in _names(spec.ephemeral_containers, actions.ephemeral_containers_to_start)
    )
    parts.extend(
        f"start {name}"
        for name in (
            *_names(spec.init_containers, actions.init_containers_to_start),
            *_names(spec.containers, actions.containers_to_start),
        )
    )
    return "; ".join(parts) if parts else "nothing to do"


def _gate_text(name: str, newest: RuntimeContainer | None, gate: StartGate) -> str:
    """A gate worth a mention (its container exited): held back, or restarted under back-off."""
    if not gate.allowed:
        return f"{name}: back-off {format_duration(gate.delay)}, {gate.remaining:.1f}s left"
    if newest is not None and newest.state is ContainerState.EXITED:
        return f"{name}: restarted, back-off now {format_duration(gate.delay)}"
    return ""


def _gate_reason(
    pod: Pod, start: ContainerStart, newest: RuntimeContainer | None, gate: StartGate
) -> list[str]:
    if newest is None or newest.state is not ContainerState.EXITED:
        return []
    container = _container(pod, start.container)
    policy = (container.restart_policy if container else None) or pod.spec.restart_policy
    exited = f"exited {newest.exit_code}, policy {policy}"
    if not gate.allowed:
        return [
            f"wait {start.container}: {exited}, back-off {format_duration(gate.delay)}, "
            f"{gate.remaining:.1f}s left"
        ]
    waited = (
        f"back-off {format_duration(start.prior_delay)} elapsed"
        if start.prior_delay is not None
        else "no back-off yet"
    )
    return [
        f"restart {start.container}: {exited}, {waited}; "
        f"next back-off {format_duration(gate.delay)}"
    ]


def _ago(now: float, then: float) -> str:
    return f"{now - then:.1f}s ago" if then else "at an unknown time"


def _describe_instance(container: RuntimeContainer, now: float, older: int) -> str:
    state, restarts = container.state, container.restart_count
    if state is ContainerState.EXITED:
        reason = f" ({container.reason})" if container.reason else ""
        text = f"exited {container.exit_code}{reason}, restarts {restarts}, "
        text += f"finished {_ago(now, container.finished_at)}"
    elif state is ContainerState.RUNNING:
        text = f"running, restarts {restarts}, started {_ago(now, container.started_at)}"
    else:
        text = f"{state.value}, restarts {restarts}"
    if older:
        text += f" ({older} older instance{'s' if older > 1 else ''})"
    return f"{container.name}: {text}"


def _explain_inputs(pod: Pod, record: DecisionRecord, observed: RuntimePodStatus) -> list[str]:
    """The observed state behind a decision, one line per sandbox and container."""
    lines = [f"restartPolicy: {pod.spec.restart_policy}"]
    for sandbox in observed.sandboxes:
        text = f"sandbox {sandbox.id[:12]}: {sandbox.state.value}, attempt {sandbox.attempt}"
        lines.append(text + (f", ip {sandbox.ip}" if sandbox.ip else ""))
    seen: set[str] = set()
    for container in observed.containers:
        if container.name not in seen:
            seen.add(container.name)
            older = len(observed.instances(container.name)) - 1
            lines.append(_describe_instance(container, record.now, older))
    if not observed.sandboxes and not observed.containers:
        lines.append("nothing on the runtime yet")
    for probe, results in (("liveness", record.liveness), ("startup", record.startup)):
        lines.extend(f"{probe} {cid[:12]}: {value}" for cid, value in results.items())
    return lines


# -- drivers ------------------------------------------------------------------------------------


def _numbered(records: Iterable[Record | NumberedRecord]) -> Iterator[NumberedRecord]:
    for index, item in enumerate(records, start=1):
        yield item if isinstance(item, NumberedRecord) else NumberedRecord(index, item)


def replay(
    records: Iterable[Record | NumberedRecord],
    *,
    until: float | None = None,
    pod: str | None = None,
    explain: bool = False,
) -> ReplayResult:
    """Re-check every decision of a recording (records without a line number count from 1)."""
    replayer = Replayer(until=until, pod=pod, explain=explain)
    for item in _numbered(records):
        replayer.feed(item.line, item.record)
    return replayer.result


async def replay_in_virtual_time(
    records: Iterable[Record | NumberedRecord],
    *,
    until: float | None = None,
    pod: str | None = None,
    explain: bool = False,
) -> ReplayResult:
    """``replay``, with trio's clock following the recording (run it under a MockClock).

    The clock moves in steps of at least ``CLOCK_STEP`` (a recording has records
    microseconds apart) and ends on the last replayed record's time exactly.
    """
    replayer = Replayer(until=until, pod=pod, explain=explain)
    origin = trio.current_time()
    for item in _numbered(records):
        t = replayer.relative(item.line, item.record)
        if replayer.in_range(t) and origin + t >= trio.current_time() + CLOCK_STEP:
            await advance_clock_to(origin + t)
        replayer.feed(item.line, item.record)
    await advance_clock_to(origin + replayer.result.end)
    return replayer.result


async def advance_clock_to(deadline: float) -> None:
    """``trio.sleep_until(deadline)``, made cheap under a MockClock.

    Letting the autojump reach a deadline takes two trips through the scheduler
    (about 80 us, a third of a 100,000-record replay); jumping the clock and
    checkpointing wakes the same sleepers in one. Other clocks really sleep.
    """
    clock = trio.lowlevel.current_clock()
    now = trio.current_time()
    if isinstance(clock, trio.testing.MockClock):
        if deadline > now:
            clock.jump(deadline - now)
        await trio.lowlevel.checkpoint()
    else:
        await trio.sleep_until(deadline)

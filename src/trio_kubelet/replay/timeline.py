"""A recording as one self-contained HTML page: pods and their containers as lanes over time.

``build_timeline`` turns records into plain values (what ``tests/unit/test_timeline.py``
checks); ``render_timeline`` writes them as HTML with inline CSS, SVG and a little JS
(a tooltip and a pod filter), so the file opens anywhere without a network.

How the lanes are derived:

* A container's state comes from the StatusRecords the agent published: it holds from the
  record that first showed it until the next record showing another state, the pod's
  TeardownRecord or the end of the recording. Consecutive records with the same state
  (same instance, same reason) make one segment, which keeps the file small.
* A status can skip an instance's end: a crash-looping container goes straight from
  running to ``CrashLoopBackOff``, the exit only visible in ``lastState``. Such an exit is
  drawn too (marked "inferred"), from its ``finishedAt`` (clamped between the two records,
  whose clock is the agent's; ``finishedAt`` has whole seconds only).
* Markers: every decision with something to do (start, kill, back-off gate) on the pod's
  row, with its ``reasons`` and gate results; decisions that found nothing to do as small
  ticks; container restarts (``restartCount`` increments), OOM kills and probe results
  on the container's lane; source changes (pod added, changed, removed) and teardowns.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from trio_kubelet.core.container_ids import runtime_id
from trio_kubelet.recording.records import (
    ContainerStart,
    DecisionRecord,
    EventRecord,
    Header,
    Record,
    SnapshotRecord,
    StatusRecord,
    TeardownRecord,
)

State = Literal[
    "waiting", "running", "unready", "succeeded", "failed", "oomkilled", "backoff", "unknown"
]
LaneKind = Literal["init", "sidecar", "container", "ephemeral"]
MarkerKind = Literal[
    "start", "backoff", "kill", "decision", "restart", "oom", "probe", "spec", "teardown",
    "problem", "stream",
]

BACKOFF_REASONS = frozenset({"CrashLoopBackOff", "ImagePullBackOff"})
OOM_REASON = "OOMKilled"
_RUNNING_STATES: frozenset[State] = frozenset({"running", "unready"})
_TERMINATED_STATES: frozenset[State] = frozenset({"succeeded", "failed", "oomkilled"})
_PHASE_STATES: Mapping[str, State] = {
    "Pending": "waiting",
    "Running": "running",
    "Succeeded": "succeeded",
    "Failed": "failed",
}
_GROUPS: tuple[tuple[str, str, LaneKind], ...] = (
    ("initContainers", "initContainerStatuses", "init"),
    ("containers", "containerStatuses", "container"),
    ("ephemeralContainers", "ephemeralContainerStatuses", "ephemeral"),
)
_MAX_REASONS = 40  # sentences shown per decision tooltip


# -- the values ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Segment:
    """One state over ``[start, end)`` seconds since the recording started."""

    start: float
    end: float
    state: State
    label: str
    details: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Marker:
    """Something that happened at one instant; ``summary`` is its one-line explanation."""

    t: float
    kind: MarkerKind
    summary: str
    details: tuple[str, ...] = ()


@dataclass(slots=True)
class Lane:
    """One container of a pod (all its instances)."""

    name: str
    kind: LaneKind
    segments: list[Segment] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)


@dataclass(slots=True)
class PodTimeline:
    uid: str
    name: str  # name_namespace, as recorded
    lanes: list[Lane] = field(default_factory=list)
    phases: list[Segment] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)  # decisions, source changes, teardowns
    idle_syncs: list[float] = field(default_factory=list)  # decisions with nothing to do

    @property
    def display_name(self) -> str:
        """``namespace/name`` (names and namespaces cannot contain ``_``)."""
        name, sep, namespace = self.name.rpartition("_")
        return f"{namespace}/{name}" if sep and name and namespace else self.name

    @property
    def restarts(self) -> int:
        return sum(1 for lane in self.lanes for m in lane.markers if m.kind == "restart")


@dataclass(slots=True)
class Timeline:
    node: str
    agent_version: str
    start_time: float | None  # epoch seconds at relative time 0
    duration: float
    pods: list[PodTimeline]
    node_segments: list[Segment]  # the runtime unreachable (failed relists)
    node_markers: list[Marker]  # manifest problems, the container event stream's changes
    record_count: int
    rotated_from: str | None = None


# -- small readers of untrusted JSON ------------------------------------------------------------


_EMPTY: Mapping[str, Any] = {}


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else _EMPTY


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


def _epoch(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    # The API's timestamps are cut to whole seconds: the middle of that second is the best guess.
    return moment.timestamp() + (0.5 if moment.microsecond == 0 else 0.0)


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def fmt_seconds(value: float) -> str:
    """A relative time or a duration for people: ``0.25 s``, ``12.3 s``, ``95 s``."""
    if abs(value) < 10:
        return f"{value:.2f} s"
    if abs(value) < 100:
        return f"{value:.1f} s"
    return f"{value:.0f} s"


def _short_id(container_id: str) -> str:
    return runtime_id(container_id)[:13]


# -- container states ---------------------------------------------------------------------------

_Key = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class _Observed:
    key: _Key  # equal keys merge into one segment
    state: State
    label: str
    details: tuple[str, ...]


def _terminated(term: Mapping[str, Any], *, inferred: bool = False) -> _Observed:
    exit_code = _int(term.get("exitCode"))
    reason = _str(term.get("reason"))
    if reason == OOM_REASON:
        state: State = "oomkilled"
        label = f"OOMKilled (exit {exit_code})" if exit_code is not None else "OOMKilled"
    else:
        state = "succeeded" if exit_code == 0 else "failed"
        label = f"exit {exit_code if exit_code is not None else '?'}"
        if reason:
            label += f" ({reason})"
    details = ["inferred: the agent saw this exit only in lastState"] if inferred else []
    for field_name, title in (("startedAt", "started"), ("finishedAt", "finished")):
        if term.get(field_name):
            details.append(f"{title} {_str(term.get(field_name))}")
    if term.get("signal") is not None:
        details.append(f"signal {_str(term.get('signal'))}")
    if term.get("message"):
        details.append(f"message: {_str(term.get('message'))}")
    container_id = _str(term.get("containerID"))
    if container_id:
        details.append(f"container {_short_id(container_id)}")
    key = ("terminated", _term_identity(term))
    return _Observed(key, state, label, tuple(details))


def _term_identity(term: Mapping[str, Any]) -> _Key:
    """Which instance ended: its container ID, else its times and exit code."""
    container_id = _str(term.get("containerID"))
    if container_id:
        return (container_id,)
    return (_str(term.get("startedAt")), _str(term.get("finishedAt")), _int(term.get("exitCode")))


def _container_observed(status: Mapping[str, Any], kind: LaneKind) -> _Observed:
    state = _dict(status.get("state"))
    restarts = _int(status.get("restartCount"))
    container_id = _str(status.get("containerID"))
    common = [f"restartCount {restarts}"] if restarts is not None else []
    if container_id:
        common.append(f"container {_short_id(container_id)}")
    if "running" in state:
        running = _dict(state.get("running"))
        # A running regular init container is never "ready"; that is not worth a colour.
        unready = kind != "init" and status.get("ready") is False
        started_at = _str(running.get("startedAt"))
        label = "running, not ready" if unready else "running"
        details = (*([f"started {started_at}"] if started_at else []), *common)
        return _Observed(
            ("running", container_id or started_at, unready),
            "unready" if unready else "running",
            label,
            details,
        )
    if "terminated" in state:
        return _terminated(_dict(state.get("terminated")))
    if "waiting" in state:
        waiting = _dict(state.get("waiting"))
        reason = _str(waiting.get("reason")) or "waiting"
        message = _str(waiting.get("message"))
        details = (*([message] if message else []), *common)
        backoff = reason in BACKOFF_REASONS
        return _Observed(("waiting", reason), "backoff" if backoff else "waiting", reason, details)
    return _Observed(("unknown",), "unknown", "no state", ("the status has no state", *common))


# -- building -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Open:
    start: float
    observed: _Observed


class _Track:
    """Observations at increasing times → merged, contiguous segments."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self.open: _Open | None = None
        self._last_key: _Key | None = None

    def observe(self, t: float, observed: _Observed) -> None:
        if self.open is not None and self.open.observed.key == observed.key:
            return
        self.close(t)
        self.open = _Open(t, observed)

    def insert(self, start: float, end: float, observed: _Observed) -> None:
        """A segment known after the fact (an inferred run or exit)."""
        self.close(start)
        self.open = _Open(start, observed)
        self.close(end)

    def close(self, t: float) -> None:
        current, self.open = self.open, None
        if current is None or t <= current.start:
            return
        obs = current.observed
        last = self.segments[-1] if self.segments else None
        if last is not None and self._last_key == obs.key and last.end >= current.start:
            self.segments[-1] = Segment(last.start, t, last.state, last.label, last.details)
            return
        self.segments.append(Segment(current.start, t, obs.state, obs.label, obs.details))
        self._last_key = obs.key


@dataclass(slots=True)
class _LaneBuild:
    lane: Lane
    group: int
    track: _Track = field(default_factory=_Track)
    restarts: int | None = None
    seen_exits: set[_Key] = field(default_factory=set)
    container_id: str = ""
    last: object = None  # the status last applied (an equal one changes nothing)


@dataclass(slots=True)
class _PodBuild:
    pod: PodTimeline
    first_seen: int
    lanes: dict[tuple[int, str], _LaneBuild] = field(default_factory=dict)
    spec_order: dict[tuple[int, str], int] = field(default_factory=dict)
    phase: _Track = field(default_factory=_Track)
    spec: Mapping[str, Any] = field(default_factory=dict)
    fingerprint: str | None = None
    probes: dict[str, str] = field(default_factory=dict)
    last: object = None  # the status last applied (an equal one changes nothing)


class _Builder:
    def __init__(self, base: float, start_time: float | None) -> None:
        self.base = base
        self.start_time = start_time
        self.pods: dict[str, _PodBuild] = {}
        self.source_sets: dict[str, set[str]] = {}
        self.node = _Track()
        self.node_markers: list[Marker] = []
        self.end = 0.0

    # time

    def rel(self, t: float) -> float:
        return t - self.base

    def rel_wall(self, text: object) -> float | None:
        epoch = _epoch(text)
        if epoch is None or self.start_time is None:
            return None
        return epoch - self.start_time

    # pods and lanes

    def pod(self, uid: str, name: str) -> _PodBuild:
        build = self.pods.get(uid)
        if build is None:
            build = _PodBuild(PodTimeline(uid=uid, name=name or uid), first_seen=len(self.pods))
            self.pods[uid] = build
        elif name and build.pod.name == uid:
            build.pod.name = name
        return build

    def lane(self, pod: _PodBuild, group: int, name: str, kind: LaneKind) -> _LaneBuild:
        key = (group, name)
        build = pod.lanes.get(key)
        if build is None:
            build = _LaneBuild(Lane(name=name, kind=kind), group)
            pod.lanes[key] = build
        elif kind == "sidecar":
            build.lane.kind = kind
        return build

    def set_spec(self, pod: _PodBuild, spec: Mapping[str, Any]) -> None:
        pod.spec = spec
        for group, (spec_field, _, default_kind) in enumerate(_GROUPS):
            for index, container in enumerate(_list(spec.get(spec_field))):
                container = _dict(container)
                name = _str(container.get("name"))
                if not name:
                    continue
                sidecar = default_kind == "init" and container.get("restartPolicy") == "Always"
                self.lane(pod, group, name, "sidecar" if sidecar else default_kind)
                pod.spec_order[(group, name)] = index

    def container_name(self, pod: _PodBuild, spec_field: str, index: object) -> str:
        containers = _list(pod.spec.get(spec_field))
        position = _int(index)
        if position is not None and 0 <= position < len(containers):
            name = _str(_dict(containers[position]).get("name"))
            if name:
                return name
        return f"{spec_field}[{_str(index)}]"

    # records

    def add(self, record: Record) -> None:
        t = self.rel(record.t)
        self.end = max(self.end, t)
        if isinstance(record, StatusRecord):
            self.status(t, record)
        elif isinstance(record, DecisionRecord):
            self.decision(t, record)
        elif isinstance(record, TeardownRecord):
            self.teardown(t, record)
        elif isinstance(record, EventRecord):
            self.event(t, record.event)
        elif isinstance(record, SnapshotRecord):
            for source, pods in record.pod_sets.items():
                self.pod_set(t, source, pods)

    def status(self, t: float, record: StatusRecord) -> None:
        pod = self.pod(record.uid, record.pod)
        status = record.status
        if status == pod.last:
            return
        pod.last = status
        phase = _str(status.get("phase")) or "Unknown"
        details = []
        for name in ("reason", "message"):
            if status.get(name):
                details.append(f"{name}: {_str(status.get(name))}")
        for condition in _list(status.get("conditions")):
            condition = _dict(condition)
            text = f"{_str(condition.get('type'))}: {_str(condition.get('status'))}"
            if condition.get("reason"):
                text += f" ({_str(condition.get('reason'))})"
            details.append(text)
        pod.phase.observe(
            t, _Observed((phase,), _PHASE_STATES.get(phase, "unknown"), phase, tuple(details))
        )
        for group, (_, status_field, default_kind) in enumerate(_GROUPS):
            for container in _list(status.get(status_field)):
                container = _dict(container)
                name = _str(container.get("name"))
                if name:
                    self.container(t, pod, self.lane(pod, group, name, default_kind), container)

    def container(
        self, t: float, pod: _PodBuild, build: _LaneBuild, status: Mapping[str, Any]
    ) -> None:
        if status == build.last:
            return
        build.last = status
        lane, track = build.lane, build.track
        observed = _container_observed(status, lane.kind)
        start = t
        last = _dict(_dict(status.get("lastState")).get("terminated"))
        if last:
            identity = _term_identity(last)
            if identity not in build.seen_exits:
                build.seen_exits.add(identity)
                if track.open is not None and track.open.observed.state not in _TERMINATED_STATES:
                    start = self._inferred_exit(t, build, last, status, observed)
        if observed.state in _TERMINATED_STATES:
            identity = _term_identity(_dict(_dict(status.get("state")).get("terminated")))
            if identity not in build.seen_exits:
                build.seen_exits.add(identity)
                if observed.state == "oomkilled":
                    lane.markers.append(_oom_marker(t, lane.name, observed))
        restarts = _int(status.get("restartCount"))
        if restarts is not None:
            if build.restarts is not None and restarts > build.restarts:
                lane.markers.append(_restart_marker(start, lane.name, build.restarts, restarts,
                                                    _dict(status.get("lastState"))))
            build.restarts = restarts
        build.container_id = _str(status.get("containerID"))
        track.observe(start, observed)

    def _inferred_exit(
        self,
        t: float,
        build: _LaneBuild,
        last: Mapping[str, Any],
        status: Mapping[str, Any],
        observed: _Observed,
    ) -> float:
        """Draw an exit the statuses skipped; return when the newly observed state starts."""
        track, lane = build.track, build.lane
        assert track.open is not None
        low = track.open.start
        was_running = track.open.observed.state in _RUNNING_STATES
        finished = self.rel_wall(last.get("finishedAt"))
        finished = t if finished is None else _clamp(finished, low, t)
        if not was_running:
            started = self.rel_wall(last.get("startedAt"))
            if started is not None and low < started < finished:
                run = _Observed(("inferred-run", _term_identity(last)), "running", "running",
                                ("inferred: the agent never saw this instance run",))
                track.insert(_clamp(started, low, finished), finished, run)
        end = t
        if observed.state in _RUNNING_STATES:
            running = _dict(_dict(status.get("state")).get("running"))
            started = self.rel_wall(running.get("startedAt"))
            if started is not None:
                end = _clamp(started, finished, t)
        exited = _terminated(last, inferred=True)
        if end > finished:
            track.insert(finished, end, exited)
        else:
            track.close(finished)
        if exited.state == "oomkilled":
            lane.markers.append(_oom_marker(finished, lane.name, exited))
        return end

    def decision(self, t: float, record: DecisionRecord) -> None:
        pod = self.pod(record.uid, record.pod)
        self.probe_results(t, pod, record)
        marker = self.decision_marker(t, pod, record)
        if marker is None:
            pod.pod.idle_syncs.append(t)
        else:
            pod.pod.markers.append(marker)

    def decision_marker(self, t: float, pod: _PodBuild, record: DecisionRecord) -> Marker | None:
        actions = record.actions
        reasons = [_str(r) for r in _list(actions.get("reasons"))]
        kills = [_dict(k) for k in _dict(actions.get("containers_to_kill")).values()]
        denied = [s for s in record.starts if not s.allowed]
        denied_names = {s.container for s in denied}
        starts: list[str] = []
        for spec_field, action_field in (
            ("ephemeralContainers", "ephemeral_containers_to_start"),
            ("initContainers", "init_containers_to_start"),
            ("containers", "containers_to_start"),
        ):
            for index in _list(actions.get(action_field)):
                name = self.container_name(pod, spec_field, index)
                if name not in denied_names:
                    starts.append(name)
        kill_pod = bool(actions.get("kill_pod"))
        create = bool(actions.get("create_sandbox"))
        if not (reasons or kills or denied or starts or kill_pod or create):
            return None
        observed = record.observed
        live = any(
            _dict(c).get("state") in ("running", "unknown")
            for c in _list(observed.get("containers"))
        ) or any(_dict(s).get("state") == "ready" for s in _list(observed.get("sandboxes")))
        parts: list[str] = []
        if kill_pod and (live or not create):
            parts.append("kill pod")
        if create:
            parts.append(f"create sandbox (attempt {_str(actions.get('attempt'))})")
        if kills:
            parts.append("kill " + ", ".join(_str(k.get("name")) for k in kills))
        if starts:
            parts.append("start " + ", ".join(starts))
        for gate in denied:
            parts.append(f"back-off {gate.container} ({fmt_seconds(gate.remaining)} left)")
        kind: MarkerKind
        if kills or (kill_pod and (live or not create)):
            kind = "kill"
        elif denied:
            kind = "backoff"
        elif starts or create:
            kind = "start"
        else:
            kind = "decision"
        details: list[str] = []
        if reasons:
            details.append("Reasons:")
            details.extend(f"• {r}" for r in reasons[:_MAX_REASONS])
            if len(reasons) > _MAX_REASONS:
                details.append(f"• … {len(reasons) - _MAX_REASONS} more")
        for kill in kills:
            text = f"• kill {_str(kill.get('name'))}: {_str(kill.get('reason'))}"
            if kill.get("message"):
                text += f" — {_str(kill.get('message'))}"
            details.append(text)
        if record.starts:
            details.append("Crash-loop gates:")
            details.extend(f"• {_gate_text(gate)}" for gate in record.starts)
        seen = _observed_text(observed)
        if seen:
            details.append(f"Observed: {seen}")
        summary = f"sync at {fmt_seconds(t)}: " + ("; ".join(parts) or "decision")
        return Marker(t, kind, summary, tuple(details))

    def probe_results(self, t: float, pod: _PodBuild, record: DecisionRecord) -> None:
        """A probe marker wherever a liveness or startup result changed since the last sync."""
        for probe, results in (("liveness", record.liveness), ("startup", record.startup)):
            for container_id, result in results.items():
                key = f"{probe}/{container_id}"
                if pod.probes.get(key) == result:
                    continue
                pod.probes[key] = result
                target = self._lane_of(pod, container_id)
                name = target.lane.name if target else _short_id(container_id)
                marker = Marker(t, "probe", f"{probe} probe of {name}: {result}",
                                (f"container {_short_id(container_id)}",))
                (target.lane.markers if target else pod.pod.markers).append(marker)

    def _lane_of(self, pod: _PodBuild, container: str) -> _LaneBuild | None:
        if not container:
            return None
        for build in pod.lanes.values():
            if build.lane.name == container:
                return build
            cid = build.container_id
            if cid and (cid == container or runtime_id(cid) == container):
                return build
        return None

    def teardown(self, t: float, record: TeardownRecord) -> None:
        pod = self.pod(record.uid, record.pod)
        for build in pod.lanes.values():
            build.track.close(t)
            build.restarts = None
            build.container_id = ""
            build.last = None
        pod.phase.close(t)
        pod.probes.clear()
        pod.last = None
        pod.pod.markers.append(
            Marker(t, "teardown", f"teardown at {fmt_seconds(t)}",
                   ("the pod's containers, sandboxes and logs were removed",))
        )

    def event(self, t: float, event: Mapping[str, Any]) -> None:
        kind = _str(event.get("kind"))
        if kind == "pod_set":
            source = _str(event.get("source"))
            self.pod_set(t, source, _list(event.get("pods")))
            for problem in _list(event.get("problems")):
                problem = _dict(problem)
                self.node_markers.append(Marker(
                    t, "problem", f"manifest problem in {_str(problem.get('file'))}",
                    (_str(problem.get("reason")), f"source {source}"),
                ))
        elif kind == "relist":
            if event.get("ok") is False:
                error = _str(event.get("error")) or "relist failed"
                self.node.observe(
                    t, _Observed(("down",), "failed", "runtime unreachable", (error,))
                )
            else:
                self.node.close(t)
        elif kind == "event_stream":
            state = _str(event.get("state"))
            title = _STREAM_TITLES.get(state, f"container event stream {state}")
            error = _str(event.get("error"))
            self.node_markers.append(Marker(t, "stream", title, (error,) if error else ()))
        elif "probe" in kind:
            self.probe_event(t, kind, event)

    def probe_event(self, t: float, kind: str, event: Mapping[str, Any]) -> None:
        uid = _str(event.get("pod_uid") or event.get("uid"))
        pod = self.pods.get(uid)
        if pod is None:
            return
        container = _str(
            event.get("container") or event.get("container_name") or event.get("container_id")
        )
        target = self._lane_of(pod, container)
        result = _str(event.get("result") or event.get("type"))
        name = target.lane.name if target else container or "pod"
        details = tuple(
            f"{k}: {_str(v)}" for k, v in event.items() if k != "kind" and not isinstance(v, dict)
        )
        marker = Marker(t, "probe", f"{kind} {name}: {result}".rstrip(": "), details)
        (target.lane.markers if target else pod.pod.markers).append(marker)

    def pod_set(self, t: float, source: str, pods: Iterable[Any]) -> None:
        now: set[str] = set()
        for item in pods:
            item = _dict(item)
            meta = _dict(item.get("metadata"))
            uid = _str(meta.get("uid"))
            if not uid:
                continue
            name = f"{_str(meta.get('name'))}_{_str(meta.get('namespace')) or 'default'}"
            pod = self.pod(uid, name)
            now.add(uid)
            spec = _dict(item.get("spec"))
            self.set_spec(pod, spec)
            annotations = _dict(meta.get("annotations"))
            fingerprint = _str(annotations.get("kubernetes.io/config.hash")) or json.dumps(
                spec, sort_keys=True, default=str
            )
            if pod.fingerprint is None:
                pod.pod.markers.append(Marker(t, "spec", f"pod added by source {source}",
                                              (f"uid {uid}",)))
            elif pod.fingerprint != fingerprint:
                pod.pod.markers.append(Marker(t, "spec", f"spec changed (source {source})",
                                              (f"uid {uid}",)))
            pod.fingerprint = fingerprint
        for uid in self.source_sets.get(source, set()) - now:
            gone = self.pods.get(uid)
            if gone is not None:
                gone.fingerprint = None
                gone.pod.markers.append(Marker(t, "spec", f"pod removed from source {source}",
                                               (f"uid {uid}",)))
        self.source_sets[source] = now

    # the end

    def finish(self, end: float) -> tuple[list[PodTimeline], list[Segment]]:
        pods: list[PodTimeline] = []
        for build in sorted(self.pods.values(), key=lambda b: b.first_seen):
            build.phase.close(end)
            build.pod.phases = build.phase.segments
            lanes = []
            for key in sorted(build.lanes, key=_lane_order(build)):
                lane = build.lanes[key]
                lane.track.close(end)
                lane.lane.segments = lane.track.segments
                lane.lane.markers.sort(key=lambda m: m.t)
                lanes.append(lane.lane)
            build.pod.lanes = lanes
            build.pod.markers.sort(key=lambda m: m.t)
            pods.append(build.pod)
        self.node.close(end)
        return pods, self.node.segments


def _lane_order(pod: _PodBuild) -> Callable[[tuple[int, str]], tuple[int, int, int]]:
    """Init containers (and sidecars), containers, ephemeral ones; each in spec order, then
    the ones no spec names in the order they appeared."""
    first_seen = {key: i for i, key in enumerate(pod.lanes)}

    def order(key: tuple[int, str]) -> tuple[int, int, int]:
        index = pod.spec_order.get(key)
        return (key[0], 0, index) if index is not None else (key[0], 1, first_seen[key])

    return order


def _gate_text(gate: ContainerStart) -> str:
    if gate.allowed:
        text = f"{gate.container}: allowed"
        if gate.delay:
            text += f"; a failure now waits {fmt_seconds(gate.delay)}"
        return text
    text = f"{gate.container}: held back, {fmt_seconds(gate.remaining)} left"
    if gate.prior_delay is not None:
        text += f" of a {fmt_seconds(gate.prior_delay)} back-off"
    return text


def _observed_text(observed: Mapping[str, Any]) -> str:
    parts: list[str] = []
    sandboxes = _list(observed.get("sandboxes"))
    if sandboxes:
        newest = _dict(sandboxes[0])
        text = f"sandbox {_str(newest.get('state'))} (attempt {_str(newest.get('attempt'))})"
        parts.append(text)
    else:
        parts.append("no sandbox")
    names: set[str] = set()
    for container in _list(observed.get("containers")):
        container = _dict(container)
        name = _str(container.get("name"))
        if name in names:
            continue  # newest instance first
        names.add(name)
        state = _str(container.get("state"))
        if state == "exited":
            state = f"exited {_str(container.get('exit_code'))}"
            if container.get("reason"):
                state += f" ({_str(container.get('reason'))})"
        parts.append(f"{name} {state}")
        if len(names) >= 12:
            parts.append("…")
            break
    return "; ".join(parts)


def _oom_marker(t: float, lane: str, observed: _Observed) -> Marker:
    return Marker(t, "oom", f"{lane} was OOM-killed",
                  ("the kernel killed it for exceeding its memory limit", *observed.details))


def _restart_marker(
    t: float, lane: str, before: int, after: int, last_state: Mapping[str, Any]
) -> Marker:
    details = [f"restartCount {before} → {after}"]
    term = _dict(last_state.get("terminated"))
    if term:
        details.append(f"previous instance: {_terminated(term).label}")
        if term.get("finishedAt"):
            details.append(f"finished {_str(term.get('finishedAt'))}")
    return Marker(t, "restart", f"{lane} restarted (#{after})", tuple(details))


def build_timeline(records: Sequence[Record]) -> Timeline:
    """The lanes, segments and markers of a recording (records in any order)."""
    header = next((r for r in records if isinstance(r, Header)), None)
    body = sorted((r for r in records if not isinstance(r, Header)), key=lambda r: r.t)
    if header is not None:
        base, start_time = header.t, header.start_time
    else:
        base, start_time = (body[0].t if body else 0.0), None
    builder = _Builder(base, start_time)
    for record in body:
        builder.add(record)
    duration = max(builder.end, 1.0)
    pods, node_segments = builder.finish(builder.end)
    return Timeline(
        node=header.node if header else "",
        agent_version=header.agent_version if header else "",
        start_time=start_time,
        duration=duration,
        pods=pods,
        node_segments=node_segments,
        node_markers=builder.node_markers,
        record_count=len(records),
        rotated_from=header.rotated_from if header else None,
    )


# -- rendering ----------------------------------------------------------------------------------

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def esc(text: object) -> str:
    """Text for HTML content and attribute values: escaped, without control characters."""
    clean = _CONTROL.sub("\ufffd", str(text))
    clean = clean.encode("utf-8", "replace").decode("utf-8")  # lone surrogates
    return html.escape(clean, quote=True)


COLOURS: Mapping[str, str] = {
    "waiting": "#ced4da",
    "running": "#2f9e44",
    "unready": "#a9dcb5",
    "succeeded": "#3b78d8",
    "failed": "#d9342b",
    "oomkilled": "#7a1012",
    "backoff": "#f2a900",
    "backoff-stripe": "#fbd97a",
    "unknown": "#868e96",
}
_TEXT_ON: Mapping[str, str] = {
    "waiting": "#212529", "unready": "#1b4d2a", "backoff": "#3d2a00", "unknown": "#ffffff",
}
_MARKER_FILL: Mapping[str, str] = {
    "start": "#343a40", "backoff": "#f2a900", "kill": "#c92a2a", "decision": "#868e96",
    "restart": "#ffffff", "oom": "#7a1012", "probe": "#7048e8", "spec": "#1098ad",
    "teardown": "#212529", "problem": "#e8590c", "stream": "#1971c2",
}

_STREAM_TITLES: Mapping[str, str] = {
    "open": "container event stream open: relists are the safety net",
    "closed": "container event stream lost: relisting every second",
    "unsupported": "the runtime has no container event stream: relisting every second",
}
_STATE_WORDS: Mapping[str, str] = {
    "waiting": "waiting", "backoff": "waiting", "succeeded": "terminated",
    "failed": "terminated", "oomkilled": "terminated",
}
_LABEL_W = 220
_RIGHT_PAD = 18
_POD_ROW = 30  # decision markers, then the phase strip, then source changes
_LANE_H = 20
_LANE_GAP = 3
_CHAR_W = 6.6  # DejaVu Sans at 11 px, a little generous


def _num(value: float) -> str:
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _fit(text: str, pixels: float) -> str:
    """``text`` cut to what fits in ``pixels`` at the lane font size ("" if nothing does)."""
    chars = int(pixels / _CHAR_W)
    if chars >= len(text):
        return text
    if chars < 4:
        return ""
    return text[: chars - 1] + "…"


def _tick_step(duration: float, max_ticks: int) -> float:
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
                 7200, 10800, 21600, 43200, 86400):
        if duration / step <= max_ticks:
            return float(step)
    return 86400.0 * math.ceil(duration / (86400.0 * max_ticks))


def _tick_label(value: float, step: float) -> str:
    if step < 1:
        return f"{value:.1f} s"
    if value < 1000:
        return f"{value:.0f} s"
    hours, rest = divmod(round(value), 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "m"), (seconds, "s")]
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0 s"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _tip(summary: str, details: Iterable[str]) -> str:
    return "<title>" + esc("\n".join((summary, *details))) + "</title>"


class _Page:
    def __init__(self, timeline: Timeline, width: int) -> None:
        self.tl = timeline
        self.width = width - 48  # body padding and a vertical scroll bar
        self.x0 = _LABEL_W
        self.plot_w = self.width - _LABEL_W - _RIGHT_PAD
        step = _tick_step(timeline.duration, max(2, int(self.plot_w / 95)))
        self.step = step
        self.ticks = [i * step for i in range(int(timeline.duration / step + 1e-9) + 1)]

    def x(self, t: float) -> float:
        return self.x0 + _clamp(t / self.tl.duration, 0.0, 1.0) * self.plot_w

    # pieces

    def grid(self, height: float) -> str:
        path = "".join(f"M{_num(self.x(v))} 0v{_num(height)}" for v in self.ticks)
        return f'<path class="grid" d="{path}"/>'

    def axis(self) -> str:
        out = [f'<svg class="axis" width="{self.width}" height="30">',
               '<text class="axlabel" x="4" y="19">time since start</text>',
               f'<path class="axline" d="M{self.x0} 24h{_num(self.plot_w)}"/>']
        ticks = "".join(f"M{_num(self.x(v))} 19v5" for v in self.ticks)
        out.append(f'<path class="axline" d="{ticks}"/>')
        for v in self.ticks:
            anchor = ' text-anchor="middle"' if v > 0 else ""
            out.append(f'<text class="tick" x="{_num(self.x(v))}" y="14"{anchor}>'
                       f"{esc(_tick_label(v, self.step))}</text>")
        out.append("</svg>")
        return "".join(out)

    def segment(self, seg: Segment, y: float, h: float, summary: str, inset: float = 3) -> str:
        x1, x2 = self.x(seg.start), self.x(seg.end)
        w = max(x2 - x1, 0.8)
        duration = (f"{fmt_seconds(seg.start)} to {fmt_seconds(seg.end)} "
                    f"({fmt_seconds(seg.end - seg.start)})")
        out = (f'<rect class="s {seg.state}" x="{_num(x1)}" y="{_num(y)}" width="{_num(w)}" '
               f'height="{h}">{_tip(summary, (duration, *seg.details))}</rect>')
        label = _fit(seg.label, w - inset - 3)
        if label:
            out += (f'<text class="sl {seg.state}" x="{_num(x1 + inset)}" '
                    f'y="{_num(y + h / 2 + 4)}">{esc(label)}</text>')
        return out

    def marker(self, marker: Marker, y: float, height: float = 16) -> str:
        x, kind = self.x(marker.t), marker.kind
        if kind in ("start", "backoff", "kill", "decision"):
            tag, geometry = "path", f'd="M{_num(x - 5)} {_num(y)}h10l-5 9z"'
        elif kind == "oom":
            tag, geometry = "path", f'd="M{_num(x)} {_num(y - 7)}l7 7-7 7-7-7z"'
        elif kind == "restart":
            tag, geometry = "circle", f'cx="{_num(x)}" cy="{_num(y)}" r="4.5"'
        elif kind == "probe":
            tag, geometry = "rect", f'x="{_num(x - 4)}" y="{_num(y - 4)}" width="8" height="8"'
        elif kind == "teardown":
            tag, geometry = "path", f'd="M{_num(x - 1)} {_num(y)}h2v{_num(height)}h-2z"'
        else:  # spec, problem
            tag, geometry = "path", f'd="M{_num(x)} {_num(y)}l5 9h-10z"'
        tip = _tip(marker.summary, marker.details)
        return f'<{tag} class="m {kind}" {geometry}>{tip}</{tag}>'

    def pod(self, pod: PodTimeline) -> str:
        height = _POD_ROW + len(pod.lanes) * (_LANE_H + _LANE_GAP) + 4
        phase = pod.phases[-1].label if pod.phases else "no status"
        phase_cls = pod.phases[-1].state if pod.phases else "unknown"
        decisions = sum(1 for m in pod.markers if m.kind in ("start", "backoff", "kill"))
        meta = [f"uid {pod.uid}", _plural(len(pod.lanes), "container"),
                _plural(decisions, "decision"), _plural(len(pod.idle_syncs), "idle sync")]
        if pod.restarts:
            meta.append(_plural(pod.restarts, "restart"))
        out = [f'<details class="pod" open data-name="{esc(pod.display_name.lower())}">',
               f'<summary><span class="pname">{esc(pod.display_name)}</span> '
               f'<span class="badge {phase_cls}">{esc(phase)}</span> '
               f'<span class="meta">{esc(" · ".join(meta))}</span></summary>',
               f'<svg class="lanes" width="{self.width}" height="{height}">',
               self.grid(height)]
        # the pod row: idle sync ticks and decisions, the phase strip, source changes
        out.append('<text class="ll pod" x="14" y="19">pod phase &amp; syncs</text>')
        if pod.idle_syncs:
            out.append(f'<path class="idle" d="{self.idle_path(pod.idle_syncs)}">'
                       f"<title>{_plural(len(pod.idle_syncs), 'sync')} that found nothing to do"
                       "</title></path>")
        for seg in pod.phases:
            out.append(self.segment_strip(seg, 12, 7))
        for marker in pod.markers:
            if marker.kind == "teardown":
                out.append(self.marker(marker, 0, height))
            elif marker.kind in ("spec", "problem"):
                out.append(self.marker(marker, 20))
            else:
                out.append(self.marker(marker, 1))
        y = float(_POD_ROW)
        for lane in pod.lanes:
            out.append(f'<text class="ll" x="22" y="{_num(y + _LANE_H / 2 + 4)}">'
                       f"{esc(_fit(lane.name, _LABEL_W - 90))}<title>{esc(lane.name)}</title>"
                       "</text>")
            if lane.kind != "container":
                out.append(f'<text class="lk {lane.kind}" x="{_LABEL_W - 8}" '
                           f'y="{_num(y + _LANE_H / 2 + 4)}" text-anchor="end">'
                           f"{lane.kind}</text>")
            out.append(f'<rect class="lanebg" x="{self.x0}" y="{_num(y)}" '
                       f'width="{_num(self.plot_w)}" height="{_LANE_H}"/>')
            marked = {round(self.x(m.t)) for m in lane.markers}
            for seg in lane.segments:
                word = _STATE_WORDS.get(seg.state)
                summary = f"{lane.name}: {f'{word}: ' if word else ''}{seg.label}"
                x1 = round(self.x(seg.start))
                inset = 9 if marked & {x1 - 1, x1, x1 + 1} else 3  # clear of a ring or diamond
                out.append(self.segment(seg, y, _LANE_H, summary, inset))
            for marker in lane.markers:
                out.append(self.marker(marker, y + _LANE_H / 2))
            y += _LANE_H + _LANE_GAP
        out.append("</svg></details>")
        return "".join(out)

    def idle_path(self, times: Sequence[float]) -> str:
        """A 1 px tick per sync; ticks 5 px apart or closer merge into a band (long recordings)."""
        columns = sorted({round(self.x(t)) for t in times})
        runs: list[list[int]] = []
        for x in columns:
            if runs and x - runs[-1][1] <= 5:
                runs[-1][1] = x
            else:
                runs.append([x, x])
        return "".join(f"M{a} 3h{b - a + 1}v8h{a - b - 1}z" for a, b in runs)

    def segment_strip(self, seg: Segment, y: float, h: float) -> str:
        x1, x2 = self.x(seg.start), self.x(seg.end)
        duration = f"{fmt_seconds(seg.start)} to {fmt_seconds(seg.end)}"
        return (f'<rect class="s {seg.state}" x="{_num(x1)}" y="{_num(y)}" '
                f'width="{_num(max(x2 - x1, 0.8))}" height="{h}">'
                f"{_tip('pod phase ' + seg.label, (duration, *seg.details))}</rect>")

    def node(self) -> str:
        tl = self.tl
        if not tl.node_segments and not tl.node_markers:
            return ""
        out = ['<details class="pod" open data-name="node"><summary>'
               f'<span class="pname">node {esc(tl.node)}</span> '
               '<span class="meta">runtime reachability, its event stream and manifest problems'
               '</span></summary>',
               f'<svg class="lanes" width="{self.width}" height="{_LANE_H + 8}">',
               self.grid(_LANE_H + 8),
               f'<text class="ll" x="14" y="{_LANE_H / 2 + 6}">runtime</text>']
        for seg in tl.node_segments:
            out.append(self.segment(seg, 2, _LANE_H, "runtime unreachable (relists failed)"))
        for marker in tl.node_markers:
            out.append(self.marker(marker, 4))
        out.append("</svg></details>")
        return "".join(out)

    def legend(self) -> str:
        items = [
            ("waiting", "waiting (reason)"), ("running", "running"),
            ("unready", "running, not ready"), ("succeeded", "exited 0"),
            ("failed", "exited non-zero (code)"), ("oomkilled", "OOMKilled"),
            ("backoff", "CrashLoopBackOff / ImagePullBackOff"),
        ]
        out = ['<div class="legend">']
        for state, text in items:
            out.append(f'<span><svg width="26" height="12"><rect class="s {state}" width="26" '
                       f'height="12"/></svg>{esc(text)}</span>')
        markers: list[tuple[MarkerKind, str]] = [
            ("start", "decision: start"), ("backoff", "decision: held back"),
            ("kill", "decision: kill"), ("restart", "restart"), ("oom", "OOM kill"),
            ("probe", "probe result"), ("spec", "source change"), ("teardown", "teardown"),
        ]
        for kind, text in markers:
            y = 7 if kind in ("restart", "oom", "probe") else 1
            shape = self.marker(Marker(0.0, kind, text), y)
            out.append(f'<span><svg width="18" height="16" class="lm">'
                       f'<g transform="translate({9 - self.x0} 0)">{shape}</g></svg>'
                       f"{esc(text)}</span>")
        out.append('<span><svg width="18" height="16"><path class="idle" d="M9 4h1v9h-1z"/></svg>'
                   "idle sync</span></div>")
        return "".join(out)

    def header(self) -> str:
        tl = self.tl
        start = (datetime.fromtimestamp(tl.start_time, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                 if tl.start_time is not None else "unknown")
        fields = [("node", tl.node or "unknown"), ("agent", tl.agent_version or "unknown"),
                  ("started", start), ("duration", fmt_seconds(tl.duration)),
                  ("pods", str(len(tl.pods))), ("records", str(tl.record_count))]
        if tl.rotated_from:
            fields.append(("continues", tl.rotated_from))
        cells = "".join(f"<span><b>{esc(k)}</b> {esc(v)}</span>" for k, v in fields)
        return f'<header><h1>trio-kubelet timeline</h1><div class="facts">{cells}</div></header>'

    def page(self) -> str:
        tl = self.tl
        body = [self.header(),
                '<div class="tools"><input id="filter" type="search" '
                'placeholder="filter pods by name" aria-label="filter pods">'
                '<button id="collapse" type="button">collapse all</button>'
                '<button id="expand" type="button">expand all</button></div>',
                self.legend(),
                f'<div class="sticky">{self.axis()}</div>',
                self.node()]
        body.extend(self.pod(pod) for pod in tl.pods)
        if not tl.pods:
            body.append('<p class="empty">No pod statuses or decisions in this recording.</p>')
        title = f"timeline — {tl.node}" if tl.node else "timeline"
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{_css(self.width)}</style></head><body>"
            f"{_DEFS}{''.join(body)}<div id=\"tip\" role=\"tooltip\"></div>"
            f"<script>{_JS}</script></body></html>\n"
        )


def _css(width: int) -> str:
    rules = [
        "body{margin:0;padding:12px 16px;font:13px 'DejaVu Sans',Verdana,sans-serif;"
        f"color:#212529;background:#fff;min-width:{width}px}}",
        "header{display:flex;align-items:baseline;gap:24px;flex-wrap:wrap}",
        "h1{font-size:19px;margin:0 0 6px}",
        ".facts{display:flex;gap:18px;flex-wrap:wrap;color:#495057}",
        ".facts b{color:#868e96;font-weight:normal;margin-right:4px}",
        ".tools{margin:8px 0;display:flex;gap:8px}",
        ".tools input{width:280px;padding:3px 6px;font:inherit}",
        ".tools button{font:inherit;padding:2px 10px}",
        ".legend{display:flex;flex-wrap:wrap;gap:6px 16px;font-size:12px;color:#495057;"
        "margin:6px 0 4px}",
        ".legend span{display:inline-flex;align-items:center;gap:5px}",
        ".sticky{position:sticky;top:0;background:#fff;z-index:2;border-bottom:1px solid #dee2e6}",
        "details.pod{border-bottom:1px solid #e9ecef;padding:3px 0}",
        "summary{cursor:pointer;padding:2px 0}",
        ".pname{font-weight:bold}",
        ".meta{color:#868e96;font-size:12px;margin-left:6px}",
        ".badge{font-size:11px;padding:1px 6px;border-radius:8px;color:#fff;"
        "background:#868e96}",
        "svg{display:block;font-family:'DejaVu Sans',Verdana,sans-serif}",
        ".legend svg{display:inline-block}",
        ".grid{stroke:#e9ecef;stroke-width:1}",
        ".axline{stroke:#495057;fill:none}",
        ".tick{font-size:11px;fill:#495057}",
        ".axlabel{font-size:11px;fill:#868e96}",
        ".lanebg{fill:#f8f9fa}",
        ".ll{font-size:12px;fill:#212529}",
        ".ll.pod{fill:#868e96;font-size:11px}",
        ".lk{font-size:10px;fill:#868e96}",
        ".lk.sidecar{fill:#1098ad}",
        ".lk.ephemeral{fill:#7048e8}",
        ".sl{font-size:11px;fill:#fff;pointer-events:none}",
        ".idle{fill:#adb5bd}",
        ".m{stroke:#fff;stroke-width:1}",
        ".m.backoff{stroke:#3d2a00}",
        ".m.restart{stroke:#212529;stroke-width:2}",
        ".m.probe{stroke:#fff}",
        "#tip{position:absolute;display:none;max-width:560px;background:#212529;color:#f8f9fa;"
        "padding:6px 9px;border-radius:4px;font-size:12px;white-space:pre-wrap;z-index:10;"
        "pointer-events:none;box-shadow:0 2px 8px rgba(0,0,0,.3)}",
        "#tip::first-line{font-weight:bold}",
        ".empty{color:#868e96}",
    ]
    for state, colour in COLOURS.items():
        if state == "backoff-stripe":
            continue
        fill = "url(#stripes)" if state == "backoff" else colour
        rules.append(f".s.{state}{{fill:{fill}}}")
        rules.append(f".badge.{state}{{background:{colour}}}")
        rules.append(f".sl.{state}{{fill:{_TEXT_ON.get(state, '#fff')}}}")
    for kind, colour in _MARKER_FILL.items():
        rules.append(f".m.{kind}{{fill:{colour}}}")
    return "".join(rules)


_DEFS = (
    '<svg width="0" height="0" style="position:absolute"><defs>'
    '<pattern id="stripes" width="10" height="10" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)">'
    f'<rect width="10" height="10" fill="{COLOURS["backoff"]}"/>'
    f'<rect width="3" height="10" fill="{COLOURS["backoff-stripe"]}"/>'
    "</pattern></defs></svg>"
)

# The tooltip moves each element's <title> into a property on first hover, so the browser's
# own tooltip does not show as well; text is only ever assigned as textContent.
_JS = """
(function () {
  var tip = document.getElementById('tip');
  function text(el) {
    if (el._tip === undefined) {
      var t = null;
      for (var c = el.firstChild; c; c = c.nextSibling) {
        if (c.nodeName === 'title') { t = c; break; }
      }
      el._tip = t ? t.textContent : null;
      if (t) { el.removeChild(t); }
    }
    return el._tip;
  }
  document.addEventListener('mouseover', function (e) {
    var el = e.target;
    var s = el && el.closest ? el.closest('svg') : null;
    if (!s || !s.contains(el)) { tip.style.display = 'none'; return; }
    var value = text(el);
    if (!value) { tip.style.display = 'none'; return; }
    tip.textContent = value;
    tip.style.display = 'block';
  });
  document.addEventListener('mousemove', function (e) {
    if (tip.style.display !== 'block') { return; }
    var x = e.pageX + 14, y = e.pageY + 14;
    var maxX = window.scrollX + document.documentElement.clientWidth - tip.offsetWidth - 8;
    var maxY = window.scrollY + document.documentElement.clientHeight - tip.offsetHeight - 8;
    if (x > maxX) { x = Math.max(window.scrollX, e.pageX - tip.offsetWidth - 14); }
    if (y > maxY) { y = Math.max(window.scrollY, e.pageY - tip.offsetHeight - 14); }
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  });
  var pods = document.querySelectorAll('details.pod');
  document.getElementById('filter').addEventListener('input', function (e) {
    var q = e.target.value.toLowerCase();
    pods.forEach(function (d) { d.hidden = q !== '' && d.dataset.name.indexOf(q) < 0; });
  });
  document.getElementById('collapse').addEventListener('click', function () {
    pods.forEach(function (d) { d.open = false; });
  });
  document.getElementById('expand').addEventListener('click', function () {
    pods.forEach(function (d) { d.open = true; });
  });
})();
"""


def timeline_html(timeline: Timeline, *, width: int = 1400) -> str:
    """The page for a built timeline, laid out for a window ``width`` pixels wide."""
    return _Page(timeline, width).page()


def render_timeline(records: Sequence[Record], out: Path, *, width: int = 1400) -> None:
    """Write the timeline of ``records`` to ``out`` as one self-contained HTML file."""
    out.write_text(timeline_html(build_timeline(records), width=width), encoding="utf-8")

"""The decision kinds of one pod: its sync (actions, crash-loop gates), status and admission.

Each kind is the one place that says how the shell records it (the wrapper the pod worker or
the sync loop calls instead of the bare pure function), how replay re-decides the record, and
how the trace explains it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Literal

import trio
from pydantic import ValidationError

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
from trio_kubelet.core.eviction import evicted_status
from trio_kubelet.core.observed import (
    ContainerState,
    ProbeResult,
    RuntimeContainer,
    RuntimePodStatus,
    SandboxState,
)
from trio_kubelet.core.phase import compute_pod_status
from trio_kubelet.model.pod import Container, Pod, PodStatus
from trio_kubelet.recording.codec import (
    actions_to_json,
    observed_from_json,
    observed_to_json,
    probe_results_from_json,
    probe_results_to_json,
)
from trio_kubelet.recording.kinds import BadRecord, DecisionKind, Replay
from trio_kubelet.recording.recorder import Recorder
from trio_kubelet.recording.records import (
    AdmissionRecord,
    ContainerStart,
    DecisionRecord,
    StatusRecord,
)

# Gate times are sums and differences of epoch seconds: equal up to float rounding.
GATE_TOLERANCE = 1e-6

class PodSync(DecisionKind[DecisionRecord]):
    """One pod sync: ``compute_pod_actions``, then the crash-loop gate of each start.

    The worker gets one from `decide`, carries out its ``actions``, passes each start
    through `gate`, and calls `record` once the actions are done (the gates are part of
    the record).
    """

    record = DecisionRecord

    def __init__(
        self, recorder: Recorder | None, uid: str, pod: Pod, spec_seq: int,
        observed: RuntimePodStatus, now: float, liveness: Mapping[str, ProbeResult],
        startup: Mapping[str, ProbeResult], actions: PodActions,
    ) -> None:
        self._recorder = recorder
        self._t = trio.current_time()
        self.uid, self.pod, self.spec_seq, self.observed = uid, pod, spec_seq, observed
        self.now = now  # the wall time the actions and gates are decided at
        self._liveness, self._startup = liveness, startup
        self.actions = actions
        self.starts: list[ContainerStart] = []

    @classmethod
    def decide(
        cls, recorder: Recorder | None, uid: str, pod: Pod, spec_seq: int,
        observed: RuntimePodStatus, *, now: float, liveness: Mapping[str, ProbeResult],
        startup: Mapping[str, ProbeResult],
    ) -> PodSync:
        """The sync's actions (``compute_pod_actions``), kept with their inputs."""
        if recorder is not None:  # the maps are live: copy what this decision saw
            liveness, startup = dict(liveness), dict(startup)
        actions = compute_pod_actions(pod, observed, liveness=liveness, startup=startup)
        return cls(recorder, uid, pod, spec_seq, observed, now, liveness, startup, actions)

    def gate(
        self, backoff: Backoff, key: str, container: str, newest: RuntimeContainer | None
    ) -> StartGate:
        """``gate_container_start`` for a container the actions start, kept with its prior entry."""
        prior = backoff.entries.get(key)
        gate = gate_container_start(backoff, key, newest, self.now)
        self.starts.append(ContainerStart(
            container=container, key=key,
            prior_delay=prior.delay if prior else None,
            prior_update=prior.last_update if prior else None,
            allowed=gate.allowed, remaining=gate.remaining, delay=gate.delay,
        ))
        return gate

    def finish(self) -> None:
        """Record the sync (a ``DecisionRecord``) once its actions have been carried out."""
        recorder = self._recorder
        if recorder is None:
            return
        t, name, starts = self._t, self.pod.full_name, list(self.starts)
        liveness = probe_results_to_json(self._liveness)
        startup = probe_results_to_json(self._startup)
        recorder.add(lambda: DecisionRecord(
            t=t, uid=self.uid, pod=name, spec_seq=self.spec_seq, now=self.now,
            observed=observed_to_json(self.observed), liveness=liveness, startup=startup,
            actions=actions_to_json(self.actions), starts=starts,
        ))

    @classmethod
    def replay(cls, replay: Replay, record: DecisionRecord) -> None:
        if not replay.shows(record.pod):
            return
        replay.count("decisions")
        observed, liveness, startup = _decision_inputs(record)
        pod = replay.spec(record.uid, record.spec_seq)
        if pod is None:
            replay.diverge(
                record.pod,
                f"the spec of pod {record.pod} ({record.uid}) set by event seq "
                f"{record.spec_seq} is not in the recording (the file starts after that "
                "event and has no snapshot of it)",
                record.actions,
                {},
            )
            replay.trace(record.pod, record.uid, "(pod spec unknown)", diverged=True)
            return
        actions = compute_pod_actions(pod, observed, liveness=liveness, startup=startup)
        diverged = cls.compare(replay, record.pod,
                               "the replayed actions differ from the recorded ones",
                               record.actions, actions_to_json(actions))
        gates: list[str] = []
        reasons: list[str] = list(record.actions.get("reasons", ())) if replay.explain else []
        to_start = _names_to_start(pod, record.actions)
        for index, start in enumerate(record.starts):
            gate = _check_gate(replay, index, record, pod, observed, start, to_start)
            diverged |= gate is None
            if gate is None:
                continue
            newest = observed.find(start.container)
            text = _gate_text(start.container, newest, gate)
            if text:
                gates.append(text)
            if replay.explain:
                reasons.extend(_gate_reason(pod, start, newest, gate))
        inputs = _explain_inputs(pod, record, observed) if replay.explain else ()
        replay.trace(record.pod, record.uid, summarize(pod, observed, actions), gates=gates,
                     inputs=inputs, reasons=reasons, diverged=diverged)


@dataclass(frozen=True)
class StatusInputs:
    """What a pod status is decided from, as the worker has it and its record keeps it.

    ``decided`` names the pure function: ``sync`` (``compute_pod_status``), ``rejected``
    (``rejected_status`` with admission's ``reason``/``message``; no ``observed``) or
    ``evicted`` (``compute_pod_status`` of a terminal pod, then ``evicted_status``).
    ``previous`` is the status the worker published before (None: none yet).
    """

    decided: Literal["sync", "rejected", "evicted"]
    spec_seq: int
    observed: RuntimePodStatus | None
    previous: PodStatus | None
    readiness: Mapping[str, ProbeResult]
    startup: Mapping[str, ProbeResult]
    host_ip: str
    runtime_name: str
    now: float = 0.0
    errors: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    terminal: bool = False
    reason: str = ""
    message: str = ""
    disruption: bool = True


class PodStatusDecision(DecisionKind[StatusRecord]):
    """The status a pod worker publishes: decided by `decide` on both sides of a recording."""

    record = StatusRecord

    @staticmethod
    def decide(pod: Pod, inputs: StatusInputs) -> PodStatus:
        """The status the pure core gives for ``inputs``."""
        if inputs.decided == "rejected":
            return rejected_status(pod, Rejection(inputs.reason, inputs.message))
        assert inputs.observed is not None
        status = compute_pod_status(
            pod, inputs.observed, now=inputs.now, previous=inputs.previous,
            sync_errors=inputs.errors, readiness=inputs.readiness, startup=inputs.startup,
            host_ip=inputs.host_ip, runtime_name=inputs.runtime_name,
            pod_is_terminal=inputs.terminal,
        )
        if inputs.decided == "evicted":
            status = evicted_status(status, inputs.message, inputs.now, inputs.reason,
                                    disruption=inputs.disruption)
        return status

    @classmethod
    def publish(
        cls, recorder: Recorder | None, uid: str, pod: Pod, inputs: StatusInputs
    ) -> PodStatus:
        """The status to publish; a changed one is recorded with its inputs (a ``StatusRecord``)."""
        status = cls.decide(pod, inputs)
        if recorder is not None and status != inputs.previous:
            t, name, wire = trio.current_time(), pod.full_name, status.to_api()
            fields = _status_fields(inputs)
            recorder.add(lambda: StatusRecord(t=t, uid=uid, pod=name, status=wire, **fields))
        return status

    @classmethod
    def replay(cls, replay: Replay, record: StatusRecord) -> None:
        """Re-decide a published pod status from the inputs recorded with it."""
        previous = replay.last_status(record.uid) if record.prior else None
        try:
            replay.set_status(record.uid, PodStatus.model_validate(record.status))
        except ValidationError as err:
            raise BadRecord("status", err) from None
        if record.decided is None or (record.prior and previous is None):
            return  # recorded without its inputs, or its previous status is not in the file
        if not replay.shows(record.pod):
            return
        replay.count("statuses")
        pod = replay.spec(record.uid, record.spec_seq)
        if pod is None:
            replay.diverge(record.pod, f"the spec of pod {record.pod} ({record.uid}) set "
                           f"by event seq {record.spec_seq} is not in the recording",
                           record.status, {})
            return
        try:
            replayed = cls.decide(pod, _recorded_inputs(record, previous)).to_api()
        except (KeyError, ValueError, TypeError) as err:
            raise BadRecord(f"status: inputs: {err}") from None
        if cls.compare(replay, record.pod, "the replayed pod status differs from the recorded one",
                       record.status, replayed):
            summary = f"status: {replayed.get('phase')} (recorded {record.status.get('phase')})"
            replay.trace(record.pod, record.uid, summary, diverged=True)


def _status_fields(inputs: StatusInputs) -> dict[str, Any]:
    """A status decision's inputs as its record holds them (``prior``: one was published)."""
    return {
        "decided": inputs.decided, "spec_seq": inputs.spec_seq, "now": inputs.now,
        "observed": observed_to_json(inputs.observed) if inputs.observed is not None else {},
        "prior": inputs.previous is not None, "errors": dict(inputs.errors),
        "readiness": probe_results_to_json(inputs.readiness),
        "startup": probe_results_to_json(inputs.startup),
        "host_ip": inputs.host_ip, "runtime_name": inputs.runtime_name,
        "terminal": inputs.terminal, "reason": inputs.reason, "message": inputs.message,
        "disruption": inputs.disruption,
    }


def _recorded_inputs(record: StatusRecord, previous: PodStatus | None) -> StatusInputs:
    """The inputs a status record holds; raises KeyError/ValueError/TypeError if malformed."""
    assert record.decided is not None
    rejected = record.decided == "rejected"
    return StatusInputs(
        decided=record.decided, spec_seq=record.spec_seq,
        observed=None if rejected else observed_from_json(record.observed),
        previous=previous, readiness=probe_results_from_json(record.readiness),
        startup=probe_results_from_json(record.startup), host_ip=record.host_ip,
        runtime_name=record.runtime_name, now=record.now, errors=record.errors,
        terminal=record.terminal, reason=record.reason, message=record.message,
        disruption=record.disruption,
    )


class Admission(DecisionKind[AdmissionRecord]):
    """Whether a new pod may run beside the pods already admitted (``core.admission.admit``)."""

    record = AdmissionRecord

    @staticmethod
    def decide(
        recorder: Recorder | None, uid: str, pod: Pod, seq: int,
        admitted: Mapping[str, tuple[int, Pod]], allocatable: Mapping[str, Fraction], *,
        allowed_unsafe_sysctls: Sequence[str], node_conditions: list[str],
    ) -> Rejection | None:
        """``admit``; ``admitted`` maps the other pods' UIDs to (spec seq, pod), as recorded."""
        rejection = admit(
            pod, [other for _, other in admitted.values()], allocatable,
            allowed_unsafe_sysctls=allowed_unsafe_sysctls, node_conditions=node_conditions,
        )
        if recorder is not None:
            t, name = trio.current_time(), pod.full_name
            seqs = {other: spec_seq for other, (spec_seq, _) in admitted.items()}
            wire = {name: str(value) for name, value in allocatable.items()}
            recorder.add(lambda: AdmissionRecord(
                t=t, uid=uid, pod=name, spec_seq=seq, admitted=seqs, allocatable=wire,
                node_conditions=node_conditions,
                reason=rejection.reason if rejection else None,
                message=rejection.message if rejection else None,
            ))
        return rejection

    @classmethod
    def replay(cls, replay: Replay, record: AdmissionRecord) -> None:
        """Re-decide whether the pod was admitted, from its spec and the admitted pods' specs."""
        if not replay.shows(record.pod):
            return
        replay.count("admissions")
        recorded = {"reason": record.reason, "message": record.message}
        wanted = [(record.uid, record.spec_seq), *record.admitted.items()]
        specs = [replay.spec(uid, seq) for uid, seq in wanted]
        missing = [key for key, spec in zip(wanted, specs, strict=True) if spec is None]
        if missing:
            uid, seq = missing[0]
            replay.diverge(record.pod,
                           f"the spec of pod {uid} set by event seq {seq} is not in the recording",
                           recorded, {})
            return
        pod, *others = (spec for spec in specs if spec is not None)
        try:
            allocatable = {name: Fraction(value) for name, value in record.allocatable.items()}
        except (ValueError, ZeroDivisionError):
            raise BadRecord("allocatable: not a fraction") from None
        rejection = admit(
            pod, others, allocatable,
            allowed_unsafe_sysctls=replay.config().get("allowedUnsafeSysctls") or (),
            node_conditions=record.node_conditions,
        )
        replayed = {
            "reason": rejection.reason if rejection else None,
            "message": rejection.message if rejection else None,
        }
        diverged = cls.compare(replay, record.pod,
                               "the replayed admission differs from the recorded one",
                               recorded, replayed)
        summary = f"reject: {rejection.reason}: {rejection.message}" if rejection else "admit"
        replay.trace(record.pod, record.uid, summary, diverged=diverged)


# -- re-checking a sync ---------------------------------------------------------------------------


def _decision_inputs(
    record: DecisionRecord,
) -> tuple[RuntimePodStatus, dict[str, ProbeResult], dict[str, ProbeResult]]:
    """The recorded inputs as core values; a malformed one is a bad record."""
    try:
        observed = observed_from_json(record.observed)
    except KeyError as err:
        raise BadRecord(f"observed: {json.dumps(err.args[0])} is missing") from None
    except (ValueError, TypeError) as err:
        raise BadRecord(f"observed: {err}") from None
    try:
        liveness = probe_results_from_json(record.liveness)
        startup = probe_results_from_json(record.startup)
    except ValueError as err:
        raise BadRecord(f"liveness/startup: {err}") from None
    return observed, liveness, startup


def _check_gate(
    replay: Replay,
    index: int,
    record: DecisionRecord,
    pod: Pod,
    observed: RuntimePodStatus,
    start: ContainerStart,
    to_start: set[str],
) -> StartGate | None:
    """Re-decide one recorded crash-loop gate from its prior entry; None if it diverged."""
    replay.count("gates")
    where = f"starts[{index}]"
    container = _container(pod, start.container)
    if container is None or start.container not in to_start:
        replay.diverge(
            record.pod,
            f"{where}: the worker gated container {start.container}, which the recorded "
            "actions do not start",
            start.model_dump(),
            {"containers_to_start": sorted(to_start)},
        )
        return None
    if start.prior_delay is not None and start.prior_update is None:
        raise BadRecord(f"{where}.prior_update: required with prior_delay")
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
        replay.diverge(
            record.pod,
            f"{where}: the replayed crash-loop gate of {start.container} differs",
            start.model_dump(),
            replayed.model_dump(),
        )
        return None
    return gate


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


# -- words ----------------------------------------------------------------------------------------


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

"""Replaying a recording: recompute every recorded decision with the pure core and compare.

The replayer rebuilds the desired state the sync loop had (``PodConfig`` fed the
recorded events, or a rotated file's snapshot), keeps every pod spec version by
``(uid, seq)`` — the version the event with that seq set — and hands every decision
record to its kind (``recording.registry``), which re-decides it with the pure core on
the recorded inputs and spec versions and explains it. Any difference from the
recording is a divergence. Nothing here does I/O; time only
advances in ``replay_in_virtual_time``, which walks trio's clock along the recording.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
import trio.testing
from pydantic import ValidationError

from trio_kubelet.config import ConfigError, KubeletConfiguration
from trio_kubelet.core.eviction import Threshold
from trio_kubelet.core.image_gc import ImageGCPolicy
from trio_kubelet.events import EVENT_ADAPTER, PodSetUpdate
from trio_kubelet.images.gc import image_gc_policy
from trio_kubelet.model.pod import Pod, PodStatus
from trio_kubelet.reconcile.podconfig import PodConfig
from trio_kubelet.recording.kinds import BadRecord, Counter
from trio_kubelet.recording.records import EventRecord, Header, Record, SnapshotRecord
from trio_kubelet.recording.registry import KINDS
from trio_kubelet.replay.reader import NumberedRecord, RecordingError, field_path
from trio_kubelet.resources.eviction import EvictionConfig

# How far trio's clock may lag behind the record being replayed (see replay_in_virtual_time).
CLOCK_STEP = 0.01


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
    """One replayed decision, as the trace prints it."""

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
    log_rotations: int = 0  # container logs at the rotation size
    gates: int = 0
    divergences: int = 0
    divergence: Divergence | None = None  # the first one
    end: float = 0.0  # relative time of the last record replayed

    @property
    def ok(self) -> bool:
        return self.divergences == 0


def json_diff(expected: Any, actual: Any) -> str:
    """A unified diff of two JSON values (recorded vs replayed)."""
    before = json.dumps(expected, sort_keys=True, indent=2).splitlines()
    after = json.dumps(actual, sort_keys=True, indent=2).splitlines()
    return "\n".join(difflib.unified_diff(before, after, "recorded", "replayed", lineterm=""))


class Replayer:
    """Consumes a recording record by record (``feed``); the outcome is ``result``.

    Events and snapshots rebuild the pods' spec versions; every decision record is
    re-decided by its kind (``recording.registry.KINDS``), through this replayer as the
    kinds' `Replay`.
    """

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
        self._line, self._t = 0, 0.0  # the record being fed

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
        self._line, self._t = line, t
        if isinstance(record, EventRecord):
            self._event(record)
        elif isinstance(record, SnapshotRecord):
            self._snapshot(record)
        elif (kind := KINDS.get(type(record))) is not None:
            try:
                kind.replay(self, record)
            except BadRecord as err:
                message = _describe(err.message, err.error) if err.error else err.message
                raise RecordingError(line, message) from None

    def _event(self, record: EventRecord) -> None:
        self.result.events += 1
        try:
            event = EVENT_ADAPTER.validate_python(record.event)
        except ValidationError as err:
            raise RecordingError(self._line, _describe("event", err)) from None
        if isinstance(event, PodSetUpdate):
            for change in self._config.apply(event):
                if change.pod is not None:
                    self._versions[(change.uid, record.seq)] = change.pod

    def _snapshot(self, record: SnapshotRecord) -> None:
        """Start over from the pod sets a rotated file begins with."""
        line = self._line
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

    # -- what the decision kinds re-decide with (recording.kinds.Replay) ----------------------

    def shows(self, pod: str | None) -> bool:
        if self.pod is None:
            return True
        return pod is not None and self._wanted(pod)

    def spec(self, uid: str, seq: int) -> Pod | None:
        return self._versions.get((uid, seq))

    def config(self) -> Mapping[str, Any]:
        return self.header.config if self.header else {}

    def thresholds(self) -> Sequence[Threshold]:
        return self._eviction().thresholds

    def transition_period(self) -> float:
        return self._eviction().transition_period

    def image_gc_policy(self) -> ImageGCPolicy:
        """The image GC policy of the recording's configuration (parsed once)."""
        if self._image_gc_policy is None:
            self._image_gc_policy = image_gc_policy(self._header_config())
        return self._image_gc_policy

    def last_status(self, uid: str) -> PodStatus | None:
        return self._statuses.get(uid)

    def set_status(self, uid: str, status: PodStatus) -> None:
        self._statuses[uid] = status

    def count(self, counter: Counter, n: int = 1) -> None:
        setattr(self.result, counter, getattr(self.result, counter) + n)

    def diverge(
        self, pod: str, reason: str, expected: Mapping[str, Any], actual: Mapping[str, Any]
    ) -> None:
        result = self.result
        result.divergences += 1
        if result.divergence is None:
            diff = json_diff(expected, actual)
            result.divergence = Divergence(self._line, result.events, pod, reason,
                                           dict(expected), dict(actual), diff)

    def trace(
        self, pod: str, uid: str, summary: str, *, gates: Sequence[str] = (),
        inputs: Sequence[str] = (), reasons: Sequence[str] = (), diverged: bool = False,
    ) -> None:
        self.result.trace.append(DecisionTrace(
            self._line, self._t, pod, uid, summary, tuple(gates), tuple(inputs), tuple(reasons),
            diverged,
        ))

    def _eviction(self) -> EvictionConfig:
        """The eviction settings of the recording's configuration (parsed once)."""
        if self._eviction_config is None:
            try:
                self._eviction_config = EvictionConfig.from_config(self._header_config())
            except ConfigError as err:
                raise RecordingError(self._line, f"header config: {err}") from None
        return self._eviction_config

    def _header_config(self) -> KubeletConfiguration:
        try:
            return KubeletConfiguration.model_validate(self.config())
        except ValidationError as err:
            raise RecordingError(self._line, f"header config: {err}") from None

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

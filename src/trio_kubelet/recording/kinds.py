"""Decision kinds: what every recorded decision is registered with, on both sides of a recording.

A kind (``pod_decisions``, ``node_decisions``; all of them in ``registry.KINDS``) holds, in one
class, its record type, the recording wrapper the shell calls instead of the bare pure function
(so a call site can neither forget the record nor build it from other values than the ones the
core decided on), how replay re-decides a record of it, and the words the trace explains it with.
Replay reaches the recording's state only through `Replay`, so nothing here imports ``replay/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from trio_kubelet.core.eviction import Threshold
from trio_kubelet.core.image_gc import ImageGCPolicy
from trio_kubelet.model.pod import Pod, PodStatus

R = TypeVar("R", bound=BaseModel)

Counter = Literal[
    "decisions", "statuses", "admissions", "evictions", "gc_passes", "log_rotations", "gates"
]


class BadRecord(Exception):
    """A recorded input the core cannot take: ``message`` names the field (with ``error``,
    the field's validation error, which the replayer words)."""

    def __init__(self, message: str, error: ValidationError | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.error = error


class Replay(Protocol):
    """What the replayer offers a kind re-deciding one record (the one it is feeding)."""

    @property
    def explain(self) -> bool: ...

    def shows(self, pod: str | None) -> bool:
        """Whether ``--pod`` lets this pod's decision through (None: a node-wide one)."""
        ...

    def spec(self, uid: str, seq: int) -> Pod | None:
        """The pod spec version the event with ``seq`` set (None: not in the recording)."""
        ...

    def config(self) -> Mapping[str, Any]:
        """The recording's configuration, as its header holds it."""
        ...

    def thresholds(self) -> Sequence[Threshold]: ...

    def transition_period(self) -> float: ...

    def image_gc_policy(self) -> ImageGCPolicy: ...

    def last_status(self, uid: str) -> PodStatus | None:
        """The pod's status as its previous status record held it."""
        ...

    def set_status(self, uid: str, status: PodStatus) -> None: ...

    def count(self, counter: Counter, n: int = 1) -> None: ...

    def diverge(
        self, pod: str, reason: str, expected: Mapping[str, Any], actual: Mapping[str, Any]
    ) -> None:
        """A decision replayed differently (the record as ``expected``)."""
        ...

    def trace(
        self, pod: str, uid: str, summary: str, *, gates: Sequence[str] = (),
        inputs: Sequence[str] = (), reasons: Sequence[str] = (), diverged: bool = False,
    ) -> None:
        """A line of the trace, at the record being fed; ``inputs`` and ``reasons`` are the
        explanation (``explain``): the state behind the decision, and why, in words."""
        ...


class DecisionKind(Generic[R]):
    """One kind of recorded decision; subclasses add the shell's recording wrapper."""

    record: ClassVar[type[BaseModel]]

    @classmethod
    def replay(cls, replay: Replay, record: R) -> None:
        """Re-decide ``record`` with the pure core: a divergence if it differs, a trace line."""
        raise NotImplementedError

    @staticmethod
    def compare(
        replay: Replay, pod: str, reason: str, recorded: Mapping[str, Any],
        replayed: Mapping[str, Any],
    ) -> bool:
        """Whether the replayed decision differs from the recorded one (a divergence if so)."""
        diverged = replayed != recorded
        if diverged:
            replay.diverge(pod, reason, recorded, replayed)
        return diverged

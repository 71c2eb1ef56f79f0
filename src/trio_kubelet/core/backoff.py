"""Crash-loop backoff: how long a container that keeps exiting must wait before it restarts.

client-go's ``flowcontrol.Backoff`` as an immutable value, used the way the kubelet's
``doBackOff`` uses it: the delay starts at 10 s, doubles with each restart up to
300 s, and an entry not touched for twice the maximum (10 min) is forgotten, so a
container that ran cleanly that long starts again from 10 s. There is no jitter
(the kubelet's crash-loop backoff has none) so decisions replay exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from trio_kubelet.core.hashing import container_hash
from trio_kubelet.core.observed import ContainerState, RuntimeContainer
from trio_kubelet.model.pod import Container, Pod

CRASH_LOOP_INITIAL_SECONDS = 10.0
CRASH_LOOP_MAX_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class BackoffEntry:
    """The current delay for one key and when it last grew."""

    delay: float
    last_update: float


@dataclass(frozen=True)
class Backoff:
    """Per-key exponential backoff; every update returns a new value."""

    initial: float = CRASH_LOOP_INITIAL_SECONDS
    maximum: float = CRASH_LOOP_MAX_SECONDS
    entries: Mapping[str, BackoffEntry] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum <= 0:
            raise ValueError("backoff initial and maximum must be positive")
        if self.initial > self.maximum:
            # As the kubelet does when a configured maximum is below the initial delay.
            object.__setattr__(self, "initial", self.maximum)

    def _expired(self, entry: BackoffEntry, event_time: float) -> bool:
        return event_time - entry.last_update > 2 * self.maximum

    def delay(self, key: str) -> float:
        """The current delay for ``key`` (0.0 when it has none)."""
        entry = self.entries.get(key)
        return entry.delay if entry is not None else 0.0

    def in_backoff(self, key: str, finished_at: float, now: float) -> float:
        """Seconds before ``key``, finished at ``finished_at``, may restart (0.0: now)."""
        entry = self.entries.get(key)
        if entry is None or self._expired(entry, finished_at):
            return 0.0
        return max(0.0, entry.delay - (now - finished_at))

    def next(self, key: str, now: float, *, event_time: float | None = None) -> Backoff:
        """Record a restart of ``key``: a new or expired entry gets the initial delay, else double.

        ``event_time`` (the container's finish time, as the kubelet passes it) decides
        expiry; it defaults to ``now``.
        """
        entry = self.entries.get(key)
        when = now if event_time is None else event_time
        if entry is None or self._expired(entry, when):
            delay = self.initial
        else:
            delay = min(2 * entry.delay, self.maximum)
        entries = dict(self.entries)
        entries[key] = BackoffEntry(delay, now)
        return replace(self, entries=MappingProxyType(entries))

    def reset(self, key: str) -> Backoff:
        """Forget ``key`` (its next restart gets the initial delay)."""
        if key not in self.entries:
            return self
        entries = {k: v for k, v in self.entries.items() if k != key}
        return replace(self, entries=MappingProxyType(entries))

    def gc(self, now: float) -> Backoff:
        """Drop every entry not updated for twice the maximum delay."""
        kept = {k: v for k, v in self.entries.items() if not self._expired(v, now)}
        if len(kept) == len(self.entries):
            return self
        return replace(self, entries=MappingProxyType(kept))


def backoff_key(pod: Pod, container: Container) -> str:
    """``GetStableKey``: a spec edit gives the container a fresh backoff."""
    meta = pod.metadata
    return f"{meta.name}_{meta.namespace}_{meta.uid}_{container.name}_{container_hash(container)}"


def format_duration(seconds: float) -> str:
    """A duration as Go prints one: 10s, 1m20s, 5m0s, 1h0m0s."""
    whole = int(seconds)
    fraction = seconds - whole
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    sec_text = f"{secs + fraction:g}s" if fraction else f"{secs}s"
    if hours:
        return f"{hours}h{minutes}m{sec_text}"
    if minutes:
        return f"{minutes}m{sec_text}"
    return sec_text


def crash_loop_message(delay: float, pod: Pod, container: Container) -> str:
    """The CrashLoopBackOff waiting message, worded as the Go kubelet words it."""
    meta = pod.metadata
    return (
        f"back-off {format_duration(delay)} restarting failed container={container.name} "
        f"pod={meta.name}_{meta.namespace}({meta.uid})"
    )


@dataclass(frozen=True, slots=True)
class StartGate:
    """Whether a container may start now, and the backoff state that follows (doBackOff)."""

    allowed: bool
    remaining: float
    delay: float
    backoff: Backoff


def gate_container_start(
    backoff: Backoff, key: str, newest: RuntimeContainer | None, now: float
) -> StartGate:
    """Decide a start under crash-loop backoff.

    Only a container whose newest instance exited is subject to backoff; a start
    that is allowed advances the backoff (doubling it), as the kubelet does when it
    restarts an exited container.
    """
    if newest is None or newest.state is not ContainerState.EXITED:
        return StartGate(True, 0.0, 0.0, backoff)
    remaining = backoff.in_backoff(key, newest.finished_at, now)
    if remaining > 0:
        return StartGate(False, remaining, backoff.delay(key), backoff)
    advanced = backoff.next(key, now, event_time=newest.finished_at)
    return StartGate(True, 0.0, advanced.delay(key), advanced)

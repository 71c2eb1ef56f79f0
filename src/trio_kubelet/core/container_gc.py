"""Container GC's choice: which dead containers, sandboxes and pod log directories go.

The Go kubelet's containerGC, as a pure function of what the runtime holds, which
pods still exist and the policy. Dead instances are grouped per (pod UID, container
name), an *evict unit*. Per unit the newest ``max_per_pod_container`` dead
instances stay (``kubectl logs --previous`` reads the newest); past
``max_containers`` in total, every unit is cut to an equal share and then the
oldest go across the node. A container younger than ``min_age`` always stays.

One rule is ours and stronger than Go's: while its pod exists, the newest exited
instance of each container is never removed, whatever the limits say, and neither
is its newest instance of all (a created one may be starting right now). The agent
keeps no other record of a container's exit (the pod worker reads exit codes and
restart counts from the runtime), so removing it would make a finished
``restartPolicy: Never`` container look never started, and the worker would run
it again, and a restarted container would lose its ``lastState``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from operator import attrgetter

from trio_kubelet.core.observed import ContainerState, SandboxState

__all__ = [
    "GCContainer",
    "GCPlan",
    "GCPolicy",
    "GCSandbox",
    "log_dir_pod_uid",
    "plan_container_gc",
]


@dataclass(frozen=True, slots=True)
class GCPolicy:
    """The Go kubelet's container GC flags; a negative limit means none."""

    min_age: float = 0.0  # --minimum-container-ttl-duration, seconds
    max_per_pod_container: int = 1  # --maximum-dead-containers-per-container
    max_containers: int = -1  # --maximum-dead-containers


@dataclass(frozen=True, slots=True)
class GCContainer:
    """One container as the runtime lists it. ``pod_uid`` is "" when no kubelet made it."""

    id: str
    pod_uid: str
    name: str
    state: ContainerState
    created_at: float  # seconds since the epoch
    attempt: int = 0
    sandbox_id: str = ""
    # Its CRI log file relative to the pod logs directory, "" if unknown (the runtime
    # leaves the file behind when the container is removed).
    log_path: str = ""


@dataclass(frozen=True, slots=True)
class GCSandbox:
    """One pod sandbox as the runtime lists it. ``pod_uid`` is "" when no kubelet made it."""

    id: str
    pod_uid: str
    state: SandboxState
    created_at: float
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class GCPlan:
    """What one GC pass removes, in removal order: containers oldest first, then sandboxes
    (only once their containers are gone: a runtime removes a sandbox's containers with
    it), then pod log directories (names relative to the pod logs directory)."""

    containers: tuple[GCContainer, ...] = ()
    sandboxes: tuple[GCSandbox, ...] = ()
    log_dirs: tuple[str, ...] = ()
    dead: int = 0  # dead containers seen, for the pass's log line

    def __bool__(self) -> bool:
        return bool(self.containers or self.sandboxes or self.log_dirs)


_Unit = tuple[str, str]  # (pod UID, container name)
_Predicate = Callable[[str], bool]
# Newest first; attempt then id break ties of a coarse clock, so the choice is deterministic.
_NEWEST_FIRST = attrgetter("created_at", "attempt", "id")


def plan_container_gc(
    containers: Iterable[GCContainer],
    sandboxes: Iterable[GCSandbox],
    *,
    policy: GCPolicy,
    now: float,
    existing_pods: Collection[str],
    sources_ready: bool,
    log_dirs: Iterable[str] = (),
) -> GCPlan:
    """Choose what to remove. ``existing_pods``: UIDs some source wants or a worker is
    still tearing down. Until ``sources_ready`` every pod counts as existing (a pod a
    source has not reported yet may be one a restarted agent is about to adopt), so
    nothing is removed for belonging to a gone pod, and no log directory goes.

    Never chosen: a running container, a ready sandbox, a sandbox that keeps a
    container, anything not made by a kubelet.
    """
    listed = list(containers)

    def gone(uid: str) -> bool:
        return sources_ready and uid not in existing_pods

    units, protected, dead = _evict_units(listed, policy.min_age, now, gone)
    removed: list[GCContainer] = []
    kept: dict[_Unit, list[GCContainer]] = {}
    for unit, instances in units.items():
        if gone(unit[0]):
            removed += instances
        else:
            kept[unit] = _cut(instances, policy.max_per_pod_container, protected, removed)
    if policy.max_containers >= 0:
        _enforce_total(kept, policy.max_containers, protected, removed)
    removed.sort(key=_NEWEST_FIRST)
    removed_ids = {c.id for c in removed}
    remaining = [c for c in listed if c.id not in removed_ids]
    doomed_sandboxes = _sandboxes_to_remove(sandboxes, remaining, gone)
    doomed_ids = {s.id for s in doomed_sandboxes}
    dirs: tuple[str, ...] = ()
    if sources_ready:
        occupied = {c.pod_uid for c in remaining}
        occupied.update(s.pod_uid for s in sandboxes if s.id not in doomed_ids)
        dirs = tuple(
            sorted(
                name
                for name in log_dirs
                if (uid := log_dir_pod_uid(name)) and gone(uid) and uid not in occupied
            )
        )
    return GCPlan(tuple(removed), tuple(doomed_sandboxes), dirs, dead)


def _evict_units(
    containers: list[GCContainer],
    min_age: float,
    now: float,
    gone: _Predicate,
) -> tuple[dict[_Unit, list[GCContainer]], set[str], int]:
    """The removable dead instances per unit (newest first), the ids no rule may remove
    (each existing pod's newest dead and newest exited instance per container) and the
    dead count.

    The newest exited one besides the newest dead one: while the worker starts a new
    instance, the runtime lists it as created (not running), and it must not push out
    the exit the pod's status shows as ``lastState``.
    """
    units: dict[_Unit, list[GCContainer]] = {}
    newest_dead: dict[_Unit, GCContainer] = {}
    newest_exited: dict[_Unit, GCContainer] = {}
    newest_allowed = now - min_age
    dead = 0
    for c in containers:
        if not c.pod_uid or c.state is ContainerState.RUNNING:
            continue
        dead += 1
        unit = (c.pod_uid, c.name)
        if not gone(c.pod_uid):
            _keep_newest(newest_dead, unit, c)
            if c.state is ContainerState.EXITED:
                _keep_newest(newest_exited, unit, c)
        if c.created_at <= newest_allowed:
            units.setdefault(unit, []).append(c)
    for instances in units.values():
        instances.sort(key=_NEWEST_FIRST, reverse=True)
    protected = {c.id for c in newest_dead.values()} | {c.id for c in newest_exited.values()}
    return units, protected, dead


def _keep_newest(newest: dict[_Unit, GCContainer], unit: _Unit, c: GCContainer) -> None:
    best = newest.get(unit)
    if best is None or _NEWEST_FIRST(c) > _NEWEST_FIRST(best):
        newest[unit] = c


def _cut(
    instances: list[GCContainer], keep: int, protected: set[str], removed: list[GCContainer]
) -> list[GCContainer]:
    """Keep the newest ``keep`` of a unit (newest first; negative: all) and the protected
    instance; append the rest to ``removed``; return what stays."""
    if keep < 0 or len(instances) <= keep:
        return instances
    stays = instances[:keep]
    for c in instances[keep:]:
        (stays if c.id in protected else removed).append(c)
    return stays


def _enforce_total(
    kept: dict[_Unit, list[GCContainer]],
    max_containers: int,
    protected: set[str],
    removed: list[GCContainer],
) -> None:
    """Bring the removable dead containers down to ``max_containers``: first an equal
    share per unit (at least one each), then the oldest across every unit."""
    total = sum(len(instances) for instances in kept.values())
    if total <= max_containers:
        return
    share = max(1, max_containers // sum(1 for instances in kept.values() if instances))
    for unit, instances in kept.items():
        kept[unit] = _cut(instances, share, protected, removed)
    flat = sorted((c for instances in kept.values() for c in instances), key=_NEWEST_FIRST)
    excess = len(flat) - max_containers
    for c in flat:  # oldest first
        if excess <= 0:
            break
        if c.id not in protected:
            removed.append(c)
            excess -= 1


def _sandboxes_to_remove(
    sandboxes: Iterable[GCSandbox], remaining: Iterable[GCContainer], gone: _Predicate
) -> list[GCSandbox]:
    """Not-ready sandboxes that no remaining container uses: all of a gone pod's, every
    one but the newest of an existing pod's (the worker's next sync reads it)."""
    occupied = {c.sandbox_id for c in remaining}
    by_pod: dict[str, list[GCSandbox]] = {}
    for s in sandboxes:
        if s.pod_uid:
            by_pod.setdefault(s.pod_uid, []).append(s)
    chosen: list[GCSandbox] = []
    for uid, group in by_pod.items():
        group.sort(key=_NEWEST_FIRST, reverse=True)
        candidates = group if gone(uid) else group[1:]
        chosen += [
            s for s in candidates if s.state is not SandboxState.READY and s.id not in occupied
        ]
    chosen.sort(key=_NEWEST_FIRST)
    return chosen


def log_dir_pod_uid(name: str) -> str:
    """The pod UID of a pod log directory ``<namespace>_<name>_<uid>``; "" for any other name.

    Namespaces and pod names cannot hold "_", so anything else is not ours to remove.
    """
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return ""
    return parts[2]

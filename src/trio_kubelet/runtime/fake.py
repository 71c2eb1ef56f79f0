"""An in-memory, scriptable CRI runtime that behaves like containerd, for tests and simulation.

`FakeRuntime` holds the state and containerd's rules (sync methods taking and
returning CRI messages, raising `CRIError`), so it can also be driven without
any socket. `serve_fake_runtime` serves it over a real unix socket with grpclib
(an asyncio loop in a worker thread) so the real `CRIClient` can talk to it;
`open_fake_runtime` gives a `CRIClient` that reaches it in-process on trio, for
code under trio's MockClock.

Time comes from an injectable ``clock`` (seconds since the epoch). Scripted
container exits are evaluated lazily whenever state is read, so nothing runs in
the background and results are deterministic under a fake clock.

With ``event_stream=True`` it serves GetContainerEvents as containerd 2.x does (an event
for every container and sandbox created, started, stopped and deleted, carrying the
sandbox's status and its containers' statuses); a stream waits on its serving loop for the
next event or the next scripted exit. Without it (the default) that call answers
UNIMPLEMENTED, as containerd 1.6 does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import ipaddress
import json
import math
import os
import time
import weakref
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, NoReturn, TypeVar

import grpclib
import grpclib.const
import grpclib.protocol
import grpclib.server
import outcome
import trio
from grpclib.encoding.proto import ProtoCodec

from .asyncio_thread import open_asyncio_thread
from .client import DEFAULT_TIMEOUT, Answer, CRIClient, Observer, deadline_exceeded
from .cri.runtime import v1
from .errors import CRIError, StatusCode, error_for

__all__ = [
    "ContainerScript",
    "EventSubscription",
    "ExecResult",
    "FakeRuntime",
    "FakeTransport",
    "in_process_opener",
    "normalize_image_ref",
    "open_fake_runtime",
    "serve_fake_runtime",
]

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
Q = TypeVar("Q")
R = TypeVar("R")

RUNNING = v1.ContainerState.CONTAINER_RUNNING
CREATED = v1.ContainerState.CONTAINER_CREATED
EXITED = v1.ContainerState.CONTAINER_EXITED
UNKNOWN = v1.ContainerState.CONTAINER_UNKNOWN
CONTAINER_CREATED_EVENT = v1.ContainerEventType.CONTAINER_CREATED_EVENT
CONTAINER_STARTED_EVENT = v1.ContainerEventType.CONTAINER_STARTED_EVENT
CONTAINER_STOPPED_EVENT = v1.ContainerEventType.CONTAINER_STOPPED_EVENT
CONTAINER_DELETED_EVENT = v1.ContainerEventType.CONTAINER_DELETED_EVENT
READY = v1.PodSandboxState.SANDBOX_READY
NOTREADY = v1.PodSandboxState.SANDBOX_NOTREADY

START_ERROR_EXIT_CODE = 128  # containerd's exit code and reason for a failed start
KILLED_EXIT_CODE = 137
IMAGE_FS_MOUNTPOINT = "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs"


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What an ExecSync of a command answers; ``delay`` is how long the command runs."""

    stdout: bytes = b""
    stderr: bytes = b""
    exit_code: int = 0
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class ContainerScript:
    """How one (pod name, container name) behaves in the fake.

    ``exit_after`` seconds after a successful start the process exits with
    ``exit_code`` (or is OOM-killed, 137, if ``oom``). ``fail_create`` /
    ``fail_start`` make those calls fail with the given message (a failed start
    leaves the container EXITED with reason StartError, as containerd does).
    On StopContainer the process needs ``term_grace`` seconds to exit on SIGTERM
    with ``stop_exit_code``; if that exceeds the stop timeout it is killed (137).
    ExecSync answers from ``exec_results`` by exact argv, else ``default_exec``.
    """

    exit_after: float | None = None
    exit_code: int = 0
    oom: bool = False
    fail_create: str | None = None
    fail_start: str | None = None
    term_grace: float = 0.0
    stop_exit_code: int = 143
    exec_results: Mapping[tuple[str, ...], ExecResult] = field(default_factory=dict)
    default_exec: ExecResult = ExecResult()


DEFAULT_SCRIPT = ContainerScript()


class EventSubscription:
    """One GetContainerEvents stream of the fake: the events published to it, in order (each
    a ContainerEventResponse already encoded), then the error that ends it. ``wake`` is set
    by whoever waits for the next event."""

    def __init__(self) -> None:
        self.events: collections.deque[bytes] = collections.deque()
        self.error: CRIError | None = None
        self.wake: Callable[[], None] | None = None

    def put(self, event: bytes) -> None:
        self.events.append(event)
        self._woken()

    def end(self, error: CRIError) -> None:
        self.error = error
        self._woken()

    def _woken(self) -> None:
        if self.wake is not None:
            self.wake()


#: How a stream's serving loop waits until `EventSubscription.wake` is called or
#: ``timeout`` seconds pass (None: no timeout): trio's or asyncio's.
Wait = Callable[[EventSubscription, float | None], Awaitable[None]]


@dataclass(slots=True)
class _Image:
    id: str
    repo_tags: list[str]
    repo_digests: list[str]
    size: int
    pinned: bool = False

    def message(self) -> v1.Image:
        return v1.Image(id=self.id, repo_tags=list(self.repo_tags),
                        repo_digests=list(self.repo_digests), size=self.size,
                        spec=v1.ImageSpec(image=self.id), pinned=self.pinned)


@dataclass(slots=True)
class _Sandbox:
    id: str
    config: v1.PodSandboxConfig
    metadata: v1.PodSandboxMetadata
    created_at: int
    runtime_handler: str
    network_mode: v1.NamespaceMode
    ip: str
    name_key: str
    state: v1.PodSandboxState = READY
    listed: v1.PodSandbox | None = None  # caches, dropped on every change
    wire: bytes | None = None  # as a list reply's element
    status_wire: bytes | None = None  # the PodSandboxStatus encoded

    def changed(self) -> None:
        self.listed = self.wire = self.status_wire = None

    @property
    def labels(self) -> dict[str, str]:
        return self.config.labels


@dataclass(slots=True)
class _Container:
    id: str
    sandbox_id: str
    pod_name: str
    config: v1.ContainerConfig
    metadata: v1.ContainerMetadata
    image_id: str
    image_ref: str
    created_at: int
    log_path: str
    name_key: str
    resources: v1.LinuxContainerResources | None
    state: v1.ContainerState = CREATED
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    exit_at: int | None = None  # ns; when a scripted exit is due
    exit_plan: tuple[int, str] = (0, "")  # (exit code, reason) of the scripted exit
    cpu_ns: int = 0
    memory_bytes: int = 0
    listed: v1.Container | None = None  # caches, dropped on every change
    wire: bytes | None = None  # as a list reply's element
    status_wire: bytes | None = None  # the ContainerStatus encoded

    def changed(self) -> None:
        self.listed = self.wire = self.status_wire = None

    @property
    def labels(self) -> dict[str, str]:
        return self.config.labels


def _fail(method: str, code: StatusCode, message: str) -> NoReturn:
    raise error_for(method, code, message)


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _field(number: int, encoded: bytes) -> bytes:
    """An encoded message as field ``number`` (< 16) of another (one element if repeated),
    as it appears on the wire."""
    size, prefix = len(encoded), bytearray([number << 3 | 2])
    while size > 0x7F:
        prefix.append((size & 0x7F) | 0x80)
        size >>= 7
    prefix.append(size)
    return bytes(prefix) + encoded


def normalize_image_ref(ref: str) -> str:
    """Docker-style normalisation: ``busybox`` -> ``docker.io/library/busybox:latest``."""
    if ref.startswith("sha256:"):
        return ref
    name, at, digest = ref.partition("@")
    first, slash, _ = name.partition("/")
    if not slash or ("." not in first and ":" not in first and first != "localhost"):
        name = f"docker.io/{name}" if slash else f"docker.io/library/{name}"
    if not at and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return f"{name}{at}{digest}"


class FakeRuntime:
    """containerd's CRI behaviour over in-memory state; see the module docstring."""

    def __init__(self, clock: Clock = time.time, *, pull_by_default: bool = True,
                 runtime_handlers: Iterable[str] = ("", "runc"),
                 event_stream: bool = False,
                 default_script: Callable[[v1.ContainerConfig], ContainerScript] | None = None,
                 pod_network: str = "10.88.0.0/16") -> None:
        self.clock = clock
        #: How a container nobody scripted behaves, from its config (e.g. its command,
        #: ``fake_commands.script_for``); None: it runs until stopped.
        self.default_script = default_script
        self._pod_network = ipaddress.IPv4Network(pod_network)
        #: Whether GetContainerEvents is served (containerd 2.x) or UNIMPLEMENTED (1.6).
        self.event_stream = event_stream
        self._subscriptions: list[EventSubscription] = []
        self.pull_by_default = pull_by_default
        self.runtime_handlers = set(runtime_handlers)
        #: Number of calls per CRI method name ("RunPodSandbox"), counted by the server.
        self.calls: collections.Counter[str] = collections.Counter()
        #: ExecSync and StopContainer requests as the server received them, in order:
        #: (method, container id, argv of ExecSync or timeout of StopContainer).
        self.container_calls: list[tuple[str, str, tuple[str, ...] | int]] = []
        self.pod_cidr = ""
        #: What containerd's verbose Status reports as its sandbox (pause) image.
        self.sandbox_image = "registry.k8s.io/pause:3.9"
        #: PullImage requests as received, in order: (image, auth or None).
        self.pull_requests: list[tuple[str, v1.AuthConfig | None]] = []
        #: PullImage calls being served now, and the most there ever were at once.
        self.pulls_in_flight = 0
        self.max_pulls_in_flight = 0
        self._pull_credentials: dict[str, tuple[str, str]] = {}
        self._sandboxes: dict[str, _Sandbox] = {}
        self._containers: dict[str, _Container] = {}
        self._names: dict[str, str] = {}  # reserved sandbox/container name -> id
        self._images: dict[str, _Image] = {}  # image id -> image
        self._tags: dict[str, str] = {}  # normalized tag or digest ref -> image id
        self._pullable: dict[str, bool] = {}
        self._scripts: dict[tuple[str, str], ContainerScript] = {}
        self._sandbox_failures: dict[str, str] = {}
        self._pending_exits: set[str] = set()
        self._delays: dict[str, float] = {}
        self._unavailable = False
        self._network_ready = True
        self._serial = 0
        # Pod IPs: .2 to .254 of each /24 of the pod network, the ith of them numbered i.
        self._ip_count = max(1, self._pod_network.num_addresses // 256) * 253
        self._last_ip = -1  # the number of the address given last
        self._ips_in_use: set[str] = set()  # addresses of ready sandboxes

    # -- scripting API (for tests) ----------------------------------------------------------

    def script(self, pod: str, container: str, behaviour: ContainerScript) -> None:
        """Script every future container named ``container`` in pods named ``pod``."""
        self._scripts[(pod, container)] = behaviour

    def fail_sandbox(self, pod: str, message: str | None) -> None:
        """Make RunPodSandbox for pods named ``pod`` fail (None clears it)."""
        if message is None:
            self._sandbox_failures.pop(pod, None)
        else:
            self._sandbox_failures[pod] = message

    def add_image(self, ref: str, *, size: int = 1_000_000, pinned: bool = False) -> str:
        """Make an image present (as if pulled); returns its id."""
        name = normalize_image_ref(ref)
        image_id = f"sha256:{_digest('image', name)}"
        image = self._images.get(image_id)
        if image is None:
            repo = name.rsplit(":", 1)[0] if "@" not in name else name.split("@")[0]
            digest = f"{repo}@sha256:{_digest('manifest', name)}"
            image = self._images[image_id] = _Image(image_id, [], [digest], size, pinned)
            self._tags[digest] = image_id
        if "@" not in name and name not in image.repo_tags:
            image.repo_tags.append(name)
        self._tags[name] = image_id
        return image_id

    def set_pullable(self, ref: str, ok: bool) -> None:
        """Whether PullImage of ``ref`` succeeds (others follow ``pull_by_default``)."""
        self._pullable[normalize_image_ref(ref)] = ok

    def require_credentials(self, ref: str, username: str, password: str) -> None:
        """PullImage of ``ref`` fails as unauthorized unless given these credentials."""
        self._pull_credentials[normalize_image_ref(ref)] = (username, password)

    @property
    def image_bytes(self) -> int:
        """The size of every image present (what ImageFsInfo reports as used)."""
        return sum(i.size for i in self._images.values())

    def crash(self, container_id: str, exit_code: int = 1) -> None:
        """The container's process exits now with ``exit_code``."""
        container = self._container("crash", container_id)
        self._settle(container)
        if container.state == RUNNING:
            self._exit(container, exit_code, "Completed" if exit_code == 0 else "Error",
                       _ns(self.clock()))

    def lose_track(self, container_id: str) -> None:
        """The runtime can no longer tell the container's state: CONTAINER_UNKNOWN.

        Stopping it makes it exited (a real runtime kills whatever may still run).
        """
        container = self._container("lose_track", container_id)
        container.state = UNKNOWN
        container.changed()

    def oom_kill(self, container_id: str) -> None:
        """The kernel OOM-kills the container's process now."""
        container = self._container("oom_kill", container_id)
        self._settle(container)
        if container.state == RUNNING:
            self._exit(container, KILLED_EXIT_CODE, "OOMKilled", _ns(self.clock()))

    def set_usage(self, container_id: str, *, cpu_ns: int, memory_bytes: int) -> None:
        """What the stats RPCs report for a container."""
        container = self._container("set_usage", container_id)
        container.cpu_ns, container.memory_bytes = cpu_ns, memory_bytes

    def set_unavailable(self, unavailable: bool) -> None:
        """Simulate an outage: every served call answers UNAVAILABLE, open streams break."""
        self._unavailable = unavailable
        if unavailable:
            self.drop_event_streams()

    def drop_event_streams(self) -> None:
        """End every open GetContainerEvents stream with UNAVAILABLE (a broken connection)."""
        for subscription in self._subscriptions:
            subscription.end(error_for("GetContainerEvents", StatusCode.UNAVAILABLE,
                                       "fake runtime dropped the event stream"))
        self._subscriptions.clear()

    def set_network_ready(self, ready: bool) -> None:
        self._network_ready = ready

    def set_delay(self, method: str, seconds: float) -> None:
        """Delay every served call of ``method`` (e.g. to exceed a deadline)."""
        if seconds > 0:
            self._delays[method] = seconds
        else:
            self._delays.pop(method, None)

    @property
    def open_event_streams(self) -> int:
        """How many GetContainerEvents streams are open now."""
        return len(self._subscriptions)

    def container_ids(self) -> list[str]:
        return list(self._containers)

    def ready_sandboxes(self) -> int:
        return sum(1 for sandbox in self._sandboxes.values() if sandbox.state == READY)

    def sandbox_ids(self) -> list[str]:
        return list(self._sandboxes)

    # -- internals --------------------------------------------------------------------------

    def _next_id(self, kind: str) -> str:
        self._serial += 1
        return _digest(kind, str(self._serial))

    def _sandbox(self, method: str, id: str) -> _Sandbox:
        sandbox = self._sandboxes.get(id) or self._by_prefix(self._sandboxes, id)
        if sandbox is None:
            _fail(method, StatusCode.NOT_FOUND,
                  f"an error occurred when try to find sandbox {id!r}: not found")
        return sandbox

    def _container(self, method: str, id: str) -> _Container:
        container = self._containers.get(id) or self._by_prefix(self._containers, id)
        if container is None:
            _fail(method, StatusCode.NOT_FOUND,
                  f"an error occurred when try to find container {id!r}: not found")
        return container

    @staticmethod
    def _by_prefix(store: Mapping[str, Any], prefix: str) -> Any:
        # containerd resolves unique id prefixes (truncindex).
        if not prefix:
            return None
        found = [v for k, v in store.items() if k.startswith(prefix)]
        return found[0] if len(found) == 1 else None

    def _script(self, container: _Container) -> ContainerScript:
        return self._script_for(container.pod_name, container.config)

    def _script_for(self, pod: str, config: v1.ContainerConfig) -> ContainerScript:
        scripted = self._scripts.get((pod, config.metadata.name if config.metadata else ""))
        if scripted is not None:
            return scripted
        return self.default_script(config) if self.default_script else DEFAULT_SCRIPT

    def _settle(self, container: _Container) -> None:
        """Apply a scripted exit whose time has come."""
        if container.exit_at is not None and _ns(self.clock()) >= container.exit_at:
            code, reason = container.exit_plan
            self._exit(container, code, reason, container.exit_at)

    def _settle_all(self) -> None:
        if self._pending_exits:
            for id in list(self._pending_exits):
                self._settle(self._containers[id])

    def _exit(self, container: _Container, code: int, reason: str, at: int, *,
              told: bool = True) -> None:
        """The container's process is gone; ``told``: a stopped event says so (containerd
        sends none for a start that failed)."""
        container.state = EXITED
        container.exit_code, container.reason, container.finished_at = code, reason, at
        container.exit_at = None
        container.changed()
        self._pending_exits.discard(container.id)
        if told:
            self._publish(container.id, container.sandbox_id, CONTAINER_STOPPED_EVENT)

    def _publish(self, object_id: str, sandbox_id: str, kind: v1.ContainerEventType) -> None:
        """Tell every open event stream of a change, as containerd 2 does right after it:
        with the sandbox's status (none once it is deleted) and its containers' statuses."""
        if not self._subscriptions:
            return
        sandbox = self._sandboxes.get(sandbox_id)
        # Encoded from the statuses' own caches (fields 4 and 5 of ContainerEventResponse).
        event = b"".join([
            bytes(v1.ContainerEventResponse(container_id=object_id, container_event_type=kind,
                                            created_at=_ns(self.clock()))),
            _field(4, self._sandbox_status_wire(sandbox)) if sandbox is not None else b"",
            *(_field(5, self._container_status_wire(c)) for c in self._containers.values()
              if c.sandbox_id == sandbox_id)])
        for subscription in self._subscriptions:
            subscription.put(event)

    def _next_exit_in(self) -> float | None:
        """Seconds until the next scripted exit (None: none is due)."""
        due = [c.exit_at for id in self._pending_exits
               if (c := self._containers[id]).exit_at is not None]
        return max(0.0, min(due) / 1e9 - self.clock()) if due else None

    def _resolve_image(self, ref: str) -> _Image | None:
        if ref.startswith("sha256:"):
            return self._images.get(ref) or self._by_prefix(self._images, ref)
        image_id = self._tags.get(normalize_image_ref(ref))
        return self._images.get(image_id) if image_id else None

    # -- RuntimeService ---------------------------------------------------------------------

    def version(self, request: v1.VersionRequest) -> v1.VersionResponse:
        return v1.VersionResponse(version="0.1.0", runtime_name="fake",
                                  runtime_version="0.1.0", runtime_api_version="v1")

    def status(self, request: v1.StatusRequest) -> v1.StatusResponse:
        network = v1.RuntimeCondition(type="NetworkReady", status=self._network_ready)
        if not self._network_ready:
            network.reason = "NetworkPluginNotReady"
            network.message = "Network plugin returns error: cni plugin not initialized"
        conditions = [v1.RuntimeCondition(type="RuntimeReady", status=True), network]
        config = {"fake": True, "sandboxImage": self.sandbox_image}
        info = {"config": json.dumps(config)} if request.verbose else {}
        return v1.StatusResponse(status=v1.RuntimeStatus(conditions=conditions), info=info)

    def update_runtime_config(
        self, request: v1.UpdateRuntimeConfigRequest,
    ) -> v1.UpdateRuntimeConfigResponse:
        config = request.runtime_config
        if config is not None and config.network_config is not None:
            self.pod_cidr = config.network_config.pod_cidr
        return v1.UpdateRuntimeConfigResponse()

    def run_pod_sandbox(self, request: v1.RunPodSandboxRequest) -> v1.RunPodSandboxResponse:
        method = "RunPodSandbox"
        config = request.config
        if config is None or config.metadata is None:
            _fail(method, StatusCode.UNKNOWN, "sandbox config must include metadata")
        meta = config.metadata
        if request.runtime_handler not in self.runtime_handlers:
            _fail(method, StatusCode.UNKNOWN,
                  f"failed to get sandbox runtime: no runtime for {request.runtime_handler!r} "
                  "is configured")
        name_key = f"{meta.name}_{meta.namespace}_{meta.uid}_{meta.attempt}"
        if name_key in self._names:
            _fail(method, StatusCode.UNKNOWN,
                  f"failed to reserve sandbox name {name_key!r}: name {name_key!r} is reserved "
                  f"for {self._names[name_key]!r}")
        mode = _network_mode(config)
        if mode == v1.NamespaceMode.NODE and config.hostname:
            _fail(method, StatusCode.UNKNOWN,
                  "failed to start sandbox container task: unable to set hostname without a "
                  "private UTS namespace")
        if meta.name in self._sandbox_failures:
            _fail(method, StatusCode.UNKNOWN, self._sandbox_failures[meta.name])
        id = self._next_id("sandbox")
        ip = "" if mode == v1.NamespaceMode.NODE else self._next_ip()
        self._names[name_key] = id
        self._sandboxes[id] = _Sandbox(
            id=id, config=config, metadata=meta, created_at=_ns(self.clock()),
            runtime_handler=request.runtime_handler, network_mode=mode, ip=ip, name_key=name_key)
        self._publish(id, id, CONTAINER_CREATED_EVENT)
        self._publish(id, id, CONTAINER_STARTED_EVENT)
        return v1.RunPodSandboxResponse(pod_sandbox_id=id)

    def _next_ip(self) -> str:
        """The next free pod IP after the one given last, as host-local IPAM allocates (.2 to
        .254 of each /24 of the pod network, round and round): one is free again once its
        sandbox has stopped. None free fails as the CNI plugin does."""
        for step in range(1, self._ip_count + 1):
            number = (self._last_ip + step) % self._ip_count
            subnet, host = divmod(number, 253)
            ip = str(self._pod_network.network_address + subnet * 256 + host + 2)
            if ip not in self._ips_in_use:
                self._last_ip = number
                self._ips_in_use.add(ip)
                return ip
        _fail("RunPodSandbox", StatusCode.UNKNOWN,
              'failed to setup network for sandbox: plugin type="host-local" failed (add): '
              f"failed to allocate for range 0: no IP addresses available in range set: "
              f"{self._pod_network}")

    def stop_pod_sandbox(self, request: v1.StopPodSandboxRequest) -> v1.StopPodSandboxResponse:
        sandbox = self._sandbox("StopPodSandbox", request.pod_sandbox_id)
        now = _ns(self.clock())
        for container in self._containers.values():
            if container.sandbox_id == sandbox.id:
                self._settle(container)
                if container.state == RUNNING:
                    self._exit(container, KILLED_EXIT_CODE, "Error", now)
        if sandbox.state == READY:
            sandbox.state = NOTREADY
            sandbox.changed()
            self._ips_in_use.discard(sandbox.ip)  # the network torn down: the IP is free
            self._publish(sandbox.id, sandbox.id, CONTAINER_STOPPED_EVENT)
        return v1.StopPodSandboxResponse()

    def remove_pod_sandbox(
        self, request: v1.RemovePodSandboxRequest,
    ) -> v1.RemovePodSandboxResponse:
        sandbox = self._sandboxes.get(request.pod_sandbox_id)
        if sandbox is None:
            return v1.RemovePodSandboxResponse()  # containerd: nothing to do
        if sandbox.state == READY:
            self.stop_pod_sandbox(v1.StopPodSandboxRequest(pod_sandbox_id=sandbox.id))
        for container in [c for c in self._containers.values() if c.sandbox_id == sandbox.id]:
            self._forget_container(container)
        self._publish(sandbox.id, sandbox.id, CONTAINER_DELETED_EVENT)
        del self._sandboxes[sandbox.id]
        self._names.pop(sandbox.name_key, None)
        return v1.RemovePodSandboxResponse()

    def pod_sandbox_status(
        self, request: v1.PodSandboxStatusRequest,
    ) -> v1.PodSandboxStatusResponse:
        sandbox = self._sandbox("PodSandboxStatus", request.pod_sandbox_id)
        status = self._sandbox_status(sandbox)
        info = {}
        if request.verbose:
            info["info"] = json.dumps({"hostname": sandbox.config.hostname,
                                       "cgroupParent": _cgroup_parent(sandbox.config)})
        return v1.PodSandboxStatusResponse(status=status, info=info,
                                           timestamp=_ns(self.clock()))

    def pod_sandbox_status_wire(
        self, request: v1.PodSandboxStatusRequest,
    ) -> v1.PodSandboxStatusResponse | bytes:
        """`pod_sandbox_status` encoded, the status kept encoded until the sandbox changes
        (what a runtime spends encoding is no part of what a benchmark of the agent measures)."""
        if request.verbose:
            return self.pod_sandbox_status(request)
        sandbox = self._sandbox("PodSandboxStatus", request.pod_sandbox_id)
        return _field(1, self._sandbox_status_wire(sandbox)) + bytes(
            v1.PodSandboxStatusResponse(timestamp=_ns(self.clock())))

    def _sandbox_status_wire(self, sandbox: _Sandbox) -> bytes:
        if sandbox.status_wire is None:
            sandbox.status_wire = bytes(self._sandbox_status(sandbox))
        return sandbox.status_wire

    @staticmethod
    def _sandbox_status(sandbox: _Sandbox) -> v1.PodSandboxStatus:
        namespace = _namespace_options(sandbox.config)
        return v1.PodSandboxStatus(
            id=sandbox.id, metadata=sandbox.metadata, state=sandbox.state,
            created_at=sandbox.created_at,
            network=v1.PodSandboxNetworkStatus(ip=sandbox.ip),
            linux=v1.LinuxPodSandboxStatus(namespaces=v1.Namespace(options=namespace)),
            labels=dict(sandbox.config.labels), annotations=dict(sandbox.config.annotations),
            runtime_handler=sandbox.runtime_handler)

    def list_pod_sandbox(self, request: v1.ListPodSandboxRequest) -> v1.ListPodSandboxResponse:
        return v1.ListPodSandboxResponse(items=[self._listed_sandbox(s)
                                                for s in self._select_sandboxes(request)])

    def list_pod_sandbox_wire(self, request: v1.ListPodSandboxRequest) -> bytes:
        """ListPodSandbox's answer already encoded, from per-sandbox caches (the fast path)."""
        return b"".join(self._sandbox_wire(s) for s in self._select_sandboxes(request))

    def _select_sandboxes(self, request: v1.ListPodSandboxRequest) -> list[_Sandbox]:
        want = request.filter
        if want is None:
            return list(self._sandboxes.values())
        selected = []
        for sandbox in self._sandboxes.values():
            if want.id and not sandbox.id.startswith(want.id):
                continue
            if want.state is not None and sandbox.state != want.state.state:
                continue
            if want.label_selector and not _matches(sandbox.labels, want.label_selector):
                continue
            selected.append(sandbox)
        return selected

    def _listed_sandbox(self, sandbox: _Sandbox) -> v1.PodSandbox:
        if sandbox.listed is None:
            sandbox.listed = v1.PodSandbox(
                id=sandbox.id, metadata=sandbox.metadata, state=sandbox.state,
                created_at=sandbox.created_at, labels=sandbox.config.labels,
                annotations=sandbox.config.annotations, runtime_handler=sandbox.runtime_handler)
        return sandbox.listed

    def _sandbox_wire(self, sandbox: _Sandbox) -> bytes:
        if sandbox.wire is None:
            sandbox.wire = _field(1, bytes(self._listed_sandbox(sandbox)))
        return sandbox.wire

    def create_container(
        self, request: v1.CreateContainerRequest,
    ) -> v1.CreateContainerResponse:
        method = "CreateContainer"
        sandbox = self._sandbox(method, request.pod_sandbox_id)
        config = request.config
        if config is None or config.metadata is None:
            _fail(method, StatusCode.UNKNOWN, "container config must include metadata")
        meta, pod = config.metadata, sandbox.metadata
        name_key = f"{meta.name}_{pod.name}_{pod.namespace}_{pod.uid}_{meta.attempt}"
        if name_key in self._names:
            _fail(method, StatusCode.UNKNOWN,
                  f"failed to reserve container name {name_key!r}: name {name_key!r} is "
                  f"reserved for {self._names[name_key]!r}")
        ref = config.image.image if config.image is not None else ""
        image = self._resolve_image(ref)
        if image is None:
            _fail(method, StatusCode.NOT_FOUND, f"failed to resolve image {ref!r}: not found")
        script = self._script_for(pod.name, config)
        if script.fail_create is not None:
            _fail(method, StatusCode.UNKNOWN, script.fail_create)
        id = self._next_id("container")
        log_path = ""
        if sandbox.config.log_directory and config.log_path:
            log_path = os.path.join(sandbox.config.log_directory, config.log_path)
            # containerd creates the (empty) log file with the container; the agent reads
            # restart counts from these names when no instance is left.
            with contextlib.suppress(OSError):
                open(log_path, "a").close()
        linux = config.linux.resources if config.linux is not None else None
        self._names[name_key] = id
        self._containers[id] = _Container(
            id=id, sandbox_id=sandbox.id, pod_name=pod.name, config=config, metadata=meta,
            image_id=image.id, image_ref=image.repo_digests[0] if image.repo_digests else image.id,
            created_at=_ns(self.clock()), log_path=log_path, name_key=name_key, resources=linux)
        self._publish(id, sandbox.id, CONTAINER_CREATED_EVENT)
        return v1.CreateContainerResponse(container_id=id)

    def start_container(self, request: v1.StartContainerRequest) -> v1.StartContainerResponse:
        method = "StartContainer"
        container = self._container(method, request.container_id)
        self._settle(container)
        if container.state != CREATED:
            _fail(method, StatusCode.UNKNOWN,
                  f"failed to set starting state for container {container.id!r}: container is "
                  f"in {container.state.name} state")
        sandbox = self._sandboxes.get(container.sandbox_id)
        if sandbox is None or sandbox.state != READY:
            _fail(method, StatusCode.UNKNOWN,
                  f"sandbox container {container.sandbox_id!r} is not running")
        script = self._script(container)
        now = _ns(self.clock())
        container.changed()
        if script.fail_start is not None:
            self._exit(container, START_ERROR_EXIT_CODE, "StartError", now, told=False)
            container.message = script.fail_start
            _fail(method, StatusCode.UNKNOWN,
                  f"failed to start containerd task {container.id!r}: {script.fail_start}")
        container.state, container.started_at = RUNNING, now
        if script.oom or script.exit_after is not None:
            container.exit_at = now + _ns(script.exit_after or 0.0)
            container.exit_plan = ((KILLED_EXIT_CODE, "OOMKilled") if script.oom else
                                   (script.exit_code,
                                    "Completed" if script.exit_code == 0 else "Error"))
            self._pending_exits.add(container.id)
        self._publish(container.id, container.sandbox_id, CONTAINER_STARTED_EVENT)
        return v1.StartContainerResponse()

    def stop_wait(self, request: v1.StopContainerRequest) -> float:
        """How long StopContainer takes in real time (the process's SIGTERM grace)."""
        container = self._container("StopContainer", request.container_id)
        self._settle(container)
        if container.state != RUNNING or request.timeout <= 0:
            return 0.0
        return min(self._script(container).term_grace, float(request.timeout))

    def stop_container(self, request: v1.StopContainerRequest) -> v1.StopContainerResponse:
        container = self._container("StopContainer", request.container_id)
        self._settle(container)
        if container.state == UNKNOWN:
            self._exit(container, KILLED_EXIT_CODE, "Error", _ns(self.clock()))
        if container.state != RUNNING:
            return v1.StopContainerResponse()  # containerd: created/exited need no stopping
        script = self._script(container)
        now = _ns(self.clock())
        if request.timeout > 0 and script.term_grace <= request.timeout:
            code = script.stop_exit_code
            self._exit(container, code, "Completed" if code == 0 else "Error", now)
        else:
            self._exit(container, KILLED_EXIT_CODE, "Error", now)
        return v1.StopContainerResponse()

    def remove_container(
        self, request: v1.RemoveContainerRequest,
    ) -> v1.RemoveContainerResponse:
        container = self._containers.get(request.container_id)
        if container is None:
            return v1.RemoveContainerResponse()  # containerd: nothing to do
        self._settle(container)
        if container.state in (RUNNING, UNKNOWN):
            _fail("RemoveContainer", StatusCode.UNKNOWN,
                  f"failed to set removing state for container {container.id!r}: container is "
                  "still running, to stop first")
        self._forget_container(container)
        return v1.RemoveContainerResponse()

    def _forget_container(self, container: _Container) -> None:
        del self._containers[container.id]
        self._names.pop(container.name_key, None)
        self._pending_exits.discard(container.id)
        self._publish(container.id, container.sandbox_id, CONTAINER_DELETED_EVENT)

    def list_containers(self, request: v1.ListContainersRequest) -> v1.ListContainersResponse:
        return v1.ListContainersResponse(containers=[self._listed_container(c)
                                                     for c in self._select_containers(request)])

    def list_containers_wire(self, request: v1.ListContainersRequest) -> bytes:
        """ListContainers' answer already encoded, from per-container caches (the fast path)."""
        return b"".join(self._container_wire(c) for c in self._select_containers(request))

    def _select_containers(self, request: v1.ListContainersRequest) -> list[_Container]:
        self._settle_all()
        want = request.filter
        if want is None:
            return list(self._containers.values())
        selected = []
        for c in self._containers.values():
            if want.id and not c.id.startswith(want.id):
                continue
            if want.state is not None and c.state != want.state.state:
                continue
            if want.pod_sandbox_id and not c.sandbox_id.startswith(want.pod_sandbox_id):
                continue
            if want.label_selector and not _matches(c.labels, want.label_selector):
                continue
            selected.append(c)
        return selected

    def _listed_container(self, c: _Container) -> v1.Container:
        if c.listed is None:
            c.listed = v1.Container(
                id=c.id, pod_sandbox_id=c.sandbox_id, metadata=c.metadata,
                image=c.config.image, image_ref=c.image_id, state=c.state,
                created_at=c.created_at, labels=c.config.labels,
                annotations=c.config.annotations, image_id=c.image_id)
        return c.listed

    def _container_wire(self, c: _Container) -> bytes:
        if c.wire is None:
            c.wire = _field(1, bytes(self._listed_container(c)))
        return c.wire

    def container_status(
        self, request: v1.ContainerStatusRequest,
    ) -> v1.ContainerStatusResponse:
        c = self._container("ContainerStatus", request.container_id)
        self._settle(c)
        info = {}
        if request.verbose:
            info["info"] = json.dumps({"sandboxID": c.sandbox_id, "pid": 0 if c.state != RUNNING
                                       else 1000 + len(c.id)})
        return v1.ContainerStatusResponse(status=self._container_status(c), info=info)

    def container_status_wire(
        self, request: v1.ContainerStatusRequest,
    ) -> v1.ContainerStatusResponse | bytes:
        """`container_status` encoded, the status kept encoded until the container changes."""
        if request.verbose:
            return self.container_status(request)
        c = self._container("ContainerStatus", request.container_id)
        self._settle(c)
        return _field(1, self._container_status_wire(c))

    def _container_status_wire(self, c: _Container) -> bytes:
        if c.status_wire is None:
            c.status_wire = bytes(self._container_status(c))
        return c.status_wire

    @staticmethod
    def _container_status(c: _Container) -> v1.ContainerStatus:
        return v1.ContainerStatus(
            id=c.id, metadata=c.metadata, state=c.state, created_at=c.created_at,
            started_at=c.started_at, finished_at=c.finished_at, exit_code=c.exit_code,
            image=c.config.image, image_ref=c.image_ref, reason=c.reason, message=c.message,
            labels=dict(c.config.labels), annotations=dict(c.config.annotations),
            mounts=list(c.config.mounts), log_path=c.log_path,
            resources=v1.ContainerResources(linux=c.resources) if c.resources else None,
            image_id=c.image_id)

    def update_container_resources(
        self, request: v1.UpdateContainerResourcesRequest,
    ) -> v1.UpdateContainerResourcesResponse:
        method = "UpdateContainerResources"
        container = self._container(method, request.container_id)
        self._settle(container)
        if container.state not in (CREATED, RUNNING):
            _fail(method, StatusCode.UNKNOWN,
                  f"container {container.id!r} is in {container.state.name} state")
        if request.linux is not None:
            container.resources = request.linux
            container.changed()
        return v1.UpdateContainerResourcesResponse()

    def reopen_container_log(
        self, request: v1.ReopenContainerLogRequest,
    ) -> v1.ReopenContainerLogResponse:
        container = self._container("ReopenContainerLog", request.container_id)
        self._settle(container)
        if container.state != RUNNING:
            _fail("ReopenContainerLog", StatusCode.UNKNOWN, "container is not running")
        if container.log_path:  # as containerd: the output goes on in a new file of that name
            with contextlib.suppress(OSError):
                open(container.log_path, "a").close()
        return v1.ReopenContainerLogResponse()

    def _running(self, method: str, id: str) -> _Container:
        container = self._container(method, id)
        self._settle(container)
        if container.state != RUNNING:
            _fail(method, StatusCode.UNKNOWN, f"container is in {container.state.name} state")
        return container

    def exec_result(self, request: v1.ExecSyncRequest) -> ExecResult:
        """The scripted answer to an ExecSync (its ``delay`` is served as real time)."""
        container = self._running("ExecSync", request.container_id)
        script = self._script(container)
        return script.exec_results.get(tuple(request.cmd), script.default_exec)

    def exec_sync(self, request: v1.ExecSyncRequest) -> v1.ExecSyncResponse:
        result = self.exec_result(request)
        if request.timeout > 0 and result.delay > request.timeout:
            _fail("ExecSync", StatusCode.DEADLINE_EXCEEDED,
                  f"failed to exec in container: timeout {request.timeout}s exceeded: context "
                  "deadline exceeded")
        return v1.ExecSyncResponse(stdout=result.stdout, stderr=result.stderr,
                                   exit_code=result.exit_code)

    def exec(self, request: v1.ExecRequest) -> v1.ExecResponse:
        container = self._running("Exec", request.container_id)
        return v1.ExecResponse(url=f"http://127.0.0.1:0/exec/{_digest('exec', container.id)[:8]}")

    def attach(self, request: v1.AttachRequest) -> v1.AttachResponse:
        container = self._running("Attach", request.container_id)
        url = f"http://127.0.0.1:0/attach/{_digest('attach', container.id)[:8]}"
        return v1.AttachResponse(url=url)

    def port_forward(self, request: v1.PortForwardRequest) -> v1.PortForwardResponse:
        sandbox = self._sandbox("PortForward", request.pod_sandbox_id)
        if sandbox.state != READY:
            _fail("PortForward", StatusCode.UNKNOWN,
                  f"pod sandbox {sandbox.id!r} is not running")
        url = f"http://127.0.0.1:0/portforward/{_digest('pf', sandbox.id)[:8]}"
        return v1.PortForwardResponse(url=url)

    def _stats(self, c: _Container, now: int) -> v1.ContainerStats:
        running = c.state == RUNNING
        return v1.ContainerStats(
            attributes=v1.ContainerAttributes(id=c.id, metadata=c.metadata,
                                              labels=dict(c.config.labels),
                                              annotations=dict(c.config.annotations)),
            cpu=v1.CpuUsage(timestamp=now, usage_core_nano_seconds=v1.UInt64Value(
                c.cpu_ns if running else 0)),
            memory=v1.MemoryUsage(timestamp=now, working_set_bytes=v1.UInt64Value(
                c.memory_bytes if running else 0)),
            writable_layer=v1.FilesystemUsage(
                timestamp=now, fs_id=v1.FilesystemIdentifier(mountpoint=IMAGE_FS_MOUNTPOINT),
                used_bytes=v1.UInt64Value(0), inodes_used=v1.UInt64Value(0)))

    def container_stats(self, request: v1.ContainerStatsRequest) -> v1.ContainerStatsResponse:
        container = self._container("ContainerStats", request.container_id)
        self._settle(container)
        return v1.ContainerStatsResponse(stats=self._stats(container, _ns(self.clock())))

    def list_container_stats(
        self, request: v1.ListContainerStatsRequest,
    ) -> v1.ListContainerStatsResponse:
        self._settle_all()
        want, now = request.filter, _ns(self.clock())
        stats = [self._stats(c, now) for c in self._containers.values()
                 if want is None or (
                     (not want.id or c.id.startswith(want.id))
                     and (not want.pod_sandbox_id or c.sandbox_id.startswith(want.pod_sandbox_id))
                     and _matches(c.labels, want.label_selector))]
        return v1.ListContainerStatsResponse(stats=stats)

    def _sandbox_stats(self, sandbox: _Sandbox, now: int) -> v1.PodSandboxStats:
        containers = [self._stats(c, now) for c in self._containers.values()
                      if c.sandbox_id == sandbox.id]
        cpu = sum(s.cpu.usage_core_nano_seconds.value for s in containers
                  if s.cpu and s.cpu.usage_core_nano_seconds)
        memory = sum(s.memory.working_set_bytes.value for s in containers
                     if s.memory and s.memory.working_set_bytes)
        return v1.PodSandboxStats(
            attributes=v1.PodSandboxAttributes(id=sandbox.id, metadata=sandbox.metadata,
                                               labels=dict(sandbox.config.labels),
                                               annotations=dict(sandbox.config.annotations)),
            linux=v1.LinuxPodSandboxStats(
                cpu=v1.CpuUsage(timestamp=now, usage_core_nano_seconds=v1.UInt64Value(cpu)),
                memory=v1.MemoryUsage(timestamp=now, working_set_bytes=v1.UInt64Value(memory)),
                containers=containers))

    def pod_sandbox_stats(
        self, request: v1.PodSandboxStatsRequest,
    ) -> v1.PodSandboxStatsResponse:
        sandbox = self._sandbox("PodSandboxStats", request.pod_sandbox_id)
        self._settle_all()
        return v1.PodSandboxStatsResponse(stats=self._sandbox_stats(sandbox, _ns(self.clock())))

    def list_pod_sandbox_stats(
        self, request: v1.ListPodSandboxStatsRequest,
    ) -> v1.ListPodSandboxStatsResponse:
        self._settle_all()
        want, now = request.filter, _ns(self.clock())
        stats = [self._sandbox_stats(s, now) for s in self._sandboxes.values()
                 if want is None or ((not want.id or s.id.startswith(want.id))
                                     and _matches(s.labels, want.label_selector))]
        return v1.ListPodSandboxStatsResponse(stats=stats)

    # -- ImageService -----------------------------------------------------------------------

    def list_images(self, request: v1.ListImagesRequest) -> v1.ListImagesResponse:
        want = request.filter
        if want is not None and want.image is not None and want.image.image:
            image = self._resolve_image(want.image.image)
            return v1.ListImagesResponse(images=[image.message()] if image else [])
        return v1.ListImagesResponse(images=[i.message() for i in self._images.values()])

    def image_status(self, request: v1.ImageStatusRequest) -> v1.ImageStatusResponse:
        image = self._resolve_image(request.image.image if request.image else "")
        if image is None:
            return v1.ImageStatusResponse()  # containerd: absent, not an error
        info = {"info": json.dumps({"size": image.size})} if request.verbose else {}
        return v1.ImageStatusResponse(image=image.message(), info=info)

    def pull_image(self, request: v1.PullImageRequest) -> v1.PullImageResponse:
        ref = request.image.image if request.image else ""
        name = normalize_image_ref(ref)
        self.pull_requests.append((ref, request.auth))
        if not self._pullable.get(name, self.pull_by_default):
            _fail("PullImage", StatusCode.UNKNOWN,
                  f"failed to pull and unpack image {name!r}: failed to resolve reference "
                  f"{name!r}: {name}: not found")
        wanted = self._pull_credentials.get(name)
        auth = request.auth
        if wanted is not None and (auth is None or (auth.username, auth.password) != wanted):
            _fail("PullImage", StatusCode.UNKNOWN,
                  f"failed to pull and unpack image {name!r}: failed to resolve reference "
                  f"{name!r}: pulling from host failed with status code 401 Unauthorized")
        return v1.PullImageResponse(image_ref=self.add_image(ref))

    def remove_image(self, request: v1.RemoveImageRequest) -> v1.RemoveImageResponse:
        image = self._resolve_image(request.image.image if request.image else "")
        if image is not None:  # every tag of the image goes, as in containerd
            del self._images[image.id]
            for tag in [t for t, i in self._tags.items() if i == image.id]:
                del self._tags[tag]
        return v1.RemoveImageResponse()

    def image_fs_info(self, request: v1.ImageFsInfoRequest) -> v1.ImageFsInfoResponse:
        usage = v1.FilesystemUsage(
            timestamp=_ns(self.clock()),
            fs_id=v1.FilesystemIdentifier(mountpoint=IMAGE_FS_MOUNTPOINT),
            used_bytes=v1.UInt64Value(sum(i.size for i in self._images.values())),
            inodes_used=v1.UInt64Value(len(self._images)))
        return v1.ImageFsInfoResponse(image_filesystems=[usage], container_filesystems=[usage])

    # -- serving ----------------------------------------------------------------------------

    async def answer(self, method: str, request: Any, sleep: Sleep, *, wire: bool = True) -> Any:
        """Answer one call of ``method`` (a CRI method name, "StopContainer") as containerd would.

        ``sleep`` is the serving loop's own (trio's or asyncio's): a scripted delay, a stop's
        SIGTERM grace and a slow exec take that long on it. Returns the reply message (bytes
        for the list and status calls the fake encodes itself, unless ``wire`` is False: then
        only for the list calls); raises CRIError.
        """
        if method == "StopContainer":
            self.container_calls.append((method, request.container_id, request.timeout))
        elif method == "ExecSync":
            self.container_calls.append((method, request.container_id, tuple(request.cmd)))
        pulling = method == "PullImage"
        if pulling:
            self.pulls_in_flight += 1
            self.max_pulls_in_flight = max(self.max_pulls_in_flight, self.pulls_in_flight)
        try:
            self.calls[method] += 1
            delay = self._delays.get(method)
            if delay:
                await sleep(delay)
            if self._unavailable:
                _fail(method, StatusCode.UNAVAILABLE, "fake runtime is unavailable")
            wait = self._call_wait(method, request)
            if wait > 0:
                await sleep(wait)
            return self._handler(method, wire)(request)
        finally:
            if pulling:
                self.pulls_in_flight -= 1

    @asynccontextmanager
    async def container_events(self, method: str, wait: Wait) -> AsyncIterator[_Events]:
        """A GetContainerEvents stream for the block: every event from now on (the block's
        ``async for`` waits with ``wait`` on the serving loop). Counted as a call; fails as
        containerd 1.6 does unless ``event_stream``, and while the runtime is unavailable."""
        self.calls[method] += 1
        if self._unavailable:
            _fail(method, StatusCode.UNAVAILABLE, "fake runtime is unavailable")
        if method != "GetContainerEvents" or not self.event_stream:
            _fail(method, StatusCode.UNIMPLEMENTED,
                  f"unknown method {method} for service runtime.v1.RuntimeService")
        subscription = EventSubscription()
        self._subscriptions.append(subscription)
        try:
            yield _Events(self, subscription, wait)
        finally:
            with suppress(ValueError):
                self._subscriptions.remove(subscription)

    async def next_event(self, subscription: EventSubscription, wait: Wait) -> bytes:
        """The stream's next event (encoded), waited for with ``wait``; the error that
        ended it."""
        while True:
            self._settle_all()  # a scripted exit whose time has come is published now
            if subscription.events:
                return subscription.events.popleft()
            if subscription.error is not None:
                raise subscription.error
            await wait(subscription, self._next_exit_in())

    def _call_wait(self, method: str, request: Any) -> float:
        """How long a call takes before it answers (0 for all but a stop and an exec)."""
        if method == "StopContainer":
            return self.stop_wait(request)
        if method == "ExecSync":
            result = self.exec_result(request)
            wait = min(result.delay, request.timeout) if request.timeout > 0 else result.delay
            return wait if math.isfinite(wait) else 0.0
        return 0.0

    def _handler(self, method: str, wire: bool) -> Callable[[Any], Any]:
        """The sync method above answering ``method`` (list calls, and status calls if
        ``wire``: their encoded form)."""
        name = (_WIRE_HANDLERS if wire else _LIST_HANDLERS).get(method) or _snake_case(method)
        handler: Callable[[Any], Any] | None = getattr(self, name, None)
        if handler is None:
            _fail(method, StatusCode.UNIMPLEMENTED, f"{method} is not implemented by the fake")
        return handler


class _Events:
    """The events of one open stream of the fake, as an async iterator."""

    def __init__(self, fake: FakeRuntime, subscription: EventSubscription, wait: Wait) -> None:
        self._fake = fake
        self._subscription = subscription
        self._wait = wait

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> bytes:
        return await self._fake.next_event(self._subscription, self._wait)


async def _wait_on_trio(subscription: EventSubscription, timeout: float | None) -> None:
    woken = trio.Event()
    subscription.wake = woken.set
    try:
        with trio.move_on_after(math.inf if timeout is None else timeout):
            await woken.wait()
    finally:
        subscription.wake = None


async def _wait_on_asyncio(subscription: EventSubscription, timeout: float | None) -> None:
    woken = asyncio.Event()
    subscription.wake = woken.set
    try:
        with suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), timeout)
    finally:
        subscription.wake = None


_LIST_HANDLERS = {"ListPodSandbox": "list_pod_sandbox_wire",
                  "ListContainers": "list_containers_wire"}
_WIRE_HANDLERS = {**_LIST_HANDLERS,
                  "PodSandboxStatus": "pod_sandbox_status_wire",
                  "ContainerStatus": "container_status_wire"}


def _snake_case(method: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in method).lstrip("_")


@contextmanager
def _as_grpc_error() -> Iterator[None]:
    try:
        yield
    except CRIError as exc:
        raise grpclib.GRPCError(grpclib.const.Status(exc.code.value), exc.message) from None


def _namespace_options(config: v1.PodSandboxConfig) -> v1.NamespaceOption:
    linux = config.linux
    context = linux.security_context if linux is not None else None
    options = context.namespace_options if context is not None else None
    return options if options is not None else v1.NamespaceOption()


def _network_mode(config: v1.PodSandboxConfig) -> v1.NamespaceMode:
    return _namespace_options(config).network


def _cgroup_parent(config: v1.PodSandboxConfig) -> str:
    return config.linux.cgroup_parent if config.linux is not None else ""


class _Encoded:
    """A reply the fake encoded itself (list and status calls and container events, from
    per-object caches)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _Codec(ProtoCodec):
    """grpclib's protobuf codec, passing `_Encoded` replies through untouched."""

    def encode(self, message: Any, message_type: Any) -> bytes:
        if isinstance(message, _Encoded):
            return message.data
        return super().encode(message, message_type)


class _Server(grpclib.server.Server):
    """A grpclib server that also drops open connections when closed.

    asyncio's server close leaves accepted connections open; a stopped
    containerd does not, and clients must see the connection go.
    """

    def __init__(self, handlers: list[Any]) -> None:
        super().__init__(handlers, codec=_Codec())
        # Weak: a finished connection's protocol goes away with its transport.
        self.protocols: weakref.WeakSet[grpclib.protocol.H2Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> grpclib.protocol.H2Protocol:
        protocol = super()._protocol_factory()
        self.protocols.add(protocol)
        return protocol

    def drop_connections(self) -> None:
        for protocol in list(self.protocols):
            processor = getattr(protocol, "processor", None)
            if processor is not None:
                processor.close()
        self.protocols.clear()


#: How a grpclib server of the fake opens a server stream (on its asyncio loop): the
#: replies for ``(method, request)``, or a CRIError.
OpenStream = Callable[[str, Any], AbstractAsyncContextManager[AsyncIterator[Any]]]


class _Served:
    """One CRI service of the fake for a grpclib server: the generated table's paths and
    message types, every unary method answered by ``answer(method, request)`` and every
    server-streaming one by ``open_stream``."""

    def __init__(self, service: Any, answer: Callable[[str, Any], Awaitable[Any]],
                 open_stream: OpenStream) -> None:
        self._answer = answer
        self._open_stream = open_stream
        handlers = {grpclib.const.Cardinality.UNARY_UNARY: self._handle,
                    grpclib.const.Cardinality.UNARY_STREAM: self._handle_stream}
        self._mapping = {
            path: handler._replace(func=partial(handlers[handler.cardinality],
                                                path.rsplit("/", 1)[1]))
            for path, handler in service.__mapping__().items()
            if handler.cardinality in handlers
        }

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return self._mapping

    async def _handle(self, method: str, stream: grpclib.server.Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        with _as_grpc_error():
            reply = await self._answer(method, request)
        await stream.send_message(_Encoded(reply) if isinstance(reply, bytes) else reply)

    async def _handle_stream(self, method: str, stream: grpclib.server.Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        with _as_grpc_error():
            async with self._open_stream(method, request) as replies:
                async for reply in replies:
                    await stream.send_message(_Encoded(reply) if isinstance(reply, bytes)
                                              else reply)


async def _start_server(path: str, answer: Callable[[str, Any], Awaitable[Any]],
                        open_stream: OpenStream) -> _Server:
    server = _Server([_Served(v1.RuntimeServiceBase(), answer, open_stream),
                      _Served(v1.ImageServiceBase(), answer, open_stream)])
    with suppress(FileNotFoundError):
        os.unlink(path)  # a stale socket from a previous run, as containerd does
    await server.start(path=path)
    return server


async def _stop_server(server: _Server) -> None:
    server.close()
    server.drop_connections()
    await server.wait_closed()


def _answer_on_trio(fake: FakeRuntime, nursery: trio.Nursery,
                    loop: asyncio.AbstractEventLoop) -> Callable[[str, Any], Awaitable[Any]]:
    """An ``answer`` for a server on ``loop`` that has the fake answer on the trio thread.

    The fake's state is then only ever touched by trio, where the test changes it too.
    """
    token = trio.lowlevel.current_trio_token()

    async def answer(method: str, request: Any) -> Any:  # on the asyncio loop
        future: asyncio.Future[outcome.Outcome[Any]] = loop.create_future()

        def settle(result: outcome.Outcome[Any]) -> None:
            if not future.done():  # the client may have gone away meanwhile
                future.set_result(result)

        async def on_trio() -> None:
            result = await outcome.acapture(fake.answer, method, request, trio.sleep)
            loop.call_soon_threadsafe(settle, result)

        token.run_sync_soon(nursery.start_soon, on_trio)
        return (await future).unwrap()

    return answer


class _Queued:
    """A stream's replies taken from an asyncio queue (each one, or the error ending it)."""

    def __init__(self, queue: asyncio.Queue[outcome.Outcome[Any]]) -> None:
        self._queue = queue

    def __aiter__(self) -> _Queued:
        return self

    async def __anext__(self) -> Any:
        return (await self._queue.get()).unwrap()


def _stream_on_trio(fake: FakeRuntime, nursery: trio.Nursery,
                    loop: asyncio.AbstractEventLoop) -> OpenStream:
    """An ``open_stream`` for a server on ``loop`` whose streams the fake serves on trio
    (like `_answer_on_trio`): a trio task reads each one into an asyncio queue."""
    token = trio.lowlevel.current_trio_token()

    @asynccontextmanager
    async def open_stream(method: str, request: Any) -> AsyncIterator[_Queued]:
        queue: asyncio.Queue[outcome.Outcome[Any]] = asyncio.Queue()
        scope = trio.CancelScope()

        def push(item: outcome.Outcome[Any]) -> None:  # on trio
            loop.call_soon_threadsafe(queue.put_nowait, item)

        async def on_trio() -> None:
            with scope:
                try:
                    async with fake.container_events(method, _wait_on_trio) as events:
                        async for event in events:
                            push(outcome.Value(event))
                except CRIError as error:
                    push(outcome.Error(error))

        token.run_sync_soon(nursery.start_soon, on_trio)
        try:
            yield _Queued(queue)
        finally:
            token.run_sync_soon(scope.cancel)

    return open_stream


@asynccontextmanager
async def serve_fake_runtime(socket_path: str | os.PathLike[str],
                             runtime: FakeRuntime | None = None, *,
                             clock: Clock = time.time) -> AsyncIterator[FakeRuntime]:
    """Serve a fake runtime on a unix socket for the duration of the block (trio side).

    grpclib serves the socket from an asyncio loop in a worker thread; the fake itself
    answers on trio. Pass an existing ``runtime`` to serve the same state again after a
    stop, like a restarted containerd; otherwise a new one is made with ``clock``.
    Code under trio's MockClock uses `open_fake_runtime` instead (no socket, no thread).
    """
    fake = runtime if runtime is not None else FakeRuntime(clock)
    path = os.fspath(socket_path)
    try:
        async with open_asyncio_thread() as thread, trio.open_nursery() as nursery:
            loop = await thread.run(_running_loop)
            answer = _answer_on_trio(fake, nursery, loop)
            open_stream = _stream_on_trio(fake, nursery, loop)
            server = await thread.run(lambda: _start_server(path, answer, open_stream))
            try:
                yield fake
            finally:
                with trio.CancelScope(shield=True):
                    await thread.run(lambda: _stop_server(server))
                nursery.cancel_scope.cancel()
                with suppress(FileNotFoundError):
                    os.unlink(path)
    except BaseExceptionGroup as group:
        # The nursery wraps whatever the block raised; give the caller back the
        # exception it would have seen without one.
        raise _only_error(group) from None


def _only_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The single exception inside (possibly nested) groups, else the group itself."""
    while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
        group = group.exceptions[0]  # type: ignore[assignment]
    return group


async def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def serve_fake_runtime_on_asyncio(fake: FakeRuntime, socket_path: str | os.PathLike[str], *,
                                  started: Callable[[], object],
                                  done: Callable[[], bool]) -> None:
    """Serve ``fake`` from a plain asyncio loop in this thread until ``done()`` (blocking).

    For benchmarks that run the fake in a child process of its own, so the agent's
    side is what is measured.
    """
    path = os.fspath(socket_path)

    async def serve() -> None:
        server = await _start_server(
            path, lambda method, request: fake.answer(method, request, asyncio.sleep),
            lambda method, request: fake.container_events(method, _wait_on_asyncio))
        started()
        try:
            while not done():
                await asyncio.sleep(0.05)
        finally:
            await _stop_server(server)
            with suppress(FileNotFoundError):
                os.unlink(path)

    asyncio.run(serve())


class FakeTransport:
    """CRI calls answered by a `FakeRuntime` on trio itself: no socket and no thread, so
    trio's MockClock sees every wait. Requests and replies pass through their wire encoding,
    as over a socket (so upb replies decode as from containerd), unless ``wire`` is False:
    then the runtime gets the request itself and the caller the runtime's reply message
    (encoded only where the caller asked for another type, upb's), as hollow nodes do so
    that hundreds of them measure the agent rather than a runtime's encoding and a
    client's decoding of it (docs/scale.md)."""

    def __init__(self, fake: FakeRuntime, *, wire: bool = True) -> None:
        self.fake = fake
        self.wire = wire
        self._closed = False

    async def unary(self, method: str, request: Any, reply_type: type[R],
                    timeout: float | None) -> R:
        if self._closed:
            _fail(method, StatusCode.UNAVAILABLE, "the CRI client is closed")
        if self.wire:
            request = type(request).FromString(bytes(request))
        # The request's trip to the runtime: like any real call, a checkpoint (other tasks
        # run, a cancellation lands) before the runtime sees it.
        await trio.lowlevel.checkpoint()
        try:
            with trio.fail_after(timeout) if timeout is not None else contextlib.nullcontext():
                reply = await self.fake.answer(method, request, trio.sleep, wire=self.wire)
        except trio.TooSlowError:
            raise deadline_exceeded(method, timeout) from None
        return self._decoded(reply, reply_type)

    def _decoded(self, reply: Any, reply_type: type[R]) -> R:
        """``reply`` as the caller's ``reply_type``, through its wire encoding if ``wire``."""
        if not self.wire and isinstance(reply, reply_type):
            return reply
        wire = reply if isinstance(reply, bytes) else bytes(reply)
        decoded: R = reply_type.FromString(wire)  # type: ignore[attr-defined]
        return decoded

    async def burst(self, method: str, requests: Sequence[Any], reply_type: type,
                    timeout: float | None, concurrency: int) -> list[Answer]:
        """One request after another: concurrency only matters over a socket."""
        answers: list[Answer] = []
        for request in requests:
            start = trio.current_time()
            try:
                answer: Any = await self.unary(method, request, reply_type, timeout)
            except CRIError as error:
                answer = error
            answers.append((answer, trio.current_time() - start))
        return answers

    @asynccontextmanager
    async def stream(self, method: str, request: Any,
                     reply_type: type[R]) -> AsyncIterator[AsyncIterator[R]]:
        if self._closed:
            _fail(method, StatusCode.UNAVAILABLE, "the CRI client is closed")
        await trio.lowlevel.checkpoint()
        async with self.fake.container_events(method, _wait_on_trio) as events:
            yield _Decoded(self, events, reply_type)

    async def aclose(self) -> None:
        self._closed = True


class _Decoded(Generic[R]):
    """A fake stream's replies as its transport hands replies over (`FakeTransport._decoded`)."""

    def __init__(self, transport: FakeTransport, events: _Events, reply_type: type[R]) -> None:
        self._transport = transport
        self._events = events
        self._reply_type = reply_type

    def __aiter__(self) -> _Decoded[R]:
        return self

    async def __anext__(self) -> R:
        return self._transport._decoded(await self._events.__anext__(), self._reply_type)


@asynccontextmanager
async def open_fake_runtime(runtime: FakeRuntime | None = None, *, clock: Clock = time.time,
                            timeout: float = DEFAULT_TIMEOUT, observer: Observer | None = None,
                            wire: bool = True) -> AsyncIterator[tuple[FakeRuntime, CRIClient]]:
    """A fake runtime and a `CRIClient` that reaches it in-process (`FakeTransport`, with
    ``wire``).

    For code under trio's MockClock, where `serve_fake_runtime`'s socket and thread
    would let the virtual clock run ahead of the calls.
    """
    fake = runtime if runtime is not None else FakeRuntime(clock)
    client = CRIClient(FakeTransport(fake, wire=wire), timeout, observer)
    try:
        yield fake, client
    finally:
        await client.aclose()


def in_process_opener(fake: FakeRuntime, *, wire: bool = True
                      ) -> Callable[..., AbstractAsyncContextManager[CRIClient]]:
    """A stand-in for `open_cri_client` whose clients reach ``fake`` in-process (`FakeTransport`,
    with ``wire``), whatever the endpoint: to run a whole agent (``run_agent``) under a
    MockClock, or many in one process (hollow nodes)."""

    @asynccontextmanager
    async def open_client(endpoint: str, timeout: float = DEFAULT_TIMEOUT, *,
                          observer: Observer | None = None) -> AsyncIterator[CRIClient]:
        async with open_fake_runtime(fake, timeout=timeout, observer=observer,
                                     wire=wire) as (_, client):
            yield client

    return open_client

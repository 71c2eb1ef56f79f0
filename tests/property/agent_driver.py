"""A whole agent (SyncLoop, pod workers, PLEG, CRI client) on the fake runtime, run by a test.

`TrioPortal` runs one ``trio.run`` under a `trio.testing.MockClock` in a background
thread, so synchronous code (a hypothesis state machine) can drive it: every
`TrioPortal.call` runs one coroutine in the trio thread and returns its result.
Virtual time only moves inside `Node.advance` / `Node.wait_until` (autojump is
switched on just for them), so nothing happens while the calling thread thinks.

`Node` is the world: a `RecordingFake` the agent's CRI client reaches in-process
(``open_fake_runtime``: on trio, so the MockClock sees every call), the pod set the
"file" source wants, and at most one agent run on it that can be stopped, crashed
in the middle of a CRI call, and started again (it must adopt what is there).
"""

from __future__ import annotations

import concurrent.futures
import math
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import trio
import trio.testing

from trio_kubelet.clock import TrioWallClock
from trio_kubelet.core.observed import RuntimePodStatus
from trio_kubelet.events import Event, PodSetUpdate
from trio_kubelet.images.manager import ImageManager
from trio_kubelet.model.pod import Pod, PodStatus, is_sidecar
from trio_kubelet.reconcile.loop import SyncLoop
from trio_kubelet.reconcile.workers import WorkerContext
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import CRIError
from trio_kubelet.runtime.fake import ContainerScript, FakeRuntime, open_fake_runtime
from trio_kubelet.runtime.inspect import inspect_pod
from trio_kubelet.sources.pleg import run_pleg
from trio_kubelet.sources.static_files import static_pod
from trio_kubelet.status.store import PodStatusStore

T = TypeVar("T")

NODE = "node1"
SOURCE = "file"
IMAGE = "busybox:1.36"
EPOCH = 1_700_000_000.0
CRI_TIMEOUT = 5.0
# Real seconds one portal call may take; longer means the agent spins at a fixed
# virtual time (it never lets every task block), which is a bug of its own.
REAL_TIMEOUT = 60.0

RUNNING = v1.ContainerState.CONTAINER_RUNNING
EXITED = v1.ContainerState.CONTAINER_EXITED
CREATED = v1.ContainerState.CONTAINER_CREATED
READY = v1.PodSandboxState.SANDBOX_READY

# -- what the test asks for -------------------------------------------------------------------


@dataclass(frozen=True)
class Behaviour:
    """What every instance of one container does once started: run, or exit after a while."""

    exit_after: float | None = None  # None: runs until it is stopped
    exit_code: int = 0

    def script(self) -> ContainerScript:
        return ContainerScript(exit_after=self.exit_after, exit_code=self.exit_code)

    def __str__(self) -> str:
        if self.exit_after is None:
            return "runs"
        return f"exits {self.exit_code} after {self.exit_after:g}s"


RUNS = Behaviour()


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    behaviour: Behaviour = RUNS
    version: int = 0  # part of the command, so an edit changes the container hash


@dataclass(frozen=True)
class PodPlan:
    """One static pod: regular containers, an optional regular init container and sidecar."""

    name: str  # the manifest's name; the pod is called ``<name>-<node>``
    policy: str
    containers: tuple[ContainerPlan, ...]
    init: ContainerPlan | None = None
    sidecar: ContainerPlan | None = None
    sidecar_first: bool = True

    @property
    def full_name(self) -> str:
        return f"{self.name}-{NODE}"

    def init_containers(self) -> list[tuple[ContainerPlan, bool]]:
        """(plan, is sidecar) in spec order."""
        found = [(c, False) for c in (self.init,) if c is not None]
        if self.sidecar is not None:
            sidecar = (self.sidecar, True)
            found = [sidecar, *found] if self.sidecar_first else [*found, sidecar]
        return found

    def every_container(self) -> list[ContainerPlan]:
        return [c for c, _ in self.init_containers()] + list(self.containers)

    def container(self, name: str) -> ContainerPlan:
        return next(c for c in self.every_container() if c.name == name)

    def with_container(self, new: ContainerPlan) -> PodPlan:
        """The plan with the container of ``new``'s name replaced by ``new``."""
        if self.init is not None and self.init.name == new.name:
            return replace(self, init=new)
        if self.sidecar is not None and self.sidecar.name == new.name:
            return replace(self, sidecar=new)
        return replace(self, containers=tuple(new if c.name == new.name else c
                                              for c in self.containers))

    def pod(self) -> Pod:
        def spec(plan: ContainerPlan, sidecar: bool = False) -> dict[str, Any]:
            found: dict[str, Any] = {"name": plan.name, "image": IMAGE,
                                     "command": ["sh", "-c", f"serve --v{plan.version}"]}
            if sidecar:
                found["restartPolicy"] = "Always"
            return found

        document = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name},
            "spec": {
                "restartPolicy": self.policy,
                "terminationGracePeriodSeconds": 2,
                "initContainers": [spec(c, sidecar) for c, sidecar in self.init_containers()],
                "containers": [spec(c) for c in self.containers],
            },
        }
        return static_pod(document, f"/etc/kubernetes/manifests/{self.name}.yaml", NODE)

    def describe(self) -> str:
        parts = [f"{c.name}{'(sidecar)' if s else '(init)'}: {c.behaviour} v{c.version}"
                 for c, s in self.init_containers()]
        parts += [f"{c.name}: {c.behaviour} v{c.version}" for c in self.containers]
        return f"{self.name} [{self.policy}] " + ", ".join(parts)


# -- the fake runtime, watched ----------------------------------------------------------------


@dataclass(frozen=True)
class CriContainer:
    """One container on the fake, as the test checks it."""

    id: str
    uid: str
    name: str
    attempt: int
    kind: str
    state: v1.ContainerState
    exit_code: int
    reason: str
    spec_hash: str
    created_at: int
    sandbox_id: str


@dataclass(frozen=True)
class CriSandbox:
    id: str
    uid: str
    state: v1.PodSandboxState
    attempt: int


class RecordingFake(FakeRuntime):
    """The fake runtime, checking rules at the moment of each call and able to crash the agent.

    ``violations`` collects broken rules: a second running instance of a container,
    an attempt number that does not grow, and a restart the pod's policy forbids of a
    container that exited on its own (any exit under Never, a success under OnFailure,
    a successful init container in the same sandbox); a container the agent stopped
    to apply a changed spec may be restarted. ``arm`` runs a callback right after the next
    successful call of a method (before the agent sees the answer).
    """

    def __init__(self, clock: Callable[[], float], pod_of: Callable[[str], Pod | None]) -> None:
        super().__init__(clock)
        self.pod_of = pod_of  # the pod the source wants now, by UID
        self.violations: list[str] = []
        self.stopped_running: set[str] = set()  # containers the agent stopped while running
        self._armed: tuple[str, Callable[[], None]] | None = None

    def arm(self, method: str, callback: Callable[[], None]) -> None:
        self._armed = (method, callback)

    def disarm(self) -> None:
        self._armed = None

    def _fire(self, method: str) -> None:
        if self._armed is not None and self._armed[0] == method:
            callback = self._armed[1]
            self._armed = None
            callback()

    def instances(self, uid: str, name: str) -> list[v1.Container]:
        selector = {labels.POD_UID: uid, labels.CONTAINER_NAME: name}
        listed = self.list_containers(
            v1.ListContainersRequest(filter=v1.ContainerFilter(label_selector=selector)))
        # Oldest first; instances made at one (virtual) instant are ordered by attempt.
        return sorted(listed.containers,
                      key=lambda c: (c.created_at, c.metadata.attempt if c.metadata else 0))

    def create_container(self, request: v1.CreateContainerRequest) -> v1.CreateContainerResponse:
        config = request.config
        assert config is not None and config.metadata is not None
        uid, name = config.labels[labels.POD_UID], config.metadata.name
        before = self.instances(uid, name)
        response = super().create_container(request)
        self._check_new_instance(uid, name, request, before)
        self._fire("CreateContainer")
        return response

    def _status(self, container_id: str) -> v1.ContainerStatus:
        status = self.container_status(v1.ContainerStatusRequest(container_id=container_id))
        assert status.status is not None
        return status.status

    def _check_new_instance(self, uid: str, name: str, request: v1.CreateContainerRequest,
                            before: list[v1.Container]) -> None:
        config = request.config
        assert config is not None and config.metadata is not None
        attempt = config.metadata.attempt
        where = f"pod {uid} container {name}"
        for old in before:
            assert old.metadata is not None
            if old.metadata.attempt >= attempt:
                self.violations.append(
                    f"{where}: new instance has attempt {attempt}, an existing one has "
                    f"{old.metadata.attempt}")
        kind = config.annotations.get(labels.CONTAINER_TYPE)
        if not before or kind not in ("regular", "init"):
            return
        newest = before[-1]
        if newest.state != EXITED:
            return
        new_hash = config.annotations.get(labels.CONTAINER_HASH)
        if (newest.id in self.stopped_running
                and newest.annotations.get(labels.CONTAINER_HASH) != new_hash):
            return  # the agent replaced it because its spec changed
        exit_code = self._status(newest.id).exit_code
        same_sandbox = newest.pod_sandbox_id == request.pod_sandbox_id
        pod = self.pod_of(uid)
        policy = pod.spec.restart_policy if pod is not None else None
        why = ""
        if policy == "Never":
            why = "under policy Never"
        elif exit_code == 0 and kind == "regular" and policy == "OnFailure":
            why = "under policy OnFailure"
        elif exit_code == 0 and kind == "init" and same_sandbox:
            why = "in the same sandbox (an init container runs once per sandbox)"
        if why:
            self.violations.append(
                f"{where}: restarted {why} (attempt {attempt}) after instance "
                f"{newest.id[:12]} exited {exit_code} on its own")

    def start_container(self, request: v1.StartContainerRequest) -> v1.StartContainerResponse:
        response = super().start_container(request)
        started = self._status(request.container_id)
        assert started.metadata is not None
        uid, name = started.labels[labels.POD_UID], started.metadata.name
        live = [c.id for c in self.instances(uid, name) if c.state == RUNNING]
        if len(live) > 1:
            self.violations.append(
                f"pod {uid} container {name}: {len(live)} running instances after StartContainer")
        if started.annotations.get(labels.CONTAINER_TYPE) == "regular":
            self._check_initialized(uid, name, self._sandbox_of(request.container_id))
        self._fire("StartContainer")
        return response

    def _sandbox_of(self, container_id: str) -> str:
        listed = self.list_containers(
            v1.ListContainersRequest(filter=v1.ContainerFilter(id=container_id)))
        return listed.containers[0].pod_sandbox_id

    def _check_initialized(self, uid: str, name: str, sandbox_id: str) -> None:
        """Every regular init container succeeded in this sandbox before ``name`` starts."""
        pod = self.pod_of(uid)
        for init in pod.spec.init_containers if pod is not None else ():
            if is_sidecar(init):
                continue
            done = [c for c in self.instances(uid, init.name)
                    if c.pod_sandbox_id == sandbox_id and c.state == EXITED
                    and self._status(c.id).exit_code == 0]
            if not done:
                self.violations.append(
                    f"pod {uid} container {name} started in sandbox "
                    f"{sandbox_id[:12]} where init container {init.name} has not succeeded")

    def stop_container(self, request: v1.StopContainerRequest) -> v1.StopContainerResponse:
        with suppress(CRIError):  # an unknown ID: the call below answers NOT_FOUND
            if self._status(request.container_id).state == RUNNING:
                self.stopped_running.add(request.container_id)
        response = super().stop_container(request)
        self._fire("StopContainer")
        return response

    def run_pod_sandbox(self, request: v1.RunPodSandboxRequest) -> v1.RunPodSandboxResponse:
        response = super().run_pod_sandbox(request)
        self._fire("RunPodSandbox")
        return response

    def stop_pod_sandbox(self, request: v1.StopPodSandboxRequest) -> v1.StopPodSandboxResponse:
        response = super().stop_pod_sandbox(request)
        self._fire("StopPodSandbox")
        return response

    def remove_container(self, request: v1.RemoveContainerRequest) -> v1.RemoveContainerResponse:
        response = super().remove_container(request)
        self._fire("RemoveContainer")
        return response

    def remove_pod_sandbox(
        self, request: v1.RemovePodSandboxRequest,
    ) -> v1.RemovePodSandboxResponse:
        response = super().remove_pod_sandbox(request)
        self._fire("RemovePodSandbox")
        return response

    # -- reading the state the way the test checks it --------------------------------------

    def cri_containers(self) -> list[CriContainer]:
        found = []
        for c in self.list_containers(v1.ListContainersRequest()).containers:
            status = self.container_status(v1.ContainerStatusRequest(container_id=c.id)).status
            assert status is not None and c.metadata is not None
            found.append(CriContainer(
                id=c.id, uid=c.labels.get(labels.POD_UID, ""), name=c.metadata.name,
                attempt=c.metadata.attempt, kind=c.annotations.get(labels.CONTAINER_TYPE, ""),
                state=c.state, exit_code=status.exit_code, reason=status.reason,
                spec_hash=c.annotations.get(labels.CONTAINER_HASH, ""),
                created_at=c.created_at, sandbox_id=c.pod_sandbox_id))
        return sorted(found, key=lambda c: (c.created_at, c.attempt))

    def cri_sandboxes(self) -> list[CriSandbox]:
        return [CriSandbox(id=s.id, uid=s.labels.get(labels.POD_UID, ""), state=s.state,
                           attempt=s.metadata.attempt if s.metadata else 0)
                for s in self.list_pod_sandbox(v1.ListPodSandboxRequest()).items]


# -- the agent and the world ------------------------------------------------------------------


@dataclass
class Agent:
    """One run of the agent: its own CRI client, status store, sync loop and PLEG."""

    number: int
    scope: trio.CancelScope
    loop: SyncLoop
    store: PodStatusStore
    client: CRIClient
    send: trio.MemorySendChannel[Event]
    done: trio.Event = field(default_factory=trio.Event)


@dataclass(frozen=True)
class Snapshot:
    """Everything the invariants look at, taken at a quiescent point."""

    time: float
    containers: list[CriContainer]
    sandboxes: list[CriSandbox]
    statuses: dict[str, PodStatus]  # by UID, from the running agent's status store
    workers: frozenset[str]
    violations: list[str]


class Node:
    """The fake runtime, the pod set the file source wants, and the current agent run."""

    def __init__(self, clock: trio.testing.MockClock, nursery: trio.Nursery,
                 fake: RecordingFake, logs: Path, wall: TrioWallClock) -> None:
        self.clock = clock
        self.fake = fake
        self.logs = logs
        self.wall = wall
        self.desired: dict[str, Pod] = {}  # by UID: the "file" source's current pod set
        self.agent: Agent | None = None
        self._nursery = nursery
        self._runs = 0

    # -- time --------------------------------------------------------------------------------

    async def quiesce(self) -> None:
        """Let everything runnable at this virtual instant run, without moving time."""
        self.clock.autojump_threshold = math.inf
        await trio.testing.wait_all_tasks_blocked()

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, then quiesce."""
        deadline = trio.current_time() + seconds
        self.clock.autojump_threshold = 0
        try:
            await trio.sleep_until(deadline)
        finally:
            self.clock.autojump_threshold = math.inf
        await self.quiesce()

    async def wait_until(self, condition: Callable[[], Awaitable[bool]], timeout: float,
                         step: float = 0.5) -> bool:
        """Check ``condition`` at quiescent points every ``step`` virtual seconds."""
        deadline = trio.current_time() + timeout
        await self.quiesce()
        while not await condition():
            left = deadline - trio.current_time()
            if left <= 0:
                return False
            await self.advance(min(step, left))
        return True

    # -- the agent ---------------------------------------------------------------------------

    async def start_agent(self) -> Agent:
        assert self.agent is None or self.agent.done.is_set()
        self._runs += 1
        agent: Agent = await self._nursery.start(self._run_agent, self._runs)
        self.agent = agent
        await self.quiesce()
        return agent

    async def _run_agent(self, number: int, *, task_status: trio.TaskStatus[Agent]) -> None:
        done = trio.Event()
        try:
            with trio.CancelScope() as scope:
                async with open_fake_runtime(self.fake, timeout=CRI_TIMEOUT) as (_, client):
                    store = PodStatusStore()
                    ctx = WorkerContext(client=client, images=ImageManager(client), store=store,
                                        clock=self.wall, pod_logs_dir=self.logs)
                    loop = SyncLoop(ctx, [SOURCE])
                    send, receive = trio.open_memory_channel[Event](math.inf)
                    async with trio.open_nursery() as nursery:
                        await nursery.start(loop.run, receive)
                        nursery.start_soon(run_pleg, send.clone(), client)
                        task_status.started(
                            Agent(number, scope, loop, store, client, send, done))
        finally:
            done.set()

    async def stop_agent(self) -> None:
        """Stop the agent (SIGKILL-like: its tasks are cancelled wherever they are)."""
        if self.agent is not None:
            self.agent.scope.cancel()
            await self.agent.done.wait()
        self.fake.disarm()
        await self.quiesce()

    async def publish(self) -> None:
        """The file source reports its current pod set to the running agent."""
        if self.agent is not None and not self.agent.done.is_set():
            pods = sorted(self.desired.values(), key=lambda p: p.metadata.name)
            await self.agent.send.send(PodSetUpdate(source=SOURCE, pods=pods))
        await self.quiesce()

    def crash_agent_at(self, method: str) -> None:
        """Kill the agent right after its next successful ``method`` call on the runtime."""
        agent = self.agent
        assert agent is not None
        self.fake.arm(method, agent.scope.cancel)

    # -- looking -----------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        agent = self.agent
        live = agent is not None and not agent.done.is_set()
        return Snapshot(
            time=trio.current_time(),
            containers=self.fake.cri_containers(),
            sandboxes=self.fake.cri_sandboxes(),
            statuses={p.metadata.uid: p.status for p in agent.store.pods()}
            if agent is not None and live else {},
            workers=frozenset(agent.loop.workers) if agent is not None and live else frozenset(),
            violations=list(self.fake.violations),
        )

    async def inspect(self, uid: str) -> RuntimePodStatus:
        """The runtime's view of a pod through the agent's own CRI client and inspect code."""
        assert self.agent is not None
        return await inspect_pod(self.agent.client, uid)


@asynccontextmanager
async def open_node(clock: trio.testing.MockClock) -> AsyncIterator[Node]:
    """A fake runtime (no agent yet); everything is removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="tk-agent-", dir="/tmp"))
    wall = TrioWallClock(epoch=EPOCH)
    desired: dict[str, Pod] = {}

    fake = RecordingFake(wall.now, desired.get)
    try:
        async with trio.open_nursery() as nursery:
            fake.add_image(IMAGE)
            node = Node(clock, nursery, fake, root / "logs", wall)
            node.desired = desired
            try:
                yield node
            finally:
                await node.stop_agent()
                nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def put_pod(node: Node, plan: PodPlan) -> str:
    """Script the pod's containers on the fake and add (or update) it in the source's set."""
    for container, _ in each_pod_container(plan):
        node.fake.script(plan.full_name, container.name, container.behaviour.script())
    pod = plan.pod()
    node.desired[pod.metadata.uid] = pod
    await node.publish()
    return pod.metadata.uid


async def drop_pod(node: Node, uid: str, *, publish: bool = True) -> None:
    """Take the pod out of the source's set (and tell the agent, unless ``publish`` is off)."""
    del node.desired[uid]
    if publish:
        await node.publish()


# -- running trio for a synchronous caller ----------------------------------------------------


class TrioPortal:
    """A ``trio.run`` under a MockClock in a background thread, holding one `Node`."""

    def __init__(self) -> None:
        self.clock = trio.testing.MockClock()  # rate 0, no autojump: time is frozen
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self.node: Node | None = None
        self._thread = threading.Thread(target=self._thread_main, name="trio-agent", daemon=True)
        self._thread.start()
        if not self._ready.wait(REAL_TIMEOUT):
            raise RuntimeError("the trio thread did not start")
        if self._failure is not None:
            raise self._failure

    def _thread_main(self) -> None:
        try:
            trio.run(self._main, clock=self.clock)
        except BaseException as exc:  # reported to the caller by start/close
            self._failure = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with open_node(self.clock) as node, trio.open_nursery() as calls:
            self._nursery = calls
            self.node = node
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            calls.cancel_scope.cancel()  # a call that never finished (see `call`)

    def call(self, fn: Callable[[Node], Awaitable[T]]) -> T:
        """Run ``fn(node)`` in the trio thread and return its result (or raise its error)."""
        assert self._token is not None and self._nursery is not None and self.node is not None
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        node, nursery = self.node, self._nursery

        async def runner() -> None:
            try:
                result = await fn(node)
            except Exception as exc:
                future.set_exception(exc)
            except BaseException as exc:
                future.set_exception(exc)
                raise
            else:
                future.set_result(result)

        self._token.run_sync_soon(nursery.start_soon, runner)
        try:
            return future.result(timeout=REAL_TIMEOUT)
        except concurrent.futures.TimeoutError:
            raise AssertionError(
                f"the agent did not settle within {REAL_TIMEOUT:g} real seconds: some task "
                "keeps running at a fixed virtual time") from None

    def close(self) -> None:
        if self._token is not None and self._stop is not None:
            stop = self._stop
            with suppress(trio.RunFinishedError):
                self._token.run_sync_soon(stop.set)
        self._thread.join(REAL_TIMEOUT)
        if self._failure is not None and not isinstance(self._failure, KeyboardInterrupt):
            failure, self._failure = self._failure, None
            raise failure


def each_pod_container(plan: PodPlan) -> Iterator[tuple[ContainerPlan, str]]:
    """Every container of a plan with its kind: "init", "sidecar" or "regular"."""
    for container, sidecar in plan.init_containers():
        yield container, "sidecar" if sidecar else "init"
    for container in plan.containers:
        yield container, "regular"

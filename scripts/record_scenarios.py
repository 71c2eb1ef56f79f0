#!/usr/bin/env python3
"""Re-record the curated scenarios in scenarios/ from real runs on a private containerd.

Usage: record_scenarios.py [--list] [--out DIR] [--keep-going] [NAME ...]

With no NAME every scenario is recorded. One containerd is started for the whole
invocation (scripts/containerd-env, under /tmp/tk-scenarios/containerd) and stopped
at the end. Each scenario then runs the agent as a subprocess with
``--record``, writes, edits and deletes manifests, kills and restarts the agent
or containerd, and waits for what it needs by reading the recording as it grows
(the agent flushes it every 0.2 s). When the scenario is done the agent gets
SIGTERM, every pod is removed through CRI (scripts/cri_reset.py), and the new
recording is checked twice before it replaces scenarios/NAME/recording.jsonl:
the scenario's own expectations (its point really shows in the recording) and
``trio-kubelet replay FILE --check`` (every decision re-checks against the core).
A scenario that fails either check leaves the committed recording alone; its
candidate and the agent's log stay in /tmp/tk-scenarios/NAME/.

Needs root, containerd (scripts/containerd-env install) and the project installed.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
SCENARIOS = ROOT / "scenarios"
# Stable paths: they end up in each recording's header, so re-records diff cleanly.
WORK = Path("/tmp/tk-scenarios")
CONTAINERD_DIR = WORK / "containerd"
NODE = "scenario"
RECORDING = "recording.jsonl"
POLL = 0.2
AGENT_START_TIMEOUT = 20.0
AGENT_STOP_TIMEOUT = 20.0
# CRI calls that change the runtime (as opposed to reading it).
MUTATIONS = frozenset(
    {
        "RunPodSandbox",
        "StopPodSandbox",
        "RemovePodSandbox",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "RemoveContainer",
    }
)
# A long-running container that exits 0 promptly on SIGTERM (pid 1 ignores it by default).
LOOP = "trap 'exit 0' TERM; while true; do sleep 1; done"


class ScenarioFailed(Exception):
    """A wait timed out or an expectation about the recording does not hold."""


def log(message: str) -> None:
    print(f"record_scenarios: {message}", file=sys.stderr, flush=True)


# --- reading the recording as it grows ---------------------------------------------------------


def short_name(full: str) -> str:
    """``web-scenario_default`` -> ``web`` (the name in the manifest)."""
    name = full.partition("_")[0]
    return name.removesuffix(f"-{NODE}")


class Recording:
    """The records of a (growing) recording file, parsed as JSON, with a few indexes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self.header: dict[str, Any] | None = None
        self.status: dict[str, dict[str, Any]] = {}  # latest API status per pod (short name)
        self.statuses: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        self.teardowns: dict[str, float] = {}
        self._offset = 0
        self._partial = b""

    def poll(self) -> None:
        try:
            with self.path.open("rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                self._add(json.loads(line))

    def _add(self, record: dict[str, Any]) -> None:
        if record["kind"] == "header":
            if self.header is not None:
                raise ScenarioFailed(f"{self.path}: rotated (a second header); keep it smaller")
            self.header = record
        self.records.append(record)
        if record["kind"] == "status":
            name = short_name(record["pod"])
            self.status[name] = record["status"]
            self.statuses.setdefault(name, []).append((self.rel(record), record["status"]))
            self.teardowns.pop(name, None)
        elif record["kind"] == "teardown":
            self.teardowns[short_name(record["pod"])] = self.rel(record)

    # time: seconds since the header, the axis of `replay` and the timeline
    def rel(self, record: dict[str, Any]) -> float:
        assert self.header is not None
        return float(record["t"]) - float(self.header["t"])

    def now(self) -> float:
        """The recording's time axis at this moment (wall clock minus the header's epoch)."""
        assert self.header is not None
        return time.time() - float(self.header["start_time"])

    def duration(self) -> float:
        return self.rel(self.records[-1]) if self.records else 0.0

    # queries
    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]

    def decisions(self, pod: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.of_kind("decision") if pod is None or short_name(r["pod"]) == pod]

    def cri(self, *methods: str, since: float = float("-inf")) -> list[dict[str, Any]]:
        return [
            r
            for r in self.of_kind("cri")
            if (not methods or r["method"] in methods) and self.rel(r) >= since
        ]

    def container_names(self) -> dict[str, str]:
        """Runtime container ID -> container name, from the CreateContainer calls."""
        names = {}
        for r in self.cri("CreateContainer"):
            if r.get("response"):
                names[r["response"]["containerId"]] = r["request"]["config"]["metadata"]["name"]
        return names

    def created(self, since: float = float("-inf")) -> list[str]:
        """Names of the containers created (in order)."""
        return [
            r["request"]["config"]["metadata"]["name"]
            for r in self.cri("CreateContainer", since=since)
            if r.get("response")
        ]

    def stopped(self, since: float = float("-inf")) -> list[str]:
        """Names of the containers the agent stopped (in order)."""
        names = self.container_names()
        return [
            names.get(r["request"]["containerId"], r["request"]["containerId"][:12])
            for r in self.cri("StopContainer", since=since)
        ]

    def allowed_starts(self, pod: str, container: str) -> list[tuple[float, dict[str, Any]]]:
        """The crash-loop gates that let a restart of an exited ``container`` through."""
        return [
            (self.rel(d), s)
            for d in self.decisions(pod)
            if _restart(d, container)
            for s in d["starts"]
            if s["container"] == container and s["allowed"]
        ]

    def summary(self) -> str:
        lines = []
        for name, status in sorted(self.status.items()):
            gone = " (torn down)" if name in self.teardowns else ""
            lines.append(f"  {name}: {describe(status)}{gone}")
        return "\n".join(lines) or "  (no pod status recorded)"


def _restart(decision: dict[str, Any], container: str) -> bool:
    """Whether the decision restarts an exited instance of ``container``."""
    return any(
        c["name"] == container and c["state"] == "exited"
        for c in decision["observed"]["containers"]
    )


# --- API status helpers (the dicts StatusRecords carry) ----------------------------------------


def containers(status: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    if status is None:
        return {}
    every = [*status.get("initContainerStatuses", ()), *status.get("containerStatuses", ())]
    return {c["name"]: c for c in every}


def state_of(status: dict[str, Any] | None, name: str) -> str:
    """``running``, ``terminated:Completed``, ``waiting:CrashLoopBackOff`` or ``absent``."""
    c = containers(status).get(name)
    if c is None:
        return "absent"
    for key in ("running", "terminated", "waiting"):
        value = c["state"].get(key)
        if value is not None:
            reason = value.get("reason")
            return f"{key}:{reason}" if reason else key
    return "unknown"


def is_running(status: dict[str, Any] | None, name: str) -> bool:
    return state_of(status, name) == "running"


def restarts(status: dict[str, Any] | None, name: str) -> int:
    c = containers(status).get(name)
    return int(c["restartCount"]) if c else 0


def phase(status: dict[str, Any] | None) -> str:
    return status.get("phase", "?") if status else "absent"


def describe(status: dict[str, Any]) -> str:
    parts = [
        f"{name}={state_of(status, name)}/r{restarts(status, name)}" for name in containers(status)
    ]
    return f"{phase(status)} " + " ".join(parts)


def documents(*manifests: str) -> str:
    """Several manifests as one multi-document YAML file."""
    return "---\n".join(textwrap.dedent(m).lstrip() for m in manifests)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise ScenarioFailed(message)


# --- processes ---------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: containerd's reaper is not us)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


class Containerd:
    """The private containerd of this invocation (scripts/containerd-env)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.socket = directory / "containerd.sock"

    def start(self) -> None:
        subprocess.run(
            ["bash", str(SCRIPTS / "containerd-env"), "start", str(self.dir)], check=True
        )

    def stop(self) -> None:
        subprocess.run(
            ["bash", str(SCRIPTS / "containerd-env"), "stop", str(self.dir)], check=False
        )

    def kill(self) -> None:
        """SIGKILL containerd itself (its shims and the containers keep running)."""
        pid = int((self.dir / "containerd.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)

    def reset(self) -> None:
        """Remove every pod sandbox and container (through CRI, so CNI is torn down too)."""
        subprocess.run(
            [sys.executable, str(SCRIPTS / "cri_reset.py"), str(self.socket)], check=True
        )

    def container_ids(self) -> set[str]:
        out = subprocess.run(
            ["ctr", "-a", str(self.socket), "-n", "k8s.io", "containers", "ls", "-q"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return set(out.split())


class Agent:
    """One trio-kubelet subprocess recording to ``record``."""

    def __init__(self, run: Run, record: Path) -> None:
        self.run = run
        self.record = record
        self.recording = Recording(record)
        self._ended = False
        record.unlink(missing_ok=True)
        self.log_file = run.work / f"agent-{record.stem}.log"
        command = [
            sys.executable, "-m", "trio_kubelet",
            "--pod-manifest-path", str(run.manifests),
            "--container-runtime-endpoint", f"unix://{run.containerd.socket}",
            "--root-dir", str(run.work / "root"),
            "--pod-logs-dir", str(run.work / "logs"),
            "--hostname-override", NODE,
            "--record", str(record),
        ]  # fmt: skip
        with self.log_file.open("ab") as out:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        deadline = time.monotonic() + AGENT_START_TIMEOUT
        while self.recording.header is None:
            if self.process.poll() is not None:
                raise ScenarioFailed(f"agent exited with {self.process.returncode}: {self._tail()}")
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"agent wrote no recording header in {AGENT_START_TIMEOUT}s")
            time.sleep(0.05)
            self.recording.poll()

    def _tail(self) -> str:
        lines = self.log_file.read_text(errors="replace").splitlines()[-15:]
        return "\n".join(lines)

    @property
    def ended(self) -> bool:
        """Stopped or killed on purpose."""
        return self._ended

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM: the agent stops, flushes its recording; the pods keep running."""
        self._ended = True
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(AGENT_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise ScenarioFailed(f"agent ignored SIGTERM for {AGENT_STOP_TIMEOUT}s") from None
            if self.process.returncode != 0:
                raise ScenarioFailed(
                    f"agent exited with {self.process.returncode} on SIGTERM: {self._tail()}"
                )
        self.recording.poll()

    def kill9(self) -> None:
        self._ended = True
        self.process.kill()
        self.process.wait()
        self.recording.poll()


# --- a scenario run ----------------------------------------------------------------------------


@dataclass
class Run:
    """What a scenario's step function works with: manifests, the agent, containerd, waits."""

    name: str
    containerd: Containerd
    work: Path
    agent: Agent | None = None
    marks: list[tuple[float, str]] = field(default_factory=list)
    agents: list[Agent] = field(default_factory=list)

    @property
    def manifests(self) -> Path:
        return self.work / "manifests"

    @property
    def candidate(self) -> Path:
        return self.work / RECORDING

    @property
    def rec(self) -> Recording:
        assert self.agent is not None, "no agent started"
        return self.agent.recording

    # the agent
    def start_agent(self, record: Path | None = None) -> Agent:
        """Start an agent recording to the scenario's recording (or to ``record``)."""
        self.agent = Agent(self, record or self.candidate)
        self.agents.append(self.agent)
        self.mark("agent started" + (f" (recording {record.name})" if record else ""))
        return self.agent

    def stop_agent(self) -> None:
        if self.agent is not None:
            self.mark("agent stopped (SIGTERM)")
            self.agent.stop()

    def kill_agent(self) -> None:
        assert self.agent is not None
        self.mark("agent killed (SIGKILL)")
        self.agent.kill9()

    # manifests
    def write(self, filename: str, text: str) -> None:
        """Write a manifest the way an editor saves: a temporary file renamed into place."""
        self.manifests.mkdir(parents=True, exist_ok=True)
        tmp = self.manifests / f".{filename}.tmp"
        tmp.write_text(textwrap.dedent(text).lstrip())
        tmp.rename(self.manifests / filename)
        self.mark(f"wrote {filename}")

    def delete(self, filename: str) -> None:
        (self.manifests / filename).unlink()
        self.mark(f"deleted {filename}")

    # time
    def mark(self, text: str) -> float:
        """Note a step on the recording's time axis (printed at the end of the scenario)."""
        t = self.rec.now() if self.agent is not None and self.rec.header is not None else 0.0
        self.marks.append((t, text))
        log(f"{self.name}: {t:7.2f}s  {text}")
        return t

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._check_agent()
            time.sleep(POLL)
        self.rec.poll()

    def wait(
        self, what: str, predicate: Callable[[Recording], bool], timeout: float = 60.0
    ) -> float:
        """Poll the recording until ``predicate`` holds; returns the time it did."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_agent()
            self.rec.poll()
            if predicate(self.rec):
                return self.mark(f"reached: {what}")
            if time.monotonic() > deadline:
                raise ScenarioFailed(
                    f"timed out after {timeout:.0f}s waiting for: {what}\n{self.rec.summary()}"
                )
            time.sleep(POLL)

    def wait_pod(
        self,
        pod: str,
        what: str,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = 60.0,
    ) -> float:
        def check(rec: Recording) -> bool:
            status = rec.status.get(pod)
            return status is not None and pod not in rec.teardowns and predicate(status)

        return self.wait(f"{pod} {what}", check, timeout)

    def _check_agent(self) -> None:
        if self.agent is not None and not self.agent.ended and not self.agent.alive():
            raise ScenarioFailed(f"agent died (exit {self.agent.process.returncode})")


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: Callable[[Run], None]
    check: Callable[[Recording, Run], None]
    doc: str


SCENARIO_LIST: list[Scenario] = []


def scenario(doc: str) -> Callable[[Callable[[Run], None]], Callable[[Run], None]]:
    """Register ``steps`` (named like ``crash_loop_backoff``) with the checks ``check_<name>``."""

    def register(steps: Callable[[Run], None]) -> Callable[[Run], None]:
        name = steps.__name__.replace("_", "-")
        check = globals()[f"check_{steps.__name__}"]
        SCENARIO_LIST.append(Scenario(name, steps, check, doc))
        return steps

    return register


# --- the scenarios -----------------------------------------------------------------------------
# Each check_<name> is defined before its scenario and states what the recording must show.


def check_crash_loop_backoff(rec: Recording, run: Run) -> None:
    gates = rec.allowed_starts("crash", "app")
    delays = [g["delay"] for _, g in gates]
    expect(delays[:4] == [10.0, 20.0, 40.0, 80.0], f"back-off delays {delays}")
    times = [t for t, _ in gates]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Each restart waits out the previous back-off (the container itself exits at once).
    for gap, delay in zip(gaps, (10.0, 20.0, 40.0), strict=False):
        expect(delay <= gap < delay + 5, f"restart gaps {gaps} do not follow 10/20/40 s")
    held = [s for d in rec.decisions("crash") for s in d["starts"] if not s["allowed"]]
    expect(bool(held), "no start was held back by the crash-loop gate")


@scenario("a container that exits 1 at once: restarts after 0, 10, 20, 40 s (CrashLoopBackOff)")
def crash_loop_backoff(run: Run) -> None:
    run.start_agent()
    run.write(
        "crash.yaml",
        """
        apiVersion: v1
        kind: Pod
        metadata:
          name: crash
        spec:
          containers:
            - name: app
              image: busybox:1.36
              command: ["sh", "-c", "echo crashing; exit 1"]
        """,
    )
    run.wait_pod("crash", "restarted 4 times", lambda s: restarts(s, "app") >= 4, timeout=120)
    run.sleep(1)


def check_onfailure_vs_never(rec: Recording, run: Run) -> None:
    for pod in ("onfailure-exit0", "never-exit0", "never-exit1"):
        expect(restarts(rec.status[pod], "main") == 0, f"{pod} was restarted")
        expect(not rec.allowed_starts(pod, "main"), f"{pod}: a restart was let through")
    expect(phase(rec.status["onfailure-exit0"]) == "Succeeded", "onfailure-exit0 not Succeeded")
    expect(phase(rec.status["never-exit0"]) == "Succeeded", "never-exit0 not Succeeded")
    expect(phase(rec.status["never-exit1"]) == "Failed", "never-exit1 not Failed")
    expect(restarts(rec.status["onfailure-exit1"], "main") >= 2, "onfailure-exit1 not restarted")


def _exit_pod(name: str, policy: str, code: int) -> str:
    return f"""
        apiVersion: v1
        kind: Pod
        metadata:
          name: {name}
        spec:
          restartPolicy: {policy}
          containers:
            - name: main
              image: busybox:1.36
              command: ["sh", "-c", "sleep 1; echo exiting {code}; exit {code}"]
        """


@scenario("exit 0 and exit 1 under OnFailure and Never: only OnFailure + exit 1 restarts")
def onfailure_vs_never(run: Run) -> None:
    run.start_agent()
    jobs = documents(
        _exit_pod("onfailure-exit0", "OnFailure", 0),
        _exit_pod("onfailure-exit1", "OnFailure", 1),
        _exit_pod("never-exit0", "Never", 0),
        _exit_pod("never-exit1", "Never", 1),
    )
    run.write("jobs.yaml", jobs)
    run.wait(
        "exit-0 pods Succeeded, never-exit1 Failed, onfailure-exit1 restarted twice",
        lambda rec: (
            phase(rec.status.get("onfailure-exit0")) == "Succeeded"
            and phase(rec.status.get("never-exit0")) == "Succeeded"
            and phase(rec.status.get("never-exit1")) == "Failed"
            and restarts(rec.status.get("onfailure-exit1"), "main") >= 2
        ),
    )
    run.sleep(2)


def check_init_container_failure(rec: Recording, run: Run) -> None:
    expect("main" not in rec.created(), "a main container was created despite a failed init")
    always = rec.statuses["init-always"]
    expect(all(phase(s) == "Pending" for _, s in always), "init-always left Pending")
    expect(restarts(rec.status["init-always"], "init") >= 2, "init-always's init not retried")
    expect(
        any(state_of(s, "init") == "waiting:CrashLoopBackOff" for _, s in always),
        "init-always never showed CrashLoopBackOff",
    )
    expect(phase(rec.status["init-never"]) == "Failed", "init-never not Failed")
    expect(restarts(rec.status["init-never"], "init") == 0, "init-never's init was retried")


def _init_fail_pod(name: str, policy: str) -> str:
    return f"""
        apiVersion: v1
        kind: Pod
        metadata:
          name: {name}
        spec:
          restartPolicy: {policy}
          initContainers:
            - name: init
              image: busybox:1.36
              command: ["sh", "-c", "echo cannot initialise; exit 1"]
          containers:
            - name: main
              image: busybox:1.36
              command: ["sh", "-c", "{LOOP}"]
        """


@scenario("a failing init container: retried with back-off under Always, pod Failed under Never")
def init_container_failure(run: Run) -> None:
    run.start_agent()
    run.write(
        "init.yaml",
        documents(_init_fail_pod("init-always", "Always"), _init_fail_pod("init-never", "Never")),
    )
    run.wait(
        "init-never Failed, init-always's init retried twice",
        lambda rec: (
            phase(rec.status.get("init-never")) == "Failed"
            and restarts(rec.status.get("init-always"), "init") >= 2
        ),
    )
    run.sleep(1)


def check_sidecar_ordering(rec: Recording, run: Run) -> None:
    created = rec.created()
    expect(created == ["setup", "proxy", "logger", "app"], f"creation order {created}")
    stopped = rec.stopped()
    expect(stopped == ["logger", "proxy"], f"stop order {stopped} (want logger, then proxy)")
    app_done = next(
        t for t, s in rec.statuses["sidecars"] if state_of(s, "app").startswith("terminated")
    )
    first_stop = rec.rel(rec.cri("StopContainer")[0])
    expect(first_stop >= app_done - 1.5, "a sidecar was stopped before app finished")
    expect(phase(rec.status["sidecars"]) == "Succeeded", "pod not Succeeded")


@scenario("sidecars start before the main container and are stopped after it, in reverse order")
def sidecar_ordering(run: Run) -> None:
    run.start_agent()
    run.write(
        "sidecars.yaml",
        f"""
        apiVersion: v1
        kind: Pod
        metadata:
          name: sidecars
        spec:
          restartPolicy: Never
          terminationGracePeriodSeconds: 5
          initContainers:
            - name: setup
              image: busybox:1.36
              command: ["sh", "-c", "echo setting up"]
            - name: proxy
              image: busybox:1.36
              restartPolicy: Always
              command: ["sh", "-c", "{LOOP}"]
            - name: logger
              image: busybox:1.36
              restartPolicy: Always
              command: ["sh", "-c", "{LOOP}"]
          containers:
            - name: app
              image: busybox:1.36
              command: ["sh", "-c", "echo working; sleep 4; echo done"]
        """,
    )
    run.wait_pod(
        "sidecars",
        "Succeeded with both sidecars stopped",
        lambda s: (
            phase(s) == "Succeeded"
            and state_of(s, "proxy").startswith("terminated")
            and state_of(s, "logger").startswith("terminated")
        ),
    )
    run.sleep(1)


TWO_CONTAINERS = """
    apiVersion: v1
    kind: Pod
    metadata:
      name: two
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: web
          image: {web_image}
          command: ["sh", "-c", "echo web up; {loop}"]
        - name: worker
          image: busybox:1.36
          command: ["sh", "-c", "echo {worker_message}; {loop}"]
    """


def check_container_hash_change(rec: Recording, run: Run) -> None:
    created = rec.created()
    expect(created.count("web") == 2 and created.count("worker") == 2, f"created {created}")
    kills = [d["actions"]["containers_to_kill"] for d in rec.decisions("two")]
    kills = [k for k in kills if k]
    expect(len(kills) == 2, f"{len(kills)} decisions kill containers (want 2)")
    expect(all(len(k) == 1 for k in kills), f"a decision kills more than one container: {kills}")
    killed = [next(iter(k.values()))["name"] for k in kills]
    expect(killed == ["worker", "web"], f"killed {killed} (want worker, then web)")
    expect(len(rec.cri("RunPodSandbox")) == 1, "the sandbox was recreated")
    final = rec.status["two"]
    expect(restarts(final, "web") == 1 and restarts(final, "worker") == 1, describe(final))


@scenario("editing one container's command, then another's image: only the edited one restarts")
def container_hash_change(run: Run) -> None:
    run.start_agent()
    fmt = {"web_image": "busybox:1.36", "worker_message": "worker v1", "loop": LOOP}
    run.write("two.yaml", TWO_CONTAINERS.format(**fmt))
    run.wait_pod("two", "running", lambda s: is_running(s, "web") and is_running(s, "worker"))
    run.sleep(2)
    run.write("two.yaml", TWO_CONTAINERS.format(**(fmt | {"worker_message": "worker v2"})))
    run.wait_pod(
        "two", "worker restarted", lambda s: restarts(s, "worker") == 1 and is_running(s, "worker")
    )
    run.sleep(2)
    fmt |= {"worker_message": "worker v2", "web_image": "busybox:latest"}
    run.write("two.yaml", TWO_CONTAINERS.format(**fmt))
    run.wait_pod("two", "web restarted", lambda s: restarts(s, "web") == 1 and is_running(s, "web"))
    run.sleep(2)


WEB = """
    apiVersion: v1
    kind: Pod
    metadata:
      name: web
      labels:
        tier: {tier}
    spec:
      hostNetwork: {host_network}
      terminationGracePeriodSeconds: 5
      containers:
        - name: web
          image: busybox:1.36
          command: ["sh", "-c", "echo serving; {loop}"]
    """


def check_static_manifest_edit_and_delete(rec: Recording, run: Run) -> None:
    label_edit = next(t for t, text in run.marks if "tier" in text)
    network_edit = next(t for t, text in run.marks if "hostNetwork" in text)
    quiet = [r for r in rec.cri(*MUTATIONS, since=label_edit) if rec.rel(r) < network_edit]
    expect(not quiet, f"the label edit changed the runtime: {[r['method'] for r in quiet]}")
    expect(len(rec.cri("RunPodSandbox")) == 2, "want two sandboxes (before/after hostNetwork)")
    expect(rec.created() == ["web", "web"], f"created {rec.created()}")
    expect("web" in rec.teardowns, "the pod was not torn down after its file was deleted")
    sandboxes = [r["request"]["podSandboxId"] for r in rec.cri("StopPodSandbox")]
    expect(len(set(sandboxes)) == 2, "both sandboxes should be stopped by the end")


@scenario("a static pod edited (labels: nothing restarts; hostNetwork: new sandbox), then deleted")
def static_manifest_edit_and_delete(run: Run) -> None:
    run.start_agent()
    fmt = {"tier": "frontend", "host_network": "false", "loop": LOOP}
    run.write("web.yaml", WEB.format(**fmt))
    run.wait_pod("web", "running", lambda s: is_running(s, "web"))
    run.sleep(2)
    fmt["tier"] = "backend"
    run.write("web.yaml", WEB.format(**fmt))
    run.mark("(edit: label tier=backend)")
    run.sleep(3)
    fmt["host_network"] = "true"
    run.write("web.yaml", WEB.format(**fmt))
    run.mark("(edit: hostNetwork true)")
    run.wait_pod(
        "web", "running on the host network", lambda s: is_running(s, "web") and restarts(s, "web")
    )
    run.sleep(2)
    run.delete("web.yaml")
    run.wait("web torn down", lambda rec: "web" in rec.teardowns, timeout=30)
    run.sleep(1)


def check_oom_kill(rec: Recording, run: Run) -> None:
    def oom(status: dict[str, Any]) -> bool:
        c = containers(status).get("hog", {})
        last = {**c.get("state", {}), **c.get("lastState", {})}.get("terminated") or {}
        return bool(last.get("reason") == "OOMKilled" and last.get("exitCode") == 137)

    expect(any(oom(s) for _, s in rec.statuses["hog"]), "no OOMKilled (137) in the statuses")
    observed = [
        c
        for d in rec.decisions("hog")
        for c in d["observed"]["containers"]
        if c["state"] == "exited"
    ]
    expect(observed and all(c["reason"] == "OOMKilled" for c in observed), "exit not OOMKilled")
    expect(restarts(rec.status["hog"], "hog") >= 2, "hog not restarted twice")


@scenario("a container over its 16Mi memory limit is OOMKilled (137) and restarted with back-off")
def oom_kill(run: Run) -> None:
    run.start_agent()
    run.write(
        "hog.yaml",
        """
        apiVersion: v1
        kind: Pod
        metadata:
          name: hog
        spec:
          containers:
            - name: hog
              image: busybox:1.36
              command: ["sh", "-c", "sleep 1; dd if=/dev/zero of=/dev/null bs=64M count=1"]
              resources:
                limits:
                  memory: 16Mi
        """,
    )
    run.wait_pod("hog", "OOM-killed twice", lambda s: restarts(s, "hog") >= 2, timeout=60)
    run.sleep(1)


ADOPTED = f"""
    apiVersion: v1
    kind: Pod
    metadata:
      name: adopted
    spec:
      terminationGracePeriodSeconds: 5
      initContainers:
        - name: setup
          image: busybox:1.36
          command: ["sh", "-c", "echo set up"]
        - name: proxy
          image: busybox:1.36
          restartPolicy: Always
          command: ["sh", "-c", "{LOOP}"]
      containers:
        - name: app
          image: busybox:1.36
          command: ["sh", "-c", "{LOOP}"]
    """

FINISHED = """
    apiVersion: v1
    kind: Pod
    metadata:
      name: finished
    spec:
      restartPolicy: Never
      containers:
        - name: job
          image: busybox:1.36
          command: ["sh", "-c", "echo job done"]
    """


def check_agent_restart_adoption(rec: Recording, run: Run) -> None:
    changed = [r["method"] for r in rec.cri(*MUTATIONS)]
    expect(not changed, f"the restarted agent changed the runtime: {changed}")
    expect(bool(rec.decisions("adopted")), "the restarted agent made no decision on adopted")
    final = rec.status["adopted"]
    expect(phase(final) == "Running" and is_running(final, "app"), describe(final))
    expect(state_of(final, "setup") == "terminated:Completed", describe(final))
    done = rec.status["finished"]
    expect(phase(done) == "Succeeded" and restarts(done, "job") == 0, describe(done))


@scenario("the agent is killed (-9) and restarted: it adopts its pods, creates and stops nothing")
def agent_restart_adoption(run: Run) -> None:
    # The first agent's recording only serves the waits; the second one's is the scenario.
    run.start_agent(run.work / "first-agent.jsonl")
    run.write("adopted.yaml", ADOPTED)
    run.write("finished.yaml", FINISHED)
    run.wait(
        "adopted running, finished Succeeded",
        lambda rec: (
            is_running(rec.status.get("adopted"), "app")
            and is_running(rec.status.get("adopted"), "proxy")
            and phase(rec.status.get("finished")) == "Succeeded"
        ),
    )
    run.sleep(1)
    before = run.containerd.container_ids()
    run.kill_agent()
    run.sleep(2)
    run.start_agent()
    run.wait(
        "both statuses published",
        lambda rec: (
            is_running(rec.status.get("adopted"), "app")
            and phase(rec.status.get("finished")) == "Succeeded"
        ),
        timeout=30,
    )
    run.sleep(4)
    after = run.containerd.container_ids()
    expect(before == after, f"containers changed across the restart: {before ^ after}")


WEB_LOOP = f"""
    apiVersion: v1
    kind: Pod
    metadata:
      name: {{name}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: {{name}}
          image: busybox:1.36
          command: ["sh", "-c", "echo serving; {LOOP}"]
    """


def check_runtime_outage_and_recovery(rec: Recording, run: Run) -> None:
    killed = next(t for t, text in run.marks if "killing containerd" in text)
    back = next(t for t, text in run.marks if "containerd started" in text)
    failed = [r for r in rec.cri() if r.get("error") and killed <= rec.rel(r) <= back]
    expect(bool(failed), "no failed CRI call recorded during the outage")
    relists = [
        r for r in rec.of_kind("event")
        if r["event"].get("kind") == "relist" and not r["event"].get("ok")
    ]  # fmt: skip
    expect(bool(relists), "no failed relist recorded during the outage")
    expect(rec.created() == ["web", "late"], f"containers created: {rec.created()}")
    late = rec.cri("RunPodSandbox", "CreateContainer", since=killed)
    expect(all(rec.rel(r) > back for r in late), "late's pod was created during the outage?")
    final = rec.status["web"]
    expect(is_running(final, "web") and restarts(final, "web") == 0, describe(final))
    expect(is_running(rec.status["late"], "late"), describe(rec.status["late"]))


@scenario("containerd is SIGKILLed for ~10 s while a pod is added: retries, then re-converges")
def runtime_outage_and_recovery(run: Run) -> None:
    run.start_agent()
    run.write("web.yaml", WEB_LOOP.format(name="web"))
    run.wait_pod("web", "running", lambda s: is_running(s, "web"))
    run.sleep(2)
    run.mark("killing containerd (SIGKILL)")
    run.containerd.kill()
    run.sleep(2)
    run.write("late.yaml", WEB_LOOP.format(name="late"))
    run.sleep(8)
    run.containerd.start()
    run.mark("containerd started again")
    run.wait_pod("late", "running", lambda s: is_running(s, "late"), timeout=60)
    run.sleep(2)


def check_malformed_manifest(rec: Recording, run: Run) -> None:
    broken = next(t for t, text in run.marks if "wrote broken.yaml" in text)
    changed = [r["method"] for r in rec.cri(*MUTATIONS, since=broken)]
    expect(not changed, f"the runtime changed after the broken file appeared: {changed}")
    updates = [e["event"] for e in rec.of_kind("event") if e["event"].get("kind") == "pod_set"]
    pods = {short_name(p["metadata"]["name"]) for u in updates for p in u["pods"]}
    expect(pods == {"web"}, f"pods seen by the sources: {pods}")
    reasons = {Path(p["file"]).name: p["reason"] for p in updates[-1]["problems"]}
    expect("duplicate container name" in reasons.get("broken.yaml", ""), f"problems {reasons}")
    expect("invalid YAML" in reasons.get("web.yaml", ""), f"problems {reasons}")
    expect(not rec.decisions("web")[-1]["actions"]["reasons"], "web's last decision does something")
    final = rec.status["web"]
    expect(is_running(final, "web") and restarts(final, "web") == 0, describe(final))


@scenario("broken manifests beside (and over) a running pod's: nothing else changes")
def malformed_manifest(run: Run) -> None:
    web = f"""
        apiVersion: v1
        kind: Pod
        metadata:
          name: web
        spec:
          terminationGracePeriodSeconds: 5
          containers:
            - name: web
              image: busybox:1.36
              command: ["sh", "-c", "echo serving; {LOOP}"]
        """
    run.start_agent()
    run.write("web.yaml", web)
    run.wait_pod("web", "running", lambda s: is_running(s, "web"))
    run.sleep(2)
    # A field-level error: two containers with the same name.
    run.write(
        "broken.yaml",
        """
        apiVersion: v1
        kind: Pod
        metadata:
          name: broken
        spec:
          containers:
            - name: app
              image: busybox:1.36
            - name: app
              image: busybox:1.36
        """,
    )
    run.sleep(3)
    # A half-saved edit of the running pod's own file: not even YAML. Its pod keeps running.
    run.write("web.yaml", web.replace("containers:", "containers: [", 1))
    run.sleep(3)


def check_liveness_kill(rec: Recording, run: Run) -> None:
    probed = [d for d in rec.decisions("alive") if "failure" in d["liveness"].values()]
    expect(bool(probed), "no decision saw a failed liveness probe")
    killed = [
        d for d in probed
        if any(k["name"] == "app" and k["reason"] == "LivenessProbe"
               for k in d["actions"]["containers_to_kill"].values())
    ]
    expect(bool(killed), "app was not killed for its liveness probe")
    # The sync that kills the container starts it again, through the crash-loop gate.
    expect(any(s["container"] == "app" and s["allowed"] for s in killed[0]["starts"]),
           f"the killed container was not started again: {killed[0]['starts']}")
    expect(restarts(rec.status["alive"], "app") >= 1, describe(rec.status["alive"]))


@scenario("a container whose liveness probe starts failing: killed (LivenessProbe), restarted")
def liveness_kill(run: Run) -> None:
    run.start_agent()
    run.write(
        "alive.yaml",
        f"""
        apiVersion: v1
        kind: Pod
        metadata:
          name: alive
        spec:
          terminationGracePeriodSeconds: 2
          containers:
            - name: app
              image: busybox:1.36
              command: ["sh", "-c", "touch /tmp/healthy; sleep 5; rm /tmp/healthy; {LOOP}"]
              livenessProbe:
                exec:
                  command: ["cat", "/tmp/healthy"]
                periodSeconds: 1
                failureThreshold: 2
        """,
    )
    run.wait_pod("alive", "restarted after its liveness probe failed",
                 lambda s: restarts(s, "app") >= 1, timeout=60)
    run.sleep(1)


BY_NAME = {s.name: s for s in SCENARIO_LIST}


# --- driver ------------------------------------------------------------------------------------


def replay_check(path: Path) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-m", "trio_kubelet", "replay", str(path), "--check"],
        capture_output=True,
        text=True,
    )
    return result.returncode, (result.stdout + result.stderr).strip().splitlines()[-1]


@contextlib.contextmanager
def cleaned_up(run: Run) -> Iterator[None]:
    """Whatever happens: stop every agent of the run (SIGTERM, then SIGKILL), remove all pods."""
    try:
        yield
    finally:
        for agent in run.agents:
            if agent.alive():
                with contextlib.suppress(ScenarioFailed):
                    agent.stop()
            if agent.alive():
                agent.kill9()
        try:
            run.containerd.reset()
        except subprocess.CalledProcessError:
            log(f"{run.name}: cri_reset failed")


def record(scenario_: Scenario, containerd: Containerd, out: Path) -> tuple[bool, str]:
    work = WORK / scenario_.name
    shutil.rmtree(work, ignore_errors=True)
    (work / "manifests").mkdir(parents=True)
    run = Run(scenario_.name, containerd, work)
    started = time.monotonic()
    log(f"{scenario_.name}: {scenario_.doc}")
    try:
        with cleaned_up(run):
            scenario_.steps(run)
            run.stop_agent()
        rec = Recording(run.candidate)
        rec.poll()
        scenario_.check(rec, run)
    except ScenarioFailed as err:
        return False, f"FAILED: {err} (work dir {work})"
    except Exception as err:  # a bug in the scenario itself: show it, record the others
        traceback.print_exc()
        return False, f"FAILED: {type(err).__name__}: {err} (work dir {work})"
    code, last = replay_check(run.candidate)
    if code != 0:
        return False, f"FAILED: replay --check exited {code}: {last} (candidate {run.candidate})"
    target = out / scenario_.name / RECORDING
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run.candidate, target)
    size = target.stat().st_size
    return True, (
        f"ok: {size / 1024:.0f} KiB, {rec.duration():.1f}s recorded, "
        f"{len(rec.decisions())} decisions, took {time.monotonic() - started:.0f}s; {last}"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description="Re-record scenarios/NAME/recording.jsonl from real runs on containerd."
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="scenarios (default: all)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--out", type=Path, default=SCENARIOS, help="where to write (scenarios/)")
    parser.add_argument("--keep-going", action="store_true", help="record the rest after a failure")
    args = parser.parse_args(argv)
    if args.list:
        for s in SCENARIO_LIST:
            print(f"{s.name:34} {s.doc}")
        return 0
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    if os.geteuid() != 0:
        parser.error("needs root (containerd)")
    chosen = [BY_NAME[n] for n in args.names] if args.names else SCENARIO_LIST
    containerd = Containerd(CONTAINERD_DIR)
    results: dict[str, tuple[bool, str]] = {}
    containerd.start()
    try:
        containerd.reset()
        for each in chosen:
            results[each.name] = record(each, containerd, args.out)
            ok, text = results[each.name]
            log(f"{each.name}: {text}")
            if not ok and not args.keep_going:
                break
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        containerd.stop()
    print()
    for name, (_ok, text) in results.items():
        print(f"{name:34} {text}")
    return 0 if len(results) == len(chosen) and all(ok for ok, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
